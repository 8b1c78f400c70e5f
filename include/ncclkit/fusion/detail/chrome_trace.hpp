#pragma once
/// The text of a Chrome trace (the JSON that Perfetto and chrome://tracing open) and writing it
/// to a file whole: what `Timeline` needs, apart from what it records.

#include <cerrno>       // errno
#include <cstdint>      // std::int64_t
#include <cstdio>       // std::FILE, std::fopen, std::fwrite, std::fclose, std::rename, std::remove
#include <cstring>      // std::strerror
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/core/error.hpp"

namespace ncclkit::fusion::detail {

/// Appends `text` as a JSON string, quotes included.
inline void append_json_string(std::string& out, std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (const char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (byte < 0x20) {
      out += "\\u00";
      out.push_back(kHex[byte >> 4]);
      out.push_back(kHex[byte & 0xf]);
    } else {
      out.push_back(c);
    }
  }
  out.push_back('"');
}

/// Appends a count of nanoseconds as microseconds with three decimals (the trace format's unit),
/// by integer arithmetic: exact, whatever the magnitude.
inline void append_microseconds(std::string& out, std::int64_t nanoseconds) {
  if (nanoseconds < 0) {
    out.push_back('-');
    nanoseconds = -nanoseconds;
  }
  out += std::to_string(nanoseconds / 1000);
  const auto fraction = std::to_string(1000 + nanoseconds % 1000);  // "1xyz": keeps leading zeros
  out.push_back('.');
  out.append(fraction, 1, 3);
}

/// Writes `text` to `path` whole: into `<path>.tmp`, then renamed over `path`, so that a reader
/// (or a crash) never sees half a file. ConfigError naming the path, the system's reason and
/// what to do when it cannot.
inline void write_file_whole(const std::string& path, std::string_view text, std::string_view what_to_do) {
  const std::string temporary = path + ".tmp";
  const auto fail = [&](const std::string& action) {
    const int error = errno;
    std::remove(temporary.c_str());
    return ConfigError("ncclkit: timeline: cannot " + action + " \"" + temporary + "\" (" + std::strerror(error) +
                       ") to write \"" + path + "\"; " + std::string(what_to_do));
  };
  std::FILE* file = std::fopen(temporary.c_str(), "wb");
  if (file == nullptr) throw fail("create");
  const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
  if (std::fclose(file) != 0 || !written) throw fail("write");
  if (std::rename(temporary.c_str(), path.c_str()) != 0) throw fail("rename");
}

}  // namespace ncclkit::fusion::detail
