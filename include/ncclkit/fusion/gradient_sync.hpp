#pragma once
/// `GradientSync<B>`: all-reduces the gradients of a `FusedBuffer` bucket by bucket while
/// backward is still running, over any backend.
///
/// Backward marks each tensor ready as its gradient is written; a bucket of the plan is
/// launched as soon as it is complete **and every earlier bucket has been launched**, so every
/// rank issues the same collectives in the same order whatever order its gradients arrived in.
/// A launch records an event on the caller's compute stream, makes the communication stream
/// wait for it and all-reduces the bucket's range in place there: the host never waits (llm.c's
/// "we avoid having to synchronize the host"). `finish` launches what is left and makes the
/// compute stream wait for the last bucket, by an event; the optimizer step that follows on
/// that stream sees reduced gradients.
///
/// Events are made once, at construction (one per bucket and one for the end of a step, and,
/// with a codec or loose tensors, two per piece of the plan: a bucket, or a chunk of a
/// compressed one), and re-recorded every step.
///
/// Compression (GradientSyncOptions::codec): a float32 bucket is encoded to 16 bits on the
/// compute stream when it launches, summed in 16 bits on the comm stream, and decoded back
/// into the float32 gradients on the stream given to `finish`, chunk by chunk, each after an
/// event: encoding bucket k+1 overlaps reducing bucket k, and decoding bucket k overlaps
/// reducing bucket k+1. A high-priority comm stream (nccl::Options::stream_priority) keeps
/// NCCL's kernels ahead of the casts.
///
/// Seeing it: with NCCLKIT_TIMELINE=prefix (or GradientSyncOptions::timeline) each rank writes a
/// Chrome trace of its first steps (fusion/timeline.hpp): buckets ready, launched and done, and
/// the pack, encode, all_reduce, decode and unpack work on the streams. On device backends the
/// same phases are NVTX ranges (domain "ncclkit") for Nsight Systems, where nvtx3 is on the
/// include path.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>    // std::max
#include <array>        // std::array
#include <chrono>       // std::chrono::steady_clock
#include <cstddef>      // std::size_t, std::byte
#include <cstdint>      // std::uint64_t
#include <exception>    // std::exception
#include <memory>       // std::unique_ptr
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <utility>      // std::move
#include <vector>       // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/nvtx.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/compression/codec.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/core/detail/backend_memory.hpp"
#include "ncclkit/fusion/detail/pieces.hpp"
#include "ncclkit/fusion/detail/plan_agreement.hpp"
#include "ncclkit/fusion/detail/sync_timeline.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/fusion/ready_tracker.hpp"
#include "ncclkit/fusion/timeline.hpp"

namespace ncclkit::fusion {

/// Options of a `GradientSync<B>`; designated initialisers:
/// `GradientSync sync(buffer, plan, {.op = ReduceOp::kSum, .codec = compression::Codec::kFloat16})`.
template <Backend B>
struct GradientSyncOptions {
  /// kAvg (default: gradients of the mean loss over the global batch, as DDP gives) or kSum.
  ReduceOp op = ReduceOp::kAvg;
  /// What `finish` does about tensors never marked ready in a step (see MissingTensors).
  MissingTensors missing = MissingTensors::kError;
  /// Where buckets are reduced; the backend's `comm_stream()` when empty.
  std::optional<typename B::Stream> comm_stream = std::nullopt;
  /// Compare the plan's fingerprint and these options across ranks at construction (one
  /// all_gather of 32 bytes a rank) and throw ConfigError on every rank when they differ. Turn
  /// off only where every rank parsed rank 0's `serialize()`d plan already; the same on every rank.
  bool check_plan = true;

  /// How float32 buckets travel (compression/codec.hpp): kNone (default) reduces them as they
  /// are; kFloat16 and kBFloat16 encode each bucket into 16 bits on the compute stream (scale
  /// and cast in one pass), sum the 16-bit data, and decode it back into the float32
  /// gradients in `finish` (one pass, counting non-finite results). Buckets of other element
  /// types are reduced as they are. Needs a CodecBackend.
  compression::Codec codec = compression::Codec::kNone;
  /// What encode multiplies float32 gradients by; decode divides it out. Default 1/world:
  /// the 16-bit sum of `world` gradients is then no larger than one gradient, so fp16
  /// overflows only where a single gradient would.
  std::optional<double> prescale = std::nullopt;
  /// Compressed buckets are encoded, reduced and decoded in chunks of at most this many
  /// float32 bytes, so encoding one chunk overlaps reducing the one before; 0 (default): one
  /// chunk per bucket (buckets already pipeline against each other).
  std::size_t chunk_bytes = 0;
  /// With a codec: reduce again in float32 every chunk whose 16-bit result has a non-finite
  /// value (the float32 gradients are still intact then), so an fp16 overflow costs time,
  /// never a step. It makes `finish` wait on the host for the compressed chunks once a step.
  bool rerun_nonfinite = false;
  /// With a codec, on a backend that can (CompressedReduceBackend: the NCCL communicator when
  /// every rank's GPU reaches every other's memory and NCCL is the version ncclkit was built
  /// against), each compressed piece is reduced by one kernel that encodes, moves the 16-bit
  /// data between GPUs, sums and decodes it (docs/fusion.md, "Compression"): no separate
  /// casts, and each rank's own part is summed unrounded. Elsewhere, off, or with
  /// rerun_nonfinite (which needs the float32 gradients intact after the reduction): cast,
  /// 16-bit all-reduce, cast. The two paths round differently in the last bit, each the same
  /// on every rank. `fused_transfer()` says which one runs.
  bool fused_transfer = true;

