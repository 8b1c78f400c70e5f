// Tests of auto-tuning (ncclkit/fusion/tuning.hpp, GradientSyncOptions::tuning), ranks as threads over the loopback backend, with an
// injected clock so that each rank sees the step times the test scripts (no sleeps): results
// equal the float64 per-tensor reference through and after tuning; every rank switches plans at
// the same steps and picks the same candidate when their own timings would pick different
// ones (the slowest rank's median decides); candidates with equal plans run once; stats and
// timings survive a switch; bad options, ranks that tune differently, a missing tensor during
// tuning and a failure while switching.
#include <doctest/doctest.h>

#include <chrono>    // std::chrono
#include <cstddef>   // std::size_t
#include <cstdint>   // std::uint64_t
#include <limits>    // std::numeric_limits
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "ncclkit/fusion/detail/bucket_tuning.hpp"
#include "ncclkit/compression.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "support/fusion_check.hpp"
#include "support/loopback_backend.hpp"

using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::ReduceOp;
using ncclkit::fusion::BucketOptions;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::kWholeBuffer;
using ncclkit::fusion::MissingTensors;
using ncclkit::fusion::Slot;
using ncclkit::fusion::TuningOptions;
using ncclkit::testing::awkward_layout;
using ncclkit::testing::Buffer;
using ncclkit::testing::buffer_hash;
using ncclkit::testing::errors_against_reference;
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;
using ncclkit::testing::message_of;
using ncclkit::testing::run_ranks;
using ncclkit::testing::shuffled_slots;
using ncclkit::testing::small_layout;
using ncclkit::testing::tolerance;
using ncclkit::testing::write_gradients;
using ncclkit::testing::Sync;
using Milliseconds = std::chrono::milliseconds;

namespace {

// Twelve tensors of 256 bytes: caps of 512 B, 1 KiB and the whole buffer give three plans, and
// a cap of 1 MiB gives the whole buffer's again.
std::vector<BucketOptions> three_plans_and_a_twin() {
  return {{.bucket_bytes = 512, .first_bucket_bytes = 512},
          {.bucket_bytes = 1024, .first_bucket_bytes = 512},
          {.bucket_bytes = kWholeBuffer, .first_bucket_bytes = 512},
          {.bucket_bytes = 1 << 20, .first_bucket_bytes = 512}};
}

// The step time each rank sees per candidate: rank 0 alone would pick candidate 0 and rank 1
// candidate 1, but the slowest rank's medians (40, 30, 25 ms) make candidate 2 the fastest.
Milliseconds scripted_time(int rank, std::size_t candidate, std::size_t step_in_candidate) {
  const long times[2][3] = {{10, 30, 20}, {40, 5, 25}};
  // One slow outlier per candidate: the median ignores it.
  const long outlier = step_in_candidate == 2 ? 1000 : 0;
  return Milliseconds(times[rank][candidate] + outlier);
}

struct StepRecord {
  std::size_t current = 0;   // the candidate that ran the step
  std::uint64_t plan = 0;    // its plan's fingerprint
  std::uint64_t result = 0;  // the buffer's hash after the step
  bool done = false;         // tuning().done() after the step
};

}  // namespace

