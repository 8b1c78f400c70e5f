// NCCLKIT_CHECK_COLLECTIVES on the NCCL backend against the fake CUDA runtime and NCCL of
// tests/support/fake_cuda_nccl.hpp: two ranks (two threads, each with its own communicator and
// FileStore on one folder) compare each collective's arguments through the store before it
// is issued. The fake moves no data, so what is checked is what NCCL is asked to do: a
// mismatch is a CollectiveMismatchError on both ranks with nothing launched, the communicator
// stays usable; a rank that never arrives fails the other with CommError within the timeout;
// ranks that disagree on the setting fail at creation; without the check, nothing changes.
// tests/gpu/test_nccl_check.cu does the same with real NCCL on two GPUs.
#include <doctest/doctest.h>

#include <stdlib.h>  // setenv, unsetenv

#include <atomic>      // std::atomic
#include <chrono>      // std::chrono
#include <cstddef>     // std::size_t
#include <exception>   // std::exception
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <string>      // std::string
#include <thread>      // std::thread
#include <vector>      // std::vector

#include "fake/fake_session.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/group.hpp"
#include "support/fake_cuda_nccl.hpp"
#include "support/temp_dir.hpp"

namespace {

namespace fake = ncclkit_test::fake;
using ncclkit::CollectiveMismatchError;
using ncclkit::DataType;
using ncclkit::MemoryKind;
using ncclkit::ReduceOp;
using ncclkit::TensorView;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::GroupGuard;
using ncclkit::nccl::Options;
using ncclkit_test::contains;
using ncclkit_test::FakeSession;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

/// What one rank saw: the messages of the errors its steps threw ("" for none), in order.
struct RankLog {
  std::vector<std::string> errors;
  std::string fatal;  ///< an exception that escaped the rank's function
};

/// Runs `fn(comm, rank, log)` in two threads, rank 0 and rank 1 of one job, each with its own
/// communicator made with `options(rank)`.
std::vector<RankLog> two_ranks(const std::function<Options(int)>& options,
                               const std::function<void(Communicator&, int, RankLog&)>& fn) {
  ncclkit_test::TempDir dir("fake-check");
  std::vector<RankLog> logs(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        ncclkit::WorldInfo world;
        world.rank = world.local_rank = rank;
        world.world_size = world.local_world_size = 2;
        world.init_url = "file://" + dir.path;
        auto store = ncclkit::make_store(world.init_url, world);
        Communicator comm(store, world, options(rank));
        fn(comm, rank, logs[static_cast<std::size_t>(rank)]);
      } catch (const std::exception& e) {
        logs[static_cast<std::size_t>(rank)].fatal = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return logs;
}

Options checked(bool on = true) {
  Options options = ncclkit_test::fake_options("checked");
  options.check_collectives = on;
  return options;
}

/// The message of the error `call` throws, "" when it throws none.
template <class Call>
std::string error_of(Call&& call) {
  try {
    call();
  } catch (const CollectiveMismatchError& e) {
    return std::string("mismatch: ") + e.what();
  } catch (const std::exception& e) {
    return std::string("other: ") + e.what();
  }
  return {};
}

TensorView device_view(Communicator& comm, std::size_t count, DataType type = DataType::kFloat32) {
  return TensorView{comm.allocate(count * ncclkit::size_of(type)), count, type, MemoryKind::kDevice};
}

}  // namespace

TEST_CASE("a count mismatch is a CollectiveMismatchError on both ranks, nothing is launched, and the next call runs") {
  FakeSession session;
  std::vector<int> launched_after_mismatch(2, -1), launched_at_end(2, -1);
  const auto logs =
      two_ranks([](int) { return checked(); },
                [&](Communicator& comm, int rank, RankLog& log) {
                  auto buffer = device_view(comm, 120);
                  auto part = buffer;
                  part.count = rank == 0 ? 120 : 100;
                  log.errors.push_back(error_of([&] { comm.all_reduce(part, part, ReduceOp::kSum); }));
                  launched_after_mismatch[static_cast<std::size_t>(rank)] = fake::launched(comm.native());
                  log.errors.push_back(error_of([&] { comm.all_reduce(buffer, buffer, ReduceOp::kSum); }));
                  comm.synchronize();
                  launched_at_end[static_cast<std::size_t>(rank)] = fake::launched(comm.native());
                  if (comm.failed()) log.errors.push_back("failed");
                  comm.deallocate(buffer.data);
                });
  for (int rank = 0; rank < 2; ++rank) {
    const auto& log = logs[static_cast<std::size_t>(rank)];
    CAPTURE(rank);
    CHECK_MESSAGE(log.fatal.empty(), log.fatal);
    REQUIRE(log.errors.size() == 2);
    CHECK_MESSAGE(
        contains(log.errors[0], "mismatch: nccl communicator 'checked' (rank " + std::to_string(rank) + " of 2"),
        log.errors[0]);
    CHECK_MESSAGE(contains(log.errors[0],
                           "collective argument mismatch at seq 1: rank 1 called all_reduce(count=100, "
                           "float, sum) but rank 0 called all_reduce(count=120, float, sum): count (100 "
                           "vs 120) differs"),
                  log.errors[0]);
    CHECK_MESSAGE(log.errors[1].empty(), log.errors[1]);
    CHECK(launched_after_mismatch[static_cast<std::size_t>(rank)] == 0);
    CHECK(launched_at_end[static_cast<std::size_t>(rank)] == 1);
  }
  FakeSession::check_clean();
}

TEST_CASE("element type, op and root mismatches of every kind of collective are caught before NCCL sees them") {
  FakeSession session;
  std::vector<int> launched(2, -1);
  const auto logs =
      two_ranks([](int) { return checked(); },
                [&](Communicator& comm, int rank, RankLog& log) {
                  auto floats = device_view(comm, 64);
                  auto ints = device_view(comm, 64, DataType::kInt32);
                  auto& mine = rank == 0 ? floats : ints;
                  log.errors.push_back(error_of([&] { comm.all_reduce(mine, mine, ReduceOp::kSum); }));
                  log.errors.push_back(
                      error_of([&] { comm.all_reduce(floats, floats, rank == 0 ? ReduceOp::kSum : ReduceOp::kMin); }));
                  log.errors.push_back(error_of([&] { comm.broadcast(floats, floats, rank); }));
                  log.errors.push_back(error_of([&] { comm.reduce(floats, floats, ReduceOp::kSum, rank); }));
                  // all_gather: rank 0 gathers 32 elements per rank, rank 1 16 (each consistent on its own).
                  auto gather_in = floats, gather_out = floats;
                  gather_in.count = rank == 0 ? 32 : 16;
                  gather_out.count = 2 * gather_in.count;
                  log.errors.push_back(error_of([&] { comm.all_gather(gather_in, gather_out); }));
                  log.errors.push_back(error_of([&] { comm.barrier(); }));  // matching: runs
                  launched[static_cast<std::size_t>(rank)] = fake::launched(comm.native());
                  comm.deallocate(floats.data);
                  comm.deallocate(ints.data);
                });
  for (int rank = 0; rank < 2; ++rank) {
    const auto& log = logs[static_cast<std::size_t>(rank)];
    CAPTURE(rank);
    CHECK_MESSAGE(log.fatal.empty(), log.fatal);
    REQUIRE(log.errors.size() == 6);
    CHECK_MESSAGE(contains(log.errors[0], "element type (int32 vs float) differs"), log.errors[0]);
    CHECK_MESSAGE(contains(log.errors[1], "op (min vs sum) differs"), log.errors[1]);
    CHECK_MESSAGE(contains(log.errors[2], "rank 1 called broadcast(count=64, float, root=1)"), log.errors[2]);
    CHECK_MESSAGE(contains(log.errors[3], "root (1 vs 0) differs"), log.errors[3]);
    CHECK_MESSAGE(contains(log.errors[4], "rank 1 called all_gather(count=16, float)"), log.errors[4]);
    CHECK_MESSAGE(log.errors[5].empty(), log.errors[5]);
    CHECK(launched[static_cast<std::size_t>(rank)] == 1);  // the barrier alone
  }
  FakeSession::check_clean();
}

TEST_CASE("inside a GroupGuard each call is compared before it is queued; the group still ends") {
  FakeSession session;
  std::vector<int> launched(2, -1);
  const auto logs = two_ranks([](int) { return checked(); },
                              [&](Communicator& comm, int rank, RankLog& log) {
                                auto buffer = device_view(comm, 8);
                                {
                                  GroupGuard group;
                                  comm.all_reduce(buffer, buffer, ReduceOp::kSum);
                                  log.errors.push_back(error_of([&] { comm.broadcast(buffer, buffer, rank); }));
                                  log.errors.push_back(error_of([&] { group.end(); }));
                                }
                                comm.synchronize();
                                launched[static_cast<std::size_t>(rank)] = fake::launched(comm.native());
                                comm.deallocate(buffer.data);
                              });
  for (int rank = 0; rank < 2; ++rank) {
    const auto& log = logs[static_cast<std::size_t>(rank)];
    CAPTURE(rank);
    CHECK_MESSAGE(log.fatal.empty(), log.fatal);
    REQUIRE(log.errors.size() == 2);
    CHECK_MESSAGE(contains(log.errors[0], "mismatch: "), log.errors[0]);
    CHECK_MESSAGE(contains(log.errors[0], "seq 2"), log.errors[0]);
    CHECK_MESSAGE(log.errors[1].empty(), log.errors[1]);
    CHECK(launched[static_cast<std::size_t>(rank)] == 1);  // the all_reduce queued before the mismatch
  }
  FakeSession::check_clean();
}

TEST_CASE("a rank that never reaches the collective fails the other with CommError, naming it, within the timeout") {
  FakeSession session;
  std::atomic<bool> rank0_done{false};
  double waited = -1;
  const auto logs = two_ranks([](int) { return checked(); },
                              [&](Communicator& comm, int rank, RankLog& log) {
                                if (rank == 1) {
                                  ncclkit_test::wait_until([&] { return rank0_done.load(); }, 20s);
                                  return;
                                }
                                auto buffer = device_view(comm, 8);
                                const auto start = Clock::now();
                                try {
                                  comm.all_reduce(buffer, buffer, ReduceOp::kSum);
                                  log.errors.push_back("no error");
                                } catch (const ncclkit::CommError& e) {
                                  log.errors.push_back(e.what());
                                } catch (const std::exception& e) {
                                  log.errors.push_back(std::string("other: ") + e.what());
                                }
                                waited = std::chrono::duration<double>(Clock::now() - start).count();
                                if (!comm.failed()) log.errors.push_back("not failed");
                                if (comm.native() != nullptr) log.errors.push_back("not aborted");
                                rank0_done = true;
                                comm.deallocate(buffer.data);
                              });
  CHECK_MESSAGE(logs[0].fatal.empty(), logs[0].fatal);
  REQUIRE(logs[0].errors.size() == 1);
  CHECK_MESSAGE(contains(logs[0].errors[0], "rank 1 did not reach it within 1.000 s"), logs[0].errors[0]);
  CHECK(waited < 1.0 + 5.0);
  FakeSession::check_clean();
}

TEST_CASE("a rank whose own arguments are bad makes the other raise a mismatch naming it, not wait for the timeout") {
  FakeSession session;
  std::vector<int> launched(2, -1);
  std::vector<double> waited(2, -1);
  const auto logs = two_ranks(
      [](int) { return checked(); },
      [&](Communicator& comm, int rank, RankLog& log) {
        auto buffer = device_view(comm, 16);
        auto out = buffer;
        if (rank == 1) out.count = 15;  // rank 1's output is one element short
        const auto start = Clock::now();
        log.errors.push_back(error_of([&] { comm.all_reduce(buffer, out, ReduceOp::kSum); }));
        // Rank 0 names a root outside the world.
        log.errors.push_back(error_of([&] { comm.reduce(buffer, buffer, ReduceOp::kSum, rank == 0 ? 2 : 0); }));
        waited[static_cast<std::size_t>(rank)] = std::chrono::duration<double>(Clock::now() - start).count();
        log.errors.push_back(error_of([&] { comm.all_reduce(buffer, buffer, ReduceOp::kSum); }));
        comm.synchronize();
        launched[static_cast<std::size_t>(rank)] = fake::launched(comm.native());
        if (comm.failed()) log.errors.push_back("failed");
        comm.deallocate(buffer.data);
      });
  for (int rank = 0; rank < 2; ++rank) {
    const auto& log = logs[static_cast<std::size_t>(rank)];
    CAPTURE(rank);
    CHECK_MESSAGE(log.fatal.empty(), log.fatal);
    REQUIRE(log.errors.size() == 3);
    // The bad rank raises its own ConfigError; the other the mismatch naming it and its reason.
    const std::string& count_error = log.errors[0];
    const std::string& root_error = log.errors[1];
    if (rank == 1) {
      CHECK_MESSAGE(contains(count_error, "other: ncclkit: all_reduce on"), count_error);
      CHECK_MESSAGE(contains(root_error, "mismatch: "), root_error);
      CHECK_MESSAGE(contains(root_error,
                             "rank 0 rejected its own arguments to reduce: root 2 is outside [0, 2); give a "
                             "rank of this communicator, the same on every rank; rank 1 called reduce("),
                    root_error);
    } else {
      CHECK_MESSAGE(contains(count_error, "mismatch: "), count_error);
      CHECK_MESSAGE(contains(count_error,
                             "rank 1 rejected its own arguments to all_reduce: sizes do not match (in.count "
                             "== out.count): 16 and 15 elements; size the buffers so that in.count == out.count; "
                             "rank 0 called all_reduce(count=16"),
                    count_error);
      CHECK_MESSAGE(contains(root_error, "other: ncclkit: reduce on"), root_error);
      CHECK_MESSAGE(contains(root_error, "root 2 is outside"), root_error);
    }
    CHECK_MESSAGE(log.errors[2].empty(), log.errors[2]);
    CHECK(launched[static_cast<std::size_t>(rank)] == 1);  // only the matching all_reduce
    // Well inside the 1 s check timeout plus the 5 s verdict slack that waiting would take.
    CHECK(waited[static_cast<std::size_t>(rank)] < 5.0);
  }
  FakeSession::check_clean();
}

TEST_CASE("ranks that disagree on the check get a ConfigError at creation, on both ranks") {
  FakeSession session;
  const auto logs = two_ranks([](int rank) { return checked(rank == 1); }, [](Communicator&, int, RankLog&) {});
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK_MESSAGE(contains(logs[static_cast<std::size_t>(rank)].fatal, "collective argument check on"),
                  logs[static_cast<std::size_t>(rank)].fatal);
  }
  FakeSession::check_clean();
}

