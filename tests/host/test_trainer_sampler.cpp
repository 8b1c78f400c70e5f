// Tests of ncclkit/trainer/sampler.hpp: shards disjoint and covering, the same permutation on
// every rank, deterministic per (seed, epoch), drop_last and padding, a resumable position at
// the same and at another world size, evaluation shards, and the errors.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <algorithm>  // std::sort, std::count
#include <cstddef>    // std::size_t
#include <set>        // std::set
#include <vector>     // std::vector

#include "ncclkit/trainer/sampler.hpp"

using ncclkit::ConfigError;
using ncclkit::trainer::DistributedSampler;
using ncclkit::trainer::epoch_permutation;
using ncclkit::trainer::evaluation_shard;
using ncclkit::trainer::LastBatch;
using ncclkit::trainer::SamplerOptions;
using ncclkit::trainer::SamplerPosition;

namespace {

// Every rank's samples of the next step, rank by rank.
std::vector<std::vector<std::size_t>> step_of(std::vector<DistributedSampler>& ranks) {
  std::vector<std::vector<std::size_t>> taken;
  for (auto& s : ranks) taken.push_back(s.next());
  return taken;
}

std::vector<DistributedSampler> world_of(SamplerOptions options, int world) {
  std::vector<DistributedSampler> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(options, r, world);
  return ranks;
}

}  // namespace

TEST_CASE("an epoch's shards are disjoint, cover the stream, and follow one permutation on every rank") {
  const SamplerOptions options{.dataset_size = 1437, .global_batch = 60, .seed = 7};
  for (int world : {1, 2, 3, 4}) {
    CAPTURE(world);
    auto ranks = world_of(options, world);
    const std::size_t steps = ranks[0].steps_per_epoch();
    CHECK(steps == 1437 / 60);
    const auto stream = epoch_permutation(1437, 7, 0);
    std::vector<std::size_t> seen;
    for (std::size_t s = 0; s < steps; ++s) {
      const auto taken = step_of(ranks);
      for (int r = 0; r < world; ++r) {
        REQUIRE(taken[r].size() == 60 / static_cast<std::size_t>(world));
        // Rank r's slice of the step's global batch of the stream.
        for (std::size_t i = 0; i < taken[r].size(); ++i) {
          CHECK(taken[r][i] == stream[s * 60 + static_cast<std::size_t>(r) * taken[r].size() + i]);
        }
        seen.insert(seen.end(), taken[r].begin(), taken[r].end());
      }
    }
    // drop_last: the first steps × 60 samples of the stream, each once.
    CHECK(std::set<std::size_t>(seen.begin(), seen.end()).size() == seen.size());
    CHECK(seen.size() == steps * 60);
    for (auto& s : ranks) CHECK(s.epoch_done());
  }
}

TEST_CASE("the permutation is deterministic per (seed, epoch), differs between epochs and seeds, and is one") {
  const auto a = epoch_permutation(1000, 3, 5);
  CHECK(a == epoch_permutation(1000, 3, 5));
  CHECK(a != epoch_permutation(1000, 3, 6));
  CHECK(a != epoch_permutation(1000, 4, 5));
  auto sorted = a;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i) REQUIRE(sorted[i] == i);
  // Not the identity, and no position systematically kept (a rough check of the shuffle).
  std::size_t fixed = 0;
  for (std::size_t i = 0; i < a.size(); ++i) fixed += a[i] == i;
  CHECK(fixed < 10);
  // Known values pin the generator: a change of it would silently change every run's data
  // order, and so resumed runs of older checkpoints.
  CHECK(epoch_permutation(10, 0, 0) == std::vector<std::size_t>{3, 8, 7, 4, 6, 2, 5, 0, 1, 9});
  const auto small = epoch_permutation(8, 42, 1);
  CHECK(std::set<std::size_t>(small.begin(), small.end()).size() == 8);
  SamplerOptions ordered{.dataset_size = 10, .global_batch = 2, .shuffle = false};
  DistributedSampler plain(ordered, 1, 2);
  CHECK(plain.next() == std::vector<std::size_t>{1});
  CHECK(plain.next() == std::vector<std::size_t>{3});
}

