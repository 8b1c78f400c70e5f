#pragma once
/// Reading environment variables, with errors that name the variable. ncclkit's own variables
/// (prefix `NCCLKIT_`) are declared in core/knobs.hpp and read through it; these readers are
/// for the others (a launcher's, a test's own) and for the parsers the knobs share.

#include <algorithm>    // std::max
#include <chrono>       // std::chrono::milliseconds
#include <cmath>        // std::llround
#include <cstdint>      // std::int64_t
#include <cstdlib>      // std::getenv, std::strtod
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/core/detail/deadline.hpp"  // detail::kLongestTimeout
#include "ncclkit/core/error.hpp"

namespace ncclkit {

/// The variable's value, or nullopt when it is unset or empty.
inline std::optional<std::string> env_string(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr || *value == '\0') return std::nullopt;
  return std::string(value);
}

/// Parses a whole string as a decimal integer; nullopt when it is not one.
inline std::optional<std::int64_t> parse_int(std::string_view text) {
  if (text.empty()) return std::nullopt;
  std::size_t i = 0;
  bool negative = false;
  if (text[0] == '-' || text[0] == '+') {
    negative = text[0] == '-';
    i = 1;
  }
  if (i == text.size()) return std::nullopt;
  std::int64_t value = 0;
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (c < '0' || c > '9') return std::nullopt;
    if (value > (INT64_MAX - (c - '0')) / 10) return std::nullopt;  // overflow
    value = value * 10 + (c - '0');
  }
  return negative ? -value : value;
}

/// The variable as an integer; nullopt when unset. A value that is not an integer is a
/// ConfigError naming the variable and the value.
inline std::optional<std::int64_t> env_int(const char* name) {
  auto text = env_string(name);
  if (!text) return std::nullopt;
  auto value = parse_int(*text);
  if (!value) {
    throw ConfigError(std::string("environment variable ") + name + "='" + *text +
                      "' is not an integer; set it to a whole number or unset it");
  }
  return value;
}

/// The longest timeout ncclkit takes, in seconds: detail::kLongestTimeout (core/detail/deadline.hpp),
/// the one limit, in the unit that timeouts are written in.
inline constexpr double kMaxTimeoutSeconds = std::chrono::duration<double>(detail::kLongestTimeout).count();

/// A timeout written in seconds ("300", "2.5"), in whole milliseconds (rounded to nearest, and
/// at least 1 ms: never the 0 that means "the default"); nullopt unless it is a number > 0 and
/// at most kMaxTimeoutSeconds with nothing after it (leading blanks are skipped, as strtod does).
inline std::optional<std::chrono::milliseconds> parse_timeout_seconds(std::string_view text) {
  const std::string number(text);
  char* end = nullptr;
  const double seconds = std::strtod(number.c_str(), &end);
  if (end == number.c_str() || end != number.c_str() + number.size() || !(seconds > 0) ||
      seconds > kMaxTimeoutSeconds) {
    return std::nullopt;
  }
  return std::chrono::milliseconds(std::max<std::int64_t>(1, std::llround(seconds * 1000.0)));
}

/// A duration in seconds (fractions allowed, e.g. "2.5"); `fallback` when unset.
inline std::chrono::milliseconds env_seconds(const char* name, std::chrono::milliseconds fallback) {
  auto text = env_string(name);
  if (!text) return fallback;
  const auto timeout = parse_timeout_seconds(*text);
  if (!timeout) {
    throw ConfigError(std::string("environment variable ") + name + "='" + *text +
                      "' is not a positive number of seconds; set it like " + name + "=300");
  }
  return *timeout;
}

}  // namespace ncclkit
