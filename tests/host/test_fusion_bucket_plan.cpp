// Tests of ncclkit/fusion/bucket_plan.hpp: buckets that tile each allocation within the caps,
// launch order, whole tensors, the bucket counts of ResNet-50 and GPT-2 small, a fingerprint
// pinned to an independent computation, and serialise/parse with malformed input refused.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <cstddef>   // std::byte, std::size_t
#include <cstdint>   // std::uint8_t, std::uint32_t, std::uint64_t
#include <optional>  // std::optional
#include <random>    // std::mt19937_64
#include <set>       // std::set
#include <string>    // std::string, std::to_string
#include <vector>    // std::vector

#include "ncclkit/fusion/bucket_plan.hpp"
#include "support/model_shapes.hpp"

using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::fusion::Bucket;
using ncclkit::fusion::BucketOptions;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::LayoutOptions;
using ncclkit::fusion::Slot;

namespace {

constexpr std::size_t kMiB = std::size_t{1} << 20;

std::vector<std::uint32_t> indices(const Bucket& bucket) {
  std::vector<std::uint32_t> out;
  for (Slot s : bucket.slots) out.push_back(s.index);
  return out;
}

// What every plan must be: per element type, buckets that tile [0, total) in launch order at
// tensor boundaries, each holding exactly the non-empty tensors of its range; every non-empty
// tensor in one bucket, zero-element ones in none; buckets ordered by the position of their
// last tensor in reverse registration order. With `options`, also the caps: a bucket over its
// cap holds a single tensor, or was under min_bucket_bytes before its last tensor joined.
void check_plan(const FusedLayout& layout, const BucketPlan& plan, std::optional<BucketOptions> options = {}) {
  std::vector<std::size_t> covered(ncclkit::fusion::kDataTypeCount, 0);
  std::vector<std::size_t> buckets_of_type(ncclkit::fusion::kDataTypeCount, 0);
  std::set<std::uint32_t> seen;
  std::uint32_t previous_last = layout.size();
  for (std::size_t b = 0; b < plan.size(); ++b) {
    const Bucket& bucket = plan[b];
    INFO("bucket ", b);
    const auto t = static_cast<std::size_t>(bucket.dtype);
    CHECK(bucket.begin_bytes == covered[t]);
    CHECK(bucket.end_bytes > bucket.begin_bytes);
    CHECK(bucket.begin_bytes % layout.alignment_of(bucket.dtype) == 0);
    CHECK(bucket.end_bytes % layout.alignment_of(bucket.dtype) == 0);
    CHECK(bucket.begin_elements() * ncclkit::size_of(bucket.dtype) == bucket.begin_bytes);
    CHECK(bucket.count() * ncclkit::size_of(bucket.dtype) == bucket.bytes());
    covered[t] = bucket.end_bytes;
    REQUIRE_FALSE(bucket.slots.empty());
    std::vector<Slot> expected;
    for (Slot s : layout.order(bucket.dtype)) {
      if (layout.count(s) != 0 && layout.offset_bytes(s) >= bucket.begin_bytes &&
          layout.offset_bytes(s) < bucket.end_bytes) {
        expected.push_back(s);
        CHECK(layout.offset_bytes(s) + layout.bytes(s) <= bucket.end_bytes);  // whole tensors
      }
    }
    CHECK(bucket.slots == expected);
    for (Slot s : bucket.slots) {
      CHECK(seen.insert(s.index).second);
      CHECK(plan.bucket_of(s) == b);
    }
    // Completion order: the last tensor of each bucket (lowest slot index) comes later in
    // backward order than the previous bucket's.
    CHECK(bucket.slots.back().index < previous_last);
    previous_last = bucket.slots.back().index;
    if (options) {
      const std::size_t cap = buckets_of_type[t] == 0 ? options->first_bucket_bytes : options->bucket_bytes;
      if (bucket.bytes() > cap && bucket.slots.size() > 1) {
        CHECK(layout.offset_bytes(bucket.slots.back()) - bucket.begin_bytes < options->min_bucket_bytes);
      }
    }
    ++buckets_of_type[t];
  }
  for (std::size_t t = 0; t < ncclkit::fusion::kDataTypeCount; ++t) {
    CHECK(covered[t] == layout.total_bytes(static_cast<DataType>(t)));
  }
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    if (layout.count(Slot{i}) == 0)
      CHECK_FALSE(plan.bucket_of(Slot{i}).has_value());
    else
      CHECK(seen.count(i) == 1);
  }
}

