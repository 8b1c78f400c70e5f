// Tests of ncclkit/bootstrap/init_url.hpp: make_store, end to end with real processes and
// stores (parsing the URLs: test_init_url.cpp).
#include <doctest/doctest.h>

// ncclkit-test: timeout=120
#include <arpa/inet.h>   // htons
#include <netinet/in.h>  // sockaddr_in6, in6addr_loopback
#include <sys/socket.h>  // socket, bind
#include <unistd.h>      // close

#include <cerrno>      // errno, EADDRINUSE
#include <chrono>      // std::chrono::milliseconds
#include <cstdint>     // std::int64_t
#include <cstdio>      // std::fopen
#include <cstdlib>     // setenv, unsetenv, mkdtemp
#include <filesystem>  // std::filesystem::remove_all
#include <memory>      // std::shared_ptr
#include <random>      // std::mt19937_64
#include <stdexcept>   // std::runtime_error
#include <string>      // std::string
#include <vector>      // std::vector

#include "ncclkit/bootstrap/environment.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/store/barrier.hpp"
#include "support/ports.hpp"

using ncclkit::ConfigError;
using namespace std::chrono_literals;

namespace {

// Throws with `what` when `condition` fails: inside a spawned worker that becomes exit code 1
// and a logged message, which the parent's CHECK on the SpawnResult reports.
void expect(bool condition, const std::string& what) {
  if (!condition) throw std::runtime_error("check failed: " + what);
}

// A port for rank 0's server: drawn outside the kernel's ephemeral range (support/ports.hpp), so
// that no other test's port-0 socket takes it before rank 0 binds it. For IPv6, also free on
// ::1; -1 where this machine has no IPv6 loopback.
int free_loopback_port(int family = AF_INET) {
  if (family == AF_INET) return ncclkit_test::free_port();
  for (int attempt = 0; attempt < 20; ++attempt) {
    const int port = ncclkit_test::free_port();
    const int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_loopback;
    address.sin6_port = htons(static_cast<std::uint16_t>(port));
    const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    const int error = errno;
    ::close(fd);
    if (bound) return port;
    if (error != EADDRINUSE) return -1;  // no ::1 here
  }
  return -1;
}

// Every rank publishes a random value, waits for all through a barrier, checks every other
// rank's value and adds to a shared counter; the sum must be exact.
void rendezvous_through(ncclkit::Store& store, const ncclkit::WorldInfo& world) {
  auto value_of = [](int rank) {
    std::mt19937_64 random(0x5eed0000u + static_cast<unsigned>(rank));
    std::string value(1 + random() % 64, '\0');
    for (char& c : value) c = static_cast<char>(random() % 256);
    return value;
  };
  store.set("value/" + std::to_string(world.rank), value_of(world.rank));
  const std::int64_t after_add = store.add("counter", world.rank + 1);
  expect(after_add >= world.rank + 1, "add returned " + std::to_string(after_add));
  ncclkit::barrier(store, world.rank, world.world_size, "values", 20s);
  for (int other = 0; other < world.world_size; ++other) {
    expect(store.get_string("value/" + std::to_string(other), 20s) == value_of(other),
           "value of rank " + std::to_string(other));
  }
  const std::int64_t expected = std::int64_t{world.world_size} * (world.world_size + 1) / 2;
  const std::int64_t total = store.add("counter", 0);
  expect(total == expected, "counter " + std::to_string(total) + " != " + std::to_string(expected));
  // With the server inside rank 0, rank 0 must stop last: a barrier lets it go as soon as all
  // arrived, while the others may still be reading the barrier's keys. So the others say when
  // they are done with the store, and rank 0 waits for that.
  if (world.rank != 0) {
    store.set("left/" + std::to_string(world.rank), "1");
  } else {
    std::vector<std::string> left;
    for (int other = 1; other < world.world_size; ++other) left.push_back("left/" + std::to_string(other));
    store.wait(left, 20s);
  }
}

}  // namespace

