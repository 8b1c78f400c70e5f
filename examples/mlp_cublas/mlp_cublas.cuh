#pragma once
// An MLP of Linear + ReLU layers on cuBLAS as a trainer Model (trainer/model.hpp) on GPU memory
// (the NCCL backend), with mean-squared-error loss: `depth` Linear layers, input → width → … →
// width → output, ReLU after each but the last; the per-sample loss is Σ_o (p_o − y_o)² / output,
// so the gradients are those of PyTorch's nn.MSELoss() (mean over samples and outputs).
//
// Layout: PyTorch's. A layer's weight is row-major [out, in] ("fc<l>.weight"), its bias [out]
// ("fc<l>.bias"), activations are row-major [samples, features]; cuBLAS, column-major, sees each
// of them transposed, so y = x Wᵀ + b is the column-major product Yᶜ = Wᶜᵀ Xᶜ.
//
// Precision: TF32 tensor cores by default (CUBLAS_COMPUTE_32F_FAST_TF32, as PyTorch with
// torch.backends.cuda.matmul.allow_tf32 = True), or float32 (CUBLAS_COMPUTE_32F). Weights,
// gradients and activations are float32 either way.
//
// Backward, layer by layer from the last: the weight-gradient GEMM (beta = 1: the gradient is
// added, as the Model contract asks), the bias gradient (a GEMV against ones, beta = 1), then
// `step.ready` for the weight and the bias at once, so their bucket is reduced while the input-
// gradient GEMM and the earlier layers run; the input gradient goes to the next layer down.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>  // std::max
#include <cmath>      // std::sqrt
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t, std::uint64_t
#include <limits>     // std::numeric_limits
#include <string>     // std::string, std::to_string
#include <utility>    // std::swap
#include <vector>     // std::vector

#include <ncclkit/core/error.hpp>
#include <ncclkit/fusion/layout.hpp>
#include <ncclkit/nccl/cuda_check.hpp>
#include <ncclkit/nccl/device_buffer.hpp>
#include <ncclkit/nccl/stream.hpp>  // DeviceGuard
#include <ncclkit/trainer/model.hpp>

#include "mlp_cublas/cublas_handle.hpp"
#include "mlp_cublas/kernels.cuh"
#include "mlp_cublas/synthetic_data.cuh"

namespace mlp_cublas {

/// How the GEMMs compute.
enum class Precision {
  kTf32,     ///< TF32 tensor cores, float32 accumulation (default)
  kFloat32,  ///< full float32
};

/// The model's shape and precision.
struct MlpOptions {
  std::size_t input = 4096;   ///< features in
  std::size_t width = 4096;   ///< features of every hidden layer
  std::size_t output = 4096;  ///< features out
  std::size_t depth = 8;      ///< Linear layers (at least 1)
  Precision precision = Precision::kTf32;
  /// SMs cuBLAS plans its GEMMs for (cublasSetSmCountTarget), leaving the rest to the reductions
  /// that overlap backward; 0: all of them.
  int cublas_sms = 0;
  /// Seeds the initial weights (rank 0's are broadcast by the trainer, so only rank 0's count).
  std::uint64_t seed = 1;

  std::size_t in_features(std::size_t layer) const { return layer == 0 ? input : width; }
  std::size_t out_features(std::size_t layer) const { return layer + 1 == depth ? output : width; }
  /// Weights and biases of every layer.
  std::size_t parameters() const {
    std::size_t n = 0;
    for (std::size_t l = 0; l < depth; ++l) n += (in_features(l) + 1) * out_features(l);
    return n;
  }
  /// Why this shape cannot be built; empty when it can.
  std::string problem() const {
    if (depth == 0) return "mlp_cublas: depth 0; a model needs at least one layer";
    if (input == 0 || width == 0 || output == 0) return "mlp_cublas: input, width and output must be at least 1";
    constexpr std::size_t kMostFeatures = std::size_t{1} << 20;  // cuBLAS takes int dimensions
    if (input > kMostFeatures || width > kMostFeatures || output > kMostFeatures) {
      return "mlp_cublas: at most " + std::to_string(kMostFeatures) + " features per layer";
    }
    return {};
  }
};

/// The name of layer `l`'s weight ("fc3.weight") or bias ("fc3.bias").
inline std::string weight_name(std::size_t layer) { return "fc" + std::to_string(layer) + ".weight"; }
inline std::string bias_name(std::size_t layer) { return "fc" + std::to_string(layer) + ".bias"; }

template <class B>
class MlpCublas {
 public:
  using Batch = mlp_cublas::Batch;

  explicit MlpCublas(MlpOptions options = {}) : options_(options) {
    if (std::string p = options_.problem(); !p.empty()) throw ncclkit::ConfigError(p);
  }

  const MlpOptions& options() const { return options_; }

  /// Layers in forward order: the layout places the last layer's tensors first, so the first
  /// bucket holds what backward writes first.
  void declare(ncclkit::fusion::FusedLayout& layout) const {
    for (std::size_t l = 0; l < options_.depth; ++l) {
      const auto out = static_cast<std::int64_t>(options_.out_features(l));
      const auto in = static_cast<std::int64_t>(options_.in_features(l));
      layout.add(weight_name(l), {out, in}, ncclkit::DataType::kFloat32);
      layout.add(bias_name(l), {out}, ncclkit::DataType::kFloat32);
    }
  }

