#pragma once
/// How the knobs of core/knobs.hpp are parsed: one parser per kind of value, one sentence per
/// kind saying what is allowed, and one message for a value that is not. Every environment
/// variable ncclkit reads, and every options field a knob overrides, is checked here.

#include <chrono>       // std::chrono::milliseconds
#include <cstdint>      // std::int64_t
#include <cstdlib>      // std::strtod
#include <limits>       // std::numeric_limits
#include <optional>     // std::optional
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view

#include "ncclkit/core/env.hpp"  // parse_int, parse_timeout_seconds
#include "ncclkit/core/error.hpp"

namespace ncclkit {

/// What a knob's value is.
enum class KnobKind : std::uint8_t {
  kText,           ///< any text (a path, a host name, a token)
  kChoice,         ///< one word of the knob's `choices`
  kInteger,        ///< a whole number from `min` to `max`
  kPowerOfTwo,     ///< a power of two from `min` to `max`
  kSwitch,         ///< a whole number: 0 is off, any other on
  kSeconds,        ///< seconds > 0, fractions allowed, at most kMaxTimeoutSeconds
  kSecondsOrZero,  ///< seconds >= 0, fractions allowed; 0 is "none"
};

/// When the library reads a knob.
enum class KnobRead : std::uint8_t {
  kAtCreation,      ///< each time an object it configures is made (store, communicator, sync)
  kOncePerProcess,  ///< the first time it is needed; later changes to the variable are ignored
  kForTheProgram,   ///< set by ncclkit-run for the program to read; the library only writes it
};

namespace detail {

/// A knob's value as parsed: an integer (kInteger, kPowerOfTwo, kSwitch), a duration (kSeconds,
/// kSecondsOrZero) or text (kText, kChoice).
struct KnobValue {
  std::int64_t integer = 0;
  std::chrono::milliseconds duration{0};
  std::string text;
};

/// Whether `word` is one of the comma-separated `choices`.
constexpr bool is_choice(std::string_view choices, std::string_view word) {
  while (!choices.empty()) {
    const auto comma = choices.find(',');
    if (choices.substr(0, comma) == word) return true;
    if (comma == std::string_view::npos) break;
    choices.remove_prefix(comma + 1);
  }
  return false;
}

/// "an integer from 1 to 8", "one of: error, warn, info, debug", ...: what a knob of `kind`
/// takes, for messages and for docs/environment.md.
inline std::string allowed_values(KnobKind kind, std::int64_t min, std::int64_t max, std::string_view choices) {
  const auto bound = [](std::int64_t v) { return std::to_string(v); };
  switch (kind) {
    case KnobKind::kText:
      return "any text";
    case KnobKind::kChoice: {
      std::string list;
      for (char c : choices) list += c == ',' ? std::string(", ") : std::string(1, c);
      return "one of: " + list;
    }
    case KnobKind::kInteger:
      return max == std::numeric_limits<std::int64_t>::max() ? "an integer >= " + bound(min)
                                                             : "an integer from " + bound(min) + " to " + bound(max);
    case KnobKind::kPowerOfTwo:
      return "a power of two from " + bound(min) + " to " + bound(max);
    case KnobKind::kSwitch:
      return "an integer (0: off, another: on)";
    case KnobKind::kSeconds:
      return "a number of seconds > 0 (fractions allowed, at most 1e9)";
    case KnobKind::kSecondsOrZero:
      return "a number of seconds >= 0 (fractions allowed; 0: none)";
  }
  return "";
}

/// `text` parsed as a value of `kind`, or nullopt when it is not one (out of range included).
inline std::optional<KnobValue> parse_knob_value(KnobKind kind, std::int64_t min, std::int64_t max,
                                                 std::string_view choices, std::string_view text) {
  KnobValue value;
  switch (kind) {
    case KnobKind::kText:
      value.text = std::string(text);
      return value;
    case KnobKind::kChoice:
      if (!is_choice(choices, text)) return std::nullopt;
      value.text = std::string(text);
      return value;
    case KnobKind::kInteger:
    case KnobKind::kPowerOfTwo:
    case KnobKind::kSwitch: {
      const std::optional<std::int64_t> number = parse_int(text);
      if (!number) return std::nullopt;
      if (kind != KnobKind::kSwitch && (*number < min || *number > max)) return std::nullopt;
      if (kind == KnobKind::kPowerOfTwo && (*number <= 0 || (*number & (*number - 1)) != 0)) return std::nullopt;
      value.integer = *number;
      return value;
    }
    case KnobKind::kSeconds:
    case KnobKind::kSecondsOrZero: {
      const std::string number(text);
      char* end = nullptr;
      const double seconds = std::strtod(number.c_str(), &end);
      if (kind == KnobKind::kSecondsOrZero && end != number.c_str() && end == number.c_str() + number.size() &&
          seconds == 0) {
        return value;  // zero: none
      }
      const std::optional<std::chrono::milliseconds> duration = parse_timeout_seconds(text);
      if (!duration) return std::nullopt;
      value.duration = *duration;
      return value;
    }
  }
  return std::nullopt;
}

/// The one message for a value a knob cannot take, from the environment (`source` is the
/// variable's name) or from an options field (`source` is the field, e.g.
/// "nccl::Options::copy_chunk_kb"): what was given, what is allowed, what to do.
inline std::string bad_knob_value(std::string_view source, bool from_environment, std::string_view value,
                                  const std::string& allowed, std::string_view default_value) {
  if (from_environment) {
    return "environment variable " + std::string(source) + "='" + std::string(value) + "' is not " + allowed +
           "; set it to one, or unset it for the default (" + std::string(default_value) + ")";
  }
  return std::string(source) + " = " + std::string(value) + " is not " + allowed +
         "; give one, or leave the default (" + std::string(default_value) + ")";
}

}  // namespace detail
}  // namespace ncclkit
