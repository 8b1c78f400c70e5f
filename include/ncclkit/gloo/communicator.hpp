#pragma once
/// ncclkit::gloo::Communicator: collectives on host memory over Gloo's TCP transport, created
/// from an ncclkit `Store` and `WorldInfo`. Models the `Backend` concept (core/backend.hpp) and
/// speaks the same dialect as ncclkit::nccl::Communicator (same names, defaults and overloads),
/// so fusion, compression, the trainer and the perf engine run on CPUs exactly as on GPUs.
///
/// Collectives: all_reduce (sum, prod, min, max, avg), broadcast, reduce, all_gather,
/// all_gather_uneven, reduce_scatter, all_to_all, gather, scatter, send, recv, barrier; element
/// types int8, uint8, int32, uint32, int64, uint64, Half, BFloat16, float, double. Each takes
/// `TensorView`s (the type travels in the view) or, through the typed overloads every backend
/// shares (core/detail/typed_collectives.hpp), pointer + count or `std::span<T>`s; the stream
/// comes last.
///
/// Streams (`Stream`): the default stream runs a collective in the calling thread, which
/// returns when it is done; the comm stream hands it to the communicator's worker thread
/// (CommQueue) and returns at once; events (`create_event`, `record`, `wait`) and
/// `synchronize` order and join the two. Buffers of work on the comm stream must stay alive and
/// untouched until it has finished. Both streams use the same Gloo connections: a collective on
/// one waits for one running on the other, and every rank must issue its collectives in the
/// same order (for work on both streams, order it with events, as on a GPU).
///
/// Failures. Gloo reports every failure (a peer exited, a timeout) as a `gloo::Exception`, and
/// its context is unusable afterwards. The communicator turns it into `CommError` naming rank,
/// operation, sequence number, size and time waited, and refuses every later call with
/// `CommError`. Every collective is bounded by `Options::timeout` (Gloo's own 30 s default is
/// never used); a collective split into chunks shares one deadline. A peer whose connection
/// fails (it exited, crashed, was killed) is caught at once, whatever the timeout, and named by
/// rank: see detail/peer_monitor.hpp (one watcher thread per communicator).
///
/// What this Gloo snapshot (Debian 0.0~git20220518) lacks, and how it is provided:
///   - bfloat16, and a fast float16: reductions are ncclkit's (reduce_kernels.hpp), for every
///     type, passed to Gloo as its reduction callback.
///   - a fast all-reduce of two ranks: ncclkit's piecewise exchange on Gloo's transport
///     (detail/algorithms.hpp); three or more ranks use Gloo's ring.
///   - an options-style reduce_scatter: a ring reduce-scatter on Gloo's transport buffers
///     (each rank sends and receives (n-1)/n of the data, as NCCL's ring does).
///   - loops that count past 2^31 elements: buffers are cut into chunks of at most
///     `chunk_elements` elements per Gloo call.
///   - a barrier in `connectFullMesh`: the constructor runs one after connecting, and the
///     destructor one before closing connections, so no rank closes a socket a peer still
///     reads from.

#include <gloo/context.h>  // gloo::Context

#include <algorithm>    // std::max
#include <atomic>       // std::atomic_ref
#include <chrono>       // std::chrono::milliseconds, std::chrono::steady_clock
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint8_t, std::uint64_t
#include <cstring>      // std::memcpy, std::memset
#include <memory>       // std::shared_ptr, std::unique_ptr
#include <new>          // std::align_val_t
#include <numeric>      // std::accumulate
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::move
#include <vector>       // std::vector

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/detail/cast.hpp"
#include "ncclkit/core/detail/update_on_host.hpp"
#include "ncclkit/core/detail/typed_collectives.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/gloo/comm_queue.hpp"
#include "ncclkit/gloo/detail/algorithms.hpp"
#include "ncclkit/gloo/detail/communicator_state.hpp"
#include "ncclkit/gloo/detail/connect.hpp"
#include "ncclkit/gloo/detail/view_checks.hpp"
#include "ncclkit/gloo/options.hpp"
#include "ncclkit/gloo/reduce_kernels.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::gloo {

/// Names one of a communicator's two work queues. Cheap to copy; compare with ==.
struct Stream {
  enum class Queue : std::uint8_t {
    kInline,  ///< run in the calling thread; the call returns when the work is done
    kComm,    ///< run on the communicator's worker thread, in submission order
  };
  Queue queue = Queue::kInline;
  friend constexpr bool operator==(Stream, Stream) = default;
};

