// gbench_nccl_enqueue: Google Benchmark microbenchmarks of the host time it takes to enqueue one
// collective through ncclkit, against NCCL called directly (8-byte all_reduce, so that the GPU
// is never the bottleneck), on 2 processes with one GPU each (1 when only one is visible).
//
// Collectives must match across ranks, so every benchmark runs a fixed number of iterations
// (no adaptive count, which would differ between processes) and every rank runs the same
// list; rank 0 reports, the others run silently. One iteration issues one call (one group of 8
// for the group benchmarks: there the time is per group, and items_per_second counts
// collectives); the stream is synchronised every 256 calls with the timer paused, so that the
// stream's queue never fills and the time is the host's. Unlike bench_nccl_enqueue, whose
// variants take turns batch by batch, each benchmark here runs alone for 51200 calls: caches
// stay warm for the one path being timed. Google Benchmark's flags
// apply (--benchmark_filter, --benchmark_repetitions, --benchmark_format=json,
// --benchmark_out=FILE; rank 0 writes the file). Each benchmark checks, after its last call, that
// every call completed without error; a failed check makes the program exit 1.
//
//   gbench_nccl_enqueue [google benchmark flags]
//
// bench_nccl_enqueue.cu measures the same with its own loop and more variants (and a breakdown
// of the CUDA calls); this is the Google Benchmark form, for tools that read its output.
#include <benchmark/benchmark.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/local_gpus.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"
#include "ncclkit/nccl/group.hpp"
#include "gbench_main.hpp"  // CheckedReporter: a failed check fails the program
#include "raw_nccl_comm.hpp"

namespace {

using ncclkit::ReduceOp;
using ncclkit::nccl::Communicator;

constexpr int kSyncEvery = 256;         // calls between (untimed) stream synchronisations
constexpr int kIterations = 256 * 200;  // per benchmark and repetition, equal on every rank
constexpr int kGroup = 8;               // calls per group in the group benchmarks

/// What the benchmarks run on, made by each rank before the benchmarks start.
struct Setup {
  std::unique_ptr<Communicator> checked, unchecked;
  ncclComm_t raw = nullptr;
  std::unique_ptr<ncclkit::nccl::DeviceBuffer<float>> buffer;
  cudaStream_t stream = nullptr;  // checked's default stream; raw NCCL uses it too
  cudaEvent_t marker = nullptr;
};
Setup* setup = nullptr;

/// One call per iteration; a synchronisation with the timer paused every kSyncEvery calls.
/// After the last, `check` says what went wrong ("" when every call completed without error):
/// a failed check fails the benchmark, and the program's exit status (gbench_main.hpp). It is
/// reported after the loop, never inside it: every rank must issue the same calls.
template <class Issue, class Sync, class Check>
void enqueue_loop(benchmark::State& state, int calls_per_iteration, Issue&& issue, Sync&& sync, Check&& check) {
  int since_sync = 0;
  for (auto _ : state) {
    issue();
    since_sync += calls_per_iteration;
    if (since_sync >= kSyncEvery) {
      state.PauseTiming();
      sync();
      state.ResumeTiming();
      since_sync = 0;
    }
  }
  sync();
  state.SetItemsProcessed(state.iterations() * calls_per_iteration);  // items_per_second: collectives per second
  if (const std::string problem = check(); !problem.empty()) state.SkipWithError(problem.c_str());
}

void raw_sync() { NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(setup->stream)); }

/// Raw NCCL's calls: the stream drained and no asynchronous error on the communicator.
std::string raw_check() {
  ncclResult_t status = ncclSuccess;
  if (ncclCommGetAsyncError(setup->raw, &status) != ncclSuccess || status != ncclSuccess)
    return std::string("raw NCCL communicator: ") + ncclGetErrorString(status);
  if (cudaStreamQuery(setup->stream) != cudaSuccess) return "raw NCCL's stream has work left after synchronising";
  return "";
}

