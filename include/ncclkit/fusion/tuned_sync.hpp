#pragma once
/// `TunedGradientSync<B>`: a `GradientSync<B>` whose bucket cap is picked by timing the first
/// steps of training, then fixed.
///
/// Which cap is fastest depends on the model and the machine: a larger bucket costs less per
/// byte (fewer launches and latencies, NCCL nearer full bandwidth), a smaller one starts
/// sooner and overlaps more of backward. So the first steps try a few candidates, each for
/// `warmup_steps` untimed and `measured_steps` timed steps, and the rest of training runs the
/// fastest. A candidate is a `BucketOptions` (the cap and the first bucket's cap); candidates
/// whose plans come out equal for this layout are tried once.
///
/// Timing is backend-agnostic and measures what training feels: during tuning, `finish`
/// synchronises its stream and a step's time is the host time from its first `mark_ready` to
/// the end of that wait, backward's compute and the overlap with it included. Every rank takes
/// the median of its measured steps per candidate; after the last candidate one all_gather
/// (8 bytes a candidate and rank) gives every rank every rank's medians, and every rank makes
/// the same choice from the same integers: per candidate the slowest rank's median (a step
/// ends for everyone when the slowest rank's gradients are reduced), then the smallest of
/// those. The number of tuning steps is fixed by the options, so every rank switches plans
/// at the same step, whatever its timings. After tuning, steps run the chosen plan exactly as
/// a `GradientSync` would: no host waits.
///
/// Opt-in, because the results then depend on timing: the plan decides the sizes of the
/// collectives, and NCCL picks its algorithm and chunking by size, so the float sum of a
/// gradient may round differently under another cap. Ranks always agree with each other; two
/// runs of one program may differ in the last bits. Use `GradientSync` with a fixed cap where
/// runs must be bitwise reproducible (`tuning().chosen` says which cap to fix).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>    // std::max
#include <chrono>       // std::chrono::steady_clock, std::chrono::nanoseconds
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint64_t
#include <cstdio>       // std::snprintf
#include <exception>    // std::exception
#include <functional>   // std::function
#include <limits>       // std::numeric_limits
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <utility>      // std::move
#include <vector>       // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/byte_format.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/core/detail/backend_memory.hpp"
#include "ncclkit/fusion/detail/bucket_tuning.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/fusion/ready_tracker.hpp"