/// A Gloo communicator over TCP. Move-only RAII: the constructor connects every pair of ranks
/// (collective: every rank of `world` must construct one, with the same name, in the same
/// order), the destructor closes the connections. Models `ncclkit::Backend`.
///
/// Thread safety: collectives may be issued from any thread, but the order in which a rank
/// issues them must be the same on every rank. The worker thread of the comm stream is the
/// only thread that runs work issued there.
class Communicator : public ncclkit::detail::TypedCollectives<Communicator, gloo::Stream> {
  using Typed = ncclkit::detail::TypedCollectives<Communicator, gloo::Stream>;

 public:
  using Stream = gloo::Stream;
  using Event = gloo::Event;
  using Options = gloo::Options;
  /// Collectives read and write host memory.
  static constexpr MemoryKind memory_kind = MemoryKind::kHost;

  /// Connects to the other ranks of `world` through `store` (rendezvous only: the store is not
  /// used after the constructor returns, and may be destroyed then). Store keys live under
  /// "ncclkit/gloo/<name>/<generation>/", where the generation is agreed through a counter in
  /// the store, so reruns and several communicators on one store never mix.
  /// Throws ConfigError (bad options or interface), TimeoutError (peers missing at the
  /// rendezvous, naming the store keys) or CommError (connecting or the first barrier failed).
  Communicator(ncclkit::Store& store, const WorldInfo& world, Options options = {})
      : Communicator(std::shared_ptr<ncclkit::Store>(std::shared_ptr<ncclkit::Store>(), &store), world,
                     std::move(options)) {}

  Communicator(std::shared_ptr<ncclkit::Store> store, const WorldInfo& world, Options options = {})
      : state_(std::make_unique<detail::CommunicatorState>()) {
    world.validate();
    auto& s = *state_;
    s.options = std::move(options);
    s.rank = world.rank;
    s.size = world.world_size;
    if (!store) throw ConfigError(s.who() + ": the store is null");
    detail::validate_options(s);
    s.store_description = store->describe();
    s.queue = std::make_unique<CommQueue>(s.options.name);
    if (s.size > 1) detail::connect(s, store);
    if (s.size > 1) detail::agree_on_argument_check(s);
  }

  /// Drains nothing: work still queued on the comm stream is cancelled (with a warning; call
  /// synchronize(comm_stream()) first). Then, if the communicator is healthy, a barrier (bounded
  /// by the timeout) so that no rank closes connections a peer is still reading, and the
  /// connections are closed. Never throws.
  ~Communicator() { destroy(); }