  /// Keeps the views and writes the initial values: weights U(±√(6/in)) (He's bound, for the
  /// ReLU layers) and U(±√(3/in)) for the last layer (unit output variance), biases 0.
  void bind(const ncclkit::trainer::ModelViews<B>& views) {
    layers_.clear();
    for (std::size_t l = 0; l < options_.depth; ++l) {
      layers_.push_back(Layer{views.template value_data<float>(weight_name(l)),
                              views.template value_data<float>(bias_name(l)),
                              views.template gradient_data<float>(weight_name(l)),
                              views.template gradient_data<float>(bias_name(l)),
                              views.layout().slot(weight_name(l)), views.layout().slot(bias_name(l)),
                              options_.in_features(l), options_.out_features(l)});
    }
    // The trainer's memory is on the communicator's GPU, which need not be the current one:
    // every later call switches to it, since kernels, handles and allocations go to the current
    // device.
    cudaPointerAttributes where{};
    NCCLKIT_CUDA_CHECK(cudaPointerGetAttributes(&where, layers_.front().weight));
    if (where.type != cudaMemoryTypeDevice) {
      throw ncclkit::ConfigError("mlp_cublas::MlpCublas: the trainer's parameters are not in GPU memory; "
                                 "this model runs on the NCCL backend");
    }
    if (!handle_ || device_ != where.device) {
      device_ = where.device;
      handle_ = CublasHandle(device_);
      capacity_ = 0;
    }
    const ncclkit::nccl::DeviceGuard guard(device_);
    MLP_CUBLAS_CHECK(cublasSetMathMode(handle_.get(), options_.precision == Precision::kTf32
                                                          ? CUBLAS_TF32_TENSOR_OP_MATH
                                                          : CUBLAS_DEFAULT_MATH));
    MLP_CUBLAS_CHECK(cublasSetSmCountTarget(handle_.get(), options_.cublas_sms));
    using kernels::blocks_for;
    using kernels::kThreads;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      const float gain = l + 1 == layers_.size() ? 3.0f : 6.0f;
      const std::size_t count = layer.in * layer.out;
      kernels::fill_uniform<float><<<blocks_for(count), kThreads>>>(
          layer.weight, count, options_.seed * 1000003u + l, std::sqrt(gain / static_cast<float>(layer.in)));
      kernels::fill_value<float><<<blocks_for(layer.out), kThreads>>>(layer.bias, layer.out, 0.0f);
    }
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    // The trainer broadcasts the values on its own stream next: they must be written by then.
    NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }

