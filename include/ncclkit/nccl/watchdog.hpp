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
/// The store side runs on a second thread, the store link, so that a store that stops
/// answering (its host rank stopped, say) never delays the watchdog's own timeout:
///   - progress: while healthy, it publishes "issued completed" sequence numbers under
///     `progress/<rank>` in the communicator's store scope whenever they change (at most
///     every 50 ms), so that a report can say which rank fell behind even when that rank is
///     stopped or dead;
///   - peer failures: a failing rank sets `failed` ("<rank> <reason>") in the scope before it
///     aborts (waiting at most 500 ms for the store). While this rank has a collective in
///     flight for longer than the peer check interval (the timeout / 10, between 100 ms and
///     1 s), the store link checks that key once per interval; when it is set, the collective
///     cannot complete (a member of it has aborted), and this communicator fails too, without
///     waiting out its own timeout. With nothing in flight it checks once per interval as well
///     (one store read per interval and communicator), so that a rank learns of a peer's
///     failure before it issues its next collective.
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
/// Host code only: compiles with g++ given the CUDA and NCCL include folders.

#include <cuda_runtime_api.h>  // cudaEvent_t, cudaEventQuery, cudaEventRecord
#include <nccl.h>              // ncclComm_t, ncclCommAbort, ncclCommGetAsyncError

#include <algorithm>           // std::clamp
#include <atomic>              // std::atomic
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::size_t
#include <cstdint>             // std::uint64_t, std::int64_t
#include <cstdio>              // std::sscanf
#include <deque>               // std::deque
#include <memory>              // std::shared_ptr
#include <mutex>               // std::mutex, std::timed_mutex
#include <optional>            // std::optional
#include <string>              // std::string
#include <thread>              // std::thread
#include <utility>             // std::move, std::exchange
#include <vector>              // std::vector

#include "ncclkit/core/detail/coarse_clock.hpp"
#include "ncclkit/core/detail/communicator_label.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/driver_calls.hpp"
#include "ncclkit/nccl/failure_report.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::nccl {

namespace detail {

using Clock = std::chrono::steady_clock;

/// How long an abort waits for the kernels that read memory windows to stop (CommHandle).
inline constexpr std::chrono::milliseconds kWindowKernelStop{1000};

/// The NCCL handles shared by the communicator (which issues work on them) and its watchdog
/// (which may abort them). Every NCCL call on them holds `mutex`, so that an abort never runs
/// while another thread is inside NCCL with the same handle, except when that thread is stuck
/// there (see Watchdog::handle_failure).
///
/// Two NCCL communicators per ncclkit communicator, because NCCL's non-blocking mode costs
/// about 90 us per collective (NCCL 2.28 launches every group of a non-blocking communicator
/// from a helper thread), against about 8 us for a blocking one:
///   - `control`, non-blocking: init, split and finalize, each polled and so bounded;
///   - `comm`, blocking, split from `control` (bounded too, since its parent is non-blocking):
///     every collective. A blocking call that does not return (connection setup waiting for a
///     dead peer) is caught through `issuing_since`.
struct CommHandle {
  std::timed_mutex mutex;
  ncclComm_t control = nullptr;     ///< non-blocking
  ncclComm_t comm = nullptr;        ///< blocking; collectives
  bool aborted = false;             ///< guarded by mutex; both handles are gone when true
  std::atomic<int> open_groups{0};  ///< >0: ops of this comm sit in an open ncclGroupStart
  /// Steady-clock nanoseconds at which the issuing thread entered an NCCL call (0: not in one),
  /// and what that call is. The watchdog and store link threads read them while the issuing
  /// thread rewrites them for its next call: atomics (relaxed; plain stores on x86), the
  /// fields read between two loads of issuing_since (see blocked_call).
  std::atomic<std::int64_t> issuing_since{0};
  std::atomic<std::uint64_t> issuing_seq{0};
  std::atomic<const char*> issuing_operation{""};
  std::atomic<std::size_t> issuing_bytes{0};

  /// Marks entry into an NCCL call that may block (written by the issuing thread only).
  /// Returns the time of entry (the issue time the watchdog measures the call from; a coarse
  /// stamp, core/detail/coarse_clock.hpp: cheap on every host, and at most a tick early).
  std::chrono::steady_clock::time_point enter(std::uint64_t seq, const char* operation, std::size_t bytes) {
    // The last leave()'s store of 0 before the fields' new values (free on x86; on weaker
    // CPUs a reader could otherwise see new fields under the old issuing_since).
    std::atomic_thread_fence(std::memory_order_release);
    issuing_seq.store(seq, std::memory_order_relaxed);
    issuing_operation.store(operation, std::memory_order_relaxed);
    issuing_bytes.store(bytes, std::memory_order_relaxed);
    const auto now = ncclkit::detail::coarse_now();
    issuing_since.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
                        std::memory_order_release);
    return now;
  }
  void leave() { issuing_since.store(0, std::memory_order_release); }

