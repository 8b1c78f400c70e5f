#pragma once
/// The watchdog: one thread per NCCL communicator that turns hangs into errors.
///
/// Every collective the communicator issues gets a sequence number and (outside CUDA graph
/// capture) a completion event recorded after it; collectives issued back to back on one
/// stream share one event, recorded again after each (Watchdog::track). The watchdog thread
/// polls, every poll interval (the timeout / 20, between 1 ms and 50 ms):
///   - the oldest incomplete events: when one has not completed within the communicator's
///     timeout, the communicator has failed;
///   - `ncclCommGetAsyncError`: an error there (a peer lost over the network transport, a
///     CUDA error inside NCCL) means the communicator has failed.
/// On failure it aborts the communicator (`ncclCommAbort`, which also releases the GPU streams
/// waiting on its kernels), announces the failure and publishes this rank's progress to the
/// store, reads every other rank's (when the store still answers), and records a
/// `FailureReport`. From the moment the failure is detected, every call on the communicator
/// throws `CommError` with that report.
///
/// The store side runs on a second thread, the store link (detail/store_link.hpp), so that a
/// store that stops answering never delays the watchdog's own timeout: it publishes this
/// rank's progress while healthy, and fails this communicator when a peer announces its
/// failure while this rank waits on work (or is idle).
///
/// Released collectives. NCCL's aborted kernels still signal their peers, so a collective
/// waiting on a rank that aborts can complete on the others, with undefined data. Such a
/// collective has waited at least as long as the failing rank's timeout. So whenever
/// synchronize() sees work complete that had been in flight for a peer check interval or
/// longer, it reads `failed` from the store before returning (one store round trip, at most
/// once per such collective); since the failing rank announced before aborting, a released
/// collective makes synchronize() throw CommError instead of returning undefined data. A
/// collective issued after its peers had already aborted can be released at once, too fast to
/// look suspicious: the idle checks make the communicator fail before that, unless the rank
/// issues within one interval of the announcement (then its next collective fails).
///
/// Why a thread and not checks inside each call: a hang happens exactly when the program is
/// blocked somewhere else (in synchronize, in a data loader, in another library), and it is
/// the abort that releases the GPU streams so that the program can get control back.
///
/// Internal: users include ncclkit/nccl/communicator.hpp. The parts, one concern each, are in
/// detail/: comm_handle.hpp (the NCCL handles and their lock), work_record.hpp (work in
/// flight), watchdog_state.hpp (what the threads share), completions.hpp (retiring completed
/// work, finding overdue work), store_link.hpp (progress and announcements through the store),
/// watchdog_thread.hpp (the thread's loop and failure handling).
///
/// Host code only: compiles with g++ given the CUDA and NCCL include folders.

#include <cuda_runtime_api.h>  // cudaEvent_t, cudaEventCreateWithFlags, cudaEventQuery

#include <algorithm>  // std::clamp
#include <chrono>     // std::chrono
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint64_t
#include <memory>     // std::shared_ptr, std::make_shared
#include <mutex>      // std::lock_guard, std::unique_lock
#include <optional>   // std::optional
#include <string>     // std::string
#include <thread>     // std::thread, std::this_thread
#include <utility>    // std::move, std::exchange, std::pair

#include "ncclkit/core/detail/coarse_clock.hpp"
#include "ncclkit/core/detail/communicator_label.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/comm_handle.hpp"
#include "ncclkit/nccl/detail/completions.hpp"
#include "ncclkit/nccl/detail/driver_calls.hpp"
#include "ncclkit/nccl/detail/store_link.hpp"
#include "ncclkit/nccl/detail/watchdog_state.hpp"
#include "ncclkit/nccl/detail/watchdog_thread.hpp"
#include "ncclkit/nccl/detail/work_record.hpp"
#include "ncclkit/nccl/failure_report.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::nccl {

/// The watchdog of one communicator: owns the thread and the shared state.
class Watchdog {
 public:
  struct Config {
    std::string name;
    int rank = 0;
    int world = 1;
    int device = 0;
    std::chrono::milliseconds timeout{std::chrono::minutes(10)};
    std::shared_ptr<Store> store;  ///< this communicator's scope; null: no progress exchange
  };

