// Abort drills: one rank exits, one is stopped with SIGSTOP, one skips a collective, one
// issues only after its peers gave up (3 GPUs or more), and the survivors destroy a
// communicator with a hung collective. The others must get CommError within the timeout + 5 s
// (naming the operation, its sequence number, its bytes, the time waited and the rank that fell
// behind), every later call must throw CommError too, and every process must exit cleanly. Two
// more drills destroy an idle communicator after a peer exited or was stopped: that too must
// return in time.
// Over NVLink a lost peer is only caught by the timeout; with NCCL_P2P_DISABLE=1
// NCCL_SHM_DISABLE=1 (scripts/gpu-run.sh runs that too) NCCL reports it.
//
// NCCL's aborted kernels stop waiting but keep signalling their peers (prims: a wait breaks on
// the abort flag, the step counters are still posted), so a survivor whose direct peers in
// NCCL's ring all aborted can see the collective complete, with undefined data, and fails
// only at its next collective (seen on 4 x H200 with NCCL 2.28.3). The drills accept that outcome
// only when it is explained so (some peer had already timed out) and the next collective
// fails; they print the data and timing that show it. A failing rank announces its failure
// through the store, and the other ranks' store links learn of it from there (nccl/detail/store_link.hpp):
// the late rank, idle when its peers failed, must have its all_reduce refused instead of
// released, and ranks whose timeout is much longer than the failing rank's must fail with it.
// ncclkit-test: labels=nccl timeout=300 serial
#include <doctest/doctest.h>

#include <signal.h>  // kill, raise, SIGSTOP, SIGCONT
#include <unistd.h>  // getpid, _exit

#include <algorithm>  // std::find, std::min
#include <chrono>     // std::chrono
#include <cmath>      // std::fabs
#include <cstdint>    // std::int64_t, std::uint64_t
#include <cstdio>     // std::printf
#include <cstdlib>    // std::getenv
#include <limits>     // std::numeric_limits
#include <optional>   // std::optional
#include <string>     // std::string
#include <thread>     // std::this_thread::sleep_for
#include <vector>     // std::vector

#include "gpu/hang_dump.hpp"
#include "gpu/nccl_support.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"

namespace {

using namespace ncclkit_test;
using ncclkit::CommError;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;
using ncclkit::nccl::Options;
using Clock = std::chrono::steady_clock;

enum class Drill { kExit, kStop, kSkip, kLate, kDestroy, kExitIdle, kStopIdle };

const char* drill_name(Drill drill) {
  switch (drill) {
    case Drill::kExit:
      return "a rank exits";
    case Drill::kStop:
      return "a rank is stopped (SIGSTOP)";
    case Drill::kSkip:
      return "a rank skips a collective";
    case Drill::kLate:
      return "a rank issues after its peers gave up";
    case Drill::kDestroy:
      return "destroy with a collective hung";
    case Drill::kExitIdle:
      return "a rank exits after its last collective";
    case Drill::kStopIdle:
      return "a rank is stopped after its last collective";
  }
  return "?";
}

constexpr auto kTimeout = std::chrono::seconds(5);
constexpr std::size_t kCount = 1 << 20;  // 4 MiB of float
/// The rank that issues seq 2 only once the other survivors have failed (Drill::kLate, with
/// at least 3 ranks). With 4 ranks its ring neighbours are usually 0 and 2, which abort.
constexpr int kLateRank = 1;

/// Steady-clock nanoseconds. steady_clock is CLOCK_MONOTONIC on Linux, one clock for every
/// process of the host, so ranks can compare the times they publish.
std::int64_t nanoseconds(Clock::time_point t) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

/// Waits (bounded) until the watchdog of rank `of_rank` has published progress that `accept`
/// takes (its store key holds "issued completed[ failed]").
template <class Accept>
bool wait_progress(Communicator& comm, int of_rank, Accept&& accept, std::chrono::seconds limit) {
  const auto deadline = Clock::now() + limit;
  const std::string key = "progress/" + std::to_string(of_rank);
  while (Clock::now() < deadline) {
    if (comm.store_scope()->check({key}) && accept(comm.store_scope()->get_string(key))) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling a watchdog thread's output
  }
  return false;
}

/// Waits (bounded) until this rank's watchdog has published `issued completed` to the store,
/// so that the survivors' reports can show where this rank stopped.
bool wait_published(Communicator& comm, const std::string& expected) {
  return wait_progress(
      comm, comm.rank(), [&](const std::string& value) { return value.rfind(expected, 0) == 0; },
      std::chrono::seconds(10));
}

/// One all_reduce (in place, kCount floats) and synchronize on a survivor.
struct Attempt {
  bool threw = false;  ///< CommError (its text in `message`); false: it returned
  std::string message;
  Clock::time_point issued, ended;
};
Attempt all_reduce_and_wait(Communicator& comm, DeviceBuffer<float>& buffer) {
  Attempt attempt;
  attempt.issued = Clock::now();
  try {
    comm.all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);
    comm.synchronize();
  } catch (const CommError& e) {
    attempt.threw = true;
    attempt.message = e.what();
  }
  attempt.ended = Clock::now();
  return attempt;
}

