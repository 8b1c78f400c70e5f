#pragma once
/// Deadlines from timeouts that cannot overflow. A caller may pass milliseconds::max() to mean
/// "wait forever"; now() + that wraps into a deadline already passed, so every timeout is
/// bounded by kLongestTimeout (about 31.7 years: forever enough) before it is added to a time.
///
/// Host code only: C++20.

#include <algorithm>  // std::clamp
#include <chrono>     // std::chrono

namespace ncclkit::detail {

/// The longest timeout ncclkit acts on, 1e9 s: the one limit of every timeout, both where a
/// given timeout is refused as too long (an environment variable, Options::timeout) and where
/// one is bounded before a deadline is computed from it. Far from the clock's overflow.
inline constexpr std::chrono::milliseconds kLongestTimeout = std::chrono::seconds(1'000'000'000);

/// `timeout` within [0, kLongestTimeout].
inline std::chrono::milliseconds bounded_timeout(std::chrono::milliseconds timeout) {
  return std::clamp(timeout, std::chrono::milliseconds(0), kLongestTimeout);
}

/// start + timeout, saturating (see the top of this file).
inline std::chrono::steady_clock::time_point deadline_after(
    std::chrono::milliseconds timeout, std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now()) {
  return start + bounded_timeout(timeout);
}

}  // namespace ncclkit::detail
