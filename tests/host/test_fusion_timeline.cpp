// Tests of ncclkit/fusion/timeline.hpp and GradientSync's timeline, ranks as threads over the
// loop-back backend: the trace file is JSON in Chrome's format (a strict reader parses it), one
// per rank, with every bucket's ready, launch and done and, with a codec or loose tensors,
// encode, decode, pack and unpack in stream order; the steps cap is honoured and the file is
// written when the last recorded step is known; off, nothing is made; an unwritable prefix is a
// warning naming it, and training goes on; the environment variables turn it on.
#include <doctest/doctest.h>

#include <stdlib.h>  // setenv, unsetenv

#include <chrono>      // std::chrono
#include <cmath>       // std::abs
#include <cstddef>     // std::size_t
#include <filesystem>  // std::filesystem::exists
#include <string>      // std::string
#include <vector>      // std::vector

#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/fusion/timeline.hpp"
#include "support/fusion_check.hpp"
#include "support/json_value.hpp"
#include "support/loopback_backend.hpp"
#include "support/stderr_capture.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"
#include "support/timeline_check.hpp"

using ncclkit::ConfigError;
using ncclkit::compression::Codec;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::Timeline;
using ncclkit::fusion::TimelineArgs;
using ncclkit::fusion::TimelineLane;
using ncclkit::fusion::TimelineOptions;
using ncclkit::testing::Buffer;
using ncclkit::testing::kTwoPerBucket;
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;
using ncclkit::testing::message_of;
using ncclkit::testing::run_ranks;
using ncclkit::testing::shuffled_slots;
using ncclkit::testing::small_layout;
using ncclkit::testing::Sync;
using ncclkit::testing::write_gradients;
using ncclkit_test::JsonValue;
using ncclkit_test::parse_json;
using ncclkit_test::read_text;
using ncclkit_test::stderr_of;
using ncclkit_test::TempDir;
using ncclkit_test::trace_problems;
using ncclkit_test::TraceExpectation;

namespace {

// `steps` steps of a GradientSync on `ranks` threads with `options`, every tensor marked in a
// shuffled order; `between(rank, step, sync)` runs after each finish.
template <class Between>
void run_timeline_steps(int ranks, int steps, Sync::Options options, Between between, bool loose = false) {
  LoopbackWorld world(ranks);
  const auto errors = run_ranks(ranks, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    const std::size_t tensors = buffer.layout().size();
    // Loose: every tensor in an allocation of its own, staged through the buffer.
    std::vector<std::vector<float>> own(tensors);
    std::vector<void*> pointers;
    if (loose) {
      for (std::size_t i = 0; i < tensors; ++i) {
        own[i].assign(buffer.layout().count(ncclkit::fusion::Slot{static_cast<std::uint32_t>(i)}), 1.0f + rank);
        pointers.push_back(own[i].data());
      }
    }
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket), pointers, options);
    for (int step = 0; step < steps; ++step) {
      write_gradients(buffer, rank, step);
      for (auto slot : shuffled_slots(tensors, rank, step)) sync.mark_ready(slot);
      sync.finish();
      between(rank, step, sync);
    }
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

void no_check(int, int, const Sync&) {}

std::string rank_file(const std::string& prefix, int rank) { return prefix + ".rank" + std::to_string(rank) + ".json"; }

}  // namespace

