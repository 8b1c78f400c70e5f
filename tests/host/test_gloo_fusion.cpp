// Tests of the fusion layer over the Gloo backend in real processes (ncclkit/fusion/
// gradient_sync.hpp with gloo::Communicator): bucketed results equal a float64 average of every
// rank's gradients, with the ready order shuffled differently on every rank, at 2 and 4 ranks;
// a tensor never marked ready is an error on every rank that names it, not a hang; each rank
// writes its timeline, with the all_reduce of every bucket timed on the comm queue's worker.
#include <doctest/doctest.h>

#include <algorithm>  // std::shuffle
#include <cmath>      // std::sqrt
#include <cstdint>    // std::uint64_t
#include <random>     // std::mt19937_64, std::normal_distribution
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/compression.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "support/fusion_reference.hpp"
#include "support/gloo_testing.hpp"
#include "support/temp_dir.hpp"
#include "support/timeline_check.hpp"

using ncclkit::DataType;
using ncclkit::WorldInfo;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::FusedBuffer;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::GradientSync;
using ncclkit::fusion::Slot;
using ncclkit::gloo::Communicator;
using ncclkit::testing::Checker;
using ncclkit::testing::run_gloo;

namespace {

// One huge tensor, a few mid-sized ones, hundreds of tiny ones and empty ones, so the plan has
// many buckets (a 16 KiB cap) and buckets of one tensor.
FusedLayout test_layout() {
  FusedLayout layout;
  layout.add("embedding", {1000, 300}, DataType::kFloat32);
  for (int i = 0; i < 200; ++i) layout.add("tiny." + std::to_string(i), {1 + i % 7}, DataType::kFloat32);
  layout.add("empty.0", {0}, DataType::kFloat32);
  for (int i = 0; i < 6; ++i) layout.add("block." + std::to_string(i), {64, 100 + 13 * i}, DataType::kFloat32);
  layout.add("empty.1", {4, 0}, DataType::kFloat32);
  layout.add("head", {10}, DataType::kFloat32);
  layout.finalize();
  return layout;
}

// Rank r's gradient of tensor `slot` at `step`: N(0, 1e-3), the same in every process.
std::vector<float> gradient(int rank, std::uint32_t slot, int step, std::size_t count) {
  std::mt19937_64 random(0x9e3779b97f4a7c15ULL ^ (std::uint64_t(rank) << 40) ^ (std::uint64_t(slot) << 8) ^
                         std::uint64_t(step));
  std::normal_distribution<double> normal(0.0, 1e-3);
  std::vector<float> values(count);
  for (float& v : values) v = static_cast<float>(normal(random));
  return values;
}

}  // namespace

TEST_CASE("bucketed gradients over Gloo equal the float64 average, in every rank's own ready order") {
  for (int nprocs : {2, 4}) {
    CAPTURE(nprocs);
    auto result = run_gloo(nprocs, [](Communicator& comm, const WorldInfo& world, Checker& check) {
      FusedBuffer<Communicator> grads(comm, test_layout());
      const FusedLayout& layout = grads.layout();
      BucketPlan plan = BucketPlan::compute(layout, {.bucket_bytes = 16 << 10, .first_bucket_bytes = 4 << 10});
      check.expect(plan.size() > 10, "the plan has many buckets: " + plan.describe());
      GradientSync<Communicator> sync(grads, std::move(plan));
      std::vector<std::uint32_t> order(layout.size());
      for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
      std::mt19937 shuffle_random(1234u + static_cast<unsigned>(world.rank));
      for (int step = 0; step < 3; ++step) {
        std::shuffle(order.begin(), order.end(), shuffle_random);
        for (std::uint32_t i : order) {
          const Slot slot{i};
          const auto values = gradient(world.rank, i, step, layout.count(slot));
          std::copy(values.begin(), values.end(), grads.span<float>(slot).begin());
          sync.mark_ready(slot, comm.default_stream());
        }
        sync.finish(comm.default_stream());
        const double relative = ncclkit::testing::error_against_average(grads, world.world_size, step, gradient);
        check.expect(relative <= 1e-6,
                     "step " + std::to_string(step) + ": norm-relative error " + std::to_string(relative) + " > 1e-6");
        check.expect(sync.stats().launched_before_finish == sync.stats().buckets,
                     "every bucket launched as its last tensor became ready, before finish");
      }
    });
    CHECK_MESSAGE(result.ok(), result.describe());
  }
}

TEST_CASE("a tensor one rank never marks ready is an error on that rank naming it, and no rank hangs") {
  auto result = run_gloo(2,
                         [](Communicator& comm, const WorldInfo& world, Checker& check) {
                           FusedBuffer<Communicator> grads(comm, test_layout());
                           GradientSync<Communicator> sync(
                               grads, BucketPlan::compute(grads.layout(), {.bucket_bytes = 64 << 10}));
                           const FusedLayout& layout = grads.layout();
                           for (std::uint32_t i = 0; i < layout.size(); ++i) {
                             if (world.rank == 1 && layout.name(Slot{i}) == "block.3") continue;
                             sync.mark_ready(Slot{i});
                           }
                           if (world.rank == 0) {
                             sync.finish();
                             return;
                           }
                           try {
                             sync.finish();
                             check.expect(false, "finish() accepted a step with block.3 never marked ready");
                           } catch (const ncclkit::ConfigError& e) {
                             check.expect(std::string(e.what()).find("block.3") != std::string::npos,
                                          std::string("names it: ") + e.what());
                           }
                           // The rank marks it late, as the message says; the step then completes on both ranks.
                           sync.mark_ready(layout.slot("block.3"));
                           sync.finish();
                         },
                         {.timeout = std::chrono::seconds(30)});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE(
    "over Gloo each rank writes a timeline: buckets reduced on the comm queue's worker, casts on the caller's thread") {
  ncclkit_test::TempDir dir("gloo-timeline");
  const std::string prefix = dir.path + "/gloo";
  const ncclkit::fusion::BucketOptions caps{.bucket_bytes = 256 << 10, .first_bucket_bytes = 64 << 10};
  auto result = run_gloo(2, [&](Communicator& comm, const WorldInfo& world, Checker& check) {
    FusedBuffer<Communicator> grads(comm, test_layout());
    const FusedLayout& layout = grads.layout();
    GradientSync<Communicator> sync(grads, BucketPlan::compute(layout, caps),
                                    {.reducer = ncclkit::compression::compressed({.codec = ncclkit::compression::Codec::kFloat16}), .timeline = ncclkit::fusion::TimelineOptions{.prefix = prefix}});
    check.expect(sync.timeline() != nullptr, "the timeline is on");
    for (int step = 0; step < 3; ++step) {
      for (std::uint32_t i = static_cast<std::uint32_t>(layout.size()); i-- > 0;) {
        const Slot slot{i};
        const auto values = gradient(world.rank, i, step, layout.count(slot));
        std::copy(values.begin(), values.end(), grads.span<float>(slot).begin());
        sync.mark_ready(slot, comm.default_stream());
      }
      sync.finish(comm.default_stream());
    }
  });
  CHECK_MESSAGE(result.ok(), result.describe());
  const std::size_t buckets = BucketPlan::compute(test_layout(), caps).size();
  CHECK(buckets >= 3);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(ncclkit_test::trace_problems(prefix + ".rank" + std::to_string(rank) + ".json",
                                       {.rank = rank, .buckets = buckets, .steps = 3, .codec = true}) == "");
  }
}
