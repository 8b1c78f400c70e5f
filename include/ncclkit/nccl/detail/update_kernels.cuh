#pragma once
/// The NCCL backend's optimizer kernels (Communicator::update and sum_squares; core/update.hpp):
/// an element-wise update in one pass, and a sum of squares whose partial sums are added in a
/// fixed order, so that every rank, holding the same gradients, gets the same bits (a clipping
/// factor that differed in the last bit would let replicas drift apart). Compiled only by nvcc,
/// through ncclkit/nccl/kernels.cuh, which registers the launchers (detail/kernel_hooks.hpp).

#if !defined(__CUDACC__)
#error "ncclkit/nccl/detail/update_kernels.cuh holds CUDA kernels: include it only from nvcc"
#endif

#include <cuda_bf16.h>         // __nv_bfloat16
#include <cuda_fp16.h>         // __half
#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint32_t, std::uintptr_t

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/update.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"

namespace ncclkit::nccl::detail {

/// One element's update, and its bfloat16 copy where there is one. The state in registers (no
/// reference into memory that may be a local's), as update4 holds it.
__device__ inline void update_one(const FusedUpdate& u, std::size_t i, float grad) {
  float p = u.values[i];
  float s0 = u.state0 != nullptr ? u.state0[i] : 0.0f;
  float s1 = u.state1 != nullptr ? u.state1[i] : 0.0f;
  update_element(u.rule, p, grad, s0, s1);
  u.values[i] = p;
  if (u.state0 != nullptr) u.state0[i] = s0;
  if (u.state1 != nullptr) u.state1[i] = s1;
  if (u.copy != nullptr) reinterpret_cast<__nv_bfloat16*>(u.copy)[i] = __float2bfloat16_rn(p);
}

/// The update of elements [at, at + 4) by gradients g0..g3: 16-byte loads and stores of the
/// parameters and the state the update has (its pointers 16-byte aligned there), and its
/// bfloat16 copy 8 bytes at a time. Shared by the update kernel and the fused 16-bit reduction
/// (compressed_reduce_kernels.cuh), so both compute the same bits.
__device__ inline void update4(const FusedUpdate& u, std::size_t at, float g0, float g1, float g2, float g3) {
  float4 p = *reinterpret_cast<const float4*>(u.values + at);
  float4 s0 = u.state0 != nullptr ? *reinterpret_cast<const float4*>(u.state0 + at) : float4{};
  float4 s1 = u.state1 != nullptr ? *reinterpret_cast<const float4*>(u.state1 + at) : float4{};
  update_element(u.rule, p.x, g0, s0.x, s1.x);
  update_element(u.rule, p.y, g1, s0.y, s1.y);
  update_element(u.rule, p.z, g2, s0.z, s1.z);
  update_element(u.rule, p.w, g3, s0.w, s1.w);
  *reinterpret_cast<float4*>(u.values + at) = p;
  if (u.state0 != nullptr) *reinterpret_cast<float4*>(u.state0 + at) = s0;
  if (u.state1 != nullptr) *reinterpret_cast<float4*>(u.state1 + at) = s1;
  if (u.copy != nullptr) {
    auto* copy = reinterpret_cast<__nv_bfloat162*>(u.copy + at);
    copy[0] = __floats2bfloat162_rn(p.x, p.y);
    copy[1] = __floats2bfloat162_rn(p.z, p.w);
  }
}

// Templates, though of nothing but a switch: a header's kernels are then defined in every .cu
// that includes it without clashing at link time (as inline functions are).
// `kVectors`: every pointer 16-byte aligned (the copy 8-byte), so each thread loads and stores
// four elements at a time (16 bytes of each buffer), the way a memory-bound pass reaches the
// GPU's bandwidth; the last count % 4 elements one at a time. Otherwise one at a time.
template <bool kVectors>
__global__ void update_kernel(FusedUpdate u, const float* __restrict__ grad, std::size_t count) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  std::size_t tail = 0;
  if constexpr (kVectors) {
    const std::size_t vectors = count / 4;
    for (std::size_t v = first; v < vectors; v += stride) {
      const float4 g = *reinterpret_cast<const float4*>(grad + v * 4);
      update4(u, v * 4, g.x, g.y, g.z, g.w);
    }
    tail = vectors * 4;
  }
  for (std::size_t i = tail + first; i < count; i += stride) update_one(u, i, grad[i]);
}

