// FileStore with real processes (ncclkit::spawn): 2, 8 and 64 ranks rendezvous, add, values
// of 0 B and 16 MiB, compare_set races, delete_key/num_keys, timeouts, and cleanup by the last
// rank. Every worker builds FileStore(init_url without "file://", {.world_size = n}).
#include <doctest/doctest.h>

#include <signal.h>  // signal, SIGTERM
#include <stdlib.h>  // mkdtemp

#include <algorithm>   // std::sort, std::max
#include <chrono>      // std::chrono
#include <cstdint>     // std::uint64_t, std::int64_t
#include <cstring>     // std::memcpy
#include <filesystem>  // std::filesystem
#include <set>         // std::set
#include <sstream>     // std::istringstream
#include <stdexcept>   // std::runtime_error
#include <string>      // std::string
#include <thread>      // std::this_thread::sleep_for
#include <vector>      // std::vector
#include <fstream>     // std::ofstream

#include "support/store_values.hpp"
#include "support/temp_dir.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/file_store.hpp"
#include "support/checker.hpp"

using namespace std::chrono_literals;
using ncclkit::Bytes;
using ncclkit::FileStore;
using Clock = std::chrono::steady_clock;

namespace {

using ncclkit_test::entries;

using ncclkit_test::random_bytes;
using ncclkit_test::TempDir;

constexpr int kSizes[] = {2, 8, 64};

/// A fingerprint of a value, to compare large values without a second copy.
std::uint64_t hash_of(const Bytes& bytes) {
  return ncclkit::detail::file_store::hash64(
      std::string_view(reinterpret_cast<const char*>(bytes.data()), bytes.size()), 12345);
}

/// Worker-side assertion: a failed one ends the worker with code 1 and a logged reason.
using ncclkit_test::require;

/// Runs fn(store, rank, world) in `n` processes sharing one folder, then checks that all
/// succeeded and that the last rank to leave removed the run's files.
template <class Fn>
void run_ranks(int n, Fn fn) {
  TempDir dir;
  auto result = ncclkit::spawn(
      n,
      [&](const ncclkit::WorldInfo& world) {
        ::signal(SIGTERM, SIG_DFL);  // a worker stopped by spawn should die quietly, not report a doctest crash
        FileStore store(world.init_url.substr(7), {.world_size = world.world_size, .timeout = 60s});
        fn(store, world.rank, world.world_size);
      },
      {.timeout = 120s, .rendezvous_dir = dir.path});
  CHECK_MESSAGE(result.ok(), result.describe());
  CHECK(entries(dir.path) == std::vector<std::string>{"lock"});
}

}  // namespace

TEST_CASE("rendezvous: every rank sets its key and reads everyone's") {
  for (int n : kSizes) {
    CAPTURE(n);
    run_ranks(n, [](FileStore& store, int rank, int world) {
      require(store.run_world_size() == world, "wrong run world size");
      store.set("addr/" + std::to_string(rank), random_bytes(64 + rank, 1000 + rank));
      std::vector<std::string> keys;
      for (int r = 0; r < world; ++r) keys.push_back("addr/" + std::to_string(r));
      store.wait(keys, 30s);
      for (int r = 0; r < world; ++r) {
        require(store.get("addr/" + std::to_string(r), 1s) == random_bytes(64 + r, 1000 + r),
                "wrong value of addr/" + std::to_string(r));
      }
      ncclkit::barrier(store, rank, world, "end", 30s);  // nobody leaves while others still read
    });
  }
}

TEST_CASE("add from every rank sums exactly, and every add returns a distinct value") {
  constexpr int kAdds = 5;
  for (int n : kSizes) {
    CAPTURE(n);
    run_ranks(n, [](FileStore& store, int rank, int world) {
      std::string returned;
      for (int i = 0; i < kAdds; ++i) returned += std::to_string(store.add("sum", rank + 1)) + " ";
      store.add("count", 1);
      store.set("returned/" + std::to_string(rank), returned);
      ncclkit::barrier(store, rank, world, "added", 30s);
      const std::int64_t expected = std::int64_t{kAdds} * world * (world + 1) / 2;
      require(store.add("sum", 0) == expected, "sum " + store.get_string("sum") + " != " + std::to_string(expected));
      require(store.get_string("count") == std::to_string(world), "count is wrong");
      if (rank == 0) {
        // Each add's result is the running total at one point of a single order: all distinct.
        std::set<std::int64_t> seen;
        for (int r = 0; r < world; ++r) {
          std::istringstream values(store.get_string("returned/" + std::to_string(r)));
          std::int64_t value;
          while (values >> value) require(seen.insert(value).second, "two adds returned " + std::to_string(value));
        }
        require(static_cast<int>(seen.size()) == kAdds * world, "missing results");
        require(*seen.rbegin() == expected, "the largest result is not the total");
      }
      ncclkit::barrier(store, rank, world, "end", 30s);
    });
  }
}

