#pragma once
/// Options of an NCCL communicator. Every field has a default that works; set the ones you
/// need with designated initialisers:
///   ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "grads"}
///
/// Host code only: compiles with g++ given the CUDA include folder.

#include <cuda_runtime_api.h>  // cudaStream_t

#include <chrono>  // std::chrono::milliseconds
#include <string>  // std::string

#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"

namespace ncclkit::nccl {

namespace detail {
/// NCCLKIT_CHECK_POINTERS=0 turns the cudaPointerGetAttributes checks off by default.
inline bool default_check_pointers() {
  auto value = env_int("NCCLKIT_CHECK_POINTERS");
  return !value || *value != 0;
}
}  // namespace detail

struct Options {
  /// GPU to use; -1: the local rank modulo the number of visible GPUs (the launcher, like
  /// torchrun, leaves CUDA_VISIBLE_DEVICES alone).
  int device = -1;
  /// How long a collective may stay in flight, and communicator init may take, before the
  /// communicator is aborted. Zero: NCCLKIT_TIMEOUT seconds, else 600 s.
  std::chrono::milliseconds timeout{0};
  /// ncclConfig_t knobs; -1 / empty leave NCCL's default in force. NCCL's variables
  /// (NCCL_CGA_CLUSTER_SIZE, NCCL_MIN_CTAS, NCCL_MAX_CTAS, NCCL_NET) override them, as NCCL
  /// decides; NCCL caps CTA counts above its channel limit (64 in 2.28) to that limit.
  int cga_cluster_size = -1;  ///< CGA cluster size of NCCL kernels, 0..8 (Hopper and newer)
  int min_ctas = -1;          ///< lower bound on the CTAs (channels) NCCL uses, >= 1
  int max_ctas = -1;          ///< upper bound on the CTAs NCCL uses (leaves SMs to compute), >= min_ctas
  std::string net_name{};     ///< network by name: NCCL's "IB" or "Socket", or a net plugin's
  /// Priority of comm_stream() (cudaDeviceGetStreamPriorityRange: lower numbers run first;
  /// -1 or lower lets NCCL kernels overtake compute kernels waiting for SMs).
  int stream_priority = 0;
  /// Name used in logs, error messages, NCCL's commName and the store scope.
  std::string name = "nccl";
  /// The communicator's default stream (where compute runs); null: it creates its own.
  /// Not owned: must outlive the communicator.
  cudaStream_t stream = nullptr;
  /// Check with cudaPointerGetAttributes that buffers are device memory of this
  /// communicator's GPU, and that streams not made by the communicator belong to it, before
  /// NCCL sees them. The last 64 buffers found good are remembered (freeing memory through
  /// ncclkit forgets them), so a loop over the same buffers pays for the query once; a new
  /// buffer costs a few hundred nanoseconds. NCCLKIT_CHECK_POINTERS=0 turns it off by default.
  bool check_pointers = detail::default_check_pointers();
  /// Compare every collective's arguments across ranks before it is issued (collective,
  /// element type, count, op, root, and the call's number), through the store; a difference
  /// is a CollectiveMismatchError on every rank. Costs store round trips per collective
  /// (docs/collectives.md). Default: NCCLKIT_CHECK_COLLECTIVES. Every rank must set it alike
  /// (compared at creation). Members of a LocalGroup are not checked (they have no store).
  bool check_collectives = default_check_collectives();
};

namespace detail {

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
  if (options.net_name.find('\0') != std::string::npos) {
    refuse("Options::net_name contains a NUL character; give the network's name alone, such as \"Socket\"");
  }
}

}  // namespace detail

}  // namespace ncclkit::nccl
