// The NCCL backend's concurrency logic (watchdog, GroupGuard, abort, shutdown:
// nccl/detail/watchdog.hpp and its parts, group.hpp, communicator.hpp, local_group.hpp,
// detail/comm_core.hpp) against the fake CUDA runtime and NCCL of
// tests/support/fake_cuda_nccl.hpp, so that it runs on every CI machine, GPU or not. Linked
// with the fake instead of libcudart/libnccl (tests/fake_nccl.cmake).
//
// Every test ends by checking that the fake saw no violation: above all no use of an aborted
// communicator (an ncclGroupEnd launching a queued op of it, a collective on it), which in real
// NCCL is a use after free. Timeouts are 1 s; time bounds carry seconds of slack, so that two
// busy cores do not make them flaky; waits for the watchdog poll with a deadline.
#include <doctest/doctest.h>

#include <chrono>      // std::chrono
#include <cstddef>     // std::size_t
#include <functional>  // std::function
#include <memory>      // std::unique_ptr, std::shared_ptr
#include <optional>    // std::optional
#include <string>      // std::string

#include "fake/fake_session.hpp"
#include "ncclkit/core/detail/coarse_clock.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/group.hpp"
#include "ncclkit/nccl/local_group.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "support/fake_cuda_nccl.hpp"

namespace {

namespace fake = ncclkit_test::fake;
using ncclkit::CommError;
using ncclkit::ConfigError;
using ncclkit::CudaError;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::GroupGuard;
using ncclkit::nccl::LocalGroup;
using ncclkit::nccl::Options;
using ncclkit_test::contains;
using ncclkit_test::FakeSession;
using ncclkit_test::message_of;
using ncclkit_test::OneRankJob;
using ncclkit_test::wait_until;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

constexpr auto kTimeout = ncclkit_test::kFakeTimeout;
/// Added to every upper time bound: scheduling on a busy CI machine, not the code under test.
constexpr double kSlackSeconds = 3.0;
/// Elements per buffer; the fake moves no data, so their values do not matter.
constexpr std::size_t kCount = 256;

Options options(const char* name) { return ncclkit_test::fake_options(name); }

double seconds_since(Clock::time_point start) { return std::chrono::duration<double>(Clock::now() - start).count(); }

/// While a failed member's group is open, its watchdog keeps polling (and retrying the
/// abort): lets it poll three more times, each counted by `polls`, then checks that `comm` is
/// still not aborted. (A watchdog that aborts stops polling: the wait ends at the abort too,
/// and the check reports it.)
void check_abort_held_back(const std::function<long()>& polls, ncclComm_t comm) {
  const long before = polls();
  CHECK(wait_until([&] { return polls() >= before + 3 || fake::aborted(comm); }));
  CHECK_FALSE(fake::aborted(comm));
}

/// Device memory of the fake (host memory underneath), freed at the end of the test.
struct FreeDevice {
  void operator()(float* data) const { (void)cudaFree(data); }
};
using DeviceFloats = std::unique_ptr<float, FreeDevice>;
DeviceFloats allocate(Communicator& comm) {
  return DeviceFloats(static_cast<float*>(comm.allocate(kCount * sizeof(float))));
}

}  // namespace

