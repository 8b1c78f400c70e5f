#pragma once
/// Options of an NCCL communicator. Every field has a default that works; set the ones you
/// need with designated initialisers:
///   ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "grads"}
/// An NCCLKIT_ environment variable that names a field overrides it, when set, at the
/// communicator's creation (core/knobs.hpp); options() returns the values in force.
///
/// Host code only: compiles with g++ given the CUDA include folder.

#include <cuda_runtime_api.h>  // cudaStream_t

#include <chrono>   // std::chrono::milliseconds
#include <cstdint>  // std::int64_t
#include <limits>   // std::numeric_limits
#include <string>   // std::string

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/knobs.hpp"

namespace ncclkit::nccl {

/// Options::stream_priority's default: below every GPU's range, so clamped to its highest.
inline constexpr int kHighestStreamPriority = std::numeric_limits<int>::min();

struct Options {
  /// GPU to use; -1: the local rank modulo the number of visible GPUs (the launcher, like
  /// torchrun, leaves CUDA_VISIBLE_DEVICES alone).
  int device = -1;
  /// How long a collective may stay in flight, and communicator init may take, before the
  /// communicator is aborted. Zero: 600 s. NCCLKIT_TIMEOUT overrides it.
  std::chrono::milliseconds timeout{0};
  /// ncclConfig_t knobs; -1 / empty leave NCCL's default in force. NCCL's variables
  /// (NCCL_CGA_CLUSTER_SIZE, NCCL_MIN_CTAS, NCCL_MAX_CTAS, NCCL_NET) override them, as NCCL
  /// decides; NCCL caps CTA counts above its channel limit (64 in 2.28) to that limit.
  int cga_cluster_size = -1;  ///< CGA cluster size of NCCL kernels, 0..8 (Hopper and newer)
  int min_ctas = -1;          ///< lower bound on the CTAs (channels) NCCL uses, >= 1
  int max_ctas = -1;          ///< upper bound on the CTAs NCCL uses (leaves SMs to compute), >= min_ctas
  std::string net_name{};     ///< network by name: NCCL's "IB" or "Socket", or a net plugin's
  /// Priority of comm_stream() (cudaDeviceGetStreamPriorityRange: lower numbers run first).
  /// The default, kHighestStreamPriority, is the GPU's highest: reductions overlapped with
  /// backward then take SMs as backward's kernels end instead of queueing behind the kernels
  /// launched after them (on the cuBLAS MLP of docs/performance.md, fp32 steps were 6–10%
  /// slower at 0). A value outside the GPU's range is clamped to it, as CUDA does; options()
  /// reports the priority the stream got.
  int stream_priority = kHighestStreamPriority;
  /// Name used in logs, error messages, NCCL's commName and the store scope.
  std::string name = "nccl";
  /// The communicator's default stream (where compute runs); null: it creates its own.
  /// Not owned: must outlive the communicator.
  cudaStream_t stream = nullptr;
  /// Check with cudaPointerGetAttributes that buffers are device memory of this
  /// communicator's GPU, and that streams not made by the communicator belong to it, before
  /// NCCL sees them. The last 64 buffers found good are remembered (freeing memory through
  /// ncclkit forgets them), so a loop over the same buffers pays for the query once; a new
  /// buffer costs a few hundred nanoseconds. NCCLKIT_CHECK_POINTERS overrides it.
  bool check_pointers = knob_default<bool>("NCCLKIT_CHECK_POINTERS");
  /// Compare every collective's arguments across ranks before it is issued (collective,
  /// element type, count, op, root, and the call's number), through the store; a difference
  /// is a CollectiveMismatchError on every rank. Costs store round trips per collective
  /// (docs/collectives.md). NCCLKIT_CHECK_COLLECTIVES overrides it. Every rank must set it
  /// alike (compared at creation). Members of a LocalGroup are not checked (they have no store).
  bool check_collectives = knob_default<bool>("NCCLKIT_CHECK_COLLECTIVES");

  // ---- the kernels ncclkit runs beside NCCL's (casts, batched copies, the fused reduction) ----

