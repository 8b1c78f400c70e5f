#pragma once
// The digits classifier as a trainer Model on GPU memory (the NCCL backend): the MLP of
// mlp_cpu.hpp, 64 -> hidden (ReLU) -> 10 with softmax cross-entropy, in simple CUDA kernels on
// the trainer's stream. Every gradient element is summed over the batch by one thread in a fixed
// order (no atomics), so the same inputs give the same bits. Backward marks each layer ready on
// the stream right after its gradient kernels.
#include <cuda_runtime.h>

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <span>     // std::span
#include <vector>   // std::vector

#include <ncclkit/nccl/cuda_check.hpp>
#include <ncclkit/nccl/device_buffer.hpp>
#include <ncclkit/nccl/stream.hpp>  // DeviceGuard
#include <ncclkit/trainer/model.hpp>

#include "digits/data.hpp"
#include "digits/mlp_cpu.hpp"  // uniform(): the same initial weights as the CPU model

namespace digits {

/// A batch on the GPU: the indices of its samples in a DeviceData's arrays.
struct DeviceBatch {
  ncclkit::nccl::DeviceBuffer<int> indices;
  std::size_t count = 0;
  const float* features = nullptr;  // the whole dataset's, on the GPU
  const int* labels = nullptr;
  std::size_t size() const { return count; }
};

/// A Dataset of the trainer whose samples live on the GPU (`device`).
class DeviceData {
 public:
  DeviceData(const Samples& samples, int device)
      : size_(samples.size()),
        device_(device),
        features_(samples.features.size(), device),
        labels_(samples.labels.size(), device) {
    ncclkit::nccl::DeviceGuard guard(device);
    NCCLKIT_CUDA_CHECK(cudaMemcpy(features_.data(), samples.features.data(), samples.features.size() * sizeof(float),
                                  cudaMemcpyHostToDevice));
    NCCLKIT_CUDA_CHECK(
        cudaMemcpy(labels_.data(), samples.labels.data(), samples.labels.size() * sizeof(int), cudaMemcpyHostToDevice));
  }
  std::size_t size() const { return size_; }
  DeviceBatch batch(std::span<const std::size_t> indices) const {
    std::vector<int> host(indices.begin(), indices.end());
    DeviceBatch b{ncclkit::nccl::DeviceBuffer<int>(host.size(), device_), host.size(), features_.data(), labels_.data()};
    ncclkit::nccl::DeviceGuard guard(device_);
    NCCLKIT_CUDA_CHECK(cudaMemcpy(b.indices.data(), host.data(), host.size() * sizeof(int), cudaMemcpyHostToDevice));
    return b;
  }

 private:
  std::size_t size_;
  int device_;
  ncclkit::nccl::DeviceBuffer<float> features_;
  ncclkit::nccl::DeviceBuffer<int> labels_;
};

namespace kernels {

// hidden[s][j] = relu(b1[j] + W1[j] · x[s])
__global__ void hidden_layer(const float* w1, const float* b1, const float* features, const int* index, int n,
                             int hidden, float* out) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * hidden) return;
  const int s = t / hidden, j = t % hidden;
  const float* x = features + static_cast<std::size_t>(index[s]) * kPixels;
  float a = b1[j];
  for (int i = 0; i < static_cast<int>(kPixels); ++i) a += w1[j * kPixels + i] * x[i];
  out[t] = a > 0 ? a : 0;
}

// Per sample: logits, softmax, loss and hit into metrics; dlogits = weight · (p − one hot).
__global__ void output_layer(const float* w2, const float* b2, const float* hidden_out, const int* labels,
                             const int* index, int n, int hidden, float weight, float* dlogits, double* metrics) {
  const int s = blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= n) return;
  float logits[kClasses];
  float top = -1e30f;
  int best = 0;  // the first class of the highest logit, as the CPU model picks it
  for (int c = 0; c < static_cast<int>(kClasses); ++c) {
    float a = b2[c];
    for (int j = 0; j < hidden; ++j) a += w2[c * hidden + j] * hidden_out[s * hidden + j];
    logits[c] = a;
    if (a > top) {
      top = a;
      best = c;
    }
  }
  float sum = 0;
  for (int c = 0; c < static_cast<int>(kClasses); ++c) sum += logits[c] = expf(logits[c] - top);
  const int label = labels[index[s]];
  const float p_label = logits[label] / sum;
  atomicAdd(&metrics[0], -static_cast<double>(logf(fmaxf(p_label, 1e-30f))));
  atomicAdd(&metrics[1], best == label ? 1.0 : 0.0);
  atomicAdd(&metrics[2], 1.0);
  if (dlogits == nullptr) return;
  for (int c = 0; c < static_cast<int>(kClasses); ++c) {
    dlogits[s * kClasses + c] = weight * (logits[c] / sum - (c == label ? 1.0f : 0.0f));
  }
}

