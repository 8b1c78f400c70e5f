// call_bounded returns the call's result when it returns in time, and returns empty-handed
// within the limit when it does not (the call goes on in the background).
#include <doctest/doctest.h>

#include <atomic>  // std::atomic
#include <chrono>  // std::chrono
#include <memory>  // std::make_shared
#include <string>  // std::string
#include <thread>  // std::this_thread

#include "ncclkit/core/detail/bounded_call.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

TEST_CASE("call_bounded returns the result of a call that returns in time") {
  const auto result = ncclkit::detail::call_bounded([] { return 42; }, 5s);
  REQUIRE(result.has_value());
  CHECK(*result == 42);
  const auto text = ncclkit::detail::call_bounded([] { return std::string("done"); }, 5s);
  REQUIRE(text.has_value());
  CHECK(*text == "done");
}

TEST_CASE("call_bounded gives up on a call that blocks past the limit, and the call goes on") {
  auto release = std::make_shared<std::atomic<bool>>(false);
  auto finished = std::make_shared<std::atomic<bool>>(false);
  const auto start = Clock::now();
  const auto result = ncclkit::detail::call_bounded(
      [release, finished] {
        while (!release->load()) std::this_thread::sleep_for(1ms);  // a call stuck until released
        finished->store(true);
        return 7;
      },
      200ms);
  const auto waited = Clock::now() - start;
  CHECK_FALSE(result.has_value());
  CHECK(waited >= 200ms);
  CHECK(waited < 5s);
  CHECK_FALSE(finished->load());
  // The detached call still runs, and finishes once released.
  release->store(true);
  const auto deadline = Clock::now() + 10s;
  while (!finished->load() && Clock::now() < deadline) std::this_thread::sleep_for(1ms);
  CHECK(finished->load());
}
