// coarse_now() is steady_clock's time, at most one tick behind, and never goes back.
#include <doctest/doctest.h>

#include <time.h>  // CLOCK_MONOTONIC_COARSE

#include <chrono>
#include <thread>

#include "ncclkit/core/detail/coarse_clock.hpp"

using namespace std::chrono_literals;

TEST_CASE("coarse_now lags steady_clock by at most one tick") {
  const auto tick = ncclkit::detail::coarse_resolution();
#if defined(__linux__) && defined(CLOCK_MONOTONIC_COARSE)
  // One kernel tick: 1 ms at HZ=1000 to 10 ms at HZ=100. Never zero: the watchdog adds it to
  // its timeouts, which would otherwise end up to a tick short.
  CHECK(tick > 0ns);
  CHECK(tick <= 10ms);
#else
  CHECK(tick == 0ns);  // coarse_now() is steady_clock::now()
#endif
  for (int i = 0; i < 1000; ++i) {
    const auto fine_before = std::chrono::steady_clock::now();
    const auto coarse = ncclkit::detail::coarse_now();
    const auto fine_after = std::chrono::steady_clock::now();
    REQUIRE(coarse <= fine_after);
    // One tick of lag, plus slack for a descheduled thread between the two reads.
    REQUIRE(fine_before - coarse <= tick + 50ms);
  }
}

TEST_CASE("coarse_now never goes back and advances with time") {
  auto last = ncclkit::detail::coarse_now();
  const auto start = last;
  const auto tick = ncclkit::detail::coarse_resolution();
  const auto until = std::chrono::steady_clock::now() + 3 * tick + 20ms;
  while (std::chrono::steady_clock::now() < until) {
    const auto now = ncclkit::detail::coarse_now();
    REQUIRE(now >= last);
    last = now;
    std::this_thread::sleep_for(1ms);
  }
  CHECK(last > start);
}
