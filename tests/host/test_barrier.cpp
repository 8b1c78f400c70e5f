// Tests of ncclkit/store/barrier.hpp over a FileStore with real processes: 2, 8 and 64 ranks,
// reuse over several rounds, and the error that names ranks that never arrive.
#include <doctest/doctest.h>

#include <signal.h>  // signal, SIGTERM
#include <stdlib.h>  // mkdtemp

#include <chrono>      // std::chrono
#include <cstdint>     // std::int64_t
#include <filesystem>  // std::filesystem
#include <stdexcept>   // std::runtime_error
#include <string>      // std::string
#include <vector>      // std::vector

#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/file_store.hpp"
#include "support/checker.hpp"

using namespace std::chrono_literals;
using ncclkit::FileStore;
using Clock = std::chrono::steady_clock;

namespace {

using ncclkit_test::require;

FileStore open_store(const ncclkit::WorldInfo& world) {
  return FileStore(world.init_url.substr(7), {.world_size = world.world_size, .timeout = 60s});
}

}  // namespace

TEST_CASE("a barrier reused for several rounds lets nobody through before everyone arrived") {
  constexpr int kRounds = 5;
  for (int n : {2, 8, 64}) {
    CAPTURE(n);
    auto result =
        ncclkit::spawn(n,
                       [](const ncclkit::WorldInfo& world) {
                         ::signal(SIGTERM, SIG_DFL);
                         FileStore store = open_store(world);
                         for (int round = 0; round < kRounds; ++round) {
                           const std::string prefix = "round/" + std::to_string(round) + "/";
                           // Ranks reach the barrier at different times: each does rank-dependent work first.
                           for (int i = 0; i < (world.rank * 7 + round) % 5; ++i)
                             store.add("busy/" + std::to_string(world.rank), 1);
                           store.set(prefix + std::to_string(world.rank), "here");
                           ncclkit::barrier(store, world.rank, world.world_size, "loop", 30s);
                           // check() never blocks: every rank's key must exist already.
                           for (int r = 0; r < world.world_size; ++r) {
                             require(store.check({prefix + std::to_string(r)}),
                                     "rank " + std::to_string(r) + " had not arrived when round " +
                                         std::to_string(round) + " released");
                           }
                         }
                         // A second tag runs its own rounds, independent of the first.
                         ncclkit::barrier(store, world.rank, world.world_size, "other", 30s);
                         require(store.get_string("barrier/loop/arrived") == std::to_string(kRounds * world.world_size),
                                 "the loop barrier counted " + store.get_string("barrier/loop/arrived"));
                         ncclkit::barrier(store, world.rank, world.world_size, "end", 30s);
                       },
                       {.timeout = 120s});
    CHECK_MESSAGE(result.ok(), result.describe());
  }
}

TEST_CASE("a rank that never arrives makes the others fail, naming it") {
  struct Case {
    int world;
    std::vector<int> absent;
    std::string named;
  };
  for (const Case& c : {Case{2, {1}, "never arrived: 1;"}, Case{8, {5}, "never arrived: 5;"},
                        Case{64, {37, 50}, "never arrived: 37, 50;"}}) {
    CAPTURE(c.world);
    // Long enough for 62 processes to write their arrival on a loaded 2-core machine (CTest
    // runs other tests beside this one); 1 s missed some of them there.
    const auto timeout = c.world >= 64 ? 4s : 1s;
    auto result = ncclkit::spawn(
        c.world,
        [&](const ncclkit::WorldInfo& world) {
          ::signal(SIGTERM, SIG_DFL);
          for (int absent : c.absent)
            if (world.rank == absent) return 0;  // never joins, never arrives
          FileStore store = open_store(world);
          // Every rank that will arrive is up before the clock starts: on a loaded machine 64 forked
          // ranks take longer than the barrier's timeout to start, and a late one is not the absent one.
          const auto present = static_cast<std::int64_t>(world.world_size - static_cast<int>(c.absent.size()));
          store.add("present", 1);
          require(
              ncclkit::detail::poll_until(Clock::now() + 60s, {}, [&] { return store.add("present", 0) == present; }),
              "the present ranks did not all start within 60 s");
          const auto start = Clock::now();
          try {
            ncclkit::barrier(store, world.rank, world.world_size, "gate", timeout);
          } catch (const ncclkit::TimeoutError& e) {
            const std::string text = e.what();
            require(text.find(c.named) != std::string::npos, "message does not name the absent rank(s): " + text);
            require(text.find("barrier 'gate'") != std::string::npos, "message does not name the barrier: " + text);
            require(text.find(store.describe()) != std::string::npos, "message does not name the folder: " + text);
            require(Clock::now() - start >= timeout, "the barrier timed out early");
            return 0;
          }
          require(false, "the barrier let rank " + std::to_string(world.rank) + " through with ranks missing");
          return 1;
        },
        {.timeout = 120s});
    CHECK_MESSAGE(result.ok(), result.describe());
  }
}

TEST_CASE("barrier rejects a rank outside the world") {
  char pattern[] = "/tmp/ncclkit-barrier-test-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  {
    FileStore store(pattern, {.world_size = 1});
    CHECK_THROWS_WITH_AS(ncclkit::barrier(store, 2, 2, "x", 1s), doctest::Contains("rank 2 is outside a world of 2"),
                         ncclkit::ConfigError);
    CHECK_THROWS_AS(ncclkit::barrier(store, 0, 0, "x", 1s), ncclkit::ConfigError);
    ncclkit::barrier(store, 0, 1, "alone", 1s);  // a world of one passes at once
    ncclkit::barrier(store, 0, 1, "alone");
  }
  std::filesystem::remove_all(pattern);
}
