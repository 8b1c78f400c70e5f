// fusion_nccl: gradient synchronisation of real models' gradient sets over ncclkit's NCCL
// backend, one process per GPU: one all_reduce per tensor, the fusion layer's buckets over
// views of one fused buffer (FusedBuffer + GradientSync), loose tensors packed per bucket, one
// flat all_reduce over the same bytes, and fp16/bf16 compressed buckets. See fusion_bench.hpp
// for the rows and the method.
//
//   fusion_nccl                                   # 2 processes, ResNet-50 and GPT-2 small
//   fusion_nccl -p 4 --model gpt2_small --bucket-mb 50,100 -n 50 -R 5 --csv fusion.csv
//
// Steps are timed with CUDA timing events on the compute stream (the communicator's default
// stream); collectives run on its comm stream. Set NCCL_NVLS_ENABLE=0 as the other GPU
// benchmarks do (the tool sets it when unset, before NCCL starts).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <vector>

#include "fusion_bench.hpp"

#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/group.hpp"

template <>
struct ncclkit::bench::fusion_bench::CollectiveGroup<ncclkit::nccl::Communicator> {
  static constexpr bool available = true;
  using Guard = ncclkit::nccl::GroupGuard;
};

namespace {

namespace fb = ncclkit::bench::fusion_bench;
using ncclkit::nccl::Communicator;

/// One pair of timing events per step, recorded on the compute stream.
class CudaStepClock {
 public:
  CudaStepClock(Communicator& comm, int steps) {
    for (int s = 0; s < steps; ++s) {
      starts_.emplace_back(comm.device(), true);
      stops_.emplace_back(comm.device(), true);
    }
  }
  void start(std::size_t step, cudaStream_t stream) { starts_[step].record(stream); }
  void stop(std::size_t step, cudaStream_t stream) { stops_[step].record(stream); }
  double ms(std::size_t step) const { return stops_[step].elapsed_ms_since(starts_[step]); }

 private:
  std::vector<ncclkit::nccl::Event> starts_, stops_;
};

int run_rank(const ncclkit::WorldInfo& world, const fb::Options& options) {
  try {
    auto store = ncclkit::make_store(world.init_url, world);
    ncclkit::nccl::Options comm_options;
    comm_options.name = "fusion_bench";
    comm_options.check_pointers = options.check_pointers;
    // Not given (-100): the communicator's default, the GPU's highest priority, which lets NCCL's
    // kernels overtake the codec's casts for SMs.
    if (options.comm_priority != -100) comm_options.stream_priority = options.comm_priority;
    if (options.timeout_seconds > 0) {
      comm_options.timeout = std::chrono::milliseconds(static_cast<long long>(options.timeout_seconds * 1000));
    }
    // --compute-stream own: the compute stream is a non-blocking stream of this program's
    // (Options::stream) instead of CUDA's legacy default stream.
    ncclkit::nccl::Stream own_stream;
    if (options.own_compute_stream) {
      int visible = 1;
      NCCLKIT_CUDA_CHECK(cudaGetDeviceCount(&visible));
      own_stream = ncclkit::nccl::Stream(world.local_rank % visible);  // the GPU the communicator picks
      comm_options.stream = own_stream.get();
    }
    Communicator comm(store, world, comm_options);
    // This process works on the communicator's GPU: its default stream and kernels go there.
    NCCLKIT_CUDA_CHECK(cudaSetDevice(comm.device()));
    if (world.rank == 0) {
      cudaDeviceProp prop{};
      NCCLKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, comm.device()));
      const char* nvls = std::getenv("NCCL_NVLS_ENABLE");
      int least = 0, greatest = 0;
      NCCLKIT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      std::printf(
          "# fusion_nccl: %d ranks (one process per GPU), %s, %s, NCCL_NVLS_ENABLE=%s, pointer checks %s, "
          "comm stream priority %d (range %d..%d), compute stream %s, float32, kAvg\n",
          comm.size(), prop.name, ncclkit::nccl::version_text().c_str(), nvls ? nvls : "(unset)",
          options.check_pointers ? "on" : "off", comm.options().stream_priority, least, greatest,
          options.own_compute_stream ? "a non-blocking stream" : "CUDA's legacy default stream");
      std::fflush(stdout);
    }
    return fb::run_all<Communicator, CudaStepClock>(comm, options);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusion_nccl rank %d: %s\n", world.rank, e.what());
    return 2;
  }
}

}  // namespace

int main(int argc, char** argv) {
  setenv("NCCL_NVLS_ENABLE", "0", 0);  // as the other GPU benchmarks run; an explicit value wins
  return fb::main_of(argc, argv, "fusion_nccl", run_rank);
}