  /// A kernel that reads this communicator's memory windows by plain loads and stores (the
  /// fused compressed reduction, nccl/compressed_reduce.hpp). ncclCommAbort unmaps the windows:
  /// a kernel still spinning on one then faults, and a fault poisons the whole CUDA context
  /// (no later allocation or copy works in the process). So before an abort each is asked to
  /// stop and waited for (stop_window_kernels).
  struct WindowKernel {
    volatile int* stop = nullptr;  ///< mapped host memory the kernel polls; nonzero: return
    cudaEvent_t done = nullptr;    ///< recorded after its last launch
    int device = 0;
  };
  void add_window_kernel(WindowKernel kernel) {
    std::lock_guard lock(window_kernels_mutex);
    window_kernels.push_back(kernel);
  }
  void remove_window_kernel(volatile int* stop) {
    std::lock_guard lock(window_kernels_mutex);
    std::erase_if(window_kernels, [&](const WindowKernel& k) { return k.stop == stop; });
  }
  /// Raises every window kernel's stop flag, then waits for each one's last launch to end, at
  /// most `bound` in all. A kernel still queued behind a hung collective cannot end before the
  /// abort; it finds its flag raised when it starts and returns before it touches a window.
  void stop_window_kernels(std::chrono::milliseconds bound) noexcept {
    std::lock_guard lock(window_kernels_mutex);
    if (window_kernels.empty()) return;
    for (const WindowKernel& k : window_kernels) *k.stop = 1;
    const auto deadline = Clock::now() + bound;
    for (const WindowKernel& k : window_kernels) {
      if (cudaSetDevice(k.device) != cudaSuccess) (void)cudaGetLastError();
      for (;;) {
        const cudaError_t state = cudaEventQuery(k.done);
        if (state != cudaErrorNotReady) {
          if (state != cudaSuccess) (void)cudaGetLastError();
          break;
        }
        if (Clock::now() >= deadline) break;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    }
  }

 private:
  std::mutex window_kernels_mutex;
  std::vector<WindowKernel> window_kernels;
};

/// Collectives issued together (one, one NCCL group, or a burst: single collectives and
/// one-stream groups issued back to back on one stream) and the event that marks their end.
struct WorkRecord {
  std::uint64_t first_seq = 0;
  std::uint64_t last_seq = 0;
  const char* operation = "";  ///< the first collective's
  int operations = 1;          ///< >1 for a group or a burst
  std::size_t bytes = 0;       ///< the first collective's, or the first group's total
  Clock::time_point issued{};  ///< the first collective's
  cudaEvent_t event = nullptr;
  bool verified = false;          ///< synchronize() already asked the store about it
  cudaStream_t stream = nullptr;  ///< where `event` was recorded
  bool burst = false;             ///< may grow: work issued back to back on one stream (Watchdog::track's `merge`)
  bool merged = false;            ///< has grown: later work joined it (its members' stamps differ)
};

/// The NCCL call the issuing thread is inside (see CommHandle::enter), as a record; none when
/// it is not in one.
/// A call that lasts is what matters here: when the issuing thread moved on to another call
/// while the fields were read (issuing_since changed), the fields may mix two calls, and
/// the newer call is reported as not blocked yet (it has just begun). Two calls begun within
/// one tick of the coarse clock look alike; a mix of those names a call that began then too.
inline std::optional<WorkRecord> blocked_call(const CommHandle& handle) {
  const std::int64_t since = handle.issuing_since.load(std::memory_order_acquire);
  if (since == 0) return std::nullopt;
  const std::uint64_t seq = handle.issuing_seq.load(std::memory_order_relaxed);
  const char* operation = handle.issuing_operation.load(std::memory_order_relaxed);
  const std::size_t bytes = handle.issuing_bytes.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (handle.issuing_since.load(std::memory_order_relaxed) != since) return std::nullopt;
  return WorkRecord{seq, seq, operation, 1, bytes, Clock::time_point(std::chrono::nanoseconds(since)), nullptr};
}

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

  std::string progress_key(int of_rank) const { return "progress/" + std::to_string(of_rank); }

  static constexpr const char* kFailedKey = "failed";

  /// After a store call failed: no more store traffic from this communicator, said once.
  void store_failed(const char* what, const std::exception& error) {
    store_broken = true;
    log_warn("watchdog of '" + name + "': " + what + ": " + error.what());
  }

