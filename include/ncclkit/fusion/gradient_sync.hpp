#pragma once
/// `GradientSync<B>`: averages (or sums) the gradients of a `FusedBuffer` across ranks bucket by
/// bucket while backward is still running, over any backend.
///
/// Backward marks each tensor ready as its gradient is written; a bucket of the plan is
/// launched as soon as it is complete **and every earlier bucket has been launched**, so every
/// rank issues the same collectives in the same order whatever order its gradients arrived in.
/// What a launch does is the reducer's (fusion/reducer.hpp): by default an all_reduce in place
/// on the comm stream, behind an event of the caller's compute stream, so the host never waits
/// (llm.c's "we avoid having to synchronize the host"); compression::compressed(...) sends
/// float32 buckets in 16 bits. `finish` launches what is left and makes the stream it is given
/// wait for each bucket, in plan order, by events: work issued there afterwards sees reduced
/// gradients. With a callback, `finish` hands over each bucket as soon as that bucket is
/// complete on the stream, so an optimizer's update of bucket b runs while later buckets are
/// still being reduced. A reducer that can (the fused 16-bit kernel) applies the update itself
/// where each bucket lands, given it before the step (`fuse_update`).
///
/// With `GradientSyncOptions::defer_gather`, a bucket travels in two halves where the reducer
/// can: its reduce-scatter at launch, under backward, and its all-gather issued by `finish` on
/// the comm stream in reverse plan order, with the callback's work for that bucket behind it.
/// `finish` leaves its stream waiting for nothing; `wait(slot, stream)` makes a stream see one
/// bucket's result and that work, so the next forward waits layer by layer while the gathers of
/// later layers still run.
///
/// Loose tensors: given a pointer per slot (null for a tensor that lives in the buffer), the
/// buffer is a staging area: a bucket's loose gradients are packed into it by one batched copy
/// on the compute stream when the bucket launches, and unpacked by one batched copy in
/// `finish`. A bucket that is one loose tensor is reduced where it lives where the reducer can.
///
/// The plan: given, or (constructors without one) the default caps' or, with
/// `GradientSyncOptions::tuning`, the fastest of a few candidates, timed over the first steps
/// (fusion/tuning.hpp).
///
/// Seeing it: with NCCLKIT_TIMELINE=prefix (or GradientSyncOptions::timeline) each rank writes a
/// Chrome trace of its first steps (fusion/timeline.hpp); on device backends every phase is also
/// an NVTX range (domain "ncclkit") for Nsight Systems. Both are observers (fusion/observer.hpp).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <array>        // std::array
#include <chrono>       // std::chrono::steady_clock
#include <cstddef>      // std::size_t, std::byte
#include <cstdint>      // std::uint64_t, std::uint32_t
#include <exception>    // std::exception
#include <functional>   // std::function
#include <memory>       // std::unique_ptr, std::make_shared
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <utility>      // std::move, std::exchange
#include <vector>       // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/core/update.hpp"
#include "ncclkit/fusion/all_reduce_reducer.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/detail/bucket_tuning.hpp"
#include "ncclkit/fusion/detail/loose_staging.hpp"
#include "ncclkit/fusion/detail/nvtx_observer.hpp"
#include "ncclkit/fusion/detail/sync_agreement.hpp"
#include "ncclkit/fusion/detail/sync_timeline.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/fusion/observer.hpp"
#include "ncclkit/fusion/ready_tracker.hpp"
#include "ncclkit/fusion/reducer.hpp"
#include "ncclkit/fusion/sync_options.hpp"
#include "ncclkit/fusion/timeline.hpp"
#include "ncclkit/fusion/tuning.hpp"

namespace ncclkit::fusion {

/// Synchronises the gradients of `buffer` along a plan, one step at a time: `mark_ready(slot)`
/// for every tensor as backward writes it, then `finish()`.
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

