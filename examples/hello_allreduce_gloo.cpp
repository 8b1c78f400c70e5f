// hello_allreduce_gloo: every process contributes a vector, ncclkit averages it over Gloo
// (CPU, TCP), and every process checks the result.
//
// Run it alone and it forks N local processes (default 4):
//     ./hello_allreduce_gloo 4
// or start it under a launcher, one process per rank, e.g. torchrun:
//     torchrun --nproc-per-node 4 ./hello_allreduce_gloo
// (ncclkit reads RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; SLURM and Open MPI work too).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <span>
#include <vector>

#include "ncclkit/bootstrap/environment.hpp"  // ncclkit::detect_world
#include "ncclkit/bootstrap/init_url.hpp"     // ncclkit::make_store
#include "ncclkit/bootstrap/spawn.hpp"        // ncclkit::spawn
#include "ncclkit/gloo/communicator.hpp"      // ncclkit::gloo::Communicator

int run(const ncclkit::WorldInfo& world) {
  // Rendezvous: a TcpStore at MASTER_ADDR:MASTER_PORT under a launcher, a shared folder under
  // spawn (world.init_url says which).
  auto store = ncclkit::make_store(world.init_url, world);
  ncclkit::gloo::Communicator comm(store, world, {.timeout = std::chrono::seconds(60)});

  // Rank r holds r + 1 everywhere, plus a little pattern so that positions matter.
  const std::size_t count = 1 << 20;
  std::vector<float> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<float>(world.rank + 1) + static_cast<float>(i % 7);

  comm.all_reduce(std::span<float>(values), ncclkit::ReduceOp::kAvg);

  // The average of 1..n is (n + 1) / 2.
  const float base = static_cast<float>(comm.size() + 1) / 2.0f;
  std::size_t wrong = 0;
  for (std::size_t i = 0; i < count; ++i) {
    if (std::fabs(values[i] - (base + static_cast<float>(i % 7))) > 1e-5f) ++wrong;
  }
  std::printf("rank %d of %d: averaged %zu floats over Gloo, %zu wrong%s\n", comm.rank(), comm.size(), count, wrong,
              wrong == 0 ? " - OK" : "");
  return wrong == 0 ? 0 : 1;
}

int main(int argc, char** argv) {
  try {
    const ncclkit::WorldInfo world = ncclkit::detect_world();
    if (world.world_size > 1) return run(world);  // started by a launcher: this is one rank

    const int nprocs = argc > 1 ? std::atoi(argv[1]) : 4;
    auto result = ncclkit::spawn(nprocs, run);
    std::printf("%s\n", result.describe().c_str());
    return result.ok() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "hello_allreduce_gloo: %s\n", e.what());
    return 1;
  }
}
