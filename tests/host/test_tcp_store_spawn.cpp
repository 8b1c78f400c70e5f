// Multi-process tests of TcpStore through spawn(..., {.store = SpawnStore::kTcp}): real
// processes rendezvous, count, pass barriers and exchange large values through a server in
// the test process, which spawn starts only after forking.
#include <doctest/doctest.h>

#include <unistd.h>  // pipe, read, write: a worker reports its port to the test

#include <chrono>   // std::chrono
#include <cstdint>  // std::uint8_t, std::int64_t
#include <random>   // std::mt19937_64: per-rank random values
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/tcp_store.hpp"
#include "support/ports.hpp"

using namespace std::chrono_literals;
using ncclkit::Bytes;
using ncclkit::SpawnStore;
using ncclkit::TcpStore;
using ncclkit::WorldInfo;
using Clock = std::chrono::steady_clock;

namespace {

ncclkit::TcpStoreOptions store_options(const WorldInfo& world, std::chrono::milliseconds timeout = 60s) {
  return {.host = world.master_addr, .port = world.master_port, .timeout = timeout};
}

/// The value rank `rank` publishes: `bytes` random bytes from a seed of its own.
Bytes rank_value(int rank, std::size_t bytes) {
  std::mt19937_64 random(static_cast<std::uint64_t>(rank) * 1000003u + 17u);
  Bytes value(bytes);
  for (auto& b : value) b = static_cast<std::uint8_t>(random());
  return value;
}

/// A worker's failure: logged (so the test output says why) and returned as its exit code.
int fail(int code, const std::string& why) {
  ncclkit::log_error(why);
  return code;
}

ncclkit::SpawnOptions tcp_spawn(std::chrono::milliseconds timeout = 120s) {
  return {.timeout = timeout, .store = SpawnStore::kTcp};
}

}  // namespace

TEST_CASE("2, 8 and 64 processes rendezvous through spawn's TcpStore") {
  for (int nprocs : {2, 8, 64}) {
    CAPTURE(nprocs);
    auto result = ncclkit::spawn(
        nprocs,
        [nprocs](const WorldInfo& world) -> int {
          const std::string expected_url = "tcp://127.0.0.1:" + std::to_string(world.master_port);
          if (world.init_url.rfind(expected_url, 0) != 0) {
            return fail(10, "init_url " + world.init_url + " does not start with " + expected_url);
          }
          TcpStore store(store_options(world));
          store.set("rank/" + std::to_string(world.rank), rank_value(world.rank, 32));
          std::vector<std::string> keys;
          for (int r = 0; r < nprocs; ++r) keys.push_back("rank/" + std::to_string(r));
          store.wait(keys, 60s);
          for (int r = 0; r < nprocs; ++r) {
            if (store.get(keys[static_cast<std::size_t>(r)]) != rank_value(r, 32))
              return fail(11, "wrong value of " + keys[r]);
          }
          if (store.num_keys() != nprocs) return fail(12, "num_keys " + std::to_string(store.num_keys()));
          return 0;
        },
        tcp_spawn());
    CHECK_MESSAGE(result.ok(), result.describe());
  }
}

TEST_CASE("add from every rank of 8 and 64 processes sums exactly") {
  for (int nprocs : {8, 64}) {
    CAPTURE(nprocs);
    constexpr int kAdds = 40;
    auto result = ncclkit::spawn(
        nprocs,
        [nprocs](const WorldInfo& world) -> int {
          TcpStore store(store_options(world));
          std::int64_t last = 0;
          for (int i = 0; i < kAdds; ++i) {
            const std::int64_t now = store.add("sum", world.rank + 1);
            // Other ranks only add positive amounts, so what this rank sees grows by at least its own.
            if (now < last + world.rank + 1) return fail(20, "add went backwards: " + std::to_string(now));
            last = now;
          }
          ncclkit::barrier(store, world.rank, world.world_size, "adds", 60s);
          const std::int64_t expected = std::int64_t{kAdds} * nprocs * (nprocs + 1) / 2;
          const std::int64_t total = store.add("sum", 0);
          if (total != expected) return fail(21, "sum " + std::to_string(total) + " != " + std::to_string(expected));
          return 0;
        },
        tcp_spawn());
    CHECK_MESSAGE(result.ok(), result.describe());
  }
}

