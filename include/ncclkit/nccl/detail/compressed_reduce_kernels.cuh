#pragma once
/// The kernel of Communicator::compressed_all_reduce: a float32 all-reduce whose data crosses
/// NVLink in 16 bits, compression fused into the transfer (docs/performance.md, "Compression
/// fused into the transfer"). Compiled only by nvcc, through ncclkit/nccl/kernels.cuh, which
/// registers the launcher for host code (detail/kernel_hooks.hpp).
///
/// Every rank's GPU reaches every other's symmetric window by plain loads and stores (NCCL
/// 2.28's LSA pointers), so one kernel does what cast, all-reduce and cast do in three:
///   1. each rank encodes (scale, round to 16 bits) the shards that others own and stores
///      them straight into their reduce-scatter inboxes;
///   2. each rank sums its own shard: its own float32 values (never rounded) plus the others'
///      16-bit ones, rounds the sum to 16 bits once, stores that into every peer's all-gather
///      inbox and decodes it into its own float32 data;
///   3. each rank decodes the others' shards from its all-gather inbox.
/// Every rank ends with the same bits: each shard is rounded once, by its owner, and decoded
/// alike everywhere. Non-finite 16-bit results are counted over the whole tensor on every
/// rank (phase 2 counts the own shard, phase 3 the others'), so the counts agree too.
///
/// With an optimizer update (CompressedReduceArgs::update), phases 2 and 3 do not write the
/// results into `data`: each result goes through update_element (core/update.hpp, the same
/// arithmetic as the separate update kernel, so the same bits as reducing and then updating)
/// into the parameters and state, read and written once where the result is made. `data` keeps
/// this rank's own values, which phase 1 of other blocks may still be reading: the update's
/// buffers must not overlap it.
///
/// Between the phases, block b of every rank meets block b of every other at a barrier of
/// flags in the window; word v of an inbox slot is always handled by the same block (a
/// grid-stride loop over a grid of fixed size, slots of fixed size), so those pairwise
/// barriers order every access, also from one call to the next; every rank runs the same grid
/// (prepare_compressed_reduce agrees on it). A barrier gives up after `timeout_ns` (a peer that
/// died or never launched), or as soon as the host raised `stop` before aborting the
/// communicator (whose abort unmaps the windows): the block raises `gave_up` (mapped host
/// memory, which the next call and the workspace's destructor read) and `stop`, adds one to
/// the non-finite count (the result is not whole) and returns, so the kernel never spins
/// forever and never reads a window while an abort takes it down. A kernel that starts with
/// `stop` raised returns at once. `stop` is in device memory: every block reads it at every
/// launch, and a read of host memory there costs about 0.1 ms a launch. The communicator's
/// watchdog, whose deadline comes first, reports the failure.

#if !defined(__CUDACC__)
#error "ncclkit/nccl/detail/compressed_reduce_kernels.cuh holds CUDA kernels: include it only from nvcc"
#endif

#include <nccl.h>

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)  // the device API; older NCCL: no fused kernel

#include <cuda/atomic>  // cuda::atomic_ref
#include <cuda_bf16.h>  // __nv_bfloat16
#include <cuda_fp16.h>  // __half

// NCCL's device header declares a namespace `nccl` at global scope, which would take that name
// from every file that includes ncclkit (a user's `namespace nccl = ncclkit::nccl;`, or a global
// `nccl` of their own). The header's own uses of it are its only `nccl` tokens: renamed while
// it is read, the namespace is one whose name ncclkit owns. (A file that uses NCCL's device API
// itself includes <nccl_device.h> before ncclkit's headers, and keeps NCCL's name.)
#pragma push_macro("nccl")
#define nccl ncclkit_nccl_device
#include <nccl_device.h>  // ncclGetLsaPointer, ncclGetLocalPointer
#undef nccl
#pragma pop_macro("nccl")

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint32_t, std::uint64_t

#include "ncclkit/core/update.hpp"                // FusedUpdate, update_element
#include "ncclkit/nccl/detail/codec_kernels.cuh"  // Convert: the casts' rounding, shared
#include "ncclkit/nccl/detail/kernel_hooks.hpp"
#include "ncclkit/nccl/detail/update_kernels.cuh"  // update4, update_one: the update kernel's code