  /// A Chrome trace of the first steps (fusion/timeline.hpp): nullopt (default) takes it from
  /// the environment (NCCLKIT_TIMELINE, NCCLKIT_TIMELINE_STEPS; off when unset); a value turns it
  /// on, or off whatever the environment says when its prefix is empty. Need not be the same
  /// on every rank. Off, it costs nothing: no events, no allocations.
  std::optional<TimelineOptions> timeline = std::nullopt;
};

/// What the last finished step did.
struct GradientSyncStats {
  /// Buckets in the plan.
  std::size_t buckets = 0;
  /// Buckets launched from `mark_ready`, before `finish` was called: the overlap with backward.
  std::size_t launched_before_finish = 0;
  /// Tensors `finish` reduced as zeros (MissingTensors::kReduceAsZeros).
  std::size_t zeroed = 0;
  /// Steps finished so far.
  std::size_t steps = 0;
  /// Chunks reduced in 16 bits each step (0 without a codec).
  std::size_t compressed_chunks = 0;
  /// With rerun_nonfinite: the chunks the last step reduced again in float32.
  std::size_t rerun_chunks = 0;
};

/// Host times of one bucket in a step (steady_clock), for seeing the overlap: when its last
/// tensor was marked ready (or `finish` zeroed it) and when its collective was issued. When
/// the collective ends is the comm stream's business and is not recorded here.
struct BucketTiming {
  std::chrono::steady_clock::time_point ready;
  std::chrono::steady_clock::time_point launched;
};

namespace detail {
/// A backend's CompressedReduce workspace, or an empty stand-in for a backend that has none.
template <class B>
struct CompressedReduceOf {
  struct type {};
};
template <CompressedReduceBackend B>
struct CompressedReduceOf<B> {
  using type = typename B::CompressedReduce;
};
/// A backend's CopyBatch, or an empty stand-in for a backend that has none.
template <class B>
struct CopyBatchOf {
  struct type {};
};
template <CodecBackend B>
struct CopyBatchOf<B> {
  using type = typename B::CopyBatch;
};
}  // namespace detail

/// Synchronises the gradients of `buffer` along `plan`, one step at a time:
/// `mark_ready(slot)` for every tensor as backward writes it, then `finish()`.
///
/// Loose tensors: given a pointer per slot (`loose`; null for a tensor that lives in the
/// buffer), the buffer is a staging area: a bucket's loose gradients are packed into it by
/// one batched copy on the compute stream when the bucket launches, and unpacked by one
/// batched copy in `finish` (a CodecBackend's copy_batch: one kernel on GPUs). A loose tensor
/// alone in its bucket (one larger than the cap, say) and not compressed is reduced where it
/// lives, with no copies.
///
/// The buffer's memory and the backend must outlive this object (moving the FusedBuffer is
/// fine: its allocations stay where they are). Not thread-safe: hooks that fire on several
/// threads serialise their calls. Every rank must construct it with the same plan and options
/// (it checks) and mark all tensors (or use kReduceAsZeros) every step. All of a step's
/// `mark_ready` calls name one compute stream, or streams the caller has ordered.
template <Backend B>
class GradientSync {
 public:
  using Stream = typename B::Stream;
  using Event = typename B::Event;
  using Options = GradientSyncOptions<B>;

