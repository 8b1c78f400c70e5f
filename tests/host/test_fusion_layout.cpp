// Tests of ncclkit/fusion/layout.hpp: offsets in reverse registration order, aligned and
// without overlap, one allocation per element type, zero-element tensors, the real shapes of
// ResNet-50 and GPT-2 small, and bad input named in the error.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <cstddef>  // std::size_t
#include <cstdint>  // std::int64_t
#include <limits>   // std::numeric_limits
#include <set>      // std::set
#include <string>   // std::string, std::to_string
#include <vector>   // std::vector

#include "ncclkit/fusion/layout.hpp"
#include "support/model_shapes.hpp"

using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::LayoutOptions;
using ncclkit::fusion::Slot;

namespace {

// Every slot: aligned, inside its type's allocation, not overlapping the next one; the
// per-type orders hold every slot exactly once, by increasing offset, in reverse registration order.
void check_aligned_without_overlap(const FusedLayout& layout) {
  std::set<std::uint32_t> seen;
  for (std::size_t t = 0; t < ncclkit::fusion::kDataTypeCount; ++t) {
    const auto type = static_cast<DataType>(t);
    const std::size_t align = layout.alignment_of(type);
    const std::size_t total = layout.total_bytes(type);
    CHECK(total % align == 0);
    std::size_t previous_end = 0;
    std::uint32_t previous_index = std::numeric_limits<std::uint32_t>::max();
    for (Slot slot : layout.order(type)) {
      INFO("tensor ", layout.name(slot));
      CHECK(layout.dtype(slot) == type);
      CHECK(seen.insert(slot.index).second);
      CHECK(slot.index < previous_index);  // reverse registration order
      previous_index = slot.index;
      const std::size_t offset = layout.offset_bytes(slot);
      CHECK(offset % align == 0);
      CHECK(offset >= previous_end);
      CHECK(layout.offset_elements(slot) * ncclkit::size_of(type) == offset);
      previous_end = offset + layout.bytes(slot);
      CHECK(previous_end <= total);
    }
    // No slack at the end beyond the alignment of the last tensor.
    CHECK(total == (previous_end + align - 1) / align * align);
  }
  CHECK(seen.size() == layout.size());
}

}  // namespace

TEST_CASE("tensors are laid out in reverse registration order, each at an aligned offset") {
  FusedLayout layout;
  const Slot a = layout.add("a", {3, 5}, DataType::kFloat32);  // 60 bytes
  const Slot b = layout.add("b", {64}, DataType::kFloat32);    // 256 bytes
  const Slot c = layout.add("c", {100}, DataType::kFloat32);   // 400 bytes
  CHECK(a.index == 0);
  CHECK(c.index == 2);
  layout.finalize();
  CHECK(layout.alignment() == 256);
  CHECK(layout.offset_bytes(c) == 0);
  CHECK(layout.offset_bytes(b) == 512);
  CHECK(layout.offset_bytes(a) == 768);
  CHECK(layout.offset_elements(a) == 192);
  CHECK(layout.total_bytes(DataType::kFloat32) == 1024);
  CHECK(layout.total_bytes(DataType::kFloat16) == 0);
  CHECK(layout.count(a) == 15);
  CHECK(layout.bytes(a) == 60);
  CHECK(std::vector<std::int64_t>(layout.shape(a).begin(), layout.shape(a).end()) == std::vector<std::int64_t>{3, 5});
  CHECK(layout.slot("b") == b);
  CHECK(layout.find("b") == b);
  CHECK_FALSE(layout.find("nope").has_value());
  CHECK(layout.name(c) == "c");
  check_aligned_without_overlap(layout);
}

TEST_CASE("each element type gets its own allocation, offsets from 0") {
  FusedLayout layout;
  std::vector<Slot> slots;
  const DataType types[] = {DataType::kFloat32, DataType::kFloat16, DataType::kInt64, DataType::kBFloat16};
  for (int i = 0; i < 20; ++i) {
    slots.push_back(layout.add("t" + std::to_string(i), {i * 37 + 1}, types[i % 4]));
  }
  layout.finalize();
  check_aligned_without_overlap(layout);
  CHECK(layout.element_types() ==
        std::vector<DataType>{DataType::kInt64, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32});
  for (DataType type : types) {
    REQUIRE(layout.order(type).size() == 5);
    CHECK(layout.offset_bytes(layout.order(type).front()) == 0);  // the last registered of the type
  }
  CHECK(layout.order(DataType::kFloat32).front() == slots[16]);
  CHECK(layout.order(DataType::kFloat16).front() == slots[17]);
  CHECK(layout.order(DataType::kInt8).empty());
}

