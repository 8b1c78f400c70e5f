// TcpStore benchmarks (Google Benchmark). bench/pytorch_store_bench.py measures PyTorch's
// TCPStore the same way and, given this binary, runs both and prints them side by side.
//
//   BM_TcpStoreSetGet               one set + one get of a 16-byte value on loopback (a client
//                                   and a server thread in this process): the round trip of
//                                   two requests. Timed in batches of 100 calls (the time
//                                   column is per batch); counters mean_us, median_us and
//                                   p10_us are per call (the median is robust to other users'
//                                   load bursts).
//   BM_TcpStoreAdd                  one add: one request; same batches and counters.
//   BM_TcpStoreRendezvousThreads/256  256 threads, each with its own connection (connect and
//                                   handshake included), set their key, then wait for all 256
//                                   keys. Wall time until the last thread is done.
//   BM_TcpStoreRendezvousProcesses/N  N processes forked by spawn (SpawnStore::kTcp: the server
//                                   runs in this process) do the same. Wall time from the first
//                                   fork until every process has been reaped.
//
// Every benchmark checks its results (values read back, all keys present) before it counts.
// The rendezvous benchmarks run once per repetition: use --benchmark_repetitions=5 (and
// --benchmark_report_aggregates_only=true) for a median.

#include <benchmark/benchmark.h>

#include <algorithm>  // std::sort: batch percentiles
#include <atomic>     // std::atomic: failures seen by worker threads
#include <chrono>     // std::chrono
#include <cstdint>    // std::uint8_t
#include <random>     // std::mt19937_64: the value
#include <string>     // std::string
#include <thread>     // std::thread
#include <vector>     // std::vector

#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/store/tcp_store.hpp"
#include "gbench_main.hpp"  // NCCLKIT_BENCHMARK_MAIN: a failed check exits 1

using namespace std::chrono_literals;

namespace {

ncclkit::TcpStoreOptions client_of(int port) {
  return {.host = "127.0.0.1", .port = port, .timeout = 60s, .token = ""};
}

std::vector<std::string> rank_keys(int n) {
  std::vector<std::string> keys;
  keys.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) keys.push_back("rank/" + std::to_string(i));
  return keys;
}

/// Times `op` in batches of kBatch calls, one batch per benchmark iteration (so the time
/// column is per 100 calls), and reports per call the mean, the median and the 10th percentile
/// over the batches as counters (mean_us, median_us, p10_us). On a shared machine a burst of
/// someone else's work slows some batches; the batch median shows the store's own cost better
/// than the mean.
template <class Op>
void time_in_batches(benchmark::State& state, Op&& op) {
  constexpr int kBatch = 100;
  std::vector<double> per_call;
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kBatch; ++i) op();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    state.SetIterationTime(elapsed.count());
    per_call.push_back(elapsed.count() / kBatch);
  }
  std::sort(per_call.begin(), per_call.end());
  if (!per_call.empty()) {
    double sum = 0;
    for (double x : per_call) sum += x;
    state.counters["mean_us"] = sum / static_cast<double>(per_call.size()) * 1e6;
    state.counters["median_us"] = per_call[per_call.size() / 2] * 1e6;
    state.counters["p10_us"] = per_call[per_call.size() / 10] * 1e6;
  }
}

void BM_TcpStoreSetGet(benchmark::State& state) {
  ncclkit::TcpStoreServer server({.token = ""});
  ncclkit::TcpStore store(client_of(server.port()));
  std::mt19937_64 random(1);
  ncclkit::Bytes value(16);
  for (auto& b : value) b = static_cast<std::uint8_t>(random());
  store.set("key", value);
  if (store.get("key") != value) {
    state.SkipWithError("value read back differs");
    return;
  }
  time_in_batches(state, [&] {
    store.set("key", value);
    benchmark::DoNotOptimize(store.get("key"));
  });
}
BENCHMARK(BM_TcpStoreSetGet)->UseManualTime();

void BM_TcpStoreAdd(benchmark::State& state) {
  ncclkit::TcpStoreServer server({.token = ""});
  ncclkit::TcpStore store(client_of(server.port()));
  std::int64_t calls = 0;
  time_in_batches(state, [&] {
    store.add("counter", 1);
    ++calls;
  });
  if (store.add("counter", 0) != calls) state.SkipWithError("add lost counts");
}
BENCHMARK(BM_TcpStoreAdd)->UseManualTime();

void BM_TcpStoreRendezvousThreads(benchmark::State& state) {
  const int clients = static_cast<int>(state.range(0));
  const auto keys = rank_keys(clients);
  for (auto _ : state) {
    ncclkit::TcpStoreServer server({.token = ""});
    const int port = server.port();
    std::atomic<int> failures{0};
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    threads.reserve(static_cast<std::size_t>(clients));
    for (int i = 0; i < clients; ++i) {
      threads.emplace_back([&, i] {
        try {
          ncclkit::TcpStore store(client_of(port));
          store.set(keys[static_cast<std::size_t>(i)], std::string_view("1"));
          store.wait(keys, 60s);
        } catch (const std::exception&) {
          ++failures;
        }
      });
    }
    for (auto& thread : threads) thread.join();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (failures != 0) {
      state.SkipWithError("a client failed");
      return;
    }
    state.SetIterationTime(elapsed.count());
  }
}
// One rendezvous per run: pass --benchmark_repetitions=N for N of them and their median.
BENCHMARK(BM_TcpStoreRendezvousThreads)->Arg(256)->UseManualTime()->Unit(benchmark::kMillisecond)->Iterations(1);

void BM_TcpStoreRendezvousProcesses(benchmark::State& state) {
  const int nprocs = static_cast<int>(state.range(0));
  for (auto _ : state) {
    const auto start = std::chrono::steady_clock::now();
    auto result = ncclkit::spawn(
        nprocs,
        [nprocs](const ncclkit::WorldInfo& world) -> int {
          ncclkit::TcpStore store({.host = world.master_addr, .port = world.master_port, .timeout = 60s});
          store.set("rank/" + std::to_string(world.rank), std::string_view("1"));
          store.wait(rank_keys(nprocs), 60s);
          return 0;
        },
        {.timeout = 120s, .store = ncclkit::SpawnStore::kTcp});
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    if (!result.ok()) {
      state.SkipWithError(result.describe().c_str());
      return;
    }
    state.SetIterationTime(elapsed.count());
  }
}
BENCHMARK(BM_TcpStoreRendezvousProcesses)
    ->Arg(8)
    ->Arg(64)
    ->Arg(256)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond)
    ->Iterations(1);

}  // namespace

NCCLKIT_BENCHMARK_MAIN()
