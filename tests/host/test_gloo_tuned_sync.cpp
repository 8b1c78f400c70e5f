// Tests of auto-tuning (ncclkit/fusion/tuning.hpp) over the Gloo backend in real processes, timed by the
// real clock (so each process measures its own, different times): every step's result equals
// the float64 average of every rank's gradients through and after tuning, and every rank runs
// the same plan at every step and chooses the same candidate.
#include <doctest/doctest.h>

#include <algorithm>  // std::copy
#include <array>      // std::array
#include <cmath>      // std::sqrt
#include <cstdint>    // std::uint64_t
#include <random>     // std::mt19937_64, std::normal_distribution
#include <span>       // std::span, std::as_bytes
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/core/detail/backend_memory.hpp"
#include "ncclkit/fusion/detail/byte_codec.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/fusion/tuning.hpp"
#include "support/fusion_reference.hpp"
#include "support/gloo_testing.hpp"

using ncclkit::DataType;
using ncclkit::WorldInfo;
using ncclkit::fusion::FusedBuffer;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::kWholeBuffer;
using ncclkit::fusion::Slot;
using ncclkit::fusion::GradientSync;
using ncclkit::fusion::TuningOptions;
using ncclkit::gloo::Communicator;
using ncclkit::testing::Checker;
using ncclkit::testing::run_gloo;

namespace {

// A few large tensors and many small ones: caps of 16 KiB, 64 KiB and the whole buffer give
// three different plans.
FusedLayout tuned_gloo_layout() {
  FusedLayout layout;
  for (int i = 0; i < 40; ++i) layout.add("layer." + std::to_string(i) + ".weight", {32, 50 + i}, DataType::kFloat32);
  for (int i = 0; i < 40; ++i) layout.add("layer." + std::to_string(i) + ".bias", {3 + i % 5}, DataType::kFloat32);
  layout.finalize();
  return layout;
}

// Rank r's gradient of tensor `slot` at `step`: N(0, 1e-3), the same in every process.
std::vector<float> tuned_gloo_gradient(int rank, std::uint32_t slot, int step, std::size_t count) {
  std::mt19937_64 random(0x7a11ed5ULL ^ (std::uint64_t(rank) << 40) ^ (std::uint64_t(slot) << 8) ^ std::uint64_t(step));
  std::normal_distribution<double> normal(0.0, 1e-3);
  std::vector<float> values(count);
  for (float& v : values) v = static_cast<float>(normal(random));
  return values;
}

}  // namespace

TEST_CASE("tuning over Gloo with each process's own clock: exact averages, one plan per step on every rank") {
  auto result = run_gloo(2, [](Communicator& comm, const WorldInfo& world, Checker& check) {
    FusedBuffer<Communicator> grads(comm, tuned_gloo_layout());
    const FusedLayout& layout = grads.layout();
    GradientSync<Communicator> sync(
        grads, {.tuning = TuningOptions{.candidates = {{.bucket_bytes = 16 << 10, .first_bucket_bytes = 4 << 10},
                                                       {.bucket_bytes = 64 << 10, .first_bucket_bytes = 4 << 10},
                                                       {.bucket_bytes = kWholeBuffer, .first_bucket_bytes = 4 << 10}},
                                        .warmup_steps = 1,
                                        .measured_steps = 2}});
    const auto& candidates = sync.tuning().candidates;
    check.expect(!candidates[1].same_plan_as && !candidates[2].same_plan_as, "three different plans");
    // Every rank's sequence of (candidate, plan) over the steps, hashed, compared at the end.
    std::uint64_t history = ncclkit::detail::kFnvOffsetBasis;
    constexpr int kSteps = 3 * 3 + 2;
    for (int step = 0; step < kSteps; ++step) {
      const std::array<std::uint64_t, 2> ran = {sync.tuning().current, sync.plan().fingerprint()};
      history = ncclkit::detail::fnv1a64(std::as_bytes(std::span(ran)), history);
      for (std::uint32_t i = static_cast<std::uint32_t>(layout.size()); i-- > 0;) {
        const Slot slot{i};
        const auto values = tuned_gloo_gradient(world.rank, i, step, layout.count(slot));
        std::copy(values.begin(), values.end(), grads.span<float>(slot).begin());
        sync.mark_ready(slot, comm.default_stream());
      }
      sync.finish(comm.default_stream());
      const double relative =
          ncclkit::testing::error_against_average(grads, world.world_size, step, tuned_gloo_gradient);
      check.expect(relative <= 1e-6,
                   "step " + std::to_string(step) + ": norm-relative error " + std::to_string(relative) + " > 1e-6");
      check.expect(sync.tuning().done() == (step >= 3 * 3 - 1), "tuning ends after 3 candidates x 3 steps");
    }
    check.expect(sync.tuning().tuning_steps == 9, "9 tuning steps: " + sync.tuning().describe());
    for (const auto& c : candidates) {
      check.expect(c.step_times.size() == 2 && c.median.count() > 0 && c.slowest_median >= c.median,
                   "every candidate timed twice; the slowest rank's median is at least this rank's: " +
                       sync.tuning().describe());
    }
    const std::array<std::uint64_t, 2> mine = {sync.tuning().chosen.value_or(99), history};
    const auto all = ncclkit::detail::all_gather_words(comm, comm.comm_stream(), std::span(mine));
    check.expect(all[0] == all[2] && all[1] == all[3],
                 "both ranks chose candidate " + std::to_string(all[0]) + " and ran the same plans at every step");
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}