// gW2[c][j] += Σ_s dlogits[s][c] · hidden[s][j]; gb2[c] += Σ_s dlogits[s][c] (j == hidden).
__global__ void output_gradients(const float* dlogits, const float* hidden_out, int n, int hidden, float* gw2,
                                 float* gb2) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= static_cast<int>(kClasses) * (hidden + 1)) return;
  const int c = t / (hidden + 1), j = t % (hidden + 1);
  float sum = 0;
  for (int s = 0; s < n; ++s) sum += dlogits[s * kClasses + c] * (j == hidden ? 1.0f : hidden_out[s * hidden + j]);
  if (j == hidden) {
    gb2[c] += sum;
  } else {
    gw2[c * hidden + j] += sum;
  }
}

// dhidden[s][j] = (hidden[s][j] > 0) · Σ_c W2[c][j] · dlogits[s][c]
__global__ void hidden_delta(const float* w2, const float* dlogits, const float* hidden_out, int n, int hidden,
                             float* dhidden) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n * hidden) return;
  const int s = t / hidden, j = t % hidden;
  float d = 0;
  if (hidden_out[t] > 0) {
    for (int c = 0; c < static_cast<int>(kClasses); ++c) d += w2[c * hidden + j] * dlogits[s * kClasses + c];
  }
  dhidden[t] = d;
}

// gW1[j][i] += Σ_s dhidden[s][j] · x[s][i]; gb1[j] += Σ_s dhidden[s][j] (i == kPixels).
__global__ void hidden_gradients(const float* dhidden, const float* features, const int* index, int n, int hidden,
                                 float* gw1, float* gb1) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  const int row = static_cast<int>(kPixels) + 1;
  if (t >= hidden * row) return;
  const int j = t / row, i = t % row;
  float sum = 0;
  for (int s = 0; s < n; ++s) {
    const float x = i == static_cast<int>(kPixels) ? 1.0f : features[static_cast<std::size_t>(index[s]) * kPixels + i];
    sum += dhidden[s * hidden + j] * x;
  }
  if (i == static_cast<int>(kPixels)) {
    gb1[j] += sum;
  } else {
    gw1[j * kPixels + i] += sum;
  }
}

inline unsigned blocks(std::size_t threads) { return static_cast<unsigned>((threads + 127) / 128); }

}  // namespace kernels

template <class B>
class MlpGpu {
 public:
  using Batch = DeviceBatch;
  explicit MlpGpu(std::size_t hidden = 128, std::uint64_t seed = 1) : hidden_(hidden), seed_(seed) {}

  void declare(ncclkit::fusion::FusedLayout& layout) const { MlpCpu<B>(hidden_, seed_).declare(layout); }

  void bind(const ncclkit::trainer::ModelViews<B>& v) {
    w1_ = v.template value_data<float>("fc1.weight");
    b1_ = v.template value_data<float>("fc1.bias");
    w2_ = v.template value_data<float>("fc2.weight");
    b2_ = v.template value_data<float>("fc2.bias");
    gw1_ = v.template gradient_data<float>("fc1.weight");
    gb1_ = v.template gradient_data<float>("fc1.bias");
    gw2_ = v.template gradient_data<float>("fc2.weight");
    gb2_ = v.template gradient_data<float>("fc2.bias");
    // The trainer's memory is on the communicator's GPU, which need not be the current one: every
    // later call switches to it, since kernels and allocations go to the current device.
    cudaPointerAttributes where{};
    NCCLKIT_CUDA_CHECK(cudaPointerGetAttributes(&where, w1_));
    device_ = where.device;
    ncclkit::nccl::DeviceGuard guard(device_);
    // The CPU model's initial values, uploaded.
    std::vector<float> w1(hidden_ * kPixels), w2(kClasses * hidden_), zeros(hidden_, 0.0f);
    const float bound1 = std::sqrt(6.0f / static_cast<float>(kPixels));
    const float bound2 = std::sqrt(6.0f / static_cast<float>(hidden_));
    for (std::size_t i = 0; i < w1.size(); ++i) w1[i] = uniform(seed_, i, bound1);
    for (std::size_t i = 0; i < w2.size(); ++i) w2[i] = uniform(seed_ + 1, i, bound2);
    NCCLKIT_CUDA_CHECK(cudaMemcpy(w1_, w1.data(), w1.size() * sizeof(float), cudaMemcpyHostToDevice));
    NCCLKIT_CUDA_CHECK(cudaMemcpy(w2_, w2.data(), w2.size() * sizeof(float), cudaMemcpyHostToDevice));
    NCCLKIT_CUDA_CHECK(cudaMemcpy(b1_, zeros.data(), hidden_ * sizeof(float), cudaMemcpyHostToDevice));
    NCCLKIT_CUDA_CHECK(cudaMemcpy(b2_, zeros.data(), kClasses * sizeof(float), cudaMemcpyHostToDevice));
  }

