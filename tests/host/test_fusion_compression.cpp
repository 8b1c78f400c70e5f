// Tests of gradient compression (ncclkit/compression/compressed.hpp, a GradientSync's reducer)
// and of loose tensors, ranks as threads over the loop-back backend: fp16 and bf16 results
// against float64 (N(0, 1e-3) gradients, shuffled per-rank orders, chunked buckets, 2 and 4
// ranks), values near the fp16 limit (non-finite results counted on every rank alike, or
// rerun in float32), loose tensors packed by one batched copy per bucket; and the pieces
// arithmetic, the host cast and the codec factors on their own.
#include <doctest/doctest.h>

#include <chrono>   // std::chrono::seconds
#include <cmath>    // std::isfinite, std::isnan
#include <cstring>  // std::memcpy
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <limits>   // std::numeric_limits
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/compression/codec.hpp"
#include "ncclkit/core/detail/cast.hpp"
#include "ncclkit/compression.hpp"
#include "ncclkit/compression/detail/pieces.hpp"
#include "ncclkit/core/detail/update_on_host.hpp"
#include "ncclkit/core/update.hpp"
#include "support/element_conversions.hpp"
#include "support/fusion_check.hpp"
#include "support/loopback_backend.hpp"

namespace compression_tests {

using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::Half;
using ncclkit::ReduceOp;
using ncclkit::TensorView;
using ncclkit::compression::Codec;
using ncclkit::fusion::BucketOptions;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::Slot;
using ncclkit::testing::Buffer;
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;
using ncclkit::testing::message_of;
using ncclkit::testing::run_ranks;
using ncclkit::testing::Sync;

const BucketOptions kSmallBuckets{.bucket_bytes = 256 << 10, .first_bucket_bytes = 16 << 10};

FusedLayout two_tensors(std::size_t count) {
  FusedLayout layout;
  layout.add("a", {static_cast<std::int64_t>(count)}, DataType::kFloat32);
  layout.add("b", {static_cast<std::int64_t>(count)}, DataType::kFloat32);
  layout.finalize();
  return layout;
}

}  // namespace compression_tests

using namespace compression_tests;

TEST_CASE("fp16 and bf16 compressed buckets match float64 within 1e-3 and 5e-3, chunked, at 2 and 4 ranks") {
  for (Codec codec : {Codec::kFloat16, Codec::kBFloat16}) {
    for (int ranks : {2, 4}) {
      CAPTURE(ranks);
      CAPTURE(ncclkit::compression::name_of(codec));
      // 48 KiB chunks: the huge tensor's buckets are cut into several.
      ncclkit::testing::check_synchronised(ranks, ncclkit::testing::awkward_layout, kSmallBuckets, 2,
                                           {.reducer = ncclkit::compression::compressed({.codec = codec, .chunk_bytes = 48 << 10})});
    }
  }
}

TEST_CASE("compressed sum, a user prescale, and GPT-2 shapes scaled down") {
  ncclkit::testing::check_synchronised(2, ncclkit::testing::awkward_layout, kSmallBuckets, 1,
                                       {.op = ReduceOp::kSum, .reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16})});
  ncclkit::testing::check_synchronised(3, ncclkit::testing::awkward_layout, kSmallBuckets, 1,
                                       {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .prescale = 0.25})});
  ncclkit::testing::check_synchronised(4, ncclkit::testing::scaled_gpt2,
                                       BucketOptions{.bucket_bytes = 1 << 20, .first_bucket_bytes = 64 << 10}, 1,
                                       {.reducer = ncclkit::compression::compressed({.codec = Codec::kBFloat16, .chunk_bytes = 256 << 10})});
}