TEST_CASE(
    "tuning picks the candidate whose slowest rank is fastest, on every rank, at the same step, with exact results") {
  constexpr int kRanks = 2;
  constexpr std::size_t kWarmup = 1, kMeasured = 3, kAfter = 3;
  constexpr std::size_t kTuningSteps = 3 * (kWarmup + kMeasured);  // the twin is not run
  LoopbackWorld world(kRanks);
  std::vector<std::vector<StepRecord>> records(kRanks);
  std::vector<std::string> failures(kRanks);
  const auto errors = run_ranks(kRanks, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout(12));
    std::chrono::steady_clock::time_point now{};
    Sync sync(buffer, {.tuning = TuningOptions{.candidates = three_plans_and_a_twin(), .warmup_steps = kWarmup, .measured_steps = kMeasured, .clock = [&] { return now; }}});
    const auto& candidates = sync.tuning().candidates;
    REQUIRE(candidates.size() == 4);
    CHECK(candidates[0].buckets == 6);
    CHECK(candidates[1].buckets == 4);
    CHECK(candidates[2].buckets == 2);
    CHECK(candidates[3].same_plan_as == std::optional<std::size_t>(2));
    CHECK_FALSE(sync.tuning().done());
    for (int step = 0; step < static_cast<int>(kTuningSteps + kAfter); ++step) {
      const std::size_t current = sync.tuning().current;
      const BucketPlan plan = sync.plan();
      const std::size_t step_in_candidate = static_cast<std::size_t>(step) % (kWarmup + kMeasured);
      write_gradients(buffer, rank, step);
      const auto order = shuffled_slots(buffer.layout().size(), rank, step);
      sync.mark_ready(order[0]);  // starts the step's clock
      now += scripted_time(rank, current, step_in_candidate);
      for (std::size_t i = 1; i < order.size(); ++i) sync.mark_ready(order[i]);
      sync.finish();
      records[rank].push_back({current, plan.fingerprint(), buffer_hash(buffer), sync.tuning().done()});
      // What the step did, reported also when the step ended with a switch.
      CHECK(sync.stats().steps == static_cast<std::size_t>(step) + 1);
      CHECK(sync.stats().buckets == plan.size());
      CHECK(sync.stats().launched_before_finish == plan.size());
      CHECK(sync.timings().size() == plan.size());
      CHECK(sync.nonfinite() == 0);
      const double error = errors_against_reference(buffer, kRanks, step, ReduceOp::kAvg)[0];
      if (!(error <= tolerance(DataType::kFloat32))) {
        failures[rank] += "step " + std::to_string(step) + ": error " + std::to_string(error) + "; ";
      }
    }
    const auto& tuning = sync.tuning();
    REQUIRE(tuning.done());
    CHECK(*tuning.chosen == 2);
    CHECK(sync.plan().size() == 2);
    CHECK(tuning.tuning_steps == kTuningSteps);
    CHECK(tuning.steps == kTuningSteps + kAfter);
    for (std::size_t c = 0; c < 3; ++c) {
      REQUIRE(candidates[c].step_times.size() == kMeasured);
      CHECK(candidates[c].median == scripted_time(rank, c, 1));
    }
    CHECK(candidates[0].slowest_median == Milliseconds(40));
    CHECK(candidates[1].slowest_median == Milliseconds(30));
    CHECK(candidates[2].slowest_median == Milliseconds(25));
    CHECK(candidates[3].step_times.empty());
    CHECK(tuning.describe() ==
          "512 B (6 buckets) 40.000 ms, 1.00 KiB (4 buckets) 30.000 ms, whole buffer (2 buckets) 25.000 ms, "
          "1.00 MiB (2 buckets) same plan as whole buffer; chosen: whole buffer after 12 steps");
  });
  for (int r = 0; r < kRanks; ++r) {
    CHECK(message_of(errors[r]) == "");
    CHECK(failures[r] == "");
  }
  REQUIRE(records[0].size() == kTuningSteps + kAfter);
  REQUIRE(records[1].size() == records[0].size());
  for (std::size_t step = 0; step < records[0].size(); ++step) {
    CAPTURE(step);
    CHECK(records[1][step].current == records[0][step].current);
    CHECK(records[1][step].plan == records[0][step].plan);
    CHECK(records[1][step].result == records[0][step].result);  // bit for bit
    CHECK(records[1][step].done == records[0][step].done);
    // Candidates in order, each for its warm-up and measured steps, then the winner.
    const std::size_t expected = step < kTuningSteps ? step / (kWarmup + kMeasured) : 2;
    CHECK(records[0][step].current == expected);
    CHECK(records[0][step].done == (step + 1 >= kTuningSteps));
  }
}