  /// Makes the reducer and the events, zeroes the buffer's alignment padding and, with
  /// `check_plan` and more than one rank, compares plan and options across ranks: a collective
  /// every rank must enter, also a rank whose own arguments are invalid, so that every rank
  /// throws the same ConfigError at once. ConfigError when `plan` was not made for
  /// `buffer.layout()`, for an op other than kSum and kAvg, for options the reducer rejects,
  /// and when ranks hold different plans or options (naming the rank and what differs).
  GradientSync(FusedBuffer<B>& buffer, BucketPlan plan, Options options = {})
      : GradientSync(buffer, std::optional<BucketPlan>(std::move(plan)), {}, std::move(options)) {}
  /// With loose tensors: `loose[slot]` is the user's tensor for that slot (its element type and
  /// count, in the backend's memory), or null where the tensor lives in the buffer; empty
  /// means none.
  GradientSync(FusedBuffer<B>& buffer, BucketPlan plan, std::span<void* const> loose, Options options = {})
      : GradientSync(buffer, std::optional<BucketPlan>(std::move(plan)), loose, std::move(options)) {}
  /// Without a plan: `options.tuning`'s choice, or the default caps' (BucketPlan::compute).
  explicit GradientSync(FusedBuffer<B>& buffer, Options options = {})
      : GradientSync(buffer, std::nullopt, {}, std::move(options)) {}
  GradientSync(FusedBuffer<B>& buffer, std::span<void* const> loose, Options options)
      : GradientSync(buffer, std::nullopt, loose, std::move(options)) {}

  /// Movable (a moved-from sync owns no step); not move-assignable, since assigning over a
  /// step in flight would drop it unwaited.
  GradientSync(GradientSync&&) noexcept = default;
  GradientSync& operator=(GradientSync&&) = delete;
  GradientSync(const GradientSync&) = delete;
  GradientSync& operator=(const GradientSync&) = delete;
  /// After a finished step, waits for nothing: let the stream reach `finish` before freeing the
  /// buffer. A step left unfinished (an exception between the first launch and the end of
  /// `finish`) may still have buckets queued that write into the buffer: the destructor waits
  /// for them on the comm stream, bounded by the backend's timeout. Writes the timeline, if any
  /// (a warning, not an exception, when it cannot).
  ~GradientSync() {
    if (step_in_flight_.on || gathers_issued_.on) {
      try {
        backend_->synchronize(comm_);
        if (gathers_issued_.on && options_.update_stream) backend_->synchronize(*options_.update_stream);
      } catch (const std::exception& e) {
        log_warn(std::string("GradientSync: the buckets of the last step failed: ") + e.what());
      }
    }
    if (state_) state_->observers.flush();
  }

  /// Records that `slot`'s gradient has been written by work issued on `stream` (the compute
  /// stream), and launches the buckets that may go now. Never blocks the host. ConfigError,
  /// naming the tensor, when it was already marked this step or the slot is out of range.
  void mark_ready(Slot slot, Stream stream) {
    throw_if_failed();
    PlanState& s = *state_;
    const BucketRange range = s.tracker.mark_ready(slot);
    if (tuner_) tuner_->start_clock();
    if (!s.observers.empty()) s.observers.mark(stream);
    if (const auto bucket = s.tracker.plan().bucket_of(slot); bucket && --s.pending[*bucket] == 0) {
      s.timings[*bucket].ready = Clock::now();
    }
    launch(range, stream);
  }
  void mark_ready(Slot slot) { mark_ready(slot, backend_->default_stream()); }
  /// By name; ConfigError naming it when no tensor has that name.
  void mark_ready(std::string_view name, Stream stream) { mark_ready(layout_.slot(name), stream); }
  void mark_ready(std::string_view name) { mark_ready(name, backend_->default_stream()); }

