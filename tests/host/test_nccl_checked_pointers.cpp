// CheckedPointers (ncclkit/nccl/detail/checked_pointers.hpp): the memory of buffer addresses
// that passed the NCCL communicator's pointer checks. Plain data, so it runs without a GPU;
// the GPU side (a host or freed buffer is still refused after good calls) is in
// tests/gpu/test_nccl_communicator.cu.
#include <doctest/doctest.h>

#include <algorithm>  // std::find
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint64_t, std::uintptr_t
#include <vector>     // std::vector

#include "ncclkit/nccl/detail/checked_pointers.hpp"

namespace {

using ncclkit::nccl::detail::CheckedPointers;
using ncclkit::nccl::detail::destroyed_stream_generation;
using ncclkit::nccl::detail::note_device_memory_freed;
using ncclkit::nccl::detail::note_stream_destroyed;

/// Distinct fake addresses (never dereferenced).
const void* address(std::size_t i) {
  static std::vector<char> storage(1024);
  return storage.data() + i;
}

}  // namespace

TEST_CASE("an address is remembered once inserted, and only then") {
  CheckedPointers memory;
  CHECK_FALSE(memory.contains(address(0)));
  memory.insert(address(0));
  CHECK(memory.contains(address(0)));
  CHECK_FALSE(memory.contains(address(1)));
  CHECK_FALSE(memory.contains(nullptr));
}

TEST_CASE("it holds the newest kSlots addresses; the oldest goes first") {
  CheckedPointers memory;
  const std::size_t n = CheckedPointers::kSlots;
  for (std::size_t i = 0; i < n; ++i) memory.insert(address(i));
  for (std::size_t i = 0; i < n; ++i) CHECK(memory.contains(address(i)));
  memory.insert(address(n));
  CHECK_FALSE(memory.contains(address(0)));
  for (std::size_t i = 1; i <= n; ++i) CHECK(memory.contains(address(i)));
  // A loop over more buffers than slots never hits, but never answers wrongly either.
  for (std::size_t round = 0; round < 3; ++round) {
    for (std::size_t i = 0; i < 2 * n; ++i) {
      const bool remembered = memory.contains(address(n + 1 + i));
      CHECK_FALSE(remembered);
      memory.insert(address(n + 1 + i));
    }
  }
}

TEST_CASE("memory freed through ncclkit empties every memory") {
  CheckedPointers first, second;
  first.insert(address(3));
  second.insert(address(4));
  note_device_memory_freed();
  CHECK_FALSE(first.contains(address(3)));
  CHECK_FALSE(second.contains(address(4)));
  // Remembering starts again after the free.
  first.insert(address(3));
  CHECK(first.contains(address(3)));
  first.clear();
  CHECK_FALSE(first.contains(address(3)));
}

TEST_CASE("a memory of streams forgets on a stream destroyed through ncclkit, not on a free") {
  CheckedPointers streams{destroyed_stream_generation()};
  CheckedPointers buffers;
  streams.insert(address(5));
  buffers.insert(address(6));
  note_device_memory_freed();  // buffers only
  CHECK(streams.contains(address(5)));
  CHECK_FALSE(buffers.contains(address(6)));
  buffers.insert(address(6));
  note_stream_destroyed();  // streams only
  CHECK_FALSE(streams.contains(address(5)));
  CHECK(buffers.contains(address(6)));
}

TEST_CASE("a trainer's loop over more buffers than the old 8 hits after its first pass") {
  CheckedPointers memory;
  const std::size_t buffers = 40;  // e.g. gradient buckets, each passed once per step
  for (std::size_t step = 0; step < 3; ++step) {
    for (std::size_t i = 0; i < buffers; ++i) {
      const bool remembered = memory.contains(address(i));
      CHECK(remembered == (step > 0));
      if (!remembered) memory.insert(address(i));
    }
  }
}

TEST_CASE("lookup, insert and eviction agree with a plain list, whatever the order of the calls") {
  // A reference model: the newest kSlots distinct addresses, oldest first.
  CheckedPointers memory;
  std::vector<const void*> model;
  std::uint64_t state = 12345;  // a fixed linear congruential sequence: deterministic
  auto next = [&] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::size_t>(state >> 33);
  };
  static std::vector<char> storage(4096);
  for (int call = 0; call < 20000; ++call) {
    // Addresses from a pool a little larger than the memory, some neighbours, some far apart.
    const std::size_t pick = next() % (CheckedPointers::kSlots + 24);
    const void* pointer = storage.data() + (pick % 2 == 0 ? pick : pick * 37 % 4096);
    const bool expected = std::find(model.begin(), model.end(), pointer) != model.end();
    REQUIRE(memory.contains(pointer) == expected);
    if (!expected) {
      memory.insert(pointer);
      model.push_back(pointer);
      if (model.size() > CheckedPointers::kSlots) model.erase(model.begin());
    }
    if (call % 997 == 0) {  // every address held answers, now and then
      for (const void* held : model) REQUIRE(memory.contains(held));
    }
  }
}

TEST_CASE("inserting an address held already, or null, changes nothing") {
  CheckedPointers memory;
  const std::size_t n = CheckedPointers::kSlots;
  memory.insert(nullptr);
  CHECK_FALSE(memory.contains(nullptr));
  for (std::size_t i = 0; i < n; ++i) memory.insert(address(i));
  memory.insert(address(0));  // held: not a second entry, and 0 stays the oldest
  memory.insert(address(n));  // so this one pushes out 0, and only 0
  CHECK_FALSE(memory.contains(address(0)));
  for (std::size_t i = 1; i <= n; ++i) CHECK(memory.contains(address(i)));
}

TEST_CASE("allocation-like addresses (2 MiB and 512 B apart) and a free while the memory is full") {
  // Only compared, never dereferenced: numbers shaped like device addresses.
  const auto device_address = [](std::uintptr_t base, std::uintptr_t stride, std::size_t i) {
    return reinterpret_cast<const void*>(base + stride * i);
  };
  for (const std::uintptr_t stride : {std::uintptr_t{2} << 20, std::uintptr_t{512}}) {
    CheckedPointers memory;
    const std::size_t n = CheckedPointers::kSlots;
    for (std::size_t i = 0; i < 3 * n; ++i) memory.insert(device_address(0x7f0000000000, stride, i));
    for (std::size_t i = 0; i < 3 * n; ++i) {
      CHECK(memory.contains(device_address(0x7f0000000000, stride, i)) == (i >= 2 * n));
    }
    note_device_memory_freed();
    for (std::size_t i = 2 * n; i < 3 * n; ++i) CHECK_FALSE(memory.contains(device_address(0x7f0000000000, stride, i)));
    memory.insert(device_address(0x7f0000000000, stride, 0));
    CHECK(memory.contains(device_address(0x7f0000000000, stride, 0)));
  }
}