TEST_CASE("tuning over mixed element types and empty tensors, no warm-up, four ranks, matches float64") {
  // Also with defer_gather: a switch of plans waits for the step's second halves.
  for (bool defer : {false, true}) {
    CAPTURE(defer);
    constexpr int kRanks = 4;
    LoopbackWorld world(kRanks);
    std::vector<std::string> failures(kRanks);
    std::vector<std::size_t> chosen(kRanks);
    const auto errors = run_ranks(kRanks, [&](int rank) {
      LoopbackBackend backend(world, rank);
      Buffer buffer(backend, awkward_layout());
      std::chrono::steady_clock::time_point now{};
      Sync sync(
          buffer,
          {.op = ReduceOp::kSum,
           .tuning = TuningOptions{.candidates = {{.bucket_bytes = 4 << 10, .first_bucket_bytes = 4 << 10},
                                                  {.bucket_bytes = 32 << 10, .first_bucket_bytes = 4 << 10},
                                                  {.bucket_bytes = kWholeBuffer, .first_bucket_bytes = kWholeBuffer}},
                                   .warmup_steps = 0,
                                   .measured_steps = 1,
                                   .clock = [&] { return now; }},
           .defer_gather = defer});
      for (int step = 0; step < 5; ++step) {
        write_gradients(buffer, rank, step);
        // Rank 3 is slow with the middle candidate, everyone else with the first: the last wins.
        const std::size_t current = sync.tuning().current;
        for (Slot slot : shuffled_slots(buffer.layout().size(), rank, step)) sync.mark_ready(slot);
        now += Milliseconds(current == 2 ? 10 : current == 1 ? (rank == 3 ? 50 : 1) : (rank == 3 ? 1 : 50));
        sync.finish();
        sync.wait_all(backend.default_stream());
        const auto error = errors_against_reference(buffer, kRanks, step, ReduceOp::kSum);
        for (DataType type : buffer.layout().element_types()) {
          if (!(error[static_cast<std::size_t>(type)] <= tolerance(type))) {
            failures[rank] += "step " + std::to_string(step) + " " + std::string(ncclkit::name_of(type)) + "; ";
          }
        }
      }
      CHECK(sync.tuning().tuning_steps == 3);
      CHECK(sync.tuning().candidates[0].buckets != sync.tuning().candidates[1].buckets);
      chosen[rank] = sync.tuning().chosen.value_or(99);
    });
    for (int r = 0; r < kRanks; ++r) {
      CHECK(message_of(errors[r]) == "");
      CHECK(failures[r] == "");
      CHECK(chosen[r] == 2);
    }
  }
}

TEST_CASE("candidates that all give one plan mean no tuning: no host waits, no exchange of times") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());  // 2 KiB: every default cap takes it whole
    int clock_reads = 0;
    Sync sync(buffer, {.tuning = TuningOptions{.clock = [&] {
                 ++clock_reads;
                 return std::chrono::steady_clock::time_point{};
               }}});
    CHECK(sync.tuning().done());
    CHECK(sync.tuning().chosen == std::optional<std::size_t>(0));
    for (std::size_t c = 1; c < sync.tuning().candidates.size(); ++c) {
      CHECK(sync.tuning().candidates[c].same_plan_as == std::optional<std::size_t>(0));
    }
    const std::size_t setup = backend.collectives_issued();
    CHECK(setup == 1);  // the check of plan, options and tuning
    for (int step = 0; step < 3; ++step) {
      write_gradients(buffer, rank, step);
      for (Slot slot : shuffled_slots(buffer.layout().size(), rank, step)) sync.mark_ready(slot);
      sync.finish();
      CHECK(errors_against_reference(buffer, 2, step, ReduceOp::kAvg)[0] <= 1e-6);
    }
    CHECK(backend.collectives_issued() == setup + 3);  // one bucket a step, nothing else
    CHECK(clock_reads == 0);
    CHECK(sync.tuning().tuning_steps == 0);
    CHECK(sync.stats().steps == 3);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("a step with a tensor missing is not counted; marking it and finishing again counts it once") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  Buffer buffer(backend, small_layout(12));
  std::chrono::steady_clock::time_point now{};
  Sync sync(buffer, {.tuning = TuningOptions{.candidates = three_plans_and_a_twin(), .warmup_steps = 0, .measured_steps = 1, .clock = [&] {
                        return now;
                      }}});
  write_gradients(buffer, 0, 0);
  for (std::uint32_t i = 1; i < 12; ++i) sync.mark_ready(Slot{i});
  now += Milliseconds(7);
  CHECK_THROWS_WITH_AS(sync.finish(), doctest::Contains("\"w0\""), ConfigError);
  CHECK(sync.tuning().tuning_steps == 0);
  CHECK(sync.tuning().current == 0);
  now += Milliseconds(2);
  sync.mark_ready(Slot{0});
  sync.finish();
  CHECK(sync.tuning().tuning_steps == 1);
  CHECK(sync.tuning().current == 1);
  REQUIRE(sync.tuning().candidates[0].step_times.size() == 1);
  CHECK(sync.tuning().candidates[0].step_times[0] == Milliseconds(9));  // from the first mark
  CHECK(errors_against_reference(buffer, 1, 0, ReduceOp::kAvg)[0] <= 1e-6);
}

