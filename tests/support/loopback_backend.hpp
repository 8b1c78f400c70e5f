#pragma once
// A fake backend that models ncclkit::Backend in one process, for tests that run ranks as
// threads: `LoopbackWorld world(n)` is shared by n `LoopbackBackend(world, rank)`s.
//
// - Memory is host memory (MemoryKind::kHost), 64-byte aligned.
// - A collective blocks until the n ranks have issued their k-th collective (matched by a
//   per-rank sequence number), then the last to arrive computes the result for everyone, in
//   rank order (deterministic), in the element type (16-bit floats accumulate in float). The
//   wait is bounded by the world's timeout: a broken test fails with TimeoutError, never hangs,
//   and the world stays broken so the other ranks fail fast too. Ranks that issue different
//   collectives (kind, type, count, op, root) get a CommError on every rank.
// - abort(reason), from any thread: this rank's later calls throw CommError, and the world
//   breaks, so every collective waiting in it (this rank's and the others') ends with
//   CommError at once, as a communicator's abort closes its connections.
// - Streams: the default stream runs work inline in the calling thread; the comm stream hands
//   it to one worker thread per rank that runs it in order. Events and waits are real: an event
//   recorded on the comm stream completes when the worker reaches it.
// - Timing events: a marker keeps the steady_clock time at which it completed.
// - Counters for tests: events made (create_event and one-off record), timing events made,
//   collectives issued.

#include <algorithm>           // std::max
#include <atomic>              // std::atomic
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::size_t
#include <optional>            // std::optional
#include <cstdint>             // std::uint64_t
#include <cstring>             // std::memcpy
#include <deque>               // std::deque
#include <exception>           // std::exception_ptr
#include <functional>          // std::function
#include <map>                 // std::map
#include <memory>              // std::shared_ptr
#include <mutex>               // std::mutex
#include <new>                 // std::align_val_t
#include <span>                // std::span
#include <string>              // std::string
#include <thread>              // std::thread
#include <type_traits>         // std::conditional_t
#include <utility>             // std::move
#include <vector>              // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/cast.hpp"
#include "ncclkit/core/detail/update_on_host.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/tensor.hpp"

namespace ncclkit::testing {

/// The n ranks of a loopback world: where their collectives meet.
class LoopbackWorld {
 public:
  enum class Kind { kAllReduce, kBroadcast, kAllGather, kReduceScatter };
  struct Call {
    Kind kind = Kind::kAllReduce;
    TensorView in;
    TensorView out;
    ReduceOp op = ReduceOp::kSum;
    int root = 0;
  };