  /// Makes the events, zeroes the buffer's alignment padding (so that it never holds a NaN
  /// that a codec would count) and, with `check_plan` and more than one rank, compares the
  /// plan's fingerprint and options across ranks: a collective every rank must enter (it
  /// synchronises the comm stream once; construction is not on the hot path). ConfigError
  /// when `plan` was not made for `buffer.layout()`, for an op other than kSum and kAvg, for a
  /// codec or loose tensors on a backend that is not a CodecBackend, and, on every rank, when
  /// ranks hold different plans or options (the message lists each rank's fingerprint).
  GradientSync(FusedBuffer<B>& buffer, BucketPlan plan, Options options = {})
      : GradientSync(buffer, std::move(plan), {}, options) {}
  /// With loose tensors: `loose[slot]` is the user's tensor for that slot (its element type and
  /// count, in the backend's memory), or null where the tensor lives in the buffer; empty
  /// means none.
  GradientSync(FusedBuffer<B>& buffer, BucketPlan plan, std::span<void* const> loose, Options options = {})
      : backend_(&buffer.backend()),
        layout_(buffer.layout()),
        tracker_(checked(buffer, std::move(plan), loose, options), ReadyTrackerOptions{options.missing}),
        options_(options),
        comm_(options.comm_stream.value_or(backend_->comm_stream())),
        done_event_(backend_->create_event()) {
    for (DataType type : layout_.element_types())
      base_[static_cast<std::size_t>(type)] = static_cast<std::byte*>(buffer.data(type));
    const BucketPlan& p = tracker_.plan();
    const std::size_t buckets = p.size();
    stats_.buckets = buckets;
    ready_events_.reserve(buckets);
    for (std::size_t b = 0; b < buckets; ++b) {
      ready_events_.push_back(backend_->create_event());
      initial_pending_.push_back(static_cast<std::uint32_t>(p[b].slots.size()));
    }
    pending_ = initial_pending_;
    timings_.resize(buckets);
    last_timings_.resize(buckets);

    const bool compress = options_.codec != compression::Codec::kNone;
    pieces_ = detail::cut_pieces(p, compress, compression::wire_type(options_.codec), options_.chunk_bytes);
    stats_.compressed_chunks = pieces_.encoded;
    if (compress) factors_ = compression::factors(backend_->size(), options_.op == ReduceOp::kAvg, options_.prescale);
    bool try_fused = compress && pieces_.encoded != 0 && options_.fused_transfer && !options_.rerun_nonfinite;
    for (const detail::Piece& piece : pieces_.pieces) {
      // The kernel moves 16-byte words: a layout aligned more loosely (LayoutOptions) runs the
      // separate casts. The layout is the same on every rank, so is this decision.
      if (piece.encoded && reinterpret_cast<std::uintptr_t>(piece_view(piece).data) % 16 != 0) try_fused = false;
    }
    (void)try_fused;  // used only where the backend can run the fused kernel

    // Seed of zeros, for kReduceAsZeros, the padding and the non-finite counters.
    static const std::byte kZeros[kZeroBytes] = {};
    zeros_ = ncclkit::detail::Allocation<B>(*backend_, kZeroBytes);
    ncclkit::detail::copy_from_host(*backend_, zeros_.data(), kZeros, kZeroBytes, comm_);
    zero_padding();

    if constexpr (CodecBackend<B>) {
      if (!loose.empty()) prepare_loose(loose);
      if (compress) {
        // Two sets, for steps of even and odd number: nonfinite() reads the last finished step's
        // while the next step's fused kernels count into the other.
        counters_ = ncclkit::detail::Allocation<B>(*backend_, 2 * pieces_.pieces.size() * sizeof(std::uint64_t));
        // Zeroed once: with the fused kernel only the compressed pieces' counters are reset per step.
        ncclkit::detail::zero_fill(
            *backend_, TensorView{counters_.data(), 2 * pieces_.pieces.size(), DataType::kUint64, B::memory_kind},
            zeros_.data(), zeros_.bytes(), comm_);
        for (std::size_t i = 0; i < pieces_.pieces.size(); ++i) encoded_events_.push_back(backend_->create_event());
      }
      if (compress || !pack_.empty()) {
        for (std::size_t i = 0; i < pieces_.pieces.size(); ++i) reduced_events_.push_back(backend_->create_event());
      }
    }
    // The zeros must be in place before any other stream copies from them.
    backend_->synchronize(comm_);
    start_timeline();  // the comm stream is idle now: where the timeline's anchor goes
    if (options_.check_plan && backend_->size() > 1) {
      detail::agree_on_plan(*backend_, comm_, p.fingerprint(), settings(),
                            "ncclkit: GradientSync on rank " + std::to_string(backend_->rank()), p.describe());
    }
    // After the agreement: every rank reaches this collective with the same options.
    if constexpr (CompressedReduceBackend<B>) {
      if (try_fused) {
        std::size_t largest = 0;
        for (const detail::Piece& piece : pieces_.pieces) {
          if (piece.encoded) largest = std::max(largest, piece.count);
        }
        compressed_ = backend_->prepare_compressed_reduce(largest, compression::wire_type(options_.codec));
        if (!compressed_) {
          const std::string why = backend_->compressed_reduce_unavailable();
          log_info("ncclkit: GradientSync: compression runs as separate casts around a 16-bit all-reduce: " +
                   (why.empty() ? std::string("another rank cannot run the fused kernel") : why));
        }
      }
    }
    if constexpr (CodecBackend<B>) {
      if (compress && !fused_transfer()) wire_ = ncclkit::detail::Allocation<B>(*backend_, pieces_.wire_bytes);
    }
  }