std::vector<float> download_now(const DeviceBuffer<float>& buffer, cudaStream_t stream) {
  std::vector<float> host(kCount);
  ncclkit::nccl::DeviceGuard on_buffer_gpu(buffer.device());  // a default-stream handle: the buffer's GPU's
  NCCLKIT_CUDA_CHECK(
      cudaMemcpyAsync(host.data(), buffer.data(), kCount * sizeof(float), cudaMemcpyDeviceToHost, stream));
  NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(stream));  // the stream is idle but for this copy
  return host;
}

/// A survivor's seq 2 returned although rank `victim` never issued it. NCCL's abort explains
/// that only if some other survivor had already timed out (and aborted) when it returned:
/// checks that against the issue times the survivors published, and prints what the log must
/// show (timing, capture status, progress, how wrong the data is).
void explain_early_completion(Checker& checker, Communicator& comm, Store& store, DeviceBuffer<float>& buffer,
                              const std::vector<float>& before, const Attempt& attempt, int victim) {
  const int n = comm.size(), r = comm.rank();
  const cudaStream_t s = comm.default_stream();
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  const cudaError_t capture_status = cudaStreamIsCapturing(s, &capture);
  // Every rank held seq 1's result (`before`), so seq 2 should be n times it.
  const std::vector<float> got = download_now(buffer, s);
  std::size_t wrong = 0, unchanged = 0, first_wrong = 0;
  for (std::size_t i = 0; i < kCount; ++i) {
    const double expected = n * static_cast<double>(before[i]);
    if (std::fabs(got[i] - expected) > 1e-5 * (std::fabs(expected) + 1.0) && wrong++ == 0) first_wrong = i;
    if (got[i] == before[i]) ++unchanged;
  }
  // The earliest issue of seq 2 by another survivor; its watchdog fired the timeout after that.
  std::int64_t earliest_peer = std::numeric_limits<std::int64_t>::max();
  for (int j = 0; j < n; ++j) {
    if (j == r || j == victim) continue;
    earliest_peer = std::min<std::int64_t>(
        earliest_peer, std::stoll(store.get_string("drill/issued_at/" + std::to_string(j), std::chrono::seconds(10))));
  }
  const std::int64_t issued = nanoseconds(attempt.issued), ended = nanoseconds(attempt.ended);
  const std::int64_t timeout = std::chrono::duration_cast<std::chrono::nanoseconds>(kTimeout).count();
  const double took = static_cast<double>(ended - issued) * 1e-9;
  const double peer_offset = static_cast<double>(earliest_peer - issued) * 1e-9;
  std::printf(
      "rank %d: NOTE all_reduce seq 2 without rank %d RETURNED %.3f s after issuing; the earliest other "
      "survivor issued %+.3f s from this rank (its timeout fired at %+.3f s); stream capturing: %s; "
      "issued %llu, completed %llu, failed %d; data: %zu of %zu elements differ from %d x seq 1's result "
      "(first at %zu: got %g, expected %g), %zu equal to seq 1's result\n",
      r, victim, took, peer_offset, peer_offset + static_cast<double>(timeout) * 1e-9,
      capture_status != cudaSuccess            ? "query failed"
      : capture == cudaStreamCaptureStatusNone ? "no"
                                               : "YES",
      static_cast<unsigned long long>(comm.issued_sequence()),
      static_cast<unsigned long long>(comm.completed_sequence()), comm.failed() ? 1 : 0, wrong, kCount, n, first_wrong,
      static_cast<double>(got[first_wrong]), n * static_cast<double>(before[first_wrong]), unchanged);
  std::fflush(stdout);
  checker.expect(capture_status == cudaSuccess && capture == cudaStreamCaptureStatusNone,
                 "the default stream is not capturing");
  // No other survivor (2 ranks): nothing could have released this rank.
  const bool explained = earliest_peer != std::numeric_limits<std::int64_t>::max() && ended - timeout >= earliest_peer;
  checker.expect(explained,
                 "seq 2 returned " + std::to_string(took) +
                     " s after issuing, before any other survivor "
                     "could have timed out (the earliest issued " +
                     std::to_string(peer_offset) +
                     " s from this rank): NCCL's abort does not explain it; suspect ncclkit's completion tracking");
}