  explicit LoopbackWorld(int size, std::chrono::milliseconds timeout = std::chrono::seconds(10))
      : size_(size), timeout_(timeout) {
    if (size < 1) throw ConfigError("LoopbackWorld: size " + std::to_string(size) + " must be at least 1");
  }
  int size() const { return size_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  /// Breaks the world with `message` (the first break stays): every collective waiting in it,
  /// and every later one, throws CommError.
  void abort(const std::string& message) {
    std::lock_guard lock(mutex_);
    if (broken_.empty()) broken_ = message;
    changed_.notify_all();
  }

  /// Rank `rank`'s collective number `sequence`: blocks until every rank has issued its own,
  /// then returns with every rank's `out` written.
  void collective(int rank, std::uint64_t sequence, const Call& call) {
    std::unique_lock lock(mutex_);
    if (!broken_.empty()) throw CommError(broken_);
    Round& round = rounds_[sequence];
    if (round.calls.empty()) round.calls.resize(size_);
    round.calls[rank] = call;
    if (++round.arrived == size_) {
      round.error = run(round.calls, sequence);
      round.done = true;
      changed_.notify_all();
    } else {
      const auto deadline = std::chrono::steady_clock::now() + timeout_;
      if (!changed_.wait_until(lock, deadline, [&] { return round.done || !broken_.empty(); })) {
        broken_ = "LoopbackWorld: rank " + std::to_string(rank) + " waited " + std::to_string(timeout_.count()) +
                  " ms in collective " + std::to_string(sequence) + " for the other ranks (" +
                  std::to_string(round.arrived) + " of " + std::to_string(size_) + " arrived)";
        changed_.notify_all();
        throw TimeoutError(broken_);
      }
      if (!round.done) throw CommError(broken_);
    }
    const std::string error = round.error;
    if (++round.left == size_) rounds_.erase(sequence);
    if (!error.empty()) throw CommError(error);
  }

 private:
  struct Round {
    std::vector<Call> calls;
    int arrived = 0;
    int left = 0;
    bool done = false;
    std::string error;
  };

  template <class T>
  using Accumulator = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

  /// Computes the round's results; returns an error message when the calls disagree.
  std::string run(const std::vector<Call>& calls, std::uint64_t sequence) const {
    const Call& first = calls[0];
    for (int r = 1; r < size_; ++r) {
      const Call& c = calls[r];
      if (c.kind != first.kind || c.in.dtype != first.in.dtype || c.in.count != first.in.count ||
          c.out.count != first.out.count || c.op != first.op || c.root != first.root) {
        return "LoopbackWorld: collective " + std::to_string(sequence) + ": rank " + std::to_string(r) +
               " issued a different collective than rank 0 (" + std::to_string(c.in.count) + " vs " +
               std::to_string(first.in.count) + " elements of " + std::string(name_of(c.in.dtype)) + " vs " +
               std::string(name_of(first.in.dtype)) + ")";
      }
    }
    visit_data_type(first.in.dtype, [&]<class T>() { compute<T>(calls); });
    return {};
  }

  template <class T>
  void compute(const std::vector<Call>& calls) const {
    using A = Accumulator<T>;
    const auto in = [&](int r) { return static_cast<const T*>(calls[r].in.data); };
    const auto out = [&](int r) { return static_cast<T*>(calls[r].out.data); };
    const Call& first = calls[0];
    // Every rank's `in`, reduced element by element in the accumulator type.
    const auto reduced = [&] {
      std::vector<T> result(first.in.count);
      for (std::size_t i = 0; i < first.in.count; ++i) {
        A value = static_cast<A>(in(0)[i]);
        for (int r = 1; r < size_; ++r) value = combine<A>(value, static_cast<A>(in(r)[i]), first.op);
        if (first.op == ReduceOp::kAvg) value = static_cast<A>(value / static_cast<A>(size_));
        result[i] = static_cast<T>(value);
      }
      return result;
    };
    switch (first.kind) {
      case Kind::kAllReduce: {
        const std::vector<T> result = reduced();
        for (int r = 0; r < size_; ++r) {
          if (first.in.count > 0) std::memcpy(out(r), result.data(), first.in.count * sizeof(T));
        }
        break;
      }
      case Kind::kBroadcast: {
        std::vector<T> result(in(first.root), in(first.root) + first.in.count);
        for (int r = 0; r < size_; ++r) {
          if (first.in.count > 0) std::memcpy(out(r), result.data(), first.in.count * sizeof(T));
        }
        break;
      }
      case Kind::kAllGather: {
        std::vector<T> result;
        for (int r = 0; r < size_; ++r) result.insert(result.end(), in(r), in(r) + first.in.count);
        for (int r = 0; r < size_; ++r) {
          if (!result.empty()) std::memcpy(out(r), result.data(), result.size() * sizeof(T));
        }
        break;
      }
      case Kind::kReduceScatter: {
        const std::size_t part = first.out.count;
        const std::vector<T> result = reduced();
        for (int r = 0; r < size_; ++r) {
          if (part > 0) std::memcpy(out(r), result.data() + r * part, part * sizeof(T));
        }
        break;
      }
    }
  }

  template <class A>
  static A combine(A a, A b, ReduceOp op) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        return static_cast<A>(a + b);
      case ReduceOp::kProd:
        return static_cast<A>(a * b);
      case ReduceOp::kMin:
        return b < a ? b : a;
      case ReduceOp::kMax:
        return a < b ? b : a;
    }
    return a;
  }