/// ncclkit's calls: every one issued has completed, and the communicator has not failed. The
/// watchdog thread counts completions after the stream has passed them: give it a moment.
std::string ncclkit_check(const Communicator& comm) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!comm.failed() && comm.completed_sequence() != comm.issued_sequence() &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));  // polling the watchdog's count
  }
  if (comm.failed()) return "the ncclkit communicator failed";
  if (comm.completed_sequence() != comm.issued_sequence()) {
    return "ncclkit completed " + std::to_string(comm.completed_sequence()) + " of " +
           std::to_string(comm.issued_sequence()) + " collectives after synchronize()";
  }
  return "";
}

void BM_RawAllReduce(benchmark::State& state) {
  float* data = setup->buffer->data();
  enqueue_loop(
      state, 1,
      [&] { NCCLKIT_NCCL_CHECK(ncclAllReduce(data, data, 2, ncclFloat32, ncclSum, setup->raw, setup->stream)); },
      raw_sync, raw_check);
}
void BM_RawAllReducePlusEvent(benchmark::State& state) {
  float* data = setup->buffer->data();
  enqueue_loop(
      state, 1,
      [&] {
        NCCLKIT_NCCL_CHECK(ncclAllReduce(data, data, 2, ncclFloat32, ncclSum, setup->raw, setup->stream));
        NCCLKIT_CUDA_CHECK(cudaEventRecord(setup->marker, setup->stream));
      },
      raw_sync, raw_check);
}
void BM_NcclkitAllReduce(benchmark::State& state) {
  float* data = setup->buffer->data();
  enqueue_loop(
      state, 1, [&] { setup->checked->all_reduce(data, data, 2, ReduceOp::kSum); },
      [] { setup->checked->synchronize(); }, [] { return ncclkit_check(*setup->checked); });
}
void BM_NcclkitAllReduceNoChecks(benchmark::State& state) {
  float* data = setup->buffer->data();
  enqueue_loop(
      state, 1, [&] { setup->unchecked->all_reduce(data, data, 2, ReduceOp::kSum); },
      [] { setup->unchecked->synchronize(); }, [] { return ncclkit_check(*setup->unchecked); });
}
void BM_RawGroupOf8(benchmark::State& state) {
  float* data = setup->buffer->data();
  enqueue_loop(
      state, kGroup,
      [&] {
        NCCLKIT_NCCL_CHECK(ncclGroupStart());
        for (int i = 0; i < kGroup; ++i)
          NCCLKIT_NCCL_CHECK(
              ncclAllReduce(data + 2 * i, data + 2 * i, 2, ncclFloat32, ncclSum, setup->raw, setup->stream));
        NCCLKIT_NCCL_CHECK(ncclGroupEnd());
      },
      raw_sync, raw_check);
}
void BM_NcclkitGroupOf8(benchmark::State& state) {
  float* data = setup->buffer->data();
  enqueue_loop(
      state, kGroup,
      [&] {
        ncclkit::nccl::GroupGuard group;
        for (int i = 0; i < kGroup; ++i) setup->checked->all_reduce(data + 2 * i, data + 2 * i, 2, ReduceOp::kSum);
        group.end();
      },
      [] { setup->checked->synchronize(); }, [] { return ncclkit_check(*setup->checked); });
}

void apply(benchmark::internal::Benchmark* b, int calls_per_iteration) {
  b->Iterations(kIterations / calls_per_iteration)->UseRealTime()->Unit(benchmark::kMicrosecond);
}

