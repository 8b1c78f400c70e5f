#pragma once
/// Hashes and random ids of the FileStore: a seeded 64-bit hash (key file names, key lock
/// bytes) and 128-bit random run ids from the kernel's generator.

#include <sys/random.h>  // getrandom
#include <unistd.h>      // getpid

#include <algorithm>    // std::min
#include <cerrno>       // errno
#include <chrono>       // std::chrono::steady_clock (fallback entropy)
#include <cstdint>      // std::uint64_t, std::uintptr_t
#include <cstring>      // std::memcpy
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/core/detail/hex.hpp"  // hex64

namespace ncclkit::detail::file_store {

/// A 64-bit bijective mixer (the splitmix64 finaliser).
inline std::uint64_t mix64(std::uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

/// A seeded 64-bit hash of bytes. Not cryptographic: file names of long keys carry two of
/// these (128 bits) and the file repeats the key, so a collision is detected, never silent.
inline std::uint64_t hash64(std::string_view data, std::uint64_t seed) {
  std::uint64_t h = mix64(seed ^ (data.size() * 0x9e3779b97f4a7c15ULL));
  for (std::size_t i = 0; i < data.size(); i += 8) {
    std::uint64_t block = 0;
    std::memcpy(&block, data.data() + i, std::min<std::size_t>(8, data.size() - i));
    h = mix64(h ^ block) + 0x9e3779b97f4a7c15ULL;
  }
  return mix64(h);
}

/// 32 random hex digits from the kernel's generator.
inline std::string random_hex_id() {
  std::uint64_t words[2] = {0, 0};
  std::size_t got = 0;
  auto* bytes = reinterpret_cast<std::uint8_t*>(words);
  while (got < sizeof words) {
    ssize_t n = ::getrandom(bytes + got, sizeof words - got, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      // Never expected on Linux >= 3.17; fall back to time, pid and address entropy.
      words[0] ^= mix64(static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count()));
      words[1] ^= mix64(static_cast<std::uint64_t>(::getpid()) ^ reinterpret_cast<std::uintptr_t>(&got));
      break;
    }
    got += static_cast<std::size_t>(n);
  }
  return hex64(words[0]) + hex64(words[1]);
}

}  // namespace ncclkit::detail::file_store
