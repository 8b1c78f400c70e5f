#pragma once
/// The watchdog thread: its loop, the polls that find a failure (work overdue or failed on the
/// GPU, an NCCL call that does not return, NCCL's asynchronous error), and what it does on
/// one (abort, progress exchange, report). Internal: part of the watchdog
/// (ncclkit/nccl/detail/watchdog.hpp).
///
/// Host code only: compiles with g++ given the CUDA and NCCL include folders.

#include <cuda_runtime_api.h>  // cudaEventQuery, cudaSetDevice, cudaThreadExchangeStreamCaptureMode
#include <nccl.h>              // ncclComm_t, ncclCommAbort, ncclCommGetAsyncError

#include <chrono>    // std::chrono
#include <mutex>     // std::lock_guard, std::unique_lock
#include <optional>  // std::optional
#include <string>    // std::string, std::to_string
#include <utility>   // std::move

#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/comm_handle.hpp"
#include "ncclkit/nccl/detail/completions.hpp"
#include "ncclkit/nccl/detail/store_link.hpp"
#include "ncclkit/nccl/detail/watchdog_state.hpp"
#include "ncclkit/nccl/detail/work_record.hpp"
#include "ncclkit/nccl/failure_report.hpp"

namespace ncclkit::nccl::detail {

/// A blocking NCCL call that has not returned within the timeout (e.g. connection setup
/// waiting for a peer that is gone) fails the communicator; the abort releases the call.
inline void poll_issuing(WatchdogState& s) {
  const auto call = blocked_call(s.handle);
  if (!call || Clock::now() - call->issued <= s.timeout + s.stamp_slack) return;
  request_failure(s,
                  "an NCCL call did not return within the timeout of " +
                      FailureReport::format_seconds(std::chrono::duration<double>(s.timeout).count()) +
                      " (it was waiting for other ranks, e.g. to set up connections)",
                  call);
}

inline void poll_async_error(WatchdogState& s) {
  ncclResult_t async = ncclSuccess;
  {
    std::unique_lock lock(s.handle.mutex, std::defer_lock);
    // Never wait long here: the issuing thread holds the lock only for the length of one call.
    if (!lock.try_lock_for(std::chrono::milliseconds(100))) return;
    if (s.handle.aborted || s.handle.comm == nullptr) return;
    if (ncclCommGetAsyncError(s.handle.comm, &async) != ncclSuccess) return;
    if (async == ncclSuccess || async == ncclInProgress) return;
  }
  std::optional<WorkRecord> oldest;
  {
    std::lock_guard lock(s.queue_mutex);
    if (!s.in_flight.empty()) oldest = s.in_flight.front();
  }
  request_failure(s, "NCCL reported an asynchronous error: " + describe_nccl_error(async), oldest);
}

/// Aborts, exchanges progress and writes the report. Returns false to be called again:
/// while the communicator has ops queued in an open group that has not reached its end,
/// aborting it would pull the handle out from under the ncclGroupEnd that launches them
/// (the issuing thread joins a group under the handle's lock, and GroupGuard::end holds
/// that lock while it launches). Once the end runs (the issuing thread is inside an NCCL
/// call) the abort goes ahead: it may be what releases a launch stuck waiting for peers.
inline bool handle_failure(WatchdogState& s) {
  if (s.handle.open_groups.load() > 0 && !blocked_call(s.handle)) return false;

  FailureReport report;
  report.name = s.name;
  report.rank = s.rank;
  report.world = s.world;
  report.device = s.device;
  std::optional<WorkRecord> culprit;
  {
    std::lock_guard lock(s.control_mutex);
    report.reason = s.requested_reason;
    culprit = s.culprit;
  }
  {
    std::lock_guard lock(s.queue_mutex);
    if (!culprit) {
      if (!s.in_flight.empty()) culprit = s.in_flight.front();
    } else {
      // A burst may have grown since the copy was taken (track's `merge`): report all of it.
      for (const auto& record : s.in_flight) {
        if (record.first_seq == culprit->first_seq && record.event == culprit->event) {
          culprit->last_seq = record.last_seq;
          culprit->operations = record.operations;
          culprit->merged = record.merged;
          break;
        }
      }
    }
  }
  if (culprit) {
    report.has_operation = true;
    report.operation = culprit->operation;
    if (culprit->operations > 1) {
      report.operation += " (+" + std::to_string(culprit->operations - 1) +
                          (culprit->merged ? " more issued right after it on the same stream, up to seq " +
                                                 std::to_string(culprit->last_seq) + "; one of these did not complete)"
                                           : " more in one group)");
    }
    report.seq = culprit->first_seq;
    report.last_seq = culprit->last_seq;
    report.bytes = culprit->bytes;
    report.waited_s = std::chrono::duration<double>(s.detected_at - culprit->issued).count();
  }

  // Peers released by the abort must find the announcement in the store when they look
  // (synchronize() does): wait for the store link to make it, but never long.
  if (s.store) {
    std::unique_lock lock(s.control_mutex);
    s.control_cv.wait_for(lock, std::chrono::milliseconds(500), [&] { return s.announced || s.link_done; });
  }

  // Abort. The lock keeps the abort away from a thread inside NCCL; a thread that holds it
  // for long is itself stuck (e.g. a kernel launch blocked behind a hung queue), and only
  // the abort can release it: then abort without the lock.
  const auto abort_start = Clock::now();
  {
    std::unique_lock lock(s.handle.mutex, std::defer_lock);
    const bool locked = lock.try_lock_for(std::chrono::seconds(2));
    // Joined a group since the check above, or its end has just launched and not yet let go
    // of the group: once more at the next poll.
    if (locked && s.handle.open_groups.load() > 0) return false;
    if (!locked) log_warn("watchdog of '" + s.name + "': aborting while another thread is inside NCCL");
    if (!s.handle.aborted) {
      s.handle.stop_window_kernels(kWindowKernelStop);
      for (ncclComm_t* handle : {&s.handle.comm, &s.handle.control}) {
        if (*handle == nullptr) continue;
        const ncclResult_t status = ncclCommAbort(*handle);
        if (status != ncclSuccess) log_warn("ncclCommAbort returned " + describe_nccl_error(status));
        *handle = nullptr;
      }
      s.handle.aborted = true;
      report.aborted = true;
    }
  }
  report.abort_s = std::chrono::duration<double>(Clock::now() - abort_start).count();

  // Events of aborted work complete now; whatever completed counts as completed.
  {
    std::lock_guard lock(s.queue_mutex);
    while (!s.in_flight.empty()) {
      auto& front = s.in_flight.front();
      if (cudaEventQuery(front.event) != cudaSuccess) {
        (void)cudaGetLastError();
        break;
      }
      if (!culprit || front.first_seq < culprit->first_seq) advance_completed(s, front.last_seq);
      s.free_events.push_back(front.event);
      s.in_flight.pop_front();
    }
  }
  report.issued = s.issued.load();
  report.completed = s.completed.load();
  // A collective the failure is about did not complete, even if its event fired (released).
  if (culprit && culprit->first_seq > 0 && report.completed >= culprit->first_seq) {
    report.completed = culprit->first_seq - 1;
    s.completed.store(report.completed);
  }
  publish_progress(s, true, true);
  gather_peers(s, report);

  log_error(report.describe());
  std::lock_guard lock(s.control_mutex);
  s.report = std::move(report);
  s.report_ready = true;
  s.control_cv.notify_all();
  return true;
}

/// The watchdog thread (Watchdog::start): polls every `poll` interval until stopped, and
/// handles the first failure requested.
inline void run_watchdog(WatchdogState& s) {
  // The thread's CUDA calls go to the communicator's GPU; relaxed capture mode keeps its
  // event queries legal while another thread captures a CUDA graph in global mode.
  if (cudaSetDevice(s.device) != cudaSuccess) (void)cudaGetLastError();
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  (void)cudaThreadExchangeStreamCaptureMode(&mode);
  bool handled = false;
  bool deferred = false;  // a failure waits for an open group to close
  while (true) {
    {
      std::unique_lock lock(s.control_mutex);
      s.control_cv.wait_for(lock, s.poll, [&] { return s.stop || (s.failure_requested && !handled && !deferred); });
      if (s.stop) break;
    }
    if (!handled) {
      poll_completions(s);
      poll_issuing(s);
      poll_async_error(s);
      bool requested = false;
      {
        std::lock_guard lock(s.control_mutex);
        requested = s.failure_requested;
      }
      if (requested) {
        handled = handle_failure(s);
        deferred = !handled;
      }
    }
  }
  std::lock_guard lock(s.control_mutex);
  s.thread_done = true;
  s.control_cv.notify_all();
}

}  // namespace ncclkit::nccl::detail
