// Failure drills for ncclkit::gloo::Communicator with real processes: a peer that exits
// mid-run, a peer stopped with SIGSTOP, a peer that skips a collective, a failure under work
// queued on the comm stream, a rank that never shows up at the rendezvous, and repeated trials
// of a peer dying in the middle of large collectives. Every other rank must raise CommError
// (TimeoutError for the rendezvous) within its timeout + 5 s (within 2 s of a death, whatever
// the timeout), naming the rank to blame where there is one, refuse later calls, and end;
// nothing may hang (spawn's own limit would kill a hung rank, and the test would fail on its
// exit status).
// ncclkit-test: timeout=300
#include <doctest/doctest.h>

#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "ncclkit/core/env.hpp"
#include "ncclkit/store/memory_store.hpp"
#include "support/gloo_testing.hpp"

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using ncclkit::CommError;
using ncclkit::ReduceOp;
using ncclkit::WorldInfo;
using ncclkit::gloo::Communicator;
using ncclkit::testing::Checker;

namespace {

constexpr auto kTimeout = 2s;
constexpr auto kSlack = 5s;
/// How soon after a peer's death the survivors must know, whatever the timeout.
constexpr auto kDetectionBound = 2s;

/// Runs `collective`, expects a CommError within `limit` whose message names what happened
/// (and, given `blame`, says "connection to rank <blame>"); records the time waited.
template <class Fn>
void expect_comm_error(Checker& check, const char* what, Fn&& collective, bool expect_timeout_in_message = false,
                       int blame = -1, std::chrono::milliseconds limit = kTimeout + kSlack) {
  const auto start = Clock::now();
  try {
    collective();
    check.expect(false, std::string(what) + ": no CommError");
  } catch (const CommError& e) {
    const auto waited = Clock::now() - start;
    const std::string message = e.what();
    check.expect(waited <= limit, std::string(what) + ": CommError only after " +
                                      std::to_string(std::chrono::duration<double>(waited).count()) + " s");
    check.expect(message.find("rank ") != std::string::npos && message.find(" #") != std::string::npos &&
                     message.find("failed after") != std::string::npos,
                 std::string(what) + ": message lacks rank, sequence number or time: " + message);
    if (expect_timeout_in_message) {
      // Gloo's own "Timed out" (every message has "(timeout N s)", so that cannot be the test),
      // or, where another survivor timed out first and closed its connections, that failure.
      check.expect(
          message.find("Timed out") != std::string::npos || message.find("connection to rank") != std::string::npos,
          std::string(what) + ": message says neither that it timed out nor which connection failed: " + message);
    }
    if (blame >= 0) {
      const std::string phrase = "connection to rank " + std::to_string(blame) + " failed";
      check.expect(message.find(phrase) != std::string::npos,
                   std::string(what) + ": message does not say '" + phrase + "': " + message);
    }
  }
}

/// Whether process `pid` is stopped (state T in /proc/<pid>/stat) within `limit`.
bool wait_until_stopped(pid_t pid, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    std::FILE* stat = std::fopen(("/proc/" + std::to_string(pid) + "/stat").c_str(), "r");
    char state = '?';
    if (stat) {
      if (std::fscanf(stat, "%*d %*s %c", &state) != 1) state = '?';
      std::fclose(stat);
    }
    if (state == 'T' || state == 't') return true;
    std::this_thread::sleep_for(1ms);
  }
  return false;
}

/// After a failure: the next call is refused with CommError saying so, at once.
void expect_refused(Checker& check, Communicator& comm) {
  check.expect(comm.failed(), "failed() after the failure");
  std::vector<float> x(4, 1.0f);
  const auto start = Clock::now();
  try {
    comm.all_reduce(std::span<float>(x));
    check.expect(false, "a call after the failure was not refused");
  } catch (const CommError& e) {
    check.expect(std::string(e.what()).find("unusable") != std::string::npos, std::string("refusal: ") + e.what());
  }
  check.expect(Clock::now() - start < 1s, "the refusal took long");
}

}  // namespace