  const int size_;
  const std::chrono::milliseconds timeout_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::uint64_t, Round> rounds_;
  std::string broken_;
};

/// Names one of a loopback backend's two queues.
struct LoopbackStream {
  enum class Queue { kInline, kComm };
  Queue queue = Queue::kInline;
  friend constexpr bool operator==(LoopbackStream, LoopbackStream) = default;
};

namespace detail {

/// A point in a queue's work: complete once the worker has run everything before it.
class LoopbackMarker {
 public:
  void complete() {
    std::lock_guard lock(mutex_);
    done_ = true;
    at_ = std::chrono::steady_clock::now();
    changed_.notify_all();
  }
  /// When it completed; only after wait_for returned true.
  std::chrono::steady_clock::time_point completed_at() {
    std::lock_guard lock(mutex_);
    return at_;
  }
  bool wait_for(std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    return changed_.wait_for(lock, timeout, [&] { return done_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  bool done_ = false;
  std::chrono::steady_clock::time_point at_{};
};

/// One rank's comm stream: a worker thread running tasks in submission order. After a task
/// fails, later work is skipped (markers still complete, so nothing waits forever) and the
/// failure is rethrown by `rethrow`.
class LoopbackQueue {
 public:
  LoopbackQueue() : worker_([this] { run(); }) {}
  ~LoopbackQueue() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    worker_.join();
  }
  LoopbackQueue(const LoopbackQueue&) = delete;
  LoopbackQueue& operator=(const LoopbackQueue&) = delete;

  /// `always`: runs even after a failure (markers).
  void submit(std::function<void()> task, bool always = false) {
    {
      std::lock_guard lock(mutex_);
      tasks_.push_back(Task{std::move(task), always});
    }
    changed_.notify_all();
  }
  void rethrow() {
    std::lock_guard lock(mutex_);
    if (error_) std::rethrow_exception(error_);
  }

 private:
  struct Task {
    std::function<void()> run;
    bool always = false;
  };
  void run() {
    std::unique_lock lock(mutex_);
    for (;;) {
      changed_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      Task task = std::move(tasks_.front());
      tasks_.pop_front();
      if (!task.always && (error_ || stop_)) continue;
      lock.unlock();
      std::exception_ptr failure;
      try {
        task.run();
      } catch (...) {
        failure = std::current_exception();
      }
      lock.lock();
      if (failure && !error_) error_ = failure;
    }
  }

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<Task> tasks_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread worker_;  // last: starts after the members it uses
};

}  // namespace detail

/// A reusable event: the marker of the last `record`, or none (complete).
class LoopbackEvent {
 public:
  bool query() const { return marker_ == nullptr || marker_->wait_for(std::chrono::milliseconds(0)); }

 private:
  friend class LoopbackBackend;
  std::shared_ptr<detail::LoopbackMarker> marker_;
  bool timed_ = false;
};

/// One rank of a LoopbackWorld. Not thread-safe, like a communicator's issuing side.
class LoopbackBackend {
 public:
  using Stream = LoopbackStream;
  using Event = LoopbackEvent;
  static constexpr MemoryKind memory_kind = MemoryKind::kHost;

  LoopbackBackend(LoopbackWorld& world, int rank) : world_(&world), rank_(rank) {
    if (rank < 0 || rank >= world.size()) {
      throw ConfigError("LoopbackBackend: rank " + std::to_string(rank) + " is outside a world of " +
                        std::to_string(world.size()));
    }
  }

  int rank() const { return rank_; }
  int size() const { return world_->size(); }

  Stream default_stream() const { return Stream{Stream::Queue::kInline}; }
  Stream comm_stream() const { return Stream{Stream::Queue::kComm}; }