/// Destroys `comm`; if that has not returned after the timeout + 10 s, every thread's stack
/// goes to the log (tests/gpu/hang_dump.hpp), so that a hang shows where it waits.
void destroy_watched(std::optional<Communicator>& comm, const std::string& what) {
  HangDump dump(what, kTimeout + std::chrono::seconds(10));
  comm.reset();
}

template <class Call>
void expect_comm_error(Checker& checker, const std::string& what, Call&& call) {
  try {
    call();
    checker.expect(false, what + ": no CommError");
  } catch (const CommError& e) {
    checker.expect(std::string(e.what()).find("failed") != std::string::npos, what + ": " + e.what());
  } catch (const std::exception& e) {
    checker.expect(false, what + ": wrong exception type: " + e.what());
  }
}

int drill_worker(const WorldInfo& world, const std::shared_ptr<Store>& store, Drill drill) {
  Checker checker(world.rank);
  std::optional<Communicator> comm(std::in_place, store, world, Options{.timeout = kTimeout, .name = "drill"});
  const int n = comm->size(), r = comm->rank(), victim = n - 1;
  require(drill != Drill::kLate || kLateRank < victim, "the late-rank drill needs 3 ranks or more");
  const cudaStream_t s = comm->default_stream();
  DeviceBuffer<float> buffer(kCount, comm->device());
  upload(buffer, make_input<float>(1, r, kCount), s);
  comm->all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);  // seq 1, on every rank
  comm->synchronize();
  checker.expect(comm->completed_sequence() == 1 || wait_published(*comm, "1 1"), "seq 1 completed");

  if (r == victim) {
    checker.expect(wait_published(*comm, "1 1"), "victim's progress published");
    switch (drill) {
      case Drill::kExit:
      case Drill::kExitIdle:
        std::printf("rank %d: exiting without a word, as a crashed rank would\n", r);
        std::fflush(stdout);
        store->set("drill/victim_gone", "1");
        ::_exit(0);
      case Drill::kStop:
      case Drill::kStopIdle:
        store->set("drill/victim_pid", std::to_string(::getpid()));
        store->set("drill/victim_gone", "1");
        ::raise(SIGSTOP);  // rank 0 sends SIGCONT once the survivors are done
        break;
      case Drill::kSkip:
      case Drill::kLate:
      case Drill::kDestroy:
        break;  // never issues seq 2
    }
    store->wait({"drill/release"}, std::chrono::seconds(120));
    comm->abort("drill over");
    return checker.finish(drill_name(drill));
  }

  // Survivors: seq 2 never completes (the victim never issues it); the idle drills issue none.
  const bool idle = drill == Drill::kExitIdle || drill == Drill::kStopIdle;
  const std::vector<float> before = drill == Drill::kDestroy || idle ? std::vector<float>{} : download_now(buffer, s);
  if (drill == Drill::kLate && r == kLateRank) {
    // Issue only after every other survivor's communicator has failed and been aborted.
    for (int j = 0; j < n; ++j) {
      if (j == r || j == victim) continue;
      checker.expect(wait_progress(
                         *comm, j, [](const std::string& value) { return value.find(" failed") != std::string::npos; },
                         std::chrono::seconds(30)),
                     "rank " + std::to_string(j) + " failed before the late rank issued");
    }
  }
  store->set("drill/issued_at/" + std::to_string(r), std::to_string(nanoseconds(Clock::now())));
  const auto start = Clock::now();
  if (idle) {
    // All work completed; then a peer died or stopped. NCCL's ncclCommDestroy may synchronise
    // with the peers to free resources (NVIDIA/nccl issue 863): destruction must still return.
    store->wait({"drill/victim_gone"}, std::chrono::seconds(30));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let it go or stop for good
    const auto destroy_start = Clock::now();
    destroy_watched(comm, "rank " + std::to_string(r) + ": destroying an idle communicator whose peer is gone");
    const double took = std::chrono::duration<double>(Clock::now() - destroy_start).count();
    std::printf("rank %d: destroying the idle communicator took %.3f s\n", r, took);
    std::fflush(stdout);
    checker.expect(took < std::chrono::duration<double>(kTimeout).count() + 5.0,
                   "destruction of an idle communicator whose peer is gone took " + std::to_string(took) + " s");
  } else if (drill == Drill::kDestroy) {
    comm->all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);
    // Pending work gets the timeout, then the communicator is aborted. Watched, because a
    // blocking ncclCommDestroy waiting for peers that are gone would never return from here.
    destroy_watched(comm, "rank " + std::to_string(r) + ": destroying a communicator with a hung collective");
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    checker.expect(took < std::chrono::duration<double>(kTimeout).count() + 5.0,
                   "destruction with a hung collective took " + std::to_string(took) + " s");
  } else if (drill == Drill::kLate && r == kLateRank) {
    // Its peers announced their failure more than a peer-check interval (0.5 s) before it
    // issued (their progress says "failed" only after their ~1 s abort): its store link has
    // seen the announcement while idle, so the all_reduce must be refused at once rather than
    // released by the aborted peers with undefined data (what NCCL alone lets happen).
    Attempt attempt = all_reduce_and_wait(*comm, buffer);
    const double waited = std::chrono::duration<double>(attempt.ended - attempt.issued).count();
    std::printf("rank %d (late) %s after %.3f s:\n%s\n", r, attempt.threw ? "caught" : "RETURNED", waited,
                attempt.message.c_str());
    if (!attempt.threw) explain_early_completion(checker, *comm, *store, buffer, before, attempt, victim);
    checker.expect(attempt.threw, "the late rank's all_reduce was refused, not released with undefined data");
    checker.expect(attempt.message.find("announced through the store") != std::string::npos &&
                       attempt.message.find("cannot be used any more") != std::string::npos,
                   "the late rank learnt of its peers' failure through the store while idle");
    // The call waits for the report of the abort its store link started (~1 s): not a hang.
    checker.expect(waited < std::chrono::duration<double>(kTimeout).count(),
                   "refused within the timeout (took " + std::to_string(waited) + " s)");
    checker.expect(comm->issued_sequence() == 1, "the refused all_reduce took no sequence number");
    expect_comm_error(checker, "a later all_reduce",
                      [&] { comm->all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum); });
    expect_comm_error(checker, "a later synchronize", [&] { comm->synchronize(); });
    comm.reset();
  } else {
    Attempt attempt = all_reduce_and_wait(*comm, buffer);
    std::uint64_t failing = 2;  // the collective this rank's CommError is about
    if (!attempt.threw) {
      explain_early_completion(checker, *comm, *store, buffer, before, attempt, victim);
      failing = 3;
      attempt = all_reduce_and_wait(*comm, buffer);
      checker.expect(attempt.threw, "all_reduce seq 3 after seq 2 returned without a peer: no CommError");
    }
    if (attempt.threw) {
      const double waited = std::chrono::duration<double>(attempt.ended - attempt.issued).count();
      const std::string& message = attempt.message;
      std::printf("rank %d caught after %.2f s:\n%s\n", r, waited, message.c_str());
      checker.expect(waited < std::chrono::duration<double>(kTimeout).count() + 5.0,
                     "CommError within timeout + 5 s (took " + std::to_string(waited) + " s)");
      const std::vector<std::string> needles{"all_reduce", "seq " + std::to_string(failing), "4194304 bytes", "waited",
                                             "rank " + std::to_string(r) + " of"};
      for (const std::string& needle : needles) {
        checker.expect(message.find(needle) != std::string::npos, "message names '" + needle + "'");
      }
      const auto report = comm->failure_report();
      checker.expect(report.has_value(), "a failure report exists");
      if (report) {
        checker.expect(report->has_operation && report->seq == failing && report->bytes == kCount * sizeof(float),
                       "report: op seq " + std::to_string(failing) + ", 4 MiB");
        checker.expect(report->aborted, "report: the communicator was aborted");
        checker.expect(
            report->issued == failing && report->completed == failing - 1,
            "report: this rank issued " + std::to_string(failing) + ", completed " + std::to_string(failing - 1));
        const auto behind = report->ranks_behind();
        checker.expect(std::find(behind.begin(), behind.end(), victim) != behind.end(),
                       "report names rank " + std::to_string(victim) + " as behind");
        checker.expect(std::find(behind.begin(), behind.end(), r) == behind.end(), "report does not blame this rank");
      }
    }
    expect_comm_error(checker, "a later all_reduce",
                      [&] { comm->all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum); });
    expect_comm_error(checker, "a later synchronize", [&] { comm->synchronize(); });
    expect_comm_error(checker, "a later barrier", [&] { comm->barrier(); });
    expect_comm_error(checker, "a later record", [&] { (void)comm->record(); });
    const auto destroy_start = Clock::now();
    comm.reset();
    const double took = std::chrono::duration<double>(Clock::now() - destroy_start).count();
    checker.expect(took < 2.0, "destroying an aborted communicator took " + std::to_string(took) + " s");
  }

  // Rank 0 releases the victim once every survivor is done.
  store->set("drill/checked/" + std::to_string(r), "1");
  if (r == 0) {
    for (int j = 0; j < n - 1; ++j) store->wait({"drill/checked/" + std::to_string(j)}, std::chrono::seconds(60));
    if (drill == Drill::kStop || drill == Drill::kStopIdle) {
      const pid_t pid = static_cast<pid_t>(std::stol(store->get_string("drill/victim_pid", std::chrono::seconds(10))));
      ::kill(pid, SIGCONT);
    }
    store->set("drill/release", "1");
  }
  return checker.finish(drill_name(drill));
}