TEST_CASE(
    "a peer that exits mid-run makes every other rank raise CommError naming it, promptly, and refuse later calls") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result =
      ncclkit::spawn(4,
                     [](const WorldInfo& world) {
                       auto store = ncclkit::make_store(world.init_url, world);
                       Checker check(world.rank);
                       Communicator comm(store, world, {.timeout = kTimeout});
                       std::vector<float> data(1 << 16, 1.0f);
                       for (int i = 0; i < 3; ++i) comm.all_reduce(std::span<float>(data));
                       check.expect(data[0] == 64.0f, "the first all_reduces worked");
                       if (world.rank == 2) {
                         // Gone, without a word, once the others have finished the three (a death fails the
                         // collective in flight on every rank); exit code 0: spawn lets the others run on.
                         store->wait({std::string("done/0"), std::string("done/1"), std::string("done/3")}, 30s);
                         ::_exit(0);
                       }
                       store->set("done/" + std::to_string(world.rank), "1");
                       // Promptly: the peer monitor's doing, in milliseconds; the 2 s timeout is no part of it.
                       expect_comm_error(
                           check, "all_reduce after a peer exited", [&] { comm.all_reduce(std::span<float>(data)); },
                           /*expect_timeout_in_message=*/false, /*blame=*/2, std::chrono::milliseconds(kTimeout) / 4);
                       expect_refused(check, comm);
                       return check.code();
                     },
                     {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a peer that exits while others wait in gather or recv is named at once, long before the timeout") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result =
      ncclkit::spawn(3,
                     [](const WorldInfo& world) {
                       auto store = ncclkit::make_store(world.init_url, world);
                       Checker check(world.rank);
                       // A timeout far beyond expect_comm_error's bound: only the peer monitor can be that quick.
                       Communicator comm(store, world, {.timeout = 60s});
                       std::vector<float> part(1000, 1.0f), all(3000);
                       if (world.rank == 2) {
                         std::this_thread::sleep_for(500ms);  // the others are waiting by now
                         ::_exit(0);                          // never sends its part
                       }
                       if (world.rank == 0) {
                         expect_comm_error(
                             check, "gather whose peer exited", [&] { comm.gather(part.data(), all.data(), 1000, 0); },
                             /*expect_timeout_in_message=*/false, /*blame=*/2);
                       } else {
                         comm.gather(part.data(), all.data(), 1000, 0);  // rank 1's part reaches the root
                         expect_comm_error(
                             check, "recv whose peer exited", [&] { comm.recv(part.data(), part.size(), 2); },
                             /*expect_timeout_in_message=*/false, /*blame=*/2);
                       }
                       expect_refused(check, comm);
                       return check.code();
                     },
                     {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a write on a connection that broke unnoticed fails with CommError, not a SIGPIPE that kills the rank") {
  // The race of a rank that writes to a connection whose other end went away before its Gloo
  // event loop saw it go: the write raises SIGPIPE, whose default action kills the process.
  // ncclkit blocks SIGPIPE while Gloo runs, so the write fails with EPIPE and the rank gets
  // CommError. Provoked every time: rank 0 stops its peer (which then cannot react), shuts down
  // the sending side of its own sockets (every later write fails with EPIPE at once, and nothing
  // arrives that its event loop could notice first), and only then broadcasts.
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::spawn(
      2,
      [](const WorldInfo& world) {
        auto store = ncclkit::make_store(world.init_url, world);
        Checker check(world.rank);
        std::vector<std::uint8_t> data(4 << 20, 7);
        Communicator comm(store, world, {.timeout = kTimeout});
        comm.broadcast(std::span<std::uint8_t>(data), 0);
        if (world.rank == 1) {
          store->set("pid1", std::to_string(::getpid()));
          store->wait({std::string("drill_done")}, 60s);  // stopped and resumed by rank 0 meanwhile
          return 0;
        }
        const pid_t peer = static_cast<pid_t>(std::stol(store->get_string("pid1", 30s)));
        ::kill(peer, SIGSTOP);
        check.expect(wait_until_stopped(peer, 30s), "the peer did not stop");
        // The store is a FileStore: every socket of this process is one of Gloo's connections.
        int shut = 0;
        for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
          const int fd = std::stoi(entry.path().filename().string());
          struct stat info {};
          if (::fstat(fd, &info) == 0 && S_ISSOCK(info.st_mode) && ::shutdown(fd, SHUT_WR) == 0) ++shut;
        }
        check.expect(shut >= 1, "no connected socket to shut down");
        // Gloo takes EPIPE for "try again later", so the broadcast fails at its timeout.
        expect_comm_error(
            check, "broadcast on connections shut down", [&] { comm.broadcast(std::span<std::uint8_t>(data), 0); },
            /*expect_timeout_in_message=*/true);
        // Alive, so the SIGPIPE was blocked; it was consumed, and the signal mask is as before.
        sigset_t pending, mask;
        sigemptyset(&pending);
        ::sigpending(&pending);
        check.expect(!sigismember(&pending, SIGPIPE), "a SIGPIPE is left pending");
        ::pthread_sigmask(SIG_SETMASK, nullptr, &mask);
        check.expect(!sigismember(&mask, SIGPIPE), "SIGPIPE is left blocked");
        ::kill(peer, SIGCONT);
        store->set("drill_done", "1");
        return check.code();
      },
      {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a peer stopped with SIGSTOP makes every other rank raise CommError within its timeout + 5 s") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result =
      ncclkit::spawn(3,
                     [](const WorldInfo& world) {
                       auto store = ncclkit::make_store(world.init_url, world);
                       Checker check(world.rank);
                       {
                         Communicator comm(store, world, {.timeout = kTimeout});
                         std::vector<double> data(1000, 1.0);
                         comm.all_reduce(std::span<double>(data));
                         if (world.rank == 1) {
                           store->set("stopped_pid", std::to_string(::getpid()));
                           ::raise(SIGSTOP);  // frozen until rank 0 sends SIGCONT
                           // Resumed: the others are gone; this collective must fail too, not hang.
                           expect_comm_error(
                               check, "all_reduce of the resumed rank",
                               [&] { comm.all_reduce(std::span<double>(data)); },
                               /*expect_timeout_in_message=*/false);
                           expect_refused(check, comm);
                           return check.code();
                         }
                         expect_comm_error(
                             check, "all_reduce with a stopped peer", [&] { comm.all_reduce(std::span<double>(data)); },
                             /*expect_timeout_in_message=*/true);
                         expect_refused(check, comm);
                       }
                       store->set("survivor_done/" + std::to_string(world.rank), "1");
                       if (world.rank == 0) {
                         // Wake the stopped rank once every survivor is done, so that it ends too.
                         store->wait({std::string("survivor_done/0"), std::string("survivor_done/2")}, 30s);
                         const pid_t stopped = static_cast<pid_t>(std::stol(store->get_string("stopped_pid", 30s)));
                         ::kill(stopped, SIGCONT);
                       }
                       return check.code();
                     },
                     {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a peer that skips a collective makes the others time out with CommError, not hang") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::spawn(
      2,
      [](const WorldInfo& world) {
        auto store = ncclkit::make_store(world.init_url, world);
        Checker check(world.rank);
        // One communicator per collective: a failure makes a communicator unusable.
        Communicator for_broadcast(store, world, {.timeout = kTimeout, .name = "b"});
        Communicator for_all_reduce(store, world, {.timeout = kTimeout, .name = "a"});
        std::vector<std::int32_t> data(10, 1);
        if (world.rank == 0) {
          expect_comm_error(
              check, "broadcast the peer skipped", [&] { for_broadcast.broadcast(std::span<std::int32_t>(data), 1); },
              /*expect_timeout_in_message=*/true);
          // Two ranks: ncclkit's own all-reduce exchange, bounded the same way.
          expect_comm_error(
              check, "all_reduce the peer skipped", [&] { for_all_reduce.all_reduce(std::span<std::int32_t>(data)); },
              /*expect_timeout_in_message=*/true);
          store->set("rank0_done", "1");
        } else {
          store->wait({std::string("rank0_done")}, 30s);  // alive, but never joins the broadcast
        }
        return check.code();
      },
      {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a failure on the comm stream surfaces at synchronize and on events; later work is refused") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::testing::run_gloo(
      2,
      [](Communicator& comm, const WorldInfo& world, Checker& check) {
        if (world.rank == 1) ::_exit(0);
        std::vector<float> a(1000, 1.0f), b(1000, 1.0f), c(1000, 1.0f);
        const auto stream = comm.comm_stream();
        comm.all_reduce(std::span<float>(a), ReduceOp::kSum, stream);
        auto after_a = comm.record(stream);
        comm.all_reduce(std::span<float>(b), ReduceOp::kSum, stream);
        comm.all_reduce(std::span<float>(c), ReduceOp::kSum, stream);
        expect_comm_error(
            check, "synchronize(comm stream)", [&] { comm.synchronize(stream); },
            /*expect_timeout_in_message=*/false, /*blame=*/1);
        bool event_failed = false;
        try {
          after_a.wait();
        } catch (const CommError&) {
          event_failed = true;
        }
        check.expect(event_failed, "the event of the failed collective rethrows");
        expect_refused(check, comm);
        bool refused_at_issue = false;
        try {
          comm.all_reduce(std::span<float>(a), ReduceOp::kSum, stream);
        } catch (const CommError&) {
          refused_at_issue = true;
        }
        check.expect(refused_at_issue, "work issued on the comm stream after the failure is refused at issue");
      },
      {.timeout = kTimeout}, 60s);
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE(
    "a rank that never creates its communicator makes the others' constructors time out, naming it and the keys") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::spawn(2,
                               [](const WorldInfo& world) {
                                 auto store = ncclkit::make_store(world.init_url, world);
                                 if (world.rank == 1) {
                                   store->wait({std::string("rank0_done")}, 30s);
                                   return 0;
                                 }
                                 const auto start = Clock::now();
                                 int code = 1;
                                 try {
                                   Communicator comm(store, world, {.timeout = 1s, .name = "lonely"});
                                 } catch (const ncclkit::TimeoutError& e) {
                                   const std::string message = e.what();
                                   const bool names_keys = message.find("ncclkit/gloo/lonely/0") != std::string::npos;
                                   const bool names_rank =
                                       message.find("waiting for rank 1 (of 2)") != std::string::npos;
                                   code = names_keys && names_rank && Clock::now() - start < 1s + kSlack ? 0 : 2;
                                   if (code) ncclkit::log_error(message);
                                 }
                                 store->set("rank0_done", "1");
                                 return code;
                               },
                               {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

namespace {

/// One death trial: `world` ranks with a long timeout run a stream of 8 MiB all_reduces and
/// broadcasts; one rank (a different one from trial to trial) exits abruptly from a second
/// thread after a random few
/// milliseconds, in the middle of a collective. Every survivor must get CommError naming the
/// dead rank within kDetectionBound of the call that failed (so of the death: the calls
/// before it took milliseconds), far below the timeout. Each survivor appends
/// "<seconds> <ok>" to `log_path` for the statistics.
ncclkit::SpawnResult death_trial(int world_size, int trial, const std::string& log_path,
                                 std::chrono::milliseconds timeout) {
  return ncclkit::spawn(world_size,
                        [&](const WorldInfo& world) {
                          auto store = ncclkit::make_store(world.init_url, world);
                          Checker check(world.rank);
                          Communicator comm(store, world, {.timeout = timeout});
                          std::vector<float> data(std::size_t{2} << 20, 1.0f);
                          const int victim = (trial + 1) % world.world_size;
                          std::thread killer;
                          if (world.rank != victim) store->set("ready/" + std::to_string(world.rank), "1");
                          if (world.rank == victim) {
                            // The clock starts once every survivor has its communicator: this drill is about
                            // collectives, not construction.
                            for (int r = 0; r < world.world_size; ++r) {
                              if (r != victim) store->wait({"ready/" + std::to_string(r)}, 30s);
                            }
                            std::mt19937 rng(static_cast<unsigned>(trial) * 7919u + 13u);
                            const auto delay =
                                std::chrono::microseconds(std::uniform_int_distribution<int>(0, 20000)(rng));
                            killer = std::thread([delay] {
                              std::this_thread::sleep_for(delay);
                              ::_exit(0);  // exit code 0: spawn lets the survivors run on
                            });
                          }
                          Clock::time_point call_start{};
                          try {
                            for (int i = 0; i < 10000; ++i) {
                              call_start = Clock::now();
                              if (i % 2 == 0) {
                                comm.all_reduce(std::span<float>(data), ReduceOp::kMax);
                              } else {
                                comm.broadcast(std::span<float>(data), (i / 2) % world.world_size);
                              }
                            }
                            check.expect(false, "the stream of collectives ended without a CommError");
                          } catch (const CommError& e) {
                            const double waited = std::chrono::duration<double>(Clock::now() - call_start).count();
                            const std::string message = e.what();
                            const bool fast = waited < std::chrono::duration<double>(kDetectionBound).count();
                            check.expect(fast, "CommError only after " + std::to_string(waited) + " s: " + message);
                            const std::string blame = "connection to rank " + std::to_string(victim);
                            check.expect(message.find(blame) != std::string::npos,
                                         "the message does not say '" + blame + "': " + message);
                            if (std::FILE* log = std::fopen(log_path.c_str(), "a")) {
                              std::fprintf(log, "%.6f %d\n", waited, fast ? 1 : 0);
                              std::fclose(log);
                            }
                          }
                          if (killer.joinable()) killer.join();  // never reached by the victim
                          return check.code();
                        },
                        {.timeout = timeout + 30s});
}

}  // namespace

TEST_CASE("a peer that dies mid-collective is detected within a second or two at world 2 and 3, in every trial") {
  // NCCLKIT_TEST_DEATH_TRIALS (per world size, default 20) raises the count for a soak run;
  // NCCLKIT_TEST_DEATH_TIMEOUT (seconds, default 30) is the communicators' timeout.
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  const auto trials = static_cast<int>(ncclkit::env_int("NCCLKIT_TEST_DEATH_TRIALS").value_or(20));
  const auto timeout = ncclkit::env_seconds("NCCLKIT_TEST_DEATH_TIMEOUT", 30s);
  char folder[] = "/tmp/ncclkit-death-XXXXXX";
  REQUIRE(::mkdtemp(folder) != nullptr);
  for (int world_size : {2, 3}) {
    const std::string log_path = std::string(folder) + "/world" + std::to_string(world_size);
    const auto start = Clock::now();
    int failed_trials = 0;
    for (int trial = 0; trial < trials; ++trial) {
      auto result = death_trial(world_size, trial, log_path, timeout);
      if (!result.ok()) {
        ++failed_trials;
        MESSAGE("world " << world_size << " trial " << trial << ": " << result.describe());
      }
    }
    std::vector<double> waits;
    int slow = 0;
    if (std::FILE* log = std::fopen(log_path.c_str(), "r")) {
      double seconds = 0;
      int fast = 0;
      while (std::fscanf(log, "%lf %d", &seconds, &fast) == 2) {
        waits.push_back(seconds);
        slow += fast ? 0 : 1;
      }
      std::fclose(log);
      std::remove(log_path.c_str());
    }
    std::sort(waits.begin(), waits.end());
    std::printf(
        "death trials, world %d: %d trials (%.1f s), %zu survivor reports, %d slower than %.1f s; "
        "detection median %.3f s, max %.3f s\n",
        world_size, trials, std::chrono::duration<double>(Clock::now() - start).count(), waits.size(), slow,
        std::chrono::duration<double>(kDetectionBound).count(), waits.empty() ? 0.0 : waits[waits.size() / 2],
        waits.empty() ? 0.0 : waits.back());
    CHECK_MESSAGE(failed_trials == 0,
                  failed_trials << " of " << trials << " trials at world " << world_size << " failed");
    CHECK(waits.size() == static_cast<std::size_t>(trials * (world_size - 1)));
  }
  ::rmdir(folder);
}

TEST_CASE(
    "abort() from another thread ends the collective in flight at once, refuses later calls, and the peers fail "
    "promptly naming the aborted rank") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  // A long timeout: every prompt end below comes from the abort, not from a timeout.
  constexpr auto kLongTimeout = 60s;
  const auto start = Clock::now();
  auto result = ncclkit::spawn(
      3,
      [&](const WorldInfo& world) {
        auto store = ncclkit::make_store(world.init_url, world);
        Checker check(world.rank);
        Communicator comm(store, world, {.timeout = kLongTimeout});
        std::vector<float> data(1 << 16, 1.0f);
        comm.all_reduce(std::span<float>(data));
        check.expect(data[0] == 3.0f, "the first all_reduce worked");
        if (world.rank == 2) {
          // Skips the next collective, so ranks 0 and 1 block in it, until rank 0 has aborted.
          store->wait({std::string("aborted")}, 30s);
          expect_comm_error(
              check, "a collective after a peer aborted", [&] { comm.all_reduce(std::span<float>(data)); },
              /*expect_timeout_in_message=*/false, /*blame=*/0);
          return check.code();
        }
        std::thread aborter;
        if (world.rank == 0) {
          aborter = std::thread([&] {
            std::this_thread::sleep_for(1s);  // the all_reduce below is in flight by then
            comm.abort("the test's watchdog gave up");
            store->set("aborted", "1");
          });
        }
        const auto issued = Clock::now();
        try {
          comm.all_reduce(std::span<float>(data));
          check.expect(false, "the collective in flight returned");
        } catch (const CommError& e) {
          const double waited = std::chrono::duration<double>(Clock::now() - issued).count();
          const std::string message = e.what();
          check.expect(waited < 5.0, "the collective in flight ended only after " + std::to_string(waited) + " s");
          if (world.rank == 0) {
            check.expect(message.find("aborted on this rank: the test's watchdog gave up") != std::string::npos &&
                             message.find("abort() was called on this rank") != std::string::npos,
                         "the aborted rank's message: " + message);
          } else {
            check.expect(message.find("connection to rank 0 failed") != std::string::npos,
                         "the peer's message does not name rank 0: " + message);
          }
        }
        if (aborter.joinable()) aborter.join();
        check.expect(comm.failed(), "failed() after the abort");
        if (world.rank == 0) {
          try {
            comm.barrier(comm.comm_stream());
            comm.synchronize(comm.comm_stream());
            check.expect(false, "a call after abort() was not refused");
          } catch (const CommError& e) {
            check.expect(std::string(e.what()).find("the test's watchdog gave up") != std::string::npos,
                         std::string("the refusal does not give the reason: ") + e.what());
          }
          comm.abort("a second abort");  // changes nothing
        }
        const auto destroying = Clock::now();
        { Communicator gone = std::move(comm); }
        check.expect(Clock::now() - destroying < 3s, "the destructor after the abort took long");
        return check.code();
      },
      {.timeout = 90s});
  CHECK_MESSAGE(result.ok(), result.describe());
  CHECK(Clock::now() - start < 45s);
}

TEST_CASE("abort() on an idle communicator: every later call throws CommError with the first reason") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  ncclkit::MemoryStore store;
  Communicator comm(store, WorldInfo{}, {.timeout = 5s});
  std::vector<float> x(4, 1.0f);
  comm.all_reduce(std::span<float>(x));
  CHECK_FALSE(comm.failed());
  comm.abort("stopping the job");
  comm.abort("a later reason");
  CHECK(comm.failed());
  CHECK_THROWS_WITH_AS(comm.all_reduce(std::span<float>(x)), doctest::Contains("stopping the job"), CommError);
  CHECK_THROWS_WITH_AS(comm.all_reduce(std::span<float>(x), ReduceOp::kSum, comm.comm_stream()),
                       doctest::Contains("unusable"), CommError);
  CHECK_THROWS_AS(comm.barrier(), CommError);
}