TEST_CASE("a compressed step makes no events and no allocations after construction; encode and decode per chunk") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, two_tensors(4096));
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), {.bucket_bytes = 16 << 10, .first_bucket_bytes = 16 << 10}),
              {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .chunk_bytes = 8 << 10})});
    REQUIRE(sync.plan().size() == 2);
    // Two buckets of 4096 floats in 2048-float chunks, with a quarter-size first and last
    // chunk: 512, 1536, 1536, 512 each.
    CHECK(sync.stats().compressed_chunks == 8);
    const std::size_t events = backend.events_created();
    const long allocations = backend.live_allocations();
    const std::size_t casts = backend.casts();
    for (int step = 0; step < 3; ++step) {
      ncclkit::testing::write_gradients(buffer, rank, step);
      sync.mark_ready(Slot{1});
      sync.mark_ready(Slot{0});
      sync.finish();
    }
    CHECK(backend.events_created() == events);
    CHECK(backend.live_allocations() == allocations);
    CHECK(backend.casts() - casts == 3 * 2 * 8);  // per step: an encode and a decode per chunk
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("fp16 overflow is counted on every rank alike, not silent; the default prescale keeps a sum finite") {
  // Every rank gives 40000: the fp16 sum of two is 80000 > 65504 with prescale 1, while with
  // the default prescale (1/2) each is 20000 and the sum 40000 is finite. One NaN is counted too.
  for (const bool default_prescale : {false, true}) {
    CAPTURE(default_prescale);
    LoopbackWorld world(2);
    std::vector<std::uint64_t> counts(2);
    std::vector<float> results(2);
    const auto errors = run_ranks(2, [&](int rank) {
      LoopbackBackend backend(world, rank);
      Buffer buffer(backend, two_tensors(1000));
      ncclkit::compression::CompressionOptions compression{.codec = Codec::kFloat16};
      if (!default_prescale) compression.prescale = 1.0;
      const Sync::Options options{.reducer = ncclkit::compression::compressed(compression)};
      Sync sync(buffer, BucketPlan::compute(buffer.layout()), options);
      auto a = buffer.span<float>("a");
      auto b = buffer.span<float>("b");
      for (float& v : a) v = 1e-3f;
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = i < 10 ? 40000.0f : 1e-3f;
      if (rank == 1) a[7] = std::numeric_limits<float>::quiet_NaN();
      sync.mark_ready("a");
      sync.mark_ready("b");
      sync.finish();
      counts[static_cast<std::size_t>(rank)] = sync.nonfinite();
      results[static_cast<std::size_t>(rank)] = b[0];
      CHECK(std::isnan(a[7]));
    });
    for (const auto& e : errors) CHECK(message_of(e) == "");
    CHECK(counts[0] == counts[1]);
    CHECK(counts[0] == (default_prescale ? 1u : 11u));
    if (default_prescale) CHECK(results[0] == doctest::Approx(40000.0f).epsilon(1e-3));
    if (!default_prescale) CHECK(!std::isfinite(results[0]));
  }
}

TEST_CASE("rerun_nonfinite reduces an overflowing chunk again in float32 and gets the exact result") {
  LoopbackWorld world(2);
  std::vector<std::string> failures(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, two_tensors(2048));
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), {.bucket_bytes = 8 << 10, .first_bucket_bytes = 8 << 10}),
              {.op = ReduceOp::kSum, .reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .prescale = 1.0, .rerun_nonfinite = true})});
    REQUIRE(sync.plan().size() == 2);
    for (int step = 0; step < 2; ++step) {
      auto a = buffer.span<float>("a");
      auto b = buffer.span<float>("b");
      for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i % 8);
      for (std::size_t i = 0; i < b.size(); ++i) b[i] = 0.25f * static_cast<float>(i % 4);
      if (step == 1) b[5] = 60000.0f;  // 120000 in the sum: only b's chunk overflows
      sync.mark_ready("a");
      sync.mark_ready("b");
      sync.finish();
      // The rerun chunk counts its float32 result, which is finite.
      CHECK(sync.nonfinite() == 0);
      CHECK(sync.stats().rerun_chunks == (step == 1 ? 1u : 0u));
      for (std::size_t i = 0; i < b.size(); ++i) {
        const float expected = i == 5 && step == 1 ? 120000.0f : 0.5f * static_cast<float>(i % 4);
        if (b[i] != expected) {
          failures[static_cast<std::size_t>(rank)] = "b[" + std::to_string(i) + "] = " + std::to_string(b[i]);
          break;
        }
      }
      for (std::size_t i = 0; i < a.size(); ++i) {
        if (a[i] != static_cast<float>(i % 8)) failures[static_cast<std::size_t>(rank)] += " a";
      }
    }
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
  CHECK(failures[0] == "");
  CHECK(failures[1] == "");
}