void run_drill(Drill drill) {
  // The late rank must be a survivor other than the victim (the last rank): with 2 ranks it
  // would be the victim itself, and the drill would be the skip drill again.
  if (!have_gpus(drill == Drill::kLate ? 3 : 2, drill_name(drill))) return;
  if (const char* p2p = std::getenv("NCCL_P2P_DISABLE");
      drill == Drill::kLate && p2p != nullptr && std::string(p2p) == "1") {
    // Over NCCL's network transport the late rank may see the peers' closed connections as an
    // asynchronous error before it issues anything: a different drill. This one is about P2P.
    std::printf("SKIP: %s: NVLink/P2P only (NCCL_P2P_DISABLE=1)\n", drill_name(drill));
    MESSAGE("skipped " << drill_name(drill) << ": NVLink/P2P only");
    return;
  }
  const int n = std::min(visible_gpu_count(), 4);
  CAPTURE(n);
  const auto start = Clock::now();
  run_workers(
      n,
      [drill](const WorldInfo& world, const std::shared_ptr<Store>& store) {
        return drill_worker(world, store, drill);
      },
      std::chrono::minutes(2));
  MESSAGE(std::string(drill_name(drill)) << ": whole drill took "
                                         << std::chrono::duration<double>(Clock::now() - start).count() << " s on " << n
                                         << " GPUs");
}