TEST_CASE("a new epoch starts by itself with that epoch's permutation") {
  DistributedSampler s({.dataset_size = 10, .global_batch = 4, .seed = 1}, 0, 2);
  CHECK(s.steps_per_epoch() == 2);
  (void)s.next();
  (void)s.next();
  CHECK(s.epoch_done());
  const auto first_of_epoch_1 = s.next();
  CHECK(s.position() == SamplerPosition{1, 4});
  const auto stream = epoch_permutation(10, 1, 1);
  CHECK(first_of_epoch_1 == std::vector<std::size_t>{stream[0], stream[1]});
}

TEST_CASE("padding repeats the epoch's stream from its start; every sample is seen") {
  DistributedSampler s({.dataset_size = 10, .global_batch = 4, .seed = 9, .last_batch = LastBatch::kPad}, 0, 1);
  CHECK(s.steps_per_epoch() == 3);
  std::vector<std::size_t> all;
  for (int i = 0; i < 3; ++i) {
    const auto t = s.next();
    all.insert(all.end(), t.begin(), t.end());
  }
  const auto stream = epoch_permutation(10, 9, 0);
  CHECK(all.size() == 12);
  CHECK(all[10] == stream[0]);
  CHECK(all[11] == stream[1]);
  CHECK(std::set<std::size_t>(all.begin(), all.end()).size() == 10);
}

TEST_CASE("a position resumed at the same or another world size continues with exactly the unseen samples") {
  const SamplerOptions options{.dataset_size = 500, .global_batch = 24, .seed = 11};
  // Three steps at 4 ranks, then resume at 2, 3, 4 and 6 ranks.
  auto four = world_of(options, 4);
  std::vector<std::size_t> before;
  for (int s = 0; s < 3; ++s) {
    for (const auto& t : step_of(four)) before.insert(before.end(), t.begin(), t.end());
  }
  const SamplerPosition at = four[0].position();
  CHECK(at == SamplerPosition{0, 72});
  for (int world : {2, 3, 4, 6}) {
    CAPTURE(world);
    auto resumed = world_of(options, world);
    for (auto& s : resumed) s.seek(at);
    std::vector<std::size_t> after;
    while (!resumed[0].epoch_done()) {
      for (const auto& t : step_of(resumed)) after.insert(after.end(), t.begin(), t.end());
    }
    std::set<std::size_t> all(before.begin(), before.end());
    for (std::size_t x : after) CHECK(all.insert(x).second);  // never seen before
    CHECK(all.size() == 500 / 24 * 24);
    // The same samples as the uninterrupted stream, in its order.
    const auto stream = epoch_permutation(500, 11, 0);
    CHECK(std::vector<std::size_t>(stream.begin() + 72, stream.begin() + 72 + static_cast<long>(after.size())) == after);
  }
}

TEST_CASE("evaluation shards are contiguous, disjoint and cover the data, with no padding") {
  for (int world : {1, 2, 3, 4, 7}) {
    std::size_t covered = 0;
    for (int r = 0; r < world; ++r) {
      const auto shard = evaluation_shard(360, r, world);
      CHECK(shard.begin == covered);
      covered = shard.end;
      CHECK(shard.size() >= 360 / static_cast<std::size_t>(world));
    }
    CHECK(covered == 360);
  }
  CHECK(evaluation_shard(3, 3, 4).size() == 0);
}

TEST_CASE("bad sampler options and positions are ConfigErrors that say which numbers") {
  CHECK_THROWS_WITH_AS(DistributedSampler({.dataset_size = 100, .global_batch = 30}, 0, 4),
                       doctest::Contains("a global batch of 30 does not split over 4 ranks (remainder 2)"), ConfigError);
  CHECK_THROWS_WITH_AS(DistributedSampler({.dataset_size = 0, .global_batch = 4}, 0, 1),
                       doctest::Contains("the dataset has no samples"), ConfigError);
  CHECK_THROWS_WITH_AS(DistributedSampler({.dataset_size = 10, .global_batch = 0}, 0, 1),
                       doctest::Contains("global_batch is 0"), ConfigError);
  CHECK_THROWS_WITH_AS(DistributedSampler({.dataset_size = 10, .global_batch = 16}, 0, 2),
                       doctest::Contains("larger than the 10 samples"), ConfigError);
  CHECK_THROWS_WITH_AS(DistributedSampler({.dataset_size = 10, .global_batch = 2}, 2, 2),
                       doctest::Contains("rank 2 is outside a world of 2"), ConfigError);
  DistributedSampler s({.dataset_size = 100, .global_batch = 8}, 0, 2);
  CHECK_THROWS_WITH_AS(s.seek({0, 12}), doctest::Contains("not a step boundary of a global batch of 8"), ConfigError);
}