TEST_CASE("a Timeline is a Chrome trace: metadata rows, X and i events in microseconds, names escaped") {
  TempDir dir("timeline");
  Timeline trace(dir.path + "/t.json", 3, "a \"quoted\"\tlabel");
  const auto t0 = Timeline::Clock::now();
  trace.add_complete(TimelineLane::kComm, "all_reduce b0", "bucket", t0, t0 + std::chrono::microseconds(1500),
                     TimelineArgs{.step = 2, .bucket = 0, .bytes = 4096});
  trace.add_instant(TimelineLane::kHost, "ready b0", "bucket", t0 + std::chrono::nanoseconds(250), {.step = 2});
  trace.describe("plan", "1 bucket \\ of 4 KiB");
  trace.write();
  const JsonValue document = parse_json(read_text(dir.path + "/t.json"));
  CHECK(document["otherData"]["plan"].string == "1 bucket \\ of 4 KiB");
  const auto& events = document["traceEvents"].array;
  REQUIRE(events.size() == 2 + 2 * 3 + 2);
  CHECK(events[0]["name"].string == "process_name");
  CHECK(events[0]["args"]["name"].string == "rank 3 a \"quoted\"\tlabel");
  const JsonValue& reduce = events[events.size() - 2];
  const JsonValue& ready = events.back();
  CHECK(reduce["ph"].string == "X");
  CHECK(reduce["pid"].number == 3);
  CHECK(reduce["tid"].number == 3);  // the comm stream's row
  CHECK(reduce["dur"].number == 1500.0);
  CHECK(reduce["args"]["bytes"].number == 4096);
  CHECK_FALSE(reduce["args"].has("chunk"));
  CHECK(ready["ph"].string == "i");
  CHECK(ready["tid"].number == 1);
  // Microseconds of the system clock: the ready instant is 0.25 us after the reduction's start.
  CHECK(ready["ts"].number - reduce["ts"].number == doctest::Approx(0.25).epsilon(0.01));
  const double now_us =
      std::chrono::duration<double, std::micro>(std::chrono::system_clock::now().time_since_epoch()).count();
  CHECK(std::abs(reduce["ts"].number - now_us) < 60e6);
  CHECK_FALSE(std::filesystem::exists(dir.path + "/t.json.tmp"));
}

TEST_CASE("Timeline::write into a folder that does not exist is a ConfigError naming the path and what to do") {
  Timeline trace("/nonexistent-ncclkit-folder/t.json", 0);
  CHECK_THROWS_WITH_AS(trace.write(),
                       doctest::Contains("cannot create \"/nonexistent-ncclkit-folder/t.json.tmp\" (No such file or "
                                         "directory) to write \"/nonexistent-ncclkit-folder/t.json\"; point "
                                         "NCCLKIT_TIMELINE"),
                       ConfigError);
}

TEST_CASE("with a timeline each of two ranks writes its own trace: every bucket ready, launched and done, in order") {
  TempDir dir("timeline");
  const std::string prefix = dir.path + "/trace";
  std::vector<std::size_t> timing_events(2);
  run_timeline_steps(2, 3, {.timeline = TimelineOptions{.prefix = prefix}}, [&](int rank, int step, const Sync& sync) {
    REQUIRE(sync.timeline() != nullptr);
    CHECK(sync.timeline()->path() == rank_file(prefix, rank));
    (void)step;
  });
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(trace_problems(rank_file(prefix, rank), {.rank = rank, .buckets = 4, .steps = 3}) == "");
  }
  CHECK(ncclkit_test::entries(dir.path) == std::vector<std::string>{"trace.rank0.json", "trace.rank1.json"});
}

TEST_CASE("with a codec the trace shows encode, all_reduce and decode of every chunk, in stream order") {
  TempDir dir("timeline");
  const std::string prefix = dir.path + "/codec";
  // 64 floats a tensor, two tensors a bucket: one chunk a bucket (chunks are covered below).
  run_timeline_steps(2, 2, {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16}), .timeline = TimelineOptions{.prefix = prefix}}, no_check);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(trace_problems(rank_file(prefix, rank), {.rank = rank, .buckets = 4, .steps = 2, .codec = true}) == "");
  }
}

TEST_CASE("with defer_gather the trace shows each bucket's all_gather after its all_reduce, on the comm stream") {
  TempDir dir("timeline");
  const std::string prefix = dir.path + "/defer";
  Sync::Options options{.timeline = TimelineOptions{.prefix = prefix}};
  options.defer_gather = true;
  // The host writes the next step's gradients: after this step's gathers.
  run_timeline_steps(2, 3, options, [](int, int, const Sync& sync) { sync.wait_all({}); });
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(trace_problems(rank_file(prefix, rank), {.rank = rank, .buckets = 4, .steps = 3, .gathered = true}) == "");
  }
}

