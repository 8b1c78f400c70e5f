// fusion_gloo: the rows of fusion_nccl over ncclkit's Gloo backend on CPUs, processes as
// ranks: one all_reduce per tensor, the fusion layer's buckets over views of one fused buffer
// (FusedBuffer + GradientSync), one flat all_reduce over the same bytes. See fusion_bench.hpp.
//
//   fusion_gloo -p 2 -n 5 -w 1 -R 2
//
// The compute stream is the communicator's inline stream (the calling thread) and collectives
// run on its comm stream (the worker thread), so a step is timed on the host (steady_clock)
// from before the first collective is issued to the return of the wait that joins them.
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <vector>

#include "fusion_bench.hpp"

#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/gloo/communicator.hpp"

namespace {

namespace fb = ncclkit::bench::fusion_bench;
using ncclkit::gloo::Communicator;

/// Host times per step: the inline stream's work is done when the call returns.
class HostStepClock {
 public:
  HostStepClock(Communicator&, int steps) : starts_(static_cast<std::size_t>(steps)), stops_(starts_.size()) {}
  void start(std::size_t step, ncclkit::gloo::Stream) { starts_[step] = Clock::now(); }
  void stop(std::size_t step, ncclkit::gloo::Stream) { stops_[step] = Clock::now(); }
  double ms(std::size_t step) const {
    return std::chrono::duration<double, std::milli>(stops_[step] - starts_[step]).count();
  }

 private:
  using Clock = std::chrono::steady_clock;
  std::vector<Clock::time_point> starts_, stops_;
};

int run_rank(const ncclkit::WorldInfo& world, const fb::Options& options) {
  try {
    auto store = ncclkit::make_store(world.init_url, world);
    ncclkit::gloo::Options comm_options;
    comm_options.name = "fusion_bench";
    if (options.timeout_seconds > 0) {
      comm_options.timeout = std::chrono::milliseconds(static_cast<long long>(options.timeout_seconds * 1000));
    }
    Communicator comm(store, world, comm_options);
    if (world.rank == 0) {
      std::printf("# fusion_gloo: %d ranks (processes, loopback), reductions %s, float32, kAvg\n", comm.size(),
                  std::string(ncclkit::gloo::name_of(comm.isa())).c_str());
      std::fflush(stdout);
    }
    return fb::run_all<Communicator, HostStepClock>(comm, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion_gloo rank %d: %s\n", world.rank, e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) { return fb::main_of(argc, argv, "fusion_gloo", run_rank); }
