// Tests of ncclkit/gloo/comm_queue.hpp in one process: order, events, failure poisoning,
// cancellation on destruction. Tasks synchronise through latches and flags, never sleeps.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <latch>
#include <stdexcept>
#include <thread>
#include <vector>

#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/gloo/comm_queue.hpp"

using ncclkit::CommError;
using ncclkit::gloo::CommQueue;
using ncclkit::gloo::Event;

TEST_CASE("tasks run in submission order on one worker thread, not the caller's") {
  CommQueue queue("order");
  std::vector<int> seen;
  std::thread::id worker;
  bool one_thread = true;
  for (int i = 0; i < 100; ++i) {
    queue.submit([&, i] {
      if (i == 0) worker = std::this_thread::get_id();
      one_thread = one_thread && std::this_thread::get_id() == worker;
      seen.push_back(i);
    });
  }
  queue.synchronize();
  REQUIRE(seen.size() == 100);
  for (int i = 0; i < 100; ++i) CHECK(seen[i] == i);
  CHECK(one_thread);
  CHECK(worker != std::this_thread::get_id());
}

TEST_CASE("an event completes when the work before it has, and not earlier") {
  CommQueue queue("events");
  std::latch release(1);
  queue.submit([&] { release.wait(); });
  Event event = queue.record();
  CHECK_FALSE(event.query());
  queue.submit([] {});
  Event later = queue.record();
  release.count_down();
  event.wait();
  CHECK(event.query());
  later.wait();
  CHECK(Event{}.query());  // a default event is complete
  Event{}.wait();
}

TEST_CASE("the first failure poisons the queue: later tasks do not run, waits rethrow it") {
  CommQueue queue("poison");
  std::atomic<int> ran{0};
  queue.submit([&] { ++ran; });
  Event before = queue.record();
  queue.submit([] { throw CommError("peer lost"); });
  queue.submit([&] { ++ran; });
  Event after = queue.record();
  CHECK_THROWS_WITH_AS(queue.synchronize(), "peer lost", CommError);
  CHECK_NOTHROW(before.wait());  // work before the failure succeeded
  CHECK_THROWS_AS(after.wait(), CommError);
  CHECK(ran == 1);
  CHECK(queue.failure() != nullptr);
  queue.submit([&] { ++ran; });
  CHECK_THROWS_AS(queue.synchronize(), CommError);
  CHECK(ran == 1);
}

TEST_CASE("a collective argument mismatch does not poison: it is reported once and later tasks run") {
  CommQueue queue("mismatch");
  std::atomic<int> ran{0};
  queue.submit([] { throw ncclkit::CollectiveMismatchError("seq 3 differs"); });
  queue.submit([&] { ++ran; });
  Event after = queue.record();
  CHECK_THROWS_WITH_AS(queue.synchronize(), "seq 3 differs", ncclkit::CollectiveMismatchError);
  CHECK(ran == 1);              // the task after the mismatch ran
  CHECK_NOTHROW(after.wait());  // reported once
  CHECK(queue.failure() == nullptr);
  queue.submit([&] { ++ran; });
  CHECK_NOTHROW(queue.synchronize());
  CHECK(ran == 2);
  // A real failure after a mismatch still poisons.
  queue.submit([] { throw CommError("peer lost"); });
  queue.submit([&] { ++ran; });
  CHECK_THROWS_AS(queue.synchronize(), CommError);
  CHECK(ran == 2);
}

TEST_CASE("destroying a queue cancels what has not started; its events fail, and outlive it") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  Event running_done, cancelled;
  std::atomic<bool> second_ran{false};
  {
    CommQueue queue("cancel");
    std::latch started(1);
    // The first task runs until shutdown() has cancelled the second (which records the
    // cancellation as the queue's failure), so the second cannot have started.
    queue.submit([&] {
      started.count_down();
      while (!queue.failure()) std::this_thread::yield();
    });
    running_done = queue.record();
    queue.submit([&] { second_ran = true; });
    cancelled = queue.record();
    started.wait();
    CHECK(queue.shutdown() == 1);  // cancels the second, waits for the running one
  }
  CHECK(running_done.query());
  CHECK_NOTHROW(running_done.wait());
  CHECK(cancelled.query());
  CHECK_THROWS_AS(cancelled.wait(), CommError);
  CHECK_FALSE(second_ran);
}

TEST_CASE("a queue that never got work starts no thread and is destroyed at once") {
  CommQueue queue("idle");
  CHECK(queue.record().query());
  queue.synchronize();
}