FusedLayout float_layout(const std::vector<std::int64_t>& counts, LayoutOptions options = {}) {
  FusedLayout layout;
  for (std::size_t i = 0; i < counts.size(); ++i) layout.add("t" + std::to_string(i), {counts[i]}, DataType::kFloat32);
  layout.finalize(options);
  return layout;
}

}  // namespace

TEST_CASE("the defaults are DDP's: 25 MiB buckets, a 1 MiB first bucket") {
  CHECK(BucketOptions{}.bucket_bytes == 25 * kMiB);
  CHECK(BucketOptions{}.first_bucket_bytes == 1 * kMiB);
}

TEST_CASE("buckets are cut in reverse registration order within the caps, a big tensor alone") {
  // Bytes 256, 1000, 512, 3000, 256, 768 (aligned: 256, 1024, 512, 3072, 256, 768).
  const FusedLayout layout = float_layout({64, 250, 128, 750, 64, 192});
  const BucketOptions options{.bucket_bytes = 2048, .first_bucket_bytes = 1024};
  const BucketPlan plan = BucketPlan::compute(layout, options);
  check_plan(layout, plan, options);
  REQUIRE(plan.size() == 3);
  CHECK(indices(plan[0]) == std::vector<std::uint32_t>{5, 4});  // the first bucket: exactly its 1024 bytes
  CHECK(plan[0].begin_bytes == 0);
  CHECK(plan[0].end_bytes == 1024);
  CHECK(indices(plan[1]) == std::vector<std::uint32_t>{3});  // 3072 bytes > 2048: a bucket of its own
  CHECK(plan[1].begin_bytes == 1024);
  CHECK(plan[1].end_bytes == 4096);
  CHECK(indices(plan[2]) == std::vector<std::uint32_t>{2, 1, 0});
  CHECK(plan[2].begin_bytes == 4096);
  CHECK(plan[2].end_bytes == 5888);
  CHECK(plan[2].begin_elements() == 1024);
  CHECK(plan[2].count() == 448);
  CHECK(plan.bucket_of(Slot{3}) == 1u);
  CHECK(plan.tensor_count() == 6);
  CHECK(plan.name(Slot{3}) == "t3");
  CHECK(plan.count(Slot{3}) == 750);
  CHECK(plan.describe().find("3 buckets, float: ") == 0);
}

TEST_CASE("one huge tensor gets its own bucket and never holds its neighbours") {
  const FusedLayout layout = float_layout({10, 10, 50257 * 768, 10, 10});
  const BucketPlan plan = BucketPlan::compute(layout);
  check_plan(layout, plan, BucketOptions{});
  REQUIRE(plan.size() == 3);
  CHECK(indices(plan[0]) == std::vector<std::uint32_t>{4, 3});
  CHECK(indices(plan[1]) == std::vector<std::uint32_t>{2});
  CHECK(plan[1].bytes() == std::size_t{50257} * 768 * 4);
  CHECK(indices(plan[2]) == std::vector<std::uint32_t>{1, 0});
}