TEST_CASE("drill: a rank exits; the others get CommError and exit cleanly") { run_drill(Drill::kExit); }
TEST_CASE("drill: a rank is stopped; the others get CommError and exit cleanly") { run_drill(Drill::kStop); }
TEST_CASE("drill: a rank skips a collective; the report names it") { run_drill(Drill::kSkip); }
TEST_CASE("drill: a rank issues after its peers gave up; its all_reduce is refused") { run_drill(Drill::kLate); }
TEST_CASE("drill: destroying a communicator with a hung collective returns") { run_drill(Drill::kDestroy); }
TEST_CASE("drill: a rank exits after its last collective; destroying the others returns") {
  run_drill(Drill::kExitIdle);
}
TEST_CASE("drill: a rank is stopped after its last collective; destroying the others returns") {
  run_drill(Drill::kStopIdle);
}

TEST_CASE("synchronize refuses work that waited while a peer announced a failure") {
  // What a collective released by a peer's abort looks like from this rank: it waited longer
  // than the peer check interval (1 s with a 10 s timeout), then completed, and a peer's
  // announcement is in the store by the time synchronize() looks. Made deterministic here:
  // rank 1 issues seq 2 1.3 s late (so rank 0's completes after waiting), then writes a
  // pretend announcement; only then does rank 0 call synchronize().
  if (!have_gpus(2, "synchronize's check of long waits")) return;
  run_workers(2, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Checker checker(world.rank);
    const int r = world.rank;
    Communicator comm(store, world, Options{.timeout = std::chrono::seconds(10), .name = "verify"});
    DeviceBuffer<float> buffer(kCount, comm.device());
    upload(buffer, make_input<float>(1, r, kCount), comm.default_stream());
    comm.all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);  // seq 1
    comm.synchronize();
    if (r == 1) {
      // Rank 0's seq 2 then waits 1.3 s: over the 1 s interval, and completed well before its
      // store link's next look (about 2 s in), so that synchronize() is what finds the key.
      std::this_thread::sleep_for(std::chrono::milliseconds(1300));
      comm.all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);  // seq 2, late
      comm.synchronize();  // did not wait long itself: no store check, no error
      checker.expect(!comm.failed(), "rank 1's own synchronize is not affected");
      comm.store_scope()->set("failed", std::string("1 pretend failure of the test"));
      store->wait({"verify/rank0-done"}, std::chrono::seconds(60));
      comm.abort("test over");
      return checker.finish("synchronize check (rank 1)");
    }
    comm.all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);  // seq 2, waits ~1.3 s for rank 1
    bool announced = false;
    for (const auto deadline = Clock::now() + std::chrono::seconds(30); !announced && Clock::now() < deadline;) {
      announced = comm.store_scope()->check({std::string("failed")});
      if (!announced) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling the store
    }
    checker.expect(announced, "rank 1 wrote the pretend announcement");
    try {
      comm.synchronize();
      checker.expect(false, "synchronize returned work that waited while a peer announced a failure");
    } catch (const CommError& e) {
      const std::string message = e.what();
      std::printf("rank 0 caught:\n%s\n", message.c_str());
      checker.expect(message.find("rank 1 announced through the store") != std::string::npos &&
                         message.find("may have been released") != std::string::npos,
                     "the error says why: " + message);
      checker.expect(message.find("all_reduce seq 2") != std::string::npos, "the error names seq 2");
    }
    store->set("verify/rank0-done", "1");
    return checker.finish("synchronize check");
  });
}