  /// Movable (a moved-from sync owns no step); not move-assignable, since assigning over a
  /// step in flight would drop it unwaited.
  GradientSync(GradientSync&&) noexcept = default;
  GradientSync& operator=(GradientSync&&) = delete;
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  /// After a finished step, waits for nothing: let the stream reach `finish` before freeing the
  /// buffer. A step left unfinished (an exception between the first launch and the end of
  /// `finish`, `finish` itself included) may still have buckets queued that write into the
  /// buffer: the destructor waits for them on the comm stream, bounded by the backend's timeout,
  /// so that the buffer can be freed after it.
  ///
  /// With a timeline, it also reads the last finished step's timings (waiting for its work) and
  /// writes the file (a warning, not an exception, when it cannot).
  ~GradientSync() {
    if (step_in_flight_.on) {
      try {
        backend_->synchronize(comm_);
      } catch (const std::exception& e) {
        log_warn(std::string("GradientSync: the buckets of an unfinished step failed: ") + e.what());
      }
    }
    if (timeline_) timeline_->flush();
  }

  /// Records that `slot`'s gradient has been written by work issued on `stream` (the compute
  /// stream), and launches the buckets that may go now. Never blocks the host. ConfigError,
  /// naming the tensor, when it was already marked this step or the slot is out of range.
  void mark_ready(Slot slot, Stream stream) {
    throw_if_failed();
    const BucketRange range = tracker_.mark_ready(slot);
    if (timeline_) timeline_->on_mark(stream);
    if (const auto bucket = tracker_.plan().bucket_of(slot); bucket && --pending_[*bucket] == 0) {
      timings_[*bucket].ready = Clock::now();
    }
    launch(range, stream);
  }
  void mark_ready(Slot slot) { mark_ready(slot, backend_->default_stream()); }
  /// By name; ConfigError naming it when no tensor has that name.
  void mark_ready(std::string_view name, Stream stream) { mark_ready(layout_.slot(name), stream); }
  void mark_ready(std::string_view name) { mark_ready(name, backend_->default_stream()); }

  /// Ends the step: launches the buckets not launched yet, then makes `stream` wait for every
  /// bucket (by events) and decodes compressed chunks and unpacks loose tensors on it, and
  /// starts the next step. Never blocks the host (except with rerun_nonfinite); work issued
  /// on `stream` afterwards sees the reduced gradients. Tensors never marked: with kError
  /// (default) a ConfigError naming every one, launching nothing more (mark them and call
  /// `finish` again); with kReduceAsZeros they are filled with zeros on `stream` first, then
  /// reduced with the rest.
  void finish(Stream stream) {
    const Nvtx range("GradientSync.finish", stats_.steps);
    throw_if_failed();
    if (timeline_) timeline_->on_finish_begin(stream);
    const std::size_t launched_before = tracker_.launched();
    FinishResult result = tracker_.finish();  // kError and tensors missing: throws, the step goes on
    const auto now = Clock::now();
    for (std::size_t b : result.launch) {
      if (pending_[b] != 0) timings_[b].ready = now;
    }
    stats_.rerun_chunks = 0;
    try {
      step_in_flight_.on = step_in_flight_.on || !result.launch.empty();
      for (Slot slot : result.zeroed) {
        ncclkit::detail::zero_fill(*backend_, loose_view(slot), zeros_.data(), zeros_.bytes(), stream);
      }
      launch_unchecked(result.launch, stream);
      if constexpr (CodecBackend<B>) {
        if (!reduced_events_.empty()) complete_on(stream);
      }
      if (!tracker_.plan().buckets().empty()) {
        backend_->record(done_event_, comm_);
        backend_->wait(done_event_, stream);
      }
    } catch (const std::exception& e) {
      failure_ = e.what();
      throw;
    }
    step_in_flight_.on = false;
    finish_stream_ = stream;
    stats_.launched_before_finish = launched_before;
    stats_.zeroed = result.zeroed.size();
    ++stats_.steps;
    last_timings_.swap(timings_);
    pending_ = initial_pending_;
    tracker_.reset();
    if (timeline_) timeline_->on_finish_end(std::span<const BucketTiming>(last_timings_));
  }
  void finish() { finish(backend_->default_stream()); }

  /// Non-finite values (Inf, NaN) in the last finished step's results of its compressed
  /// chunks: the same on every rank (they all hold the same reduced data), so all ranks can act
  /// on it (skip the step, lower a loss scale) with no more communication. 0 without a codec.
  /// With rerun_nonfinite, a chunk reduced again counts its float32 result: non-zero then means
  /// a gradient itself was not finite. Synchronises the stream last given to `finish` to read
  /// the device's counters.
  std::uint64_t nonfinite() {
    if (pieces_.encoded == 0 || stats_.steps == 0) return 0;
    // The finished step's set: the step being built (if any) counts into the other one.
    read_counters(finish_stream_, reinterpret_cast<const std::uint64_t*>(counters_.data()) +
                                      ((stats_.steps - 1) % 2) * pieces_.pieces.size());
    std::uint64_t total = 0;
    for (std::uint64_t n : host_counts_) total += n;
    return total;
  }

