// Abort drills: one rank exits, one is stopped with SIGSTOP, one skips a collective, and the
// survivors destroy a communicator with a hung collective. The others must get CommError
// within the timeout + 5 s (naming the operation, its sequence number, its bytes, the time
// waited and the rank that fell behind), every later call must throw CommError too, and every
// process must exit cleanly. Over NVLink a lost peer is only caught by the timeout; with
// NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (scripts/gpu-run.sh runs that too) NCCL reports it.
// ncclkit-test: labels=nccl timeout=300 serial
#include <doctest/doctest.h>

#include <signal.h>  // kill, raise, SIGSTOP, SIGCONT
#include <unistd.h>  // getpid, _exit

#include <algorithm>  // std::find
#include <chrono>     // std::chrono
#include <optional>   // std::optional
#include <string>     // std::string
#include <thread>     // std::this_thread::sleep_for
#include <vector>     // std::vector

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

enum class Drill { kExit, kStop, kSkip, kDestroy };

const char* drill_name(Drill drill) {
  switch (drill) {
    case Drill::kExit: return "a rank exits";
    case Drill::kStop: return "a rank is stopped (SIGSTOP)";
    case Drill::kSkip: return "a rank skips a collective";
    case Drill::kDestroy: return "destroy with a collective hung";
  }
  return "?";
}

constexpr auto kTimeout = std::chrono::seconds(5);
constexpr std::size_t kCount = 1 << 20;  // 4 MiB of float

/// Waits (bounded) until this rank's watchdog has published `issued completed` to the store,
/// so that the survivors' reports can show where this rank stopped.
bool wait_published(Communicator& comm, const std::string& expected) {
  const auto deadline = Clock::now() + std::chrono::seconds(10);
  const std::string key = "progress/" + std::to_string(comm.rank());
  while (Clock::now() < deadline) {
    if (comm.store_scope()->check({key}) && comm.store_scope()->get_string(key).rfind(expected, 0) == 0) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling our own watchdog thread's output
  }
  return false;
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
  const cudaStream_t s = comm->default_stream();
  DeviceBuffer<float> buffer(kCount, comm->device());
  upload(buffer, make_input<float>(1, r, kCount), s);
  comm->all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);  // seq 1, on every rank
  comm->synchronize();
  checker.expect(comm->completed_seq() == 1 || wait_published(*comm, "1 1"), "seq 1 completed");

  if (r == victim) {
    checker.expect(wait_published(*comm, "1 1"), "victim's progress published");
    switch (drill) {
      case Drill::kExit:
        std::printf("rank %d: exiting without a word, as a crashed rank would\n", r);
        std::fflush(stdout);
        ::_exit(0);
      case Drill::kStop:
        store->set("drill/victim_pid", std::to_string(::getpid()));
        ::raise(SIGSTOP);  // rank 0 sends SIGCONT once the survivors are done
        break;
      case Drill::kSkip:
      case Drill::kDestroy:
        break;  // never issues seq 2
    }
    store->wait({"drill/release"}, std::chrono::seconds(120));
    comm->abort("drill over");
    return checker.finish(drill_name(drill));
  }

  // Survivors: seq 2 never completes.
  const auto start = Clock::now();
  if (drill == Drill::kDestroy) {
    comm->all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);
    comm.reset();  // pending work gets the timeout, then the communicator is aborted
    const double took = std::chrono::duration<double>(Clock::now() - start).count();
    checker.expect(took < std::chrono::duration<double>(kTimeout).count() + 5.0,
                   "destruction with a hung collective took " + std::to_string(took) + " s");
  } else {
    try {
      comm->all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum);
      comm->synchronize();
      checker.expect(false, "all_reduce with a lost peer completed");
    } catch (const CommError& e) {
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      const std::string message = e.what();
      std::printf("rank %d caught after %.2f s:\n%s\n", r, waited, message.c_str());
      checker.expect(waited < std::chrono::duration<double>(kTimeout).count() + 5.0,
                     "CommError within timeout + 5 s (took " + std::to_string(waited) + " s)");
      const std::vector<std::string> needles{"all_reduce", "seq 2", "4194304 bytes", "waited",
                                             "rank " + std::to_string(r) + " of"};
      for (const std::string& needle : needles) {
        checker.expect(message.find(needle) != std::string::npos, "message names '" + needle + "'");
      }
      const auto report = comm->failure_report();
      checker.expect(report.has_value(), "a failure report exists");
      if (report) {
        checker.expect(report->has_operation && report->seq == 2 && report->bytes == kCount * sizeof(float),
                       "report: op seq 2, 4 MiB");
        checker.expect(report->aborted, "report: the communicator was aborted");
        checker.expect(report->issued == 2 && report->completed == 1, "report: this rank issued 2, completed 1");
        const auto behind = report->ranks_behind();
        checker.expect(std::find(behind.begin(), behind.end(), victim) != behind.end(),
                       "report names rank " + std::to_string(victim) + " as behind");
        checker.expect(std::find(behind.begin(), behind.end(), r) == behind.end(), "report does not blame this rank");
      }
    }
    expect_comm_error(checker, "a later all_reduce", [&] { comm->all_reduce(buffer.data(), buffer.data(), kCount, ReduceOp::kSum); });
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
    if (drill == Drill::kStop) {
      const pid_t pid = static_cast<pid_t>(std::stol(store->get_string("drill/victim_pid", std::chrono::seconds(10))));
      ::kill(pid, SIGCONT);
    }
    store->set("drill/release", "1");
  }
  return checker.finish(drill_name(drill));
}

void run_drill(Drill drill) {
  if (!have_gpus(2, drill_name(drill))) return;
  const int n = std::min(visible_gpu_count(), 4);
  CAPTURE(n);
  const auto start = Clock::now();
  run_workers(n, [drill](const WorldInfo& world, const std::shared_ptr<Store>& store) { return drill_worker(world, store, drill); },
              std::chrono::minutes(2));
  MESSAGE(std::string(drill_name(drill)) << ": whole drill took "
                            << std::chrono::duration<double>(Clock::now() - start).count() << " s on " << n << " GPUs");
}

TEST_CASE("drill: a rank exits; the others get CommError and exit cleanly") { run_drill(Drill::kExit); }
TEST_CASE("drill: a rank is stopped; the others get CommError and exit cleanly") { run_drill(Drill::kStop); }
TEST_CASE("drill: a rank skips a collective; the report names it") { run_drill(Drill::kSkip); }
TEST_CASE("drill: destroying a communicator with a hung collective returns") { run_drill(Drill::kDestroy); }

}  // namespace