TEST_CASE("min_bucket_bytes: a bucket under it takes in the next tensor, so a bias shares its weight's collective") {
  // Registered w0, b0, w1, b1 (3072 and 256 bytes once aligned); backward order b1, w1, b0, w0,
  // each bias marked with its weight.
  const FusedLayout layout = float_layout({750, 10, 750, 10});
  BucketOptions options{.bucket_bytes = 2048, .first_bucket_bytes = 1024};
  SUBCASE("off (0, the default): every weight over the cap closes the bias before it, which goes alone") {
    const BucketPlan plan = BucketPlan::compute(layout, options);
    check_plan(layout, plan, options);
    REQUIRE(plan.size() == 4);
    CHECK(indices(plan[0]) == std::vector<std::uint32_t>{3});
    CHECK(indices(plan[1]) == std::vector<std::uint32_t>{2});
    CHECK(indices(plan[2]) == std::vector<std::uint32_t>{1});
    CHECK(indices(plan[3]) == std::vector<std::uint32_t>{0});
  }
  SUBCASE("512 bytes: each 256-byte bias takes its weight in; a full bucket still closes") {
    options.min_bucket_bytes = 512;
    const BucketPlan plan = BucketPlan::compute(layout, options);
    check_plan(layout, plan, options);
    REQUIRE(plan.size() == 2);
    CHECK(indices(plan[0]) == std::vector<std::uint32_t>{3, 2});
    CHECK(plan[0].bytes() == 3328);
    CHECK(indices(plan[1]) == std::vector<std::uint32_t>{1, 0});
  }
  SUBCASE("the bias is not held for a later tensor: at 256 bytes the bias bucket is full enough and closes") {
    options.min_bucket_bytes = 256;
    CHECK(BucketPlan::compute(layout, options).size() == 4);
  }
  SUBCASE("larger than the cap: a bucket grows past the cap until it holds that much") {
    options.min_bucket_bytes = 4096;
    const BucketPlan plan = BucketPlan::compute(layout, options);
    check_plan(layout, plan, options);
    REQUIRE(plan.size() == 1);  // b1, w1, b0 hold 3584 bytes, under 4096: w0 joins too
    CHECK(indices(plan[0]) == std::vector<std::uint32_t>{3, 2, 1, 0});
  }
}

TEST_CASE("hundreds of tiny tensors fill buckets to the cap") {
  const FusedLayout layout = float_layout(std::vector<std::int64_t>(600, 10));  // 256 bytes each once aligned
  const BucketOptions options{.bucket_bytes = 4096, .first_bucket_bytes = 1024};
  const BucketPlan plan = BucketPlan::compute(layout, options);
  check_plan(layout, plan, options);
  REQUIRE(plan.size() == 39);  // 4, then 37 of 16, then the last 4
  CHECK(plan[0].slots.size() == 4);
  for (std::size_t b = 1; b < 38; ++b) CHECK(plan[b].slots.size() == 16);
  CHECK(plan[38].slots.size() == 4);
  // With the defaults all 600 fit the 1 MiB first bucket: one collective.
  CHECK(BucketPlan::compute(layout).size() == 1);
}

TEST_CASE("mixed element types: buckets of one type each, ordered by when they complete") {
  FusedLayout layout;
  layout.add("a", {64}, DataType::kFloat32);
  layout.add("b", {128}, DataType::kFloat16);
  layout.add("c", {64}, DataType::kFloat32);
  layout.add("d", {128}, DataType::kFloat16);
  layout.add("e", {64}, DataType::kFloat32);
  layout.add("f", {3}, DataType::kInt64);
  layout.finalize();
  const BucketOptions options{.bucket_bytes = 512, .first_bucket_bytes = 256};
  const BucketPlan plan = BucketPlan::compute(layout, options);
  check_plan(layout, plan, options);
  // Backward order: f, e, d, c, b, a. int64 {f} completes first, then float {e} (the first
  // float bucket is full), half {d}, half {b}, and float {c, a} last.
  REQUIRE(plan.size() == 5);
  CHECK(plan[0].dtype == DataType::kInt64);
  CHECK(plan[1].dtype == DataType::kFloat32);
  CHECK(indices(plan[1]) == std::vector<std::uint32_t>{4});
  CHECK(plan[2].dtype == DataType::kFloat16);
  CHECK(indices(plan[2]) == std::vector<std::uint32_t>{3});
  CHECK(plan[3].dtype == DataType::kFloat16);
  CHECK(indices(plan[3]) == std::vector<std::uint32_t>{1});
  CHECK(plan[3].begin_bytes == 256);
  CHECK(plan[4].dtype == DataType::kFloat32);
  CHECK(indices(plan[4]) == std::vector<std::uint32_t>{2, 0});
  CHECK(plan[4].begin_bytes == 256);
  CHECK(plan[4].end_bytes == 768);
}

