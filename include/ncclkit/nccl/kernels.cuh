#pragma once
/// Element-wise CUDA kernels the NCCL backend needs for the `Backend` concept: `scale` (used
/// for averaging and for pre-scaling before a reduction) and `fill` (tests and benchmarks);
/// and, from detail/codec_kernels.cuh, `cast` and `copy_batch` (members of the Backend concept).
/// Compiled only by nvcc. Including this header in one translation unit registers the
/// launchers for the whole program (see detail/kernel_hooks.hpp), so host code compiled by g++
/// can call Communicator::scale too.

#if !defined(__CUDACC__)
#error "ncclkit/nccl/kernels.cuh holds CUDA kernels: include it only from files compiled by nvcc (.cu)"
#endif

#include <cuda_bf16.h>         // __nv_bfloat16, __bfloat162float, __float2bfloat16_rn
#include <cuda_fp16.h>         // __half, __half2float, __float2half_rn
#include <cuda_runtime_api.h>  // cudaStream_t, cudaGetLastError

#include <cstddef>  // std::size_t
#include <cstdint>  // fixed-width integers
#include <limits>   // std::numeric_limits
#include <string>   // std::string

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/codec_kernels.cuh"
#include "ncclkit/nccl/detail/compressed_reduce_kernels.cuh"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"
#include "ncclkit/nccl/detail/update_kernels.cuh"

namespace ncclkit::nccl::detail {

// ---- kernels ----------------------------------------------------------------

/// How an element is scaled: in float for 16- and 32-bit floats, in double for doubles, and
/// in double with rounding to nearest and saturation for integers (so that scaling an int8
/// gradient by 0.5 gives the nearest int8, never a wrapped value).
template <class T>
struct ScaleOp {
  // Evaluated on the host at compile time (numeric_limits is host code); usable on the device.
  static constexpr double kLowest = static_cast<double>(std::numeric_limits<T>::lowest());
  static constexpr double kHighest = static_cast<double>(std::numeric_limits<T>::max());
  __device__ static T apply(T value, double factor) {
    double scaled = rint(static_cast<double>(value) * factor);
    scaled = scaled < kLowest ? kLowest : (scaled > kHighest ? kHighest : scaled);
    return static_cast<T>(scaled);
  }
};
template <>
struct ScaleOp<float> {
  __device__ static float apply(float value, double factor) { return value * static_cast<float>(factor); }
};
template <>
struct ScaleOp<double> {
  __device__ static double apply(double value, double factor) { return value * factor; }
};
template <>
struct ScaleOp<__half> {
  __device__ static __half apply(__half value, double factor) {
    return __float2half_rn(__half2float(value) * static_cast<float>(factor));
  }
};
template <>
struct ScaleOp<__nv_bfloat16> {
  __device__ static __nv_bfloat16 apply(__nv_bfloat16 value, double factor) {
    return __float2bfloat16_rn(__bfloat162float(value) * static_cast<float>(factor));
  }
};

template <class T>
__global__ void scale_kernel(T* data, std::size_t count, double factor) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = ScaleOp<T>::apply(data[i], factor);
  }
}

template <class T>
__global__ void fill_kernel(T* data, std::size_t count, T value) {
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count; i += stride) {
    data[i] = value;
  }
}

// ---- launchers --------------------------------------------------------------

/// Blocks for `count` elements: enough to fill a Hopper GPU several times over, no more (the
/// loops are grid-stride).
inline unsigned grid_for(std::size_t count, unsigned block) {
  const std::size_t blocks = (count + block - 1) / block;
  return static_cast<unsigned>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

template <class T>
void launch_scale_typed(void* data, std::size_t count, double factor, cudaStream_t stream) {
  constexpr unsigned kBlock = 256;
  scale_kernel<T><<<grid_for(count, kBlock), kBlock, 0, stream>>>(static_cast<T*>(data), count, factor);
  NCCLKIT_CUDA_CHECK(cudaGetLastError());
}

inline void launch_scale(void* data, std::size_t count, DataType type, double factor, cudaStream_t stream) {
  if (count == 0) return;
  switch (type) {
    case DataType::kInt8:
      return launch_scale_typed<std::int8_t>(data, count, factor, stream);
    case DataType::kUint8:
      return launch_scale_typed<std::uint8_t>(data, count, factor, stream);
    case DataType::kInt32:
      return launch_scale_typed<std::int32_t>(data, count, factor, stream);
    case DataType::kUint32:
      return launch_scale_typed<std::uint32_t>(data, count, factor, stream);
    case DataType::kInt64:
      return launch_scale_typed<std::int64_t>(data, count, factor, stream);
    case DataType::kUint64:
      return launch_scale_typed<std::uint64_t>(data, count, factor, stream);
    case DataType::kFloat16:
      return launch_scale_typed<__half>(data, count, factor, stream);
    case DataType::kBFloat16:
      return launch_scale_typed<__nv_bfloat16>(data, count, factor, stream);
    case DataType::kFloat32:
      return launch_scale_typed<float>(data, count, factor, stream);
    case DataType::kFloat64:
      return launch_scale_typed<double>(data, count, factor, stream);
  }
  throw ConfigError("scale: invalid DataType value " + std::to_string(static_cast<int>(type)));
}

/// Registers launch_scale for the whole program (see kernel_hooks.hpp).
inline const bool kScaleLauncherRegistered = (scale_launcher() = &launch_scale, true);

}  // namespace ncclkit::nccl::detail

namespace ncclkit::nccl {

/// Sets `count` elements at `data` (device memory) to `value` on `stream`.
template <class T>
void fill(T* data, std::size_t count, T value, cudaStream_t stream = nullptr) {
  if (count == 0) return;
  constexpr unsigned kBlock = 256;
  detail::fill_kernel<T><<<detail::grid_for(count, kBlock), kBlock, 0, stream>>>(data, count, value);
  NCCLKIT_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ncclkit::nccl