  /// The plan, in launch order.
  const BucketPlan& plan() const { return tracker_.plan(); }
  /// This step's state: what is marked, how many buckets have launched.
  const ReadyTracker& tracker() const { return tracker_; }
  /// What the last finished step did.
  const GradientSyncStats& stats() const { return stats_; }
  /// Per bucket, in plan order, when the last finished step found it ready and launched it.
  std::span<const BucketTiming> timings() const { return last_timings_; }
  const Options& options() const { return options_; }
  Stream comm_stream() const { return comm_; }
  /// Whether compressed pieces are reduced by the fused kernel (GradientSyncOptions::fused_transfer).
  bool fused_transfer() const {
    if constexpr (CompressedReduceBackend<B>) {
      return compressed_.has_value();
    } else {
      return false;
    }
  }

  /// The timeline being recorded, or null when it is off (or its file could not be written).
  const Timeline* timeline() const { return timeline_ ? &timeline_->trace() : nullptr; }
  /// Writes the timeline now, with every finished step (it waits for the last one's work);
  /// nothing when it is off. The file is also written when the last recorded step finishes and
  /// at destruction. A failure to write is a warning (core/log.hpp), never an exception.
  void flush_timeline() {
    if (timeline_) timeline_->flush();
  }

 private:
  using Clock = std::chrono::steady_clock;
  using CopyBatch = typename detail::CopyBatchOf<B>::type;
  using Nvtx = ncclkit::detail::NvtxRangeIf<B::memory_kind == MemoryKind::kDevice>;
  using Phase = detail::Phase;
  static constexpr std::size_t kZeroBytes = 4096;

  /// `plan`, once it is known to fit `buffer`'s layout and the options and backend can run it.
  static BucketPlan checked(const FusedBuffer<B>& buffer, BucketPlan plan, std::span<void* const> loose,
                            const Options& options) {
    if (options.op != ReduceOp::kSum && options.op != ReduceOp::kAvg) {
      throw ConfigError("ncclkit: GradientSync: op " + std::string(name_of(options.op)) +
                        " is not a gradient reduction; use ReduceOp::kAvg or ReduceOp::kSum");
    }
    if (options.codec != compression::Codec::kNone && options.codec != compression::Codec::kFloat16 &&
        options.codec != compression::Codec::kBFloat16) {
      throw ConfigError("ncclkit: GradientSync: invalid codec value " +
                        std::to_string(static_cast<int>(options.codec)));
    }
    if (!CodecBackend<B> && (options.codec != compression::Codec::kNone || !loose.empty())) {
      throw ConfigError(
          "ncclkit: GradientSync: a codec and loose tensors need a backend with cast, prepare_copies and "
          "copy_batch (the CodecBackend concept); this backend has none");
    }
    if (options.rerun_nonfinite && options.codec == compression::Codec::kNone) {
      throw ConfigError("ncclkit: GradientSync: rerun_nonfinite needs a codec (fp16 or bf16)");
    }
    if (!loose.empty() && loose.size() != buffer.layout().size()) {
      throw ConfigError("ncclkit: GradientSync: " + std::to_string(loose.size()) + " loose pointers for " +
                        std::to_string(buffer.layout().size()) +
                        " tensors; give one per slot (null for a tensor that lives in the buffer)");
    }
    try {
      (void)BucketPlan::parse(plan.serialize(), buffer.layout());
    } catch (const ConfigError& e) {
      throw ConfigError(std::string("ncclkit: GradientSync: the plan was not made for this buffer's layout "
                                    "(make it with BucketPlan::compute(buffer.layout())): ") +
                        e.what());
    }
    return plan;
  }

  TensorView range_view(DataType type, std::size_t begin_bytes, std::size_t count) const {
    return TensorView{base_[static_cast<std::size_t>(type)] + begin_bytes, count, type, B::memory_kind};
  }
  TensorView piece_view(const detail::Piece& piece) const {
    if (!direct_.empty() && direct_[piece.bucket] != nullptr) {
      return TensorView{direct_[piece.bucket], piece.count, tracker_.plan()[piece.bucket].dtype, B::memory_kind};
    }
    return range_view(tracker_.plan()[piece.bucket].dtype, piece.begin_bytes, piece.count);
  }
  TensorView wire_view(const detail::Piece& piece) const {
    return TensorView{wire_.data() + piece.wire_begin_bytes, piece.count, compression::wire_type(options_.codec),
                      B::memory_kind};
  }
  /// The counters of the step being built (two sets, alternating by step).
  std::size_t counter_offset() const { return (stats_.steps % 2) * pieces_.pieces.size(); }
  TensorView counters_view() const {
    return TensorView{counter(0), pieces_.pieces.size(), DataType::kUint64, B::memory_kind};
  }