TEST_CASE("a reused barrier over TcpStore: nobody leaves round k before everyone arrived") {
  constexpr int kRounds = 5;
  auto result = ncclkit::spawn(
      8,
      [](const WorldInfo& world) -> int {
        TcpStore store(store_options(world));
        for (int round = 0; round < kRounds; ++round) {
          const std::string prefix = "arrived/" + std::to_string(round) + "/";
          store.set(prefix + std::to_string(world.rank), "1");
          ncclkit::barrier(store, world.rank, world.world_size, "rounds", 60s);
          for (int r = 0; r < world.world_size; ++r) {
            if (!store.check({prefix + std::to_string(r)})) {
              return fail(30, "left round " + std::to_string(round) + " before rank " + std::to_string(r) + " arrived");
            }
          }
        }
        return 0;
      },
      tcp_spawn());
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("values of 0 B and 16 MiB pass between processes exactly") {
  constexpr std::size_t kLarge = std::size_t{16} << 20;
  auto result = ncclkit::spawn(
      4,
      [](const WorldInfo& world) -> int {
        TcpStore store(store_options(world));
        store.set("empty/" + std::to_string(world.rank), Bytes{});
        store.set("large/" + std::to_string(world.rank), rank_value(world.rank, kLarge));
        const int next = (world.rank + 1) % world.world_size;
        if (!store.get("empty/" + std::to_string(next), 60s).empty()) return fail(40, "empty value is not empty");
        if (store.get("large/" + std::to_string(next), 60s) != rank_value(next, kLarge))
          return fail(41, "16 MiB value differs");
        return 0;
      },
      tcp_spawn());
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a rank that never arrives makes the others fail, naming it, within the timeout bounds") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  static constexpr std::chrono::milliseconds kTimeout{1000};
  auto result = ncclkit::spawn(
      4,
      [](const WorldInfo& world) -> int {
        if (world.rank == 3) return 0;  // never arrives
        TcpStore store(store_options(world));
        const auto start = Clock::now();
        try {
          ncclkit::barrier(store, world.rank, world.world_size, "stuck", kTimeout);
          return fail(50, "barrier passed without rank 3");
        } catch (const ncclkit::TimeoutError& e) {
          const auto waited = Clock::now() - start;
          const std::string message = e.what();
          if (message.find("never arrived: 3") == std::string::npos)
            return fail(51, "message does not name rank 3: " + message);
          if (waited < kTimeout) return fail(52, "timed out early");
          if (waited > kTimeout + 250ms) return fail(53, "timed out late");
        }
        // A plain rendezvous on rank keys names the missing key the same way.
        store.set("rank/" + std::to_string(world.rank), "here");
        try {
          store.wait({"rank/0", "rank/1", "rank/2", "rank/3"}, 500ms);
          return fail(54, "wait passed without rank 3");
        } catch (const ncclkit::TimeoutError& e) {
          const std::string message = e.what();
          if (message.find("'rank/3'") == std::string::npos) return fail(55, "wait does not name rank/3: " + message);
        }
        return 0;
      },
      tcp_spawn());
  ncclkit::set_log_level(ncclkit::LogLevel::kWarn);
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("spawn's TcpStore server is gone once spawn returns") {
  int fds[2];
  REQUIRE(::pipe(fds) == 0);
  auto result = ncclkit::spawn(
      2,
      [&fds](const WorldInfo& world) -> int {
        TcpStore store(store_options(world));
        ncclkit::barrier(store, world.rank, world.world_size, "end", 60s);
        if (world.rank == 0 &&
            ::write(fds[1], &world.master_port, sizeof world.master_port) != sizeof world.master_port)
          return 60;
        return 0;
      },
      tcp_spawn());
  CHECK_MESSAGE(result.ok(), result.describe());
  int port = 0;
  REQUIRE(::read(fds[0], &port, sizeof port) == sizeof port);
  ::close(fds[0]);
  ::close(fds[1]);
  // The kernel handed the server this port from its ephemeral range: holding it keeps another
  // test's port-0 server from being given it before the connect below.
  const ncclkit_test::ClosedPort closed(port);
  CHECK_THROWS_WITH_AS(TcpStore({.port = port, .timeout = 300ms}), doctest::Contains("Connection refused"),
                       ncclkit::TimeoutError);
}
