#pragma once
/// Hooks through which host code (compiled by g++ or nvcc) reaches the element-wise kernels of
/// ncclkit/nccl/kernels.cuh. The kernels exist only in translation units compiled by nvcc;
/// including kernels.cuh in any one of them (communicator.hpp does so under nvcc) fills the
/// hooks for the whole program.

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/update.hpp"

namespace ncclkit::nccl::detail {

/// Multiplies `count` elements of `type` at `data` by `factor` on `stream`.
using ScaleLauncher = void (*)(void* data, std::size_t count, DataType type, double factor, cudaStream_t stream);

/// The program-wide scale launcher; null until a translation unit compiled by nvcc included
/// ncclkit/nccl/kernels.cuh.
inline ScaleLauncher& scale_launcher() {
  static ScaleLauncher launcher = nullptr;
  return launcher;
}

/// out[i] = in[i] * factor converted to `out_type` (floating types), adding the number of
/// non-finite outputs to `*nonfinite` (device memory) where it is not null; at most
/// `blocks_per_sm` blocks per SM (Options::codec_blocks_per_sm).
using CastLauncher = void (*)(const void* in, DataType in_type, void* out, DataType out_type, std::size_t count,
                              double factor, std::uint64_t* nonfinite, unsigned blocks_per_sm, cudaStream_t stream);
inline CastLauncher& cast_launcher() {
  static CastLauncher launcher = nullptr;
  return launcher;
}

/// One entry of a batched copy's table in device memory: the copy, and the index of its first
/// chunk in the batch (chunks of the batch's chunk size, numbered across the batch).
struct DeviceCopy {
  void* to;
  const void* from;
  std::uint64_t bytes;
  std::uint64_t first_chunk;
};

/// Runs `count` copies (none empty) of a table in device memory, `chunks` chunks of
/// `chunk_bytes` in all (Options::copy_chunk_kb); `blocks_per_sm` is
/// Options::copy_blocks_per_sm (0: one block per chunk).
using CopyBatchLauncher = void (*)(const DeviceCopy* items, std::size_t count, std::uint64_t chunks,
                                   std::uint64_t chunk_bytes, unsigned blocks_per_sm, cudaStream_t stream);
inline CopyBatchLauncher& copy_batch_launcher() {
  static CopyBatchLauncher launcher = nullptr;
  return launcher;
}

/// The window side of one compressed all-reduce (Communicator::compressed_all_reduce): `count`
/// float32 values at `data` (16-byte aligned), reduced in place through the symmetric window
/// `window`, laid out as [reduce-scatter inbox: world slots of `slot` wire values | all-gather
/// inbox: the same | barrier flags: `blocks` x world std::uint32_t]. Rank r owns data elements
/// [r * shard, (r + 1) * shard); shard <= slot, both multiples of 8. `epochs` (device memory,
/// `blocks` values, then the word `stop` points at) carry each block's barrier count from one
/// call to the next.
struct CompressedReduceKernelArgs {
  void* window;  // an ncclWindow_t (NCCL 2.28's device API); in a test, a table (PointerTableWindow)
  float* data;
  std::size_t count;
  std::size_t slot;   // wire values per rank in each inbox (fixed by the workspace)
  std::size_t shard;  // data elements per rank in this call
  DataType wire;      // kFloat16 or kBFloat16
  float encode;
  float decode;
  std::uint64_t* nonfinite;  // null, or a counter in device memory
  std::uint32_t* epochs;
  int* stop;     // device memory: nonzero: return before touching a window (the host raises it
                 // before an abort; a block that gives up raises it for the launches behind it)
  int* gave_up;  // mapped host memory: set to 1 by a block that stopped waiting for a peer
  int rank;      // in the LSA team (every rank of the communicator)
  int world;
  int blocks;
  std::uint64_t timeout_ns;
};

/// One compressed all-reduce, and the optimizer update it may apply: with `update.values` not
/// null, the results are not written to `data` but go through update_element into
/// `update.values` and its state (core/update.hpp; each 16-byte aligned, none overlapping `data`,
/// the state pointers null where the rule keeps fewer). The kernel takes the update as a
/// parameter of its own, apart from the window side, so that the kernel without one compiles to
/// the same code whatever the update holds (a larger argument struct changes how the compiler
/// loads the arguments).
struct CompressedReduceArgs : CompressedReduceKernelArgs {
  FusedUpdate update;  // values null: none, the results go to `data`
};
inline constexpr int kCompressedReduceThreads = 512;

/// Returns the launch's error rather than throwing: it runs inside the issue path's NCCL-call
/// bracket (detail/issue.hpp), which an exception would leave open.
using CompressedReduceLauncher = cudaError_t (*)(const CompressedReduceArgs& args, cudaStream_t stream);
inline CompressedReduceLauncher& compressed_reduce_launcher() {
  static CompressedReduceLauncher launcher = nullptr;
  return launcher;
}

/// Writes to out[0] and out[1] (memory the GPU writes and the host reads: mapped host memory)
/// the addresses the compressed all-reduce's kernel computes for byte 0 of this rank's part of
/// `window`: NCCL's local pointer, and its pointer for LSA rank `lsa_rank` (this rank). Both must
/// lead to the memory the window registered (NCCL maps it anew, so they are not its pointer, but
/// read what it holds); they do not where the NCCL that runs lays out its window structure
/// otherwise than the headers the kernel was compiled against (CompressedReduce::create).
using WindowProbeLauncher = cudaError_t (*)(void* window, int lsa_rank, void** out, cudaStream_t stream);

inline WindowProbeLauncher& window_probe_launcher() {
  static WindowProbeLauncher launcher = nullptr;
  return launcher;
}

/// One optimizer update (core/update.hpp) of `count` float32 parameters by as many gradients: the
/// update's state (null where the rule keeps none) and bfloat16 copy (null: none) alike.
using UpdateLauncher = void (*)(const FusedUpdate& update, const float* grad, std::size_t count, cudaStream_t stream);
inline UpdateLauncher& update_launcher() {
  static UpdateLauncher launcher = nullptr;
  return launcher;
}
/// Adds the sum of squares of `count` elements of `type` to out[0] (`out`: kSquareSumWords
/// doubles of device memory, the rest its scratch), the same bits for the same input.
using SumSquaresLauncher = void (*)(const void* in, DataType type, std::size_t count, double* out, cudaStream_t stream);
inline SumSquaresLauncher& sum_squares_launcher() {
  static SumSquaresLauncher launcher = nullptr;
  return launcher;
}

}  // namespace ncclkit::nccl::detail