TEST_CASE("zero-element tensors belong to no bucket and never split one") {
  FusedLayout layout;
  layout.add("a", {64}, DataType::kFloat32);
  layout.add("empty", {0}, DataType::kFloat32);
  layout.add("b", {64}, DataType::kFloat32);
  layout.add("empty_half", {2, 0}, DataType::kFloat16);
  layout.finalize();
  const BucketPlan plan = BucketPlan::compute(layout);
  check_plan(layout, plan, BucketOptions{});
  REQUIRE(plan.size() == 1);
  CHECK(indices(plan[0]) == std::vector<std::uint32_t>{2, 0});
  CHECK_FALSE(plan.bucket_of(layout.slot("empty")).has_value());
  CHECK_FALSE(plan.bucket_of(layout.slot("empty_half")).has_value());

  FusedLayout only_empty;
  only_empty.add("x", {0}, DataType::kFloat32);
  only_empty.finalize();
  CHECK(BucketPlan::compute(only_empty).size() == 0);
  FusedLayout nothing;
  nothing.finalize();
  const BucketPlan empty_plan = BucketPlan::compute(nothing);
  CHECK(empty_plan.size() == 0);
  CHECK(BucketPlan::parse(empty_plan.serialize(), nothing) == empty_plan);
}

TEST_CASE("ResNet-50 and GPT-2 small with the default caps") {
  const BucketOptions defaults;
  SUBCASE("ResNet-50: 6 buckets, the first only fc.bias (fc.weight alone is 7.8 MiB)") {
    const FusedLayout layout = ncclkit::testing::model_layout("resnet50");
    const BucketPlan plan = BucketPlan::compute(layout);
    check_plan(layout, plan, defaults);
    CHECK(plan.size() == 6);
    for (std::size_t b = 0; b < plan.size(); ++b) CHECK(plan[b].bytes() <= (b == 0 ? 1 : 25) * kMiB);
    REQUIRE(plan[0].slots.size() == 1);
    CHECK(plan.name(plan[0].slots[0]) == "fc.bias");
    CHECK(plan.name(plan[1].slots[0]) == "fc.weight");
    CHECK(plan[5].slots.back() == layout.slot("conv1.weight"));
  }
  SUBCASE("GPT-2 small: 18 buckets, the token embedding (147 MiB) alone and last") {
    const FusedLayout layout = ncclkit::testing::model_layout("gpt2_small");
    const BucketPlan plan = BucketPlan::compute(layout);
    check_plan(layout, plan, defaults);
    CHECK(plan.size() == 18);
    for (std::size_t b = 0; b + 1 < plan.size(); ++b) CHECK(plan[b].bytes() <= (b == 0 ? 1 : 25) * kMiB);
    REQUIRE(plan[17].slots.size() == 1);
    CHECK(plan.name(plan[17].slots[0]) == "wte.weight");
    CHECK(plan[17].bytes() == std::size_t{50257} * 768 * 4);
    CHECK(plan.describe().find("18 buckets, float: 474.7 MiB in 18 (0.0 to 147.2 MiB), fingerprint ") == 0);
  }
}

TEST_CASE("bad plan options are refused") {
  FusedLayout open;
  open.add("a", {1}, DataType::kFloat32);
  CHECK_THROWS_WITH_AS(BucketPlan::compute(open), doctest::Contains("not finalized"), ConfigError);
  open.finalize();
  CHECK_THROWS_WITH_AS(BucketPlan::compute(open, BucketOptions{.bucket_bytes = 0}),
                       doctest::Contains("at least 1 byte"), ConfigError);
  CHECK_THROWS_AS(BucketPlan::compute(open, BucketOptions{.first_bucket_bytes = 0}), ConfigError);
  CHECK_THROWS_WITH_AS(BucketPlan::compute(open).bucket_of(Slot{1}), doctest::Contains("slot 1 is out of range"),
                       ConfigError);
}

TEST_CASE("the encoding and fingerprint are pinned: the same bytes on every platform") {
  // Bytes and FNV-1a 64 computed independently (Python's struct.pack('<...')), not by this code.
  FusedLayout layout;
  layout.add("w", {2}, DataType::kFloat32);
  layout.add("b", {1}, DataType::kFloat16);
  layout.finalize();
  const BucketPlan plan = BucketPlan::compute(layout);
  const std::vector<std::uint8_t> expected = {
      0x4e, 0x4b, 0x42, 0x50, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
      0x01, 0x00, 0x00, 0x00, 0x77, 0x08, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00,
      0x00, 0x62, 0x06, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x06, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0x00,
      0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00};
  std::vector<std::uint8_t> bytes;
  for (std::byte b : plan.serialize()) bytes.push_back(static_cast<std::uint8_t>(b));
  CHECK(bytes == expected);
  CHECK(plan.fingerprint() == 0x7007e7055a821148ull);
}

