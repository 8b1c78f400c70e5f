// poll_until (core/detail/poll.hpp) returns as soon as its condition holds, gives up at the deadline
// so that the caller can throw its own error, and never pauses longer than its cap; and the one
// limit of timeouts (core/detail/deadline.hpp) is the one that environment variables are held to.
#include <doctest/doctest.h>

#include <chrono>     // std::chrono
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/core/time_format.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ncclkit::detail::Backoff;
using ncclkit::detail::BackoffPolicy;
using ncclkit::detail::deadline_after;
using ncclkit::detail::poll_until;

TEST_CASE("poll_until returns at once when the condition already holds") {
  int calls = 0;
  const auto start = Clock::now();
  CHECK(poll_until(deadline_after(10s), BackoffPolicy{.first = 1s, .cap = 1s}, [&] {
    ++calls;
    return true;
  }));
  CHECK(calls == 1);
  CHECK(Clock::now() - start < 500ms);  // the 1 s pause is never taken
}

TEST_CASE("poll_until returns as soon as the condition comes to hold, long before the deadline") {
  int calls = 0;
  const auto start = Clock::now();
  CHECK(poll_until(deadline_after(60s), BackoffPolicy{.first = 100us, .cap = 1ms}, [&] { return ++calls == 5; }));
  CHECK(calls == 5);
  CHECK(Clock::now() - start < 5s);
}

TEST_CASE("poll_until gives up at the deadline, after a last try, and the caller throws its error") {
  int calls = 0;
  auto wait_for_key = [&](std::chrono::milliseconds timeout) {
    const auto start = Clock::now();
    if (!poll_until(deadline_after(timeout, start), BackoffPolicy{.first = 1ms, .cap = 20ms}, [&] {
          ++calls;
          return false;
        })) {
      throw ncclkit::TimeoutError("key 'x' did not appear within " + ncclkit::format_seconds(timeout));
    }
  };
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(wait_for_key(200ms), "key 'x' did not appear within 0.200 s", ncclkit::TimeoutError);
  const auto waited = Clock::now() - start;
  CHECK(waited >= 200ms);
  CHECK(waited < 5s);
  CHECK(calls >= 2);   // the first try, and the last one at the deadline
  CHECK(calls < 200);  // backed off: 200 ms of 1, 2, 4, ... 20 ms pauses is about 15 tries
}

TEST_CASE("poll_until with a deadline already passed tries once and gives up") {
  int calls = 0;
  CHECK_FALSE(poll_until(Clock::now() - 1s, BackoffPolicy{}, [&] {
    ++calls;
    return false;
  }));
  CHECK(calls == 1);
}

TEST_CASE("poll_until takes the longest timeout without its deadline wrapping") {
  int calls = 0;
  CHECK(poll_until(deadline_after(std::chrono::milliseconds::max()), BackoffPolicy{.first = 1us, .cap = 1us},
                   [&] { return ++calls == 3; }));
  CHECK(calls == 3);
}

TEST_CASE("Backoff doubles its pause up to the cap and starts over on reset") {
  Backoff backoff(BackoffPolicy{.first = 1us, .cap = 8us});
  CHECK(backoff.next_pause() == 1us);
  for (auto expected : {2us, 4us, 8us, 8us, 8us}) {
    backoff.sleep();
    CHECK(backoff.next_pause() == expected);
  }
  backoff.reset();
  CHECK(backoff.next_pause() == 1us);
}

TEST_CASE("Backoff never sleeps past the deadline, nor once it has passed") {
  Backoff backoff(BackoffPolicy{.first = 10s, .cap = 10s, .jitter = true});
  auto start = Clock::now();
  backoff.sleep(start + 50ms);
  CHECK(Clock::now() - start < 5s);
  start = Clock::now();
  backoff.sleep(start - 1ms);
  CHECK(Clock::now() - start < 1s);
}

TEST_CASE("Backoff with jitter keeps every pause under one and a half times the cap") {
  Backoff backoff(BackoffPolicy{.first = 1ms, .cap = 4ms, .jitter = true});
  auto longest = Clock::duration::zero();
  for (int i = 0; i < 20; ++i) {
    const auto start = Clock::now();
    backoff.sleep(Clock::now() + 10s);
    longest = std::max(longest, Clock::now() - start);
  }
  CHECK(backoff.next_pause() == 4ms);
  CHECK(longest < 1s);  // 6 ms at most, with generous room for a busy machine
}

TEST_CASE("timeouts have one limit: environment variables are held to the deadlines' bound") {
  using ncclkit::detail::kLongestTimeout;
  CHECK(ncclkit::kMaxTimeoutSeconds == std::chrono::duration<double>(kLongestTimeout).count());
  CHECK(ncclkit::parse_timeout_seconds(std::to_string(
            std::chrono::duration_cast<std::chrono::seconds>(kLongestTimeout).count())) == kLongestTimeout);
  CHECK_FALSE(ncclkit::parse_timeout_seconds(
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kLongestTimeout).count() + 1)));
  CHECK(ncclkit::detail::bounded_timeout(std::chrono::milliseconds::max()) == kLongestTimeout);
}