TEST_CASE("a member that fails with an op queued in an open group is aborted only after the group's end") {
  FakeSession session;
  {
    LocalGroup group({0, 1}, options("grouped"));
    Communicator& healthy = group[0];
    Communicator& failing = group[1];
    const ncclComm_t healthy_comm = healthy.native(), failing_comm = failing.native();
    const ncclComm_t failing_control = fake::parent_of(failing_comm);
    DeviceFloats a = allocate(healthy), b = allocate(failing);
    const cudaStream_t failing_stream = failing.comm_stream();

    fake::stall_stream(failing_stream);
    const auto start = Clock::now();
    failing.all_reduce(b.get(), b.get(), kCount, ncclkit::ReduceOp::kSum, failing_stream);  // seq 1: never completes
    GroupGuard guard;
    healthy.all_reduce(a.get(), a.get(), kCount);                                           // seq 1, queued
    failing.all_reduce(b.get(), b.get(), kCount, ncclkit::ReduceOp::kSum, failing_stream);  // seq 2, queued in time
    CHECK(fake::launched(healthy_comm) == 0);
    CHECK(fake::launched(failing_comm) == 1);

    REQUIRE(wait_until([&] { return failing.failed(); }));
    // Work is stamped by the coarse clock, up to one of its ticks before `start` by this one.
    const double tick = std::chrono::duration<double>(ncclkit::detail::coarse_resolution()).count();
    CHECK(seconds_since(start) >= 1.0 - tick);
    check_abort_held_back([&] { return fake::event_queries(failing_stream); }, failing_comm);
    CHECK_FALSE(fake::aborted(failing_control));
    CHECK_FALSE(failing.failure_report().has_value());

    const std::string message = message_of<CommError>([&] { guard.end(); });
    CHECK(contains(message, "nccl communicator 'grouped' (rank 1 of 2, GPU 1) failed"));
    CHECK(contains(message, "did not complete within the timeout"));
    CHECK(contains(message, "all_reduce seq 1"));
    // The group launched both ops, then the failed member was aborted, both of its communicators.
    CHECK(fake::launched(healthy_comm) == 1);
    CHECK(fake::launched(failing_comm) == 2);
    CHECK(fake::aborted(failing_comm));
    CHECK(fake::aborted(failing_control));
    CHECK(fake::group_depth() == 0);

    // The healthy member is not failed, and its op of the group is tracked.
    CHECK_FALSE(healthy.failed());
    CHECK_FALSE(fake::aborted(healthy_comm));
    CHECK(healthy.issued_sequence() == 1);
    CHECK(wait_until([&] { return healthy.completed_sequence() == healthy.issued_sequence(); }));
    healthy.all_reduce(a.get(), a.get(), kCount);
    healthy.synchronize();
    CHECK(wait_until([&] { return healthy.completed_sequence() == 2; }));  // the watchdog retires it
  }
  FakeSession::check_clean();
}

TEST_CASE("abort() of a member with an op queued in an open group waits for the group's end") {
  FakeSession session;
  {
    LocalGroup group({0, 1}, options("grouped"));
    Communicator& healthy = group[0];
    Communicator& failing = group[1];
    const ncclComm_t healthy_comm = healthy.native(), failing_comm = failing.native();
    DeviceFloats a = allocate(healthy), b = allocate(failing);

    GroupGuard guard;
    healthy.all_reduce(a.get(), a.get(), kCount);
    failing.all_reduce(b.get(), b.get(), kCount);
    const auto before = Clock::now();
    failing.abort("the test aborted it");
    CHECK(seconds_since(before) < kSlackSeconds);  // returns at once, without its report
    CHECK(failing.failed());
    // The watchdog polls NCCL's error state each interval.
    check_abort_held_back([&] { return fake::async_error_queries(failing_comm); }, failing_comm);

    const std::string message = message_of<CommError>([&] { guard.end(); });
    CHECK(contains(message, "(rank 1 of 2, GPU 1) failed: the test aborted it"));
    CHECK(fake::launched(failing_comm) == 1);
    CHECK(fake::aborted(failing_comm));
    CHECK_FALSE(healthy.failed());
    CHECK(wait_until([&] { return healthy.completed_sequence() == 1; }));
    CHECK_FALSE(fake::aborted(healthy_comm));
    // Every later call on the aborted member throws the same failure, and touches no NCCL.
    CHECK(
        contains(message_of<CommError>([&] { failing.all_reduce(b.get(), b.get(), kCount); }), "the test aborted it"));
  }
  FakeSession::check_clean();
}

TEST_CASE("a collective captured into a CUDA graph inside an open group holds the abort back too") {
  FakeSession session;
  {
    LocalGroup group({0, 1}, options("captured"));
    Communicator& failing = group[0];
    Communicator& healthy = group[1];
    const ncclComm_t failing_comm = failing.native();
    DeviceFloats a = allocate(failing), b = allocate(healthy);
    ncclkit::nccl::Stream graph_stream(0);
    const cudaStream_t failing_stream = failing.comm_stream();

    fake::stall_stream(failing_stream);
    failing.all_reduce(a.get(), a.get(), kCount, ncclkit::ReduceOp::kSum, failing_stream);  // seq 1: never completes
    fake::set_capturing(graph_stream, true);
    GroupGuard guard;
    failing.all_reduce(a.get(), a.get(), kCount, ncclkit::ReduceOp::kSum, graph_stream.get());  // captured
    healthy.all_reduce(b.get(), b.get(), kCount);
    CHECK(failing.issued_sequence() == 1);  // a captured collective gets no sequence number

    REQUIRE(wait_until([&] { return failing.failed(); }));
    check_abort_held_back([&] { return fake::event_queries(failing_stream); }, failing_comm);

    const std::string message = message_of<CommError>([&] { guard.end(); });
    CHECK(contains(message, "(rank 0 of 2, GPU 0) failed"));
    CHECK(contains(message, "all_reduce seq 1"));
    CHECK(fake::launched(failing_comm) == 2);  // the captured op was launched before the abort
    CHECK(fake::aborted(failing_comm));
    fake::set_capturing(graph_stream, false);
    CHECK(fake::records_during_capture() == 0);  // no completion event recorded into the graph
    CHECK_FALSE(healthy.failed());
    CHECK(wait_until([&] { return healthy.completed_sequence() == 1; }));
  }
  FakeSession::check_clean();
}

