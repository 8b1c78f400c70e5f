#pragma once
/// A 64-bit value as 16 lowercase hex digits: how ncclkit prints hashes and fingerprints in
/// messages and file names.

#include <cstdint>  // std::uint64_t
#include <cstdio>   // std::snprintf
#include <string>   // std::string

namespace ncclkit::detail {

inline std::string hex64(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(value));
  return text;
}

}  // namespace ncclkit::detail
