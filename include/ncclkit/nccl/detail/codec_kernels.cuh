#pragma once
/// The CUDA kernels of the Backend concept's codec operations: `cast` (scale and convert in one pass,
/// counting non-finite outputs) and `copy_batch` (many copies in one launch, from a table in
/// device memory). Compiled only by nvcc, through ncclkit/nccl/kernels.cuh, which registers
/// the launchers for host code (detail/kernel_hooks.hpp).
///
/// Both are memory-bound and run beside NCCL's kernels in a pipeline, so their grids are
/// capped at a few blocks per SM: enough warps in flight to reach the memory bandwidth, not so
/// many that NCCL's blocks queue behind them.

#if !defined(__CUDACC__)
#error "ncclkit/nccl/detail/codec_kernels.cuh holds CUDA kernels: include it only from files compiled by nvcc"
#endif

#include <cuda_bf16.h>         // __nv_bfloat16
#include <cuda_fp16.h>         // __half
#include <cuda_runtime_api.h>  // cudaStream_t

#include <algorithm>    // std::min
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t, std::uint64_t, std::uintptr_t
#include <string>       // std::string
#include <type_traits>  // std::conditional_t, std::is_same_v

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"

namespace ncclkit::nccl::detail {

// ---- cast -------------------------------------------------------------------

template <class T>
struct Convert;
template <>
struct Convert<float> {
  __device__ static float widen(float v) { return v; }
  __device__ static float narrow(float v) { return v; }
  __device__ static float narrow(double v) { return static_cast<float>(v); }
};
template <>
struct Convert<double> {
  __device__ static double widen(double v) { return v; }
  __device__ static double narrow(float v) { return v; }
  __device__ static double narrow(double v) { return v; }
};
template <>
struct Convert<__half> {
  __device__ static float widen(__half v) { return __half2float(v); }
  __device__ static __half narrow(float v) { return __float2half_rn(v); }
  __device__ static __half narrow(double v) { return __double2half(v); }
};
template <>
struct Convert<__nv_bfloat16> {
  __device__ static float widen(__nv_bfloat16 v) { return __bfloat162float(v); }
  __device__ static __nv_bfloat16 narrow(float v) { return __float2bfloat16_rn(v); }
  __device__ static __nv_bfloat16 narrow(double v) { return __double2bfloat16(v); }
};

/// Elements a thread moves per load: 16 bytes of the wider side's type at most.
template <class In, class Out>
inline constexpr int kCastVector = 16 / (sizeof(In) > sizeof(Out) ? sizeof(In) : sizeof(Out));

template <class T, int N>
struct alignas(sizeof(T) * N) Packed {
  T v[N];
};

/// Adds the block's `local` counts to `*total` with one atomic per warp that saw any.
__device__ inline void add_count(unsigned long long local, unsigned long long* total) {
  for (int offset = 16; offset > 0; offset >>= 1) local += __shfl_down_sync(0xffffffffu, local, offset);
  if ((threadIdx.x & 31) == 0 && local != 0) atomicAdd(total, local);
}

/// Packs a thread loads before it converts and stores any: more bytes in flight per SM, which
/// a memory-bound kernel capped at a few blocks per SM needs to approach the bandwidth.
inline constexpr int kCastUnroll = 4;

template <class In, class Out>
__global__ void cast_kernel(const In* in, Out* out, std::size_t count, double factor, bool vector,
                            unsigned long long* nonfinite) {
  using Compute = std::conditional_t<std::is_same_v<In, double> || std::is_same_v<Out, double>, double, float>;
  constexpr int kN = kCastVector<In, Out>;
  const Compute f = static_cast<Compute>(factor);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned long long bad = 0;
  std::size_t scalar_from = 0;
  if (vector) {
    const std::size_t packs = count / kN;
    const auto* in_packs = reinterpret_cast<const Packed<In, kN>*>(in);
    auto* out_packs = reinterpret_cast<Packed<Out, kN>*>(out);
    for (std::size_t base = first; base < packs; base += kCastUnroll * stride) {
      Packed<In, kN> x[kCastUnroll];
#pragma unroll
      for (int u = 0; u < kCastUnroll; ++u) {
        const std::size_t p = base + u * stride;
        if (p < packs) x[u] = in_packs[p];
      }
#pragma unroll
      for (int u = 0; u < kCastUnroll; ++u) {
        const std::size_t p = base + u * stride;
        if (p >= packs) break;
        Packed<Out, kN> y;
#pragma unroll
        for (int j = 0; j < kN; ++j) {
          y.v[j] = Convert<Out>::narrow(static_cast<Compute>(Convert<In>::widen(x[u].v[j])) * f);
          bad += isfinite(Convert<Out>::widen(y.v[j])) ? 0 : 1;
        }
        out_packs[p] = y;
      }
    }
    scalar_from = packs * kN;
  }
  for (std::size_t i = scalar_from + first; i < count; i += stride) {
    const Out y = Convert<Out>::narrow(static_cast<Compute>(Convert<In>::widen(in[i])) * f);
    bad += isfinite(Convert<Out>::widen(y)) ? 0 : 1;
    out[i] = y;
  }
  if (nonfinite != nullptr) add_count(bad, nonfinite);
}

/// Blocks for a memory-bound kernel on the current GPU: up to `per_sm` per SM.
inline unsigned capped_grid(std::size_t work_items, unsigned block, unsigned per_sm) {
  static thread_local int cached_device = -1;
  static thread_local int sms = 0;
  int device = 0;
  NCCLKIT_CUDA_CHECK(cudaGetDevice(&device));
  if (device != cached_device) {
    NCCLKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    cached_device = device;
  }
  const std::size_t wanted = (work_items + block - 1) / block;
  const std::size_t cap = static_cast<std::size_t>(sms) * per_sm;
  return static_cast<unsigned>(wanted == 0 ? 1 : (wanted < cap ? wanted : cap));
}

inline constexpr unsigned kCodecBlock = 256;

template <class In, class Out>
void launch_cast_typed(const void* in, void* out, std::size_t count, double factor, std::uint64_t* nonfinite,
                       unsigned blocks_per_sm, cudaStream_t stream) {
  constexpr int kN = kCastVector<In, Out>;
  const auto address = reinterpret_cast<std::uintptr_t>(in) | reinterpret_cast<std::uintptr_t>(out);
  const bool vector = address % (sizeof(In) * kN) == 0 && address % (sizeof(Out) * kN) == 0;
  const std::size_t work = vector ? (count / kN + kCastUnroll - 1) / kCastUnroll : count;
  const unsigned grid = capped_grid(work, kCodecBlock, blocks_per_sm);
  cast_kernel<In, Out><<<grid, kCodecBlock, 0, stream>>>(static_cast<const In*>(in), static_cast<Out*>(out), count,
                                                         factor, vector,
                                                         reinterpret_cast<unsigned long long*>(nonfinite));
  NCCLKIT_CUDA_CHECK(cudaGetLastError());
}

template <class In>
void launch_cast_from(const void* in, DataType out_type, void* out, std::size_t count, double factor,
                      std::uint64_t* nonfinite, unsigned blocks_per_sm, cudaStream_t stream) {
  switch (out_type) {
    case DataType::kFloat16:
      return launch_cast_typed<In, __half>(in, out, count, factor, nonfinite, blocks_per_sm, stream);
    case DataType::kBFloat16:
      return launch_cast_typed<In, __nv_bfloat16>(in, out, count, factor, nonfinite, blocks_per_sm, stream);
    case DataType::kFloat32:
      return launch_cast_typed<In, float>(in, out, count, factor, nonfinite, blocks_per_sm, stream);
    case DataType::kFloat64:
      return launch_cast_typed<In, double>(in, out, count, factor, nonfinite, blocks_per_sm, stream);
    default:
      throw ConfigError("cast: output type " + std::string(name_of(out_type)) + " is not a floating type");
  }
}

inline void launch_cast(const void* in, DataType in_type, void* out, DataType out_type, std::size_t count,
                        double factor, std::uint64_t* nonfinite, unsigned blocks_per_sm, cudaStream_t stream) {
  static_assert(sizeof(std::uint64_t) == sizeof(unsigned long long));
  if (count == 0) return;
  switch (in_type) {
    case DataType::kFloat16:
      return launch_cast_from<__half>(in, out_type, out, count, factor, nonfinite, blocks_per_sm, stream);
    case DataType::kBFloat16:
      return launch_cast_from<__nv_bfloat16>(in, out_type, out, count, factor, nonfinite, blocks_per_sm, stream);
    case DataType::kFloat32:
      return launch_cast_from<float>(in, out_type, out, count, factor, nonfinite, blocks_per_sm, stream);
    case DataType::kFloat64:
      return launch_cast_from<double>(in, out_type, out, count, factor, nonfinite, blocks_per_sm, stream);
    default:
      throw ConfigError("cast: input type " + std::string(name_of(in_type)) + " is not a floating type");
  }
}

// ---- copy_batch -------------------------------------------------------------

inline constexpr int kCopyUnroll = 4;

/// Moves `bytes` from `from` to `to` with the block's threads, in the widest words both
/// addresses allow; aligned runs load kCopyUnroll words per thread before storing them, so that
/// a few blocks per SM keep enough loads in flight to fill HBM.
__device__ inline void block_copy(unsigned char* to, const unsigned char* from, std::size_t bytes) {
  const auto address = reinterpret_cast<std::uintptr_t>(to) | reinterpret_cast<std::uintptr_t>(from);
  std::size_t done = 0;
  if (address % 16 == 0) {
    const std::size_t words = bytes / 16;
    auto* out = reinterpret_cast<uint4*>(to);
    const auto* in = reinterpret_cast<const uint4*>(from);
    std::size_t i = threadIdx.x;
    for (; i + (kCopyUnroll - 1) * blockDim.x < words; i += kCopyUnroll * blockDim.x) {
      uint4 v[kCopyUnroll];
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) v[u] = in[i + u * blockDim.x];
#pragma unroll
      for (int u = 0; u < kCopyUnroll; ++u) out[i + u * blockDim.x] = v[u];
    }
    for (; i < words; i += blockDim.x) out[i] = in[i];
    done = words * 16;
  } else if (address % 4 == 0) {
    const std::size_t words = bytes / 4;
    for (std::size_t i = threadIdx.x; i < words; i += blockDim.x) {
      reinterpret_cast<unsigned*>(to)[i] = reinterpret_cast<const unsigned*>(from)[i];
    }
    done = words * 4;
  }
  for (std::size_t i = done + threadIdx.x; i < bytes; i += blockDim.x) to[i] = from[i];
}

