// Tests of ncclkit/bootstrap/spawn.hpp with real processes.
#include <doctest/doctest.h>

#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/log.hpp"

using namespace std::chrono_literals;

TEST_CASE("spawn runs every rank with a shared private rendezvous folder") {
  auto result = ncclkit::spawn(8, [](const ncclkit::WorldInfo& world) {
    if (world.world_size != 8 || world.local_world_size != 8 || world.source != "spawn") return 10;
    if (world.init_url.rfind("file:///tmp/ncclkit-spawn-", 0) != 0) return 11;
    if (!std::filesystem::is_directory(world.init_url.substr(7))) return 12;
    return 0;
  });
  CHECK_MESSAGE(result.ok(), result.describe());
  REQUIRE(result.workers.size() == 8);
  for (int r = 0; r < 8; ++r) CHECK(result.workers[r].rank == r);
}

TEST_CASE("exit codes and exceptions are reported per rank") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::spawn(2, [](const ncclkit::WorldInfo& world) -> int {
    if (world.rank == 1) throw std::runtime_error("boom");
    return 0;
  });
  CHECK_FALSE(result.ok());
  CHECK(result.workers[1].exited);
  CHECK(result.workers[1].exit_code == 1);
  CHECK(result.describe().find("rank 1") != std::string::npos);
}

TEST_CASE("one failing worker stops the others, which would otherwise never end") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto start = std::chrono::steady_clock::now();
  auto result = ncclkit::spawn(4,
                               [](const ncclkit::WorldInfo& world) {
                                 if (world.rank == 2) ::_exit(3);
                                 for (;;) ::pause();  // blocks until a signal ends it
                               },
                               {.timeout = 60s, .grace = 500ms});
  auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited < 10s);
  CHECK(result.workers[2].exited);
  CHECK(result.workers[2].exit_code == 3);
  CHECK_FALSE(result.workers[2].stopped_by_spawn);
  for (int r : {0, 1, 3}) {
    CHECK(result.workers[r].stopped_by_spawn);
    CHECK_FALSE(result.workers[r].exited);
    CHECK(result.workers[r].signal == SIGTERM);
  }
}

TEST_CASE("workers that ignore SIGTERM are killed after the grace period") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  // Rank 0 fails only once rank 1 ignores SIGTERM (told through a pipe), so the SIGTERM that
  // spawn then sends cannot arrive before the worker ignores it.
  int ready[2];
  REQUIRE(::pipe(ready) == 0);
  auto result = ncclkit::spawn(2,
                               [&ready](const ncclkit::WorldInfo& world) {
                                 if (world.rank == 0) {
                                   pollfd wait_for{ready[0], POLLIN, 0};
                                   ::poll(&wait_for, 1, 30000);
                                   ::_exit(1);
                                 }
                                 ::signal(SIGTERM, SIG_IGN);
                                 const char byte = 1;
                                 if (::write(ready[1], &byte, 1) != 1) ::_exit(2);
                                 for (;;) ::pause();
                               },
                               {.timeout = 60s, .grace = 200ms});
  ::close(ready[0]);
  ::close(ready[1]);
  CHECK(result.workers[1].signal == SIGKILL);
}

TEST_CASE("the timeout kills workers that never end") {
  auto start = std::chrono::steady_clock::now();
  auto result = ncclkit::spawn(2,
                               [](const ncclkit::WorldInfo&) {
                                 for (;;) ::pause();
                               },
                               {.timeout = 300ms});
  auto waited = std::chrono::steady_clock::now() - start;
  CHECK(result.timed_out);
  CHECK_FALSE(result.ok());
  CHECK(waited >= 300ms);
  CHECK(waited < 5s);
  CHECK(result.describe().find("timed out") != std::string::npos);
}

TEST_CASE("bad arguments are clear errors") {
  CHECK_THROWS_WITH_AS(ncclkit::spawn(0, [](const ncclkit::WorldInfo&) {}), doctest::Contains("nprocs=0"),
                       ncclkit::ConfigError);
}

TEST_CASE("workers start with default signal handlers, whatever the parent installed") {
  auto previous = ::signal(SIGTERM, [](int) {});
  auto result = ncclkit::spawn(2, [](const ncclkit::WorldInfo&) {
    struct sigaction action {};
    ::sigaction(SIGTERM, nullptr, &action);
    return action.sa_handler == SIG_DFL ? 0 : 1;
  });
  ::signal(SIGTERM, previous);
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("exit statuses are collected even when the caller ignores SIGCHLD, which is restored") {
  // With SIGCHLD ignored the kernel reaps children itself, and waitpid finds no status to
  // report ("exit code -1") unless spawn restores the default disposition while it runs.
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto previous = ::signal(SIGCHLD, SIG_IGN);
  // Rank 1's failure makes spawn stop rank 0 if rank 0 has not exited yet (under load it may
  // not have): rank 1 fails a little later, and rank 0 may have either fate.
  auto result = ncclkit::spawn(2, [](const ncclkit::WorldInfo& world) {
    if (world.rank == 0) return 0;
    std::this_thread::sleep_for(100ms);
    return 3;
  });
  struct sigaction after {};
  ::sigaction(SIGCHLD, nullptr, &after);
  ::signal(SIGCHLD, previous);
  const bool restored = after.sa_handler == SIG_IGN;
  CHECK_MESSAGE(restored, "the caller's SIGCHLD disposition is restored");
  CHECK_FALSE(result.ok());
  const auto& first = result.workers[0];
  CHECK_MESSAGE(((first.exited && first.exit_code == 0) || (first.stopped_by_spawn && !first.exited)),
                first.describe());
  CHECK(result.workers[1].exited);
  CHECK(result.workers[1].exit_code == 3);
  CHECK(result.describe().find("exited with code 3") != std::string::npos);
}

TEST_CASE("a huge timeout (milliseconds::max()) does not stop the workers at once") {
  // now + milliseconds::max() can overflow into a deadline already passed: every worker would
  // be killed at once and the run reported as timed out.
  ncclkit::SpawnOptions options;
  options.timeout = std::chrono::milliseconds::max();
  auto result = ncclkit::spawn(
      2,
      [](const ncclkit::WorldInfo&) {
        std::this_thread::sleep_for(300ms);  // work that outlasts spawn's first look at the workers
        return 0;
      },
      options);
  CHECK_FALSE(result.timed_out);
  CHECK_MESSAGE(result.ok(), result.describe());
}
