#pragma once
/// Options of an NCCL communicator. Every field has a default that works; set the ones you
/// need with designated initialisers:
///   ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "grads"}
///
/// Host code only: compiles with g++ given the CUDA include folder.

#include <cuda_runtime_api.h>  // cudaStream_t

#include <chrono>  // std::chrono::milliseconds
#include <string>  // std::string

#include "ncclkit/core/env.hpp"

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
  /// ncclConfig_t knobs; -1 / empty leave NCCL's default (or its NCCL_* variable) in force.
  int cga_cluster_size = -1;  ///< CGA cluster size of NCCL kernels (0..8 on Hopper)
  int min_ctas = -1;          ///< lower bound on the CTAs (channels) NCCL uses
  int max_ctas = -1;          ///< upper bound on the CTAs NCCL uses (leaves SMs to compute)
  std::string net_name;       ///< network plugin/transport by name ("IB", "Socket")
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
};

}  // namespace ncclkit::nccl