TEST_CASE("fingerprints: equal for equal plans, different when a boundary, name, type or count differs") {
  const auto model = ncclkit::testing::read_model_shapes("resnet50");
  const auto build = [&](auto&& change, LayoutOptions layout_options = {}) {
    FusedLayout layout;
    for (std::size_t i = 0; i < model.size(); ++i) {
      std::string name = model[i].name;
      std::vector<std::int64_t> shape = model[i].shape;
      DataType type = DataType::kFloat32;
      change(i, name, shape, type);
      layout.add(name, shape, type);
    }
    layout.finalize(layout_options);
    return layout;
  };
  const auto same = [](std::size_t, std::string&, std::vector<std::int64_t>&, DataType&) {};
  const FusedLayout reference = build(same);
  const std::uint64_t fingerprint = BucketPlan::compute(reference).fingerprint();
  CHECK(BucketPlan::compute(build(same)).fingerprint() == fingerprint);  // built again, independently
  CHECK(BucketPlan::compute(build(same)) == BucketPlan::compute(reference));

  std::set<std::uint64_t> fingerprints{fingerprint};
  // A boundary: caps that move one bucket edge.
  CHECK(fingerprints.insert(BucketPlan::compute(reference, BucketOptions{.bucket_bytes = 24 * kMiB}).fingerprint())
            .second);
  CHECK(fingerprints.insert(BucketPlan::compute(reference, BucketOptions{.first_bucket_bytes = 8 * kMiB}).fingerprint())
            .second);
  // A name, a type, a count (same bytes once aligned), the alignment.
  CHECK(fingerprints
            .insert(BucketPlan::compute(build([](std::size_t i, std::string& name, auto&, auto&) {
                      if (i == 80) name += "_";
                    })).fingerprint())
            .second);
  CHECK(fingerprints
            .insert(BucketPlan::compute(build([](std::size_t i, auto&, auto&, DataType& type) {
                      if (i == 2) type = DataType::kInt32;  // bn1.bias: same size
                    })).fingerprint())
            .second);
  CHECK(fingerprints
            .insert(BucketPlan::compute(build([](std::size_t i, auto&, std::vector<std::int64_t>& shape, auto&) {
                      if (i == 2) shape = {63};  // 252 bytes: same aligned slot
                    })).fingerprint())
            .second);
  CHECK(fingerprints.insert(BucketPlan::compute(build(same, LayoutOptions{.alignment = 128})).fingerprint()).second);
}

TEST_CASE("serialize and parse: rank 0's plan is adopted by a rank with the same layout") {
  const FusedLayout layout = ncclkit::testing::model_layout("gpt2_small");
  const BucketPlan local = BucketPlan::compute(layout);
  const BucketPlan parsed = BucketPlan::parse(local.serialize(), layout);
  CHECK(parsed == local);
  CHECK(parsed.fingerprint() == local.fingerprint());
  check_plan(layout, parsed, BucketOptions{});
  // Rank 0 chose other caps (say, tuned): the others take its boundaries, not their own.
  const BucketPlan rank0 =
      BucketPlan::compute(layout, BucketOptions{.bucket_bytes = 8 * kMiB, .first_bucket_bytes = 64 << 10});
  const BucketPlan adopted = BucketPlan::parse(rank0.serialize(), layout);
  CHECK(adopted == rank0);
  CHECK_FALSE(adopted == local);
  check_plan(layout, adopted);
  CHECK(adopted.bucket_of(layout.slot("h.5.mlp.c_fc.weight")) == rank0.bucket_of(layout.slot("h.5.mlp.c_fc.weight")));
}