  std::uint64_t* counter(std::size_t piece) const {
    return reinterpret_cast<std::uint64_t*>(counters_.data()) + counter_offset() + piece;
  }
  /// Where `slot`'s gradient is written by the caller: its loose tensor, or its view.
  TensorView loose_view(Slot slot) const {
    const DataType type = layout_.dtype(slot);
    const std::size_t count = layout_.count(slot);
    if (count == 0) return TensorView{nullptr, 0, type, B::memory_kind};
    if (slot.index < loose_.size() && loose_[slot.index] != nullptr) {
      return TensorView{loose_[slot.index], count, type, B::memory_kind};
    }
    return range_view(type, layout_.offset_bytes(slot), count);
  }

  /// Zeroes the bytes of every allocation that no tensor covers.
  void zero_padding() {
    for (DataType type : layout_.element_types()) {
      std::size_t end = 0;
      const auto gap = [&](std::size_t from, std::size_t to) {
        if (to > from) {
          const TensorView bytes{base_[static_cast<std::size_t>(type)] + from, to - from, DataType::kUint8,
                                 B::memory_kind};
          ncclkit::detail::zero_fill(*backend_, bytes, zeros_.data(), zeros_.bytes(), comm_);
        }
      };
      for (Slot slot : layout_.order(type)) {
        gap(end, layout_.offset_bytes(slot));
        end = layout_.offset_bytes(slot) + layout_.bytes(slot);
      }
      gap(end, layout_.total_bytes(type));
    }
  }

  /// One pack batch (loose → buffer) and one unpack batch per bucket that has loose tensors
  /// (empty batches for the others); none at all when no bucket has any. A bucket whose only
  /// tensor is loose and whose piece is not encoded needs neither: it is reduced in place.
  void prepare_loose(std::span<void* const> loose) {
    loose_.assign(loose.begin(), loose.end());
    const BucketPlan& p = tracker_.plan();
    pack_.resize(p.size());
    unpack_.resize(p.size());
    direct_.assign(p.size(), nullptr);
    bool any = false;
    bool any_direct = false;
    for (std::size_t b = 0; b < p.size(); ++b) {
      if (p[b].slots.size() == 1 && loose_[p[b].slots[0].index] != nullptr &&
          !pieces_.pieces[pieces_.first[b]].encoded) {
        direct_[b] = loose_[p[b].slots[0].index];
        any_direct = true;
        continue;
      }
      std::vector<CopyItem> in;
      std::vector<CopyItem> out;
      for (Slot slot : p[b].slots) {
        void* user = loose_[slot.index];
        if (user == nullptr) continue;
        void* staged = base_[static_cast<std::size_t>(layout_.dtype(slot))] + layout_.offset_bytes(slot);
        in.push_back({staged, user, layout_.bytes(slot)});
        out.push_back({user, staged, layout_.bytes(slot)});
      }
      if (in.empty()) continue;
      any = true;
      pack_[b] = backend_->prepare_copies(in);
      unpack_[b] = backend_->prepare_copies(out);
    }
    if (!any) {
      pack_.clear();
      unpack_.clear();
    }
    if (!any_direct) direct_.clear();
  }
  /// Whether bucket `b` has loose tensors to pack and unpack.
  bool has_loose(std::size_t b) const requires CodecBackend<B> { return !pack_.empty() && pack_[b].size() != 0; }

  /// After a backend call failed during a launch, the tracker counts buckets as launched that
  /// never reached the backend: this rank is out of step with the others for good.
  void throw_if_failed() const {
    if (!failure_.empty()) {
      throw ConfigError("ncclkit: GradientSync on rank " + std::to_string(backend_->rank()) +
                        " is unusable: a launch failed (" + failure_ +
                        "), so its buckets are out of step with the other ranks'. Destroy it (and, after a "
                        "CommError, the communicator) and start over");
    }
  }