  Event create_event() {
    ++events_created_;
    return Event{};
  }
  Event create_timing_event() {
    ++timing_events_created_;
    Event event;
    event.timed_ = true;
    return event;
  }
  void record(Event& event, Stream stream) {
    throw_if_aborted();
    if (stream.queue == Stream::Queue::kInline) {
      event.marker_ = nullptr;  // inline work is done already
      if (event.timed_) {
        event.marker_ = std::make_shared<detail::LoopbackMarker>();
        event.marker_->complete();
      }
      return;
    }
    auto marker = std::make_shared<detail::LoopbackMarker>();
    queue_.submit([marker] { marker->complete(); }, true);
    event.marker_ = std::move(marker);
  }
  Event record(Stream stream) {
    Event event = create_event();
    record(event, stream);
    return event;
  }
  /// Takes what `event` marks now: a later `record` of it does not change this wait.
  void wait(const Event& event, Stream stream) {
    throw_if_aborted();
    auto marker = event.marker_;
    if (!marker) return;
    // Longer than a collective's timeout, so that a collective that times out before the event
    // reports its own, clearer error.
    const auto timeout = 2 * world_->timeout() + std::chrono::seconds(1);
    const auto wait_marker = [marker, timeout] {
      if (!marker->wait_for(timeout)) throw TimeoutError("LoopbackBackend: an event did not complete in time");
    };
    if (stream.queue == Stream::Queue::kInline) {
      const bool done = marker->wait_for(timeout);
      queue_.rethrow();
      if (!done) wait_marker();
    } else {
      queue_.submit(wait_marker);
    }
  }
  /// Waits (bounded) for both, then the time between their completions.
  double elapsed_ms(const Event& start, const Event& end) {
    if (!start.timed_ || !end.timed_ || !start.marker_ || !end.marker_) {
      throw ConfigError("LoopbackBackend::elapsed_ms: both events must be timing events, recorded");
    }
    const auto timeout = 2 * world_->timeout() + std::chrono::seconds(1);
    if (!start.marker_->wait_for(timeout) || !end.marker_->wait_for(timeout)) {
      throw TimeoutError("LoopbackBackend::elapsed_ms: an event did not complete in time");
    }
    queue_.rethrow();
    return std::chrono::duration<double, std::milli>(end.marker_->completed_at() - start.marker_->completed_at())
        .count();
  }
  void synchronize(Stream stream) {
    if (stream.queue == Stream::Queue::kComm) {
      Event event;
      record(event, stream);
      wait(event, default_stream());
    }
    queue_.rethrow();
    throw_if_aborted();
  }

  /// Aborts this rank (Backend::abort), from any thread: every later call throws CommError
  /// naming `reason`, and the world breaks (see the top of this file).
  void abort(std::string reason = "abort() was called") {
    {
      std::lock_guard lock(abort_mutex_);
      if (abort_message_.empty()) {
        abort_message_ = "LoopbackBackend rank " + std::to_string(rank_) + " was aborted: " + reason;
      }
    }
    aborted_.store(true, std::memory_order_release);
    world_->abort(abort_message_);
  }

  void all_reduce(TensorView in, TensorView out, ReduceOp op, Stream stream) {
    check(in, out, in.count == out.count, "all_reduce");
    issue({LoopbackWorld::Kind::kAllReduce, in, out, op, 0}, stream);
  }
  void broadcast(TensorView in, TensorView out, int root, Stream stream) {
    check(in, out, in.count == out.count, "broadcast");
    issue({LoopbackWorld::Kind::kBroadcast, in, out, ReduceOp::kSum, root}, stream);
  }
  void all_gather(TensorView in, TensorView out, Stream stream) {
    check(in, out, out.count == in.count * static_cast<std::size_t>(size()), "all_gather");
    issue({LoopbackWorld::Kind::kAllGather, in, out, ReduceOp::kSum, 0}, stream);
  }
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op, Stream stream) {
    check(in, out, in.count == out.count * static_cast<std::size_t>(size()), "reduce_scatter");
    issue({LoopbackWorld::Kind::kReduceScatter, in, out, op, 0}, stream);
  }

