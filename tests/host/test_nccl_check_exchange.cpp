// The store protocol NCCL communicators compare collective arguments through when
// NCCLKIT_CHECK_COLLECTIVES is on (ncclkit/nccl/detail/check_exchange.hpp): every rank gets
// the same verdict, a rank that never arrives is named within the timeout, and keys do not
// pile up. Pure store logic, so it runs here, on machines without a GPU, with ranks as threads
// on a MemoryStore (the cost measurement: processes on a TcpStore, as the launcher gives).
#include <doctest/doctest.h>

#include <algorithm>  // std::sort
#include <chrono>     // std::chrono
#include <cstdio>     // std::printf
#include <cstdint>    // std::uint64_t
#include <memory>     // std::shared_ptr
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/nccl/detail/check_exchange.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "support/thread_ranks.hpp"
#include "support/text.hpp"

namespace {

using ncclkit::CollectiveFingerprint;
using ncclkit::DataType;
using ncclkit::ReduceOp;
using ncclkit::WorldInfo;
using ncclkit::nccl::detail::exchange_fingerprints;
using namespace std::chrono_literals;

using ncclkit_test::contains;

CollectiveFingerprint all_reduce(std::uint64_t number, std::size_t count) {
  return CollectiveFingerprint::of("all_reduce", count, DataType::kFloat32)
      .with_op(ReduceOp::kSum)
      .with_sequence(number);
}

// Codes of the ranks: 0 as expected, 2.. which expectation failed. The ranks are threads on a
// MemoryStore (tests/support/thread_ranks.hpp), each with the scope "comm/1" of it.
template <class Fn>
ncclkit_test::ThreadRanksResult run_scoped(int n, Fn fn) {
  return ncclkit_test::run_thread_ranks(n, [&](const WorldInfo& world, ncclkit::Store& store) {
    ncclkit::PrefixStore scope("comm/1", std::shared_ptr<ncclkit::Store>(&store, [](ncclkit::Store*) {}));
    return fn(world, scope);
  });
}

// The same in processes on a TcpStore, for the cost measurement below.
template <class Fn>
ncclkit::SpawnResult run_processes(int n, Fn fn) {
  return ncclkit::spawn(
      n,
      [&](const WorldInfo& world) -> int {
        auto store = ncclkit::make_store(world.init_url, world);
        ncclkit::PrefixStore scope("comm/1", store);
        return fn(world, scope);
      },
      ncclkit::SpawnOptions{.timeout = 60s, .store = ncclkit::SpawnStore::kTcp});
}

}  // namespace

TEST_CASE("ranks that agree go on, round after round, and old keys are deleted") {
  auto result = run_scoped(3, [](const WorldInfo& world, ncclkit::Store& scope) {
    constexpr std::uint64_t kRounds = 40;
    for (std::uint64_t n = 1; n <= kRounds; ++n) {
      exchange_fingerprints(scope, world.rank, world.world_size, n, all_reduce(n, 100 + n), 20s, "test");
    }
    // Everything before the last round is gone: rank r deleted check/<n-1>/r when it published
    // round n, rank 0 verdict n-1 after reading round n.
    for (int r = 1; r < world.world_size; ++r) {
      if (scope.check({"check/" + std::to_string(kRounds - 2) + "/" + std::to_string(r)})) return 2;
    }
    if (world.rank == 0 && scope.check({"check/" + std::to_string(kRounds - 1) + "/verdict"})) return 3;
    if (!scope.check({"check/" + std::to_string(kRounds) + "/verdict"})) return 4;
    return 0;
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a mismatch is the same CollectiveMismatchError on every rank, and the next round works") {
  auto result = run_scoped(3, [](const WorldInfo& world, ncclkit::Store& scope) {
    exchange_fingerprints(scope, world.rank, world.world_size, 1, all_reduce(1, 8), 20s, "test");
    try {
      exchange_fingerprints(scope, world.rank, world.world_size, 2, all_reduce(2, world.rank == 1 ? 4 : 8), 20s,
                            "test");
      return 2;
    } catch (const ncclkit::CollectiveMismatchError& e) {
      const std::string message = e.what();
      if (!contains(message,
                    "test: collective argument mismatch at seq 2: rank 1 called all_reduce(count=4, float, "
                    "sum) but ranks 0, 2 called all_reduce(count=8, float, sum): count (4 vs 8) differs")) {
        return 3;
      }
      if (!contains(message, "still usable")) return 4;
    }
    exchange_fingerprints(scope, world.rank, world.world_size, 3, all_reduce(3, 8), 20s, "test");
    return 0;
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a rank that never arrives is named by rank 0 and, through its verdict, by the others") {
  auto result = run_scoped(3, [](const WorldInfo& world, ncclkit::Store& scope) {
    if (world.rank == 2) return 0;  // skips the collective
    try {
      exchange_fingerprints(scope, world.rank, world.world_size, 1, all_reduce(1, 8), 1s, "test");
      return 2;
    } catch (const ncclkit::TimeoutError& e) {
      // Rank 1 reports rank 0's verdict (naming rank 2), not its own account of a silent rank
      // 0 ("gave no verdict"): that is what the protocol guarantees, whatever the load.
      const std::string message = e.what();
      if (contains(message, "gave no verdict")) return 3;
      if (!contains(message, "rank 2 did not reach it within 1.000 s")) return 4;
      if (!contains(message, "all_reduce #1")) return 5;
      return 0;
    }
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("when rank 0 never arrives, the others say so after the timeout and a few seconds") {
  auto result = run_scoped(2, [](const WorldInfo& world, ncclkit::Store& scope) {
    if (world.rank == 0) return 0;
    try {
      exchange_fingerprints(scope, world.rank, world.world_size, 1, all_reduce(1, 8), 200ms, "test");
      return 2;
    } catch (const ncclkit::TimeoutError& e) {
      return contains(e.what(), "rank 0 has not reached this collective") ? 0 : 3;
    }
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

// Not a test: what the NCCL backend's check adds to each collective on the host (the store
// exchange; nothing runs on the GPU), printed for docs/performance.md. Skipped unless asked:
//   build/tests/tests_nccl --no-skip -tc="*cost*"
TEST_CASE("cost of one exchange on a TcpStore, 2 and 4 processes (run by hand)" * doctest::skip()) {
  for (int n : {2, 4}) {
    auto result = run_processes(n, [n](const WorldInfo& world, ncclkit::Store& scope) {
      constexpr int kRounds = 41, kCalls = 50;
      std::vector<double> times;
      std::uint64_t number = 0;
      for (int round = -1; round < kRounds; ++round) {
        const auto start = std::chrono::steady_clock::now();
        for (int i = 0; i < kCalls; ++i) {
          ++number;
          exchange_fingerprints(scope, world.rank, world.world_size, number, all_reduce(number, 1024), 60s, "cost");
        }
        const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
        if (round >= 0) times.push_back(us / kCalls);
      }
      std::sort(times.begin(), times.end());
      if (world.rank == 0) {
        std::printf(
            "%d processes: %.1f us per exchange in the fastest round, %.1f in the median one (%d rounds of %d)\n", n,
            times[0], times[kRounds / 2], kRounds, kCalls);
      }
      return 0;
    });
    CHECK_MESSAGE(result.ok(), result.describe());
  }
}