TEST_CASE("a chunked compressed bucket names its chunks; loose tensors show pack and unpack") {
  TempDir dir("timeline");
  SUBCASE("chunks") {
    const std::string prefix = dir.path + "/chunks";
    LoopbackWorld world(2);
    const auto errors = run_ranks(2, [&](int rank) {
      LoopbackBackend backend(world, rank);
      // One bucket of 16 KiB, in chunks of at most 4 KiB.
      ncclkit::fusion::FusedLayout layout;
      layout.add("big", {4096}, ncclkit::DataType::kFloat32);
      layout.finalize();
      Buffer big(backend, std::move(layout));
      Sync sync(big, BucketPlan::compute(big.layout()),
                {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .chunk_bytes = 4096}), .timeline = TimelineOptions{.prefix = prefix}});
      REQUIRE(sync.stats().compressed_chunks > 2);
      write_gradients(big, rank, 0);
      sync.mark_ready("big");
      sync.finish();
      sync.flush_timeline();
      CHECK(trace_problems(rank_file(prefix, rank), {.rank = rank, .buckets = 1, .steps = 1, .codec = true, .chunks_per_bucket = sync.stats().compressed_chunks}) == "");
    });
    for (const auto& e : errors) CHECK(message_of(e) == "");
  }
  SUBCASE("loose") {
    const std::string prefix = dir.path + "/loose";
    run_timeline_steps(2, 2, {.timeline = TimelineOptions{.prefix = prefix}}, no_check, true);
    for (int rank = 0; rank < 2; ++rank) {
      CHECK(trace_problems(rank_file(prefix, rank), {.rank = rank, .buckets = 4, .steps = 2, .loose = true}) == "");
    }
  }
}

TEST_CASE("only the first max_steps steps are recorded, and the file is written as soon as the last one is known") {
  TempDir dir("timeline");
  const std::string prefix = dir.path + "/cap";
  std::vector<std::size_t> events_at_cap(2), events_at_end(2);
  run_timeline_steps(2, 6, {.timeline = TimelineOptions{.prefix = prefix, .max_steps = 2}},
                     [&](int rank, int step, const Sync& sync) {
                       if (step == 1) {
                         // Before destruction and before any flush: written at the cap.
                         CHECK(trace_problems(rank_file(prefix, rank), {.rank = rank, .buckets = 4, .steps = 2}) == "");
                         events_at_cap[static_cast<std::size_t>(rank)] = sync.timeline()->size();
                       }
                       if (step == 5) events_at_end[static_cast<std::size_t>(rank)] = sync.timeline()->size();
                     });
  for (int rank = 0; rank < 2; ++rank) {
    CHECK(events_at_cap[static_cast<std::size_t>(rank)] > 0);
    CHECK(events_at_end[static_cast<std::size_t>(rank)] == events_at_cap[static_cast<std::size_t>(rank)]);
    CHECK(trace_problems(rank_file(prefix, rank), {.rank = rank, .buckets = 4, .steps = 2}) == "");
  }
}

TEST_CASE("off, a sync makes no file and no timing event; NCCLKIT_TIMELINE, where set, overrides the options' off") {
  TempDir dir("timeline");
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  Buffer buffer(backend, small_layout());
  {
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket), {.timeline = TimelineOptions{}});
    for (int step = 0; step < 3; ++step) {
      for (auto slot : shuffled_slots(buffer.layout().size(), 0, step)) sync.mark_ready(slot);
      sync.finish();
    }
    CHECK(sync.timeline() == nullptr);
    sync.flush_timeline();
  }
  {
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket));  // environment unset: off
    for (auto slot : shuffled_slots(buffer.layout().size(), 0, 0)) sync.mark_ready(slot);
    sync.finish();
    CHECK(sync.timeline() == nullptr);
  }
  CHECK(backend.timing_events_created() == 0);
  CHECK(ncclkit_test::entries(dir.path).empty());

  ::setenv("NCCLKIT_TIMELINE", (dir.path + "/env").c_str(), 1);
  Sync overridden(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket), {.timeline = TimelineOptions{}});
  ::unsetenv("NCCLKIT_TIMELINE");
  REQUIRE(overridden.timeline() != nullptr);
  CHECK(overridden.timeline()->path().rfind(dir.path + "/env.rank0", 0) == 0);
}