/// Each block takes chunks of `chunk_bytes` (grid-stride) and finds its copy by binary
/// search over the table's first chunks, so one huge copy and hundreds of tiny ones share
/// the grid evenly.
template <int = 0>  // a template of nothing: defined in every .cu that includes it, without a clash
__global__ void copy_batch_kernel(const DeviceCopy* items, std::size_t count, std::uint64_t chunks,
                                  std::uint64_t chunk_bytes) {
  for (std::uint64_t chunk = blockIdx.x; chunk < chunks; chunk += gridDim.x) {
    std::size_t lo = 0;
    std::size_t hi = count - 1;
    while (lo < hi) {
      const std::size_t mid = (lo + hi + 1) / 2;
      if (items[mid].first_chunk <= chunk) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const DeviceCopy item = items[lo];
    const std::uint64_t begin = (chunk - item.first_chunk) * chunk_bytes;
    const std::uint64_t rest = item.bytes - begin;
    block_copy(static_cast<unsigned char*>(item.to) + begin, static_cast<const unsigned char*>(item.from) + begin,
               rest < chunk_bytes ? rest : chunk_bytes);
  }
}

/// One block a chunk, capped at `per_sm` blocks per SM; 0, no cap: short-lived blocks free an
/// SM within a chunk's time for a NCCL kernel of the high-priority comm stream (a capped grid of
/// blocks that loop over chunks holds its SMs to the end; measured in docs/performance.md).
inline void launch_copy_batch(const DeviceCopy* items, std::size_t count, std::uint64_t chunks,
                              std::uint64_t chunk_bytes, unsigned per_sm, cudaStream_t stream) {
  if (count == 0 || chunks == 0) return;
  const unsigned grid = per_sm == 0 ? static_cast<unsigned>(std::min<std::uint64_t>(chunks, 0x7fffffffu))
                                    : capped_grid(static_cast<std::size_t>(chunks) * kCodecBlock, kCodecBlock, per_sm);
  copy_batch_kernel<><<<grid, kCodecBlock, 0, stream>>>(items, count, chunks, chunk_bytes);
  NCCLKIT_CUDA_CHECK(cudaGetLastError());
}

/// Registers the launchers for the whole program (see kernel_hooks.hpp).
inline const bool kCodecLaunchersRegistered =
    (cast_launcher() = &launch_cast, copy_batch_launcher() = &launch_copy_batch, true);

}  // namespace ncclkit::nccl::detail
