#pragma once
/// Auto-tuning of a GradientSync's bucket cap (fusion/tuning.hpp), no backend: the median of a
/// candidate's step times, the choice among candidates from every rank's medians, the words
/// that ranks compare to check that they tune alike, and `Tuner`, the state of a tuning sync
/// (which candidate runs, the step times, when to switch).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>   // std::max, std::nth_element
#include <array>       // std::array
#include <chrono>      // std::chrono::nanoseconds, std::chrono::steady_clock
#include <cstddef>     // std::size_t, std::ptrdiff_t
#include <cstdint>     // std::uint64_t
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <optional>    // std::optional
#include <span>        // std::span
#include <string>      // std::string, std::to_string
#include <utility>     // std::move
#include <vector>      // std::vector

#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/detail/byte_codec.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/fusion/tuning.hpp"

namespace ncclkit::fusion::detail {

/// A median of step times that every rank computes the same way: the lower middle one of an
/// even count (an element of the sample, not an average of two, so it stays a whole number of
/// nanoseconds). 0 for no times.
inline std::chrono::nanoseconds median_of(std::vector<std::chrono::nanoseconds> times) {
  if (times.empty()) return std::chrono::nanoseconds{0};
  const auto middle = times.begin() + static_cast<std::ptrdiff_t>((times.size() - 1) / 2);
  std::nth_element(times.begin(), middle, times.end());
  return *middle;
}

/// Marks a candidate that was not measured (its plan equals an earlier candidate's) in the
/// words ranks exchange.
inline constexpr std::uint64_t kNotMeasured = std::numeric_limits<std::uint64_t>::max();

/// The outcome of `choose`: the winning candidate and, per candidate, the largest median over
/// ranks (kNotMeasured where none was measured).
struct Choice {
  std::size_t index = 0;
  std::vector<std::uint64_t> slowest;
};

/// Chooses among `candidates` from `gathered`, every rank's median step time in nanoseconds
/// per candidate (rank r's at [r * candidates, (r + 1) * candidates)): per candidate the
/// largest median over ranks (a step ends for everyone when the slowest rank's gradients are
/// reduced), then the smallest of those, the earliest candidate on a tie. A pure function of
/// integers: every rank that holds the same `gathered` makes the same choice, so no second
/// collective is needed to agree on it. ConfigError when no candidate was measured.
inline Choice choose(std::span<const std::uint64_t> gathered, std::size_t candidates) {
  if (candidates == 0 || gathered.size() % candidates != 0) {
    throw ConfigError("ncclkit: GradientSync tuning: " + std::to_string(gathered.size()) +
                      " gathered times do not hold a whole number of ranks' " + std::to_string(candidates) +
                      " candidates");
  }
  Choice choice;
  choice.slowest.assign(candidates, kNotMeasured);
  const std::size_t ranks = gathered.size() / candidates;
  for (std::size_t c = 0; c < candidates; ++c) {
    std::uint64_t slowest = 0;
    bool measured = true;
    for (std::size_t r = 0; r < ranks; ++r) {
      const std::uint64_t t = gathered[r * candidates + c];
      measured = measured && t != kNotMeasured;
      slowest = std::max(slowest, t);
    }
    if (measured) choice.slowest[c] = slowest;
  }
  bool found = false;
  for (std::size_t c = 0; c < candidates; ++c) {
    if (choice.slowest[c] == kNotMeasured) continue;
    if (!found || choice.slowest[c] < choice.slowest[choice.index]) choice.index = c;
    found = true;
  }
  if (!found) throw ConfigError("ncclkit: GradientSync tuning: no candidate was measured on every rank");
  return choice;
}

/// What ranks must share to switch plans at the same steps: FNV-1a 64 of the candidates' caps,
/// then the warm-up and measured steps per candidate.
inline std::array<std::uint64_t, 3> tuning_words(std::span<const BucketOptions> candidates, std::size_t warmup_steps,
                                                 std::size_t measured_steps) {
  ncclkit::detail::ByteWriter out;
  out.u32(static_cast<std::uint32_t>(candidates.size()));
  for (const BucketOptions& c : candidates) {
    out.u64(c.bucket_bytes);
    out.u64(c.first_bucket_bytes);
  }
  return {ncclkit::detail::fnv1a64(std::move(out).take()), warmup_steps, measured_steps};
}


/// The state of a tuning sync: each candidate's plan, which one runs, this rank's step times,
/// and the choice. The sync times a step from its first mark_ready (`start_clock`) to the end of
/// a host wait after `finish`, and calls `end_step` then.
class Tuner {
 public:
  using Clock = std::chrono::steady_clock;
  /// Exchanges this rank's medians (nanoseconds, kNotMeasured for candidates not run) for every
  /// rank's: rank r's at [r * candidates, (r + 1) * candidates).
  using Gather = std::function<std::vector<std::uint64_t>(std::span<const std::uint64_t>)>;

