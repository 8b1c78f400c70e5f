#pragma once
/// The one way byte counts appear in ncclkit's messages: the largest binary unit that keeps the
/// number at least 1, with two decimals ("512 B", "1.50 KiB", "64.00 MiB", "2.00 GiB").

#include <cstddef>  // std::size_t
#include <cstdio>   // std::snprintf
#include <string>   // std::string

namespace ncclkit {

inline std::string format_bytes(std::size_t bytes) {
  char text[48];
  if (bytes >= (std::size_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (std::size_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(text, sizeof text, "%.2f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof text, "%zu B", bytes);
  }
  return text;
}

}  // namespace ncclkit