TEST_CASE("values of 0 B from every rank and 16 MiB from two ranks reach everyone intact") {
  constexpr std::size_t kBig = std::size_t{16} << 20;
  // Expected contents are fingerprinted once here; 64 workers regenerating 16 MiB each would
  // spend the test's time on two cores making reference data.
  const std::uint64_t big_hash = hash_of(random_bytes(kBig, 77));
  const std::uint64_t big2_hash = hash_of(random_bytes(kBig + 1, 78));
  for (int n : kSizes) {
    CAPTURE(n);
    run_ranks(n, [&](FileStore& store, int rank, int world) {
      store.set("empty/" + std::to_string(rank), Bytes{});
      if (rank == 0) store.set("big", random_bytes(kBig, 77));
      if (rank == world - 1) store.set("big2", random_bytes(kBig + 1, 78));
      for (int r = 0; r < world; ++r) require(store.get("empty/" + std::to_string(r), 30s).empty(), "empty not empty");
      const Bytes big = store.get("big", 30s);
      require(big.size() == kBig && hash_of(big) == big_hash, "the 16 MiB value differs");
      if (rank % 8 == 0) {
        const Bytes big2 = store.get("big2", 30s);
        require(big2.size() == kBig + 1 && hash_of(big2) == big2_hash, "the 16 MiB + 1 B value differs");
      }
      ncclkit::barrier(store, rank, world, "end", 30s);
    });
  }
}

TEST_CASE("compare_set elects exactly one winner among racing ranks") {
  for (int n : kSizes) {
    CAPTURE(n);
    run_ranks(n, [](FileStore& store, int rank, int world) {
      const std::string mine = "rank-" + std::to_string(rank);
      const std::string winner = store.compare_set("leader", "", mine);
      store.set("saw/" + std::to_string(rank), winner);
      if (winner == mine) store.add("winners", 1);
      // Then a chain: rank r may only advance the token from r-1 to r, so the value walks
      // through every rank in order, whatever order the ranks run in.
      const std::string from = rank == 0 ? "" : "token-" + std::to_string(rank - 1);
      const std::string to = "token-" + std::to_string(rank);
      for (;;) {
        const std::string now = store.compare_set("token", from, to);
        if (now == to) break;
        require(rank > 0, "rank 0 lost the empty token to " + now);
        store.get("advanced/" + std::to_string(rank - 1), 30s);  // wait for our turn
      }
      store.set("advanced/" + std::to_string(rank), "1");
      ncclkit::barrier(store, rank, world, "done", 30s);
      require(store.get_string("winners") == "1", "winners: " + store.get_string("winners"));
      for (int r = 0; r < world; ++r)
        require(store.get_string("saw/" + std::to_string(r)) == winner, "ranks saw different leaders");
      require(store.get_string("token") == "token-" + std::to_string(world - 1), "the token did not reach the end");
      ncclkit::barrier(store, rank, world, "end", 30s);
    });
  }
}

TEST_CASE("delete_key and num_keys across processes") {
  for (int n : kSizes) {
    CAPTURE(n);
    run_ranks(n, [](FileStore& store, int rank, int world) {
      store.set("tmp/" + std::to_string(rank), "x");
      ncclkit::barrier(store, rank, world, "set", 30s);
      // Every tmp/ key plus the barrier's own keys are counted.
      require(store.num_keys() >= world,
              "num_keys " + std::to_string(store.num_keys()) + " < " + std::to_string(world));
      const std::int64_t before = store.num_keys();
      ncclkit::barrier(store, rank, world, "counted", 30s);
      require(store.delete_key("tmp/" + std::to_string((rank + 1) % world)), "a key to delete was missing");
      require(!store.delete_key("tmp/" + std::to_string((rank + 1) % world)), "deleted twice");
      ncclkit::barrier(store, rank, world, "deleted", 30s);
      for (int r = 0; r < world; ++r) require(!store.check({"tmp/" + std::to_string(r)}), "a deleted key is visible");
      (void)before;
      ncclkit::barrier(store, rank, world, "end", 30s);
    });
  }
}

TEST_CASE("timeouts in every process are never early and late by at most max(10%, 250 ms)") {
  for (int n : {2, 8}) {
    CAPTURE(n);
    run_ranks(n, [](FileStore& store, int rank, int world) {
      ncclkit::barrier(store, rank, world, "start", 30s);  // time out together, on busy cores
      for (auto timeout : {100ms, 600ms}) {
        const double limit = std::chrono::duration<double>(timeout).count();
        const auto start = Clock::now();
        try {
          (void)store.get("nobody-sets-this/" + std::to_string(rank), timeout);
          require(false, "get of a missing key returned");
        } catch (const ncclkit::TimeoutError& e) {
          const double waited = std::chrono::duration<double>(Clock::now() - start).count();
          require(waited >= limit, "timed out early: " + std::to_string(waited) + " s");
          require(waited <= limit + std::max(0.1 * limit, 0.25), "timed out late: " + std::to_string(waited) + " s");
          require(std::string(e.what()).find("nobody-sets-this/" + std::to_string(rank)) != std::string::npos,
                  "the message does not name the key");
        }
      }
      ncclkit::barrier(store, rank, world, "end", 30s);
    });
  }
}