TEST_CASE("bad tuning options are ConfigErrors that say what to change") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  Buffer buffer(backend, small_layout());
  const long allocations = backend.live_allocations();
  CHECK_THROWS_WITH_AS(Sync(buffer, {.tuning = TuningOptions{.candidates = {}}}), doctest::Contains("candidates is empty; give at least one"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(Sync(buffer, {.tuning = TuningOptions{.candidates = {{.bucket_bytes = 1 << 20}, {.bucket_bytes = 0}}}}),
                       doctest::Contains("candidate 1 has bucket_bytes 0 and first_bucket_bytes 1048576; both caps "
                                         "must be at least 1 byte"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(Sync(buffer, {.tuning = TuningOptions{.candidates = {{.bucket_bytes = 1 << 20, .first_bucket_bytes = 0}}}}),
                       doctest::Contains("candidate 0 has bucket_bytes 1048576 and first_bucket_bytes 0"), ConfigError);
  CHECK_THROWS_WITH_AS(Sync(buffer, {.tuning = TuningOptions{.measured_steps = 0}}), doctest::Contains("measured_steps is 0"), ConfigError);
  CHECK_THROWS_WITH_AS(Sync(buffer, {.op = ReduceOp::kMax, .tuning = TuningOptions{}}),
                       doctest::Contains("op max is not a gradient reduction"), ConfigError);
  CHECK(backend.live_allocations() == allocations);
}

TEST_CASE("ranks that tune differently get a ConfigError on every rank, before any bucket") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout(12));
    Sync sync(buffer, {.tuning = TuningOptions{.candidates = three_plans_and_a_twin(), .measured_steps = rank == 0 ? 3u : 2u}});
  });
  for (const auto& e : errors) {
    CHECK(message_of(e).find("rank 1 tunes otherwise than rank 0 (the same candidates, warmup_steps 1, "
                             "measured_steps 2 against the same candidates, warmup_steps 1, measured_steps 3)") !=
          std::string::npos);
  }
  const auto other_candidates = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout(12));
    auto candidates = three_plans_and_a_twin();
    if (rank == 1) candidates.pop_back();
    Sync sync(buffer, {.tuning = TuningOptions{.candidates = candidates}});
  });
  for (const auto& e : other_candidates) CHECK(message_of(e).find("(other candidates, ") != std::string::npos);
}