  Watchdog() = default;
  explicit Watchdog(Config config) : state_(std::make_shared<detail::WatchdogState>()) {
    auto& s = *state_;
    s.name = std::move(config.name);
    s.rank = config.rank;
    s.world = config.world;
    s.device = config.device;
    s.timeout = config.timeout;
    s.stamp_slack = ncclkit::detail::coarse_resolution();
    s.poll = std::clamp<std::chrono::milliseconds>(config.timeout / 20, std::chrono::milliseconds(1),
                                                   std::chrono::milliseconds(50));
    s.peer_check = std::clamp<std::chrono::milliseconds>(config.timeout / 10, std::chrono::milliseconds(100),
                                                         std::chrono::milliseconds(1000));
    s.store = std::move(config.store);
    {
      // A few events up front, so that the first collectives do not pay for creating them.
      DeviceGuard guard(s.device);
      for (int i = 0; i < 16; ++i) {
        cudaEvent_t event = nullptr;
        NCCLKIT_CUDA_CHECK(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
        s.free_events.push_back(event);
      }
    }
    // The issue path's driver entry points, looked up now rather than at the first
    // collective, which may be issued while its stream captures a CUDA graph.
    (void)detail::driver_calls();
  }
  ~Watchdog() { stop(); }
  Watchdog(Watchdog&&) noexcept = default;
  Watchdog& operator=(Watchdog&& other) noexcept {
    if (this != &other) {
      stop();
      state_ = std::move(other.state_);
      thread_ = std::move(other.thread_);
      link_ = std::move(other.link_);
    }
    return *this;
  }
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  /// Starts the threads, once the communicator's NCCL handle is ready: the watchdog, and the
  /// store link when there is a store.
  void start() {
    auto state = state_;
    thread_ = std::thread([state] { detail::run_watchdog(*state); });
    if (state->store) {
      link_ = std::thread([state] { detail::run_store_link(*state); });
    } else {
      std::lock_guard lock(state->control_mutex);
      state->link_done = true;
    }
  }

  /// Stops the threads: joins them when they end within 10 s (they end within one poll
  /// interval unless one is waiting for a slow store), else detaches them (they share the
  /// state, so they may outlive the communicator). Never hangs. Returns false when the
  /// watchdog thread was left running: it may still abort the handles.
  bool stop() noexcept {
    if (!state_) return true;
    if (!thread_.joinable() && !link_.joinable()) return true;
    std::unique_lock lock(state_->control_mutex);
    state_->stop = true;
    state_->control_cv.notify_all();
    const bool done = state_->control_cv.wait_for(lock, std::chrono::seconds(10),
                                                  [&] { return state_->thread_done && state_->link_done; });
    const bool watchdog_done = state_->thread_done, link_done = state_->link_done;
    lock.unlock();
    if (!done) log_warn("watchdog of '" + state_->name + "' did not stop within 10 s (store not answering?); detached");
    for (auto [thread, finished] : {std::pair{&thread_, watchdog_done}, std::pair{&link_, link_done}}) {
      if (!thread->joinable()) continue;
      if (finished) {
        thread->join();
      } else {
        thread->detach();
      }
    }
    return watchdog_done;
  }

  detail::CommHandle& handle() { return state_->handle; }
  const detail::WatchdogState& state() const { return *state_; }
  std::chrono::milliseconds timeout() const { return state_->timeout; }

  /// Takes the next sequence number (one per collective).
  std::uint64_t next_seq() { return state_->issued.fetch_add(1, std::memory_order_relaxed) + 1; }
  /// Gives back the last sequence number (a call NCCL rejected as misuse never ran).
  void undo_seq() { state_->issued.fetch_sub(1, std::memory_order_relaxed); }
  std::uint64_t issued() const { return state_->issued.load(); }
  std::uint64_t completed() const { return state_->completed.load(); }

  /// See detail::kBurstWindow (detail/completions.hpp).
  static constexpr std::chrono::milliseconds kBurstWindow = detail::kBurstWindow;

  /// Records a completion event on `stream` after collectives `first_seq..last_seq` and hands
  /// it to the thread. `stream` must belong to the communicator's device.
  /// `issued`: when the work was issued (default: now, as a coarse stamp).
  /// `merge` (a single collective, or a group whose work is all on `stream`): when the newest
  /// record in flight is such a one on the same stream, issued up to the one before and
  /// within kBurstWindow (in practice the same clock tick) of its first, its event is
  /// recorded again after this work and the record grows to cover it, instead of a new event
  /// and record. A stream runs in order, so the event completing still means that every
  /// collective of the record has; what a burst gives up is telling its members' completions
  /// apart (a report names the first and how many came after it). It spares the pool and the
  /// queue a record per call, and keeps the events in use few, which makes small collectives
  /// cheaper per call (docs/performance.md, "Host cost per NCCL call").
  void track(std::uint64_t first_seq, std::uint64_t last_seq, const char* operation, int operations, std::size_t bytes,
             cudaStream_t stream, std::optional<detail::Clock::time_point> issued = std::nullopt, bool merge = false) {
    auto& s = *state_;
    detail::WorkRecord record{
        first_seq, last_seq, operation, operations, bytes, issued ? *issued : ncclkit::detail::coarse_now(), nullptr};
    record.burst = merge;
    // The default-stream handles name a different stream per device and thread: they never
    // count as one stream.
    const bool shared_handle = is_default_stream_handle(stream);
    // Such a handle means the current device's stream: record on this communicator's (a group
    // ends with any device current).
    std::optional<DeviceGuard> on_device;
    if (shared_handle) on_device.emplace(s.device);
    std::lock_guard lock(s.queue_mutex);
    if (merge && !shared_handle && !s.in_flight.empty()) {
      detail::WorkRecord& back = s.in_flight.back();
      if (back.burst && !back.verified && back.stream == stream && back.last_seq + 1 == first_seq &&
          record.issued <= back.issued + kBurstWindow) {
        // The message is built only on failure: this is the issue path of every collective.
        const cudaError_t status = detail::record_event(back.event, stream);
        if (status != cudaSuccess) check_cuda(status, record_failure(operation, first_seq));
        back.last_seq = last_seq;
        back.operations += operations;
        back.merged = true;
        return;
      }
    }
    if (s.free_events.empty()) {
      DeviceGuard guard(s.device);
      NCCLKIT_CUDA_CHECK(cudaEventCreateWithFlags(&record.event, cudaEventDisableTiming));
    } else {
      record.event = s.free_events.back();
      s.free_events.pop_back();
    }
    cudaError_t status = detail::record_event(record.event, stream);
    if (status != cudaSuccess) {
      s.free_events.push_back(record.event);
      check_cuda(status, record_failure(operation, first_seq));
    }
    record.stream = stream;
    if (s.in_flight.empty())
      s.one_stream = !shared_handle;
    else if (shared_handle || s.in_flight.back().stream != stream)
      s.one_stream = false;
    s.in_flight.push_back(record);
  }

  /// What a failed cudaEventRecord in track() is reported as.
  static std::string record_failure(const char* operation, std::uint64_t seq) {
    return "cudaEventRecord of the completion event of " + std::string(operation) + " seq " + std::to_string(seq);
  }

  /// What drain() found.
  struct Drained {
    bool completed = false;  ///< every tracked collective completed before the deadline
    /// One of them had been in flight for a peer check interval or longer when it was seen
    /// complete: it may have been released by a peer's abort rather than run (see the top of
    /// this file), so the peers may be gone and the communicator should be aborted, not
    /// destroyed (a blocking ncclCommDestroy may wait for them).
    bool waited_long = false;
  };

  /// For shutdown, after stop(): waits until every tracked collective has completed or
  /// `deadline` passes or the GPU reports an error (then completed is false).
  Drained drain(detail::Clock::time_point deadline) {
    auto& s = *state_;
    Drained result;
    while (true) {
      {
        std::lock_guard lock(s.queue_mutex);
        const auto now = detail::Clock::now();
        while (!s.in_flight.empty()) {
          const cudaError_t status = cudaEventQuery(s.in_flight.front().event);
          if (status == cudaErrorNotReady) break;
          if (status != cudaSuccess) {
            (void)cudaGetLastError();
            return result;
          }
          if (now - s.in_flight.front().issued >= s.peer_check) result.waited_long = true;
          detail::retire_front(s, now);
        }
        if (s.in_flight.empty()) {
          result.completed = true;
          return result;
        }
      }
      if (detail::Clock::now() >= deadline) return result;
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }

  /// Whether the communicator has failed (from the moment the failure was detected).
  bool failed() const { return state_->failed.load(std::memory_order_acquire); }

  /// Throws CommError when the communicator has failed.
  void throw_if_failed(bool wait_for_report = true) const {
    if (failed()) throw_failure(wait_for_report);
  }

  /// Throws the CommError of the failure, waiting up to 5 s for the watchdog to finish its
  /// report (abort, progress exchange) so that the message says which rank fell behind.
  [[noreturn]] void throw_failure(bool wait_for_report = true) const {
    auto& s = *state_;
    std::unique_lock lock(s.control_mutex);
    if (wait_for_report && s.handle.open_groups.load() == 0) {
      s.control_cv.wait_for(lock, std::chrono::seconds(5), [&] { return s.report_ready; });
    }
    if (s.report_ready) throw CommError("ncclkit: " + s.report.describe());
    throw CommError(
        "ncclkit: " +
        ncclkit::detail::communicator_label("nccl", s.name, s.rank, s.world, "GPU " + std::to_string(s.device)) +
        " failed: " + s.requested_reason + " (the full report was not ready yet)");
  }

  /// The failure report, once the watchdog has written it.
  std::optional<FailureReport> report() const {
    std::lock_guard lock(state_->control_mutex);
    if (!state_->report_ready) return std::nullopt;
    return state_->report;
  }

  /// Marks the communicator failed for `reason` (an error seen by the issuing thread) and lets
  /// the thread abort it and write the report.
  void request_failure(std::string reason) { detail::request_failure(*state_, std::move(reason), std::nullopt); }
  /// The same, naming the collective that was being issued (`seq`) when it went wrong.
  void request_failure(std::string reason, std::uint64_t seq, const char* operation, std::size_t bytes) {
    detail::request_failure(*state_, std::move(reason),
                            detail::WorkRecord{seq, seq, operation, 1, bytes, detail::Clock::now(), nullptr});
  }

  /// After a wait: when work that had been in flight for a peer check interval or longer has
  /// completed since the last verification, asks the store whether a peer announced a
  /// failure (such work may have been released by that peer's abort, with undefined data;
  /// see the top of this file) and throws CommError if so. One store round trip per such
  /// collective; nothing otherwise. Store errors are left to the store link to report.
  void verify_completions() const {
    auto& s = *state_;
    if (!s.store) return;
    std::optional<detail::WorkRecord> suspect;
    const auto now = detail::Clock::now();
    {
      std::lock_guard lock(s.queue_mutex);
      suspect = std::exchange(s.unverified, std::nullopt);
      for (auto& record : s.in_flight) {
        if (now - record.issued < s.peer_check) break;  // issue order: the rest are younger
        if (record.verified) continue;
        const cudaError_t status = cudaEventQuery(record.event);
        if (status != cudaSuccess) {
          if (status != cudaErrorNotReady) (void)cudaGetLastError();  // the watchdog reports it
          continue;
        }
        record.verified = true;
        if (!suspect) suspect = record;
      }
    }
    // One store round trip, bounded by the store's own timeout; none once the store failed.
    if (!suspect || s.store_broken) return;
    std::optional<std::string> announced;
    try {
      announced = detail::read_announcement(s);
    } catch (const std::exception&) {
      return;  // the store link reports store trouble
    }
    if (!announced) return;
    detail::request_failure(s,
                            detail::peer_reason(*announced,
                                                "work that completed here while it waited may have been "
                                                "released by that rank's abort and hold undefined data"),
                            suspect, /*from_peer=*/true);
    throw_failure();
  }

  /// Blocks until `event` has completed, the communicator failed (CommError) or `deadline`
  /// passed (TimeoutError naming `what`). Spins (yielding) for the first 20 ms, as
  /// cudaStreamSynchronize does, so that timing loops see completion within a microsecond;
  /// then sleeps 50 us between polls (under 1% of any wait that long).
  void wait_event(cudaEvent_t event, detail::Clock::time_point deadline, const std::string& what) const {
    const auto start = detail::Clock::now();
    while (true) {
      cudaError_t status = cudaEventQuery(event);
      if (status == cudaSuccess) {
        // An abort releases the streams it stopped: completion alone does not mean success.
        throw_if_failed();
        verify_completions();
        return;
      }
      if (status != cudaErrorNotReady) {
        (void)cudaGetLastError();
        throw_if_failed();
        throw CudaError(what + ": the stream reported " + describe_cuda_error(status));
      }
      throw_if_failed();
      const auto now = detail::Clock::now();
      if (now >= deadline) {
        throw TimeoutError(what + " timed out after " +
                           FailureReport::format_seconds(std::chrono::duration<double>(now - start).count()) + " on " +
                           ncclkit::detail::communicator_label("nccl", state_->name, state_->rank, state_->world,
                                                               "GPU " + std::to_string(state_->device)) +
                           "; work on the stream did not finish (a kernel of your own that does not end?)");
      }
      if (now - start < std::chrono::milliseconds(20)) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  }

 private:
  std::shared_ptr<detail::WatchdogState> state_;
  std::thread thread_;
  std::thread link_;  ///< the store link
};

}  // namespace ncclkit::nccl
