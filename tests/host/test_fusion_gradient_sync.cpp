// Tests of ncclkit/fusion/gradient_sync.hpp, ranks as threads over the loopback backend: fused
// and bucketed results equal a per-tensor all-reduce computed in float64 (random N(0, 1e-3)
// gradients, ready order shuffled differently on every rank, several steps), on real model
// shapes and on awkward ones (one huge tensor, hundreds of tiny ones, mixed element types,
// empty tensors); never-marked tensors (named, or reduced as zeros), marking twice, events made
// once, buckets launched before finish, and ranks with different plans; defer_gather (the same
// averages in two halves, callbacks in reverse plan order, on an update stream after their
// bucket's gather, and its errors).
#include <doctest/doctest.h>

#include <algorithm>   // std::shuffle
#include <array>       // std::array
#include <chrono>      // std::chrono
#include <cmath>       // std::sqrt, std::abs
#include <cstddef>     // std::size_t, std::byte
#include <cstdint>     // std::uint64_t
#include <functional>  // std::function
#include <limits>      // std::numeric_limits
#include <random>      // std::mt19937
#include <span>        // std::span
#include <string>      // std::string
#include <vector>      // std::vector

#include "ncclkit/fusion/gradient_sync.hpp"
#include "support/fusion_check.hpp"
#include "support/loopback_backend.hpp"
#include "support/model_shapes.hpp"

using ncclkit::BFloat16;
using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::Half;
using ncclkit::ReduceOp;
using ncclkit::fusion::BucketOptions;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::FusedBuffer;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::GradientSync;
using ncclkit::fusion::MissingTensors;
using ncclkit::fusion::Slot;
using ncclkit::testing::awkward_layout;
using ncclkit::testing::Buffer;
using ncclkit::testing::buffer_hash;
using ncclkit::testing::check_synchronised;
using ncclkit::testing::errors_against_reference;
using ncclkit::testing::gradient;
using ncclkit::testing::kTwoPerBucket;
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;
using ncclkit::testing::message_of;
using ncclkit::testing::run_ranks;
using ncclkit::testing::scaled_gpt2;
using ncclkit::testing::shuffled_slots;
using ncclkit::testing::small_layout;
using ncclkit::testing::Sync;
using ncclkit::testing::write_gradients;

namespace docs_example {
// The example of docs/fusion.md, verbatim.
template <ncclkit::Backend B>
void train(B& backend, int steps) {
  using namespace ncclkit;
  using namespace ncclkit::fusion;

  // 1. Register the parameters' gradients, in the model's order (input to output).
  FusedLayout layout;
  layout.add("fc1.weight", {256, 784}, DataType::kFloat32);
  layout.add("fc1.bias", {256}, DataType::kFloat32);
  layout.add("fc2.weight", {10, 256}, DataType::kFloat32);
  layout.add("fc2.bias", {10}, DataType::kFloat32);
  layout.finalize();

  // 2. One allocation per element type; every gradient is a view into it.
  FusedBuffer<B> gradients(backend, std::move(layout));
  const TensorView fc2_weight = gradients.view("fc2.weight");  // bind to the model, once

  // 3. The synchroniser: same plan on every rank (checked here, by a collective).
  GradientSync<B> sync(gradients, BucketPlan::compute(gradients.layout()));

  const auto compute = backend.default_stream();
  for (int step = 0; step < steps; ++step) {
    // 4. Backward writes each gradient on `compute`, output layer first, and marks it ready:
    //    a complete bucket goes to the comm stream at once, behind an event.
    backend.scale(fc2_weight, 0.5, compute);  // (stands for the kernel that writes it)
    sync.mark_ready("fc2.bias", compute);
    sync.mark_ready("fc2.weight", compute);
    sync.mark_ready("fc1.bias", compute);
    sync.mark_ready("fc1.weight", compute);
    // 5. `compute` waits for every bucket (by an event; the host does not wait).
    sync.finish(compute);
    // 6. The optimizer, issued on `compute`, reads averaged gradients.
  }
  backend.synchronize(compute);
}
}  // namespace docs_example

TEST_CASE("bucketed all-reduce of hundreds of tiny tensors, a huge one, mixed types and empty ones matches float64") {
  check_synchronised(3, awkward_layout, BucketOptions{.bucket_bytes = 256 << 10, .first_bucket_bytes = 4 << 10}, 3);
}