TEST_CASE("the docs/bootstrap.md snippet runs under a torchrun-style environment") {
  auto result = ncclkit::spawn(
      4,
      [](const ncclkit::WorldInfo& given) {
        // Each worker is its own process: setting its environment touches no other test.
        ::setenv("RANK", std::to_string(given.rank).c_str(), 1);
        ::setenv("WORLD_SIZE", "4", 1);
        ::setenv("LOCAL_RANK", std::to_string(given.rank).c_str(), 1);
        ::setenv("LOCAL_WORLD_SIZE", "4", 1);
        ::setenv("NCCLKIT_INIT_URL", given.init_url.c_str(), 1);
        ::setenv("NCCLKIT_STORE_TIMEOUT", "30", 1);  // a failure ends in 30 s, not the default 300 s
        // --- the snippet ---
        ncclkit::WorldInfo world = ncclkit::detect_world();  // arguments, else torchrun/mpirun/srun variables
        std::shared_ptr<ncclkit::Store> store = ncclkit::make_store(world.init_url, world);
        ncclkit::barrier(*store, world.rank, world.world_size, "started");
        // --- end ---
        expect(world.rank == given.rank && world.init_url == given.init_url, "detected " + world.source);
      },
      {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("file:// : 8 processes rendezvous through the FileStore the URL names") {
  char pattern[] = "/tmp/ncclkit-test-url-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  const std::string url = std::string("file://") + pattern + "/rdv?timeout=30";  // a folder yet to be created
  auto result = ncclkit::spawn(8,
                               [&](const ncclkit::WorldInfo& world) {
                                 auto store = ncclkit::make_store(url, world);
                                 expect(store->describe().find(pattern) != std::string::npos,
                                        "describe() = " + store->describe());
                                 expect(store->default_timeout() == 30s, "timeout from the URL");
                                 rendezvous_through(*store, world);
                               },
                               {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
  std::filesystem::remove_all(pattern);
}

TEST_CASE("tcp:// : rank 0 starts the server, 8 processes rendezvous") {
  const int port = free_loopback_port();
  REQUIRE(port > 0);
  const std::string url = "tcp://127.0.0.1:" + std::to_string(port) + "?timeout=30";
  auto result = ncclkit::spawn(8,
                               [&](const ncclkit::WorldInfo& world) {
                                 auto store = ncclkit::make_store(url, world);
                                 rendezvous_through(*store, world);
                               },
                               {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("tcp://[::1] : IPv6 loopback") {
  const int port = free_loopback_port(AF_INET6);
  if (port <= 0) {
    MESSAGE("skipped: no IPv6 loopback on this machine");
    return;
  }
  const std::string url = "tcp://[::1]:" + std::to_string(port) + "?timeout=30";
  auto result = ncclkit::spawn(3,
                               [&](const ncclkit::WorldInfo& world) {
                                 auto store = ncclkit::make_store(url, world);
                                 rendezvous_through(*store, world);
                               },
                               {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("tcp://...?server=external : spawn's own server, every rank a client") {
  auto result = ncclkit::spawn(8,
                               [](const ncclkit::WorldInfo& world) {
                                 expect(world.init_url.find("server=external") != std::string::npos,
                                        "init_url " + world.init_url);
                                 auto store = ncclkit::make_store(world.init_url, world, {.timeout = 30s});
                                 rendezvous_through(*store, world);
                               },
                               {.timeout = 60s, .store = ncclkit::SpawnStore::kTcp});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("env:// : detect_world from torchrun's variables, then make_store") {
  const int port = free_loopback_port();
  REQUIRE(port > 0);
  auto result = ncclkit::spawn(
      4,
      [&](const ncclkit::WorldInfo& given) {
        auto world =
            ncclkit::detect_world({}, ncclkit::fixed_environment({{"RANK", std::to_string(given.rank)},
                                                                  {"WORLD_SIZE", "4"},
                                                                  {"LOCAL_RANK", std::to_string(given.rank % 2)},
                                                                  {"LOCAL_WORLD_SIZE", "2"},
                                                                  {"MASTER_ADDR", "127.0.0.1"},
                                                                  {"MASTER_PORT", std::to_string(port)}}));
        expect(world.init_url == "env://" && world.node_rank == given.rank / 2, "detected " + world.source);
        auto store = ncclkit::make_store(world.init_url, world, {.timeout = 30s});
        rendezvous_through(*store, world);
      },
      {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a single process needs no setup") {
  ncclkit::WorldInfo world = ncclkit::detect_world({}, ncclkit::fixed_environment({}));
  auto store = ncclkit::make_store(world.init_url, world);  // tcp://127.0.0.1:0
  store->set("k", "v");
  CHECK(store->get_string("k") == "v");
  ncclkit::barrier(*store, 0, 1, "alone");
  auto from_env_url = ncclkit::make_store("env://", world);  // no MASTER_ADDR/PORT: loopback, free port
  CHECK(from_env_url->add("n", 5) == 5);
}

TEST_CASE("timeouts: NCCLKIT_STORE_TIMEOUT > options > URL, and they reach the store") {
  char pattern[] = "/tmp/ncclkit-test-url-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  const std::string dir = std::string("file://") + pattern;
  ncclkit::WorldInfo world;  // rank 0 of 1
  {
    auto store = ncclkit::make_store(dir + "/a?timeout=0.3", world);
    CHECK(store->default_timeout() == 300ms);
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_AS(store->get("never-set"), ncclkit::TimeoutError);
    const auto waited = std::chrono::steady_clock::now() - start;
    CHECK(waited >= 300ms);
    CHECK(waited < 300ms + 2s);  // the store's bound is max(10%, 250 ms); generous on a busy machine
  }
  CHECK(ncclkit::make_store(dir + "/b?timeout=5", world, {.timeout = 700ms})->default_timeout() == 700ms);
  ::setenv("NCCLKIT_STORE_TIMEOUT", "2", 1);
  auto from_environment = ncclkit::make_store(dir + "/c", world)->default_timeout();
  auto environment_beats_url = ncclkit::make_store(dir + "/d?timeout=4", world)->default_timeout();
  auto environment_beats_options = ncclkit::make_store(dir + "/g", world, {.timeout = 700ms})->default_timeout();
  ::unsetenv("NCCLKIT_STORE_TIMEOUT");
  CHECK(from_environment == 2s);
  CHECK(environment_beats_url == 2s);
  CHECK(environment_beats_options == 2s);
  CHECK(ncclkit::make_store(dir + "/e", world)->default_timeout() == 300s);
  CHECK_THROWS_WITH_AS(ncclkit::make_store(dir + "/f", world, {.timeout = 0ms}), doctest::Contains("must be positive"),
                       ConfigError);
  auto tcp = ncclkit::make_store("tcp://127.0.0.1:0?timeout=1.25", world);
  CHECK(tcp->default_timeout() == 1250ms);
  std::filesystem::remove_all(pattern);
}

TEST_CASE("make_store refuses what cannot work, saying why") {
  ncclkit::WorldInfo two;
  two.rank = 1;
  two.world_size = 2;
  two.local_world_size = 2;
  two.local_rank = 1;
  two.source = "test";
  CHECK_THROWS_WITH_AS(ncclkit::make_store("env://", two),
                       doctest::Contains("env:// needs MASTER_ADDR and MASTER_PORT"), ConfigError);
  two.master_addr = "node0";
  CHECK_THROWS_WITH_AS(ncclkit::make_store("env://", two), doctest::Contains("env:// needs MASTER_PORT"), ConfigError);
  two.master_addr.clear();
  two.master_port = 29500;
  CHECK_THROWS_WITH_AS(ncclkit::make_store("env://", two), doctest::Contains("env:// needs MASTER_ADDR"), ConfigError);
  CHECK_THROWS_WITH_AS(ncclkit::make_store("tcp://127.0.0.1:0", two),
                       doctest::Contains("the other 1 ranks cannot know"), ConfigError);
  ncclkit::WorldInfo one;
  CHECK_THROWS_WITH_AS(ncclkit::make_store("tcp://127.0.0.1:0?server=external", one),
                       doctest::Contains("clients of an external server cannot know"), ConfigError);
  CHECK_THROWS_WITH_AS(ncclkit::make_store("file://relative", one), doctest::Contains("three slashes"), ConfigError);
  ncclkit::WorldInfo broken;
  broken.rank = 3;
  broken.world_size = 2;
  CHECK_THROWS_WITH_AS(ncclkit::make_store("file:///tmp/never-created", broken),
                       doctest::Contains("rank=3 must be in [0, world_size=2)"), ConfigError);
  CHECK_FALSE(std::filesystem::exists("/tmp/never-created"));
  // Times in the message are seconds, as in every store message.
  CHECK_THROWS_WITH_AS(ncclkit::make_store("file:///tmp/never-created", one, {.timeout = -1500ms}),
                       doctest::Contains("the timeout must be positive, got -1.500 s"), ConfigError);
}

TEST_CASE("file:// naming an existing regular file says that file:// names a folder here") {
  char pattern[] = "/tmp/ncclkit-init-url-XXXXXX";
  REQUIRE(::mkdtemp(pattern) != nullptr);
  const std::string dir = pattern;
  const std::string file = dir + "/store-file";  // what PyTorch's init_method="file://..." names
  {
    std::FILE* f = std::fopen(file.c_str(), "w");
    REQUIRE(f != nullptr);
    std::fclose(f);
  }
  ncclkit::WorldInfo one;
  CHECK_THROWS_WITH_AS(ncclkit::make_store("file://" + file, one),
                       doctest::Contains("is a regular file, but a FileStore (and a file:// init URL) names a folder"),
                       ConfigError);
  std::filesystem::remove_all(dir);
}
