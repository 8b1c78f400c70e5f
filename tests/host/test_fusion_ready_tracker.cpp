// Tests of ncclkit/fusion/ready_tracker.hpp: buckets launch in plan order, as early as plan
// order allows, whatever order tensors become ready in (random, seeded orders on real models);
// double marks and never-marked tensors are named; the reduce-as-zeros option; zero-element
// tensors; steps and reset.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <algorithm>  // std::shuffle, std::find
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint32_t
#include <iterator>   // std::forward_iterator
#include <random>     // std::mt19937
#include <ranges>     // std::ranges::forward_range
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/fusion/ready_tracker.hpp"
#include "support/model_shapes.hpp"

using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::fusion::Bucket;
using ncclkit::fusion::BucketOptions;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::BucketRange;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::MissingTensors;
using ncclkit::fusion::ReadyTracker;
using ncclkit::fusion::ReadyTrackerOptions;
using ncclkit::fusion::Slot;

namespace {

std::vector<std::size_t> to_vector(BucketRange range) { return std::vector<std::size_t>(range.begin(), range.end()); }

std::vector<std::size_t> iota(std::size_t first, std::size_t last) {
  std::vector<std::size_t> out;
  for (std::size_t i = first; i < last; ++i) out.push_back(i);
  return out;
}

std::vector<Slot> all_slots(const BucketPlan& plan) {
  std::vector<Slot> slots;
  for (std::uint32_t i = 0; i < plan.tensor_count(); ++i) slots.push_back(Slot{i});
  return slots;
}

// Marks `order` on `tracker` and checks, after every mark, that what launched is exactly the
// longest prefix of the plan whose buckets are complete (in order, and no later than that),
// and that a launched bucket's tensors are all marked. Returns every bucket launched, in order.
std::vector<std::size_t> run_step(ReadyTracker& tracker, const std::vector<Slot>& order) {
  const BucketPlan& plan = tracker.plan();
  std::vector<std::size_t> launched;
  for (Slot slot : order) {
    for (std::size_t b : tracker.mark_ready(slot)) {
      for (Slot s : plan[b].slots) REQUIRE(tracker.is_marked(s));
      launched.push_back(b);
    }
    std::size_t complete_prefix = 0;
    while (complete_prefix < plan.size()) {
      bool complete = true;
      for (Slot s : plan[complete_prefix].slots) complete = complete && tracker.is_marked(s);
      if (!complete) break;
      ++complete_prefix;
    }
    REQUIRE(tracker.launched() == complete_prefix);
    REQUIRE(launched.size() == complete_prefix);
  }
  return launched;
}

BucketPlan mixed_plan() {
  FusedLayout layout;
  for (int i = 0; i < 60; ++i) {
    const DataType type = i % 3 == 0 ? DataType::kFloat16 : (i % 7 == 0 ? DataType::kInt64 : DataType::kFloat32);
    layout.add("p" + std::to_string(i), {i % 11 == 5 ? 0 : 1 + (i * 97) % 700}, type);
  }
  layout.finalize();
  return BucketPlan::compute(layout, BucketOptions{.bucket_bytes = 2048, .first_bucket_bytes = 512});
}

}  // namespace

TEST_CASE("in backward order each bucket launches as its last tensor is marked") {
  FusedLayout layout;
  for (int i = 0; i < 6; ++i) layout.add("t" + std::to_string(i), {64}, DataType::kFloat32);  // 256 bytes each
  layout.finalize();
  ReadyTracker tracker(BucketPlan::compute(layout, BucketOptions{.bucket_bytes = 512, .first_bucket_bytes = 256}));
  // Buckets: {t5}, {t4, t3}, {t2, t1}, {t0}.
  REQUIRE(tracker.plan().size() == 4);
  CHECK(to_vector(tracker.mark_ready(Slot{5})) == std::vector<std::size_t>{0});
  CHECK(to_vector(tracker.mark_ready(Slot{4})).empty());
  CHECK(to_vector(tracker.mark_ready(Slot{3})) == std::vector<std::size_t>{1});
  CHECK(to_vector(tracker.mark_ready(Slot{2})).empty());
  CHECK(to_vector(tracker.mark_ready(Slot{1})) == std::vector<std::size_t>{2});
  CHECK(to_vector(tracker.mark_ready(Slot{0})) == std::vector<std::size_t>{3});
  CHECK(tracker.marked_count() == 6);
  const auto result = tracker.finish();
  CHECK(result.launch.empty());
  CHECK(result.zeroed.empty());
  CHECK(tracker.finished());
}

