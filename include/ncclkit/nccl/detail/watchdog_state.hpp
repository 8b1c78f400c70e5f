#pragma once
/// WatchdogState: everything the watchdog's threads share with the communicator (the queue of
/// work in flight and its event pool, the issued and completed counts, thread control, the
/// failure and its report, the store traffic's bookkeeping), and request_failure, which marks
/// the communicator failed. Internal: part of the watchdog (ncclkit/nccl/detail/watchdog.hpp).
///
/// Host code only: compiles with g++ given the CUDA and NCCL include folders.

#include <cuda_runtime_api.h>  // cudaEvent_t, cudaEventDestroy

#include <atomic>              // std::atomic
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // std::uint64_t
#include <deque>               // std::deque
#include <memory>              // std::shared_ptr
#include <mutex>               // std::mutex, std::lock_guard
#include <optional>            // std::optional
#include <string>              // std::string
#include <utility>             // std::move
#include <vector>              // std::vector

#include "ncclkit/nccl/detail/comm_handle.hpp"
#include "ncclkit/nccl/detail/work_record.hpp"
#include "ncclkit/nccl/failure_report.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::nccl::detail {

/// Everything the watchdog thread shares with the communicator. Held by shared_ptr so that
/// the thread can outlive a communicator whose store stopped answering (then it is detached
/// rather than joined, and destruction does not hang).
struct WatchdogState {
  // Fixed at construction.
  std::string name;
  int rank = 0;
  int world = 1;
  int device = 0;
  std::chrono::milliseconds timeout{};
  /// How much earlier than the true issue time a coarse stamp may be (core/detail/coarse_clock.hpp):
  /// work counts as late only past timeout + this, so that it never fails early.
  std::chrono::nanoseconds stamp_slack{};
  std::chrono::milliseconds poll{};
  std::chrono::milliseconds peer_check{};  ///< how often the store link looks for a peer's failure
  std::shared_ptr<Store> store;            ///< this communicator's scope; may be null
  CommHandle handle;

  // Issue side.
  std::atomic<std::uint64_t> issued{0};
  std::atomic<std::uint64_t> completed{0};
  std::atomic<bool> failed{false};

  // In-flight work and the event pool.
  std::mutex queue_mutex;
  std::deque<WorkRecord> in_flight;
  /// Every record in in_flight was recorded on one stream (then they complete in order).
  bool one_stream = true;
  std::vector<cudaEvent_t> free_events;

  // Thread control and failure.
  std::mutex control_mutex;
  std::condition_variable control_cv;
  bool stop = false;
  bool thread_done = false;
  bool link_done = false;  ///< the store link thread has ended (or never ran)
  bool failure_requested = false;
  std::string requested_reason;
  std::optional<WorkRecord> culprit;
  Clock::time_point detected_at{};
  bool report_ready = false;
  FailureReport report;

  // Store traffic: the store link thread while healthy, the watchdog thread after a failure;
  // publish_mutex keeps a late "healthy" write from landing after the failure's.
  std::mutex publish_mutex;
  bool failure_from_peer = false;  ///< this failure was announced by another rank (control_mutex)
  bool announced = false;          ///< the store link has announced this rank's failure (control_mutex)
  /// Work that had been in flight for a peer check interval or longer, retired by the
  /// watchdog thread before synchronize() verified it (the oldest such; queue_mutex).
  std::optional<WorkRecord> unverified;
  Clock::time_point last_peer_check{};
  std::uint64_t published_issued = ~std::uint64_t{0};
  std::uint64_t published_completed = ~std::uint64_t{0};
  Clock::time_point published_at{};
  std::atomic<bool> store_broken{false};  ///< a store call failed: stop using the store

  ~WatchdogState() {
    // The events belong to `device`; destroying them needs no particular current device.
    for (cudaEvent_t event : free_events) (void)cudaEventDestroy(event);
    for (auto& record : in_flight)
      if (record.event != nullptr) (void)cudaEventDestroy(record.event);
  }
};

/// Marks the failure (the first request wins). `from_peer`: another rank announced it, so
/// this one does not announce it again.
inline void request_failure(WatchdogState& s, std::string reason, std::optional<WorkRecord> culprit,
                            bool from_peer = false) {
  std::lock_guard lock(s.control_mutex);
  if (s.failure_requested) return;
  s.failure_requested = true;
  s.failure_from_peer = from_peer;
  s.requested_reason = std::move(reason);
  s.culprit = culprit;
  s.detected_at = Clock::now();
  s.failed.store(true, std::memory_order_release);
  s.control_cv.notify_all();
}

}  // namespace ncclkit::nccl::detail