  /// Launches `range` (buckets in plan order) after the work issued so far on `stream`; a
  /// failure leaves the sync unusable (throw_if_failed).
  void launch(BucketRange range, Stream stream) {
    try {
      step_in_flight_.on = step_in_flight_.on || !range.empty();
      launch_unchecked(range, stream);
    } catch (const std::exception& e) {
      failure_ = e.what();
      throw;
    }
  }
  void launch_unchecked(BucketRange range, Stream stream) {
    if (range.empty()) return;
    const Nvtx nvtx("GradientSync.launch", range.first);
    bool plain = false;
    for (std::size_t b : range) {
      if constexpr (CodecBackend<B>) {
        if (has_loose(b)) {
          const Nvtx pack("GradientSync.pack", b);
          mark(Phase::kPack, b, false, stream);
          backend_->copy_batch(pack_[b], stream);
          mark(Phase::kPack, b, true, stream);
        }
      }
      mark(Phase::kReady, b, false, stream);
      plain = plain || !pieces_.pieces[pieces_.first[b]].encoded;
    }
    if (plain) {
      // One event covers every plain bucket of the range: they became launchable together.
      Event& ready = ready_events_[range.first];
      backend_->record(ready, stream);
      backend_->wait(ready, comm_);
    }
    for (std::size_t b : range) {
      timings_[b].launched = Clock::now();
      for (std::size_t i = pieces_.first[b]; i < pieces_.first[b + 1]; ++i) {
        const detail::Piece& piece = pieces_.pieces[i];
        if (piece.encoded && fused_transfer()) {
          if constexpr (CompressedReduceBackend<B>) {
            // Counted on the comm stream, where the kernel adds to it; complete_on only waits.
            ncclkit::detail::zero_fill(*backend_, TensorView{counter(i), 1, DataType::kUint64, B::memory_kind},
                                       zeros_.data(), zeros_.bytes(), comm_);
            if (i == pieces_.first[b]) {
              backend_->record(encoded_events_[i], stream);
              backend_->wait(encoded_events_[i], comm_);
            }
            // On the timeline as the piece's reduction: encode and decode happen inside it.
            mark(Phase::kReduce, i, false, comm_);
            backend_->compressed_all_reduce(*compressed_, piece_view(piece), factors_.encode, factors_.decode,
                                            counter(i), comm_);
          }
        } else if (piece.encoded) {
          if constexpr (CodecBackend<B>) {
            {
              const Nvtx encode("GradientSync.encode", i);
              mark(Phase::kEncode, i, false, stream);
              backend_->cast(piece_view(piece), wire_view(piece), factors_.encode, nullptr, stream);
              mark(Phase::kEncode, i, true, stream);
            }
            backend_->record(encoded_events_[i], stream);
            backend_->wait(encoded_events_[i], comm_);
            mark(Phase::kReduce, i, false, comm_);
            backend_->all_reduce(wire_view(piece), wire_view(piece), ReduceOp::kSum, comm_);
          }
        } else {
          mark(Phase::kReduce, i, false, comm_);
          backend_->all_reduce(piece_view(piece), piece_view(piece), options_.op, comm_);
        }
        mark(Phase::kReduce, i, true, comm_);
        if (!reduced_events_.empty()) backend_->record(reduced_events_[i], comm_);
      }
    }
  }

  /// The end of a step on `stream` for compressed chunks and loose tensors: wait for each
  /// piece, decode it (or, with rerun_nonfinite, reduce it again in float32 where its result
  /// is not finite), and unpack each bucket's loose tensors.
  void complete_on(Stream stream) requires CodecBackend<B> {
    const bool compress = pieces_.encoded != 0;
    if (compress && !fused_transfer())
      ncclkit::detail::zero_fill(*backend_, counters_view(), zeros_.data(), zeros_.bytes(), stream);
    if (compress && options_.rerun_nonfinite) {
      // Count first (a pass over the 16-bit results that leaves them as they are), read the
      // counts on the host: every rank sees the same ones and reruns the same chunks.
      for (std::size_t i = 0; i < pieces_.pieces.size(); ++i) {
        const detail::Piece& piece = pieces_.pieces[i];
        if (!piece.encoded) continue;
        backend_->wait(reduced_events_[i], stream);
        mark(Phase::kCount, i, false, stream);
        backend_->cast(wire_view(piece), wire_view(piece), 1.0, counter(i), stream);
        mark(Phase::kCount, i, true, stream);
      }
      read_counters(stream, counter(0));
    }
    for (std::size_t b = 0; b < pieces_.first.size() - 1; ++b) {
      for (std::size_t i = pieces_.first[b]; i < pieces_.first[b + 1]; ++i) {
        const detail::Piece& piece = pieces_.pieces[i];
        if (!piece.encoded || fused_transfer()) {
          // Reduced (and, fused, decoded) on the comm stream already.
          if (has_loose(b) || piece.encoded) backend_->wait(reduced_events_[i], stream);
          continue;
        }
        if (options_.rerun_nonfinite && host_counts_[i] != 0) {
          // The float32 gradients are untouched so far: reduce them as they are.
          backend_->record(encoded_events_[i], stream);
          backend_->wait(encoded_events_[i], comm_);
          mark(Phase::kRerun, i, false, comm_);
          backend_->all_reduce(piece_view(piece), piece_view(piece), options_.op, comm_);
          mark(Phase::kRerun, i, true, comm_);
          backend_->record(reduced_events_[i], comm_);
          backend_->wait(reduced_events_[i], stream);
          // The chunk's count is now that of its float32 result (a pass that leaves it as it is).
          ncclkit::detail::zero_fill(*backend_, TensorView{counter(i), 1, DataType::kUint64, B::memory_kind},
                                     zeros_.data(), zeros_.bytes(), stream);
          backend_->cast(piece_view(piece), piece_view(piece), 1.0, counter(i), stream);
          ++stats_.rerun_chunks;
          continue;
        }
        if (!options_.rerun_nonfinite) backend_->wait(reduced_events_[i], stream);
        const Nvtx decode("GradientSync.decode", i);
        mark(Phase::kDecode, i, false, stream);
        backend_->cast(wire_view(piece), piece_view(piece), factors_.decode,
                       options_.rerun_nonfinite ? nullptr : counter(i), stream);
        mark(Phase::kDecode, i, true, stream);
      }
      if (has_loose(b)) {
        const Nvtx unpack("GradientSync.unpack", b);
        mark(Phase::kUnpack, b, false, stream);
        backend_->copy_batch(unpack_[b], stream);
        mark(Phase::kUnpack, b, true, stream);
      }
    }
  }

