#pragma once
// Synthetic regression data on the GPU for the cuBLAS MLP: inputs x drawn uniformly with unit
// variance and targets y = T x of a fixed random "teacher" matrix T (unit variance too), both
// generated on the GPU from a seed, so the same seed gives the same samples on every GPU and in
// every run, and a model that learns shows a falling loss. A Dataset of the trainer
// (trainer/model.hpp): `size()` samples, `batch(indices)` gathers them.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cmath>    // std::sqrt
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <limits>   // std::numeric_limits
#include <span>     // std::span
#include <string>   // std::to_string
#include <vector>   // std::vector

#include <ncclkit/core/error.hpp>
#include <ncclkit/nccl/cuda_check.hpp>
#include <ncclkit/nccl/device_buffer.hpp>
#include <ncclkit/nccl/stream.hpp>  // DeviceGuard

#include "mlp_cublas/cublas_handle.hpp"
#include "mlp_cublas/kernels.cuh"

namespace mlp_cublas {

/// A batch on the GPU: `count` samples, row-major (sample after sample).
struct Batch {
  ncclkit::nccl::DeviceBuffer<float> inputs;   ///< count × input features
  ncclkit::nccl::DeviceBuffer<float> targets;  ///< count × output features
  std::size_t count = 0;
  std::size_t size() const { return count; }
};

/// `samples` samples of (x, y = T x) on `device`.
class SyntheticData {
 public:
  SyntheticData(std::size_t input, std::size_t output, std::size_t samples, std::uint64_t seed, int device)
      : input_(input),
        output_(output),
        samples_(checked_samples(input, output, samples)),
        device_(device),
        inputs_(samples * input, device),
        targets_(samples * output, device) {
    const ncclkit::nccl::DeviceGuard guard(device);
    ncclkit::nccl::DeviceBuffer<float> teacher(output * input, device);
    using kernels::blocks_for;
    using kernels::kThreads;
    // Unit variance: U(-a, a) has variance a²/3; a teacher row of `input` such weights keeps it.
    kernels::fill_uniform<float><<<blocks_for(inputs_.size()), kThreads>>>(inputs_.data(), inputs_.size(), seed,
                                                                          std::sqrt(3.0f));
    kernels::fill_uniform<float><<<blocks_for(teacher.size()), kThreads>>>(
        teacher.data(), teacher.size(), seed + 1, std::sqrt(3.0f / static_cast<float>(input)));
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    // Row-major Y (samples × output) = X Tᵀ, in cuBLAS's column-major terms Yᶜ = Tᶜᵀ Xᶜ. Full
    // float32 math: the data do not depend on the model's precision.
    const CublasHandle handle(device);
    MLP_CUBLAS_CHECK(cublasSetStream(handle.get(), cudaStreamLegacy));
    const float one = 1.0f, zero = 0.0f;
    MLP_CUBLAS_CHECK(cublasGemmEx(handle.get(), CUBLAS_OP_T, CUBLAS_OP_N, as_int(output), as_int(samples),
                                  as_int(input), &one, teacher.data(), CUDA_R_32F, as_int(input), inputs_.data(),
                                  CUDA_R_32F, as_int(input), &zero, targets_.data(), CUDA_R_32F, as_int(output),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    // The trainer's stream is another one: the data must be complete before anyone reads them.
    NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }

  std::size_t size() const { return samples_; }
  std::size_t input() const { return input_; }
  std::size_t output() const { return output_; }
  int device() const { return device_; }
  /// Every sample's inputs and targets, row-major.
  const float* inputs() const { return inputs_.data(); }
  const float* targets() const { return targets_.data(); }

  /// A copy of the given samples (each index below size()), complete when this returns.
  Batch batch(std::span<const std::size_t> indices) const {
    std::vector<int> host(indices.size());
    for (std::size_t i = 0; i < indices.size(); ++i) {
      if (indices[i] >= samples_) {
        throw ncclkit::ConfigError("mlp_cublas::SyntheticData::batch: sample " + std::to_string(indices[i]) +
                                   " of " + std::to_string(samples_));
      }
      host[i] = static_cast<int>(indices[i]);
    }
    const std::size_t n = host.size();
    Batch b{ncclkit::nccl::DeviceBuffer<float>(n * input_, device_),
            ncclkit::nccl::DeviceBuffer<float>(n * output_, device_), n};
    if (n == 0) return b;
    const ncclkit::nccl::DeviceGuard guard(device_);
    ncclkit::nccl::DeviceBuffer<int> index(n, device_);
    NCCLKIT_CUDA_CHECK(cudaMemcpy(index.data(), host.data(), n * sizeof(int), cudaMemcpyHostToDevice));
    using kernels::blocks_for;
    kernels::gather_rows<float><<<blocks_for(n * input_), kernels::kThreads>>>(inputs_.data(), index.data(), n,
                                                                              input_, b.inputs.data());
    kernels::gather_rows<float><<<blocks_for(n * output_), kernels::kThreads>>>(targets_.data(), index.data(), n,
                                                                               output_, b.targets.data());
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
    return b;
  }
  /// Samples [first, first + count).
  Batch batch(std::size_t first, std::size_t count) const {
    std::vector<std::size_t> indices(count);
    for (std::size_t i = 0; i < count; ++i) indices[i] = first + i;
    return batch(std::span<const std::size_t>(indices));
  }

 private:
  static constexpr std::size_t kMostSamples = std::numeric_limits<int>::max();
  static int as_int(std::size_t n) { return static_cast<int>(n); }
  // Before anything is allocated.
  static std::size_t checked_samples(std::size_t input, std::size_t output, std::size_t samples) {
    if (input == 0 || output == 0 || samples == 0 || samples > kMostSamples) {
      throw ncclkit::ConfigError("mlp_cublas::SyntheticData: " + std::to_string(samples) + " samples of " +
                                 std::to_string(input) + " inputs and " + std::to_string(output) +
                                 " outputs; every count must be at least 1, and the samples at most " +
                                 std::to_string(kMostSamples) + " (cuBLAS's int dimensions)");
    }
    return samples;
  }

  std::size_t input_, output_, samples_;
  int device_;
  ncclkit::nccl::DeviceBuffer<float> inputs_, targets_;
};

}  // namespace mlp_cublas