TEST_CASE("a complete bucket waits for every earlier bucket, then they launch together, in plan order") {
  FusedLayout layout;
  for (int i = 0; i < 6; ++i) layout.add("t" + std::to_string(i), {64}, DataType::kFloat32);
  layout.finalize();
  ReadyTracker tracker(BucketPlan::compute(layout, BucketOptions{.bucket_bytes = 512, .first_bucket_bytes = 256}));
  // Forward order, the worst case: bucket 3 {t0} is complete first but waits for bucket 0 {t5}.
  CHECK(to_vector(tracker.mark_ready(Slot{0})).empty());
  CHECK(to_vector(tracker.mark_ready(Slot{1})).empty());
  CHECK(to_vector(tracker.mark_ready(Slot{2})).empty());
  CHECK(to_vector(tracker.mark_ready(Slot{3})).empty());
  CHECK(to_vector(tracker.mark_ready(Slot{4})).empty());
  CHECK(tracker.launched() == 0);
  CHECK(to_vector(tracker.mark_ready(Slot{5})) == std::vector<std::size_t>{0, 1, 2, 3});
}

TEST_CASE("random ready orders: every rank launches the whole plan in plan order, as early as it may") {
  struct Case {
    std::string name;
    BucketPlan plan;
  };
  std::vector<Case> cases;
  cases.push_back({"resnet50", BucketPlan::compute(ncclkit::testing::model_layout("resnet50"))});
  cases.push_back({"gpt2_small", BucketPlan::compute(ncclkit::testing::model_layout("gpt2_small"))});
  cases.push_back({"gpt2_small, 2 MiB buckets", BucketPlan::compute(ncclkit::testing::model_layout("gpt2_small"),
                                                                    BucketOptions{.bucket_bytes = 2 << 20})});
  cases.push_back({"mixed types with empty tensors", mixed_plan()});
  std::mt19937 random(19);
  for (const Case& c : cases) {
    INFO(c.name);
    ReadyTracker tracker(c.plan);
    const std::vector<std::size_t> plan_order = iota(0, c.plan.size());
    std::vector<Slot> order = all_slots(c.plan);
    for (int trial = 0; trial < 200; ++trial) {  // 200 "ranks", each with its own ready order
      std::shuffle(order.begin(), order.end(), random);
      tracker.reset();
      REQUIRE(run_step(tracker, order) == plan_order);
      REQUIRE(tracker.finish().launch.empty());
    }
  }
}

TEST_CASE("marking a tensor twice in a step is an error naming it, and changes nothing") {
  FusedLayout layout;
  layout.add("encoder.weight", {64}, DataType::kFloat32);
  layout.add("encoder.bias", {64}, DataType::kFloat32);
  layout.finalize();
  ReadyTracker tracker(BucketPlan::compute(layout));
  CHECK(tracker.mark_ready(Slot{1}).empty());
  CHECK_THROWS_WITH_AS(tracker.mark_ready(Slot{1}),
                       doctest::Contains("tensor \"encoder.bias\" (slot 1) was already marked ready this step"),
                       ConfigError);
  CHECK(tracker.marked_count() == 1);
  CHECK(tracker.launched() == 0);
  CHECK(to_vector(tracker.mark_ready(Slot{0})) == std::vector<std::size_t>{0});
  CHECK_THROWS_WITH_AS(tracker.mark_ready(Slot{2}),
                       doctest::Contains("slot 2 is out of range (the plan has 2 tensors)"), ConfigError);
  CHECK_THROWS_AS(static_cast<void>(tracker.is_marked(Slot{2})), ConfigError);
}