TEST_CASE("the alignment is an option, raised to the element size where that is larger") {
  FusedLayout layout;
  const Slot a = layout.add("a", {3}, DataType::kFloat64);
  const Slot b = layout.add("b", {1}, DataType::kInt8);
  const Slot c = layout.add("c", {1}, DataType::kFloat64);
  const Slot d = layout.add("d", {5}, DataType::kInt8);
  layout.finalize(LayoutOptions{.alignment = 1});
  check_aligned_without_overlap(layout);
  CHECK(layout.alignment_of(DataType::kFloat64) == 8);
  CHECK(layout.alignment_of(DataType::kInt8) == 1);
  CHECK(layout.offset_bytes(c) == 0);
  CHECK(layout.offset_bytes(a) == 8);
  CHECK(layout.offset_bytes(d) == 0);
  CHECK(layout.offset_bytes(b) == 5);
  CHECK(layout.total_bytes(DataType::kInt8) == 6);

  FusedLayout wide;
  wide.add("x", {1}, DataType::kFloat32);
  wide.add("y", {1}, DataType::kFloat32);
  wide.finalize(LayoutOptions{.alignment = 4096});
  CHECK(wide.offset_bytes(wide.slot("x")) == 4096);
  CHECK(wide.total_bytes(DataType::kFloat32) == 8192);
}

TEST_CASE("zero-element tensors are allowed: an aligned offset, no bytes, nothing displaced") {
  FusedLayout layout;
  const Slot a = layout.add("a", {10}, DataType::kFloat32);
  const Slot empty1 = layout.add("empty1", {0}, DataType::kFloat32);
  const Slot empty2 = layout.add("empty2", {4, 0, 3}, DataType::kFloat32);
  const Slot b = layout.add("b", {10}, DataType::kFloat32);
  const Slot scalar = layout.add("scalar", {}, DataType::kFloat32);
  const Slot only_empty = layout.add("only_empty", {0}, DataType::kInt32);
  layout.finalize();
  check_aligned_without_overlap(layout);
  CHECK(layout.count(empty1) == 0);
  CHECK(layout.count(empty2) == 0);
  CHECK(layout.bytes(empty2) == 0);
  CHECK(layout.count(scalar) == 1);  // no extents: a scalar
  CHECK(layout.offset_bytes(scalar) == 0);
  CHECK(layout.offset_bytes(b) == 256);
  CHECK(layout.offset_bytes(empty2) == 512);
  CHECK(layout.offset_bytes(empty1) == 512);
  CHECK(layout.offset_bytes(a) == 512);
  CHECK(layout.total_bytes(DataType::kFloat32) == 768);
  CHECK(layout.offset_bytes(only_empty) == 0);
  CHECK(layout.total_bytes(DataType::kInt32) == 0);
}

TEST_CASE("hundreds of tiny tensors each take one aligned slot") {
  FusedLayout layout;
  for (int i = 0; i < 500; ++i) layout.add("tiny." + std::to_string(i), {1 + i % 7}, DataType::kFloat32);
  layout.finalize();
  check_aligned_without_overlap(layout);
  CHECK(layout.total_bytes(DataType::kFloat32) == 500 * 256);
  CHECK(layout.offset_bytes(Slot{499}) == 0);
  CHECK(layout.offset_bytes(Slot{0}) == 499 * 256);
}

TEST_CASE("one huge tensor among small ones") {
  FusedLayout layout;
  layout.add("small.0", {3}, DataType::kFloat32);
  const Slot huge = layout.add("huge", {50257, 768, 4}, DataType::kFloat32);
  layout.add("small.1", {3}, DataType::kFloat32);
  layout.finalize();
  check_aligned_without_overlap(layout);
  CHECK(layout.count(huge) == std::size_t{50257} * 768 * 4);
  CHECK(layout.offset_bytes(huge) == 256);
  CHECK(layout.total_bytes(DataType::kFloat32) == 256 + std::size_t{50257} * 768 * 16 + 256);
}

