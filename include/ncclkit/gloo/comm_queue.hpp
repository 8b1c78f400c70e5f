#pragma once
/// CommQueue and Event: the Gloo backend's stand-in for a CUDA stream and event.
///
/// Gloo's collectives block the calling thread. So that communication can overlap compute on
/// CPUs, each Gloo communicator owns one CommQueue: a worker thread that runs the tasks handed
/// to it one at a time, in submission order (the `comm_stream()` of the Backend concept). Each
/// task gets a ticket (1, 2, 3, ...); an Event names a ticket of a queue and can be polled or
/// waited for. The first task that throws poisons the queue: it and every later task count as
/// failed (later tasks are not run), and every wait for them rethrows that first exception.
/// This mirrors a failed NCCL communicator: nothing after the failure is trusted.
///
/// One exception does not poison: a CollectiveMismatchError (NCCLKIT_CHECK_COLLECTIVES) means
/// nothing ran on any rank, and every rank compared the same fingerprints, so every rank's
/// queue meets it at the same ticket. It is reported once, by the first wait for that ticket
/// or a later one, and later tasks run as usual.
///
/// Every task is expected to be bounded (each collective has a timeout), so waits are bounded
/// by the work queued ahead of them. The worker thread starts with the first task.

#include <algorithm>           // std::max
#include <chrono>              // std::chrono::steady_clock
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::size_t
#include <cstdint>             // std::uint64_t
#include <deque>               // std::deque
#include <exception>           // std::exception_ptr, std::rethrow_exception
#include <functional>          // std::function
#include <memory>              // std::shared_ptr
#include <mutex>               // std::mutex, std::unique_lock
#include <string>              // std::string
#include <thread>              // std::thread
#include <utility>             // std::move, std::pair

#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"

namespace ncclkit::gloo {

namespace detail {

/// What a queue and its events share. Events keep it alive, so an event stays valid (and
/// complete) after its queue is gone.
struct QueueState {
  std::mutex mutex;
  std::condition_variable changed;
  std::uint64_t submitted = 0;  ///< tickets handed out so far
  std::uint64_t completed = 0;  ///< tickets finished: run, failed or cancelled (in order)
  std::uint64_t failed_at = 0;  ///< the first ticket that failed; 0 when none has
  std::exception_ptr failure;   ///< what it threw
  /// The first CollectiveMismatchError not yet reported, and its ticket (0: none). Later
  /// mismatches before it is reported are dropped: the first one names the call to fix.
  std::uint64_t mismatch_at = 0;
  std::exception_ptr mismatch;

  /// Blocks until `ticket` has finished; rethrows the queue's failure if `ticket` is at or
  /// after the ticket that failed, else an unreported mismatch at or before `ticket` (once).
  /// Caller must not hold `mutex`.
  void wait(std::uint64_t ticket) {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return completed >= ticket; });
    if (mismatch_at != 0 && ticket >= mismatch_at) {
      std::exception_ptr error = std::move(mismatch);
      mismatch = nullptr;
      mismatch_at = 0;
      std::rethrow_exception(error);
    }
    if (failed_at != 0 && ticket >= failed_at) std::rethrow_exception(failure);
  }
};

/// When the work a timing event marks was done: written once, by the thread that reached the
/// event (the worker, or the caller for the inline queue), before the event completes.
struct EventTime {
  std::chrono::steady_clock::time_point at{};
};

}  // namespace detail

/// A point in a communicator's work order: all work submitted to a queue before `record()`.
/// Copyable; a default-constructed Event is complete. Thread safety: any thread may query or
/// wait.
class Event {
 public:
  Event() = default;
  Event(std::shared_ptr<detail::QueueState> state, std::uint64_t ticket, std::shared_ptr<detail::EventTime> time = {})
      : state_(std::move(state)), ticket_(ticket), time_(std::move(time)) {}
  /// A complete timing event that was reached at `at` (inline work, done when it is recorded).
  static Event reached_at(std::chrono::steady_clock::time_point at) {
    auto time = std::make_shared<detail::EventTime>();
    time->at = at;
    return Event({}, 0, std::move(time));
  }

  /// Whether the work has finished (successfully or not). Never blocks, never throws.
  bool query() const {
    if (!state_ || ticket_ == 0) return true;
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->completed >= ticket_;
  }

  /// Blocks until the work has finished; rethrows the failure (a CommError, typically) of that
  /// work or of anything before it on the same queue.
  void wait() const {
    if (state_ && ticket_ != 0) state_->wait(ticket_);
  }

  /// Whether this event belongs to the queue whose state is `state` (an ordering on that queue
  /// already implies it).
  bool belongs_to(const detail::QueueState* state) const { return state_.get() == state; }
  std::uint64_t ticket() const { return ticket_; }

  /// Whether this is a timing event (Communicator::create_timing_event), which keeps when the
  /// work it marks was done.
  bool timed() const { return time_ != nullptr; }
  /// Waits for the work (rethrowing its failure), then says when it was done. ConfigError for
  /// an event that is not a timing event.
  std::chrono::steady_clock::time_point done_at() const {
    if (!time_) {
      throw ConfigError("gloo::Event::done_at: not a timing event; make it with Communicator::create_timing_event()");
    }
    wait();
    return time_->at;
  }

 private:
  std::shared_ptr<detail::QueueState> state_;
  std::uint64_t ticket_ = 0;
  std::shared_ptr<detail::EventTime> time_;  // timing events only
};