TEST_CASE("finish names the tensors never marked, and leaves the step as it was") {
  const FusedLayout layout = ncclkit::testing::model_layout("gpt2_small");
  ReadyTracker tracker(BucketPlan::compute(layout));
  const std::vector<std::string> missing = {"wte.weight", "h.3.attn.c_attn.weight", "h.7.ln_2.bias"};
  std::vector<Slot> order;
  for (Slot s : all_slots(tracker.plan())) {
    if (std::find(missing.begin(), missing.end(), layout.name(s)) == missing.end()) order.push_back(s);
  }
  std::shuffle(order.begin(), order.end(), std::mt19937(7));
  for (Slot s : order) static_cast<void>(tracker.mark_ready(s));
  const std::size_t launched = tracker.launched();
  CHECK(launched < tracker.plan().size());
  CHECK_THROWS_WITH_AS(tracker.finish(),
                       doctest::Contains("3 of 148 tensors were never marked ready this step: \"wte.weight\", "
                                         "\"h.3.attn.c_attn.weight\", \"h.7.ln_2.bias\"."),
                       ConfigError);
  CHECK_FALSE(tracker.finished());
  CHECK(tracker.launched() == launched);
  // The caller may still mark them (late hooks) and finish.
  std::vector<std::size_t> later;
  for (const std::string& name : missing) {
    for (std::size_t b : tracker.mark_ready(layout.slot(name))) later.push_back(b);
  }
  CHECK(later == iota(launched, tracker.plan().size()));
  const auto result = tracker.finish();
  CHECK(result.launch.empty());
  CHECK(result.zeroed.empty());
}

TEST_CASE("finish names the first eight tensors never marked and how many more, not a page of names") {
  const FusedLayout layout = ncclkit::testing::model_layout("resnet50");
  ReadyTracker tracker(BucketPlan::compute(layout));
  // Only the last tensor is marked: 160 of ResNet-50's 161 are missing.
  static_cast<void>(tracker.mark_ready(Slot{static_cast<std::uint32_t>(layout.size() - 1)}));
  std::string names;
  for (std::uint32_t i = 0; i < 8; ++i) names += (i == 0 ? "\"" : ", \"") + layout.name(Slot{i}) + "\"";
  try {
    static_cast<void>(tracker.finish());
    FAIL("finish did not throw");
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    CHECK(message.find("160 of 161 tensors were never marked ready this step: " + names + " and 152 more.") !=
          std::string::npos);
    CHECK(message.find(layout.name(Slot{8})) == std::string::npos);
    CHECK(message.size() < 600);
  }
}

