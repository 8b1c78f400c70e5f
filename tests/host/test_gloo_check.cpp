// NCCLKIT_CHECK_COLLECTIVES on the Gloo backend, with real processes: ranks that call a
// collective with different arguments all raise CollectiveMismatchError naming the ranks and
// the fields, before anything ran (without the check a count mismatch aborts a rank inside
// Gloo, and element type, op, root or broadcast-count mismatches return wrong data silently);
// the communicator stays usable; matching calls give the right results; the setting must
// agree across ranks; without it nothing changes.
// ncclkit-test: timeout=300
#include <doctest/doctest.h>

#include <stdlib.h>  // setenv, unsetenv

#include <algorithm>   // std::sort
#include <chrono>      // std::chrono
#include <cstdio>      // std::printf
#include <cstdint>     // std::int32_t
#include <exception>   // std::exception
#include <functional>  // std::function
#include <thread>      // std::this_thread::sleep_for
#include <span>        // std::span
#include <string>      // std::string
#include <vector>      // std::vector

#include "ncclkit/core/collective_check.hpp"
#include "support/gloo_testing.hpp"
#include "support/text.hpp"

using namespace std::chrono_literals;
using ncclkit::CollectiveMismatchError;
using ncclkit::ReduceOp;
using ncclkit::WorldInfo;
using ncclkit::gloo::Communicator;
using ncclkit::gloo::Options;
using ncclkit::testing::Checker;

namespace {

constexpr auto kCheckTimeout = 5s;

using ncclkit_test::contains;

/// Runs `fn(comm, world, check)` in `n` ranks, with NCCLKIT_CHECK_COLLECTIVES set to
/// `variable` (unset when empty) in each worker before its communicator is made.
ncclkit::SpawnResult run(int n, const std::string& variable,
                         const std::function<void(Communicator&, const WorldInfo&, Checker&)>& fn) {
  return ncclkit::spawn(
      n,
      [&](const WorldInfo& world) {
        if (variable.empty()) {
          ::unsetenv("NCCLKIT_CHECK_COLLECTIVES");
        } else {
          ::setenv("NCCLKIT_CHECK_COLLECTIVES", variable.c_str(), 1);
        }
        ncclkit::set_log_level(ncclkit::LogLevel::kError);
        auto store = ncclkit::make_store(world.init_url, world);
        Options options;
        options.timeout = kCheckTimeout;
        Communicator comm(store, world, options);
        Checker check(world.rank);
        fn(comm, world, check);
        return check.code();
      },
      ncclkit::SpawnOptions{.timeout = 60s});
}

/// Expects `call` to throw CollectiveMismatchError whose message has every one of `parts`;
/// then expects the communicator to be usable: a matching all_reduce gives the right sum.
template <class Call>
void expect_mismatch(Checker& check, Communicator& comm, const char* what, Call&& call,
                     const std::vector<std::string>& parts) {
  try {
    call();
    check.expect(false, std::string(what) + ": no CollectiveMismatchError");
  } catch (const CollectiveMismatchError& e) {
    const std::string message = e.what();
    check.expect(contains(message, "mismatch"), std::string(what) + ": no 'mismatch' in: " + message);
    for (const auto& part : parts) {
      check.expect(contains(message, part), std::string(what) + ": no '" + part + "' in: " + message);
    }
  } catch (const std::exception& e) {
    check.expect(false, std::string(what) + ": another exception: " + e.what());
  }
  check.expect(!comm.failed(), std::string(what) + ": the communicator failed");
  std::vector<std::int32_t> ones(5, 1);
  comm.all_reduce(std::span<std::int32_t>(ones));
  check.expect(ones[4] == comm.size(), std::string(what) + ": the all_reduce after the mismatch is wrong");
}

}  // namespace

