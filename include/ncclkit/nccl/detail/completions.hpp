#pragma once
/// Retiring the watchdog's work in flight as it completes: the watchdog thread's poll of the
/// completion events, which also finds the work that is overdue or failed on the GPU, and
/// the bookkeeping of what counts as completed. Internal: part of the watchdog
/// (ncclkit/nccl/detail/watchdog.hpp).
///
/// Host code only: compiles with g++ given the CUDA and NCCL include folders.

#include <cuda_runtime_api.h>  // cudaEvent_t, cudaEventQuery, cudaGetLastError

#include <chrono>   // std::chrono
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <mutex>    // std::lock_guard

#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/watchdog_state.hpp"
#include "ncclkit/nccl/detail/work_record.hpp"
#include "ncclkit/nccl/failure_report.hpp"

namespace ncclkit::nccl::detail {

/// Single collectives (and one-stream groups) issued on one stream within this time of the
/// first one in flight share its record: its event is recorded again after each (see
/// Watchdog::track).
inline constexpr std::chrono::milliseconds kBurstWindow{1};

/// Publishes `seq` as completed, never going back: a group spanning streams has a record per
/// stream, whose seq ranges overlap (NCCL holds every stream of a group until all of its work
/// is done, so the first of them to complete means the group has). Only the watchdog thread,
/// or drain() after it stopped, calls this.
inline void advance_completed(WatchdogState& s, std::uint64_t seq) {
  if (seq > s.completed.load(std::memory_order_relaxed)) s.completed.store(seq, std::memory_order_release);
}

/// Retires the front record, whose work has completed (queue_mutex held). Work that had
/// waited a peer check interval or longer is kept for synchronize() to verify.
inline void retire_front(WatchdogState& s, Clock::time_point now) {
  WorkRecord& front = s.in_flight.front();
  if (s.store && !front.verified && !s.unverified && now - front.issued >= s.peer_check) s.unverified = front;
  advance_completed(s, front.last_seq);
  s.free_events.push_back(front.event);
  s.in_flight.pop_front();
}

/// Retires completed work from the front of in_flight. Events are queried without holding
/// queue_mutex, so that the issuing thread (track) never waits for a query; while every
/// record is on one stream, one query of the newest retires all of them (a stream runs in
/// order), so a poll costs one query however much the issuing thread queued since the last.
inline void poll_completions(WatchdogState& s) {
  const auto now = Clock::now();
  cudaEvent_t newest = nullptr;
  std::uint64_t newest_last = 0;  // the newest record's last_seq when it was seen
  std::size_t records = 0;        // in in_flight when `newest` was its last
  {
    std::lock_guard lock(s.queue_mutex);
    if (s.in_flight.empty()) return;
    if (s.one_stream && s.in_flight.size() > 1) {
      newest = s.in_flight.back().event;
      newest_last = s.in_flight.back().last_seq;
      records = s.in_flight.size();
    }
  }
  if (newest != nullptr) {
    const cudaError_t status = cudaEventQuery(newest);
    if (status == cudaSuccess) {
      // Only this thread retires, and track() only appends or grows the newest record: the
      // first `records` records are the ones seen, up to `newest` (checked, in case a drain()
      // after stop() got there first). The newest is retired only if it has not grown since:
      // the query may have seen its event before the recording for the newcomer.
      std::lock_guard lock(s.queue_mutex);
      for (std::size_t i = 0; i < records && !s.in_flight.empty(); ++i) {
        const bool last = s.in_flight.front().event == newest;
        if (last && s.in_flight.front().last_seq != newest_last) break;
        retire_front(s, now);
        if (last) break;
      }
    } else if (status != cudaErrorNotReady) {
      (void)cudaGetLastError();  // the oldest record's query below reports it
    }
  }
  while (true) {
    WorkRecord front;
    {
      std::lock_guard lock(s.queue_mutex);
      if (s.in_flight.empty()) return;
      front = s.in_flight.front();
    }
    const cudaError_t status = cudaEventQuery(front.event);
    if (status == cudaSuccess) {
      std::lock_guard lock(s.queue_mutex);
      // Only this thread retires while it runs; the check guards against a drain() after
      // a stop that had to leave this thread running.
      // A record that grew since it was copied (track's `merge`) may hold work the query did
      // not cover: the next poll looks at it again.
      if (!s.in_flight.empty() && s.in_flight.front().event == front.event &&
          s.in_flight.front().first_seq == front.first_seq) {
        if (s.in_flight.front().last_seq != front.last_seq) return;
        retire_front(s, now);
      }
      continue;
    }
    if (status == cudaErrorNotReady) {
      // A burst's stamp is its first member's: the later ones may be up to kBurstWindow younger.
      const auto slack =
          s.stamp_slack + (front.merged ? std::chrono::nanoseconds(kBurstWindow) : std::chrono::nanoseconds(0));
      if (now - front.issued > s.timeout + slack) {
        request_failure(s,
                        "did not complete within the timeout of " +
                            FailureReport::format_seconds(std::chrono::duration<double>(s.timeout).count()),
                        front);
      }
    } else {
      (void)cudaGetLastError();
      request_failure(s, "CUDA reported " + describe_cuda_error(status) + " while waiting for it", front);
    }
    return;
  }
}

}  // namespace ncclkit::nccl::detail
