#pragma once
// The element-wise CUDA kernels of the cuBLAS MLP (mlp_cublas.cuh) and of its synthetic data
// (synthetic_data.cuh): everything but the matrix products, which cuBLAS does. Kernels are
// templates, so that several .cu files of one program can include this header and link. Those
// of the model take float or __nv_bfloat16 activations and do their arithmetic in float, so that
// one kernel serves both precisions and the float32 path computes what it always did.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>  // std::min
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint64_t

namespace mlp_cublas {

/// SplitMix64's finaliser: the bits of a deterministic pseudo-random stream, the same on host
/// and device.
__host__ __device__ inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A uniform float in [-bound, bound) for (seed, index): 24 random bits, exact in float.
__host__ __device__ inline float uniform_at(std::uint64_t seed, std::uint64_t index, float bound) {
  const std::uint64_t bits = mix64(seed * 0x100000001B3ull ^ mix64(index));
  const float unit = static_cast<float>(bits >> 40) * 0x1.0p-24f;
  return (2.0f * unit - 1.0f) * bound;
}

namespace kernels {

inline constexpr int kThreads = 256;

/// Blocks for a grid-stride loop over `count` elements: enough to fill the GPU, never more
/// than the elements need.
inline unsigned blocks_for(std::size_t count, std::size_t most = 4096) {
  const std::size_t needed = (count + kThreads - 1) / kThreads;
  return static_cast<unsigned>(std::max<std::size_t>(1, std::min(needed, most)));
}

// out[i] = uniform_at(seed, i, bound)
template <class T>
__global__ void fill_uniform(T* out, std::size_t count, std::uint64_t seed, float bound) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<T>(uniform_at(seed, i, bound));
  }
}

// out[i] = value
template <class T>
__global__ void fill_value(T* out, std::size_t count, T value) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    out[i] = value;
  }
}

// out[i] = in[i], converted (float to bfloat16: round to nearest even).
template <class From, class To>
__global__ void cast(const From* in, To* out, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    out[i] = static_cast<To>(static_cast<float>(in[i]));
  }
}

// z[s][o] = act(z[s][o] + bias[o]) over `rows` samples of `features` values (row-major, that is
// cuBLAS's column-major features × rows), summed in float; act is ReLU where `relu`, else the
// identity. The bias may be of another type than z (float32 biases beside bfloat16 activations).
template <class T, class Bias>
__global__ void bias_activation(T* z, const Bias* bias, std::size_t rows, std::size_t features, bool relu) {
  const std::size_t count = rows * features;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float v = static_cast<float>(z[i]) + static_cast<float>(bias[i % features]);
    z[i] = static_cast<T>(relu && v < 0.0f ? 0.0f : v);
  }
}

// delta[i] = activation[i] > 0 ? delta[i] : 0, where activation = relu(pre-activation): ReLU's
// backward in place.
template <class T>
__global__ void relu_backward(T* delta, const T* activation, std::size_t count) {
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    if (!(static_cast<float>(activation[i]) > 0.0f)) delta[i] = static_cast<T>(0.0f);
  }
}

// Mean-squared error per sample, ℓ_s = Σ_o (p[s][o] − y[s][o])² / features: metrics[0] +=
// Σ_s ℓ_s and metrics[2] += rows (the Metrics words of ncclkit::trainer), one atomicAdd per
// block; where `dp` is given, dp = gradient_scale · (p − y), gradient_scale being
// 2 · loss_weight / features, the gradient of loss_weight · Σ_s ℓ_s. p − y in float (the
// predictions may be bfloat16, the targets float), the sum in double.
template <class P, class Y>
__global__ void mean_squared_error(const P* p, const Y* y, std::size_t rows, std::size_t features, float gradient_scale,
                                   P* dp, double* metrics) {
  __shared__ double partial[kThreads];
  const std::size_t count = rows * features;
  double sum = 0;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const float d = static_cast<float>(p[i]) - static_cast<float>(y[i]);
    sum += static_cast<double>(d) * static_cast<double>(d);
    if (dp != nullptr) dp[i] = static_cast<P>(gradient_scale * d);
  }
  partial[threadIdx.x] = sum;
  __syncthreads();
  for (int half = kThreads / 2; half > 0; half /= 2) {
    if (static_cast<int>(threadIdx.x) < half) partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) {
    atomicAdd(&metrics[0], partial[0] / static_cast<double>(features));
    if (blockIdx.x == 0) atomicAdd(&metrics[2], static_cast<double>(rows));
  }
}

// out[r][f] = source[index[r]][f]: rows gathered from a row-major table.
template <class T>
__global__ void gather_rows(const T* source, const int* index, std::size_t rows, std::size_t features, T* out) {
  const std::size_t count = rows * features;
  for (std::size_t i = blockIdx.x * std::size_t{blockDim.x} + threadIdx.x; i < count;
       i += std::size_t{gridDim.x} * blockDim.x) {
    const std::size_t r = i / features, f = i % features;
    out[i] = source[static_cast<std::size_t>(index[r]) * features + f];
  }
}

}  // namespace kernels
}  // namespace mlp_cublas
