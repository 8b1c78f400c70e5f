#pragma once
/// Hooks through which host code (compiled by g++ or nvcc) reaches the element-wise kernels of
/// ncclkit/nccl/kernels.cuh. The kernels exist only in translation units compiled by nvcc;
/// including kernels.cuh in any one of them (communicator.hpp does so under nvcc) fills the
/// hooks for the whole program.

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>   // std::size_t
#include <cstdint>   // std::int64_t, std::uint64_t
#include <optional>  // std::optional
#include <string>    // std::to_string

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
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
/// non-finite outputs to `*nonfinite` (device memory) where it is not null.
using CastLauncher = void (*)(const void* in, DataType in_type, void* out, DataType out_type, std::size_t count,
                              double factor, std::uint64_t* nonfinite, cudaStream_t stream);
inline CastLauncher& cast_launcher() {
  static CastLauncher launcher = nullptr;
  return launcher;
}

/// Bytes of one copy that one block of the batched copy kernel moves at a time: 16 KiB, one
/// pass of a 256-thread block's unrolled loop, so that blocks are short and the grid has
/// many (the fastest of 16 to 128 KiB beside NCCL, docs/performance.md).
/// NCCLKIT_COPY_CHUNK_KB (4 to 1024, a power of two) overrides it, read once per process;
/// another value is a ConfigError naming it.
inline std::uint64_t copy_chunk_bytes() {
  static const std::uint64_t bytes = [] {
    const std::optional<std::int64_t> kb = env_int("NCCLKIT_COPY_CHUNK_KB");
    if (!kb) return std::uint64_t{16} << 10;
    if (*kb < 4 || *kb > 1024 || (*kb & (*kb - 1)) != 0) {
      throw ConfigError("environment variable NCCLKIT_COPY_CHUNK_KB=" + std::to_string(*kb) +
                        " is not a power of two from 4 to 1024 (KiB per block of the batched copy); set one, or "
                        "unset it for 16");
    }
    return static_cast<std::uint64_t>(*kb) << 10;
  }();
  return bytes;
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
/// `chunk_bytes` in all.
using CopyBatchLauncher = void (*)(const DeviceCopy* items, std::size_t count, std::uint64_t chunks,
                                   std::uint64_t chunk_bytes, cudaStream_t stream);
inline CopyBatchLauncher& copy_batch_launcher() {
  static CopyBatchLauncher launcher = nullptr;
  return launcher;
}

/// One compressed all-reduce (Communicator::compressed_all_reduce): `count` float32 values at
/// `data` (16-byte aligned), reduced in place through the symmetric window `window`, laid out
/// as [reduce-scatter inbox: world slots of `slot` wire values | all-gather inbox: the same |
/// barrier flags: `blocks` x world std::uint32_t]. Rank r owns data elements [r * shard,
/// (r + 1) * shard); shard <= slot, both multiples of 8. `epochs` (device memory, `blocks`
/// values) carry each block's barrier count from one call to the next.
struct CompressedReduceArgs {
  void* window;  // an ncclWindow_t (NCCL 2.28's device API)
  float* data;
  std::size_t count;
  std::size_t slot;   // wire values per rank in each inbox (fixed by the workspace)
  std::size_t shard;  // data elements per rank in this call
  DataType wire;      // kFloat16 or kBFloat16
  float encode;
  float decode;
  std::uint64_t* nonfinite;  // null, or a counter in device memory
  std::uint32_t* epochs;
  int* gave_up;  // mapped host memory: set to 1 by a block that stopped waiting for a peer
  int rank;      // in the LSA team (every rank of the communicator)
  int world;
  int blocks;
  std::uint64_t timeout_ns;
};
inline constexpr int kCompressedReduceThreads = 512;

/// Returns the launch's error rather than throwing: it runs inside the issue path's NCCL-call
/// bracket (detail/issue.hpp), which an exception would leave open.
using CompressedReduceLauncher = cudaError_t (*)(const CompressedReduceArgs& args, cudaStream_t stream);
inline CompressedReduceLauncher& compressed_reduce_launcher() {
  static CompressedReduceLauncher launcher = nullptr;
  return launcher;
}

/// One optimizer update (core/update.hpp) of `count` float32 parameters, gradients and state
/// values (`state0`, `state1` null where the rule keeps none).
using UpdateLauncher = void (*)(const UpdateRule& rule, float* param, const float* grad, float* state0, float* state1,
                                std::size_t count, cudaStream_t stream);
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