  /// Ends the step: launches the buckets not launched yet, then makes `stream` see each bucket's
  /// result in plan order (the reducer's completion work, then the unpacking of loose tensors,
  /// both on `stream`), and starts the next step. Never blocks the host (but while tuning, and
  /// for reducers that say so). Tensors never marked: with kError (default) a ConfigError naming
  /// them, launching nothing more (mark them and call `finish` again); with kReduceAsZeros they
  /// are filled with zeros on `stream` first, then reduced with the rest.
  void finish(Stream stream) { finish_step(stream, nullptr); }
  void finish() { finish(backend_->default_stream()); }
  /// As `finish(stream)`, calling `on_bucket(b)` for each bucket b of the plan, in order, right
  /// after b's result is complete on `stream`: work it issues on `stream` runs as soon as bucket
  /// b has landed, while later buckets are still reduced (an optimizer's per-bucket update).
  void finish(Stream stream, const std::function<void(std::size_t bucket)>& on_bucket) { finish_step(stream, on_bucket); }
  /// With defer_gather, `finish` differs: after the buckets not launched yet, it orders the comm
  /// stream after the work issued so far on `stream` (what the callback's work writes, backward
  /// may still read), then, for each bucket in reverse plan order, issues its second half and
  /// the unpacking of its loose tensors on the comm stream and calls `on_bucket(b)`, whose work
  /// must go on update_stream(), which waits for that bucket. `stream` waits for none of it: use
  /// `wait` or `wait_all`.

  /// Makes work issued on `stream` from now on see the result of the last finished step for the
  /// bucket that holds `slot`, and the work `finish`'s callback issued for that bucket (with
  /// defer_gather; without it, `finish`'s stream sees them already and this does nothing, as for
  /// an empty tensor or before the first step). Never blocks the host. ConfigError for a slot out
  /// of range.
  void wait(Slot slot, Stream stream) const {
    const PlanState& s = state();
    if (!s.deferred) return;
    if (const auto bucket = s.tracker.plan().bucket_of(slot)) backend_->wait(s.gathered[*bucket], stream);
  }
  void wait(std::string_view name, Stream stream) const { wait(layout_.slot(name), stream); }
  /// `wait` for every bucket: before reading the whole buffer, or the values the callbacks wrote.
  void wait_all(Stream stream) const {
    const PlanState& s = state();
    if (s.deferred) backend_->wait(s.all_gathered, stream);
  }

  /// For this step only (call it before the step's first mark_ready): every float32 bucket whose
  /// reducer can (BucketReducer::can_update; no loose tensor in it) gets `update.rule` applied by
  /// the reduction itself as it lands. `update`'s pointers are the bases of float32 parameters and
  /// optimizer state laid out like this sync's buffer (its float32 allocation; a trainer's
  /// FusedBuffers of values and state over the same layout), state null where the rule keeps
  /// fewer (UpdateRule::state_count); each bucket gets them at its offset. The reduced gradients
  /// of those buckets then go into the parameters, not the gradients, which keep this rank's own
  /// values. In `finish`'s callback, `updated(b)` says which buckets were updated so: update the
  /// others as usual. ConfigError when the step has already launched a bucket, or when `update`
  /// lacks the values or the state the rule needs.
  void fuse_update(const FusedUpdate& update) {
    throw_if_failed();
    PlanState& s = *state_;
    if (s.tracker.launched() > 0) {
      throw ConfigError("ncclkit: GradientSync::fuse_update after " + std::to_string(s.tracker.launched()) +
                        " buckets of the step were launched; call it before the step's first mark_ready");
    }
    if (const char* missing = update.missing()) {
      throw ConfigError("ncclkit: GradientSync::fuse_update: the update's " + std::string(missing) +
                        " is null; the rule keeps " + std::to_string(update.rule.state_count()) +
                        " state values per parameter: give the values and that many state buffers");
    }
    fused_ = update;
  }
  /// Whether this step's (in `finish`'s callback; after it, the last finished step's) update of
  /// bucket `b` was applied by the reducer (fuse_update).
  bool updated(std::size_t bucket) const { return bucket < state().updated.size() && state().updated[bucket] != 0; }

