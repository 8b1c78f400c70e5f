// Tests of ncclkit/core/detail/rate_limiter.hpp: a burst per window, the count of what was left out,
// and a fresh window after the interval (times given explicitly: no sleeping).
#include <doctest/doctest.h>

#include <chrono>   // std::chrono
#include <cstdint>  // std::uint64_t
#include <string>   // std::string

#include "ncclkit/core/detail/rate_limiter.hpp"

using namespace std::chrono_literals;
using ncclkit::detail::RateLimiter;

TEST_CASE("a burst goes through, the rest is counted and reported with the next line let through") {
  RateLimiter limiter(3, 10s);
  const auto start = RateLimiter::Clock::time_point{} + 1h;
  std::uint64_t suppressed = 99;
  for (int i = 0; i < 3; ++i) {
    CHECK(limiter.admit(suppressed, start + std::chrono::milliseconds(i)));
    CHECK(suppressed == 0);
  }
  for (int i = 0; i < 5000; ++i) CHECK_FALSE(limiter.admit(suppressed, start + 1s));
  // The next window: let through again, saying how many were left out.
  std::string note;
  CHECK(limiter.admit(note, start + 10s));
  CHECK(note == " (5000 similar lines left out)");
  CHECK(limiter.admit(note, start + 10s));
  CHECK(note.empty());
  CHECK(limiter.admit(note, start + 11s));
  CHECK_FALSE(limiter.admit(note, start + 12s));
  CHECK(limiter.admit(note, start + 25s));
  CHECK(note == " (1 similar line left out)");
}

TEST_CASE("a burst of zero lets nothing through") {
  RateLimiter limiter(0, 1s);
  std::uint64_t suppressed = 0;
  CHECK_FALSE(limiter.admit(suppressed));
  CHECK_FALSE(limiter.admit(suppressed, RateLimiter::Clock::now() + 1h));
}