TEST_CASE("sum instead of average") {
  check_synchronised(2, awkward_layout, BucketOptions{}, 1, {.op = ReduceOp::kSum});
}

TEST_CASE("ResNet-50 at full size, two ranks, default buckets, matches float64") {
  check_synchronised(
      2, [] { return ncclkit::testing::model_layout("resnet50"); }, BucketOptions{}, 1);
}

TEST_CASE("GPT-2 small shapes scaled down by 8 per extent, four ranks, two steps, match float64") {
  check_synchronised(4, scaled_gpt2, BucketOptions{.bucket_bytes = 1 << 20, .first_bucket_bytes = 64 << 10}, 2);
}

TEST_CASE("buckets are launched from mark_ready, before finish, in plan order") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket));
    REQUIRE(sync.plan().size() == 4);
    const std::size_t before = backend.collectives_issued();
    write_gradients(buffer, rank, 0);
    // Backward order: w7, w6 complete bucket 0; w5 alone launches nothing.
    sync.mark_ready("w7");
    CHECK(backend.collectives_issued() == before);
    sync.mark_ready("w6");
    CHECK(backend.collectives_issued() == before + 1);
    // Later buckets complete first: they wait for bucket 1, then go together.
    for (const char* name : {"w0", "w1", "w2", "w3", "w4"}) sync.mark_ready(name);
    CHECK(backend.collectives_issued() == before + 1);
    sync.mark_ready("w5");
    CHECK(backend.collectives_issued() == before + 4);  // all four, before finish
    sync.finish();
    CHECK(sync.stats().launched_before_finish == 4);
    CHECK(errors_against_reference(buffer, 2, 0, ReduceOp::kAvg)[static_cast<std::size_t>(DataType::kFloat32)] <= 1e-6);
    // Host timings: buckets 2 and 3 were ready before bucket 1 but launched after it.
    const auto t = sync.timings();
    REQUIRE(t.size() == 4);
    for (const auto& bucket : t) CHECK(bucket.ready <= bucket.launched);
    CHECK(t[0].launched <= t[2].ready);
    CHECK(t[2].ready <= t[1].ready);
    CHECK(t[3].ready <= t[1].ready);
    CHECK(t[1].launched <= t[2].launched);
    CHECK(t[2].launched <= t[3].launched);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("a comm stream given in the options is used (here the inline one)") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket), {.comm_stream = backend.default_stream()});
    CHECK(sync.comm_stream() == backend.default_stream());
    write_gradients(buffer, rank, 0);
    for (Slot slot : shuffled_slots(buffer.layout().size(), rank, 0)) sync.mark_ready(slot);
    sync.finish();
    CHECK(errors_against_reference(buffer, 2, 0, ReduceOp::kAvg)[static_cast<std::size_t>(DataType::kFloat32)] <= 1e-6);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("a tensor never marked ready is an error naming it; marking it and finishing again completes the step") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket));
    write_gradients(buffer, rank, 0);
    for (const char* name : {"w7", "w6", "w5", "w3", "w2", "w0"}) sync.mark_ready(name);
    CHECK_THROWS_WITH_AS(sync.finish(),
                         doctest::Contains("2 of 8 tensors were never marked ready this step: \"w1\", \"w4\""),
                         ConfigError);
    sync.mark_ready("w4");
    sync.mark_ready("w1");
    sync.finish();
    CHECK(errors_against_reference(buffer, 2, 0, ReduceOp::kAvg)[static_cast<std::size_t>(DataType::kFloat32)] <= 1e-6);
    CHECK(sync.stats().launched_before_finish == 4);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("with kReduceAsZeros a tensor never marked is reduced as zeros, even over NaN garbage") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket), {.missing = MissingTensors::kReduceAsZeros});
    for (int step = 0; step < 2; ++step) {
      write_gradients(buffer, rank, step);
      if (rank == 1) {
        for (float& x : buffer.span<float>("w3")) x = std::numeric_limits<float>::quiet_NaN();
      }
      for (Slot slot : shuffled_slots(buffer.layout().size(), rank, step)) {
        if (rank == 1 && buffer.layout().name(slot) == "w3") continue;
        sync.mark_ready(slot);
      }
      sync.finish();
      CHECK(sync.stats().zeroed == (rank == 1 ? 1u : 0u));
      const auto w3 = buffer.span<float>("w3");
      for (std::size_t e = 0; e < w3.size(); ++e) {
        const double expected = double(float(gradient(0, step, 3, e))) / 2;  // rank 1 gave zeros
        CHECK(std::abs(w3[e] - expected) <= 1e-9);
      }
      const auto w2 = buffer.span<float>("w2");
      const double expected = (double(float(gradient(0, step, 2, 0))) + double(float(gradient(1, step, 2, 0)))) / 2;
      CHECK(std::abs(w2[0] - expected) <= 1e-9);
    }
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("marking a tensor twice in a step is an error naming it") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  Buffer buffer(backend, small_layout());
  Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket));
  sync.mark_ready("w7");
  CHECK_THROWS_WITH_AS(sync.mark_ready("w7"), doctest::Contains("tensor \"w7\" (slot 7) was already marked ready"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(sync.mark_ready("nope"), doctest::Contains("\"nope\""), ConfigError);
}

TEST_CASE("ranks with different plans get a ConfigError on every rank, not a hang") {
  SUBCASE("one rank registered an extra tensor") {
    LoopbackWorld world(3, std::chrono::seconds(5));
    const auto start = std::chrono::steady_clock::now();
    const auto errors = run_ranks(3, [&](int rank) {
      LoopbackBackend backend(world, rank);
      Buffer buffer(backend, small_layout(8, rank == 2));
      Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket));
    });
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(4));
    for (int r = 0; r < 3; ++r) {
      const std::string message = message_of(errors[static_cast<std::size_t>(r)]);
      CHECK(message.find("GradientSync on rank " + std::to_string(r) + ": the ranks hold different bucket plans") !=
            std::string::npos);
      CHECK(message.find(", rank 2 ") != std::string::npos);
      CHECK(message.find("rank 1 ") == std::string::npos);  // matches rank 0: not listed
    }
  }
  SUBCASE("one rank cut buckets with another cap") {
    LoopbackWorld world(2, std::chrono::seconds(5));
    const auto errors = run_ranks(2, [&](int rank) {
      LoopbackBackend backend(world, rank);
      Buffer buffer(backend, small_layout());
      Sync sync(buffer, BucketPlan::compute(buffer.layout(), rank == 0 ? kTwoPerBucket : BucketOptions{}));
    });
    for (const auto& e : errors) CHECK(message_of(e).find("different bucket plans") != std::string::npos);
  }
}

