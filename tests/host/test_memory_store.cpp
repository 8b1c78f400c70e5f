// Tests of ncclkit/store/memory_store.hpp: every Store operation, timeouts that name what is
// missing, waiters woken by a set from another thread, and many threads at once.
#include <doctest/doctest.h>

#include <atomic>   // std::atomic
#include <chrono>   // std::chrono
#include <cstdint>  // std::int64_t
#include <string>   // std::string
#include <thread>   // std::thread
#include <vector>   // std::vector

#include "ncclkit/core/error.hpp"
#include "ncclkit/store.hpp"
#include "support/text.hpp"
#include "support/thread_ranks.hpp"

using namespace std::chrono_literals;
using ncclkit::MemoryStore;
using ncclkit_test::contains;

namespace {

using MemoryClock = std::chrono::steady_clock;

/// The message of the TimeoutError that `call` throws, and how long it took to come.
template <class Call>
std::pair<std::string, MemoryClock::duration> memory_timeout_of(Call&& call) {
  const auto start = MemoryClock::now();
  try {
    call();
  } catch (const ncclkit::TimeoutError& e) {
    return {e.what(), MemoryClock::now() - start};
  }
  FAIL("no TimeoutError");
  return {};
}

}  // namespace

TEST_CASE("a MemoryStore sets, gets, checks, counts and deletes keys") {
  MemoryStore store("unit");
  CHECK(store.describe() == "memory://unit");
  CHECK(store.num_keys() == 0);
  CHECK_FALSE(store.check({"k"}));

  store.set("k", "v1");
  CHECK(store.get_string("k", 1s) == "v1");
  store.set("k", "v2");  // replaces
  CHECK(store.get_string("k", 1s) == "v2");
  store.set(std::string("bin\0ary", 7), ncclkit::Bytes{0, 1, 2, 255});
  CHECK(store.get(std::string("bin\0ary", 7), 1s) == ncclkit::Bytes{0, 1, 2, 255});
  CHECK(store.check({"k", std::string("bin\0ary", 7)}));
  CHECK(store.num_keys() == 2);
  store.wait({"k"}, 0ms);  // present keys need no time

  CHECK(store.add("n", 5) == 5);
  CHECK(store.add("n", -7) == -2);
  CHECK(store.get_string("n", 1s) == "-2");

  CHECK(store.delete_key("k"));
  CHECK_FALSE(store.delete_key("k"));
  CHECK_FALSE(store.check({"k"}));
  CHECK(store.num_keys() == 2);
}

TEST_CASE("MemoryStore::compare_set follows the Store contract") {
  MemoryStore store;
  CHECK(store.compare_set("c", "", "first") == "first");   // missing + empty expected: set
  CHECK(store.compare_set("c", "wrong", "x") == "first");  // mismatch: current value, unchanged
  CHECK(store.compare_set("c", "first", "second") == "second");
  CHECK(store.get_string("c", 1s) == "second");
  CHECK(store.compare_set("d", "expected", "x") == "expected");  // missing + non-empty expected: nothing set
  CHECK_FALSE(store.check({"d"}));
}

TEST_CASE("add refuses a value that is not a counter, and int64 overflow") {
  MemoryStore store("counters");
  store.set("text", "abc");
  try {
    (void)store.add("text", 1);
    FAIL("no StoreError");
  } catch (const ncclkit::StoreError& e) {
    CHECK_MESSAGE(
        contains(e.what(),
                 "MemoryStore memory://counters: add to key 'text': its value 'abc' is not a decimal integer"),
        e.what());
  }
  store.set("big", std::to_string(INT64_MAX));
  CHECK_THROWS_AS((void)store.add("big", 1), ncclkit::StoreError);
  CHECK(store.get_string("big", 1s) == std::to_string(INT64_MAX));  // unchanged
}

