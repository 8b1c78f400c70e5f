// Tests of ncclkit/fusion/gradient_sync.hpp, ranks as threads over the loopback backend: fused
// and bucketed results equal a per-tensor all-reduce computed in float64 (random N(0, 1e-3)
// gradients, ready order shuffled differently on every rank, several steps), on real model
// shapes and on awkward ones (one huge tensor, hundreds of tiny ones, mixed element types,
// empty tensors); never-marked tensors (named, or reduced as zeros), marking twice, events made
// once, buckets launched before finish, and ranks with different plans.
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

#include "ncclkit/fusion/detail/byte_codec.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
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
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;
using ncclkit::testing::message_of;
using ncclkit::testing::run_ranks;

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

using Sync = GradientSync<LoopbackBackend>;
using Buffer = FusedBuffer<LoopbackBackend>;

namespace {

/// A gradient value, close to N(0, 1e-3), as a pure function of (rank, step, tensor, element):
/// every thread can compute every rank's values for the reference without storing them. The
/// sum of four uniforms (16 bits each of one hash) is near normal and far cheaper than
/// Box-Muller, which matters for ResNet-50's 25.6 M values.
double gradient(int rank, int step, std::uint32_t tensor, std::size_t element) {
  auto mix = [](std::uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  const std::uint64_t h =
      mix((std::uint64_t(rank) << 56) ^ (std::uint64_t(step) << 48) ^ (std::uint64_t(tensor) << 32) ^ mix(element));
  const double sum = double(h & 0xffff) + double((h >> 16) & 0xffff) + double((h >> 32) & 0xffff) + double(h >> 48);
  // Four U(0, 1) have mean 2 and variance 1/3.
  return 1e-3 * (sum / 65536.0 - 2.0) * 1.7320508075688772;
}

template <class T>
T to_element(double value) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}
template <class T>
double to_double(T value) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<double>(static_cast<float>(value));
  } else {
    return static_cast<double>(value);
  }
}

/// Writes this rank's gradients of `step` into the buffer (as backward would).
void write_gradients(const Buffer& buffer, int rank, int step) {
  const FusedLayout& layout = buffer.layout();
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const Slot slot{i};
    ncclkit::visit_data_type(layout.dtype(slot), [&]<class T>() {
      const auto values = buffer.span<T>(slot);
      for (std::size_t e = 0; e < values.size(); ++e) values[e] = to_element<T>(gradient(rank, step, i, e));
    });
  }
}

/// Norm-relative error ‖out − ref‖ / ‖ref‖ per element type, against the all-reduce of every
/// rank's gradients computed in float64 from the values as stored (rounded to the type).
std::array<double, ncclkit::fusion::kDataTypeCount> errors_against_reference(const Buffer& buffer, int ranks, int step,
                                                                             ReduceOp op) {
  std::array<double, ncclkit::fusion::kDataTypeCount> diff{}, norm{}, error{};
  const FusedLayout& layout = buffer.layout();
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const Slot slot{i};
    const auto t = static_cast<std::size_t>(layout.dtype(slot));
    ncclkit::visit_data_type(layout.dtype(slot), [&]<class T>() {
      const auto values = buffer.span<T>(slot);
      for (std::size_t e = 0; e < values.size(); ++e) {
        double ref = 0;
        for (int r = 0; r < ranks; ++r) ref += to_double(to_element<T>(gradient(r, step, i, e)));
        if (op == ReduceOp::kAvg) ref /= ranks;
        const double d = to_double(values[e]) - ref;
        diff[t] += d * d;
        norm[t] += ref * ref;
      }
    });
  }
  for (std::size_t t = 0; t < error.size(); ++t) error[t] = norm[t] > 0 ? std::sqrt(diff[t] / norm[t]) : 0.0;
  return error;
}

double tolerance(DataType type) {
  switch (type) {
    case DataType::kFloat64:
      return 1e-12;
    case DataType::kFloat32:
      return 1e-6;
    case DataType::kFloat16:
      return 1e-3;
    case DataType::kBFloat16:
      return 5e-3;
    default:
      return 0;
  }
}

/// Every slot, shuffled by a seed of this rank and step: a different order on every rank.
std::vector<Slot> shuffled_slots(std::size_t count, int rank, int step) {
  std::vector<Slot> slots;
  for (std::uint32_t i = 0; i < count; ++i) slots.push_back(Slot{i});
  std::mt19937 random(static_cast<unsigned>(1000 * rank + step + 17));
  std::shuffle(slots.begin(), slots.end(), random);
  return slots;
}

/// FNV-1a 64 of every allocation of the buffer: equal on every rank when the ranks hold the
/// same reduced values, bit for bit.
std::uint64_t buffer_hash(const Buffer& buffer) {
  std::uint64_t hash = ncclkit::detail::kFnvOffsetBasis;
  for (DataType type : buffer.layout().element_types()) {
    const auto all = buffer.all(type);
    hash = ncclkit::detail::fnv1a64(std::span(static_cast<const std::byte*>(all.data), all.bytes()), hash);
  }
  return hash;
}