TEST_CASE("a group's end that blocks fails within the timeout plus a few seconds, released by the abort") {
  FakeSession session;
  std::optional<LocalGroup> group(std::in_place, std::vector<int>{0, 1}, options("blocked"));
  const ncclComm_t first = (*group)[0].native(), second = (*group)[1].native();
  DeviceFloats a = allocate((*group)[0]), b = allocate((*group)[1]);
  // Connection setup that waits for a peer that is gone: only an abort ends it.
  fake::block_launches_until_abort(first);

  GroupGuard guard;
  (*group)[0].all_reduce(a.get(), a.get(), kCount);
  (*group)[1].all_reduce(b.get(), b.get(), kCount);
  const auto start = Clock::now();
  const std::string message = message_of<CommError>([&] { guard.end(); });
  const double waited = seconds_since(start);
  INFO("the group's end returned after " << waited << " s: " << message);
  CHECK(waited >= 1.0);
  // The watchdog waits up to 2 s for the lock the blocked end holds, then aborts without it.
  CHECK(waited < 1.0 + 2.0 + kSlackSeconds);
  CHECK(contains(message, "an NCCL call did not return within the timeout"));
  CHECK(fake::launches_released_by_abort() == 1);
  CHECK(fake::aborted(first));
  CHECK(fake::aborts_while_inside() >= 1);
  CHECK((*group)[0].failed());
  CHECK((*group)[1].failed());
  CHECK(wait_until([&] { return fake::aborted(second); }));
  CHECK(fake::group_depth() == 0);

  const auto destroy_start = Clock::now();
  group.reset();
  CHECK(seconds_since(destroy_start) < kSlackSeconds);
  FakeSession::check_clean();
}

TEST_CASE("LocalGroup whose cudaSetDevice fails for the second GPU throws CudaError and closes NCCL's group") {
  FakeSession session;
  fake::fail_set_device(1);
  const std::string message = message_of<CudaError>([] { LocalGroup group({0, 1}, options("setdevice")); });
  CHECK(contains(message, "cudaSetDevice(1)"));
  CHECK(fake::group_depth() == 0);
  CHECK(fake::live_comms() == 0);  // the communicator made for GPU 0 was aborted
  CHECK(fake::current_device() == 0);

  // The thread is left fit for another group.
  fake::fail_set_device(-1);
  {
    LocalGroup group({0, 1}, options("setdevice"));
    CHECK(group.size() == 2);
  }
  CHECK(fake::live_comms() == 0);  // shut down cleanly
  FakeSession::check_clean();
}

TEST_CASE("a collective that never completes fails the next call and synchronize, naming it") {
  FakeSession session;
  OneRankJob job;
  ncclkit::nccl::Stream work(0);  // Options::stream: calls without a stream run on it
  Options stuck = options("stuck");
  stuck.stream = work;
  std::optional<Communicator> comm(std::in_place, job.store, job.world, stuck);
  const ncclComm_t handle = comm->native();
  DeviceFloats buffer = allocate(*comm);

  SUBCASE("synchronize") {
    fake::stall_stream(comm->default_stream());
    const auto start = Clock::now();
    comm->all_reduce(buffer.get(), buffer.get(), kCount);
    const std::string message = message_of<CommError>([&] { comm->synchronize(); });
    const double waited = seconds_since(start);
    INFO("synchronize threw after " << waited << " s: " << message);
    CHECK(waited >= 1.0);
    CHECK(waited < 1.0 + kSlackSeconds);
    CHECK(contains(message, "nccl communicator 'stuck' (rank 0 of 1, GPU 0) failed"));
    CHECK(contains(message, "did not complete within the timeout"));
    CHECK(contains(message, "all_reduce seq 1"));
    CHECK(fake::aborted(handle));
  }
  SUBCASE("the next call") {
    // The abort ends the hung kernels, as NCCL's does: the report still counts it incomplete.
    fake::stall_stream(comm->default_stream(), fake::Stall::kUntilAbort);
    comm->all_reduce(buffer.get(), buffer.get(), kCount);
    REQUIRE(wait_until([&] { return comm->failed(); }));
    const std::string message = message_of<CommError>([&] { comm->broadcast(buffer.get(), kCount, 0); });
    CHECK(contains(message, "all_reduce seq 1"));
    CHECK(contains(message, "issued seq 1, completed seq 0"));
    CHECK(comm->issued_sequence() == 1);  // the refused broadcast took no number
  }

  const auto destroy_start = Clock::now();
  comm.reset();
  CHECK(seconds_since(destroy_start) < kSlackSeconds);
  FakeSession::check_clean();
}

