// Benchmarks of FileStore (ncclkit/store/file_store.hpp):
//   BM_FileStoreSetGet/<bytes>   one set followed by one get of the same key, one process
//   BM_FileStoreAdd              one add (lock, read, write, rename, unlock), one process
//   BM_FileStoreRendezvous/<N>   wall time for N processes, fork included, to each join the
//                                store, set its key and wait for all N keys, then leave (the
//                                last one removes the run's files) and be reaped
//   BM_FileStoreBarrier/<N>      time of one ncclkit::barrier among N processes (rank 0's
//                                mean over 10 barriers after a warm-up one)
// Every benchmark checks what it read before its time counts. Rendezvous times are manual
// (seconds per rendezvous); the target is 256 processes under 3 s.
#include <benchmark/benchmark.h>

#include <stdlib.h>  // mkdtemp

#include <chrono>      // std::chrono
#include <cstdint>     // std::uint8_t
#include <cstdio>      // std::fopen (rank 0 reports barrier times through a file)
#include <filesystem>  // std::filesystem
#include <string>      // std::string
#include <vector>      // std::vector

#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/file_store.hpp"
#include "gbench_main.hpp"  // NCCLKIT_BENCHMARK_MAIN: a failed check exits 1

namespace {

using Clock = std::chrono::steady_clock;

std::string make_temp_dir() {
  char pattern[] = "/tmp/ncclkit-bench-fs-XXXXXX";
  if (::mkdtemp(pattern) == nullptr) throw std::runtime_error("mkdtemp failed");
  return pattern;
}

ncclkit::Bytes pattern_bytes(std::size_t size, unsigned seed) {
  ncclkit::Bytes out(size);
  for (std::size_t i = 0; i < size; ++i) out[i] = static_cast<std::uint8_t>((i * 131 + seed * 17 + 1) >> 1);
  return out;
}

void BM_FileStoreSetGet(benchmark::State& state) {
  const std::string dir = make_temp_dir();
  {
    ncclkit::FileStore store(dir, {.world_size = 1});
    const auto value = pattern_bytes(static_cast<std::size_t>(state.range(0)), 3);
    store.set("key", value);
    if (store.get("key", std::chrono::seconds(1)) != value) state.SkipWithError("get returned another value");
    for (auto _ : state) {
      store.set("key", value);
      auto got = store.get("key", std::chrono::seconds(10));
      benchmark::DoNotOptimize(got.data());
    }
    state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) * state.range(0) * 2);
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_FileStoreSetGet)->Arg(8)->Arg(4096)->Arg(1 << 20)->Unit(benchmark::kMicrosecond);

void BM_FileStoreAdd(benchmark::State& state) {
  const std::string dir = make_temp_dir();
  {
    ncclkit::FileStore store(dir, {.world_size = 1});
    std::int64_t expected = 0;
    for (auto _ : state) {
      expected += 1;
      if (store.add("counter", 1) != expected) state.SkipWithError("add returned a wrong count");
    }
  }
  std::filesystem::remove_all(dir);
}
BENCHMARK(BM_FileStoreAdd)->Unit(benchmark::kMicrosecond);

void BM_FileStoreRendezvous(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  for (auto _ : state) {
    const std::string dir = make_temp_dir();
    const auto start = Clock::now();
    auto result = ncclkit::spawn(
        n,
        [](const ncclkit::WorldInfo& world) {
          ncclkit::FileStore store(world.init_url.substr(7), {.world_size = world.world_size});
          store.set("rank/" + std::to_string(world.rank), "addr-" + std::to_string(world.rank));
          std::vector<std::string> keys;
          keys.reserve(static_cast<std::size_t>(world.world_size));
          for (int r = 0; r < world.world_size; ++r) keys.push_back("rank/" + std::to_string(r));
          store.wait(keys, std::chrono::seconds(60));
          const int peer = (world.rank + 1) % world.world_size;
          return store.get_string("rank/" + std::to_string(peer)) == "addr-" + std::to_string(peer) ? 0 : 2;
        },
        {.timeout = std::chrono::seconds(120), .rendezvous_dir = dir});
    const auto elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    bool cleaned = true;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) cleaned &= entry.path().filename() == "lock";
    std::filesystem::remove_all(dir);
    if (!result.ok()) {
      state.SkipWithError(("rendezvous failed: " + result.describe()).c_str());
      break;
    }
    if (!cleaned) {
      state.SkipWithError("the last rank did not remove the run's files");
      break;
    }
    state.SetIterationTime(elapsed);
  }
  state.counters["processes"] = n;
}
BENCHMARK(BM_FileStoreRendezvous)->Arg(8)->Arg(64)->Arg(256)->UseManualTime()->Iterations(5)->Unit(benchmark::kSecond);

void BM_FileStoreBarrier(benchmark::State& state) {
  const int n = static_cast<int>(state.range(0));
  constexpr int kRounds = 10;
  for (auto _ : state) {
    const std::string dir = make_temp_dir();
    const std::string result_file = dir + ".seconds";
    auto result =
        ncclkit::spawn(n,
                       [&](const ncclkit::WorldInfo& world) {
                         ncclkit::FileStore store(world.init_url.substr(7), {.world_size = world.world_size});
                         ncclkit::barrier(store, world.rank, world.world_size, "warm-up", std::chrono::seconds(60));
                         const auto start = Clock::now();
                         for (int round = 0; round < kRounds; ++round)
                           ncclkit::barrier(store, world.rank, world.world_size, "timed", std::chrono::seconds(60));
                         if (world.rank == 0) {
                           const double seconds = std::chrono::duration<double>(Clock::now() - start).count() / kRounds;
                           std::FILE* out = std::fopen(result_file.c_str(), "w");
                           if (out == nullptr) return 3;
                           std::fprintf(out, "%.9f\n", seconds);
                           std::fclose(out);
                         }
                         return 0;
                       },
                       {.timeout = std::chrono::seconds(120), .rendezvous_dir = dir});
    double seconds = 0;
    std::FILE* in = std::fopen(result_file.c_str(), "r");
    const bool have = in != nullptr && std::fscanf(in, "%lf", &seconds) == 1;
    if (in != nullptr) std::fclose(in);
    std::filesystem::remove_all(dir);
    std::filesystem::remove(result_file);
    if (!result.ok() || !have) {
      state.SkipWithError(("barrier run failed: " + result.describe()).c_str());
      break;
    }
    state.SetIterationTime(seconds);
  }
  state.counters["processes"] = n;
}
// Time per barrier (rank 0's view, mean of 10 consecutive barriers after a warm-up one).
BENCHMARK(BM_FileStoreBarrier)
    ->Arg(8)
    ->Arg(64)
    ->Arg(256)
    ->UseManualTime()
    ->Iterations(3)
    ->Unit(benchmark::kMillisecond);

}  // namespace

NCCLKIT_BENCHMARK_MAIN()