TEST_CASE("a failure while tuning leaves the tuned sync unusable, with an error that says so") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout(12));
    Sync sync(buffer, {.tuning = TuningOptions{.candidates = three_plans_and_a_twin(), .warmup_steps = 0,
                                               .measured_steps = 1}});
    // One step per candidate: the third step's finish exchanges the medians (a collective).
    for (int step = 0; step < 3; ++step) {
      write_gradients(buffer, rank, step);
      for (std::uint32_t i = 0; i < 12; ++i) sync.mark_ready(Slot{i});
      if (step < 2) sync.finish();
    }
    backend.fail_next_collective("peer lost (drill)");
    CHECK_THROWS_WITH_AS(sync.finish(), doctest::Contains("peer lost (drill)"), ncclkit::CommError);
    CHECK_THROWS_WITH_AS(sync.mark_ready(Slot{0}), doctest::Contains("is unusable: tuning failed (peer lost (drill))"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(sync.finish(), doctest::Contains("is unusable"), ConfigError);
    CHECK_THROWS_WITH_AS((void)sync.plan(), doctest::Contains("is unusable"), ConfigError);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("the choice: slowest rank per candidate, then the fastest candidate, the earliest on a tie") {
  using ncclkit::fusion::detail::choose;
  using ncclkit::fusion::detail::kNotMeasured;
  // Two ranks, three candidates: slowest medians 40, 30, 30.
  const std::vector<std::uint64_t> gathered = {10, 30, 30, 40, 5, 20};
  const auto choice = choose(gathered, 3);
  CHECK(choice.index == 1);
  CHECK(choice.slowest == std::vector<std::uint64_t>{40, 30, 30});
  // A candidate not measured is never chosen.
  const std::vector<std::uint64_t> twin = {kNotMeasured, 30, kNotMeasured, 40};
  CHECK(choose(twin, 2).index == 1);
  CHECK_THROWS_WITH_AS(choose(std::vector<std::uint64_t>{1, 2, 3}, 2), doctest::Contains("whole number of ranks"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(choose(std::vector<std::uint64_t>{kNotMeasured, kNotMeasured}, 2),
                       doctest::Contains("no candidate was measured"), ConfigError);
  using ncclkit::fusion::detail::median_of;
  CHECK(median_of({Milliseconds(5), Milliseconds(1), Milliseconds(900)}) == Milliseconds(5));
  CHECK(median_of({Milliseconds(4), Milliseconds(2), Milliseconds(3), Milliseconds(1)}) == Milliseconds(2));
  CHECK(median_of({}) == Milliseconds(0));
}

TEST_CASE("with a codec, non-finite results of the step that ended with a switch are still reported") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout(12));
    Sync sync(buffer, {.reducer = ncclkit::compression::compressed({.codec = ncclkit::compression::Codec::kFloat16}), .tuning = TuningOptions{.candidates = three_plans_and_a_twin(), .warmup_steps = 0, .measured_steps = 2}});
    for (int step = 0; step < 4; ++step) {
      write_gradients(buffer, rank, step);
      if (step == 1 && rank == 1) buffer.span<float>("w3")[5] = std::numeric_limits<float>::infinity();
      for (Slot slot : shuffled_slots(buffer.layout().size(), rank, step)) sync.mark_ready(slot);
      sync.finish();
      // Step 1 is candidate 0's last: finish switched to candidate 1 after it.
      CHECK(sync.tuning().current == (step < 1 ? 0u : step < 3 ? 1u : 2u));
      CHECK(sync.nonfinite() == (step == 1 ? 1u : 0u));
      CHECK(sync.stats().compressed_chunks == (step < 2 ? 6u : 4u));
      if (step != 1) {
        CHECK(errors_against_reference(buffer, 2, step, ReduceOp::kAvg)[0] <=
              tolerance(DataType::kFloat32, ncclkit::compression::Codec::kFloat16));
      }
    }
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

namespace tuned_docs_example {
// The example of docs/fusion.md's "Auto-tuning the bucket cap", verbatim.
template <ncclkit::Backend B>
std::string train_tuned(B& backend, ncclkit::fusion::FusedBuffer<B>& gradients, int steps) {
  using namespace ncclkit::fusion;
  // The default candidates (4 MiB to one bucket), one warm-up and three timed steps each.
  GradientSync<B> sync(gradients, {.op = ncclkit::ReduceOp::kAvg, .tuning = TuningOptions{}});
  const auto compute = backend.default_stream();
  for (int step = 0; step < steps; ++step) {
    // Backward writes each gradient on `compute` and marks it ready, output layer first.
    for (auto i = static_cast<std::uint32_t>(gradients.layout().size()); i-- > 0;) sync.mark_ready(Slot{i}, compute);
    sync.finish(compute);  // while tuning: waits for `compute`, times the step, may switch plans
  }
  // "4.00 MiB (3 buckets) 9.870 ms, 16.00 MiB (2 buckets) 8.120 ms, ...; chosen: 16.00 MiB after 12 steps"
  return sync.tuning().describe();
}
}  // namespace tuned_docs_example

TEST_CASE("the auto-tuning example of docs/fusion.md, on three tensors of 3 MiB: three plans among the defaults") {
  LoopbackWorld world(2);
  std::vector<std::string> described(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    ncclkit::fusion::FusedLayout layout;
    for (const char* name : {"a", "b", "c"}) layout.add(name, {3 << 18}, DataType::kFloat32);
    layout.finalize();
    Buffer buffer(backend, std::move(layout));
    for (std::uint32_t i = 0; i < 3; ++i) std::ranges::fill(buffer.span<float>(Slot{i}), 0.25f * float(rank + i));
    described[rank] = tuned_docs_example::train_tuned(backend, buffer, 13);
    CHECK(buffer.span<float>(Slot{2})[0] == doctest::Approx(0.25 * (2 + 0.5)));
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
  // Both ranks report the same slowest-rank medians and choice (their own medians differ).
  const auto decided = [](const std::string& text) { return text.substr(text.find("; chosen: ")); };
  CHECK(described[0].find("4.00 MiB (3 buckets) ") == 0);
  CHECK(described[0].find("16.00 MiB (2 buckets) ") != std::string::npos);
  CHECK(described[0].find("whole buffer (2 buckets) same plan as 16.00 MiB") != std::string::npos);
  CHECK(described[0].find("one bucket (1 buckets) ") != std::string::npos);
  CHECK(described[0].find("after 12 steps") != std::string::npos);
  CHECK(decided(described[0]) == decided(described[1]));
  CHECK(described[0] == described[1]);
}
