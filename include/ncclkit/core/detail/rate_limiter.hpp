#pragma once
/// RateLimiter: lets at most `burst` events through per `interval` and counts the rest, so a
/// log line that can be provoked from outside (a peer with a wrong token reconnecting in a
/// loop, a flood of connections the process has no descriptors for) is printed a few times,
/// then once per interval with the number left out, never thousands of times a second.
///
/// Not thread-safe: one owner (a server's event loop) calls it. Host code only: C++20.

#include <chrono>   // std::chrono::steady_clock
#include <cstdint>  // std::uint64_t
#include <string>   // std::string

namespace ncclkit::detail {

class RateLimiter {
 public:
  using Clock = std::chrono::steady_clock;

  /// `burst` events per `interval` (a fixed window that starts at the first event after the
  /// previous window ended). burst 0 lets nothing through.
  RateLimiter(std::uint64_t burst, Clock::duration interval) : burst_(burst), interval_(interval) {}

  /// Whether the event at `now` may go through. When it may, `suppressed` gets the number
  /// held back since the last one let through (and the count starts again at zero).
  bool admit(std::uint64_t& suppressed, Clock::time_point now = Clock::now()) {
    if (!started_ || now - window_start_ >= interval_) {
      started_ = true;
      window_start_ = now;
      admitted_ = 0;
    }
    if (admitted_ >= burst_) {
      ++suppressed_;
      return false;
    }
    ++admitted_;
    suppressed = suppressed_;
    suppressed_ = 0;
    return true;
  }

  /// The same, for callers that append suppressed_note() themselves: "" or the note.
  bool admit(std::string& note, Clock::time_point now = Clock::now()) {
    std::uint64_t suppressed = 0;
    if (!admit(suppressed, now)) return false;
    note = suppressed_note(suppressed);
    return true;
  }

  /// " (N similar line(s) left out)" for N > 0, else "".
  static std::string suppressed_note(std::uint64_t suppressed) {
    if (suppressed == 0) return {};
    return " (" + std::to_string(suppressed) + " similar line" + (suppressed == 1 ? "" : "s") + " left out)";
  }

 private:
  std::uint64_t burst_;
  Clock::duration interval_;
  bool started_ = false;
  Clock::time_point window_start_{};
  std::uint64_t admitted_ = 0;
  std::uint64_t suppressed_ = 0;
};

}  // namespace ncclkit::detail