TEST_CASE(
    "loose tensors are packed and unpacked by one batched copy per bucket, with and without a codec; "
    "one alone in its bucket is reduced in place") {
  for (Codec codec : {Codec::kNone, Codec::kFloat16}) {
    CAPTURE(ncclkit::compression::name_of(codec));
    LoopbackWorld world(3);
    std::vector<std::string> failures(3);
    const auto errors = run_ranks(3, [&](int rank) {
      LoopbackBackend backend(world, rank);
      Buffer staging(backend, ncclkit::testing::awkward_layout());
      const FusedLayout& layout = staging.layout();
      // Every third tensor lives in the buffer, a different third on each rank; the others are
      // the caller's own allocations.
      std::vector<std::vector<std::byte>> own(layout.size());
      std::vector<void*> loose(layout.size(), nullptr);
      for (std::uint32_t i = 0; i < layout.size(); ++i) {
        if ((i + static_cast<std::uint32_t>(rank)) % 3 == 0 || layout.count(Slot{i}) == 0) continue;
        own[i].resize(layout.bytes(Slot{i}));
        loose[i] = own[i].data();
      }
      Sync sync(staging, BucketPlan::compute(layout, kSmallBuckets), loose, {.reducer = ncclkit::compression::compressed({.codec = codec})});
      for (int step = 0; step < 2; ++step) {
        // Write the gradients where the caller keeps them.
        for (std::uint32_t i = 0; i < layout.size(); ++i) {
          const Slot slot{i};
          ncclkit::visit_data_type(layout.dtype(slot), [&]<class T>() {
            T* data = loose[i] != nullptr ? static_cast<T*>(loose[i]) : staging.span<T>(slot).data();
            for (std::size_t e = 0; e < layout.count(slot); ++e) {
              data[e] = ncclkit_test::from_double<T>(ncclkit::testing::gradient(rank, step, i, e));
            }
          });
        }
        const std::size_t batches = backend.copy_batches();
        for (Slot slot : ncclkit::testing::shuffled_slots(layout.size(), rank, step)) sync.mark_ready(slot);
        sync.finish();
        std::size_t packed = 0;
        std::size_t in_place = 0;
        for (const auto& bucket : sync.plan().buckets()) {
          const bool encoded = codec != Codec::kNone && bucket.dtype == DataType::kFloat32;
          if (bucket.slots.size() == 1 && loose[bucket.slots[0].index] != nullptr && !encoded) {
            ++in_place;
            continue;
          }
          for (Slot slot : bucket.slots) {
            if (loose[slot.index] != nullptr) {
              ++packed;
              break;
            }
          }
        }
        CHECK(backend.copy_batches() - batches == 2 * packed);
        // "embedding" has a bucket of its own; it lives in the buffer on rank 0 only, so the
        // ranks reduce it in place and staged alike.
        if (codec == Codec::kNone) CHECK(in_place == (loose[0] != nullptr ? 1u : 0u));
        // Copy the results into the staging buffer's views, then compare as the other tests do.
        for (std::uint32_t i = 0; i < layout.size(); ++i) {
          if (loose[i] != nullptr) std::memcpy(staging.view(Slot{i}).data, loose[i], layout.bytes(Slot{i}));
        }
        if (rank != 0) continue;
        const auto error = ncclkit::testing::errors_against_reference(staging, 3, step, ReduceOp::kAvg);
        for (DataType type : layout.element_types()) {
          if (!(error[static_cast<std::size_t>(type)] <= ncclkit::testing::tolerance(type, codec))) {
            failures[0] +=
                std::string(ncclkit::name_of(type)) + " " + std::to_string(error[static_cast<std::size_t>(type)]);
          }
        }
      }
    });
    for (const auto& e : errors) CHECK(message_of(e) == "");
    CHECK(failures[0] == "");
  }
}