TEST_CASE("get and wait end at their timeout, naming the store and the missing keys") {
  MemoryStore store("timeouts");
  store.set("here", "1");

  auto [get_message, get_took] = memory_timeout_of([&] { (void)store.get("absent", 200ms); });
  CHECK_MESSAGE(contains(get_message, "MemoryStore memory://timeouts: get of key 'absent' timed out after 0.2"),
                get_message);
  CHECK_MESSAGE(contains(get_message, "(timeout 0.200 s)"), get_message);
  // Bounds at about 5x what is claimed: loose enough for busy cores, tight enough to fail a
  // timeout that is not the one asked for.
  CHECK(get_took >= 200ms);
  CHECK(get_took < 1s);

  auto [wait_message, wait_took] = memory_timeout_of([&] { store.wait({"here", "a", "b"}, 150ms); });
  CHECK_MESSAGE(contains(wait_message, "wait for 3 key(s) timed out after"), wait_message);
  CHECK_MESSAGE(contains(wait_message, "2 still missing: 'a', 'b'."), wait_message);
  CHECK_FALSE(contains(wait_message, "'here'"));
  CHECK(wait_took >= 150ms);
  CHECK(wait_took < 750ms);

  // A zero or negative timeout is one look, never a hang.
  CHECK_THROWS_AS((void)store.get("absent", 0ms), ncclkit::TimeoutError);
  CHECK_THROWS_AS(store.wait({"absent"}, -5ms), ncclkit::TimeoutError);
  // The longest timeout does not overflow into one already passed.
  std::thread setter([&] {
    std::this_thread::sleep_for(50ms);
    store.set("late", "1");
  });
  CHECK(store.get_string("late", std::chrono::milliseconds::max()) == "1");
  setter.join();
}

TEST_CASE("a waiter wakes when another thread sets the key, without waiting for its timeout") {
  MemoryStore store;
  const auto start = MemoryClock::now();
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    store.set("a", "1");
    std::this_thread::sleep_for(50ms);
    (void)store.add("b", 1);
  });
  store.wait({"a", "b"}, 60s);
  const auto woke_after = MemoryClock::now() - start;
  CHECK(store.get_string("a", 0ms) == "1");
  setter.join();
  // Both keys are there after 150 ms: woken then, not at the 60 s timeout (5x, for busy cores).
  CHECK(woke_after >= 150ms);
  CHECK(woke_after < 750ms);
}

TEST_CASE("many threads add, compare_set and rendezvous on one MemoryStore") {
  constexpr int kThreads = 16;
  constexpr int kAdds = 500;
  auto result = ncclkit_test::run_thread_ranks(kThreads, [](const ncclkit::WorldInfo& world, ncclkit::Store& store) {
    for (int i = 0; i < kAdds; ++i) (void)store.add("counter", 1);
    // Exactly one thread wins the compare_set; every thread sees the winner's value.
    const std::string mine = "rank " + std::to_string(world.rank);
    const std::string winner = store.compare_set("leader", "", mine);
    store.set("arrived/" + std::to_string(world.rank), winner);
    std::vector<std::string> keys;
    for (int r = 0; r < world.world_size; ++r) keys.push_back("arrived/" + std::to_string(r));
    store.wait(keys, 30s);
    for (const auto& key : keys) {
      if (store.get_string(key, 0ms) != winner) return 2;
    }
    return store.get_string("counter", 0ms) == std::to_string(kThreads * kAdds) ? 0 : 3;
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("thread ranks report a rank's exception and its code") {
  auto result = ncclkit_test::run_thread_ranks(3, [](const ncclkit::WorldInfo& world, ncclkit::Store& store) {
    if (world.rank == 1) (void)store.get("never", 10ms);
    return world.rank == 2 ? 7 : 0;
  });
  CHECK_FALSE(result.ok());
  CHECK_MESSAGE(contains(result.describe(), "rank 1 threw: MemoryStore memory://ranks: get of key 'never'"),
                result.describe());
  CHECK_MESSAGE(contains(result.describe(), "rank 2 returned 7"), result.describe());
}