  /// Most 256-thread blocks per SM of the codec's cast kernels, 1 to 8: they run beside NCCL's
  /// kernels, which need SMs too. NCCLKIT_CODEC_BLOCKS_PER_SM overrides it.
  int codec_blocks_per_sm = knob_default<int>("NCCLKIT_CODEC_BLOCKS_PER_SM");
  /// Blocks per SM of the batched copy (loose tensors packed and unpacked), 0 to 8. 0: one
  /// short-lived block per chunk, so that NCCL's kernels on a high-priority stream get SMs within
  /// a chunk's time; 1 to 8: at most this many per SM, each looping over chunks (slower beside
  /// NCCL: docs/performance.md). NCCLKIT_COPY_BLOCKS_PER_SM overrides it.
  int copy_blocks_per_sm = knob_default<int>("NCCLKIT_COPY_BLOCKS_PER_SM");
  /// KiB one block of the batched copy moves at a time: a power of two from 4 to 1024, fixed
  /// when a batch is prepared. NCCLKIT_COPY_CHUNK_KB overrides it.
  int copy_chunk_kb = knob_default<int>("NCCLKIT_COPY_CHUNK_KB");
  /// Whether prepare_compressed_reduce may give the fused compressed all-reduce (false: a
  /// GradientSync with a codec casts around NCCL's 16-bit all-reduce instead).
  /// NCCLKIT_COMPRESSED_REDUCE overrides it.
  bool compressed_reduce = knob_default<bool>("NCCLKIT_COMPRESSED_REDUCE");
  /// 512-thread blocks of the fused compressed all-reduce; 0: one per SM (NVLink's bandwidth),
  /// else at most 2 x the GPU's SMs (more could leave partners of its barrier waiting for a
  /// place on the GPU). The kernel gets the fewest any rank asks for.
  /// NCCLKIT_COMPRESSED_REDUCE_BLOCKS overrides it.
  int compressed_reduce_blocks = knob_default<int>("NCCLKIT_COMPRESSED_REDUCE_BLOCKS");
};

namespace detail {

/// `options` with the environment's overrides applied (the rule of core/knobs.hpp); a variable
/// set to a value it cannot take is a ConfigError naming it.
inline Options with_environment(Options options) {
  options.timeout = environment_overrides(knob("NCCLKIT_TIMEOUT"), options.timeout);
  options.check_pointers = environment_overrides(knob("NCCLKIT_CHECK_POINTERS"), options.check_pointers);
  options.check_collectives = environment_overrides(knob("NCCLKIT_CHECK_COLLECTIVES"), options.check_collectives);
  options.codec_blocks_per_sm = environment_overrides(knob("NCCLKIT_CODEC_BLOCKS_PER_SM"), options.codec_blocks_per_sm);
  options.copy_blocks_per_sm = environment_overrides(knob("NCCLKIT_COPY_BLOCKS_PER_SM"), options.copy_blocks_per_sm);
  options.copy_chunk_kb = environment_overrides(knob("NCCLKIT_COPY_CHUNK_KB"), options.copy_chunk_kb);
  options.compressed_reduce = environment_overrides(knob("NCCLKIT_COMPRESSED_REDUCE"), options.compressed_reduce);
  options.compressed_reduce_blocks =
      environment_overrides(knob("NCCLKIT_COMPRESSED_REDUCE_BLOCKS"), options.compressed_reduce_blocks);
  return options;
}

/// The largest cgaClusterSize NCCL takes (NCCL_MAX_CGA_CLUSTER_SIZE, the portable CUDA limit).
inline constexpr int kMaxCgaClusterSize = 8;

/// Refuses ncclConfig_t knobs NCCL would reject (with a bare "invalid argument" at init) or
/// silently treat as "default": values below -1, 0 CTAs, min_ctas above max_ctas, a cluster
/// size above 8. `who` names the communicator in the message.
inline void check_nccl_knobs(const Options& options, const std::string& who) {
  const auto refuse = [&](const std::string& what) { throw ConfigError(who + ": " + what); };
  if (options.cga_cluster_size < -1 || options.cga_cluster_size > kMaxCgaClusterSize) {
    refuse("Options::cga_cluster_size " + std::to_string(options.cga_cluster_size) + " is out of range; give 0.." +
           std::to_string(kMaxCgaClusterSize) + " (0: no clusters), or -1 for NCCL's default");
  }
  if (options.min_ctas == 0 || options.min_ctas < -1) {
    refuse("Options::min_ctas " + std::to_string(options.min_ctas) +
           " is out of range; give at least 1 CTA, or -1 for NCCL's default");
  }
  if (options.max_ctas == 0 || options.max_ctas < -1) {
    refuse("Options::max_ctas " + std::to_string(options.max_ctas) +
           " is out of range; give at least 1 CTA, or -1 for NCCL's default");
  }
  if (options.min_ctas > 0 && options.max_ctas > 0 && options.min_ctas > options.max_ctas) {
    refuse("Options::min_ctas " + std::to_string(options.min_ctas) + " is above Options::max_ctas " +
           std::to_string(options.max_ctas) + "; give min_ctas <= max_ctas");
  }
  const struct {
    const Knob& knob;
    const char* field;
    int value;
  } kernel_knobs[] = {
      {knob("NCCLKIT_CODEC_BLOCKS_PER_SM"), "Options::codec_blocks_per_sm", options.codec_blocks_per_sm},
      {knob("NCCLKIT_COPY_BLOCKS_PER_SM"), "Options::copy_blocks_per_sm", options.copy_blocks_per_sm},
      {knob("NCCLKIT_COPY_CHUNK_KB"), "Options::copy_chunk_kb", options.copy_chunk_kb},
      {knob("NCCLKIT_COMPRESSED_REDUCE_BLOCKS"), "Options::compressed_reduce_blocks", options.compressed_reduce_blocks},
  };
  for (const auto& k : kernel_knobs) {
    if (std::string problem = knob_field_problem(k.knob, k.field, k.value); !problem.empty()) refuse(problem);
  }
  if (options.net_name.find('\0') != std::string::npos) {
    refuse("Options::net_name contains a NUL character; give the network's name alone, such as \"Socket\"");
  }
}

}  // namespace detail

}  // namespace ncclkit::nccl