TEST_CASE("ranks with different ops get a ConfigError on every rank naming the options, not different results") {
  LoopbackWorld world(2, std::chrono::seconds(5));
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    Sync sync(buffer, BucketPlan::compute(buffer.layout()), {.op = rank == 0 ? ReduceOp::kAvg : ReduceOp::kSum});
  });
  for (const auto& e : errors) {
    CHECK(message_of(e).find("rank 1 uses other GradientSyncOptions than rank 0 (op sum, missing kError, reducer "
                             "all_reduce against op avg, missing kError, reducer all_reduce)") != std::string::npos);
  }
}

TEST_CASE("a plan made for another layout, or a reduction other than sum and average, is a ConfigError") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  Buffer buffer(backend, small_layout());
  const FusedLayout other = small_layout(9);
  CHECK_THROWS_WITH_AS(Sync(buffer, BucketPlan::compute(other)), doctest::Contains("not made for this buffer's layout"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(Sync(buffer, BucketPlan::compute(buffer.layout()), {.op = ReduceOp::kMax}),
                       doctest::Contains("op max is not a gradient reduction"), ConfigError);
}

TEST_CASE("the example of docs/fusion.md") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    docs_example::train(backend, 3);
    CHECK(backend.collectives_issued() == 1 + 3);  // the plan check, then one bucket a step
    CHECK(backend.live_allocations() == 0);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("a launch that fails leaves the sync unusable, with an error that says so, not out of step") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  Buffer buffer(backend, small_layout());
  Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket));
  write_gradients(buffer, 0, 0);
  // The first bucket's two tensors are the last registered (reverse order): marking them
  // launches it, and its collective fails.
  backend.fail_next_collective("peer lost (drill)");
  sync.mark_ready(Slot{7});
  CHECK_THROWS_WITH_AS(sync.mark_ready(Slot{6}), doctest::Contains("peer lost (drill)"), ncclkit::CommError);
  CHECK_THROWS_WITH_AS(sync.mark_ready(Slot{5}),
                       doctest::Contains("is unusable: a launch failed (peer lost (drill)), so its buckets are out of "
                                         "step"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(sync.finish(), doctest::Contains("is unusable"), ConfigError);
}

TEST_CASE("a collective that fails inside finish leaves the sync unusable too") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  Buffer buffer(backend, small_layout());
  Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket), {.missing = MissingTensors::kReduceAsZeros});
  write_gradients(buffer, 0, 0);
  for (std::uint32_t i = 7; i >= 1; --i) sync.mark_ready(Slot{i});  // three buckets launched
  // finish zeroes slot 0 and launches the last bucket, whose collective fails.
  backend.fail_next_collective("link down (drill)");
  CHECK_THROWS_WITH_AS(sync.finish(), doctest::Contains("link down (drill)"), ncclkit::CommError);
  CHECK_THROWS_WITH_AS(sync.finish(), doctest::Contains("is unusable: a launch failed (link down (drill))"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(sync.mark_ready(Slot{0}), doctest::Contains("is unusable"), ConfigError);
}

TEST_CASE("defer_gather: the same averages, in two halves where a bucket splits evenly over the ranks") {
  // Awkward shapes (mixed element types, empty and tiny tensors, a huge one) at 2, 3 and 4
  // ranks (at 3 some buckets do not split evenly and are all-reduced), and GPT-2's scaled down
  // at 2: after wait_all every bucket holds the float64 reference's average, identical on every
  // rank, step after step.
  Sync::Options options;
  options.defer_gather = true;
  for (int ranks : {2, 3, 4}) {
    CAPTURE(ranks);
    check_synchronised(ranks, awkward_layout, kTwoPerBucket, 2, options);
  }
  check_synchronised(2, scaled_gpt2, BucketOptions{}, 2, options);
  // Which buckets went in two halves: at 2 ranks every float32 bucket of GPT-2's shapes (their
  // padded lengths are even), as reduce-scatters at launch; without defer_gather none.
  LoopbackWorld world(2);
  std::vector<std::size_t> split(2), plain(2), buckets(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, scaled_gpt2());
    for (bool defer : {true, false}) {
      Sync::Options o;
      o.defer_gather = defer;
      Sync sync(buffer, BucketPlan::compute(buffer.layout()), o);
      const std::size_t before = backend.reduce_scatters_issued();
      write_gradients(buffer, rank, 0);
      for (std::uint32_t i = 0; i < buffer.layout().size(); ++i) sync.mark_ready(Slot{i});
      (defer ? split : plain)[static_cast<std::size_t>(rank)] = backend.reduce_scatters_issued() - before;
      sync.finish();
      sync.wait_all(backend.default_stream());
      buckets[static_cast<std::size_t>(rank)] = sync.plan().size();
    }
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(message_of(errors[r]) == "");
    CHECK(split[r] == buckets[r]);
    CHECK(plain[r] == 0);
  }
}