TEST_CASE("fused transfer: one compressed reduction per chunk, no separate casts, results within tolerance") {
  for (Codec codec : {Codec::kFloat16, Codec::kBFloat16}) {
    for (int ranks : {2, 4}) {
      CAPTURE(ranks);
      CAPTURE(ncclkit::compression::name_of(codec));
      ncclkit::testing::check_synchronised(ranks, ncclkit::testing::awkward_layout, kSmallBuckets, 2,
                                           {.reducer = ncclkit::compression::compressed({.codec = codec, .chunk_bytes = 48 << 10})}, /*fused=*/true);
    }
  }
  ncclkit::testing::check_synchronised(2, ncclkit::testing::awkward_layout, kSmallBuckets, 1,
                                       {.op = ReduceOp::kSum, .reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16})}, /*fused=*/true);
  // Turned off, or with rerun_nonfinite: the separate casts, although the backend could.
  ncclkit::testing::check_synchronised(2, ncclkit::testing::awkward_layout, kSmallBuckets, 1,
                                       {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .fused_transfer = false})}, /*fused=*/true);
  ncclkit::testing::check_synchronised(2, ncclkit::testing::awkward_layout, kSmallBuckets, 1,
                                       {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .rerun_nonfinite = true})}, /*fused=*/true);

  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    backend.allow_compressed_reduce(true);
    Buffer buffer(backend, two_tensors(4096));
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), {.bucket_bytes = 16 << 10, .first_bucket_bytes = 16 << 10}),
              {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .chunk_bytes = 8 << 10})});
    REQUIRE(ncclkit::testing::runs_fused(sync));
    CHECK(backend.compressed_reduces_prepared() == 1);
    const std::size_t events = backend.events_created();
    const long allocations = backend.live_allocations();
    for (int step = 0; step < 3; ++step) {
      ncclkit::testing::write_gradients(buffer, rank, step);
      sync.mark_ready(Slot{1});
      sync.mark_ready(Slot{0});
      sync.finish();
    }
    CHECK(backend.compressed_reduces() == 3 * 8);  // one per chunk and step
    CHECK(backend.casts() == 0);                   // no encode or decode of GradientSync's own
    CHECK(backend.events_created() == events);
    CHECK(backend.live_allocations() == allocations);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("fused transfer: a layout aligned to less than 16 bytes runs the separate casts") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    backend.allow_compressed_reduce(true);
    FusedLayout layout;
    layout.add("a", {3}, DataType::kFloat32);  // 12, 20 and 28 bytes: whatever their order, the
    layout.add("b", {5}, DataType::kFloat32);  // second tensor starts off a 16-byte boundary
    layout.add("c", {7}, DataType::kFloat32);
    layout.finalize({.alignment = 4});
    Buffer buffer(backend, std::move(layout));
    // One bucket per tensor.
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), {.bucket_bytes = 4, .first_bucket_bytes = 4}),
              {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16})});
    CHECK(sync.plan().size() == 3);
    CHECK(!ncclkit::testing::runs_fused(sync));
    CHECK(backend.compressed_reduces_prepared() == 0);
    for (const char* name : {"a", "b", "c"}) {
      for (float& v : buffer.span<float>(name)) v = 0.5f;
      sync.mark_ready(name);
    }
    sync.finish();
    for (const char* name : {"a", "b", "c"}) CHECK(buffer.span<float>(name)[2] == 0.5f);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("fused transfer counts fp16 overflow on every rank alike") {
  LoopbackWorld world(2);
  std::vector<std::uint64_t> counts(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    backend.allow_compressed_reduce(true);
    Buffer buffer(backend, two_tensors(1000));
    Sync sync(buffer, BucketPlan::compute(buffer.layout()), {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .prescale = 1.0})});
    REQUIRE(ncclkit::testing::runs_fused(sync));
    auto b = buffer.span<float>("b");
    for (float& v : buffer.span<float>("a")) v = 1e-3f;
    for (std::size_t i = 0; i < b.size(); ++i) b[i] = i < 10 ? 40000.0f : 1e-3f;
    for (int step = 0; step < 2; ++step) {  // the counts start from zero every step
      sync.mark_ready("a");
      sync.mark_ready("b");
      sync.finish();
      counts[static_cast<std::size_t>(rank)] = sync.nonfinite();
      for (std::size_t i = 0; i < 10; ++i) b[i] = 40000.0f;
    }
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
  CHECK(counts[0] == 10);
  CHECK(counts[1] == 10);
}