  /// Non-finite values (Inf, NaN) in the last finished step's results, as the reducer counts
  /// them (compression counts its 16-bit results; 0 for the plain all_reduce): the same on every
  /// rank, so all ranks can act on it with no more communication. May synchronise the stream
  /// last given to `finish`.
  std::uint64_t nonfinite() {
    throw_if_failed();
    if (previous_nonfinite_ && stats_.steps == steps_at_plan_start_) return *previous_nonfinite_;
    return stats_.steps == 0 ? 0 : state_->reducer->nonfinite();
  }

  /// The plan the next step runs, in launch order.
  const BucketPlan& plan() const { return state().tracker.plan(); }
  /// This step's state: what is marked, how many buckets have launched.
  const ReadyTracker& tracker() const { return state().tracker; }
  /// The reducer of the current plan.
  const BucketReducer<B>& reducer() const { return *state().reducer; }
  /// What the last finished step did.
  const GradientSyncStats& stats() const { return stats_; }
  /// Per bucket, in plan order, when the last finished step found it ready and launched it.
  std::span<const BucketTiming> timings() const { return last_timings_; }
  /// What tuning measured and chose (no candidates where the sync does not tune).
  const BucketTuning& tuning() const { return tuner_ ? tuner_->tuning() : no_tuning_; }
  const Options& options() const { return options_; }
  Stream comm_stream() const { return comm_; }
  /// Where `finish`'s callback issues its work with defer_gather: GradientSyncOptions::update_stream,
  /// else the comm stream.
  Stream update_stream() const { return options_.update_stream.value_or(comm_); }

  /// The timeline being recorded, or null when it is off (or its file could not be written).
  const Timeline* timeline() const {
    const auto* t = state().observers.template find<detail::SyncTimeline<B>>();
    return t ? &t->trace() : nullptr;
  }
  /// Writes the timeline now, with every finished step (it waits for the last one's work);
  /// nothing when it is off. A failure to write is a warning (core/log.hpp), never an exception.
  void flush_timeline() {
    throw_if_failed();
    state_->observers.flush();
  }

 private:
  using Clock = std::chrono::steady_clock;

  /// What belongs to one plan: a tuning sync makes a new one per candidate it tries.
  struct PlanState {
    PlanState(BucketPlan plan, MissingTensors missing) : tracker(std::move(plan), ReadyTrackerOptions{missing}) {}
    ReadyTracker tracker;
    ReducerSetup<B> setup;  // the reducer points here
    std::unique_ptr<BucketReducer<B>> reducer;
    Observers<B> observers;
    std::optional<detail::LooseStaging<B>> staging;
    std::vector<std::uint32_t> pending;      // non-empty tensors per bucket not marked yet this step
    std::vector<BucketTiming> timings;       // this step's
    std::vector<char> updated;               // per bucket: the reducer applied the step's update
    // defer_gather: per bucket, its second half and the callback's work ended on the comm stream;
    // all of them; the compute stream's work before the gathers. `deferred`: recorded.
    std::vector<Event> gathered;
    Event all_gathered{};
    Event before_gathers{};
    bool deferred = false;
  };

  GradientSync(FusedBuffer<B>& buffer, std::optional<BucketPlan> plan, std::span<void* const> loose, Options options)
      : backend_(&buffer.backend()),
        layout_(buffer.layout()),
        options_(std::move(options)),
        comm_(options_.comm_stream.value_or(backend_->comm_stream())),
        factory_(options_.reducer ? options_.reducer : std::make_shared<AllReduceFactory<B>>()),
        loose_(loose.begin(), loose.end()) {
    for (DataType type : layout_.element_types()) base_[index_of(type)] = static_cast<std::byte*>(buffer.data(type));
    std::string problem = detail::sync_problem(options_, layout_, loose_.size(), plan);
    if (problem.empty() && options_.tuning) tuner_.emplace(*options_.tuning, layout_);
    if (problem.empty() && !plan) plan = tuner_ ? tuner_->current_plan() : BucketPlan::compute(layout_);
    if (problem.empty()) problem = factory_->problem(setup_for(*plan, nullptr));
    const std::string who = "ncclkit: GradientSync on rank " + std::to_string(backend_->rank());
    if (options_.check_plan && backend_->size() > 1) {
      detail::agree_on_sync(*backend_, comm_, who, problem, plan ? plan->fingerprint() : 0, settings_words(),
                            tuner_ ? tuner_->words() : std::array<std::uint64_t, 3>{}, *factory_,
                            plan ? plan->describe() : std::string());
    } else if (!problem.empty()) {
      throw ConfigError(problem);
    }
    buffer.zero_padding(comm_);
    start(std::move(*plan));
  }

