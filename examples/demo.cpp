// ncclkit's demo: N local processes find each other through a store, pass a barrier, agree on
// a counter, and (where Gloo is built in) all-reduce real data over Gloo and check the result.
//
//   demo [--nprocs N] [--init-url URL]
//
// Run directly, it forks N workers with a private FileStore. Run under a launcher (RANK and
// WORLD_SIZE set: ncclkit-run, torchrun, srun), it is one of the workers and rendezvouses
// through the init URL of the environment.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <ncclkit/ncclkit.hpp>

#include <cmath>
#include <random>
#include <vector>

namespace {

int worker(const ncclkit::WorldInfo& world) {
  using Clock = std::chrono::steady_clock;
  auto start = Clock::now();
  auto store = ncclkit::make_store(world.init_url, world);
  store->set("demo/hello/" + std::to_string(world.rank), "pid " + std::to_string(::getpid()));
  ncclkit::barrier(*store, world.rank, world.world_size, "demo/start");
  auto rendezvous_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();

  // Every rank adds its rank + 1: the total is world*(world+1)/2 on every rank.
  store->add("demo/sum", world.rank + 1);
  ncclkit::barrier(*store, world.rank, world.world_size, "demo/added");
  long long total = store->add("demo/sum", 0);
  long long expected = 1LL * world.world_size * (world.world_size + 1) / 2;
  std::printf("[rank %d/%d] rendezvous through %s in %.1f ms; counter %lld (expected %lld)\n", world.rank,
              world.world_size, store->describe().c_str(), rendezvous_ms, total, expected);
  if (total != expected) return 2;

#if NCCLKIT_DEMO_WITH_GLOO
  // All-reduce 1 Mi floats over Gloo: each rank contributes values from its own seed, and
  // every rank checks the sum against a double-precision reference it computes itself.
  ncclkit::gloo::Options options;
  // All ranks on this host: loopback always works (NCCLKIT_GLOO_HOSTNAME or
  // NCCLKIT_GLOO_SOCKET_IFNAME, where set, override it).
  if (world.num_nodes == 1) options.hostname = "127.0.0.1";
  ncclkit::gloo::Communicator comm(store, world, options);
  constexpr std::size_t kCount = 1 << 20;
  auto values_of = [](int rank) {
    std::vector<float> values(kCount);
    std::mt19937 rng(1000 + rank);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (auto& v : values) v = dist(rng);
    return values;
  };
  std::vector<float> data = values_of(world.rank);
  auto t0 = Clock::now();
  comm.all_reduce(std::span<float>(data), ncclkit::ReduceOp::kSum);
  auto allreduce_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
  std::vector<double> reference(kCount, 0.0);
  for (int r = 0; r < world.world_size; ++r) {
    auto contribution = values_of(r);
    for (std::size_t i = 0; i < kCount; ++i) reference[i] += contribution[i];
  }
  double error = 0, norm = 0;
  for (std::size_t i = 0; i < kCount; ++i) {
    error += (data[i] - reference[i]) * (data[i] - reference[i]);
    norm += reference[i] * reference[i];
  }
  double relative = std::sqrt(error / norm);
  bool ok = relative < 1e-6;
  std::printf(
      "[rank %d/%d] gloo all_reduce of %zu floats (4 MiB) in %.2f ms: relative error %.2e vs a double reference: %s\n",
      world.rank, world.world_size, kCount, allreduce_ms, relative, ok ? "OK" : "WRONG");
  if (!ok) return 3;
#endif
  return 0;
}

void usage() { std::printf("usage: demo [--nprocs N] [--init-url URL]\n"); }

}  // namespace

int main(int argc, char** argv) {
  int nprocs = 4;
  std::string init_url;
  for (int i = 1; i < argc; ++i) {
    std::string_view arg = argv[i];
    if (arg == "--nprocs" && i + 1 < argc) {
      auto n = ncclkit::parse_int(argv[++i]);
      if (!n || *n < 1 || *n > 1024) {
        std::fprintf(stderr, "demo: --nprocs wants a number from 1 to 1024, got '%s'\n", argv[i]);
        return 2;
      }
      nprocs = static_cast<int>(*n);
    } else if (arg == "--init-url" && i + 1 < argc) {
      init_url = argv[++i];
    } else {
      usage();
      return arg == "--help" || arg == "-h" ? 0 : 2;
    }
  }
  try {
    if (ncclkit::env_string("RANK") || ncclkit::env_string("OMPI_COMM_WORLD_RANK") ||
        ncclkit::env_string("SLURM_PROCID")) {
      auto world = ncclkit::detect_world();
      if (!init_url.empty()) world.init_url = init_url;
      return worker(world);
    }
    std::printf("demo: starting %d local processes\n", nprocs);
    auto result = ncclkit::spawn(nprocs, worker);
    std::printf("demo: %s\n", result.describe().c_str());
    return result.ok() ? 0 : 1;
  } catch (const ncclkit::Error& e) {
    std::fprintf(stderr, "demo: %s\n", e.what());
    return 1;
  }
}