  void* allocate(std::size_t bytes) {
    ++allocations_;
    return ::operator new (std::max<std::size_t>(bytes, 1), std::align_val_t{64});
  }
  void deallocate(void* pointer) {
    if (pointer == nullptr) return;
    --allocations_;
    ::operator delete (pointer, std::align_val_t{64});
  }
  void copy(void* to, const void* from, std::size_t bytes, Stream stream) {
    run_on(stream, [to, from, bytes] {
      if (bytes > 0) std::memcpy(to, from, bytes);
    });
  }
  void copy_from_host(void* to, const void* from, std::size_t bytes, Stream stream) { copy(to, from, bytes, stream); }
  void copy_to_host(void* to, const void* from, std::size_t bytes, Stream stream) { copy(to, from, bytes, stream); }
  void fill_zero(TensorView out, Stream stream) {
    run_on(stream, [out] {
      if (out.count > 0) std::memset(out.data, 0, out.bytes());
    });
  }
  void scale(TensorView out, double factor, Stream stream) {
    run_on(stream, [out, factor] {
      visit_data_type(out.dtype, [&]<class T>() {
        T* data = static_cast<T*>(out.data);
        for (std::size_t i = 0; i < out.count; ++i) {
          if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
            data[i] = T(static_cast<float>(static_cast<double>(static_cast<float>(data[i])) * factor));
          } else {
            data[i] = static_cast<T>(static_cast<double>(data[i]) * factor);
          }
        }
      });
    });
  }

  using CopyBatch = std::vector<CopyItem>;
  void cast(TensorView in, TensorView out, double factor, std::uint64_t* nonfinite, Stream stream) {
    if (const std::string problem = ncclkit::detail::cast_problem(in, out); !problem.empty()) {
      throw ConfigError("LoopbackBackend::cast: " + problem);
    }
    ++casts_;
    run_on(stream, [in, out, factor, nonfinite] {
      const std::uint64_t bad = ncclkit::detail::cast_on_host(in, out, factor);
      if (nonfinite != nullptr && bad != 0) std::atomic_ref<std::uint64_t>(*nonfinite).fetch_add(bad);
    });
  }
  CopyBatch prepare_copies(std::span<const CopyItem> items) {
    if (const std::string problem = ncclkit::detail::copy_batch_problem(items); !problem.empty()) {
      throw ConfigError("LoopbackBackend::prepare_copies: " + problem);
    }
    return CopyBatch(items.begin(), items.end());
  }
  void copy_batch(const CopyBatch& batch, Stream stream) {
    ++copy_batches_;
    const CopyBatch* items = &batch;
    run_on(stream, [items] { ncclkit::detail::copy_batch_on_host(*items); });
  }

  void update(const UpdateRule& rule, TensorView param, TensorView grad, TensorView state0, TensorView state1,
              TensorView copy, Stream stream) {
    if (const std::string problem = ncclkit::detail::update_problem(rule, param, grad, state0, state1, copy);
        !problem.empty()) {
      throw ConfigError("LoopbackBackend::update: " + problem);
    }
    run_on(stream, [rule, param, grad, state0, state1, copy] {
      ncclkit::detail::update_on_host(rule, param, grad, state0, state1, copy);
    });
  }
  void sum_squares(TensorView in, double* out, Stream stream) {
    run_on(stream, [in, out] { ncclkit::detail::sum_squares_on_host(in, out); });
  }