TEST_CASE(
    "a count mismatch (an abort inside Gloo without the check) is an error on every rank naming ranks and count") {
  auto result = run(2, "1", [](Communicator& comm, const WorldInfo& world, Checker& check) {
    std::vector<float> data(world.rank == 0 ? 120 : 100, 1.0f);
    expect_mismatch(check, comm, "count", [&] { comm.all_reduce(std::span<float>(data)); },
                    {"at seq 1", "rank 1 called all_reduce(count=100, float, sum)",
                     "rank 0 called all_reduce(count=120, float, sum)", "count (100 vs 120) differs"});
    check.expect(data[0] == 1.0f, "the mismatched all_reduce wrote into the buffer");
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("element type, op, broadcast root and broadcast count mismatches are errors, not wrong data") {
  auto result = run(2, "1", [](Communicator& comm, const WorldInfo& world, Checker& check) {
    // Element type: 8 floats against 8 int32 (the same bytes, so Gloo would run it).
    std::vector<float> floats(8, 1.5f);
    std::vector<std::int32_t> ints(8, 3);
    expect_mismatch(check, comm, "element type",
                    [&] {
                      if (world.rank == 0) {
                        comm.all_reduce(std::span<float>(floats));
                      } else {
                        comm.all_reduce(std::span<std::int32_t>(ints));
                      }
                    },
                    {"rank 1 called all_reduce(count=8, int32, sum)", "element type (int32 vs float) differs"});
    // Op: sum against max.
    std::vector<double> values(16, 2.0);
    expect_mismatch(
        check, comm, "op",
        [&] { comm.all_reduce(std::span<double>(values), world.rank == 0 ? ReduceOp::kSum : ReduceOp::kMax); },
        {"rank 1 called all_reduce(count=16, double, max)", "op (max vs sum) differs"});
    check.expect(values[0] == 2.0, "the mismatched all_reduce changed the data");
    // Broadcast root: each rank believes it is the root.
    std::vector<std::int32_t> payload(32, world.rank + 10);
    expect_mismatch(check, comm, "root", [&] { comm.broadcast(std::span<std::int32_t>(payload), world.rank); },
                    {"rank 1 called broadcast(count=32, int32, root=1)", "root (1 vs 0) differs"});
    check.expect(payload[0] == world.rank + 10, "the mismatched broadcast changed the data");
    // Broadcast count: the root sends 16, rank 1 expects 8.
    std::vector<std::int32_t> part(world.rank == 0 ? 16 : 8, world.rank + 20);
    expect_mismatch(check, comm, "broadcast count", [&] { comm.broadcast(std::span<std::int32_t>(part), 0); },
                    {"rank 1 called broadcast(count=8, int32, root=0)", "count (8 vs 16) differs"});
    // A different collective altogether, and a zero count against a non-zero one.
    std::vector<float> buffer(4, 1.0f);
    expect_mismatch(check, comm, "collective",
                    [&] {
                      if (world.rank == 0) {
                        comm.all_reduce(std::span<float>(buffer));
                      } else {
                        comm.broadcast(std::span<float>(buffer), 0);
                      }
                    },
                    {"collective (broadcast vs all_reduce)"});
    std::vector<float> maybe_empty(world.rank == 0 ? 0 : 4, 1.0f);
    expect_mismatch(check, comm, "zero count", [&] { comm.all_reduce(std::span<float>(maybe_empty)); },
                    {"count (4 vs 0) differs"});
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("with three ranks the odd rank is named against the other two, on every rank") {
  auto result = run(3, "1", [](Communicator& comm, const WorldInfo& world, Checker& check) {
    std::vector<std::int64_t> data(world.rank == 2 ? 7 : 9, 1);
    expect_mismatch(check, comm, "three ranks", [&] { comm.all_reduce(std::span<std::int64_t>(data)); },
                    {"rank 2 called all_reduce(count=7, int64, sum) but ranks 0-1 called all_reduce(count=9, int64, "
                     "sum): count (7 vs 9) differs"});
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE(
    "matching arguments: every collective gives the right result with the check on, inline and on the comm stream") {
  auto result = run(3, "1", [](Communicator& comm, const WorldInfo& world, Checker& check) {
    const int n = comm.size();
    const int r = world.rank;
    std::vector<std::int32_t> sum(10, r + 1);
    comm.all_reduce(std::span<std::int32_t>(sum));
    check.expect(sum[9] == 6, "all_reduce");
    std::vector<std::int32_t> bcast(6, r == 1 ? 42 : 0);
    comm.broadcast(std::span<std::int32_t>(bcast), 1);
    check.expect(bcast[5] == 42, "broadcast");
    std::vector<std::int32_t> in(4, r + 1), out(4, 0);
    comm.reduce(std::span<const std::int32_t>(in), std::span<std::int32_t>(out), ReduceOp::kMax, 2);
    if (r == 2) check.expect(out[0] == 3, "reduce");
    std::vector<std::int32_t> mine(2, r), gathered(static_cast<std::size_t>(2 * n), -1);
    comm.all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(gathered));
    check.expect(gathered[0] == 0 && gathered[5] == 2, "all_gather");
    const std::vector<std::size_t> counts = {1, 2, 3};
    std::vector<std::int32_t> part(counts[static_cast<std::size_t>(r)], r), all(6, -1);
    comm.all_gather_uneven(std::span<const std::int32_t>(part), std::span<std::int32_t>(all), counts);
    check.expect(all[0] == 0 && all[2] == 1 && all[5] == 2, "all_gather_uneven");
    std::vector<std::int32_t> scatter_in(static_cast<std::size_t>(3 * n), 1), scatter_out(3, 0);
    comm.reduce_scatter(std::span<const std::int32_t>(scatter_in), std::span<std::int32_t>(scatter_out));
    check.expect(scatter_out[0] == n, "reduce_scatter");
    comm.barrier();
    std::vector<float> empty;
    comm.all_reduce(std::span<float>(empty));
    // The comm stream: checked in the order the worker runs them.
    std::vector<double> queued(100, 0.5);
    for (int i = 0; i < 3; ++i) comm.all_reduce(std::span<double>(queued), ReduceOp::kSum, comm.comm_stream());
    comm.synchronize(comm.comm_stream());
    check.expect(queued[99] == 0.5 * n * n * n, "all_reduces on the comm stream");
    check.expect(comm.issued_sequence() == 11, "sequence " + std::to_string(comm.issued_sequence()));
    check.expect(!comm.failed(), "failed");
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a mismatch on the comm stream surfaces at synchronize on every rank") {
  auto result = run(2, "1", [](Communicator& comm, const WorldInfo& world, Checker& check) {
    std::vector<float> data(world.rank == 0 ? 64 : 32, 1.0f);
    comm.all_reduce(std::span<float>(data), ReduceOp::kSum, comm.comm_stream());
    try {
      comm.synchronize(comm.comm_stream());
      check.expect(false, "no error at synchronize");
    } catch (const CollectiveMismatchError& e) {
      check.expect(contains(e.what(), "count (32 vs 64) differs"), std::string("message: ") + e.what());
    }
    check.expect(!comm.failed(), "the communicator failed");
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("after a comm-stream mismatch is reported, later comm-stream collectives run and are right") {
  auto result = run(2, "1", [](Communicator& comm, const WorldInfo& world, Checker& check) {
    std::vector<float> data(world.rank == 0 ? 64 : 32, 1.0f);
    std::vector<std::int32_t> ones(7, 1);
    comm.all_reduce(std::span<float>(data), ReduceOp::kSum, comm.comm_stream());
    comm.all_reduce(std::span<std::int32_t>(ones), ReduceOp::kSum, comm.comm_stream());  // queued behind it
    try {
      comm.synchronize(comm.comm_stream());
      check.expect(false, "no error at synchronize");
    } catch (const CollectiveMismatchError& e) {
      check.expect(contains(e.what(), "count (32 vs 64) differs"), std::string("message: ") + e.what());
    }
    check.expect(ones[6] == 2,
                 "the matching all_reduce queued after the mismatch did not run: " + std::to_string(ones[6]));
    std::vector<std::int32_t> more(9, world.rank + 1);
    comm.all_reduce(std::span<std::int32_t>(more), ReduceOp::kSum, comm.comm_stream());
    try {
      comm.synchronize(comm.comm_stream());  // the mismatch was reported once
    } catch (const std::exception& e) {
      check.expect(false, std::string("synchronize after the reported mismatch threw: ") + e.what());
    }
    check.expect(more[8] == 3, "the comm-stream all_reduce after the mismatch gave " + std::to_string(more[8]));
    check.expect(!comm.failed(), "the communicator failed");
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE(
    "a rank whose own arguments are bad makes every rank raise at once, naming it; the communicator stays usable") {
  auto result = run(2, "1", [](Communicator& comm, const WorldInfo& world, Checker& check) {
    // Inline: rank 1's output is one element short.
    std::vector<float> in(16, 1.0f), out(world.rank == 1 ? 15 : 16, 0.0f);
    auto start = std::chrono::steady_clock::now();
    try {
      comm.all_reduce(std::span<const float>(in), std::span<float>(out));
      check.expect(false, "inline: no error");
    } catch (const CollectiveMismatchError& e) {
      check.expect(world.rank == 0,
                   std::string("inline: the bad rank got the mismatch, not its own error: ") + e.what());
      check.expect(contains(e.what(),
                            "rank 1 rejected its own arguments to all_reduce: sizes do not match (in.count == "
                            "out.count): 16 and 15 elements; size the buffers so that in.count == out.count; rank 0 "
                            "called all_reduce(count=16"),
                   std::string("inline: ") + e.what());
    } catch (const ncclkit::ConfigError& e) {
      check.expect(world.rank == 1, std::string("inline: a ConfigError on the good rank: ") + e.what());
      check.expect(contains(e.what(),
                            "ncclkit: all_reduce on gloo communicator 'gloo' (rank 1 of 2): sizes do not "
                            "match (in.count == out.count): 16 and 15 elements"),
                   std::string("inline: ") + e.what());
    } catch (const std::exception& e) {
      check.expect(false, std::string("inline: another exception: ") + e.what());
    }
    double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    check.expect(waited < 3.0, "inline: the error took " + std::to_string(waited) + " s (timeout 5 s)");
    check.expect(!comm.failed(), "inline: the communicator failed");

    // Comm stream: rank 0 names a root outside the world.
    std::vector<std::int32_t> data(4, world.rank == 0 ? 7 : 0);
    start = std::chrono::steady_clock::now();
    try {
      comm.broadcast(std::span<std::int32_t>(data), world.rank == 0 ? 2 : 0, comm.comm_stream());
      check.expect(world.rank == 1, "comm stream: the bad rank got no error from its call");
      comm.synchronize(comm.comm_stream());
      check.expect(false, "comm stream: no error at synchronize");
    } catch (const CollectiveMismatchError& e) {
      check.expect(world.rank == 1, std::string("comm stream: the bad rank got the mismatch: ") + e.what());
      check.expect(contains(e.what(), "rank 0 rejected its own arguments to broadcast: root 2 is outside [0, 2)"),
                   std::string("comm stream: ") + e.what());
    } catch (const ncclkit::ConfigError& e) {
      check.expect(world.rank == 0, std::string("comm stream: a ConfigError on the good rank: ") + e.what());
    } catch (const std::exception& e) {
      check.expect(false, std::string("comm stream: another exception: ") + e.what());
    }
    comm.synchronize(comm.comm_stream());  // nothing more to report on either rank
    waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    check.expect(waited < 3.0, "comm stream: the error took " + std::to_string(waited) + " s (timeout 5 s)");
    check.expect(!comm.failed(), "comm stream: the communicator failed");

    // Matching calls work afterwards, on both streams.
    std::vector<std::int32_t> ones(5, 1), twos(3, world.rank + 1);
    comm.all_reduce(std::span<std::int32_t>(ones));
    comm.all_reduce(std::span<std::int32_t>(twos), ReduceOp::kSum, comm.comm_stream());
    comm.synchronize(comm.comm_stream());
    check.expect(ones[4] == 2 && twos[2] == 3,
                 "the matching calls afterwards gave " + std::to_string(ones[4]) + ", " + std::to_string(twos[2]));
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("the check is an option too, and ranks that disagree on it get a ConfigError at creation") {
  auto result = ncclkit::spawn(
      2,
      [](const WorldInfo& world) {
        ::unsetenv("NCCLKIT_CHECK_COLLECTIVES");
        ncclkit::set_log_level(ncclkit::LogLevel::kError);
        auto store = ncclkit::make_store(world.init_url, world);
        Checker check(world.rank);
        {
          Options options;
          options.timeout = kCheckTimeout;
          options.name = "on";
          options.check_collectives = true;  // the option, without the variable
          Communicator comm(store, world, options);
          std::vector<float> data(world.rank == 0 ? 3 : 4, 1.0f);
          expect_mismatch(check, comm, "option", [&] { comm.all_reduce(std::span<float>(data)); }, {"count (4 vs 3)"});
        }
        Options options;
        options.timeout = kCheckTimeout;
        options.name = "split";
        options.check_collectives = world.rank == 1;
        try {
          Communicator comm(store, world, options);
          check.expect(false, "no error when the ranks' settings differ");
        } catch (const ncclkit::ConfigError& e) {
          check.expect(contains(e.what(), "is on for rank 1 but off for rank 0"), std::string("message: ") + e.what());
        }
        return check.code();
      },
      ncclkit::SpawnOptions{.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a rank that never reaches the collective makes the others fail with CommError within the timeout") {
  auto result = run(2, "1", [](Communicator& comm, const WorldInfo& world, Checker& check) {
    if (world.rank == 1) {
      std::this_thread::sleep_for(kCheckTimeout + 2s);  // arrives after rank 0 gave up
      return;
    }
    std::vector<float> data(8, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    try {
      comm.all_reduce(std::span<float>(data));
      check.expect(false, "no error");
    } catch (const ncclkit::CommError& e) {
      check.expect(contains(e.what(), "comparing its arguments"), std::string("message: ") + e.what());
    }
    check.expect(std::chrono::steady_clock::now() - start < kCheckTimeout + 5s, "the error came late");
    check.expect(comm.failed(), "not failed after the timeout");
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("without the variable nothing is compared: mismatched arguments run as before") {
  auto result = run(2, "", [](Communicator& comm, const WorldInfo& world, Checker& check) {
    check.expect(!comm.options().check_collectives, "the check is on");
    // Sum against max on two ranks with the same bytes: Gloo runs it, each rank its own op.
    std::vector<std::int32_t> data(4, world.rank + 1);
    comm.all_reduce(std::span<std::int32_t>(data), world.rank == 0 ? ReduceOp::kSum : ReduceOp::kMax);
    check.expect(!comm.failed(), "failed");
    std::vector<std::int32_t> ones(3, 1);
    comm.all_reduce(std::span<std::int32_t>(ones));
    check.expect(ones[0] == 2, "all_reduce");
    check.expect(comm.issued_sequence() == 2, "sequence");
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

// Not a test: the check's cost, printed, for docs/performance.md. Skipped unless asked for:
//   build/tests/tests_gloo --no-skip -tc="*cost*"
// Two processes, each with a checked and an unchecked communicator; rounds alternate between
// them (who goes first rotates), so load on the machine hits both alike. Per-call time: each
// round's mean; printed are the fastest round (the cost on a quiet machine: on a loaded one,
// scheduling delays of milliseconds dominate) and the median round.
TEST_CASE("cost of the check: all_reduce with and without it, interleaved (run by hand)" * doctest::skip()) {
  auto result = ncclkit::spawn(
      2,
      [](const WorldInfo& world) {
        ::unsetenv("NCCLKIT_CHECK_COLLECTIVES");
        auto store = ncclkit::make_store(world.init_url, world);
        Options plain_options, checked_options;
        plain_options.name = "plain";
        checked_options.name = "checked";
        checked_options.check_collectives = true;
        Communicator plain(store, world, plain_options);
        Communicator checked(store, world, checked_options);
        constexpr int kRounds = 41;
        if (world.rank == 0) {
          std::printf("%10s %6s | %27s | %27s\n", "", "", "fastest round (us per call)", "median round (us per call)");
          std::printf("%10s %6s | %8s %8s %9s | %8s %8s %9s\n", "bytes", "calls", "plain", "checked", "overhead",
                      "plain", "checked", "overhead");
        }
        for (std::size_t bytes : {std::size_t{4}, std::size_t{1024}, std::size_t{64} << 10, std::size_t{1} << 20}) {
          const int calls = bytes >= (std::size_t{1} << 20) ? 10 : 50;
          std::vector<float> data(bytes / sizeof(float), 1.0f);
          std::vector<double> times[2];
          for (int round = -1; round < kRounds; ++round) {  // round -1: warm-up
            for (int k = 0; k < 2; ++k) {
              const int which = (round + k) % 2 == 0 ? 0 : 1;
              Communicator& comm = which == 0 ? plain : checked;
              comm.barrier();
              const auto start = std::chrono::steady_clock::now();
              for (int i = 0; i < calls; ++i) comm.all_reduce(std::span<float>(data), ReduceOp::kMax);
              const double us =
                  std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
              if (round >= 0) times[which].push_back(us / calls);
            }
          }
          for (auto& t : times) std::sort(t.begin(), t.end());
          const double fast_plain = times[0][0], fast_checked = times[1][0];
          const double median_plain = times[0][kRounds / 2], median_checked = times[1][kRounds / 2];
          if (world.rank == 0) {
            std::printf("%10zu %6d | %8.1f %8.1f %9.1f | %8.1f %8.1f %9.1f\n", bytes, calls, fast_plain, fast_checked,
                        fast_checked - fast_plain, median_plain, median_checked, median_checked - median_plain);
          }
        }
        return 0;
      },
      ncclkit::SpawnOptions{.timeout = 600s});
  CHECK_MESSAGE(result.ok(), result.describe());
}
