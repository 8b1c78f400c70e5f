#pragma once
/// The arithmetic of `TunedGradientSync`, no backend: the median of a candidate's step times,
/// the choice among candidates from every rank's medians, and the words that ranks compare to
/// check that they tune alike.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>  // std::max, std::nth_element
#include <array>      // std::array
#include <chrono>     // std::chrono::nanoseconds
#include <cstddef>    // std::size_t, std::ptrdiff_t
#include <cstdint>    // std::uint64_t
#include <limits>     // std::numeric_limits
#include <span>       // std::span
#include <string>     // std::to_string
#include <vector>     // std::vector

#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/detail/byte_codec.hpp"

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
    throw ConfigError("ncclkit: TunedGradientSync: " + std::to_string(gathered.size()) +
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
  if (!found) throw ConfigError("ncclkit: TunedGradientSync: no candidate was measured on every rank");
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

}  // namespace ncclkit::fusion::detail
