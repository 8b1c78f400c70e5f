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
  std::printf("[rank %d/%d] rendezvous through %s in %.1f ms; counter %lld (expected %lld)\n",
              world.rank, world.world_size, store->describe().c_str(), rendezvous_ms, total, expected);
  if (total != expected) return 2;
  return 0;
}

void usage() {
  std::printf("usage: demo [--nprocs N] [--init-url URL]\n");
}

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