  void publish_progress(bool force, bool failed_now) {
    std::lock_guard lock(publish_mutex);
    if (!store || store_broken) return;
    // A healthy rank's write must not overwrite the failure's (see publish_mutex).
    if (!failed_now && failed.load(std::memory_order_acquire)) return;
    const std::uint64_t i = issued.load(), c = completed.load();
    const auto now = Clock::now();
    if (!force && i == published_issued && c == published_completed) return;
    if (!force && now - published_at < std::chrono::milliseconds(50)) return;
    try {
      store->set(progress_key(rank), std::to_string(i) + " " + std::to_string(c) + (failed_now ? " failed" : ""));
      published_issued = i;
      published_completed = c;
      published_at = now;
    } catch (const std::exception& e) {
      store_failed("cannot publish progress to the store any more", e);
    }
  }

  /// Tells the other ranks (their store links) that this communicator failed.
  void announce_failure(const std::string& reason) {
    std::lock_guard lock(publish_mutex);
    if (!store || store_broken) return;
    try {
      store->set(kFailedKey, std::to_string(rank) + " " + reason);
    } catch (const std::exception& e) {
      store_failed("cannot announce the failure through the store", e);
    }
  }

  /// The failure a peer announced ("<rank> <reason>"), if any. Throws on store errors.
  std::optional<std::string> read_announcement() const {
    if (!store->check({std::string(kFailedKey)})) return std::nullopt;
    return store->get_string(kFailedKey, std::chrono::milliseconds(500));
  }

  /// The reason of this rank's failure, from a peer's announcement and what it did here.
  static std::string peer_reason(const std::string& announcement, const std::string& consequence) {
    const auto space = announcement.find(' ');
    const std::string who = space == std::string::npos ? announcement : announcement.substr(0, space);
    const std::string why =
        space == std::string::npos ? std::string("no reason given") : announcement.substr(space + 1);
    return "rank " + who + " announced through the store that its communicator failed (" + why + "), so " + consequence;
  }

  /// For the store link: a peer's announced failure, checked at most once per peer_check
  /// interval, while idle (`waiting_since` empty) or while the oldest work has waited that
  /// long: no store traffic for work that completes within the interval.
  std::optional<std::string> peer_failure(Clock::time_point now, std::optional<Clock::time_point> waiting_since) {
    if (!store || now - last_peer_check < peer_check) return std::nullopt;
    if (waiting_since && now - *waiting_since < peer_check) return std::nullopt;
    last_peer_check = now;
    std::lock_guard lock(publish_mutex);
    if (store_broken) return std::nullopt;
    try {
      return read_announcement();
    } catch (const std::exception& e) {
      store_failed("cannot read peers' failures from the store any more", e);
      return std::nullopt;
    }
  }

  static std::optional<PeerProgress> parse_progress(int of_rank, const std::string& text) {
    PeerProgress p;
    p.rank = of_rank;
    unsigned long long i = 0, c = 0;
    char flag[16] = {0};
    int n = std::sscanf(text.c_str(), "%llu %llu %15s", &i, &c, flag);
    if (n < 2) return std::nullopt;
    p.known = true;
    p.issued = i;
    p.completed = c;
    p.failed = n == 3 && std::string(flag) == "failed";
    return p;
  }