TEST_CASE("the network file system code path (folder refreshes before every lookup) works too") {
  // On a local disk FileStore skips the folder refreshes that NFS needs; force them here so
  // that the code NFS runs is exercised. Workers inherit the setting through fork.
  ncclkit::detail::file_store::always_refresh_folders() = true;
  for (int n : {2, 8}) {
    CAPTURE(n);
    run_ranks(n, [](FileStore& store, int rank, int world) {
      store.set("addr/" + std::to_string(rank), random_bytes(100, 5000 + rank));
      store.add("count", 1);
      std::vector<std::string> keys;
      for (int r = 0; r < world; ++r) keys.push_back("addr/" + std::to_string(r));
      store.wait(keys, 30s);
      for (int r = 0; r < world; ++r)
        require(store.get("addr/" + std::to_string(r), 1s) == random_bytes(100, 5000 + r), "wrong value");
      ncclkit::barrier(store, rank, world, "counted", 30s);
      require(store.get_string("count") == std::to_string(world), "count is wrong");
      require(store.compare_set("leader", "", std::to_string(rank)).size() > 0, "compare_set returned nothing");
      require(!store.check({"missing"}), "a missing key is present");
      ncclkit::barrier(store, rank, world, "end", 30s);
    });
  }
  ncclkit::detail::file_store::always_refresh_folders() = false;
}

TEST_CASE("world_size 0 (unknown): processes share one run; the next run removes it once all are gone") {
  TempDir dir;
  constexpr int kRanks = 8;
  auto result = ncclkit::spawn(kRanks,
                               [&](const ncclkit::WorldInfo& world) {
                                 ::signal(SIGTERM, SIG_DFL);
                                 FileStore store(dir.path, {.world_size = 0, .timeout = 60s});
                                 require(store.run_world_size() == 0, "the run should have an unknown world size");
                                 store.set("run/" + std::to_string(world.rank), store.run_id());
                                 for (int r = 0; r < kRanks; ++r)
                                   require(store.get_string("run/" + std::to_string(r), 30s) == store.run_id(),
                                           "ranks joined different runs");
                                 ncclkit::barrier(store, world.rank, kRanks, "end", 30s);
                               },
                               {.timeout = 120s});
  CHECK_MESSAGE(result.ok(), result.describe());
  const auto left_behind = entries(dir.path);
  REQUIRE(left_behind.size() == 2);  // lock and the run: nobody knew it was complete
  FileStore next(dir.path);
  CHECK("r-" + next.run_id() != left_behind[1]);
  CHECK_FALSE(next.check({"run/0"}));
  CHECK(entries(dir.path) == std::vector<std::string>{"lock", "r-" + next.run_id()});
}

TEST_CASE("two jobs with different SLURM_JOB_IDs in one folder rendezvous separately, never with each other") {
  TempDir shared, markers;
  // Four processes: job 101's two ranks and job 202's two ranks, none with NCCLKIT_RUN_ID,
  // arriving interleaved (101, 202, 101, 202; each waits for the previous one to have joined).
  // Without job identities the second arrival joins the first one's run and both jobs read
  // each other's keys.
  auto result = ncclkit::spawn(
      4,
      [&](const ncclkit::WorldInfo& world) {
        ::signal(SIGTERM, SIG_DFL);
        const std::string job = world.rank % 2 == 0 ? "101" : "202";
        for (const char* name : {"NCCLKIT_RUN_ID", "NCCLKIT_LAUNCH_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_STEP_ID"})
          ::unsetenv(name);
        ::setenv("SLURM_JOB_ID", job.c_str(), 1);
        auto marker = [&](int rank) { return markers.path + "/joined-" + std::to_string(rank); };
        if (world.rank > 0) {
          const auto deadline = Clock::now() + 30s;
          while (!std::filesystem::exists(marker(world.rank - 1))) {
            require(Clock::now() < deadline, "the previous process never joined");
            std::this_thread::sleep_for(1ms);
          }
        }
        FileStore store(shared.path, {.world_size = 2, .timeout = 20s});
        { std::ofstream(marker(world.rank)) << "1"; }
        store.set("job/" + std::to_string(store.member()), job);
        for (int member = 0; member < 2; ++member) {
          const std::string seen = store.get_string("job/" + std::to_string(member));
          require(seen == job, "job " + job + " (rank " + std::to_string(world.rank) + ") read job " + seen +
                                   "'s key: the two jobs mixed in one run");
        }
        ncclkit::barrier(store, store.member(), 2, "done", 20s);
      },
      {.timeout = 60s, .grace = 200ms});
  CHECK_MESSAGE(result.ok(), result.describe());
  CHECK(entries(shared.path) == std::vector<std::string>{"lock"});  // both runs complete, both removed
}