namespace ncclkit::fusion {

/// A bucket cap that never closes a bucket: after the first bucket, the rest of each element
/// type's allocation is one collective (the "one flat all-reduce" end of the range).
inline constexpr std::size_t kWholeBuffer = std::numeric_limits<std::size_t>::max();

/// The candidates `TunedSyncOptions` tries by default: caps of 4, 16, 25 (DDP's default, so
/// tuning never settles on something slower than it measured), 64 and 256 MiB, and the whole
/// buffer, the first bucket 1 MiB in each; then one bucket per element type (no first
/// bucket: the flat all-reduce itself, fastest where backward leaves nothing to overlap).
/// Roughly a factor of 4 apart, since step times change slowly with the cap; smaller caps
/// rarely pay, since a 1 MiB all-reduce runs at a quarter of the bandwidth of a 16 MiB one and
/// the small first bucket already starts early.
inline std::vector<BucketOptions> default_bucket_candidates() {
  std::vector<BucketOptions> candidates;
  for (std::size_t mib : {4, 16, 25, 64, 256}) candidates.push_back({.bucket_bytes = mib << 20});
  candidates.push_back({.bucket_bytes = kWholeBuffer});
  candidates.push_back({.bucket_bytes = kWholeBuffer, .first_bucket_bytes = kWholeBuffer});
  return candidates;
}

/// Options of a `TunedGradientSync<B>`; designated initialisers:
/// `TunedGradientSync sync(buffer, {.measured_steps = 5, .sync = {.op = ReduceOp::kSum}})`.
/// Every rank must give the same candidates and step counts (checked with `sync.check_plan`).
template <Backend B>
struct TunedSyncOptions {
  /// What to try, in this order: each candidate's `BucketPlan::compute` options. At least one;
  /// no cap of 0. One candidate (or candidates that all give one plan) means no tuning.
  std::vector<BucketOptions> candidates = default_bucket_candidates();
  /// Steps run untimed after switching to a candidate (first-use costs: NCCL sets up its
  /// buffers for a size the first time it meets it).
  std::size_t warmup_steps = 1;
  /// Steps timed per candidate (at least 1); the median counts.
  std::size_t measured_steps = 3;
  /// What every candidate's `GradientSync` is made with.
  GradientSyncOptions<B> sync = {};
  /// Where step times come from; `std::chrono::steady_clock::now` when empty. Tests inject
  /// one; it is called on the thread that calls `mark_ready` and `finish`.
  std::function<std::chrono::steady_clock::time_point()> clock = {};
};

/// One candidate as tuning saw it.
struct BucketCandidate {
  BucketOptions caps;
  /// Buckets in its plan.
  std::size_t buckets = 0;
  /// An earlier candidate whose plan is the same for this layout: this one is not run.
  std::optional<std::size_t> same_plan_as;
  /// This rank's measured step times, in order.
  std::vector<std::chrono::nanoseconds> step_times;
  /// Their median (the lower middle one of an even count); 0 until measured.
  std::chrono::nanoseconds median{0};
  /// The largest median over ranks, what the choice compares; 0 until tuning ends.
  std::chrono::nanoseconds slowest_median{0};
};

/// What tuning measured and chose, and where it stands.
struct BucketTuning {
  std::vector<BucketCandidate> candidates;
  /// The candidate whose plan the next step runs.
  std::size_t current = 0;
  /// The winner, once tuning has ended (the same on every rank).
  std::optional<std::size_t> chosen;
  /// Steps finished while tuning (each waited for on the host).
  std::size_t tuning_steps = 0;
  /// Steps finished in all.
  std::size_t steps = 0;

  bool done() const { return chosen.has_value(); }
  /// One line: "4.00 MiB (6 buckets) 1.234 ms, ..., whole buffer (2 buckets) 0.987 ms; chosen:
  /// whole buffer after 24 steps" (slowest rank's medians once done, this rank's before).
  std::string describe() const {
    const auto cap = [](const BucketCandidate& c) {
      if (c.caps.bucket_bytes != kWholeBuffer) return format_bytes(c.caps.bucket_bytes);
      return std::string(c.caps.first_bucket_bytes == kWholeBuffer ? "one bucket" : "whole buffer");
    };
    std::string text;
    for (std::size_t i = 0; i < candidates.size(); ++i) {
      const BucketCandidate& c = candidates[i];
      text += (i == 0 ? "" : ", ") + cap(c) + " (" + std::to_string(c.buckets) + " buckets) ";
      if (c.same_plan_as) {
        text += "same plan as " + cap(candidates[*c.same_plan_as]);
        continue;
      }
      const auto t = done() ? c.slowest_median : c.median;
      if (c.step_times.empty()) {
        text += "not measured yet";
        continue;
      }
      char ms[32];
      std::snprintf(ms, sizeof ms, "%.3f ms", static_cast<double>(t.count()) / 1e6);
      text += ms;
    }
    if (done())
      return text + "; chosen: " + cap(candidates[*chosen]) + " after " + std::to_string(tuning_steps) + " steps";
    return text + "; tuning, " + std::to_string(tuning_steps) + " steps so far";
  }
};

/// A `GradientSync<B>` over `buffer` that tunes its bucket cap over the first steps (see the
/// header comment), with the same step interface: `mark_ready(slot or name, stream)` for every
/// tensor as backward writes it, then `finish(stream)`.
///
/// Each switch of candidate destroys the current `GradientSync` (after a finished,
/// synchronised step: nothing in flight) and constructs the next, which is a collective (the
/// plan check) that every rank enters at the same step. The buffer must stay where it is (not
/// be moved) and, with loose tensors, the pointers valid, while tuning may still switch.
/// Not thread-safe, like GradientSync. Between the first `mark_ready` and the end of `finish`
/// of a tuning step, issue no other collective on the communicator.
template <Backend B>
class TunedGradientSync {
 public:
  using Stream = typename B::Stream;
  using Options = TunedSyncOptions<B>;