  /// Reads every rank's progress, spending at most about 2 s on the store.
  void gather_peers(FailureReport& out) {
    if (!store) {
      out.peers_note = "no store: other ranks' progress is not known";
      return;
    }
    const auto budget_end = Clock::now() + std::chrono::seconds(2);
    bool budget_spent = false;
    bool store_failed = false;
    for (int r = 0; r < world; ++r) {
      PeerProgress p;
      p.rank = r;
      if (r == rank) {
        p.known = true;
        p.issued = issued.load();
        p.completed = completed.load();
        p.failed = true;
        out.peers.push_back(p);
        continue;
      }
      if (store_failed || Clock::now() >= budget_end) {
        budget_spent = budget_spent || !store_failed;
        out.peers.push_back(p);
        continue;
      }
      try {
        const std::string key = progress_key(r);
        if (store->check({key})) {
          if (auto parsed = parse_progress(r, store->get_string(key, std::chrono::milliseconds(500)))) p = *parsed;
        }
      } catch (const std::exception& e) {
        store_failed = true;
        out.peers_note = std::string("the store stopped answering while reading other ranks' progress: ") + e.what();
      }
      out.peers.push_back(p);
    }
    if (budget_spent && out.peers_note.empty()) out.peers_note = "stopped reading the store after 2 s";
  }
};

}  // namespace detail

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
    thread_ = std::thread([state] { run(*state); });
    if (state->store) {
      link_ = std::thread([state] { run_store_link(*state); });
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

  /// Single collectives (and one-stream groups) issued on one stream within this time of the
  /// first one in flight share its record: its event is recorded again after each (see track).
  static constexpr std::chrono::milliseconds kBurstWindow{1};

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
          retire_front(s, now);
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
  void request_failure(std::string reason) { request(*state_, std::move(reason), std::nullopt); }
  /// The same, naming the collective that was being issued (`seq`) when it went wrong.
  void request_failure(std::string reason, std::uint64_t seq, const char* operation, std::size_t bytes) {
    request(*state_, std::move(reason),
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
      announced = s.read_announcement();
    } catch (const std::exception&) {
      return;  // the store link reports store trouble
    }
    if (!announced) return;
    request(s,
            detail::WatchdogState::peer_reason(*announced,
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
  static void run(detail::WatchdogState& s) {
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

  /// The store link: publishes progress while healthy and turns a peer's announced failure
  /// into this communicator's while its work waits (see the top of this file). Ends at stop
  /// or once this communicator has failed (the watchdog thread then does the store work).
  static void run_store_link(detail::WatchdogState& s) {
    while (true) {
      {
        std::unique_lock lock(s.control_mutex);
        s.control_cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return s.stop || s.failure_requested; });
        if (s.stop) break;
        if (s.failure_requested) {
          // Announce this rank's own failure while the watchdog thread waits to abort (see
          // handle_failure), so that peers released by the abort find it in the store.
          const bool own = !s.failure_from_peer;
          const std::string reason = s.requested_reason;
          lock.unlock();
          if (own) s.announce_failure(reason);
          lock.lock();
          s.announced = true;
          s.control_cv.notify_all();
          break;
        }
      }
      s.publish_progress(false, false);
      // What has waited longest: the oldest collective in flight, or a blocking NCCL call.
      const auto now = detail::Clock::now();
      std::optional<detail::WorkRecord> oldest;
      {
        std::lock_guard lock(s.queue_mutex);
        if (!s.in_flight.empty()) oldest = s.in_flight.front();
      }
      if (auto call = detail::blocked_call(s.handle); call && (!oldest || call->issued < oldest->issued)) oldest = call;
      // Idle, it looks once per interval too: a collective issued after the peers aborted would
      // be released at once, with undefined data, so this rank must know before it issues one.
      std::optional<detail::Clock::time_point> waiting_since;
      if (oldest) waiting_since = oldest->issued;
      if (auto announced = s.peer_failure(now, waiting_since)) {
        const std::string consequence =
            oldest ? "this collective cannot complete; stopped waiting after " +
                         FailureReport::format_seconds(std::chrono::duration<double>(now - oldest->issued).count())
                   : std::string(
                         "this communicator cannot be used any more (seen while nothing of this rank was in "
                         "flight)");
        request(s, detail::WatchdogState::peer_reason(*announced, consequence), oldest, /*from_peer=*/true);
        // Loop once more: the failure is requested, so it ends there.
      }
    }
    std::lock_guard lock(s.control_mutex);
    s.link_done = true;
    s.control_cv.notify_all();
  }

  /// Marks the failure (the first request wins). `from_peer`: another rank announced it, so
  /// this one does not announce it again.
  static void request(detail::WatchdogState& s, std::string reason, std::optional<detail::WorkRecord> culprit,
                      bool from_peer = false) {
    std::lock_guard lock(s.control_mutex);
    if (s.failure_requested) return;
    s.failure_requested = true;
    s.failure_from_peer = from_peer;
    s.requested_reason = std::move(reason);
    s.culprit = culprit;
    s.detected_at = detail::Clock::now();
    s.failed.store(true, std::memory_order_release);
    s.control_cv.notify_all();
  }

  /// Retires completed work from the front of in_flight. Events are queried without holding
  /// queue_mutex, so that the issuing thread (track) never waits for a query; while every
  /// record is on one stream, one query of the newest retires all of them (a stream runs in
  /// order), so a poll costs one query however much the issuing thread queued since the last.
  static void poll_completions(detail::WatchdogState& s) {
    const auto now = detail::Clock::now();
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
      detail::WorkRecord front;
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
          request(s,
                  "did not complete within the timeout of " +
                      FailureReport::format_seconds(std::chrono::duration<double>(s.timeout).count()),
                  front);
        }
      } else {
        (void)cudaGetLastError();
        request(s, "CUDA reported " + describe_cuda_error(status) + " while waiting for it", front);
      }
      return;
    }
  }
  /// Retires the front record, whose work has completed (queue_mutex held). Work that had
  /// waited a peer check interval or longer is kept for synchronize() to verify.
  static void retire_front(detail::WatchdogState& s, detail::Clock::time_point now) {
    detail::WorkRecord& front = s.in_flight.front();
    if (s.store && !front.verified && !s.unverified && now - front.issued >= s.peer_check) s.unverified = front;
    advance_completed(s, front.last_seq);
    s.free_events.push_back(front.event);
    s.in_flight.pop_front();
  }
  /// Publishes `seq` as completed, never going back: a group spanning streams has a record per
  /// stream, whose seq ranges overlap (NCCL holds every stream of a group until all of its work
  /// is done, so the first of them to complete means the group has). Only the watchdog thread,
  /// or drain() after it stopped, calls this.
  static void advance_completed(detail::WatchdogState& s, std::uint64_t seq) {
    if (seq > s.completed.load(std::memory_order_relaxed)) s.completed.store(seq, std::memory_order_release);
  }

  /// A blocking NCCL call that has not returned within the timeout (e.g. connection setup
  /// waiting for a peer that is gone) fails the communicator; the abort releases the call.
  static void poll_issuing(detail::WatchdogState& s) {
    const auto call = detail::blocked_call(s.handle);
    if (!call || detail::Clock::now() - call->issued <= s.timeout + s.stamp_slack) return;
    request(s,
            "an NCCL call did not return within the timeout of " +
                FailureReport::format_seconds(std::chrono::duration<double>(s.timeout).count()) +
                " (it was waiting for other ranks, e.g. to set up connections)",
            call);
  }

  static void poll_async_error(detail::WatchdogState& s) {
    ncclResult_t async = ncclSuccess;
    {
      std::unique_lock lock(s.handle.mutex, std::defer_lock);
      // Never wait long here: the issuing thread holds the lock only for the length of one call.
      if (!lock.try_lock_for(std::chrono::milliseconds(100))) return;
      if (s.handle.aborted || s.handle.comm == nullptr) return;
      if (ncclCommGetAsyncError(s.handle.comm, &async) != ncclSuccess) return;
      if (async == ncclSuccess || async == ncclInProgress) return;
    }
    std::optional<detail::WorkRecord> oldest;
    {
      std::lock_guard lock(s.queue_mutex);
      if (!s.in_flight.empty()) oldest = s.in_flight.front();
    }
    request(s, "NCCL reported an asynchronous error: " + describe_nccl_error(async), oldest);
  }

  /// Aborts, exchanges progress and writes the report. Returns false to be called again:
  /// while the communicator has ops queued in an open group that has not reached its end,
  /// aborting it would pull the handle out from under the ncclGroupEnd that launches them
  /// (the issuing thread joins a group under the handle's lock, and GroupGuard::end holds
  /// that lock while it launches). Once the end runs (the issuing thread is inside an NCCL
  /// call) the abort goes ahead: it may be what releases a launch stuck waiting for peers.
  static bool handle_failure(detail::WatchdogState& s) {
    if (s.handle.open_groups.load() > 0 && !detail::blocked_call(s.handle)) return false;

    FailureReport report;
    report.name = s.name;
    report.rank = s.rank;
    report.world = s.world;
    report.device = s.device;
    std::optional<detail::WorkRecord> culprit;
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
        report.operation +=
            " (+" + std::to_string(culprit->operations - 1) +
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
    const auto abort_start = detail::Clock::now();
    {
      std::unique_lock lock(s.handle.mutex, std::defer_lock);
      const bool locked = lock.try_lock_for(std::chrono::seconds(2));
      // Joined a group since the check above, or its end has just launched and not yet let go
      // of the group: once more at the next poll.
      if (locked && s.handle.open_groups.load() > 0) return false;
      if (!locked) log_warn("watchdog of '" + s.name + "': aborting while another thread is inside NCCL");
      if (!s.handle.aborted) {
        s.handle.stop_window_kernels(detail::kWindowKernelStop);
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
    report.abort_s = std::chrono::duration<double>(detail::Clock::now() - abort_start).count();

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
    s.publish_progress(true, true);
    s.gather_peers(report);

    log_error(report.describe());
    std::lock_guard lock(s.control_mutex);
    s.report = std::move(report);
    s.report_ready = true;
    s.control_cv.notify_all();
    return true;
  }

  std::shared_ptr<detail::WatchdogState> state_;
  std::thread thread_;
  std::thread link_;  ///< the store link
};

}  // namespace ncclkit::nccl
