#pragma once
/// The state behind a Communicator (held by pointer, so that a Communicator moves cheaply
/// and an open group can refer to it), and the helpers the communicator and the group guard
/// share. Internal: use ncclkit/nccl/communicator.hpp.

#include <cuda_runtime_api.h>  // cudaStream_t
#include <nccl.h>              // ncclComm_t, ncclCommGetAsyncError

#include <algorithm>  // std::any_of, std::all_of
#include <chrono>     // std::chrono
#include <cstddef>    // std::size_t, std::ptrdiff_t
#include <cstdint>    // std::uint64_t
#include <memory>     // std::shared_ptr
#include <mutex>      // std::unique_lock
#include <optional>   // std::nullopt
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/core/detail/communicator_label.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/checked_pointers.hpp"
#include "ncclkit/nccl/detail/watchdog.hpp"
#include "ncclkit/nccl/options.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::nccl::detail {

/// A collective issued inside an open group, waiting for the group's end to be tracked.
struct PendingOp {
  std::uint64_t seq = 0;
  const char* operation = "";
  std::size_t bytes = 0;
  cudaStream_t stream = nullptr;
};

struct CommCore {
  Options options;  ///< as resolved: device and timeout filled in
  int rank = 0;
  int size = 1;
  int device = 0;
  Watchdog watchdog;
  Stream own_comm_stream;
  Stream own_side_stream;  ///< Communicator::side_stream(), made on first use
  /// Options::stream, else cudaStreamLegacy (CUDA's legacy default stream of this GPU).
  cudaStream_t default_stream = cudaStreamLegacy;
  cudaStream_t comm_stream = nullptr;
  std::shared_ptr<Store> scope;  ///< this communicator's keys; null for single-process groups
  std::uint64_t splits = 0;      ///< split() calls so far (scopes the children's keys)
  std::uint64_t checks = 0;      ///< collectives compared by Options::check_collectives so far
  std::vector<PendingOp> pending;
  /// Has ops (watched or captured) queued in this thread's open group (set under the
  /// handle's lock by the issue path, cleared by GroupGuard::end): the group's end must hold
  /// this handle, and the watchdog must not abort it before then.
  bool joined = false;
  Event sync_event;                  ///< recorded by synchronize()
  void* scratch = nullptr;           ///< 8 bytes of device memory for barrier()
  CheckedPointers checked_pointers;  ///< buffers already found to be device memory of this GPU
  CheckedPointers checked_streams{destroyed_stream_generation()};  ///< streams found to be of this GPU
  /// Why the last prepare_compressed_reduce gave none after its window check, or empty.
  std::string compressed_reduce_problem;
  /// Whether prepare_compressed_reduce warned already that the fused kernel cannot run here.
  bool warned_unfused = false;

  CommHandle& handle() { return watchdog.handle(); }

  /// "nccl communicator 'grads' (rank 1 of 4, GPU 1)", for messages.
  std::string who() const {
    return ncclkit::detail::communicator_label("nccl", options.name, rank, size, "GPU " + std::to_string(device));
  }

  /// Hands the ops queued during a group that just ended to the watchdog: one completion
  /// event per stream, recorded after the group's kernels. A group on one stream may join the
  /// burst before it on that stream (Watchdog::track's `merge`), as a single collective does:
  /// one thread driving several GPUs (-g) issues a group per step, and without this each
  /// communicator took a fresh event from its pool every step.
  void commit_pending() {
    if (pending.empty()) return;
    // Emptied however this ends (track throws when cudaEventRecord fails), keeping its storage.
    struct Clear {
      std::vector<PendingOp>& ops;
      ~Clear() { ops.clear(); }
    } clear{pending};
    const cudaStream_t first_stream = pending.front().stream;
    const bool one_stream =
        std::all_of(pending.begin(), pending.end(), [&](const PendingOp& op) { return op.stream == first_stream; });
    for (std::size_t i = 0; i < pending.size(); ++i) {
      const cudaStream_t stream = pending[i].stream;
      const auto same_stream = [&](const PendingOp& op) { return op.stream == stream; };
      if (std::any_of(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(i), same_stream)) {
        continue;  // this stream's ops were committed with its first one
      }
      std::uint64_t last = pending[i].seq;
      std::size_t bytes = 0;
      int count = 0;
      for (std::size_t j = i; j < pending.size(); ++j) {
        if (pending[j].stream != stream) continue;
        last = pending[j].seq;
        bytes += pending[j].bytes;
        ++count;
      }
      watchdog.track(pending[i].seq, last, pending[i].operation, count, bytes, stream, std::nullopt,
                     /*merge=*/one_stream);
      if (one_stream) break;  // that record holds all of it
    }
  }
};

/// Polls ncclCommGetAsyncError while it says ncclInProgress (a non-blocking communicator
/// still setting up or enqueueing), releasing the handle's lock between polls so that the
/// watchdog can act. Returns the final status; TimeoutError at `deadline`.
inline ncclResult_t wait_while_in_progress(CommCore& core, Clock::time_point deadline, const std::string& what,
                                           bool control = false) {
  ncclkit::detail::Backoff backoff({.first = std::chrono::microseconds(1), .cap = std::chrono::milliseconds(1)});
  while (true) {
    ncclResult_t state = ncclSuccess;
    {
      std::unique_lock lock(core.handle().mutex);
      if (core.handle().aborted) return ncclRemoteError;  // the watchdog took it down meanwhile
      const ncclResult_t status = ncclCommGetAsyncError(control ? core.handle().control : core.handle().comm, &state);
      if (status != ncclSuccess) return status;
    }
    if (state != ncclInProgress) return state;
    if (Clock::now() >= deadline) {
      throw TimeoutError(what + " on " + core.who() + " was still in progress after the timeout of " +
                         std::to_string(core.options.timeout.count()) + " ms");
    }
    backoff.sleep(deadline);
  }
}

}  // namespace ncclkit::nccl::detail