TEST_CASE("the variable turns it on; unset, mismatched calls reach NCCL as before") {
  FakeSession session;
  // The options a communicator is created with (make_core applies the environment).
  ::setenv("NCCLKIT_CHECK_COLLECTIVES", "1", 1);
  CHECK(ncclkit::nccl::detail::with_environment(ncclkit_test::fake_options("x")).check_collectives);
  ::unsetenv("NCCLKIT_CHECK_COLLECTIVES");
  CHECK_FALSE(ncclkit::nccl::detail::with_environment(ncclkit_test::fake_options("x")).check_collectives);
  std::vector<int> launched(2, -1);
  const auto logs =
      two_ranks([](int) { return ncclkit_test::fake_options("unchecked"); },
                [&](Communicator& comm, int rank, RankLog& log) {
                  auto buffer = device_view(comm, 16);
                  buffer.count = rank == 0 ? 16 : 8;
                  log.errors.push_back(error_of([&] { comm.all_reduce(buffer, buffer, ReduceOp::kSum); }));
                  comm.synchronize();
                  launched[static_cast<std::size_t>(rank)] = fake::launched(comm.native());
                  comm.deallocate(buffer.data);
                });
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK_MESSAGE(logs[static_cast<std::size_t>(rank)].fatal.empty(), logs[static_cast<std::size_t>(rank)].fatal);
    CHECK(logs[static_cast<std::size_t>(rank)].errors == std::vector<std::string>{""});
    CHECK(launched[static_cast<std::size_t>(rank)] == 1);
  }
  FakeSession::check_clean();
}
