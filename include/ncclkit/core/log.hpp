#pragma once
/// Rank-prefixed logging to stderr. One write(2) per line, so lines of concurrent processes and
/// threads never interleave mid-line. Level from NCCLKIT_LOG_LEVEL (error, warn, info, debug;
/// default warn), read once per process.

#include <unistd.h>  // write, getpid

#include <atomic>       // std::atomic
#include <cstdio>       // std::snprintf
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/knobs.hpp"

namespace ncclkit {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

namespace detail {
inline std::atomic<int>& log_rank_slot() {
  static std::atomic<int> rank{-1};
  return rank;
}
/// The level NCCLKIT_LOG_LEVEL asks for, read once per process. A value it cannot take leaves
/// the default in force and is kept in `problem`: logging runs in destructors, which must not
/// throw, so the ConfigError is raised by check_log_level() where one can be thrown.
struct LogLevelSetting {
  LogLevel level = LogLevel::kWarn;
  std::string problem;
};
inline const LogLevelSetting& log_level_setting() {
  static const LogLevelSetting setting = [] {
    LogLevelSetting result;
    try {
      const auto text = knob_text(knob("NCCLKIT_LOG_LEVEL"));
      if (!text) return result;
      if (*text == "error") result.level = LogLevel::kError;
      if (*text == "info") result.level = LogLevel::kInfo;
      if (*text == "debug") result.level = LogLevel::kDebug;
    } catch (const ConfigError& e) {
      result.problem = e.what();
    }
    return result;
  }();
  return setting;
}
/// ConfigError when NCCLKIT_LOG_LEVEL has a value it cannot take. Every store's constructor
/// calls it, so a job that meets its peers learns of the mistake at once.
inline void check_log_level() {
  if (!log_level_setting().problem.empty()) throw ConfigError(log_level_setting().problem);
}
inline std::atomic<int>& log_level_slot() {
  static std::atomic<int> level{static_cast<int>(log_level_setting().level)};
  return level;
}
}  // namespace detail

/// Sets the rank shown in front of every log line of this process (-1: none).
inline void set_log_rank(int rank) { detail::log_rank_slot().store(rank); }
/// Overrides NCCLKIT_LOG_LEVEL for this process.
inline void set_log_level(LogLevel level) { detail::log_level_slot().store(static_cast<int>(level)); }
/// Whether a message of `level` would be printed.
inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= detail::log_level_slot().load(std::memory_order_relaxed);
}

/// Prints "[ncclkit rank R LEVEL] message" as one line on stderr when `level` is enabled.
inline void log(LogLevel level, std::string_view message) {
  if (!log_enabled(level)) return;
  static constexpr const char* kNames[] = {"error", "warn", "info", "debug"};
  char prefix[64];
  int rank = detail::log_rank_slot().load(std::memory_order_relaxed);
  int n = rank >= 0
              ? std::snprintf(prefix, sizeof prefix, "[ncclkit rank %d %s] ", rank, kNames[static_cast<int>(level)])
              : std::snprintf(prefix, sizeof prefix, "[ncclkit pid %d %s] ", static_cast<int>(::getpid()),
                              kNames[static_cast<int>(level)]);
  std::string line(prefix, static_cast<std::size_t>(n));
  line.append(message);
  line.push_back('\n');
  const char* data = line.data();
  std::size_t left = line.size();
  while (left > 0) {
    ssize_t written = ::write(2, data, left);
    if (written <= 0) return;  // nothing sensible to do if stderr is gone
    data += written;
    left -= static_cast<std::size_t>(written);
  }
}

inline void log_error(std::string_view m) { log(LogLevel::kError, m); }
inline void log_warn(std::string_view m) { log(LogLevel::kWarn, m); }
inline void log_info(std::string_view m) { log(LogLevel::kInfo, m); }
inline void log_debug(std::string_view m) { log(LogLevel::kDebug, m); }

}  // namespace ncclkit