inline bool aligned(const void* p, std::size_t bytes) {
  return p == nullptr || reinterpret_cast<std::uintptr_t>(p) % bytes == 0;
}

inline void launch_update(const FusedUpdate& update, const float* grad, std::size_t count, cudaStream_t stream) {
  if (count == 0) return;
  constexpr unsigned kBlock = 256;
  const bool vectors = aligned(update.values, 16) && aligned(grad, 16) && aligned(update.state0, 16) &&
                       aligned(update.state1, 16) && aligned(update.copy, 8);
  const std::size_t threads = vectors ? (count + 3) / 4 : count;
  const std::size_t wanted = (threads + kBlock - 1) / kBlock;
  const auto blocks = static_cast<unsigned>(wanted < 8192 ? wanted : 8192);
  if (vectors) {
    update_kernel<true><<<blocks, kBlock, 0, stream>>>(update, grad, count);
  } else {
    update_kernel<false><<<blocks, kBlock, 0, stream>>>(update, grad, count);
  }
  NCCLKIT_CUDA_CHECK(cudaGetLastError());
}

template <class T>
__device__ inline double square_of(T x) {
  const double v = static_cast<double>(static_cast<float>(x));
  return v * v;
}
template <>
__device__ inline double square_of<double>(double x) {
  return x * x;
}
template <>
__device__ inline double square_of<__half>(__half x) {
  const double v = static_cast<double>(__half2float(x));
  return v * v;
}
template <>
__device__ inline double square_of<__nv_bfloat16>(__nv_bfloat16 x) {
  const double v = static_cast<double>(__bfloat162float(x));
  return v * v;
}

inline constexpr unsigned kSquareSumBlocks = kSquareSumWords - 1;
inline constexpr unsigned kSquareSumThreads = 256;

/// Block b sums elements b·256 + t, stepping by the grid, in a fixed tree; its partial goes to
/// out[1 + b]. Fixed grid and fixed trees: the same input gives the same partials.
template <class T>
__global__ void __launch_bounds__(kSquareSumThreads) square_partials_kernel(const T* in, std::size_t count,
                                                                           double* out) {
  __shared__ double sums[kSquareSumThreads];
  double sum = 0.0;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    sum += square_of(in[i]);
  }
  sums[threadIdx.x] = sum;
  __syncthreads();
  for (unsigned half = kSquareSumThreads / 2; half > 0; half /= 2) {
    if (threadIdx.x < half) sums[threadIdx.x] += sums[threadIdx.x + half];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[1 + blockIdx.x] = sums[0];
}

/// out[0] += the partials, in block order (one thread: 256 additions).
template <int = 0>
__global__ void add_partials_kernel(double* out) {
  double sum = 0.0;
  for (unsigned b = 0; b < kSquareSumBlocks; ++b) sum += out[1 + b];
  out[0] += sum;
}

template <class T>
void launch_square_sum_typed(const void* in, std::size_t count, double* out, cudaStream_t stream) {
  square_partials_kernel<T><<<kSquareSumBlocks, kSquareSumThreads, 0, stream>>>(static_cast<const T*>(in), count, out);
  NCCLKIT_CUDA_CHECK(cudaGetLastError());
  add_partials_kernel<><<<1, 1, 0, stream>>>(out);
  NCCLKIT_CUDA_CHECK(cudaGetLastError());
}

inline void launch_sum_squares(const void* in, DataType type, std::size_t count, double* out, cudaStream_t stream) {
  if (count == 0) return;
  switch (type) {
    case DataType::kFloat16:
      return launch_square_sum_typed<__half>(in, count, out, stream);
    case DataType::kBFloat16:
      return launch_square_sum_typed<__nv_bfloat16>(in, count, out, stream);
    case DataType::kFloat32:
      return launch_square_sum_typed<float>(in, count, out, stream);
    case DataType::kFloat64:
      return launch_square_sum_typed<double>(in, count, out, stream);
    default:
      throw ConfigError("sum_squares: " + std::string(name_of(type)) + " is not a floating type");
  }
}

/// Registers the launchers for the whole program (see kernel_hooks.hpp).
inline const bool kUpdateLaunchersRegistered =
    (update_launcher() = &launch_update, sum_squares_launcher() = &launch_sum_squares, true);

}  // namespace ncclkit::nccl::detail