TEST_CASE("defer_gather: finish hands buckets over in reverse plan order on the comm stream; wait names a tensor") {
  LoopbackWorld world(2);
  std::vector<std::vector<std::size_t>> order(2);
  std::vector<std::vector<float>> seen(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    Sync::Options o;
    o.defer_gather = true;
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket), o);
    REQUIRE(sync.plan().size() > 2);
    const auto compute = backend.default_stream();
    for (int step = 0; step < 2; ++step) {
      // The host writes gradients that the last step's gathers write too: after them, as a
      // model's forward (need) orders its backward.
      if (step > 0) sync.wait_all(compute);
      write_gradients(buffer, rank, step);
      for (std::uint32_t i = 0; i < buffer.layout().size(); ++i) sync.mark_ready(Slot{i});
      order[static_cast<std::size_t>(rank)].clear();
      sync.finish(compute, [&](std::size_t bucket) { order[static_cast<std::size_t>(rank)].push_back(bucket); });
    }
    // The first tensor's bucket is the plan's last: the first a forward pass needs.
    const Slot first{0};
    sync.wait(first, compute);
    sync.wait(buffer.layout().name(first), compute);
    const auto values = buffer.span<float>(first);
    seen[static_cast<std::size_t>(rank)].assign(values.begin(), values.end());
    sync.wait_all(compute);
    CHECK_THROWS_WITH_AS(sync.wait("no.such.tensor", compute), doctest::Contains("no.such.tensor"), ConfigError);
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(message_of(errors[r]) == "");
    REQUIRE(!order[r].empty());
    for (std::size_t k = 0; k < order[r].size(); ++k) CHECK(order[r][k] == order[r].size() - 1 - k);
  }
  CHECK(seen[0] == seen[1]);
  double worst = 0;
  for (std::size_t e = 0; e < seen[0].size(); ++e) {
    const double ref = (double(float(gradient(0, 1, 0, e))) + double(float(gradient(1, 1, 0, e)))) / 2;
    worst = std::max(worst, std::abs(double(seen[0][e]) - ref));
  }
  CHECK(worst <= 1e-9);
}