  /// The fused compressed all-reduce (CompressedReduceBackend), emulated by cast, 16-bit sum
  /// and cast on the stream: what GradientSync does around it is what tests look at. Off
  /// unless a test turns it on (`allow_compressed_reduce`), as on a GPU machine without it.
  struct CompressedReduce {
    std::vector<std::byte> wire;
    DataType type = DataType::kFloat16;
    std::size_t capacity = 0;
  };
  std::optional<CompressedReduce> prepare_compressed_reduce(std::size_t max_count, DataType wire) {
    if (!compressed_reduce_allowed_) return std::nullopt;
    ++compressed_reduces_prepared_;
    return CompressedReduce{std::vector<std::byte>(max_count * size_of(wire)), wire, max_count};
  }
  std::string compressed_reduce_unavailable() const {
    return compressed_reduce_allowed_ ? std::string() : std::string("the loop-back backend was not allowed to");
  }
  void compressed_all_reduce(CompressedReduce& workspace, TensorView data, double encode, double decode,
                             std::uint64_t* nonfinite, Stream stream) {
    // The NCCL kernel's conditions: float32, at most the prepared count, 16-byte aligned.
    if (data.dtype != DataType::kFloat32 || data.count > workspace.capacity ||
        reinterpret_cast<std::uintptr_t>(data.data) % 16 != 0) {
      throw ConfigError(
          "LoopbackBackend::compressed_all_reduce: float32 data of at most the prepared count, 16-byte aligned");
    }
    ++compressed_reduces_;
    const TensorView wire{workspace.wire.data(), data.count, workspace.type, memory_kind};
    run_on(stream, [data, wire, encode] { ncclkit::detail::cast_on_host(data, wire, encode); });
    all_reduce(wire, wire, ReduceOp::kSum, stream);
    run_on(stream, [data, wire, decode, nonfinite] {
      const std::uint64_t bad = ncclkit::detail::cast_on_host(wire, wire, 1.0);  // counts the 16-bit results
      ncclkit::detail::cast_on_host(wire, data, decode);
      if (nonfinite != nullptr && bad != 0) std::atomic_ref<std::uint64_t>(*nonfinite).fetch_add(bad);
    });
  }
  /// With an update: the decoded result goes through update_on_host into the update's values
  /// and state, `data` keeps this rank's values (as the NCCL kernel does).
  void compressed_all_reduce(CompressedReduce& workspace, TensorView data, double encode, double decode,
                             const FusedUpdate& update, std::uint64_t* nonfinite, Stream stream) {
    if (const char* missing = update.missing()) {
      throw ConfigError(std::string("LoopbackBackend::compressed_all_reduce: the update has no ") + missing +
                        "; give the values and the state its rule keeps");
    }
    const int states = update.rule.state_count();
    ++updates_applied_;
    // The reduction as without an update, into a buffer of its own, then the update from it.
    auto result = std::make_shared<std::vector<float>>(data.count);
    TensorView reduced = data;
    reduced.data = result->data();
    copy(reduced.data, data.data, data.bytes(), stream);
    compressed_all_reduce(workspace, reduced, encode, decode, nonfinite, stream);
    const auto view = [&](float* p) { return TensorView{p, data.count, DataType::kFloat32, memory_kind}; };
    const TensorView values = view(update.values), state0 = view(states > 0 ? update.state0 : nullptr),
                     state1 = view(states > 1 ? update.state1 : nullptr),
                     copy{update.copy, update.copy != nullptr ? data.count : 0, DataType::kBFloat16, memory_kind};
    run_on(stream, [rule = update.rule, values, reduced, state0, state1, copy, result] {
      ncclkit::detail::update_on_host(rule, values, reduced, state0, state1, copy);
    });
  }
  void allow_compressed_reduce(bool allowed) { compressed_reduce_allowed_ = allowed; }
  /// Fused reductions that applied an update so far.
  std::size_t updates_applied() const { return updates_applied_.load(); }
  /// Workspaces prepared and fused reductions issued so far.
  std::size_t compressed_reduces_prepared() const { return compressed_reduces_prepared_.load(); }
  std::size_t compressed_reduces() const { return compressed_reduces_.load(); }

  // ---- what tests look at ---------------------------------------------------------------------

