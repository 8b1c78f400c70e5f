// The store protocol NCCL communicators are created with (ncclkit/nccl/detail/rendezvous.hpp): version
// exchange, the unique id from rank 0, errors that name ranks. Pure store logic, so it runs
// here, on machines without a GPU, with ranks as threads on a MemoryStore.
#include <doctest/doctest.h>

#include <chrono>  // std::chrono
#include <string>  // std::string
#include <vector>  // std::vector

#include "ncclkit/nccl/detail/rendezvous.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "support/thread_ranks.hpp"

namespace {

using ncclkit::Bytes;
using ncclkit::WorldInfo;
using ncclkit::nccl::detail::init_rendezvous;

const std::string kVersions = "NCCL 2.28.9, CUDA runtime 13.0, ncclkit 0.1.0";

Bytes fake_id() {
  Bytes id(128);
  for (std::size_t i = 0; i < id.size(); ++i) id[i] = static_cast<std::uint8_t>(i * 7 + 3);
  return id;
}

// Ranks as threads (tests/support/thread_ranks.hpp); their codes: 0 as expected, 2.. which
// expectation failed.
using ncclkit_test::run_thread_ranks;

TEST_CASE("every rank gets rank 0's unique id when versions agree") {
  auto result = run_thread_ranks(4, [](const WorldInfo& world, ncclkit::Store& store) {
    ncclkit::PrefixStore scope("comm/1", std::shared_ptr<ncclkit::Store>(&store, [](ncclkit::Store*) {}));
    const Bytes id =
        init_rendezvous(scope, world.rank, world.world_size, kVersions, std::chrono::seconds(20), fake_id, "test");
    return id == fake_id() ? 0 : 2;
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a version mismatch is a ConfigError on every rank, naming the ranks") {
  auto result = run_thread_ranks(3, [](const WorldInfo& world, ncclkit::Store& store) {
    ncclkit::PrefixStore scope("comm/1", std::shared_ptr<ncclkit::Store>(&store, [](ncclkit::Store*) {}));
    const std::string mine = world.rank == 2 ? "NCCL 2.27.3, CUDA runtime 12.8, ncclkit 0.1.0" : kVersions;
    try {
      (void)init_rendezvous(scope, world.rank, world.world_size, mine, std::chrono::seconds(20), fake_id, "test");
      return 2;
    } catch (const ncclkit::ConfigError& e) {
      const std::string message = e.what();
      if (message.find("ranks 0-1 run " + kVersions) == std::string::npos) return 3;
      if (message.find("rank 2 runs NCCL 2.27.3") == std::string::npos) return 4;
      return 0;
    }
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a rank that never arrives is named, within the timeout") {
  auto result = run_thread_ranks(3, [](const WorldInfo& world, ncclkit::Store& store) {
    if (world.rank == 1) return 0;  // never takes part
    ncclkit::PrefixStore scope("comm/1", std::shared_ptr<ncclkit::Store>(&store, [](ncclkit::Store*) {}));
    const auto start = std::chrono::steady_clock::now();
    try {
      (void)init_rendezvous(scope, world.rank, world.world_size, kVersions, std::chrono::seconds(1), fake_id, "test");
      return 2;
    } catch (const ncclkit::TimeoutError& e) {
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (waited > 3.0) return 3;
      const std::string message = e.what();
      if (world.rank == 0 && message.find("for rank(s) 1 to arrive") == std::string::npos) return 4;
      // The other ranks name the missing rank too, not only rank 0.
      if (world.rank == 2 && (message.find("rank 0 to publish") == std::string::npos ||
                              message.find("still waiting for rank(s) 1 to arrive") == std::string::npos)) {
        return 5;
      }
      return 0;
    }
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("when rank 0 never arrives, the others say so") {
  auto result = run_thread_ranks(3, [](const WorldInfo& world, ncclkit::Store& store) {
    if (world.rank == 0) return 0;  // never takes part
    ncclkit::PrefixStore scope("comm/1", std::shared_ptr<ncclkit::Store>(&store, [](ncclkit::Store*) {}));
    try {
      (void)init_rendezvous(scope, world.rank, world.world_size, kVersions, std::chrono::seconds(1), fake_id, "test");
      return 2;
    } catch (const ncclkit::TimeoutError& e) {
      const std::string message = e.what();
      return message.find("rank 0 never arrived; is it running") != std::string::npos ? 0 : 3;
    }
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("two scopes on one store do not mix") {
  auto result = run_thread_ranks(2, [](const WorldInfo& world, ncclkit::Store& store) {
    auto base = std::shared_ptr<ncclkit::Store>(&store, [](ncclkit::Store*) {});
    ncclkit::PrefixStore first("comm/1", base), second("comm/2", base);
    // The second scope disagrees on versions; the first must still succeed.
    const std::string odd = world.rank == 1 ? "NCCL 0.0.0" : kVersions;
    bool second_failed = false;
    try {
      (void)init_rendezvous(second, world.rank, world.world_size, odd, std::chrono::seconds(20), fake_id, "second");
    } catch (const ncclkit::ConfigError&) {
      second_failed = true;
    }
    const Bytes id =
        init_rendezvous(first, world.rank, world.world_size, kVersions, std::chrono::seconds(20), fake_id, "first");
    return second_failed && id == fake_id() ? 0 : 2;
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

}  // namespace