TEST_CASE("a failure announced through the store ends peers' waits long before their own timeout") {
  // Rank 0 has a 2 s timeout, the last rank never issues seq 2, the ranks between have 120 s:
  // they must fail within seconds of rank 0 (through the store), not after 120 s.
  if (!have_gpus(3, "peer failure through the store")) return;
  const int n = std::min(visible_gpu_count(), 4);
  CAPTURE(n);
  run_workers(
      n,
      [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
        Checker checker(world.rank);
        const int r = world.rank, victim = world.world_size - 1;
        const auto timeout = r == 0 ? std::chrono::seconds(2) : std::chrono::seconds(120);
        Communicator comm(store, world, Options{.timeout = timeout, .name = "peers"});
        DeviceBuffer<float> buffer(kCount, comm.device());
        upload(buffer, make_input<float>(1, r, kCount), comm.default_stream());
        comm.all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);  // seq 1, on every rank
        comm.synchronize();
        if (r == victim) {
          store->wait({"peers/release"}, std::chrono::seconds(120));
          comm.abort("test over");
          return checker.finish("peer failure (victim)");
        }
        const auto start = Clock::now();
        Attempt attempt = all_reduce_and_wait(comm, buffer);
        if (!attempt.threw && r != 0) {
          // Released by rank 0's abort (see the top of this file) and not caught by synchronize's
          // check, which it should have been: it waited for rank 0's timeout. Say so; the next
          // collective must fail anyway.
          checker.expect(false, "seq 2 completed without CommError although rank 0 had announced its failure");
          std::printf("rank %d: seq 2 returned after %.2f s (released by an aborted peer)\n", r,
                      std::chrono::duration<double>(attempt.ended - attempt.issued).count());
          attempt = all_reduce_and_wait(comm, buffer);
        }
        const double waited = std::chrono::duration<double>(Clock::now() - start).count();
        checker.expect(attempt.threw, "CommError");
        std::printf("rank %d caught after %.2f s:\n%s\n", r, waited, attempt.message.c_str());
        if (r == 0) {
          checker.expect(attempt.message.find("did not complete within the timeout") != std::string::npos,
                         "rank 0 failed by its own timeout");
        } else {
          // Through the store; over NCCL's network transport, rank 0's abort closing its sockets
          // can be reported by NCCL first.
          const bool network =
              std::getenv("NCCL_P2P_DISABLE") != nullptr && std::string(std::getenv("NCCL_P2P_DISABLE")) == "1";
          const bool through_store = attempt.message.find("rank 0 announced through the store") != std::string::npos;
          const bool through_nccl = attempt.message.find("NCCL reported an asynchronous error") != std::string::npos;
          checker.expect(through_store || (network && through_nccl),
                         "rank " + std::to_string(r) + " learnt of rank 0's failure through the store" +
                             (network ? " or NCCL's network transport" : ""));
          checker.expect(waited < 2.0 + 8.0, "rank " + std::to_string(r) +
                                                 " failed within 8 s of rank 0's timeout (took " +
                                                 std::to_string(waited) + " s; its own timeout is 120 s)");
        }
        store->set("peers/checked/" + std::to_string(r), "1");
        if (r == 0) {
          for (int j = 0; j < victim; ++j)
            store->wait({"peers/checked/" + std::to_string(j)}, std::chrono::seconds(60));
          store->set("peers/release", "1");
        }
        return checker.finish("peer failure");
      },
      std::chrono::minutes(2));
}

}  // namespace