/// One worker thread running submitted tasks in order. Move-only in spirit (not copyable, not
/// movable: tasks and events refer to it); communicators hold it by pointer.
class CommQueue {
 public:
  /// `name` appears in log lines about the queue.
  explicit CommQueue(std::string name) : name_(std::move(name)), state_(std::make_shared<detail::QueueState>()) {}
  CommQueue(const CommQueue&) = delete;
  CommQueue& operator=(const CommQueue&) = delete;

  /// Cancels tasks that have not started (they count as failed with a CommError saying so),
  /// waits for the running task to end (bounded by its own timeout) and joins the worker.
  ~CommQueue() {
    const std::size_t cancelled = shutdown();
    if (cancelled > 0) {
      log_warn("gloo communicator '" + name_ + "': destroyed with " + std::to_string(cancelled) +
               " collective(s) still queued on its comm stream; they were cancelled (call "
               "synchronize(comm_stream()) before destroying it)");
    }
  }

  /// Enqueues `task` and returns its ticket. If the queue has already failed, the task will not
  /// run: it completes as failed. Never blocks (the queue is unbounded).
  std::uint64_t submit(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(state_->mutex);
    if (stopping_) throw CommError("gloo communicator '" + name_ + "': the comm stream is shut down");
    const std::uint64_t ticket = ++state_->submitted;
    tasks_.emplace_back(ticket, std::move(task));
    if (!worker_.joinable()) worker_ = std::thread([this] { run(); });
    lock.unlock();
    state_->changed.notify_all();
    return ticket;
  }

  /// An event for everything submitted so far.
  Event record() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return Event(state_, state_->submitted);
  }

  /// A timing event for everything submitted so far: a task that reads the clock when the worker
  /// reaches it (after everything before it), so the event knows when that was.
  Event record_timed() {
    auto time = std::make_shared<detail::EventTime>();
    const std::uint64_t ticket = submit([time] { time->at = std::chrono::steady_clock::now(); });
    return Event(state_, ticket, std::move(time));
  }

  /// Blocks until everything submitted so far has finished; rethrows the queue's failure.
  void synchronize() { record().wait(); }

  /// The failure that poisoned the queue, or null.
  std::exception_ptr failure() const {
    std::lock_guard<std::mutex> lock(state_->mutex);
    return state_->failure;
  }

  /// Whether the calling thread is this queue's worker.
  bool on_worker_thread() const { return worker_.get_id() == std::this_thread::get_id(); }

  const detail::QueueState* state() const { return state_.get(); }

  /// Stops the queue: cancels what has not started, waits for the running task, joins the
  /// worker. Returns how many tasks were cancelled. Idempotent; noexcept in effect.
  std::size_t shutdown() noexcept {
    std::size_t cancelled = 0;
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (!stopping_) {
        stopping_ = true;
        cancelled = tasks_.size();
        if (cancelled > 0) {
          const std::uint64_t first = tasks_.front().first;
          tasks_.clear();
          fail_locked(first,
                      std::make_exception_ptr(CommError("gloo communicator '" + name_ +
                                                        "': work queued on the comm stream was cancelled because the "
                                                        "communicator was destroyed before it ran")));
          // Cancelled tickets complete now, or right after the task that is running.
          if (running_ == 0) {
            state_->completed = state_->submitted;
          } else {
            cancelled_through_ = state_->submitted;
          }
        }
      }
    }
    state_->changed.notify_all();
    if (worker_.joinable() && !on_worker_thread()) worker_.join();
    return cancelled;
  }

 private:
  // Keeps the earliest failure: a cancellation recorded first may be overtaken by the failure
  // of the task that was running when it happened.
  void fail_locked(std::uint64_t ticket, std::exception_ptr error) {
    if (state_->failed_at == 0 || ticket < state_->failed_at) {
      state_->failed_at = ticket;
      state_->failure = std::move(error);
    }
  }

  void run() {
    for (;;) {
      std::pair<std::uint64_t, std::function<void()>> next;
      bool skip = false;
      {
        std::unique_lock<std::mutex> lock(state_->mutex);
        state_->changed.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
        if (tasks_.empty()) return;  // stopping, nothing left
        next = std::move(tasks_.front());
        tasks_.pop_front();
        skip = state_->failed_at != 0;
        running_ = next.first;
      }
      std::exception_ptr error;
      std::exception_ptr mismatch;
      if (!skip) {
        try {
          next.second();
        } catch (const CollectiveMismatchError&) {
          mismatch = std::current_exception();  // nothing ran on any rank: report, do not poison
        } catch (...) {
          error = std::current_exception();
        }
      }
      next.second = nullptr;  // release captured state outside the lock
      {
        std::lock_guard<std::mutex> lock(state_->mutex);
        if (error) fail_locked(next.first, error);
        if (mismatch && state_->mismatch_at == 0) {
          state_->mismatch_at = next.first;
          state_->mismatch = std::move(mismatch);
        }
        running_ = 0;
        state_->completed = std::max(next.first, cancelled_through_);
      }
      state_->changed.notify_all();
    }
  }

  std::string name_;
  std::shared_ptr<detail::QueueState> state_;
  std::deque<std::pair<std::uint64_t, std::function<void()>>> tasks_;  // guarded by state_->mutex
  bool stopping_ = false;                                              // guarded by state_->mutex
  std::uint64_t running_ = 0;            // ticket of the task running now, 0 if none (guarded)
  std::uint64_t cancelled_through_ = 0;  // last ticket cancelled by shutdown() (guarded)
  std::thread worker_;
};

}  // namespace ncclkit::gloo
