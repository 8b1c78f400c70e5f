#pragma once
// Ranks as threads of the test process, sharing one MemoryStore: for tests that check what
// ranks compute through a store, where processes would add only fork and exec time. Failure
// drills and multi-process features keep real processes (bootstrap/spawn.hpp).

#include <exception>  // std::exception
#include <memory>     // std::shared_ptr, std::make_shared
#include <string>     // std::string
#include <thread>     // std::thread
#include <vector>     // std::vector

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/store/memory_store.hpp"

namespace ncclkit_test {

/// What each rank's function returned (0: as expected), or the exception that ended it.
struct ThreadRanksResult {
  std::vector<int> codes;
  std::vector<std::string> errors;  ///< per rank: the exception's message, empty when none

  bool ok() const {
    for (std::size_t r = 0; r < codes.size(); ++r) {
      if (codes[r] != 0 || !errors[r].empty()) return false;
    }
    return true;
  }
  /// Every failed rank with its code or exception; "all N ranks succeeded" when none failed.
  std::string describe() const {
    std::string text;
    for (std::size_t r = 0; r < codes.size(); ++r) {
      if (codes[r] == 0 && errors[r].empty()) continue;
      text += (text.empty() ? "" : "; ") + std::string("rank ") + std::to_string(r) +
              (errors[r].empty() ? " returned " + std::to_string(codes[r]) : " threw: " + errors[r]);
    }
    return text.empty() ? "all " + std::to_string(codes.size()) + " ranks succeeded" : text;
  }
};

/// Runs `fn(world, store)` (returning an int, 0 when all went as expected) in `n` threads, rank
/// r with WorldInfo{.rank = r, .world_size = n} and one MemoryStore for all. Returns when every
/// thread has: `fn` must bound its waits (store calls take timeouts).
template <class Fn>
ThreadRanksResult run_thread_ranks(int n, Fn fn) {
  auto store = std::make_shared<ncclkit::MemoryStore>("ranks");
  ThreadRanksResult result{std::vector<int>(static_cast<std::size_t>(n), 0),
                           std::vector<std::string>(static_cast<std::size_t>(n))};
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(n));
  for (int rank = 0; rank < n; ++rank) {
    threads.emplace_back([&, rank] {
      ncclkit::WorldInfo world;
      world.rank = rank;
      world.world_size = n;
      world.local_rank = rank;
      world.local_world_size = n;
      world.source = "thread ranks";
      const auto r = static_cast<std::size_t>(rank);
      try {
        result.codes[r] = fn(static_cast<const ncclkit::WorldInfo&>(world), static_cast<ncclkit::Store&>(*store));
      } catch (const std::exception& e) {
        result.errors[r] = e.what();
      } catch (...) {
        result.errors[r] = "an exception that is not a std::exception";
      }
    });
  }
  for (auto& thread : threads) thread.join();
  return result;
}

}  // namespace ncclkit_test