  /// Computes each candidate's plan, checks (with `sync.check_plan` and more than one rank)
  /// that every rank tunes alike, by one all_gather, and constructs the first candidate's
  /// `GradientSync`. ConfigError for bad options (naming the field), and what `GradientSync`
  /// throws.
  explicit TunedGradientSync(FusedBuffer<B>& buffer, Options options = {})
      : TunedGradientSync(buffer, {}, std::move(options)) {}
  /// With loose tensors: as `GradientSync`'s constructor takes them.
  TunedGradientSync(FusedBuffer<B>& buffer, std::span<void* const> loose, Options options = {})
      : buffer_(&buffer),
        backend_(&buffer.backend()),
        loose_(loose.begin(), loose.end()),
        options_(checked(std::move(options))) {
    for (std::size_t i = 0; i < options_.candidates.size(); ++i) {
      BucketPlan plan = BucketPlan::compute(buffer.layout(), options_.candidates[i]);
      BucketCandidate candidate{.caps = options_.candidates[i], .buckets = plan.size()};
      for (std::size_t earlier : order_) {
        if (plans_[earlier] == plan) {
          candidate.same_plan_as = earlier;
          break;
        }
      }
      if (!candidate.same_plan_as) order_.push_back(i);
      plans_.push_back(std::move(plan));
      tuning_.candidates.push_back(std::move(candidate));
    }
    if (options_.sync.check_plan && backend_->size() > 1) agree_on_tuning();
    if (order_.size() == 1) tuning_.chosen = order_[0];
    start(order_[0]);
  }

  /// Movable while no step is in flight, like GradientSync; not assignable.
  TunedGradientSync(TunedGradientSync&&) noexcept = default;
  TunedGradientSync& operator=(TunedGradientSync&&) = delete;
  TunedGradientSync(const TunedGradientSync&) = delete;
  TunedGradientSync& operator=(const TunedGradientSync&) = delete;
  ~TunedGradientSync() = default;

  /// As GradientSync::mark_ready; while tuning, the first mark of a step starts its clock.
  void mark_ready(Slot slot, Stream stream) {
    start_clock();
    sync().mark_ready(slot, stream);
  }
  void mark_ready(Slot slot) { mark_ready(slot, backend_->default_stream()); }
  void mark_ready(std::string_view name, Stream stream) {
    start_clock();
    sync().mark_ready(name, stream);
  }
  void mark_ready(std::string_view name) { mark_ready(name, backend_->default_stream()); }

  /// As GradientSync::finish. While tuning it also waits on the host for `stream` (bounded by
  /// the backend's timeouts), records the step's time and, after a candidate's last step,
  /// switches to the next candidate or, after the last, exchanges the medians and switches to
  /// the winner: the steps after it run the new plan. A step with tensors missing (kError)
  /// throws as GradientSync's does and is not counted; any other failure leaves this object
  /// unusable.
  void finish(Stream stream) {
    throw_if_failed();
    if (tuning_.done()) {
      sync().finish(stream);
      ++tuning_.steps;
      return;
    }
    const auto begin = step_started_ ? step_begin_ : now();
    sync().finish(stream);
    try {
      backend_->synchronize(stream);
      const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(now() - begin);
      step_started_ = false;
      ++tuning_.steps;
      ++tuning_.tuning_steps;
      end_tuning_step(std::max(elapsed, std::chrono::nanoseconds{0}));
    } catch (const std::exception& e) {
      failure_ = e.what();
      throw;
    }
  }
  void finish() { finish(backend_->default_stream()); }

