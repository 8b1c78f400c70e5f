#pragma once
/// coarse_now(): std::chrono::steady_clock's time as of the kernel's last timer tick, for time
/// stamps taken on hot paths (each collective's issue time, which the watchdog measures its
/// timeout from). On Linux it reads CLOCK_MONOTONIC_COARSE, which shares steady_clock's
/// origin (CLOCK_MONOTONIC) but is a value the kernel updates once per tick (1-10 ms): reading
/// it never touches the hardware counter, so it stays a few nanoseconds even where
/// steady_clock::now() is slow (virtual machines whose clock source is not the TSC fall back
/// to a system call). A stamp is at most one tick earlier than steady_clock::now() would
/// give (coarse_resolution() says how much; the watchdog adds it to its timeouts). Elsewhere
/// it is steady_clock::now().
///
/// Host code only: C++20 and POSIX.

#include <chrono>  // std::chrono::steady_clock
#include <time.h>  // clock_gettime, clock_getres, CLOCK_MONOTONIC_COARSE

namespace ncclkit::detail {

inline std::chrono::steady_clock::time_point coarse_now() noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
  timespec now{};
  if (clock_gettime(CLOCK_MONOTONIC_COARSE, &now) == 0) {
    return std::chrono::steady_clock::time_point(std::chrono::duration_cast<std::chrono::steady_clock::duration>(
        std::chrono::seconds(now.tv_sec) + std::chrono::nanoseconds(now.tv_nsec)));
  }
#endif
  return std::chrono::steady_clock::now();
}

/// How far coarse_now() may lag steady_clock::now() (one tick; zero where it is steady_clock).
inline std::chrono::nanoseconds coarse_resolution() noexcept {
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
  timespec resolution{};
  if (clock_getres(CLOCK_MONOTONIC_COARSE, &resolution) == 0) {
    return std::chrono::seconds(resolution.tv_sec) + std::chrono::nanoseconds(resolution.tv_nsec);
  }
#endif
  return std::chrono::nanoseconds(0);
}

}  // namespace ncclkit::detail