int run_rank(const ncclkit::WorldInfo& world) {
  auto store = ncclkit::make_store(world.init_url, world);
  Setup s;
  s.checked = std::make_unique<Communicator>(
      store, world, ncclkit::nccl::Options{.timeout = std::chrono::seconds(120), .name = "gbench-checked"});
  s.unchecked = std::make_unique<Communicator>(
      store, world,
      ncclkit::nccl::Options{
          .timeout = std::chrono::seconds(120), .name = "gbench-unchecked", .check_pointers = false});
  ncclkit::nccl::DeviceGuard guard(s.checked->device());
  s.raw = ncclkit::bench::init_raw_comm(*store, world, "gbench/raw_id");
  s.buffer = std::make_unique<ncclkit::nccl::DeviceBuffer<float>>(2 * kGroup, s.checked->device());
  s.stream = s.checked->comm_stream();
  NCCLKIT_CUDA_CHECK(cudaEventCreateWithFlags(&s.marker, cudaEventDisableTiming));
  setup = &s;

  // Warm up every path (connections, event pools, caches) with the same calls on every rank.
  float* data = s.buffer->data();
  for (int i = 0; i < 1000; ++i) {
    NCCLKIT_NCCL_CHECK(ncclAllReduce(data, data, 2, ncclFloat32, ncclSum, s.raw, s.stream));
    s.checked->all_reduce(data, data, 2, ReduceOp::kSum);
    s.unchecked->all_reduce(data, data, 2, ReduceOp::kSum);
  }
  s.checked->synchronize();
  s.unchecked->synchronize();
  s.checked->barrier();

  // Rank 0 prints; the others run their half of every collective silently (no inner
  // reporter). Every rank counts its own failed checks.
  ncclkit::bench::CheckedReporter reporter(world.rank == 0 ? benchmark::CreateDefaultDisplayReporter() : nullptr);
  if (world.rank == 0) {
    std::printf("# gbench_nccl_enqueue: %d ranks, %s; time per iteration = host time per call (per group of 8)\n",
                world.world_size, ncclkit::nccl::version_text().c_str());
    std::fflush(stdout);
  } else {
    // Rank 0 alone writes --benchmark_out: the others send theirs to /dev/null.
    char name[] = "gbench_nccl_enqueue";
    char discard[] = "--benchmark_out=/dev/null";
    char* args[] = {name, discard, nullptr};
    int count = 2;
    benchmark::Initialize(&count, args);
  }
  benchmark::RunSpecifiedBenchmarks(&reporter);
  s.checked->barrier();
  setup = nullptr;
  NCCLKIT_CUDA_CHECK(cudaEventDestroy(s.marker));
  NCCLKIT_NCCL_CHECK(ncclCommDestroy(s.raw));
  return reporter.finish(("gbench_nccl_enqueue rank " + std::to_string(world.rank)).c_str());
}

}  // namespace

BENCHMARK(BM_RawAllReduce)->Apply([](benchmark::internal::Benchmark* b) { apply(b, 1); });
BENCHMARK(BM_RawAllReducePlusEvent)->Apply([](benchmark::internal::Benchmark* b) { apply(b, 1); });
BENCHMARK(BM_NcclkitAllReduce)->Apply([](benchmark::internal::Benchmark* b) { apply(b, 1); });
BENCHMARK(BM_NcclkitAllReduceNoChecks)->Apply([](benchmark::internal::Benchmark* b) { apply(b, 1); });
BENCHMARK(BM_RawGroupOf8)->Apply([](benchmark::internal::Benchmark* b) { apply(b, kGroup); });
BENCHMARK(BM_NcclkitGroupOf8)->Apply([](benchmark::internal::Benchmark* b) { apply(b, kGroup); });

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);  // parses the flags; touches no GPU
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  const auto inventory = ncclkit::find_gpus();  // no CUDA before fork
  if (inventory.visible.empty()) {
    std::printf("SKIPPED: no GPU visible\n");
    return 77;
  }
  const int ranks = std::min<int>(2, static_cast<int>(inventory.visible.size()));
  auto result = ncclkit::spawn(ranks, [](const ncclkit::WorldInfo& world) { return run_rank(world); },
                               {.timeout = std::chrono::minutes(10)});
  if (!result.ok()) {
    std::fprintf(stderr, "gbench_nccl_enqueue: %s\n", result.describe().c_str());
    return 1;
  }
  return 0;
}