  std::array<std::uint64_t, 2> settings_words() const {
    return {static_cast<std::uint64_t>(options_.op),
            static_cast<std::uint64_t>(options_.missing == MissingTensors::kReduceAsZeros) |
                (static_cast<std::uint64_t>(options_.defer_gather) << 1)};
  }

  /// What a reducer of `plan` works on.
  ReducerSetup<B> setup_for(const BucketPlan& plan, Observers<B>* observers) const {
    ReducerSetup<B> setup{backend_, comm_, &plan, {}, options_.op, observers, options_.defer_gather};
    for (std::size_t b = 0; b < plan.size(); ++b) {
      const Bucket& bucket = plan[b];
      const bool single = bucket.slots.size() == 1;
      const std::size_t count = single ? plan.count(bucket.slots[0]) : bucket.count();
      void* loose = single && !loose_.empty() ? loose_[bucket.slots[0].index] : nullptr;
      setup.buckets.push_back({range_view(bucket.dtype, bucket.begin_bytes, count),
                               range_view(bucket.dtype, bucket.begin_bytes, bucket.count()), loose});
    }
    return setup;
  }

  /// Makes everything of `plan` (the reducer's making may be a collective).
  void start(BucketPlan plan) {
    auto s = std::make_unique<PlanState>(std::move(plan), options_.missing);
    const BucketPlan& p = s->tracker.plan();
    s->setup = setup_for(p, &s->observers);
    s->reducer = factory_->make(s->setup);
    s->staging.emplace(*backend_, layout_, base_.data(), loose_, p, *s->reducer);
    for (std::size_t b = 0; b < p.size(); ++b) s->pending.push_back(static_cast<std::uint32_t>(p[b].slots.size()));
    s->timings.resize(p.size());
    s->updated.assign(p.size(), 0);
    if (options_.defer_gather) {
      for (std::size_t b = 0; b < p.size(); ++b) s->gathered.push_back(backend_->create_event());
      s->all_gathered = backend_->create_event();
      s->before_gathers = backend_->create_event();
    }
    // The zeroed padding before any other stream reads it; an idle comm stream for the anchor.
    backend_->synchronize(comm_);
    s->observers.add(detail::NvtxObserver<B>::make());
    start_timeline(*s);
    if (stats_.steps == 0) {  // later, stats() says what the last finished step did
      stats_.buckets = p.size();
      stats_.compressed_chunks = s->reducer->compressed_pieces();
    }
    steps_at_plan_start_ = stats_.steps;
    state_ = std::move(s);
  }

  void start_timeline(PlanState& s) {
    const std::optional<TimelineOptions> wanted = timeline_with_environment(options_.timeline);
    if (!wanted || wanted->prefix.empty()) return;
    const BucketReducer<B>& r = *s.reducer;
    std::string label = "GradientSync (" + std::to_string(s.tracker.plan().size()) + " buckets";
    if (r.name() != "all_reduce") label += ", " + r.name();
    if (s.staging->any()) label += ", loose tensors";
    auto timeline = detail::SyncTimeline<B>::make(*backend_, *wanted, s.tracker.plan(), r.pieces(), r.piece_phases(),
                                                  s.staging->any(), label + ")");
    if (!timeline) return;
    timeline->anchor(comm_);
    s.observers.add(std::move(timeline));
  }