  void forward_backward(const Batch& batch, ncclkit::trainer::StepContext<B>& step) {
    const ncclkit::nccl::DeviceGuard guard(device_);
    const cudaStream_t s = step.stream();
    const int n = static_cast<int>(batch.size()), h = static_cast<int>(hidden_);
    reserve(batch.size());
    using namespace kernels;
    hidden_layer<<<blocks(batch.size() * hidden_), 128, 0, s>>>(w1_, b1_, batch.features, batch.indices.data(), n, h,
                                                               hidden_out_.data());
    output_layer<<<blocks(batch.size()), 128, 0, s>>>(w2_, b2_, hidden_out_.data(), batch.labels, batch.indices.data(), n,
                                                      h, static_cast<float>(step.loss_weight()), dlogits_.data(),
                                                      step.metrics());
    output_gradients<<<blocks(kClasses * (hidden_ + 1)), 128, 0, s>>>(dlogits_.data(), hidden_out_.data(), n, h, gw2_,
                                                                      gb2_);
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    step.ready("fc2.weight");
    step.ready("fc2.bias");
    hidden_delta<<<blocks(batch.size() * hidden_), 128, 0, s>>>(w2_, dlogits_.data(), hidden_out_.data(), n, h,
                                                               dhidden_.data());
    hidden_gradients<<<blocks(hidden_ * (kPixels + 1)), 128, 0, s>>>(dhidden_.data(), batch.features,
                                                                     batch.indices.data(), n, h, gw1_, gb1_);
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    step.ready("fc1.weight");
    step.ready("fc1.bias");
  }

  void evaluate(const Batch& batch, ncclkit::trainer::EvalContext<B>& eval) {
    const ncclkit::nccl::DeviceGuard guard(device_);
    const cudaStream_t s = eval.stream();
    const int n = static_cast<int>(batch.size()), h = static_cast<int>(hidden_);
    reserve(batch.size());
    kernels::hidden_layer<<<kernels::blocks(batch.size() * hidden_), 128, 0, s>>>(
        w1_, b1_, batch.features, batch.indices.data(), n, h, hidden_out_.data());
    kernels::output_layer<<<kernels::blocks(batch.size()), 128, 0, s>>>(
        w2_, b2_, hidden_out_.data(), batch.labels, batch.indices.data(), n, h, 0.0f, nullptr, eval.metrics());
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
  }

 private:
  void reserve(std::size_t n) {
    if (n <= capacity_) return;
    // The stream may still use the old scratch: let it finish before it goes.
    NCCLKIT_CUDA_CHECK(cudaDeviceSynchronize());
    hidden_out_ = ncclkit::nccl::DeviceBuffer<float>(n * hidden_, device_);
    dhidden_ = ncclkit::nccl::DeviceBuffer<float>(n * hidden_, device_);
    dlogits_ = ncclkit::nccl::DeviceBuffer<float>(n * kClasses, device_);
    capacity_ = n;
  }

  std::size_t hidden_;
  std::uint64_t seed_;
  int device_ = 0;
  float *w1_ = nullptr, *b1_ = nullptr, *w2_ = nullptr, *b2_ = nullptr;
  float *gw1_ = nullptr, *gb1_ = nullptr, *gw2_ = nullptr, *gb2_ = nullptr;
  std::size_t capacity_ = 0;
  ncclkit::nccl::DeviceBuffer<float> hidden_out_, dhidden_, dlogits_;
};

}  // namespace digits