TEST_CASE("parse refuses malformed bytes and a different layout, saying what differs") {
  FusedLayout layout;
  layout.add("w", {2}, DataType::kFloat32);
  layout.add("b", {1}, DataType::kFloat16);
  layout.add("v", {64}, DataType::kFloat32);
  layout.finalize();
  const BucketPlan plan = BucketPlan::compute(layout, BucketOptions{.bucket_bytes = 256, .first_bucket_bytes = 256});
  REQUIRE(plan.size() == 3);  // float {v}, half {b}, float {w}
  const std::vector<std::byte> good = plan.serialize();
  const auto parse = [&](const std::vector<std::byte>& bytes) { return BucketPlan::parse(bytes, layout); };
  const auto with = [&](std::size_t at, std::uint8_t value) {
    std::vector<std::byte> bytes = good;
    bytes.at(at) = static_cast<std::byte>(value);
    return bytes;
  };
  // Offsets: header 17 bytes, tensors of 14 ("w" @17, "b" @31, "v" @45), bucket count @59,
  // buckets of 17 (type @63, begin @64, end @72; then @80, @97).
  CHECK_THROWS_WITH_AS(parse({}), doctest::Contains("truncated: magic needs 4 bytes at byte 0, 0 left"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(0, 'X')), doctest::Contains("not a serialized BucketPlan"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(4, 2)), doctest::Contains("version 2 is not the 1"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(6, 2)), doctest::Contains("aligns tensors at 512 bytes, this layout at 256"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(13, 4)), doctest::Contains("the plan has 4 tensors, this layout 3"), ConfigError);
  CHECK_THROWS_WITH_AS(
      parse(with(35, 'c')),
      doctest::Contains("the plan has \"c\" (half, 1 elements) where this layout has \"b\" (half, 1 elements)"),
      ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(36, 9)),
                       doctest::Contains("\"b\" (double, 1 elements) where this layout has \"b\" (half"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(36, 77)), doctest::Contains("\"b\" (type 77"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(37, 9)), doctest::Contains("(half, 9 elements)"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(59, 0xff)), doctest::Contains("more buckets than the bytes hold"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(59, 2)), doctest::Contains("17 bytes follow the last bucket"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(63, 42)), doctest::Contains("element type 42 is unknown"), ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(63, 2)),
                       doctest::Contains("int32 bytes [0, 256) is empty or runs past the allocation (0 bytes)"),
                       ConfigError);
  std::vector<std::byte> inside = with(72, 0x80);  // the first bucket's end: 256 -> 128, inside tensor v
  inside.at(73) = std::byte{0};
  CHECK_THROWS_WITH_AS(parse(inside), doctest::Contains("float bytes [0, 128) does not end where a tensor ends"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(parse(with(64, 0x80)),
                       doctest::Contains("does not start where the previous float bucket ended (0)"), ConfigError);
  std::vector<std::byte> dropped(good.begin(), good.end() - 17);  // the last bucket left out
  dropped.at(59) = std::byte{2};
  CHECK_THROWS_WITH_AS(parse(dropped), doctest::Contains("the float buckets cover 256 of the allocation's 512 bytes"),
                       ConfigError);
  std::vector<std::byte> longer = good;
  longer.push_back(std::byte{0});
  CHECK_THROWS_WITH_AS(parse(longer), doctest::Contains("1 bytes follow the last bucket"), ConfigError);
  FusedLayout open;
  CHECK_THROWS_WITH_AS(BucketPlan::parse(good, open), doctest::Contains("not finalized"), ConfigError);
  CHECK(parse(good) == plan);
}

TEST_CASE("parse never crashes: every truncation and thousands of random byte flips") {
  const FusedLayout layout = ncclkit::testing::model_layout("resnet50");
  const std::vector<std::byte> good = BucketPlan::compute(layout).serialize();
  for (std::size_t size = 0; size < good.size(); ++size) {
    CHECK_THROWS_AS(BucketPlan::parse(std::span(good.data(), size), layout), ConfigError);
  }
  std::mt19937_64 random(19);
  std::size_t accepted = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::byte> bytes = good;
    const int flips = 1 + static_cast<int>(random() % 3);
    for (int f = 0; f < flips; ++f) bytes[random() % bytes.size()] ^= static_cast<std::byte>(1 + random() % 255);
    try {
      const BucketPlan plan = BucketPlan::parse(bytes, layout);
      check_plan(layout, plan);  // whatever is accepted is a valid plan for this layout
      ++accepted;
    } catch (const ConfigError&) {
    }
  }
  MESSAGE(accepted, " of 3000 mutated encodings were valid plans");
}