// The fused reducer applying an optimizer update where a float32 bucket lands (the seam's
// can_update and set_update, driven here on the sync's own reducer): parameters and momentum get
// the bits of reducing and then updating, through every chunk of a chunked bucket (the last one
// clipped at the tensor's end, the padding after it untouched); the gradients keep this rank's
// own values; the update is forgotten at the step's end; a float16 bucket cannot take one, nor an
// update without the values or the state its rule keeps.
TEST_CASE("fused transfer applies an optimizer update where a float32 bucket lands: the bits of reduce, then update") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    backend.allow_compressed_reduce(true);
    FusedLayout layout;
    layout.add("w", {1001}, DataType::kFloat32);
    layout.add("b", {37}, DataType::kFloat32);
    layout.add("h", {50}, DataType::kFloat16);
    layout.finalize();
    Buffer buffer(backend, layout);
    // 1 KiB caps: "w" and "b" get a bucket each; 1 KiB chunks cut "w" (1024 elements with its
    // padding) into 4 pieces, the last reaching past the tensor's 1001 elements.
    Sync sync(buffer, BucketPlan::compute(buffer.layout(), {.bucket_bytes = 1024, .first_bucket_bytes = 1024}),
              {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .chunk_bytes = 1024})});
    REQUIRE(ncclkit::testing::runs_fused(sync));
    auto& reducer = const_cast<ncclkit::fusion::BucketReducer<LoopbackBackend>&>(sync.reducer());
    const Slot w = layout.slot("w"), b = layout.slot("b"), h = layout.slot("h");
    const std::size_t bucket_w = *sync.plan().bucket_of(w), bucket_b = *sync.plan().bucket_of(b),
                      bucket_h = *sync.plan().bucket_of(h);
    REQUIRE(bucket_w != bucket_b);
    CHECK(reducer.pieces().size() == 6);
    CHECK(reducer.can_update(bucket_w));
    CHECK(reducer.can_update(bucket_b));
    CHECK_FALSE(reducer.can_update(bucket_h));
    float unused[4] = {};
    CHECK_THROWS_WITH_AS(reducer.set_update(bucket_h, {.values = unused}), doctest::Contains("holds half values"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(reducer.set_update(bucket_w, {}), doctest::Contains("no values"), ConfigError);
    // The state the rule keeps: momentum's buffer, AdamW's two.
    CHECK_THROWS_WITH_AS(reducer.set_update(bucket_w, {.rule = {.momentum = 0.9f}, .values = unused}),
                         doctest::Contains("update has no state0; give the parameters it writes and the 1 state"),
                         ConfigError);
    CHECK_THROWS_WITH_AS(
        reducer.set_update(bucket_w,
                           {.rule = {.kind = ncclkit::UpdateRule::Kind::kAdamW}, .values = unused, .state0 = unused}),
        doctest::Contains("update has no state1"), ConfigError);

    const auto step = [&] {
      ncclkit::testing::write_gradients(buffer, rank, 0);  // the same gradients every step
      for (Slot slot : ncclkit::testing::shuffled_slots(layout.size(), rank, 0)) sync.mark_ready(slot);
      sync.finish();
    };
    const auto floats = [&](Slot slot) {
      const auto values = buffer.span<float>(slot);
      return std::vector<float>(values.begin(), values.end());
    };
    const auto view = [](std::vector<float>& v) {
      return TensorView{v.data(), v.size(), DataType::kFloat32, LoopbackBackend::memory_kind};
    };
    // Without an update: the reduced gradients, the reference's input.
    step();
    std::vector<float> reduced_w = floats(w), reduced_b = floats(b);
    const auto h_reduced = buffer.span<Half>(h);
    const std::vector<Half> reduced_h(h_reduced.begin(), h_reduced.end());
    const std::vector<float> own_w = [&] {
      std::vector<float> v(1001);
      for (std::size_t e = 0; e < v.size(); ++e) {
        v[e] = static_cast<float>(ncclkit::testing::gradient(rank, 0, w.index, e));
      }
      return v;
    }();

    // SGD with momentum, weight decay and Nesterov, past its first step (the buffer is blended).
    const ncclkit::UpdateRule rule{.lr = 0.1f, .weight_decay = 0.01f, .momentum = 0.9f, .nesterov = true};
    const auto start = [](std::size_t n, float from) {
      std::vector<float> v(n);
      for (std::size_t e = 0; e < n; ++e) v[e] = from - 1e-3f * static_cast<float>(e % 97);
      return v;
    };
    std::vector<float> param_w = start(1001, 0.5f), momentum_w = start(1001, 0.01f), param_b = start(37, -0.25f),
                       momentum_b = start(37, 0.02f);
    std::vector<float> want_param_w = param_w, want_momentum_w = momentum_w, want_param_b = param_b,
                       want_momentum_b = momentum_b;
    const TensorView none{};
    ncclkit::detail::update_on_host(rule, view(want_param_w), view(reduced_w), view(want_momentum_w), none);
    ncclkit::detail::update_on_host(rule, view(want_param_b), view(reduced_b), view(want_momentum_b), none);

    // With the update: one per float32 piece, the parameters and momentum updated, the
    // gradients left as this rank wrote them, the float16 bucket reduced as before.
    reducer.set_update(bucket_w, {rule, param_w.data(), momentum_w.data(), nullptr});
    reducer.set_update(bucket_b, {rule, param_b.data(), momentum_b.data(), nullptr});
    const std::size_t applied = backend.updates_applied();
    step();
    CHECK(backend.updates_applied() - applied == 5);
    CHECK(param_w == want_param_w);
    CHECK(momentum_w == want_momentum_w);
    CHECK(param_b == want_param_b);
    CHECK(momentum_b == want_momentum_b);
    CHECK(floats(w) == own_w);
    CHECK(std::memcmp(buffer.span<Half>(h).data(), reduced_h.data(), reduced_h.size() * sizeof(Half)) == 0);

    // The next step has none: the reduced gradients again, the parameters untouched.
    step();
    CHECK(backend.updates_applied() - applied == 5);
    CHECK(param_w == want_param_w);
    CHECK(floats(w) == reduced_w);
    CHECK(floats(b) == reduced_b);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("only the fused kernel applies an update: the separate casts, the float32 rerun and all_reduce cannot") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  backend.allow_compressed_reduce(true);
  Buffer buffer(backend, two_tensors(1024));
  float unused[4] = {};
  const std::vector<ncclkit::fusion::ReducerChoice<LoopbackBackend>> reducers = {
      ncclkit::compression::compressed({.codec = Codec::kFloat16, .fused_transfer = false}),
      ncclkit::compression::compressed({.codec = Codec::kFloat16, .rerun_nonfinite = true}), nullptr};
  for (const auto& reducer : reducers) {
    Sync sync(buffer, BucketPlan::compute(buffer.layout()), {.reducer = reducer});
    CAPTURE(sync.reducer().name());
    CHECK_FALSE(sync.reducer().can_update(0));
    auto& seam = const_cast<ncclkit::fusion::BucketReducer<LoopbackBackend>&>(sync.reducer());
    CHECK_THROWS_WITH_AS(seam.set_update(0, {.values = unused}), doctest::Contains("can_update"), ConfigError);
  }
}

TEST_CASE("ranks that differ in fused_transfer get a ConfigError naming it, before any window is made") {
  LoopbackWorld world(2, std::chrono::seconds(5));
  std::vector<std::size_t> prepared(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    backend.allow_compressed_reduce(true);
    Buffer buffer(backend, two_tensors(100));
    try {
      Sync sync(buffer, BucketPlan::compute(buffer.layout()), {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .fused_transfer = rank == 0})});
    } catch (...) {
      prepared[static_cast<std::size_t>(rank)] = backend.compressed_reduces_prepared();
      throw;
    }
  });
  for (const auto& e : errors) CHECK(message_of(e).find("fused_transfer off against") != std::string::npos);
  CHECK(prepared[0] == 0);
  CHECK(prepared[1] == 0);
}