TEST_CASE("with kReduceAsZeros, finish returns the missing tensors and launches what they held back") {
  const FusedLayout layout = ncclkit::testing::model_layout("resnet50");
  const BucketPlan plan = BucketPlan::compute(layout);
  ReadyTracker tracker(plan, ReadyTrackerOptions{.missing = MissingTensors::kReduceAsZeros});
  CHECK(tracker.options().missing == MissingTensors::kReduceAsZeros);
  std::mt19937 random(3);
  for (int step = 0; step < 50; ++step) {
    tracker.reset();
    std::vector<Slot> order = all_slots(plan);
    std::shuffle(order.begin(), order.end(), random);
    const std::size_t unused = step % 5;  // 0 to 4 tensors without a gradient this step
    std::vector<Slot> skipped(order.end() - static_cast<std::ptrdiff_t>(unused), order.end());
    order.resize(order.size() - unused);
    std::sort(skipped.begin(), skipped.end());
    std::vector<std::size_t> launched = run_step(tracker, order);
    const auto result = tracker.finish();
    CHECK(result.zeroed == skipped);  // in registration order
    for (std::size_t b : result.launch) launched.push_back(b);
    CHECK(launched == iota(0, plan.size()));  // each bucket exactly once, in plan order
    CHECK(tracker.launched() == plan.size());
  }
  // The step is over until reset.
  CHECK_THROWS_WITH_AS(tracker.mark_ready(Slot{0}),
                       doctest::Contains("mark_ready(\"conv1.weight\"): the step is finished; call reset()"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(tracker.finish(), doctest::Contains("called twice; call reset()"), ConfigError);
  tracker.reset();
  CHECK(tracker.marked_count() == 0);
  CHECK_FALSE(tracker.finished());
  CHECK(run_step(tracker, all_slots(plan)) == iota(0, plan.size()));
}

TEST_CASE("zero-element tensors need no marking; marking one is accepted once per step") {
  FusedLayout layout;
  layout.add("a", {64}, DataType::kFloat32);
  layout.add("empty", {0}, DataType::kFloat32);
  layout.add("b", {64}, DataType::kFloat32);
  layout.add("empty_int", {0}, DataType::kInt32);
  layout.finalize();
  ReadyTracker tracker(BucketPlan::compute(layout, BucketOptions{.bucket_bytes = 256, .first_bucket_bytes = 256}));
  const Slot a = layout.slot("a"), b = layout.slot("b"), empty = layout.slot("empty");
  CHECK(to_vector(tracker.mark_ready(b)) == std::vector<std::size_t>{0});
  CHECK(to_vector(tracker.mark_ready(a)) == std::vector<std::size_t>{1});
  auto result = tracker.finish();  // neither empty tensor was marked: not missing
  CHECK(result.zeroed.empty());
  CHECK(result.launch.empty());

  tracker.reset();
  CHECK(tracker.mark_ready(empty).empty());
  CHECK(tracker.is_marked(empty));
  CHECK_THROWS_WITH_AS(tracker.mark_ready(empty), doctest::Contains("\"empty\" (slot 1) was already marked"),
                       ConfigError);
  CHECK(tracker.mark_ready(a).empty());  // bucket 1 {a} complete, waits for bucket 0 {b}
  CHECK(to_vector(tracker.mark_ready(b)) == std::vector<std::size_t>{0, 1});

  // A plan of empty tensors only: nothing to launch, nothing missing.
  FusedLayout hollow;
  hollow.add("x", {0}, DataType::kFloat32);
  hollow.finalize();
  ReadyTracker nothing(BucketPlan::compute(hollow));
  result = nothing.finish();
  CHECK(result.launch.empty());
  CHECK(result.zeroed.empty());
}

TEST_CASE("reset abandons a step half done") {
  const BucketPlan plan = mixed_plan();
  ReadyTracker tracker(plan);
  const std::vector<Slot> slots = all_slots(plan);
  for (std::size_t i = slots.size() / 2; i < slots.size(); ++i) static_cast<void>(tracker.mark_ready(slots[i]));
  CHECK(tracker.launched() > 0);
  tracker.reset();
  CHECK(tracker.launched() == 0);
  CHECK(tracker.marked_count() == 0);
  std::vector<Slot> backward(slots.rbegin(), slots.rend());
  CHECK(run_step(tracker, backward) == iota(0, plan.size()));
}

TEST_CASE("a BucketRange is a forward range of indices") {
  static_assert(std::forward_iterator<BucketRange::Iterator>);
  static_assert(std::ranges::forward_range<BucketRange>);
  const BucketRange range{2, 5};
  CHECK(range.size() == 3);
  CHECK_FALSE(range.empty());
  CHECK(std::vector<std::size_t>(range.begin(), range.end()) == std::vector<std::size_t>{2, 3, 4});
  CHECK(BucketRange{4, 4}.empty());
}

TEST_CASE("the example of docs/fusion.md") {
  using namespace ncclkit;
  using namespace ncclkit::fusion;
  std::vector<std::string> launched;
  const auto launch = [&](const Bucket& bucket) {
    launched.push_back(std::to_string(bucket.begin_elements()) + "+" + std::to_string(bucket.count()));
  };

  FusedLayout layout;
  const Slot weight = layout.add("fc.weight", {1000, 2048}, DataType::kFloat32);
  const Slot bias = layout.add("fc.bias", {1000}, DataType::kFloat32);
  layout.finalize();  // offsets: fc.bias at 0, fc.weight at 4096 (reverse order, 256-byte aligned)
  CHECK(layout.offset_bytes(bias) == 0);
  CHECK(layout.offset_bytes(weight) == 4096);

  const BucketPlan plan = BucketPlan::compute(layout);  // 25 MiB buckets, first one 1 MiB

  ReadyTracker tracker(plan);
  for (int step = 0; step < 3; ++step) {
    tracker.reset();
    // ... backward writes fc.bias's gradient, then fc.weight's ...
    for (std::size_t b : tracker.mark_ready(bias)) launch(plan[b]);    // bucket 0: fc.bias
    for (std::size_t b : tracker.mark_ready(weight)) launch(plan[b]);  // bucket 1: fc.weight
    tracker.finish();  // throws, naming them, if a tensor was never marked
  }
  CHECK(launched ==
        std::vector<std::string>{"0+1024", "1024+2048000", "0+1024", "1024+2048000", "0+1024", "1024+2048000"});
}
