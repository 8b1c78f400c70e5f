// Tests of ncclkit/fusion/fused_buffer.hpp over the loopback backend: one allocation per element
// type, views at the layout's offsets (typed spans checked against the element type), empty
// views for zero-element tensors, RAII and moves.
#include <doctest/doctest.h>

#include <cstddef>  // std::byte
#include <string>   // std::string
#include <utility>  // std::move

#include "ncclkit/fusion/fused_buffer.hpp"
#include "support/loopback_backend.hpp"

using ncclkit::BFloat16;
using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::MemoryKind;
using ncclkit::fusion::FusedBuffer;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::Slot;
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;

namespace {

FusedLayout mixed_layout() {
  FusedLayout layout;
  layout.add("a", {10, 3}, DataType::kFloat32);
  layout.add("b", {7}, DataType::kBFloat16);
  layout.add("empty", {0, 5}, DataType::kFloat32);
  layout.add("c", {100}, DataType::kFloat32);
  layout.finalize();
  return layout;
}

}  // namespace

TEST_CASE("a fused buffer allocates once per element type and views sit at the layout's offsets") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  {
    FusedBuffer<LoopbackBackend> buffer(backend, mixed_layout());
    CHECK(backend.live_allocations() == 2);  // float32 and bfloat16
    const FusedLayout& layout = buffer.layout();
    for (const char* name : {"a", "c"}) {
      const Slot slot = layout.slot(name);
      const auto view = buffer.view(slot);
      CHECK(view.data == static_cast<std::byte*>(buffer.data(DataType::kFloat32)) + layout.offset_bytes(slot));
      CHECK(view.count == layout.count(slot));
      CHECK(view.dtype == DataType::kFloat32);
      CHECK(view.where == MemoryKind::kHost);
      CHECK(buffer.view(name).data == view.data);
      const auto span = buffer.span<float>(name);
      CHECK(static_cast<void*>(span.data()) == view.data);
      CHECK(span.size() == view.count);
    }
    CHECK(buffer.span<BFloat16>("b").size() == 7);
    CHECK(buffer.view("b").dtype == DataType::kBFloat16);

    const auto all = buffer.all(DataType::kFloat32);
    CHECK(all.data == buffer.data(DataType::kFloat32));
    CHECK(all.bytes() == layout.total_bytes(DataType::kFloat32));
    CHECK(buffer.all(DataType::kFloat64).empty());
    CHECK(buffer.data(DataType::kFloat64) == nullptr);

    // Writing through one view leaves the others alone: the ranges do not overlap.
    for (float& x : buffer.span<float>("a")) x = 1.f;
    for (float& x : buffer.span<float>("c")) x = 2.f;
    for (float x : buffer.span<float>("a")) CHECK(x == 1.f);
  }
  CHECK(backend.live_allocations() == 0);
}

TEST_CASE("a zero-element tensor gets an empty view") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  FusedBuffer<LoopbackBackend> buffer(backend, mixed_layout());
  const auto view = buffer.view("empty");
  CHECK(view.empty());
  CHECK(view.data == nullptr);
  CHECK(buffer.span<float>("empty").empty());
}

TEST_CASE("a typed span of the wrong element type, an unknown name or an unfinalized layout is a ConfigError") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  FusedBuffer<LoopbackBackend> buffer(backend, mixed_layout());
  CHECK_THROWS_WITH_AS(buffer.span<double>("a"), doctest::Contains("span<double>(\"a\"): the tensor holds float"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(buffer.span<float>("b"), doctest::Contains("the tensor holds bfloat16"), ConfigError);
  CHECK_THROWS_WITH_AS(buffer.view("nope"), doctest::Contains("\"nope\""), ConfigError);
  CHECK_THROWS_AS(buffer.view(Slot{99}), ConfigError);
  FusedLayout open;
  open.add("x", {1}, DataType::kFloat32);
  CHECK_THROWS_WITH_AS(FusedBuffer<LoopbackBackend>(backend, open), doctest::Contains("not finalized"), ConfigError);
}

TEST_CASE("a fused buffer moves its allocations and frees them once") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  FusedBuffer<LoopbackBackend> first(backend, mixed_layout());
  void* data = first.data(DataType::kFloat32);
  FusedBuffer<LoopbackBackend> second(std::move(first));
  CHECK(second.data(DataType::kFloat32) == data);
  FusedBuffer<LoopbackBackend> third(backend, mixed_layout());
  CHECK(backend.live_allocations() == 4);
  third = std::move(second);
  CHECK(backend.live_allocations() == 2);
  CHECK(third.data(DataType::kFloat32) == data);
}