  /// Launches `range` after the work issued so far on `stream`; a failure leaves the sync
  /// unusable (throw_if_failed): its buckets would be out of step with the other ranks'.
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
    PlanState& s = *state_;
    for (std::size_t b : range) {
      if (s.staging->stages(b)) {
        observe(Phase::kPack, b, false, stream);
        backend_->copy_batch(s.staging->pack(b), stream);
        observe(Phase::kPack, b, true, stream);
      }
      observe(Phase::kReady, b, false, stream);
      s.timings[b].launched = Clock::now();
      if (b == 0) s.updated.assign(s.updated.size(), 0);  // a new step: buckets launch in plan order
      if (fused_ && fuses(b)) {
        s.reducer->set_update(b, fused_->from(s.tracker.plan()[b].begin_bytes / sizeof(float)));
        s.updated[b] = 1;
      }
    }
    s.reducer->launch(range, stream);
  }

  void finish_step(Stream stream, const std::function<void(std::size_t)>& on_bucket) {
    throw_if_failed();
    PlanState& s = *state_;
    if (!s.observers.empty()) s.observers.finish_begin(stream);
    const std::size_t launched_before = s.tracker.launched();
    FinishResult result = s.tracker.finish();  // kError and tensors missing: throws, the step goes on
    const auto now = Clock::now();
    for (std::size_t b : result.launch) {
      if (s.pending[b] != 0) s.timings[b].ready = now;
    }
    try {
      step_in_flight_.on = step_in_flight_.on || !result.launch.empty();
      for (Slot slot : result.zeroed) backend_->fill_zero(loose_view(slot), stream);
      launch_unchecked(result.launch, stream);
      if (options_.defer_gather) {
        finish_deferred(stream, on_bucket);
      } else {
        for (std::size_t b = 0; b < s.tracker.plan().size(); ++b) complete(b, stream, on_bucket);
        s.reducer->end_step(stream);
      }
    } catch (const std::exception& e) {
      failure_ = e.what();
      throw;
    }
    step_in_flight_.on = false;
    fused_.reset();
    stats_.buckets = s.tracker.plan().size();
    stats_.launched_before_finish = launched_before;
    stats_.zeroed = result.zeroed.size();
    stats_.compressed_chunks = s.reducer->compressed_pieces();
    stats_.rerun_chunks = s.reducer->retried_pieces();
    ++stats_.steps;
    last_timings_.swap(s.timings);
    s.timings.assign(last_timings_.size(), BucketTiming{});
    for (std::size_t b = 0; b < s.pending.size(); ++b) s.pending[b] = static_cast<std::uint32_t>(plan()[b].slots.size());
    s.tracker.reset();
    if (!s.observers.empty()) s.observers.finish_end(last_timings_);
    if (tuner_) end_tuning_step(stream);
  }

  /// Bucket `b`'s result on `stream`: the reducer's completion work, the unpacking of its loose
  /// tensors, then the caller's.
  void complete(std::size_t b, Stream stream, const std::function<void(std::size_t)>& on_bucket) {
    PlanState& s = *state_;
    s.reducer->complete(b, stream);
    if (s.staging->stages(b)) {
      observe(Phase::kUnpack, b, false, stream);
      backend_->copy_batch(s.staging->unpack(b), stream);
      observe(Phase::kUnpack, b, true, stream);
    }
    if (on_bucket) on_bucket(b);
  }

  /// defer_gather's end of a step (see `finish`): every bucket completed on the comm stream, in
  /// the order a forward pass needs them.
  void finish_deferred(Stream stream, const std::function<void(std::size_t)>& on_bucket) {
    PlanState& s = *state_;
    backend_->record(s.before_gathers, stream);
    backend_->wait(s.before_gathers, comm_);
    gathers_issued_.on = true;
    const bool beside = options_.update_stream.has_value();
    const Stream updates = update_stream();
    for (std::size_t b = s.tracker.plan().size(); b-- > 0;) {
      complete(b, comm_, nullptr);
      if (beside) {  // the update stream after this bucket's gather, the comm stream free for the next
        backend_->record(s.gathered[b], comm_);
        backend_->wait(s.gathered[b], updates);
      }
      if (on_bucket) on_bucket(b);
      backend_->record(s.gathered[b], updates);
    }
    s.reducer->end_step(comm_);
    backend_->record(s.all_gathered, comm_);
    if (beside) {
      backend_->wait(s.all_gathered, updates);
      backend_->record(s.all_gathered, updates);
    }
    s.deferred = true;
  }

  /// While tuning: waits for the step, times it and switches plans when the tuner says so.
  void end_tuning_step(Stream stream) {
    try {
      // With defer_gather the step ends on the update stream (the comm stream where none is
      // given), which waited for everything of the step on the comm stream. A switch of plans
      // drops the events that the next forward would wait for: it needs the step done.
      if (options_.defer_gather) stream = update_stream();
      if (tuner_->timing()) backend_->synchronize(stream);
      const auto next = tuner_->end_step([&](std::span<const std::uint64_t> mine) {
        if (backend_->size() == 1) return std::vector<std::uint64_t>(mine.begin(), mine.end());
        return ncclkit::detail::all_gather_words(*backend_, comm_, mine);
      });
      if (!next) return;
      if (options_.defer_gather) backend_->synchronize(stream);
      // The finished step's count, read before its reducer goes.
      previous_nonfinite_ = state_->reducer->nonfinite();
      state_->observers.flush();
      state_.reset();
      start(tuner_->current_plan());
    } catch (const std::exception& e) {
      failure_ = std::string("tuning failed (") + e.what() + ")";
      throw;
    }
  }

  /// Whether bucket `b` of this step's plan may take the fused update: float32, wholly in the
  /// buffer (a loose tensor's values are not laid out there), and a reducer that can.
  bool fuses(std::size_t b) const {
    const Bucket& bucket = state_->tracker.plan()[b];
    if (bucket.dtype != DataType::kFloat32) return false;
    if (!loose_.empty()) {
      for (Slot slot : bucket.slots) {
        if (loose_[slot.index] != nullptr) return false;
      }
    }
    return state_->reducer->can_update(b);
  }

  void observe(Phase phase, std::size_t index, bool end, Stream stream) {
    if (!state_->observers.empty()) state_->observers.phase(phase, index, end, stream);
  }

  void throw_if_failed() const {
    if (!failure_.empty()) {
      throw ConfigError("ncclkit: GradientSync on rank " + std::to_string(backend_->rank()) + " is unusable: " +
                        (failure_.rfind("tuning failed", 0) == 0 ? failure_ : "a launch failed (" + failure_ + ")") +
                        ", so its buckets are out of step with the other ranks'. Destroy it (and, after a "
                        "CommError, the communicator) and start over");
    }
  }
  const PlanState& state() const {
    throw_if_failed();
    return *state_;
  }

  static std::size_t index_of(DataType type) { return static_cast<std::size_t>(type); }
  /// `count` elements of `type` from `begin_bytes` into its allocation.
  TensorView range_view(DataType type, std::size_t begin_bytes, std::size_t count) const {
    return TensorView{base_[index_of(type)] + begin_bytes, count, type, B::memory_kind};
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

  B* backend_;
  FusedLayout layout_;
  std::array<std::byte*, kDataTypeCount> base_{};  // the buffer's allocations, by element type
  Options options_;
  Stream comm_;
  std::optional<FusedUpdate> fused_;  // this step's update for the reducer at the buffer's base, from fuse_update
  ReducerChoice<B> factory_;
  std::vector<void*> loose_;  // the user's pointers by slot, or none
  std::optional<detail::Tuner> tuner_;
  std::unique_ptr<PlanState> state_;
  GradientSyncStats stats_;
  std::vector<BucketTiming> last_timings_;  // the last finished step's
  std::optional<std::uint64_t> previous_nonfinite_;  // the last step of the plan before a switch
  std::size_t steps_at_plan_start_ = 0;
  BucketTuning no_tuning_;
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
  /// defer_gather: a step's second halves were issued on the comm stream, which the destructor
  /// then waits for (they write into the buffer).
  StepFlag gathers_issued_;
};

}  // namespace ncclkit::fusion