  void forward_backward(const Batch& batch, ncclkit::trainer::StepContext<B>& step) {
    const ncclkit::nccl::DeviceGuard guard(device_);
    const cudaStream_t stream = step.stream();
    const std::size_t n = batch.size();
    reserve(n);
    MLP_CUBLAS_CHECK(cublasSetStream(handle_.get(), stream));
    forward(batch, stream);
    // The loss's gradient with respect to the output: loss_weight · 2 (p − y) / output.
    const std::size_t out = options_.output;
    float* delta = deltas_[0].data();
    kernels::mean_squared_error<float><<<kernels::blocks_for(n * out, 1024), kernels::kThreads, 0, stream>>>(
        activation(layers_.size() - 1), batch.targets.data(), n, out,
        static_cast<float>(2.0 * step.loss_weight() / static_cast<double>(out)), delta, step.metrics());
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    float* spare = deltas_[1].data();
    const float one = 1.0f, zero = 0.0f;
    for (std::size_t l = layers_.size(); l-- > 0;) {
      const Layer& layer = layers_[l];
      const float* in = l == 0 ? batch.inputs.data() : activation(l - 1);
      // dW += dZᵀ X (row-major [out, in]): column-major dWᶜ (in × out) += Xᶜ dZᶜᵀ.
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, layer.in, layer.out, n, in, layer.in, delta, layer.out, one, layer.weight_grad,
           layer.in);
      // db += Σ_s dZ[s]: column-major dZᶜ (out × n) times a vector of n ones.
      MLP_CUBLAS_CHECK(cublasSgemv(handle_.get(), CUBLAS_OP_N, as_int(layer.out), as_int(n), &one, delta,
                                   as_int(layer.out), ones_.data(), 1, &one, layer.bias_grad, 1));
      step.ready(layer.weight_slot);
      step.ready(layer.bias_slot);
      if (l == 0) break;
      // dX = dZ W (row-major [n, in]): column-major dXᶜ (in × n) = Wᶜ dZᶜ; then ReLU's backward
      // through the layer below, whose output is this layer's input.
      gemm(CUBLAS_OP_N, CUBLAS_OP_N, layer.in, n, layer.out, layer.weight, layer.in, delta, layer.out, zero, spare,
           layer.in);
      kernels::relu_backward<float><<<kernels::blocks_for(n * layer.in), kernels::kThreads, 0, stream>>>(
          spare, activation(l - 1), n * layer.in);
      NCCLKIT_CUDA_CHECK(cudaGetLastError());
      std::swap(delta, spare);
    }
  }

  void evaluate(const Batch& batch, ncclkit::trainer::EvalContext<B>& eval) {
    const ncclkit::nccl::DeviceGuard guard(device_);
    const cudaStream_t stream = eval.stream();
    const std::size_t n = batch.size();
    reserve(n);
    MLP_CUBLAS_CHECK(cublasSetStream(handle_.get(), stream));
    forward(batch, stream);
    kernels::mean_squared_error<float><<<kernels::blocks_for(n * options_.output, 1024), kernels::kThreads, 0,
                                         stream>>>(activation(layers_.size() - 1), batch.targets.data(), n,
                                                   options_.output, 0.0f, nullptr, eval.metrics());
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
  }

 private:
  struct Layer {
    float* weight;
    float* bias;
    float* weight_grad;
    float* bias_grad;
    ncclkit::fusion::Slot weight_slot;
    ncclkit::fusion::Slot bias_slot;
    std::size_t in, out;
  };

  static constexpr std::size_t kMostSamples = std::numeric_limits<int>::max();

  static int as_int(std::size_t n) { return static_cast<int>(n); }

  void gemm(cublasOperation_t a_op, cublasOperation_t b_op, std::size_t m, std::size_t n, std::size_t k,
            const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
    const float alpha = 1.0f;
    const cublasComputeType_t compute =
        options_.precision == Precision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    MLP_CUBLAS_CHECK(cublasGemmEx(handle_.get(), a_op, b_op, as_int(m), as_int(n), as_int(k), &alpha, a, CUDA_R_32F,
                                  as_int(lda), b, CUDA_R_32F, as_int(ldb), &beta, c, CUDA_R_32F, as_int(ldc), compute,
                                  CUBLAS_GEMM_DEFAULT));
  }

  // y = act(x Wᵀ + b) for every layer, each layer's output kept for backward.
  void forward(const Batch& batch, cudaStream_t stream) {
    const std::size_t n = batch.size();
    if (batch.inputs.size() != n * options_.input || batch.targets.size() != n * options_.output) {
      throw ncclkit::ConfigError("mlp_cublas::MlpCublas: a batch of " + std::to_string(n) + " samples holds " +
                                 std::to_string(batch.inputs.size()) + " inputs and " +
                                 std::to_string(batch.targets.size()) + " targets; the model takes " +
                                 std::to_string(options_.input) + " and gives " + std::to_string(options_.output) +
                                 " per sample");
    }
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      const float* in = l == 0 ? batch.inputs.data() : activation(l - 1);
      float* out = activation(l);
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, layer.out, n, layer.in, layer.weight, layer.in, in, layer.in, 0.0f, out,
           layer.out);
      kernels::bias_activation<float><<<kernels::blocks_for(n * layer.out), kernels::kThreads, 0, stream>>>(
          out, layer.bias, n, layer.out, l + 1 < layers_.size());
    }
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
  }

  // Layer l's output (after its activation) for the current batch: [n, out_features(l)].
  float* activation(std::size_t l) const { return activations_.data() + capacity_ * activation_offsets_[l]; }

  void reserve(std::size_t n) {
    if (n == 0) throw ncclkit::ConfigError("mlp_cublas::MlpCublas: an empty batch");
    if (n > kMostSamples) {
      throw ncclkit::ConfigError("mlp_cublas::MlpCublas: a batch of " + std::to_string(n) + " samples; cuBLAS takes " +
                                 "at most " + std::to_string(kMostSamples) + " (int dimensions): split it");
    }
    if (n <= capacity_) return;
    // The stream may still use the old scratch: let it finish before it goes.
    NCCLKIT_CUDA_CHECK(cudaDeviceSynchronize());
    activation_offsets_.assign(layers_.size(), 0);
    std::size_t features = 0, widest = options_.input;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      activation_offsets_[l] = features;
      features += layers_[l].out;
      widest = std::max(widest, layers_[l].out);
    }
    activations_ = ncclkit::nccl::DeviceBuffer<float>(n * features, device_);
    deltas_[0] = ncclkit::nccl::DeviceBuffer<float>(n * widest, device_);
    deltas_[1] = ncclkit::nccl::DeviceBuffer<float>(n * widest, device_);
    ones_ = ncclkit::nccl::DeviceBuffer<float>(n, device_);
    kernels::fill_value<float><<<kernels::blocks_for(n), kernels::kThreads>>>(ones_.data(), n, 1.0f);
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    capacity_ = n;
  }

  MlpOptions options_;
  std::vector<Layer> layers_;
  int device_ = -1;
  CublasHandle handle_;
  std::size_t capacity_ = 0;  // samples the scratch holds
  std::vector<std::size_t> activation_offsets_;
  ncclkit::nccl::DeviceBuffer<float> activations_;
  ncclkit::nccl::DeviceBuffer<float> deltas_[2];
  ncclkit::nccl::DeviceBuffer<float> ones_;
};

}  // namespace mlp_cublas