  /// As GradientSync::nonfinite, for the last finished step (also across a switch).
  std::uint64_t nonfinite() { return fresh() ? previous_nonfinite_ : sync().nonfinite(); }
  /// What the last finished step did (also across a switch); `steps` counts every step.
  GradientSyncStats stats() const {
    GradientSyncStats stats = fresh() ? previous_stats_ : sync().stats();
    stats.steps = tuning_.steps;
    return stats;
  }
  /// Per bucket of the last finished step's plan: see GradientSync::timings.
  std::span<const BucketTiming> timings() const {
    if (fresh()) return previous_timings_;
    return sync().timings();
  }
  /// The plan the next step runs.
  const BucketPlan& plan() const { return sync().plan(); }
  /// This step's state.
  const ReadyTracker& tracker() const { return sync().tracker(); }
  /// What was measured and chosen.
  const BucketTuning& tuning() const { return tuning_; }
  const Options& options() const { return options_; }
  Stream comm_stream() const { return sync().comm_stream(); }

 private:
  using Clock = std::chrono::steady_clock;

  static Options checked(Options options) {
    if (options.candidates.empty()) {
      throw ConfigError(
          "ncclkit: TunedGradientSync: TunedSyncOptions::candidates is empty; give at least one BucketOptions "
          "(the defaults, default_bucket_candidates(), try 4 MiB to the whole buffer)");
    }
    for (std::size_t i = 0; i < options.candidates.size(); ++i) {
      const BucketOptions& c = options.candidates[i];
      if (c.bucket_bytes == 0 || c.first_bucket_bytes == 0) {
        throw ConfigError("ncclkit: TunedGradientSync: candidate " + std::to_string(i) + " has bucket_bytes " +
                          std::to_string(c.bucket_bytes) + " and first_bucket_bytes " +
                          std::to_string(c.first_bucket_bytes) +
                          "; both caps must be at least 1 byte (kWholeBuffer for no cap)");
      }
    }
    if (options.measured_steps == 0) {
      throw ConfigError(
          "ncclkit: TunedGradientSync: TunedSyncOptions::measured_steps is 0, so nothing would be timed; use at "
          "least 1 (default 3), or a GradientSync with a fixed cap to skip tuning");
    }
    return options;
  }

  GradientSync<B>& sync() {
    throw_if_failed();
    return *sync_;
  }
  const GradientSync<B>& sync() const {
    throw_if_failed();
    return *sync_;
  }
  /// Whether the current GradientSync is new since the last finished step (a switch): what
  /// that step did is in previous_*.
  bool fresh() const { return sync_ && sync_->stats().steps == 0 && tuning_.steps > 0; }

  Clock::time_point now() const { return options_.clock ? options_.clock() : Clock::now(); }

  void start_clock() {
    if (!tuning_.done() && !step_started_ && failure_.empty()) {
      step_begin_ = now();
      step_started_ = true;
    }
  }

  /// Constructs candidate `index`'s GradientSync (a collective).
  void start(std::size_t index) {
    sync_.emplace(*buffer_, plans_[index], std::span<void* const>(loose_), options_.sync);
    tuning_.current = index;
    step_in_candidate_ = 0;
  }

  /// Keeps what the last step did, destroys the current sync (its step is finished and waited
  /// for) and starts candidate `index`.
  void switch_to(std::size_t index) {
    previous_stats_ = sync_->stats();
    previous_timings_.assign(sync_->timings().begin(), sync_->timings().end());
    previous_nonfinite_ = sync_->nonfinite();
    sync_.reset();
    start(index);
  }

