// CheckedPointers (ncclkit/nccl/detail/checked_pointers.hpp): the memory of buffer addresses
// that passed the NCCL communicator's pointer checks. Plain data, so it runs without a GPU;
// the GPU side (a host or freed buffer is still refused after good calls) is in
// tests/gpu/test_nccl_communicator.cu.
#include <doctest/doctest.h>

#include <cstddef>  // std::size_t
#include <vector>   // std::vector

#include "ncclkit/nccl/detail/checked_pointers.hpp"

namespace {

using ncclkit::nccl::detail::CheckedPointers;
using ncclkit::nccl::detail::destroyed_stream_generation;
using ncclkit::nccl::detail::note_device_memory_freed;
using ncclkit::nccl::detail::note_stream_destroyed;

/// Distinct fake addresses (never dereferenced).
const void* address(std::size_t i) {
  static std::vector<char> storage(64);
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
      const bool remembered = memory.contains(address(20 + i));
      CHECK_FALSE(remembered);
      memory.insert(address(20 + i));
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