namespace ncclkit::nccl::detail {

/// Eight wire values in one 16-byte word.
template <class Wire>
union WirePack {
  Wire v[8];
  uint4 word;
};

__device__ inline std::uint64_t global_ns() {
  std::uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// How the kernel reaches the windows: NCCL's symmetric window (LSA pointers), the only one a
/// communicator uses.
struct LsaWindow {
  ncclWindow_t window;
  __device__ explicit LsaWindow(const CompressedReduceKernelArgs& a) : window(static_cast<ncclWindow_t>(a.window)) {}
  __device__ void* local(std::size_t offset, int) const { return ncclGetLocalPointer(window, offset); }
  __device__ void* peer(std::size_t offset, int rank) const { return ncclGetLsaPointer(window, offset, rank); }
};

/// Windows as a table in device memory of every rank's window base (`a.window` points to it):
/// the ranks are launches of the kernel on one GPU, each on its own part of that GPU's memory.
/// Only a test uses it: NCCL refuses two ranks on one GPU, and this runs the kernel's exchange,
/// barriers and timeouts at any world size on a machine with one.
struct PointerTableWindow {
  char* const* bases;
  __device__ explicit PointerTableWindow(const CompressedReduceKernelArgs& a)
      : bases(static_cast<char* const*>(a.window)) {}
  __device__ void* local(std::size_t offset, int rank) const { return bases[rank] + offset; }
  __device__ void* peer(std::size_t offset, int rank) const { return bases[rank] + offset; }
};

/// Block b's flag that rank `from` raises in rank `at`'s window.
template <class Window>
__device__ inline std::uint32_t* barrier_flag(const CompressedReduceKernelArgs& a, const Window& window,
                                              std::size_t flags_offset, int from, int at) {
  const std::size_t offset = flags_offset + (static_cast<std::size_t>(blockIdx.x) * a.world + from) * 4;
  return static_cast<std::uint32_t*>(at == a.rank ? window.local(offset, at) : window.peer(offset, at));
}

/// Block b of this rank meets block b of every other rank. False when a peer did not come
/// within the deadline or the host raised `stop` (then `gave_up` and `stop` are raised).
template <class Window>
__device__ inline bool meet(const CompressedReduceKernelArgs& a, const Window& window, std::size_t flags_offset,
                            std::uint32_t& epoch, std::uint64_t deadline) {
  __syncthreads();  // the block's stores come before the flag (cumulativity of the release)
  int ok = 1;
  if (threadIdx.x == 0) {
    ++epoch;
    for (int peer = 0; peer < a.world; ++peer) {
      if (peer == a.rank) continue;
      cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system> flag(
          *barrier_flag(a, window, flags_offset, a.rank, peer));
      flag.store(epoch, cuda::memory_order_release);
    }
    for (int peer = 0; peer < a.world && ok; ++peer) {
      if (peer == a.rank) continue;
      cuda::atomic_ref<std::uint32_t, cuda::thread_scope_system> flag(
          *barrier_flag(a, window, flags_offset, peer, a.rank));
      for (unsigned spins = 0;; ++spins) {
        if (static_cast<std::int32_t>(flag.load(cuda::memory_order_acquire) - epoch) >= 0) break;
        // The host raises `stop` before it aborts the communicator (CommHandle's
        // stop_window_kernels): the windows are about to go.
        if (spins % 1024 == 1023 && (global_ns() > deadline || *static_cast<volatile int*>(a.stop) != 0)) {
          ok = 0;
          *static_cast<volatile int*>(a.stop) = 1;  // the launches queued behind this one return at once
          *static_cast<volatile int*>(a.gave_up) = 1;
          __threadfence_system();
          if (a.nonfinite != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(a.nonfinite), 1ull);
          break;
        }
      }
    }
  }
  return __syncthreads_and(ok) != 0;
}

__device__ inline void load8(const float* data, std::size_t count, std::size_t e, float* out) {
  if (e + 8 <= count) {
    const float4 x = *reinterpret_cast<const float4*>(data + e);
    const float4 y = *reinterpret_cast<const float4*>(data + e + 4);
    out[0] = x.x, out[1] = x.y, out[2] = x.z, out[3] = x.w, out[4] = y.x, out[5] = y.y, out[6] = y.z, out[7] = y.w;
  } else {
    for (int k = 0; k < 8; ++k) out[k] = e + k < count ? data[e + k] : 0.f;
  }
}
__device__ inline void store8(float* data, std::size_t count, std::size_t e, const float* v) {
  if (e + 8 <= count) {
    *reinterpret_cast<float4*>(data + e) = make_float4(v[0], v[1], v[2], v[3]);
    *reinterpret_cast<float4*>(data + e + 4) = make_float4(v[4], v[5], v[6], v[7]);
  } else {
    for (int k = 0; k < 8 && e + k < count; ++k) data[e + k] = v[k];
  }
}

/// The update of the parameters (and state, and bfloat16 copy) at elements [e, e + 8) by the
/// results `grad`: four elements at a time (update4: 16-byte loads and stores, fewer registers
/// live), where all 8 are below `count`; one element at a time in the last, partial vector, none
/// past `count`. The state pointers are null where the rule keeps none (a uniform branch).
__device__ inline void update8(const FusedUpdate& u, std::size_t count, std::size_t e, const float* grad) {
  if (e + 8 <= count) {
#pragma unroll
    for (int half = 0; half < 8; half += 4) {
      update4(u, e + half, grad[half], grad[half + 1], grad[half + 2], grad[half + 3]);
    }
    return;
  }
  for (int k = 0; k < 8 && e + k < count; ++k) update_one(u, e + k, grad[k]);
}

/// Decodes a pack into `out` (times `decode`) and counts its non-finite values among the
/// first `valid` (the rest is padding past the end of the data).
template <class Wire>
__device__ inline unsigned decode8(const WirePack<Wire>& pack, float decode, std::size_t valid, float* out) {
  unsigned bad = 0;
#pragma unroll
  for (int k = 0; k < 8; ++k) {
    const float w = Convert<Wire>::widen(pack.v[k]);
    bad += (k < valid && !isfinite(w)) ? 1u : 0u;
    out[k] = w * decode;
  }
  return bad;
}

/// `kUpdate`: the results go through `u` (update8) instead of into `a.data`; without it `u` is
/// not read. A template argument rather than a branch, so that the kernel without an update has
/// no test in its loops and holds no register for one: it compiles to the same code as a kernel
/// that knows nothing of updates. Every variant must stay within 64 registers, so that two
/// blocks of 512 threads still fit on an SM (Options::compressed_reduce_blocks allows two per SM,
/// and a block must never wait for a place while its partners wait at a barrier). A GPU test
/// reads each variant's count (tests/gpu/test_nccl_kernels.cu); launch bounds of 2 blocks per SM
/// would force it, but change the code of the variants that need fewer.
template <class Wire, bool kUpdate, class Window = LsaWindow>
__global__ void __launch_bounds__(kCompressedReduceThreads)
    compressed_reduce_kernel(CompressedReduceKernelArgs a, FusedUpdate u) {
  const Window window(a);
  const std::size_t vectors = a.shard / 8;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t slot_bytes = a.slot * sizeof(Wire);
  const std::size_t gather_offset = static_cast<std::size_t>(a.world) * slot_bytes;
  const std::size_t flags_offset = 2 * gather_offset;
  const std::size_t shard = a.shard;
  const std::uint64_t deadline = global_ns() + a.timeout_ns;
  std::uint32_t epoch = a.epochs[blockIdx.x];
  unsigned bad = 0;

  // Stopped before it started (a kernel queued behind a collective that hung, its communicator
  // aborted since): touch no window; the result is not whole.
  __shared__ int stopped;
  if (threadIdx.x == 0) stopped = *static_cast<volatile int*>(a.stop);
  __syncthreads();
  if (stopped != 0) {
    if (threadIdx.x == 0 && a.nonfinite != nullptr) atomicAdd(reinterpret_cast<unsigned long long*>(a.nonfinite), 1ull);
    return;
  }

  // 1. The others' shards, encoded, into their reduce-scatter inbox, slot `rank`.
  for (int step = 1; step < a.world; ++step) {
    const int peer = (a.rank + step) % a.world;
    auto* inbox = static_cast<uint4*>(window.peer(static_cast<std::size_t>(a.rank) * slot_bytes, peer));
    for (std::size_t v = first; v < vectors; v += stride) {
      float x[8];
      load8(a.data, a.count, static_cast<std::size_t>(peer) * shard + v * 8, x);
      WirePack<Wire> pack;
#pragma unroll
      for (int k = 0; k < 8; ++k) pack.v[k] = Convert<Wire>::narrow(x[k] * a.encode);
      inbox[v] = pack.word;
    }
  }
  if (!meet(a, window, flags_offset, epoch, deadline)) return;

  // 2. This rank's shard: its own float32 values plus the others' 16-bit ones, rounded once.
  for (std::size_t v = first; v < vectors; v += stride) {
    const std::size_t e = static_cast<std::size_t>(a.rank) * shard + v * 8;
    float acc[8];
    load8(a.data, a.count, e, acc);
#pragma unroll
    for (int k = 0; k < 8; ++k) acc[k] *= a.encode;
    for (int q = 0; q < a.world; ++q) {
      if (q == a.rank) continue;
      WirePack<Wire> in;
      in.word = static_cast<const uint4*>(window.local(static_cast<std::size_t>(q) * slot_bytes, a.rank))[v];
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += Convert<Wire>::widen(in.v[k]);
    }
    WirePack<Wire> out;
#pragma unroll
    for (int k = 0; k < 8; ++k) out.v[k] = Convert<Wire>::narrow(acc[k]);
    for (int step = 1; step < a.world; ++step) {
      const int peer = (a.rank + step) % a.world;
      static_cast<uint4*>(window.peer(gather_offset + static_cast<std::size_t>(a.rank) * slot_bytes, peer))[v] =
          out.word;
    }
    float r[8];
    bad += decode8(out, a.decode, e < a.count ? a.count - e : 0, r);
    if constexpr (kUpdate) {
      update8(u, a.count, e, r);
    } else {
      store8(a.data, a.count, e, r);
    }
  }
  if (!meet(a, window, flags_offset, epoch, deadline)) return;

  // 3. The others' shards, decoded from the all-gather inbox.
  for (int q = 0; q < a.world; ++q) {
    if (q == a.rank) continue;
    const auto* inbox =
        static_cast<const uint4*>(window.local(gather_offset + static_cast<std::size_t>(q) * slot_bytes, a.rank));
    for (std::size_t v = first; v < vectors; v += stride) {
      const std::size_t e = static_cast<std::size_t>(q) * shard + v * 8;
      WirePack<Wire> in;
      in.word = inbox[v];
      float r[8];
      bad += decode8(in, a.decode, e < a.count ? a.count - e : 0, r);
      if constexpr (kUpdate) {
        update8(u, a.count, e, r);
      } else {
        store8(a.data, a.count, e, r);
      }
    }
  }
  if (threadIdx.x == 0) a.epochs[blockIdx.x] = epoch;

  if (a.nonfinite != nullptr) {
    for (int offset = 16; offset > 0; offset /= 2) bad += __shfl_down_sync(0xffffffffu, bad, offset);
    if (threadIdx.x % 32 == 0 && bad != 0) {
      atomicAdd(reinterpret_cast<unsigned long long*>(a.nonfinite), static_cast<unsigned long long>(bad));
    }
  }
}

template <class Wire, class Window>
void launch_compressed_reduce_of(const CompressedReduceArgs& args, cudaStream_t stream) {
  if (args.update.values != nullptr) {
    compressed_reduce_kernel<Wire, true, Window>
        <<<args.blocks, kCompressedReduceThreads, 0, stream>>>(args, args.update);
  } else {
    compressed_reduce_kernel<Wire, false, Window>
        <<<args.blocks, kCompressedReduceThreads, 0, stream>>>(args, FusedUpdate{});
  }
}

/// One call of the kernel, the windows reached through `Window` (LsaWindow in a communicator).
template <class Window = LsaWindow>
cudaError_t launch_compressed_reduce(const CompressedReduceArgs& args, cudaStream_t stream) {
  if (args.wire == DataType::kFloat16) {
    launch_compressed_reduce_of<__half, Window>(args, stream);
  } else if (args.wire == DataType::kBFloat16) {
    launch_compressed_reduce_of<__nv_bfloat16, Window>(args, stream);
  } else {
    return cudaErrorInvalidValue;  // the workspace admits only these two
  }
  return cudaGetLastError();
}

/// Registers the launcher for the whole program (see kernel_hooks.hpp).
inline const bool kCompressedReduceLauncherRegistered =
    (compressed_reduce_launcher() = &launch_compressed_reduce<LsaWindow>, true);

/// What the kernel's pointer arithmetic makes of `window` for this rank's byte 0 (kernel_hooks.hpp,
/// WindowProbeLauncher): read the way the kernel reads it, so that the check tests this build's
/// view of the structure. Computes addresses only; dereferences none of them.
template <int = 0>  // a template of nothing: defined in every .cu that includes it, without a clash
__global__ void window_probe_kernel(void* window, int lsa_rank, void** out) {
  const auto w = static_cast<ncclWindow_t>(window);
  out[0] = ncclGetLocalPointer(w, 0);
  out[1] = ncclGetLsaPointer(w, 0, lsa_rank);
}

inline cudaError_t launch_window_probe(void* window, int lsa_rank, void** out, cudaStream_t stream) {
  window_probe_kernel<><<<1, 1, 0, stream>>>(window, lsa_rank, out);
  return cudaGetLastError();
}

inline const bool kWindowProbeLauncherRegistered = (window_probe_launcher() = &launch_window_probe, true);

}  // namespace ncclkit::nccl::detail

#endif  // NCCL 2.28