  void end_tuning_step(std::chrono::nanoseconds elapsed) {
    BucketCandidate& candidate = tuning_.candidates[tuning_.current];
    if (step_in_candidate_ >= options_.warmup_steps) candidate.step_times.push_back(elapsed);
    if (++step_in_candidate_ < options_.warmup_steps + options_.measured_steps) return;
    candidate.median = detail::median_of(candidate.step_times);
    if (++position_ < order_.size()) {
      switch_to(order_[position_]);
      return;
    }
    decide();
  }

  /// Every rank's medians by one all_gather, the same choice everywhere, and a switch to it.
  void decide() {
    const std::size_t count = tuning_.candidates.size();
    std::vector<std::uint64_t> mine(count, detail::kNotMeasured);
    for (std::size_t i = 0; i < count; ++i) {
      const BucketCandidate& c = tuning_.candidates[i];
      if (!c.same_plan_as) mine[i] = static_cast<std::uint64_t>(c.median.count());
    }
    const std::vector<std::uint64_t> gathered =
        backend_->size() > 1 ? ncclkit::detail::all_gather_words(*backend_, sync_->comm_stream(), mine) : mine;
    const detail::Choice choice = detail::choose(gathered, count);
    for (std::size_t i = 0; i < count; ++i) {
      if (choice.slowest[i] != detail::kNotMeasured) {
        tuning_.candidates[i].slowest_median = std::chrono::nanoseconds(choice.slowest[i]);
      }
    }
    tuning_.chosen = choice.index;
    if (choice.index != tuning_.current) switch_to(choice.index);
  }

  /// ConfigError on every rank when ranks would tune differently (and so switch plans at
  /// different steps, where the collectives of one plan would meet another's).
  void agree_on_tuning() {
    const auto mine = detail::tuning_words(options_.candidates, options_.warmup_steps, options_.measured_steps);
    const auto stream = options_.sync.comm_stream.value_or(backend_->comm_stream());
    const std::vector<std::uint64_t> all = ncclkit::detail::all_gather_words(*backend_, stream, mine);
    for (int r = 1; r < backend_->size(); ++r) {
      const std::size_t at = static_cast<std::size_t>(r) * mine.size();
      if (all[at] == all[0] && all[at + 1] == all[1] && all[at + 2] == all[2]) continue;
      const auto describe = [&](std::size_t word) {
        return std::string(all[word] == all[0] ? "the same candidates" : "other candidates") + ", warmup_steps " +
               std::to_string(all[word + 1]) + ", measured_steps " + std::to_string(all[word + 2]);
      };
      throw ConfigError("ncclkit: TunedGradientSync on rank " + std::to_string(backend_->rank()) + ": rank " +
                        std::to_string(r) + " tunes otherwise than rank 0 (" + describe(at) + " against " +
                        describe(0) +
                        "); every rank must give the same candidates, warmup_steps and measured_steps, or ranks "
                        "would switch plans at different steps");
    }
  }

  void throw_if_failed() const {
    if (!failure_.empty()) {
      throw ConfigError("ncclkit: TunedGradientSync on rank " + std::to_string(backend_->rank()) +
                        " is unusable: tuning failed (" + failure_ +
                        "), so its plan may be out of step with the other ranks'. Destroy it (and, after a "
                        "CommError, the communicator) and start over");
    }
  }

  FusedBuffer<B>* buffer_;
  B* backend_;
  std::vector<void*> loose_;
  Options options_;
  std::vector<BucketPlan> plans_;   // per candidate
  std::vector<std::size_t> order_;  // the candidates to run, in order (no two with one plan)
  std::size_t position_ = 0;        // in order_
  std::size_t step_in_candidate_ = 0;
  std::optional<GradientSync<B>> sync_;
  BucketTuning tuning_;
  bool step_started_ = false;
  Clock::time_point step_begin_{};
  // The last finished step's, kept across a switch.
  GradientSyncStats previous_stats_;
  std::vector<BucketTiming> previous_timings_;
  std::uint64_t previous_nonfinite_ = 0;
  std::string failure_;  // what a failed tuning step threw; unusable once set
};

}  // namespace ncclkit::fusion