  Communicator(Communicator&&) noexcept = default;
  Communicator& operator=(Communicator&& other) noexcept {
    if (this != &other) {
      destroy();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // ---- identity -------------------------------------------------------------------------------

  int rank() const { return state().rank; }
  int size() const { return state().size; }
  const std::string& name() const { return state().options.name; }
  const Options& options() const { return state().options; }
  /// The limit of each collective (Options::timeout, bounded).
  std::chrono::milliseconds timeout() const { return state().options.timeout; }
  /// Whether an earlier failure (or abort()) made the communicator unusable.
  bool failed() const { return state().failed.load(); }

  /// Aborts the communicator now, from any thread, as a failure would: every later call throws
  /// CommError naming `reason`. A collective in flight (inline in another thread, or on the comm
  /// stream) ends at once with CommError, and work queued behind it does too; this rank's
  /// connections are closed, so peers waiting on it fail at once (naming this rank) instead of
  /// at their timeout. Returns at once: it waits for nothing (a Gloo call that does not wait on
  /// a transport buffer still ends within the timeout). The destructor then closes what is
  /// left, without the barrier. A second abort, or one after a failure, changes nothing but
  /// keeps the first reason.
  void abort(std::string reason = "abort() was called") { state().abort(reason); }
  /// Collectives (send and recv included) issued so far: the last one's sequence number.
  std::uint64_t issued_sequence() const { return state().issued.load(); }
  /// Collectives whose run has ended so far (successfully or not); issued_sequence() minus
  /// this is the work still queued or running.
  std::uint64_t completed_sequence() const { return state().completed.load(); }
  /// Which copy of the reduction loops this communicator uses.
  KernelIsa isa() const { return state().isa; }
  /// The Gloo context, for calling Gloo directly (the perf tool's --raw mode). Null when the
  /// world has one rank. Do not use it while work is queued on the comm stream.
  std::shared_ptr<::gloo::Context> native_context() const { return state().context; }

  // ---- streams and events -----------------------------------------------------------------------

  /// The inline queue: work runs in the calling thread.
  Stream default_stream() const { return Stream{Stream::Queue::kInline}; }
  /// The communication queue: work runs on this communicator's worker thread, in order.
  Stream comm_stream() const { return Stream{Stream::Queue::kComm}; }

  /// A reusable event, complete until it is first recorded.
  Event create_event() const { return Event{}; }

  /// A reusable timing event (the Backend concept): recorded like any event, it also keeps when the
  /// work it marks was done, read by `elapsed_ms`. Each record of one costs an allocation, and on
  /// the comm stream a task of the worker that reads the clock.
  Event create_timing_event() const { return Event::reached_at(std::chrono::steady_clock::now()); }

  /// Marks in `event` the work issued so far on `stream`, forgetting what it marked before
  /// (inline work is done already: the event becomes complete). Allocates nothing, except for a
  /// timing event.
  void record(Event& event, Stream stream) {
    if (event.timed()) {
      event = stream.queue == Stream::Queue::kInline ? Event::reached_at(std::chrono::steady_clock::now())
                                                     : state().queue->record_timed();
      return;
    }
    event = stream.queue == Stream::Queue::kInline ? Event{} : state().queue->record();
  }

  /// Milliseconds from timing event `start` to `end` (the Backend concept): waits until both are done,
  /// rethrowing a failure of the work before them. ConfigError for events that are not timing
  /// events.
  double elapsed_ms(const Event& start, const Event& end) const {
    const auto from = start.done_at();
    return std::chrono::duration<double, std::milli>(end.done_at() - from).count();
  }

  /// An event for the work issued so far on `stream`: create_event() and record() in one.
  Event record(Stream stream) {
    Event event = create_event();
    record(event, stream);
    return event;
  }

  /// Makes later work on `stream` wait for `event`. Inline stream: blocks the calling thread
  /// until the event completes and rethrows its failure. Comm stream: returns at once; the
  /// worker waits before running what comes next (nothing to do for this queue's own events).
  void wait(const Event& event, Stream stream) {
    if (event.query() && stream.queue == Stream::Queue::kComm) return;
    if (stream.queue == Stream::Queue::kInline) return event.wait();
    if (event.belongs_to(state().queue->state())) return;
    state().queue->submit([event] { event.wait(); });
  }

  /// Blocks until the work issued on `stream` has finished; rethrows the first failure there
  /// (a CommError). Inline stream: nothing to wait for.
  void synchronize(Stream stream) {
    if (stream.queue == Stream::Queue::kComm) state().queue->synchronize();
  }

  // ---- collectives on views ---------------------------------------------------------------------
  // The typed overloads (pointer + count, std::span) come from TypedCollectives.

  using Typed::all_gather;
  using Typed::all_gather_uneven;
  using Typed::all_reduce;
  using Typed::all_to_all;
  using Typed::broadcast;
  using Typed::gather;
  using Typed::recv;
  using Typed::reduce;
  using Typed::reduce_scatter;
  using Typed::scatter;
  using Typed::send;

  /// out[i] = op over ranks of in[i]. in.count == out.count; in place when in.data == out.data,
  /// else the buffers must not overlap. kAvg: floating types are scaled by 1/size() before the
  /// sum; integers are summed, then divided (truncating).
  void all_reduce(TensorView in, TensorView out, ReduceOp op = ReduceOp::kSum, Stream stream = {}) {
    auto& s = state();
    validated("all_reduce", stream, [&] {
      detail::check_views(s, "all_reduce", in, out);
      if (in.count != out.count) detail::mismatch(s, "all_reduce", "in.count == out.count", in.count, out.count);
      detail::check_alias(s, "all_reduce", in, out);
    });
    auto op_info = info("all_reduce", in.count, in.dtype, std::string(name_of(op)));
    op_info.fingerprint = CollectiveFingerprint::of("all_reduce", in.count, in.dtype).with_op(op);
    submit(stream, std::move(op_info), [in, out, op](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return local_reduce(in, out);
      detail::all_reduce_now(s, in.data, out.data, in.count, in.dtype, op, deadline);
    });
  }

  /// Copies root's `in` to every rank's `out` (out.count elements). `in` is read on the root
  /// only (it may equal `out` there); other ranks may pass an empty view.
  void broadcast(TensorView in, TensorView out, int root, Stream stream = {}) {
    auto& s = state();
    validated("broadcast", stream, [&] {
      detail::check_root(s, "broadcast", root);
      detail::check_views(s, "broadcast", s.rank == root ? in : out, out);
      if (s.rank == root && in.count != out.count) {
        detail::mismatch(s, "broadcast", "in.count == out.count on the root", in.count, out.count);
      }
      if (s.rank == root) detail::check_alias(s, "broadcast", in, out);
    });
    auto op_info = info("broadcast", out.count, out.dtype, "root " + std::to_string(root));
    op_info.fingerprint = CollectiveFingerprint::of("broadcast", out.count, out.dtype).with_root(root);
    submit(stream, std::move(op_info), [in, out, root](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return copy_view(in, out);
      detail::broadcast_now(s, in.data, out.data, out.count, out.dtype, root, deadline);
    });
  }

  /// Reduces every rank's `in` into root's `out`. On the root, out.count == in.count (in place
  /// when equal pointers). Elsewhere `out` may be empty (scratch is allocated) or a buffer of
  /// in.count elements, which is then overwritten with partial results.
  void reduce(TensorView in, TensorView out, ReduceOp op, int root, Stream stream = {}) {
    auto& s = state();
    const bool has_out = s.rank == root || out.data != nullptr;
    validated("reduce", stream, [&] {
      detail::check_root(s, "reduce", root);
      detail::check_views(s, "reduce", in, has_out ? out : in);
      if (has_out && in.count != out.count) detail::mismatch(s, "reduce", "in.count == out.count", in.count, out.count);
      if (has_out) detail::check_alias(s, "reduce", in, out);
    });
    auto op_info = info("reduce", in.count, in.dtype, std::string(name_of(op)) + ", root " + std::to_string(root));
    op_info.fingerprint = CollectiveFingerprint::of("reduce", in.count, in.dtype).with_op(op).with_root(root);
    submit(stream, std::move(op_info), [in, out, op, root, has_out](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return local_reduce(in, out);
      detail::reduce_now(s, in.data, has_out ? out.data : nullptr, in.count, in.dtype, op, root, deadline);
    });
  }

  /// out = concatenation of every rank's `in` in rank order; out.count == in.count * size().
  /// In place when in.data points at this rank's slice of `out`.
  void all_gather(TensorView in, TensorView out, Stream stream = {}) {
    auto& s = state();
    const bool in_place = in.data == detail::byte_ptr(out.data) + in.bytes() * static_cast<std::size_t>(s.rank);
    validated("all_gather", stream, [&] {
      detail::check_views(s, "all_gather", in, out);
      if (out.count != in.count * static_cast<std::size_t>(s.size)) {
        detail::mismatch(s, "all_gather", "out.count == in.count * size()", in.count, out.count);
      }
      if (!in_place && detail::overlaps(in.data, in.bytes(), out.data, out.bytes()))
        detail::overlap_error(s, "all_gather");
    });
    auto op_info = info("all_gather", out.count, out.dtype, "");
    op_info.fingerprint = CollectiveFingerprint::of("all_gather", in.count, in.dtype);
    std::vector<std::size_t> counts(static_cast<std::size_t>(s.size), in.count);
    submit(stream, std::move(op_info),
           [in, out, in_place, counts = std::move(counts)](detail::CommunicatorState& s, auto deadline) {
             if (s.size == 1) return copy_view(in, out);
             detail::all_gather_uneven_now(s, in_place ? nullptr : in.data, out.data, counts, out.dtype, deadline);
           });
  }

  /// All-gather with uneven parts: rank r contributes counts[r] elements (in.count ==
  /// counts[rank()]); out holds them in rank order (out.count == sum of counts). Every rank
  /// passes the same counts. In place when in.data points at this rank's part of `out`.
  void all_gather_uneven(TensorView in, TensorView out, std::span<const std::size_t> counts, Stream stream = {}) {
    static constexpr const char* kOp = "all_gather_uneven";
    auto& s = state();
    bool in_place = false;
    validated(kOp, stream, [&] {
      if (counts.size() != static_cast<std::size_t>(s.size)) {
        detail::misuse(s, kOp,
                       "counts has " + std::to_string(counts.size()) + " entries for " + std::to_string(s.size) +
                           " ranks; give one count per rank");
      }
      detail::check_views(s, kOp, in, out);
      const auto mine = counts[static_cast<std::size_t>(s.rank)];
      if (in.count != mine) detail::mismatch(s, kOp, "in.count == counts[rank()]", in.count, mine);
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      if (out.count != total) detail::mismatch(s, kOp, "out.count == sum of counts", total, out.count);
      const std::size_t before = std::accumulate(counts.begin(), counts.begin() + s.rank, std::size_t{0});
      in_place = in.data == detail::byte_ptr(out.data) + before * size_of(out.dtype);
      if (!in_place && detail::overlaps(in.data, in.bytes(), out.data, out.bytes())) detail::overlap_error(s, kOp);
    });
    auto op_info = info(kOp, out.count, out.dtype, "");
    op_info.fingerprint = CollectiveFingerprint::of(kOp, out.count, out.dtype).with_counts(counts);
    std::vector<std::size_t> copy(counts.begin(), counts.end());
    submit(stream, std::move(op_info),
           [in, out, in_place, counts = std::move(copy)](detail::CommunicatorState& s, auto deadline) {
             if (s.size == 1) return copy_view(in, out);
             detail::all_gather_uneven_now(s, in_place ? nullptr : in.data, out.data, counts, out.dtype, deadline);
           });
  }

  /// out = chunk rank() of the reduction of every rank's `in`; in.count == out.count * size().
  /// `in` is read only. In place when out.data points at this rank's chunk of `in`. kAvg:
  /// the sum divided by size() (integers truncate).
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op = ReduceOp::kSum, Stream stream = {}) {
    auto& s = state();
    const bool in_place = out.data == detail::byte_ptr(in.data) + out.bytes() * static_cast<std::size_t>(s.rank);
    validated("reduce_scatter", stream, [&] {
      detail::check_views(s, "reduce_scatter", in, out);
      if (in.count != out.count * static_cast<std::size_t>(s.size)) {
        detail::mismatch(s, "reduce_scatter", "in.count == out.count * size()", in.count, out.count);
      }
      if (!in_place && detail::overlaps(in.data, in.bytes(), out.data, out.bytes())) {
        detail::overlap_error(s, "reduce_scatter");
      }
    });
    auto op_info = info("reduce_scatter", in.count, in.dtype, std::string(name_of(op)));
    op_info.fingerprint = CollectiveFingerprint::of("reduce_scatter", out.count, out.dtype).with_op(op);
    submit(stream, std::move(op_info), [in, out, op](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return local_reduce(in, out);
      detail::reduce_scatter_now(s, in.data, out.data, out.count, in.dtype, op, deadline);
    });
  }

  /// Slice j of `in` (in.count / size() elements) goes to rank j, landing there as slice
  /// rank() of `out`. in.count == out.count, a multiple of size(). Out of place only: the
  /// buffers must not overlap.
  void all_to_all(TensorView in, TensorView out, Stream stream = {}) {
    static constexpr const char* kOp = "all_to_all";
    auto& s = state();
    validated(kOp, stream, [&] {
      detail::check_views(s, kOp, in, out);
      if (in.count != out.count) detail::mismatch(s, kOp, "in.count == out.count", in.count, out.count);
      if (in.count % static_cast<std::size_t>(s.size) != 0) {
        detail::misuse(s, kOp,
                       "in.count " + std::to_string(in.count) + " is not a multiple of size() " +
                           std::to_string(s.size) + "; give every rank the same number of elements");
      }
      if (detail::overlaps(in.data, in.bytes(), out.data, out.bytes())) {
        detail::misuse(s, kOp, "input and output overlap; all_to_all is out of place only: pass separate buffers");
      }
    });
    auto op_info = info(kOp, in.count, in.dtype, "");
    op_info.fingerprint = CollectiveFingerprint::of(kOp, in.count, in.dtype);
    submit(stream, std::move(op_info), [in, out](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return copy_view(in, out);
      detail::all_to_all_now(s, in.data, out.data, in.count, in.dtype, deadline);
    });
  }

  /// Every rank's `in` lands on rank `root` at offset rank * in.count of `out` (out.count ==
  /// in.count * size() on the root; `out` is ignored elsewhere). In place on the root when
  /// in.data points at its slice of `out`.
  void gather(TensorView in, TensorView out, int root, Stream stream = {}) {
    static constexpr const char* kOp = "gather";
    auto& s = state();
    validated(kOp, stream, [&] {
      detail::check_root(s, kOp, root);
      detail::check_view(s, kOp, in, "input");
      if (s.rank != root) return;
      detail::check_views(s, kOp, in, out);
      if (out.count != in.count * static_cast<std::size_t>(s.size)) {
        detail::mismatch(s, kOp, "out.count == in.count * size() on the root", in.count, out.count);
      }
      const bool in_place = in.data == detail::byte_ptr(out.data) + in.bytes() * static_cast<std::size_t>(s.rank);
      if (!in_place && detail::overlaps(in.data, in.bytes(), out.data, out.bytes())) detail::overlap_error(s, kOp);
    });
    auto op_info = info(kOp, in.count, in.dtype, "root " + std::to_string(root));
    op_info.fingerprint = CollectiveFingerprint::of(kOp, in.count, in.dtype).with_root(root);
    submit(stream, std::move(op_info), [in, out, root](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return copy_view(in, out);
      detail::gather_now(s, in.data, out.data, in.count, in.dtype, root, deadline);
    });
  }

  /// Slice j of rank `root`'s `in` (in.count == out.count * size() there) lands in `out` of
  /// rank j. `in` is ignored off the root. In place on the root when out.data points at its
  /// slice of `in`.
  void scatter(TensorView in, TensorView out, int root, Stream stream = {}) {
    static constexpr const char* kOp = "scatter";
    auto& s = state();
    validated(kOp, stream, [&] {
      detail::check_root(s, kOp, root);
      detail::check_view(s, kOp, out, "output");
      if (s.rank != root) return;
      detail::check_views(s, kOp, in, out);
      if (in.count != out.count * static_cast<std::size_t>(s.size)) {
        detail::mismatch(s, kOp, "in.count == out.count * size() on the root", in.count, out.count);
      }
      const bool in_place = out.data == detail::byte_ptr(in.data) + out.bytes() * static_cast<std::size_t>(s.rank);
      if (!in_place && detail::overlaps(in.data, in.bytes(), out.data, out.bytes())) detail::overlap_error(s, kOp);
    });
    auto op_info = info(kOp, out.count, out.dtype, "root " + std::to_string(root));
    op_info.fingerprint = CollectiveFingerprint::of(kOp, out.count, out.dtype).with_root(root);
    submit(stream, std::move(op_info), [in, out, root](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return copy_view(in, out);
      detail::scatter_now(s, in.data, out.data, out.count, out.dtype, root, deadline);
    });
  }

  /// Sends `in` to rank `peer`, which must post a matching recv (same count and type). Blocks
  /// (inline) until the data has left, within the timeout; two ranks that exchange must order
  /// their calls (one sends first while the other receives first), as every call holds the
  /// communicator's connections until it ends. Not part of the argument check (only two
  /// ranks call it).
  void send(TensorView in, int peer, Stream stream = {}) {
    static constexpr const char* kOp = "send";
    auto& s = state();
    detail::check_peer(s, kOp, peer);
    detail::check_view(s, kOp, in, "input");
    auto op_info = info(kOp, in.count, in.dtype, "to rank " + std::to_string(peer), /*checked=*/false);
    submit(stream, std::move(op_info), [in, peer](detail::CommunicatorState& s, auto deadline) {
      detail::send_now(s, in.data, in.bytes(), peer, deadline);
    });
  }

  /// Receives into `out` from rank `peer` (see send).
  void recv(TensorView out, int peer, Stream stream = {}) {
    static constexpr const char* kOp = "recv";
    auto& s = state();
    detail::check_peer(s, kOp, peer);
    detail::check_view(s, kOp, out, "output");
    auto op_info = info(kOp, out.count, out.dtype, "from rank " + std::to_string(peer), /*checked=*/false);
    submit(stream, std::move(op_info), [out, peer](detail::CommunicatorState& s, auto deadline) {
      detail::recv_now(s, out.data, out.bytes(), peer, deadline);
    });
  }

  /// Returns (or, on the comm stream, completes) once every rank has reached it.
  void barrier(Stream stream = {}) {
    auto op_info = info("barrier", 0, DataType::kUint8, "");
    op_info.fingerprint = CollectiveFingerprint::of("barrier");
    submit(stream, std::move(op_info), [](detail::CommunicatorState& s, auto deadline) {
      if (s.size > 1) detail::barrier_now(s, deadline);
    });
  }

  // ---- memory and element-wise work (what fusion and compression use) -------------------------

  /// Host memory aligned to 64 bytes (a cache line, and any vector width). Never null; free
  /// with deallocate().
  void* allocate(std::size_t bytes) {
    return ::operator new (std::max<std::size_t>(bytes, 1), std::align_val_t{kAlignment});
  }
  void deallocate(void* pointer) { ::operator delete (pointer, std::align_val_t{kAlignment}); }

  /// memcpy(to, from, bytes) on `stream`. The ranges must not overlap.
  void copy(void* to, const void* from, std::size_t bytes, Stream stream = {}) {
    run_local(stream, [to, from, bytes] {
      if (bytes > 0) std::memcpy(to, from, bytes);
    });
  }
  /// The same as copy: this backend's memory is host memory. (The NCCL backend's copy between
  /// the host and its GPU; generic code calls these to move bytes to and from the host.)
  void copy_from_host(void* to, const void* from, std::size_t bytes, Stream stream = {}) {
    copy(to, from, bytes, stream);
  }
  void copy_to_host(void* to, const void* from, std::size_t bytes, Stream stream = {}) {
    copy(to, from, bytes, stream);
  }

  /// Sets every byte of `out` to zero on `stream`.
  void fill_zero(TensorView out, Stream stream = {}) {
    if (out.where != MemoryKind::kHost) throw ConfigError(state().who() + ": fill_zero needs host memory");
    run_local(stream, [out] {
      if (out.count > 0) std::memset(out.data, 0, out.bytes());
    });
  }
  /// out[i] *= factor, in out's element type (see ncclkit::gloo::scale), on `stream`.
  void scale(TensorView out, double factor, Stream stream = {}) {
    detail::misuse_if(state(), "scale",
                      ncclkit::detail::memory_problem("buffer", out, MemoryKind::kHost, detail::kHostMemoryRemedy));
    const KernelIsa isa = state().isa;
    run_local(stream, [out, factor, isa] { gloo::scale(out.dtype, out.data, out.data, out.count, factor, isa); });
  }

  // ---- compression and packing ------------------------------------------------------------

  // ---- optimizer work (the Backend concept; core/update.hpp) ---------------------------------

  /// One optimizer update of float32 `param` by `grad` (and the rule's state), and its bfloat16
  /// `copy` where that has data, on `stream`.
  void update(const UpdateRule& rule, TensorView param, TensorView grad, TensorView state0, TensorView state1,
              TensorView copy, Stream stream = {}) {
    if (const std::string problem = ncclkit::detail::update_problem(rule, param, grad, state0, state1, copy);
        !problem.empty()) {
      throw ConfigError(state().who() + ": " + problem);
    }
    run_local(stream, [rule, param, grad, state0, state1, copy] {
      ncclkit::detail::update_on_host(rule, param, grad, state0, state1, copy);
    });
  }
  /// Adds the sum of squares of `in` (floating types) to out[0] (kSquareSumWords doubles), in
  /// double, in order, on `stream`.
  void sum_squares(TensorView in, double* out, Stream stream = {}) {
    run_local(stream, [in, out] { ncclkit::detail::sum_squares_on_host(in, out); });
  }

  /// A batch of copies: host memory needs no table on a device, so it is the list itself.
  using CopyBatch = std::vector<CopyItem>;

  /// out[i] = in[i] * factor converted to out's element type, on `stream` (floating types; see
  /// the Backend concept). Where `nonfinite` is not null, the number of non-finite outputs is added to
  /// it (atomically).
  void cast(TensorView in, TensorView out, double factor, std::uint64_t* nonfinite = nullptr, Stream stream = {}) {
    detail::misuse_if(state(), "cast",
                      ncclkit::detail::memory_problem("input", in, MemoryKind::kHost, detail::kHostMemoryRemedy));
    detail::misuse_if(state(), "cast",
                      ncclkit::detail::memory_problem("output", out, MemoryKind::kHost, detail::kHostMemoryRemedy));
    detail::misuse_if(state(), "cast", ncclkit::detail::cast_problem(in, out));
    const KernelIsa isa = state().isa;
    run_local(stream, [in, out, factor, nonfinite, isa] {
      const std::uint64_t bad = gloo::cast(in, out, factor, isa);
      if (nonfinite != nullptr && bad != 0) std::atomic_ref<std::uint64_t>(*nonfinite).fetch_add(bad);
    });
  }
  /// The batch, checked; empty copies dropped.
  CopyBatch prepare_copies(std::span<const CopyItem> items) {
    detail::misuse_if(state(), "prepare_copies", ncclkit::detail::copy_batch_problem(items));
    CopyBatch batch;
    for (const CopyItem& item : items) {
      if (item.bytes != 0) batch.push_back(item);
    }
    return batch;
  }
  /// Runs every copy of `batch` on `stream` (the batch must outlive the work).
  void copy_batch(const CopyBatch& batch, Stream stream = {}) {
    const CopyBatch* items = &batch;
    run_local(stream, [items] { ncclkit::detail::copy_batch_on_host(*items); });
  }

 private:
  static constexpr std::size_t kAlignment = 64;

  detail::CommunicatorState& state() const {
    if (!state_) throw ConfigError("gloo communicator used after it was moved from");
    return *state_;
  }

  void destroy() noexcept {
    if (!state_) return;
    detail::close(*state_);
    state_.reset();
  }

  /// Numbers a collective and describes it for messages. `checked`: every rank takes part, so
  /// the argument check (Options::check_collectives) compares it; false for send and recv.
  detail::OpInfo info(const char* name, std::size_t count, DataType type, std::string detail_text,
                      bool checked = true) {
    auto& s = state();
    s.check_usable(name);
    detail::OpInfo op;
    op.name = name;
    op.sequence = s.issued.fetch_add(1) + 1;
    op.check_sequence = checked ? s.checked.fetch_add(1) + 1 : 0;
    op.count = count;
    op.dtype = type;
    op.bytes = count * size_of(type);
    op.detail = std::move(detail_text);
    return op;
  }

  /// Runs `body(state, deadline)` as collective `op` on `stream`.
  template <class Body>
  void submit(Stream stream, detail::OpInfo op, Body body) {
    auto* s = &state();
    // Nothing to move (the same on every rank, unless the argument check finds otherwise).
    const bool empty = op.count == 0 && std::string_view(op.name) != "barrier";
    if (empty && (!s->options.check_collectives || op.check_sequence == 0)) {
      return run_local(stream, [s] { s->completed.fetch_add(1, std::memory_order_acq_rel); });
    }
    auto task = [s, op = std::move(op), body = std::move(body), empty] {
      s->execute(op, [&](std::chrono::steady_clock::time_point deadline) {
        if (!empty) body(*s, deadline);
      });
    };
    if (stream.queue == Stream::Queue::kInline) {
      task();
    } else {
      s->queue->submit(std::move(task));
    }
  }

  /// Runs a collective's local argument checks (`checks`, which throw ConfigError). With
  /// Options::check_collectives on, a rank whose checks fail still takes its turn in the
  /// argument comparison, with a fingerprint that carries the reason, on `stream` (inline:
  /// now; comm stream: queued in order): so the other ranks raise a CollectiveMismatchError
  /// naming this rank and the reason at once, instead of waiting in the comparison until the
  /// timeout. This rank then raises its own ConfigError (the comparison's mismatch is not
  /// reported again here, nor at a later synchronize).
  template <class Checks>
  void validated(const char* name, Stream stream, Checks&& checks) {
    auto* s = &state();
    if (!s->options.check_collectives || s->size == 1) return checks();
    try {
      checks();
    } catch (const ConfigError& e) {
      const std::string_view reason = ncclkit::detail::misuse_what(e.what(), name, s->who());
      auto op = info(name, 0, DataType::kUint8, "arguments rejected on this rank");
      op.fingerprint = CollectiveFingerprint::of(name).with_rejection(reason);
      auto task = [s, op = std::move(op)] {
        try {
          s->execute(op, [](std::chrono::steady_clock::time_point) {});
        } catch (const CollectiveMismatchError&) {
          // Expected: this rank's own ConfigError says why.
        }
      };
      if (stream.queue == Stream::Queue::kInline) {
        task();
      } else {
        s->queue->submit(std::move(task));
      }
      throw;
    }
  }

  template <class Fn>
  void run_local(Stream stream, Fn fn) {
    if (stream.queue == Stream::Queue::kInline) {
      fn();
    } else {
      state().queue->submit(std::move(fn));
    }
  }

  static void copy_view(TensorView in, TensorView out) {
    if (in.data != out.data && out.bytes() > 0) std::memcpy(out.data, in.data, out.bytes());
  }

  /// A world of one: the reduction of one rank's input is the input (avg divides by 1).
  static void local_reduce(TensorView in, TensorView out) {
    if (out.data != nullptr) copy_view(TensorView{in.data, out.count, in.dtype, in.where}, out);
  }

  std::unique_ptr<detail::CommunicatorState> state_;
};

static_assert(Backend<Communicator>, "ncclkit::gloo::Communicator must model ncclkit::Backend");

}  // namespace ncclkit::gloo