TEST_CASE("ranks with different codecs or chunk sizes get a ConfigError naming them, on every rank") {
  LoopbackWorld world(2, std::chrono::seconds(5));
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    Buffer buffer(backend, two_tensors(100));
    Sync sync(buffer, BucketPlan::compute(buffer.layout()),
              {.reducer = ncclkit::compression::compressed({.codec = rank == 0 ? Codec::kFloat16 : Codec::kBFloat16, .chunk_bytes = rank == 0 ? 0u : 4096u})});
  });
  for (const auto& e : errors) {
    CHECK(message_of(e).find("codec bf16, chunk_bytes 4096") != std::string::npos);
    CHECK(message_of(e).find("against op avg, missing kError, codec fp16, chunk_bytes 0") != std::string::npos);
  }
}

TEST_CASE("bad compression options and loose pointers are ConfigErrors that say what to do") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  Buffer buffer(backend, two_tensors(100));
  const BucketPlan plan = BucketPlan::compute(buffer.layout());
  CHECK_THROWS_WITH_AS(Sync(buffer, plan, {.reducer = ncclkit::compression::compressed({.codec = ncclkit::compression::Codec::kNone, .rerun_nonfinite = true})}),
                       doctest::Contains("rerun_nonfinite needs a codec"), ConfigError);
  CHECK_THROWS_WITH_AS(Sync(buffer, plan, {.reducer = ncclkit::compression::compressed({.codec = static_cast<Codec>(7)})}), doctest::Contains("invalid codec value 7"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(
      Sync(buffer, plan, {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .prescale = -1.0})}),
      doctest::Contains("prescale must be a positive number whose encode and decode factors fit in a float"),
      ConfigError);
  CHECK_THROWS_WITH_AS(Sync(buffer, plan, {.reducer = ncclkit::compression::compressed({.codec = Codec::kFloat16, .prescale = 1e39})}),
                       doctest::Contains("factors fit in a float (1/world is the default), not 9.99"), ConfigError);
  std::vector<void*> one(1, nullptr);
  CHECK_THROWS_WITH_AS(Sync(buffer, plan, one), doctest::Contains("1 loose pointers for 2 tensors; give one per slot"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(ncclkit::compression::codec_named("fp8"), doctest::Contains("use none, fp16 or bf16"),
                       ConfigError);
  CHECK(ncclkit::compression::codec_named("bf16") == Codec::kBFloat16);
}

TEST_CASE(
    "pieces: compressed buckets are cut into aligned chunks that tile them; others stay whole, "
    "a bucket of one tensor without its padding") {
  FusedLayout layout;
  layout.add("big", {100000}, DataType::kFloat32);
  layout.add("half", {1000}, DataType::kFloat16);
  layout.add("small", {10}, DataType::kFloat32);
  layout.finalize();
  const BucketPlan plan = BucketPlan::compute(layout, {.bucket_bytes = 1 << 20, .first_bucket_bytes = 1 << 20});
  const auto pieces = ncclkit::compression::detail::cut_pieces(plan, true, DataType::kFloat16, 64 << 10);
  REQUIRE(pieces.first.size() == plan.size() + 1);
  std::size_t wire_end = 0;
  for (std::size_t b = 0; b < plan.size(); ++b) {
    const auto& bucket = plan[b];
    std::size_t covered = 0;
    for (std::size_t i = pieces.first[b]; i < pieces.first[b + 1]; ++i) {
      const auto& piece = pieces.pieces[i];
      CHECK(piece.bucket == b);
      CHECK(piece.begin_bytes == bucket.begin_bytes + covered * ncclkit::size_of(bucket.dtype));
      CHECK(piece.encoded == (bucket.dtype == DataType::kFloat32));
      if (piece.encoded) {
        CHECK(piece.count * 4 <= (64u << 10) + 1024);
        CHECK(piece.wire_begin_bytes % ncclkit::compression::detail::kWireAlignment == 0);
        CHECK(piece.wire_begin_bytes >= wire_end);
        wire_end = piece.wire_begin_bytes + piece.count * 2;
        if (i + 1 < pieces.first[b + 1]) CHECK(piece.count % ncclkit::compression::detail::kPieceElements == 0);
      }
      covered += piece.count;
    }
    // A plain bucket of one tensor stops at the tensor's end ("half": 1000 of 1024 elements).
    const bool plain_one = bucket.dtype != DataType::kFloat32 && bucket.slots.size() == 1;
    CHECK(covered == (plain_one ? plan.count(bucket.slots[0]) : bucket.count()));
  }
  CHECK(pieces.wire_bytes >= wire_end);
  // The first and last chunks of a chunked bucket are small: the pipeline fills and drains fast.
  std::size_t floats = plan.size();
  for (std::size_t b = 0; b < plan.size(); ++b) {
    if (plan[b].dtype == DataType::kFloat32) floats = b;
  }
  REQUIRE(floats < plan.size());
  const std::size_t first = pieces.first[floats];
  const std::size_t last = pieces.first[floats + 1] - 1;
  REQUIRE(last - first >= 2);
  CHECK(pieces.pieces[first].count * 4 <= (16u << 10));
  CHECK(pieces.pieces[last].count * 4 <= (16u << 10) + 1024);
  CHECK(pieces.pieces[first + 1].count * 4 > (32u << 10));
  const auto plain = ncclkit::compression::detail::cut_pieces(plan, false, DataType::kFloat16, 64 << 10);
  CHECK(plain.pieces.size() == plan.size());
  CHECK(plain.encoded == 0);
}

TEST_CASE("host cast: scale and round in one pass, count non-finite outputs; bad views are named") {
  std::vector<float> in{1.0f, -2.5f, 70000.0f, 1e-8f, std::numeric_limits<float>::infinity(), 3.0f};
  std::vector<Half> out(in.size());
  const auto from = TensorView::of(std::span<float>(in));
  const auto to = TensorView::of(std::span<Half>(out));
  CHECK(ncclkit::detail::cast_problem(from, to) == "");
  CHECK(ncclkit::detail::cast_on_host(from, to, 0.5) == 1);  // 35000 fits; inf does not
  CHECK(static_cast<float>(out[0]) == 0.5f);
  CHECK(static_cast<float>(out[1]) == -1.25f);
  CHECK(static_cast<float>(out[2]) == 35008.0f);             // nearest half of 35000
  CHECK(ncclkit::detail::cast_on_host(from, to, 1.0) == 2);  // 70000 overflows now
  std::vector<float> back(in.size());
  CHECK(ncclkit::detail::cast_on_host(to, TensorView::of(std::span<float>(back)), 2.0) == 2);
  CHECK(back[0] == 2.0f);
  std::vector<int> ints(in.size());
  CHECK(ncclkit::detail::cast_problem(from, TensorView::of(std::span<int>(ints))).find("floating types") !=
        std::string::npos);
  CHECK(ncclkit::detail::cast_problem(from, TensorView{out.data(), 2, DataType::kFloat16}).find("as many outputs") !=
        std::string::npos);
  CHECK(ncclkit::detail::cast_problem(from, TensorView{in.data() + 1, 6, DataType::kFloat16}).find("overlap") !=
        std::string::npos);
  CHECK(ncclkit::detail::cast_problem(from, TensorView{in.data(), 6, DataType::kFloat16}).find("in place needs one") !=
        std::string::npos);
}

TEST_CASE("codec factors: average with the default prescale decodes by 1; sum decodes by the world") {
  const auto avg = ncclkit::compression::factors(4, true);
  CHECK(avg.encode == 0.25);
  CHECK(avg.decode == doctest::Approx(1.0));
  const auto sum = ncclkit::compression::factors(4, false);
  CHECK(sum.decode == doctest::Approx(4.0));
  const auto user = ncclkit::compression::factors(8, true, 0.5);
  CHECK(user.decode == doctest::Approx(0.25));
}

TEST_CASE("chunk bounds: aligned cuts, no chunk longer than the cap, quarter-size ends") {
  using ncclkit::compression::detail::chunk_bounds;
  using ncclkit::compression::detail::kPieceElements;
  for (std::size_t count : {100u, 1000u, 10000u, 123457u}) {
    for (std::size_t per : {1u, 300u, 1000u, 4096u, 50000u}) {
      CAPTURE(count);
      CAPTURE(per);
      const auto bounds = chunk_bounds(count, per);
      REQUIRE(bounds.size() >= 2);
      CHECK(bounds.front() == 0);
      CHECK(bounds.back() == count);
      const std::size_t cap = per < kPieceElements ? kPieceElements : per / kPieceElements * kPieceElements;
      for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
        CHECK(bounds[i] < bounds[i + 1]);
        if (i + 1 < bounds.size() - 1) CHECK(bounds[i + 1] % kPieceElements == 0);
        if (bounds.size() > 2) CHECK(bounds[i + 1] - bounds[i] <= cap);
      }
    }
  }
  CHECK(chunk_bounds(5000, 0) == std::vector<std::size_t>{0, 5000});
}