/// Runs `steps` steps on `ranks` threads: write gradients, mark them in a shuffled order (a
/// different one on every rank), finish; rank 0 compares with the float64 reference and every
/// rank's result must equal rank 0's bit for bit. Also checks that events are made once, not
/// per step, and that every bucket launched before finish.
void check_synchronised(int ranks, const std::function<FusedLayout()>& make_layout, const BucketOptions& buckets,
                        int steps, ReduceOp op = ReduceOp::kAvg) {
  LoopbackWorld world(ranks);
  std::vector<std::string> failures(static_cast<std::size_t>(ranks));
  std::vector<std::vector<std::uint64_t>> hashes(static_cast<std::size_t>(ranks));
  const auto errors = run_ranks(ranks, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, make_layout());
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), buckets), {.op = op});
    const std::size_t events = backend.events_created();
    CHECK(events == sync.plan().size() + 1);
    for (int step = 0; step < steps; ++step) {
      write_gradients(buffer, rank, step);
      for (Slot slot : shuffled_slots(buffer.layout().size(), rank, step)) sync.mark_ready(slot);
      sync.finish();
      CHECK(sync.stats().launched_before_finish == sync.plan().size());
      hashes[static_cast<std::size_t>(rank)].push_back(buffer_hash(buffer));
      if (rank != 0) continue;
      const auto error = errors_against_reference(buffer, ranks, step, op);
      for (DataType type : buffer.layout().element_types()) {
        const double e = error[static_cast<std::size_t>(type)];
        if (!(e <= tolerance(type))) {
          failures[0] += "step " + std::to_string(step) + " " + std::string(ncclkit::name_of(type)) + ": error " +
                         std::to_string(e) + "; ";
        }
      }
    }
    CHECK(backend.events_created() == events);  // reused every step
    CHECK(sync.stats().steps == static_cast<std::size_t>(steps));
  });
  for (int r = 0; r < ranks; ++r) {
    CHECK(message_of(errors[static_cast<std::size_t>(r)]) == "");
    CHECK(hashes[static_cast<std::size_t>(r)] == hashes[0]);
  }
  CHECK(hashes[0].size() == static_cast<std::size_t>(steps));
  CHECK(failures[0] == "");
}

FusedLayout awkward_layout() {
  FusedLayout layout;
  layout.add("embedding", {300000, 4}, DataType::kFloat32);  // one huge tensor: 4.6 MiB
  layout.add("empty.first", {0}, DataType::kFloat32);
  for (int i = 0; i < 300; ++i) {
    const DataType type = i % 7 == 0    ? DataType::kBFloat16
                          : i % 11 == 0 ? DataType::kFloat16
                          : i % 13 == 0 ? DataType::kFloat64
                                        : DataType::kFloat32;
    layout.add("tiny." + std::to_string(i), {1 + i % 17}, type);
    if (i % 50 == 0) layout.add("empty." + std::to_string(i), {3, 0}, type);
  }
  layout.add("scalar", {}, DataType::kFloat32);
  layout.finalize();
  return layout;
}

FusedLayout scaled_gpt2() {
  FusedLayout layout;
  for (const auto& t : ncclkit::testing::read_model_shapes("gpt2_small")) {
    std::vector<std::int64_t> shape;
    for (std::int64_t extent : t.shape) shape.push_back((extent + 7) / 8);
    layout.add(t.name, shape, DataType::kFloat32);
  }
  layout.finalize();
  return layout;
}

/// Two tensors per bucket with tiny caps: a plan of several buckets.
FusedLayout small_layout(int tensors = 8, bool extra = false) {
  FusedLayout layout;
  for (int i = 0; i < tensors; ++i) layout.add("w" + std::to_string(i), {64}, DataType::kFloat32);
  if (extra) layout.add("extra", {1}, DataType::kFloat32);
  layout.finalize();
  return layout;
}
const BucketOptions kTwoPerBucket{.bucket_bytes = 512, .first_bucket_bytes = 512};

}  // namespace

TEST_CASE("bucketed all-reduce of hundreds of tiny tensors, a huge one, mixed types and empty ones matches float64") {
  check_synchronised(3, awkward_layout, BucketOptions{.bucket_bytes = 256 << 10, .first_bucket_bytes = 4 << 10}, 3);
}

TEST_CASE("sum instead of average") { check_synchronised(2, awkward_layout, BucketOptions{}, 1, ReduceOp::kSum); }

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
    CHECK(message_of(e).find("rank 1 uses other GradientSyncOptions than rank 0 (op sum, missing kError against op "
                             "avg, missing kError)") != std::string::npos);
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
