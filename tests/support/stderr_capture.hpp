#pragma once
// Captures what a piece of code writes to this process's stderr (ncclkit's log lines), for
// tests of warnings.

#include <fcntl.h>   // open
#include <unistd.h>  // dup, dup2, close

#include <stdexcept>  // std::runtime_error
#include <string>     // std::string

#include "ncclkit/core/log.hpp"
#include "support/text.hpp"

namespace ncclkit_test {

/// Runs `body` with stderr sent to `file` (created or truncated), at log level warn or more, and
/// returns what was written there. Restores stderr and the log level, also when `body` throws.
template <class Body>
std::string stderr_of(const std::string& file, Body body) {
  const bool warn_was_on = ncclkit::log_enabled(ncclkit::LogLevel::kWarn);
  const int saved = ::dup(2);
  const int sink = ::open(file.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  if (saved < 0 || sink < 0) {
    if (saved >= 0) ::close(saved);
    if (sink >= 0) ::close(sink);
    throw std::runtime_error("stderr_of: cannot open " + file + " or duplicate stderr");
  }
  if (!warn_was_on) ncclkit::set_log_level(ncclkit::LogLevel::kWarn);
  ::dup2(sink, 2);
  ::close(sink);
  const auto restore = [&] {
    ::dup2(saved, 2);
    ::close(saved);
    if (!warn_was_on) ncclkit::set_log_level(ncclkit::LogLevel::kError);
  };
  try {
    body();
  } catch (...) {
    restore();
    throw;
  }
  restore();
  return read_text(file);
}

}  // namespace ncclkit_test