TEST_CASE("destroying a communicator whose collective never completes waits the timeout, then aborts") {
  FakeSession session;
  OneRankJob job;
  ncclkit::nccl::Stream work(0);  // Options::stream: calls without a stream run on it
  Options shutdown = options("shutdown");
  shutdown.stream = work;
  std::optional<Communicator> comm(std::in_place, job.store, job.world, shutdown);
  const ncclComm_t handle = comm->native();
  const ncclComm_t control = fake::parent_of(handle);
  DeviceFloats buffer = allocate(*comm);
  fake::stall_stream(comm->default_stream());
  comm->all_reduce(buffer.get(), buffer.get(), kCount);

  const auto start = Clock::now();
  comm.reset();
  const double waited = seconds_since(start);
  CHECK(waited >= 1.0);
  CHECK(waited < 1.0 + kSlackSeconds);
  CHECK(fake::aborted(handle));     // in flight past the timeout: aborted, not destroyed
  CHECK(fake::destroyed(control));  // the idle control communicator: finalised and destroyed
  CHECK(fake::live_comms() == 0);
  FakeSession::check_clean();
}

TEST_CASE("an asynchronous NCCL error fails the communicator and aborts it") {
  FakeSession session;
  OneRankJob job;
  {
    Communicator comm(job.store, job.world, options("async"));
    const ncclComm_t handle = comm.native();
    fake::set_async_error(handle, ncclRemoteError);
    REQUIRE(wait_until([&] { return comm.failed(); }));
    CHECK(contains(message_of<CommError>([&] { comm.synchronize(); }), "NCCL reported an asynchronous error"));
    CHECK(fake::aborted(handle));
  }
  FakeSession::check_clean();
}

TEST_CASE("a timeout of milliseconds::max() is a ConfigError") {
  FakeSession session;
  Options forever;
  forever.timeout = std::chrono::milliseconds::max();
  CHECK(contains(message_of<ConfigError>([&] { LocalGroup group({0}, forever); }), "too long"));
  OneRankJob job;
  CHECK(contains(message_of<ConfigError>([&] { Communicator comm(job.store, job.world, forever); }), "too long"));
  CHECK(fake::live_comms() == 0);  // refused before NCCL was called
  FakeSession::check_clean();
}

TEST_CASE("barrier inside an open group, and synchronize or barrier on a capturing stream, are ConfigErrors") {
  FakeSession session;
  {
    LocalGroup group({0}, options("misuse"));
    Communicator& comm = group[0];
    {
      GroupGuard guard;
      CHECK(contains(message_of<ConfigError>([&] { comm.barrier(); }), "inside an open GroupGuard"));
      guard.end();  // nothing was queued: ends cleanly
    }
    CHECK(comm.issued_sequence() == 0);

    ncclkit::nccl::Stream graph_stream(0);
    fake::set_capturing(graph_stream, true);
    CHECK(contains(message_of<ConfigError>([&] { comm.synchronize(graph_stream.get()); }), "capturing a CUDA graph"));
    CHECK(contains(message_of<ConfigError>([&] { comm.barrier(graph_stream.get()); }), "capturing a CUDA graph"));
    fake::set_capturing(graph_stream, false);
    CHECK(comm.issued_sequence() == 0);

    // Misuse leaves the communicator usable.
    CHECK_FALSE(comm.failed());
    comm.barrier();
    CHECK(comm.issued_sequence() == 1);
    CHECK(wait_until([&] { return comm.completed_sequence() == 1; }));  // the watchdog retires it
  }
  FakeSession::check_clean();
}
