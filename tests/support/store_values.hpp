#pragma once
// Reproducible store values for tests.
#include <algorithm>  // std::min
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint64_t
#include <cstring>    // std::memcpy

#include "ncclkit/store/file_store.hpp"  // Bytes, detail::file_store::mix64

namespace ncclkit_test {

/// `size` pseudo-random bytes determined by `seed` (never all zeros).
inline ncclkit::Bytes random_bytes(std::size_t size, std::uint64_t seed) {
  ncclkit::Bytes out(size);
  std::uint64_t state = seed * 0x9e3779b97f4a7c15ULL + 1;
  for (std::size_t i = 0; i < size; i += 8) {
    state += 0x9e3779b97f4a7c15ULL;
    const std::uint64_t word = ncclkit::detail::file_store::mix64(state);
    std::memcpy(out.data() + i, &word, std::min<std::size_t>(8, size - i));
  }
  return out;
}

}  // namespace ncclkit_test
