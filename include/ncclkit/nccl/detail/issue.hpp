#pragma once
/// The issue path of every collective: the one NCCL call (or group of them) under the handle's
/// lock, its sequence number and completion event for the watchdog, the errors NCCL returns,
/// and the cross-rank argument comparison of Options::check_collectives. Internal: used by
/// ncclkit/nccl/communicator.hpp.

#include <cuda_runtime_api.h>  // cudaStream_t, cudaStreamLegacy
#include <nccl.h>              // ncclComm_t, ncclResult_t

#include <cstddef>   // std::size_t
#include <cstdint>   // std::uint64_t
#include <mutex>     // std::unique_lock
#include <optional>  // std::optional
#include <string>    // std::string

#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/detail/nvtx.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/check_exchange.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"
#include "ncclkit/nccl/group.hpp"
#include "ncclkit/nccl/stream.hpp"

namespace ncclkit::nccl::detail {

/// What a call learnt of its stream before anything was issued, handed explicitly to the
/// checks and to issue() (nothing of it is kept in the communicator between calls).
struct CallStream {
  /// Where the work goes. cudaStreamLegacy (no stream given, Options::stream unset) is CUDA's
  /// legacy default stream of the communicator's GPU.
  cudaStream_t stream = nullptr;
  /// The stream is capturing a CUDA graph: no CUDA query beyond the capture query is made, and
  /// the work is not watched (the user's graph replays it).
  bool capturing = false;
  /// The call runs with the communicator's GPU current, because its stream is a handle that
  /// names a stream per device (the legacy default stream).
  bool on_own_device = false;

  /// The handle NCCL gets: its null stream for the legacy one (NCCL, built without per-thread
  /// default streams, takes 0 as the legacy stream; it is the handle NCCL's users pass).
  cudaStream_t for_nccl() const { return stream == cudaStreamLegacy ? nullptr : stream; }
};

/// Fails the communicator over the collective being issued (`seq`; 0: it takes the next
/// number, so that the report names it) and throws the CommError.
[[noreturn]] inline void fail_issue(CommCore& core, const char* operation, std::size_t bytes, const std::string& reason,
                                    std::uint64_t seq = 0) {
  core.watchdog.request_failure(reason, seq != 0 ? seq : core.watchdog.next_seq(), operation, bytes);
  core.watchdog.throw_failure(group_state().depth == 0);
}

/// Usage errors leave the communicator usable (NcclError); anything else fails it (CommError).
[[noreturn]] inline void on_nccl_error(CommCore& core, ncclResult_t status, const char* operation,
                                       std::size_t bytes = 0, std::uint64_t seq = 0) {
  if (status == ncclInvalidArgument || status == ncclInvalidUsage) {
    throw NcclError("ncclkit: " + std::string(operation) + " on " + core.who() + ": NCCL rejected the call: " +
                    describe_nccl_error(status, core.handle().aborted ? nullptr : core.handle().comm));
  }
  fail_issue(core, operation, bytes, "NCCL returned " + describe_nccl_error(status) + " when it was issued", seq);
}

/// Options::check_collectives: compares this call's arguments with every rank's through the
/// store before it is issued (check_exchange.hpp), inside an open group too (each call before
/// it is queued). A mismatch throws CollectiveMismatchError on every rank, with nothing
/// issued: the communicator stays usable. A rank that does not arrive within the timeout
/// fails the communicator (CommError), as a collective that never completes would.
inline void check_collective(CommCore& core, const char* operation, CollectiveFingerprint fingerprint) {
  if (!core.options.check_collectives || core.size == 1 || !core.scope) return;
  core.watchdog.throw_if_failed(group_state().depth == 0);
  fingerprint.sequence = ++core.checks;
  try {
    exchange_fingerprints(*core.scope, core.rank, core.size, core.checks, fingerprint, core.options.timeout,
                          core.who());
  } catch (const CollectiveMismatchError& e) {
    log_error(e.what());
    throw;
  } catch (const std::exception& e) {
    fail_issue(core, operation, 0, e.what());
  }
}

/// Calls `call(comm, stream)` (one NCCL call, or a group of them) under the handle's lock,
/// waits out ncclInProgress, and hands the op to the watchdog (or to the open group).
template <class Call>
void issue(CommCore& core, const char* operation, std::size_t bytes, const CallStream& stream, Call&& call) {
  auto& group = group_state();
  const bool grouped = group.depth > 0;
  // In a group, without waiting for the report: a member with ops queued holds its abort
  // (and so its report) back until the group's end (handle_failure, detail/watchdog_thread.hpp).
  core.watchdog.throw_if_failed(!grouped);
  ncclkit::detail::NvtxRange range(operation);
  // Only for the legacy default stream, which names a stream per device: NCCL's launch and
  // the completion event must find it on this communicator's GPU.
  std::optional<DeviceGuard> on_device;
  if (stream.on_own_device) on_device.emplace(core.device);
  // The sequence number is taken before the call, so that a call that never returns is
  // reported under its own number; captured collectives (replayed by the user's graph) get
  // none.
  const bool watched = !stream.capturing;
  const std::uint64_t seq = watched ? core.watchdog.next_seq() : 0;
  ncclResult_t status;
  Clock::time_point issued;
  {
    std::unique_lock lock(core.handle().mutex);
    if (core.handle().aborted) {
      lock.unlock();
      core.watchdog.throw_failure(!grouped);
    }
    issued = core.handle().enter(seq, operation, bytes);
    status = call(core.handle().comm, stream.for_nccl());
    core.handle().leave();
    // Queued in the open group (captured ops too): join it before the lock is released, so
    // that the watchdog, which aborts under this lock, holds the abort until the group's end
    // has launched the op (an abort before would leave ncclGroupEnd a freed communicator).
    if (grouped && !core.joined && (status == ncclSuccess || status == ncclInProgress)) join_group(core);
  }
  if (status == ncclInProgress && !grouped) {
    try {
      status = wait_while_in_progress(core, Clock::now() + core.options.timeout, operation);
    } catch (const TimeoutError& e) {
      fail_issue(core, operation, bytes, e.what(), seq);
    }
  }
  if (status != ncclSuccess && status != ncclInProgress) {
    if (watched && (status == ncclInvalidArgument || status == ncclInvalidUsage)) core.watchdog.undo_seq();
    on_nccl_error(core, status, operation, bytes, seq);
  }
  if (!watched) return;
  if (grouped) {
    core.pending.push_back({seq, operation, bytes, stream.stream});
  } else {
    core.watchdog.track(seq, seq, operation, 1, bytes, stream.stream, issued, /*merge=*/true);
  }
}

}  // namespace ncclkit::nccl::detail