  /// Copies one set of per-piece counters to host_counts_, synchronising `stream`.
  void read_counters(Stream stream, const std::uint64_t* from) {
    host_counts_.assign(pieces_.pieces.size(), 0);
    ncclkit::detail::copy_to_host(*backend_, host_counts_.data(), from, host_counts_.size() * sizeof(std::uint64_t),
                                  stream);
    backend_->synchronize(stream);
  }

  /// Brackets work for the timeline (nothing when it is off).
  void mark(Phase phase, std::size_t index, bool end, Stream stream) {
    if (timeline_) timeline_->mark(phase, index, end, stream);
  }

  /// Makes the timeline the options or the environment ask for, and records its anchor on the
  /// comm stream, which must be idle.
  void start_timeline() {
    const std::optional<TimelineOptions> wanted = timeline_with_environment(options_.timeline);
    if (!wanted || wanted->prefix.empty()) return;
    std::string label = "GradientSync (" + std::to_string(tracker_.plan().size()) + " buckets";
    if (options_.codec != compression::Codec::kNone) label += ", " + std::string(compression::name_of(options_.codec));
    if (has_any_loose()) label += ", loose tensors";
    timeline_ = detail::SyncTimeline<B>::make(*backend_, *wanted, tracker_.plan(), pieces_, has_any_loose(),
                                              options_.rerun_nonfinite, label + ")");
    if (timeline_) timeline_->anchor(comm_);
  }
  bool has_any_loose() const {
    if constexpr (CodecBackend<B>) return !pack_.empty();
    return false;
  }

  detail::SyncSettings settings() const {
    return {options_.op,
            options_.missing == MissingTensors::kReduceAsZeros,
            options_.codec,
            options_.rerun_nonfinite,
            options_.chunk_bytes,
            options_.prescale.value_or(0.0),
            options_.fused_transfer};
  }

  B* backend_;
  FusedLayout layout_;
  std::array<std::byte*, kDataTypeCount> base_{};  // the buffer's allocations, by element type
  ReadyTracker tracker_;
  Options options_;
  Stream comm_;
  Stream finish_stream_{};
  Event done_event_;                      // recorded on the comm stream after a step's last bucket
  std::vector<Event> ready_events_;       // per bucket; a launch of several buckets uses its first's
  ncclkit::detail::Allocation<B> zeros_;  // kZeroBytes of zeros
  GradientSyncStats stats_;
  std::vector<std::uint32_t> initial_pending_;  // non-empty tensors per bucket
  std::vector<std::uint32_t> pending_;          // of those, not marked yet this step
  std::vector<BucketTiming> timings_;           // this step's
  std::vector<BucketTiming> last_timings_;      // the last finished step's

  // Compression: the 16-bit wire buffer, its pieces and per-piece events and counters.
  detail::Pieces pieces_;
  compression::CodecFactors factors_;
  ncclkit::detail::Allocation<B> wire_;
  ncclkit::detail::Allocation<B> counters_;  // a std::uint64_t per piece, in the backend's memory
  std::vector<std::uint64_t> host_counts_;   // the counters, as last read
  std::vector<Event> encoded_events_;        // per piece: encoded on the compute stream
  std::vector<Event> reduced_events_;        // per piece: reduced on the comm stream (decode, unpack)
  /// The fused kernel's workspace, where the backend runs it (GradientSyncOptions::fused_transfer).
  using CompressedWorkspace = typename detail::CompressedReduceOf<B>::type;
  std::optional<CompressedWorkspace> compressed_;

  std::unique_ptr<detail::SyncTimeline<B>> timeline_;  // null when off

  std::string failure_;  // what a failed launch threw; the sync is unusable once set
  /// Whether buckets may be queued that the destructor must wait for: set by a launch, cleared
  /// when `finish` completes; a moved-from sync's is off.
  struct StepFlag {
    bool on = false;
    StepFlag() = default;
    StepFlag(StepFlag&& other) noexcept : on(std::exchange(other.on, false)) {}
    StepFlag& operator=(StepFlag&& other) noexcept {
      on = std::exchange(other.on, false);
      return *this;
    }
  } step_in_flight_;

  // Loose tensors: the user's pointers by slot, per bucket the batches that move them, and per
  // bucket the loose tensor it reduces in place (null for the others).
  std::vector<void*> loose_;
  std::vector<CopyBatch> pack_;  // per bucket, or none at all
  std::vector<CopyBatch> unpack_;
  std::vector<void*> direct_;  // per bucket, or none at all
};

}  // namespace ncclkit::fusion
