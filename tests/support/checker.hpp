#pragma once
// Checks inside worker processes and rank threads, where doctest's assertions do not reach
// (they do not cross a fork): a Checker counts failed expectations and gives the worker's exit
// code; require() throws, so that the worker fails with the message.

#include <cstdio>     // std::printf, std::fflush
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string

#include "ncclkit/core/log.hpp"

namespace ncclkit_test {

/// Counts one worker's checks and failures, and logs the first failures (with the rank, through
/// ncclkit's log).
class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}
  bool expect(bool ok, const std::string& what) {
    ++checks_;
    if (!ok) {
      ++failures_;
      if (failures_ <= 25) ncclkit::log_error("CHECK FAILED: " + what);
    }
    return ok;
  }
  long checks() const { return checks_; }
  int failures() const { return failures_; }
  /// The worker's exit code: 0 when every expectation held.
  int code() const { return failures_ == 0 ? 0 : 1; }
  /// Prints the tally and returns the exit code.
  int finish(const std::string& what) const {
    std::printf("rank %d %s: %ld checks, %d failed\n", rank_, what.c_str(), checks_, failures_);
    std::fflush(stdout);
    return code();
  }

 private:
  int rank_;
  long checks_ = 0;
  int failures_ = 0;
};

/// Throws std::runtime_error(what) unless `condition` holds.
inline void require(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error(what);
}

}  // namespace ncclkit_test