  /// Why `options` cannot tune, naming the field; empty when they can.
  static std::string problem(const TuningOptions& options) {
    const std::string who = "ncclkit: GradientSync: TuningOptions::";
    if (options.candidates.empty()) {
      return who + "candidates is empty; give at least one BucketOptions (the defaults, default_bucket_candidates(), "
                   "try 4 MiB to one bucket)";
    }
    for (std::size_t i = 0; i < options.candidates.size(); ++i) {
      const BucketOptions& c = options.candidates[i];
      if (c.bucket_bytes == 0 || c.first_bucket_bytes == 0) {
        return who + "candidates: candidate " + std::to_string(i) + " has bucket_bytes " + std::to_string(c.bucket_bytes) +
               " and first_bucket_bytes " + std::to_string(c.first_bucket_bytes) +
               "; both caps must be at least 1 byte (kWholeBuffer for no cap)";
      }
    }
    if (options.measured_steps == 0) {
      return who + "measured_steps is 0, so nothing would be timed; use at least 1 (default 3), or a fixed plan";
    }
    return {};
  }

  /// `options` must have passed `problem`.
  Tuner(TuningOptions options, const FusedLayout& layout) : options_(std::move(options)) {
    for (std::size_t i = 0; i < options_.candidates.size(); ++i) {
      BucketPlan plan = BucketPlan::compute(layout, options_.candidates[i]);
      BucketCandidate candidate;
      candidate.caps = options_.candidates[i];
      candidate.buckets = plan.size();
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
    tuning_.current = order_[0];
    if (order_.size() == 1) tuning_.chosen = order_[0];
  }

  const BucketTuning& tuning() const { return tuning_; }
  const BucketPlan& current_plan() const { return plans_[tuning_.current]; }
  /// What ranks compare to check that they tune alike.
  std::array<std::uint64_t, 3> words() const {
    return tuning_words(options_.candidates, options_.warmup_steps, options_.measured_steps);
  }
  /// Whether the steps are being timed (each then waits on the host).
  bool timing() const { return !tuning_.done(); }

  /// At every mark_ready: the first of a timed step starts its clock.
  void start_clock() {
    if (timing() && !started_) {
      begin_ = now();
      started_ = true;
    }
  }
  /// After a finished step, once the host has waited for it. Returns the candidate whose plan
  /// the next step runs when it changes.
  std::optional<std::size_t> end_step(const Gather& gather) {
    ++tuning_.steps;
    if (!timing()) return std::nullopt;
    const auto elapsed = std::chrono::duration_cast<std::chrono::nanoseconds>(now() - (started_ ? begin_ : now()));
    started_ = false;
    ++tuning_.tuning_steps;
    BucketCandidate& candidate = tuning_.candidates[tuning_.current];
    if (step_in_candidate_ >= options_.warmup_steps) {
      candidate.step_times.push_back(std::max(elapsed, std::chrono::nanoseconds{0}));
    }
    if (++step_in_candidate_ < options_.warmup_steps + options_.measured_steps) return std::nullopt;
    candidate.median = median_of(candidate.step_times);
    step_in_candidate_ = 0;
    if (++position_ < order_.size()) return switch_to(order_[position_]);
    return decide(gather);
  }

 private:
  Clock::time_point now() const { return options_.clock ? options_.clock() : Clock::now(); }

  std::optional<std::size_t> switch_to(std::size_t index) {
    if (index == tuning_.current) return std::nullopt;
    tuning_.current = index;
    return index;
  }

  /// Every rank's medians, the same choice everywhere.
  std::optional<std::size_t> decide(const Gather& gather) {
    const std::size_t count = tuning_.candidates.size();
    std::vector<std::uint64_t> mine(count, kNotMeasured);
    for (std::size_t i = 0; i < count; ++i) {
      const BucketCandidate& c = tuning_.candidates[i];
      if (!c.same_plan_as) mine[i] = static_cast<std::uint64_t>(c.median.count());
    }
    const Choice choice = choose(gather(mine), count);
    for (std::size_t i = 0; i < count; ++i) {
      if (choice.slowest[i] != kNotMeasured) {
        tuning_.candidates[i].slowest_median = std::chrono::nanoseconds(choice.slowest[i]);
      }
    }
    tuning_.chosen = choice.index;
    return switch_to(choice.index);
  }

  TuningOptions options_;
  std::vector<BucketPlan> plans_;   // per candidate
  std::vector<std::size_t> order_;  // the candidates to run, in order (no two with one plan)
  std::size_t position_ = 0;        // in order_
  std::size_t step_in_candidate_ = 0;
  BucketTuning tuning_;
  bool started_ = false;
  Clock::time_point begin_{};
};

}  // namespace ncclkit::fusion::detail