  /// Events made so far (create_event and one-off record(stream)).
  std::size_t events_created() const { return events_created_.load(); }
  /// Timing events made so far (create_timing_event).
  std::size_t timing_events_created() const { return timing_events_created_.load(); }
  /// Collectives issued so far (counted when the call is made, before it runs).
  std::size_t collectives_issued() const { return issued_.load(); }
  /// Of them, reduce-scatters.
  std::size_t reduce_scatters_issued() const { return reduce_scatters_.load(); }
  /// Makes the next collective throw CommError(`what`) when it is issued (a failure drill).
  void fail_next_collective(std::string what) { fail_next_ = std::move(what); }
  /// cast and copy_batch calls so far.
  std::size_t casts() const { return casts_.load(); }
  std::size_t copy_batches() const { return copy_batches_.load(); }
  /// Allocations not yet freed.
  long live_allocations() const { return allocations_.load(); }

 private:
  void check(TensorView in, TensorView out, bool counts_fit, const char* what) const {
    if (in.where != memory_kind || out.where != memory_kind) {
      throw ConfigError(std::string("LoopbackBackend::") + what + ": views must be host memory");
    }
    if (in.dtype != out.dtype || !counts_fit) {
      throw ConfigError(std::string("LoopbackBackend::") + what + ": element types or counts do not fit");
    }
  }
  void throw_if_aborted() const {
    if (!aborted_.load(std::memory_order_acquire)) return;
    std::lock_guard lock(abort_mutex_);
    throw CommError(abort_message_);
  }
  void issue(const LoopbackWorld::Call& call, Stream stream) {
    throw_if_aborted();
    if (!fail_next_.empty()) throw CommError(std::exchange(fail_next_, std::string()));
    const std::uint64_t sequence = sequence_++;
    ++issued_;
    if (call.kind == LoopbackWorld::Kind::kReduceScatter) ++reduce_scatters_;
    LoopbackWorld* world = world_;
    const int rank = rank_;
    run_on(stream, [world, rank, sequence, call] { world->collective(rank, sequence, call); });
  }
  template <class Work>
  void run_on(Stream stream, Work work) {
    if (stream.queue == Stream::Queue::kInline) {
      work();
    } else {
      queue_.submit(std::move(work));
    }
  }

  LoopbackWorld* world_;
  int rank_;
  std::uint64_t sequence_ = 0;
  std::atomic<std::size_t> events_created_{0};
  std::atomic<std::size_t> timing_events_created_{0};
  std::atomic<std::size_t> issued_{0};
  std::atomic<std::size_t> reduce_scatters_{0};
  std::atomic<long> allocations_{0};
  std::string fail_next_;
  std::atomic<bool> aborted_{false};
  mutable std::mutex abort_mutex_;
  std::string abort_message_;  ///< guarded by abort_mutex_
  std::atomic<std::size_t> casts_{0};
  std::atomic<std::size_t> copy_batches_{0};
  bool compressed_reduce_allowed_ = false;
  std::atomic<std::size_t> compressed_reduces_prepared_{0};
  std::atomic<std::size_t> compressed_reduces_{0};
  std::atomic<std::size_t> updates_applied_{0};
  detail::LoopbackQueue queue_;  // last: its worker stops before the counters go
};

static_assert(Backend<LoopbackBackend>);
static_assert(CompressedReduceBackend<LoopbackBackend>);

/// Runs `body(rank)` for ranks 0..n-1 on n threads and returns what each threw (null where it
/// returned): tests check every rank's outcome, not only the first failure.
template <class Body>
std::vector<std::exception_ptr> run_ranks(int n, Body body) {
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(n));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(rank);
      } catch (...) {
        errors[static_cast<std::size_t>(rank)] = std::current_exception();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

/// The message of `error`, or "" when it is null.
inline std::string message_of(const std::exception_ptr& error) {
  if (!error) return {};
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "(not a std::exception)";
  }
}

}  // namespace ncclkit::testing