TEST_CASE("ResNet-50 and GPT-2 small: every parameter counted, aligned, without overlap") {
  struct Case {
    const char* model;
    std::size_t tensors;
    std::size_t parameters;
    std::size_t total_bytes;
  };
  for (const Case c :
       {Case{"resnet50", 161, 25'557'032, 102'228'224}, Case{"gpt2_small", 148, 124'439'808, 497'759'232}}) {
    INFO(c.model);
    const FusedLayout layout = ncclkit::testing::model_layout(c.model);
    CHECK(layout.size() == c.tensors);
    std::size_t parameters = 0;
    for (std::uint32_t i = 0; i < layout.size(); ++i) parameters += layout.count(Slot{i});
    CHECK(parameters == c.parameters);
    // Padding: at most 255 bytes per tensor (ResNet-50's 1000-element fc.bias, ...).
    CHECK(layout.total_bytes(DataType::kFloat32) == c.total_bytes);
    CHECK(layout.total_bytes(DataType::kFloat32) - parameters * 4 < c.tensors * 256);
    check_aligned_without_overlap(layout);
  }
}

TEST_CASE("bad registrations are refused with the tensor's name") {
  FusedLayout layout;
  layout.add("layer1.weight", {4, 4}, DataType::kFloat32);
  CHECK_THROWS_WITH_AS(layout.add("", {1}, DataType::kFloat32), doctest::Contains("needs a name"), ConfigError);
  CHECK_THROWS_WITH_AS(layout.add("layer1.weight", {1}, DataType::kFloat16),
                       doctest::Contains("\"layer1.weight\"): a tensor of that name is already registered (slot 0)"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(layout.add("neg", {3, -1}, DataType::kFloat32),
                       doctest::Contains("FusedLayout::add(\"neg\"): extent 1 is -1"), ConfigError);
  constexpr std::int64_t kBig = std::int64_t{1} << 40;
  CHECK_THROWS_WITH_AS(layout.add("too_many_elements", {kBig, kBig}, DataType::kInt8),
                       doctest::Contains("\"too_many_elements\"): the element count overflows"), ConfigError);
  CHECK_THROWS_WITH_AS(layout.add("too_many_bytes", {kBig, std::int64_t{1} << 22}, DataType::kFloat64),
                       doctest::Contains("\"too_many_bytes\"): 4611686018427387904 elements of double overflow"),
                       ConfigError);
  // Refused registrations leave nothing behind.
  CHECK(layout.size() == 1);
  CHECK_FALSE(layout.find("neg").has_value());
  layout.add("neg", {0, 5}, DataType::kFloat32);  // the name is still free; an extent of 0 is fine

  CHECK_THROWS_WITH_AS(layout.slot("layer2.weight"), doctest::Contains("no tensor is registered as \"layer2.weight\""),
                       ConfigError);
  CHECK_THROWS_WITH_AS(layout.name(Slot{7}), doctest::Contains("slot 7 is out of range (2 tensors"), ConfigError);
  CHECK_THROWS_WITH_AS(layout.offset_bytes(Slot{0}), doctest::Contains("only after finalize()"), ConfigError);
  CHECK_THROWS_WITH_AS(layout.total_bytes(DataType::kFloat32), doctest::Contains("only after finalize()"), ConfigError);
  CHECK_THROWS_WITH_AS(layout.finalize(LayoutOptions{.alignment = 96}), doctest::Contains("96 is not a power of two"),
                       ConfigError);
  CHECK_THROWS_AS(layout.finalize(LayoutOptions{.alignment = 0}), ConfigError);
  CHECK_FALSE(layout.finalized());
  layout.finalize();
  CHECK_THROWS_WITH_AS(layout.add("late", {1}, DataType::kFloat32),
                       doctest::Contains("FusedLayout::add(\"late\"): the layout is finalized"), ConfigError);
  CHECK_THROWS_WITH_AS(layout.finalize(), doctest::Contains("already finalized"), ConfigError);
}

TEST_CASE("an allocation whose total overflows is refused at finalize, naming the tensor") {
  FusedLayout layout;
  const auto half = static_cast<std::int64_t>(std::numeric_limits<std::size_t>::max() / 2);
  layout.add("first", {half}, DataType::kInt8);
  layout.add("second", {half}, DataType::kInt8);
  CHECK_THROWS_WITH_AS(layout.finalize(),
                       doctest::Contains("int8 allocation overflows std::size_t at tensor \"first\""), ConfigError);
  // A refused finalize leaves the layout as it was: still open, and without padding the two fit.
  CHECK_FALSE(layout.finalized());
  layout.finalize(LayoutOptions{.alignment = 1});
  CHECK(layout.order(DataType::kInt8).size() == 2);
  CHECK(layout.offset_bytes(layout.slot("first")) == static_cast<std::size_t>(half));
  CHECK(layout.total_bytes(DataType::kInt8) == std::numeric_limits<std::size_t>::max() - 1);
}
