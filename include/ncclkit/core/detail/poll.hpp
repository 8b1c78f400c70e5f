#pragma once
/// Polling a condition until a deadline with a bounded exponential back-off: the one loop that
/// every ncclkit wait without an event to block on is written with (file locks and keys of a
/// FileStore, TCP connects, clients leaving a store server, child processes, NCCL's init, split
/// and finalize, the Gloo peer monitor, the launcher's wait for other nodes). The first tries
/// come quickly, so that a condition that holds soon is seen soon; the pause then doubles up
/// to a cap, which bounds the CPU a long wait burns; no pause runs past the deadline.
///
/// Host code only: C++20.

#include <algorithm>   // std::min
#include <chrono>      // std::chrono
#include <cstdint>     // std::uint64_t
#include <functional>  // std::hash (jitter seed)
#include <random>      // std::minstd_rand (jitter)
#include <thread>      // std::this_thread::sleep_for, std::this_thread::get_id

namespace ncclkit::detail {

/// How a poll waits between tries: `first`, doubling after every pause up to `cap`. With
/// `jitter`, each pause is drawn uniformly from [pause/2, 3 pause/2), so that many processes
/// polling one thing (a lock) do not retry in lock step.
struct BackoffPolicy {
  std::chrono::microseconds first{100};
  std::chrono::microseconds cap{20000};
  bool jitter = false;
};

/// The pauses of one poll (see BackoffPolicy).
class Backoff {
 public:
  using Clock = std::chrono::steady_clock;

  explicit Backoff(BackoffPolicy policy) : policy_(policy), next_(policy.first) {}

  /// Sleeps the next pause, cut short at `deadline` (no sleep at all once it has passed), then
  /// doubles the pause up to the cap.
  void sleep(Clock::time_point deadline = Clock::time_point::max()) {
    const auto now = Clock::now();
    if (now >= deadline) return;
    auto interval = std::chrono::duration_cast<Clock::duration>(next_);
    if (policy_.jitter) {
      thread_local std::minstd_rand random(
          static_cast<unsigned>(static_cast<std::uint64_t>(now.time_since_epoch().count()) ^
                                std::hash<std::thread::id>{}(std::this_thread::get_id())));
      interval = interval / 2 + interval * static_cast<long>(random() % 1024) / 1024;
    }
    std::this_thread::sleep_for(std::min<Clock::duration>(interval, deadline - now));
    next_ = std::min(next_ * 2, policy_.cap);
  }

  /// Starts over from the first pause (after progress, so that the next change is seen soon).
  void reset() { next_ = policy_.first; }

  /// The pause the next sleep() takes before jitter.
  std::chrono::microseconds next_pause() const { return next_; }

 private:
  BackoffPolicy policy_;
  std::chrono::microseconds next_;
};

/// Calls `done()` until it returns true, pausing between calls as `policy` says. Returns true
/// as soon as `done()` does; false once `deadline` has passed, after a last call made at or
/// after the deadline (so a condition that holds by the deadline is never missed). The caller
/// throws its own error, naming what it waited for. A deadline from deadline_after()
/// (core/detail/deadline.hpp) never overflows, whatever the timeout.
template <class Predicate>
[[nodiscard]] bool poll_until(std::chrono::steady_clock::time_point deadline, BackoffPolicy policy, Predicate&& done) {
  Backoff backoff(policy);
  for (;;) {
    if (done()) return true;
    if (std::chrono::steady_clock::now() >= deadline) return false;
    backoff.sleep(deadline);
  }
}

}  // namespace ncclkit::detail