TEST_CASE("ranks that disagree on defer_gather, or give it with a 16-bit codec: a ConfigError on every rank") {
  LoopbackWorld world(2, std::chrono::seconds(5));
  const auto errors_with = [&](auto options_of) {
    return run_ranks(2, [&](int rank) {
      LoopbackBackend backend(world, rank);
      Buffer buffer(backend, small_layout());
      Sync sync(buffer, BucketPlan::compute(buffer.layout()), options_of(rank));
    });
  };
  const auto disagree = errors_with([](int rank) {
    Sync::Options o;
    o.defer_gather = rank == 1;
    return o;
  });
  for (const auto& e : disagree) {
    CHECK(message_of(e).find("rank 1 uses other GradientSyncOptions than rank 0 (op avg, missing kError, "
                             "defer_gather, reducer all_reduce against op avg, missing kError, reducer all_reduce)") !=
          std::string::npos);
  }
  const auto codec = errors_with([](int) {
    Sync::Options o;
    o.defer_gather = true;
    o.reducer = ncclkit::compression::compressed({.codec = ncclkit::compression::Codec::kFloat16});
    return o;
  });
  for (const auto& e : codec) {
    CHECK(message_of(e).find("defer_gather splits float32 all-reduces in two halves; the fp16 codec reduces in one "
                             "pass. Turn one of them off") != std::string::npos);
  }
}

TEST_CASE("defer_gather with an update stream: each bucket's callback runs there, after that bucket's gather") {
  // The loop-back backend's inline stream as the update stream: the callback for bucket b runs
  // in the calling thread once b's second half has landed, and finds b's average there.
  LoopbackWorld world(2);
  std::vector<double> worst(2, 1.0);
  std::vector<std::size_t> calls(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, small_layout());
    Sync::Options o;
    o.defer_gather = true;
    o.update_stream = backend.default_stream();
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), kTwoPerBucket), o);
    CHECK(sync.update_stream() == backend.default_stream());
    double w = 0;
    for (int step = 0; step < 2; ++step) {
      write_gradients(buffer, rank, step);
      for (std::uint32_t i = 0; i < buffer.layout().size(); ++i) sync.mark_ready(Slot{i});
      sync.finish(backend.default_stream(), [&](std::size_t bucket) {
        ++calls[static_cast<std::size_t>(rank)];
        for (Slot slot : sync.plan()[bucket].slots) {
          const auto values = buffer.span<float>(slot);
          for (std::size_t e = 0; e < values.size(); ++e) {
            const double ref = (double(float(gradient(0, step, slot.index, e))) +
                                double(float(gradient(1, step, slot.index, e)))) / 2;
            w = std::max(w, std::abs(double(values[e]) - ref));
          }
        }
      });
    }
    sync.wait_all(backend.default_stream());
    worst[static_cast<std::size_t>(rank)] = w;
    CHECK(calls[static_cast<std::size_t>(rank)] == 2 * sync.plan().size());
  });
  for (std::size_t r = 0; r < 2; ++r) {
    CHECK(message_of(errors[r]) == "");
    CHECK(worst[r] <= 1e-9);
  }
}