TEST_CASE("timing events are made once, at construction, not per step") {
  TempDir dir("timeline");
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  Buffer buffer(backend, small_layout());
  Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket),
            {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16}), .timeline = TimelineOptions{.prefix = dir.path + "/once"}});
  const std::size_t made = backend.timing_events_created();
  // Two sets of: backward (2), ready (4), encode, all_reduce and decode of 4 pieces (24); and
  // the anchor.
  CHECK(made == 2 * (2 + 4 + 24) + 1);
  for (int step = 0; step < 4; ++step) {
    for (auto slot : shuffled_slots(buffer.layout().size(), 0, step)) sync.mark_ready(slot);
    sync.finish();
  }
  CHECK(backend.timing_events_created() == made);
}

TEST_CASE(
    "NCCLKIT_TIMELINE turns it on for every GradientSync, numbering a process's later ones; bad steps are named") {
  TempDir dir("timeline");
  const std::string prefix = dir.path + "/env";
  ::setenv("NCCLKIT_TIMELINE", prefix.c_str(), 1);
  ::setenv("NCCLKIT_TIMELINE_STEPS", "1", 1);
  {
    LoopbackWorld world(1);
    LoopbackBackend backend(world, 0);
    Buffer buffer(backend, small_layout());
    Sync first(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket));
    Sync second(buffer, BucketPlan::compute(buffer.layout()));
    for (Sync* sync : {&first, &second}) {
      for (int step = 0; step < 2; ++step) {
        for (auto slot : shuffled_slots(buffer.layout().size(), 0, step)) sync->mark_ready(slot);
        sync->finish();
      }
    }
    REQUIRE(second.timeline() != nullptr);
    CHECK(second.timeline()->path() == prefix + ".rank0.1.json");
    ::setenv("NCCLKIT_TIMELINE_STEPS", "0", 1);
    CHECK_THROWS_WITH_AS(Sync(buffer, BucketPlan::compute(buffer.layout())),
                         doctest::Contains("NCCLKIT_TIMELINE_STEPS='0' is not an integer from 1 to"), ConfigError);
    ::setenv("NCCLKIT_TIMELINE_STEPS", "many", 1);
    CHECK_THROWS_WITH_AS(Sync(buffer, BucketPlan::compute(buffer.layout())),
                         doctest::Contains("NCCLKIT_TIMELINE_STEPS='many' is not an integer from 1 to"), ConfigError);
  }
  ::unsetenv("NCCLKIT_TIMELINE");
  ::unsetenv("NCCLKIT_TIMELINE_STEPS");
  CHECK(trace_problems(prefix + ".rank0.json", {.rank = 0, .buckets = 4, .steps = 1}) == "");
  CHECK(trace_problems(prefix + ".rank0.1.json", {.rank = 0, .buckets = 1, .steps = 1}) == "");
}

TEST_CASE("an unwritable prefix is a warning naming the path and what to do, and training goes on") {
  TempDir dir("timeline");
  const std::string log = stderr_of(dir.path + "/stderr", [&] {
    LoopbackWorld world(1);
    LoopbackBackend backend(world, 0);
    Buffer buffer(backend, small_layout());
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket),
              {.timeline = TimelineOptions{.prefix = dir.path + "/missing/trace"}});
    CHECK(sync.timeline() == nullptr);
    write_gradients(buffer, 0, 0);
    for (auto slot : shuffled_slots(buffer.layout().size(), 0, 0)) sync.mark_ready(slot);
    sync.finish();
    CHECK(sync.stats().steps == 1);
    CHECK(backend.timing_events_created() == 0);
  });
  CHECK(ncclkit_test::contains(log, "cannot create \"" + dir.path + "/missing/trace.rank0.json.tmp\""));
  CHECK(ncclkit_test::contains(log, "into a folder that exists and is writable; this rank records no timeline"));
}
