#pragma once
/// Auto-tuning of the bucket cap: a `GradientSync` made with `GradientSyncOptions::tuning` picks
/// its plan by timing the first steps of training, then keeps it. This header holds what the
/// tuning is given (`TuningOptions`) and what it reports (`BucketTuning`).
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
/// with a fixed plan: no host waits.
///
/// Opt-in, because the results then depend on timing: the plan decides the sizes of the
/// collectives, and NCCL picks its algorithm and chunking by size, so the float sum of a
/// gradient may round differently under another cap. Ranks always agree with each other; two
/// runs of one program may differ in the last bits. Use a fixed plan where runs must be bitwise
/// reproducible (`tuning().chosen` says which cap to fix).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <chrono>     // std::chrono::steady_clock, std::chrono::nanoseconds
#include <cstddef>    // std::size_t
#include <cstdio>     // std::snprintf
#include <functional>  // std::function
#include <limits>     // std::numeric_limits
#include <optional>   // std::optional
#include <string>     // std::string, std::to_string
#include <vector>     // std::vector

#include "ncclkit/core/byte_format.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"

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

/// What auto-tuning tries (GradientSyncOptions::tuning); designated initialisers:
/// `GradientSync sync(buffer, {.tuning = TuningOptions{.measured_steps = 5}})`. Every rank must
/// give the same candidates and step counts (checked with the plan, GradientSyncOptions::check_plan).
struct TuningOptions {
  /// What to try, in this order: each candidate's `BucketPlan::compute` options. At least one;
  /// no cap of 0. One candidate (or candidates that all give one plan) means no tuning.
  std::vector<BucketOptions> candidates = default_bucket_candidates();
  /// Steps run untimed after switching to a candidate (first-use costs: NCCL sets up its
  /// buffers for a size the first time it meets it).
  std::size_t warmup_steps = 1;
  /// Steps timed per candidate (at least 1); the median counts.
  std::size_t measured_steps = 3;
  /// Where step times come from; `std::chrono::steady_clock::now` when empty. Tests inject
  /// one; it is called on the thread that calls `mark_ready` and `finish`. Need not be the same
  /// on every rank.
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

}  // namespace ncclkit::fusion
