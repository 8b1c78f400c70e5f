// GradientSync over NCCL, what the seam promises on GPUs: finish's per-bucket callback issues
// work on the stream that runs after the bucket's reduction (an update scaled by 2 sees the
// reduced values, never the local ones), also with defer_gather, where the callbacks come in
// reverse plan order on the communicator's side stream and the compute stream waits for them
// at wait_all; and a peer that fails during the fused fp16 reduction
// (it exits, or stalls past the timeout, after marking half its tensors) gives the survivor the
// watchdog's CommError and nothing worse: every later call throws CommError, the GPU stays
// usable (cudaMalloc, cudaMemset, cudaDeviceSynchronize), and teardown reports no CUDA error.
// The drill repeats: a kernel spinning on a window when the abort unmapped it failed in most
// trials, not all.
// ncclkit-test: labels=nccl timeout=600 serial
#include <doctest/doctest.h>

#include <cuda_runtime.h>
#include <unistd.h>  // _exit

#include <chrono>   // std::chrono
#include <cstdio>   // std::printf
#include <cstdlib>  // std::getenv
#include <memory>   // std::shared_ptr
#include <optional>  // std::optional
#include <string>   // std::string
#include <thread>   // std::this_thread::sleep_for
#include <vector>   // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/compression.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "support/model_shapes.hpp"

namespace gradient_sync_gpu {

using namespace ncclkit_test;
using ncclkit::CommError;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::FusedBuffer;
using ncclkit::fusion::GradientSync;
using ncclkit::fusion::Slot;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::Options;
using Clock = std::chrono::steady_clock;

// Rank r's value of element i of the buffer: small, distinct per rank, exact in fp16 sums.
float value_of(int rank, std::size_t i) { return static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 3) % 64) / 64.0f; }

int bucket_callback_worker(const WorldInfo& world, const std::shared_ptr<Store>& store, bool defer) {
  Checker checker(world.rank);
  Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "callback"});
  FusedBuffer<Communicator> grads(comm, ncclkit::testing::model_layout("resnet50"));
  const std::size_t count = grads.layout().total_bytes(ncclkit::DataType::kFloat32) / 4;
  std::vector<float> host(count);
  for (std::size_t i = 0; i < count; ++i) host[i] = value_of(world.rank, i);
  const cudaStream_t compute = comm.default_stream();
  GradientSync<Communicator>::Options options{.op = ncclkit::ReduceOp::kSum};
  if (defer) {
    options.defer_gather = true;
    options.update_stream = comm.side_stream();
  }
  GradientSync<Communicator> sync(grads, BucketPlan::compute(grads.layout(), {.bucket_bytes = 4 << 20}), options);
  checker.expect(sync.plan().size() > 4, "several buckets");
  const cudaStream_t updates = defer ? comm.side_stream() : compute;
  checker.expect(sync.update_stream() == (defer ? comm.side_stream() : comm.comm_stream()), "the update stream");
  for (int step = 0; step < 3; ++step) {
    comm.copy_from_host(grads.data(ncclkit::DataType::kFloat32), host.data(), count * 4, compute);
    for (std::uint32_t i = static_cast<std::uint32_t>(grads.layout().size()); i-- > 0;) sync.mark_ready(Slot{i}, compute);
    std::vector<std::size_t> order;
    sync.finish(compute, [&](std::size_t b) {
      order.push_back(b);
      const auto& bucket = sync.plan()[b];
      comm.scale(ncclkit::TensorView{static_cast<std::byte*>(grads.data(bucket.dtype)) + bucket.begin_bytes,
                                     bucket.count(), bucket.dtype, ncclkit::MemoryKind::kDevice},
                 2.0, updates);
    });
    checker.expect(order.size() == sync.plan().size(), "every bucket handed over once");
    if (defer) {
      checker.expect(order.front() == sync.plan().size() - 1 && order.back() == 0, "reverse plan order");
      sync.wait_all(compute);
    }
    std::vector<float> got(count);
    comm.copy_to_host(got.data(), grads.data(ncclkit::DataType::kFloat32), count * 4, compute);
    comm.synchronize(compute);
    std::size_t wrong = 0;
    for (Slot slot = {0}; slot.index < grads.layout().size(); ++slot.index) {
      const std::size_t at = grads.layout().offset_elements(slot);
      for (std::size_t j = 0; j < grads.layout().count(slot); ++j) {
        float expected = 0;
        for (int r = 0; r < world.world_size; ++r) expected += value_of(r, at + j);
        if (got[at + j] != 2.0f * expected) ++wrong;
      }
    }
    checker.expect(wrong == 0, "step " + std::to_string(step) + ": " + std::to_string(wrong) +
                                   " values are not twice the sum (an update ran before its bucket landed)");
  }
  return checker.finish("per-bucket callback");
}

// The fused kernel is required on GPU runs: its absence fails, unless NCCLKIT_TEST_ALLOW_UNFUSED=1
// (then a visible SKIP line).
void fused_kernel_unavailable(const char* what) {
  const char* allow = std::getenv("NCCLKIT_TEST_ALLOW_UNFUSED");
  if (allow != nullptr && std::string(allow) == "1") {
    std::printf("SKIP: %s: the fused kernel cannot run here (NCCLKIT_TEST_ALLOW_UNFUSED=1)\n", what);
    MESSAGE("skipped " << what << ": no fused kernel");
    return;
  }
  FAIL_CHECK(what << ": the fused kernel cannot run here (set NCCLKIT_TEST_ALLOW_UNFUSED=1 where that is expected)");
}

enum class Failure { kExit, kStall };
constexpr int kNoFusedKernel = 3;  // a worker's exit code: the fused kernel cannot run here
constexpr auto kDrillTimeout = std::chrono::seconds(3);

// Whether a CUDA allocation, memset and device synchronisation work in this process.
bool gpu_usable(int device) {
  void* p = nullptr;
  if (cudaSetDevice(device) != cudaSuccess || cudaMalloc(&p, 1 << 20) != cudaSuccess) return false;
  const bool ok = cudaMemset(p, 0, 1 << 20) == cudaSuccess && cudaDeviceSynchronize() == cudaSuccess;
  return cudaFree(p) == cudaSuccess && ok;
}

int fused_failure_worker(const WorldInfo& world, const std::shared_ptr<Store>& store, Failure failure) {
  Checker checker(world.rank);
  int device = 0;
  {
    Communicator comm(store, world, Options{.timeout = kDrillTimeout, .name = "fused-drill"});
    device = comm.device();
    FusedBuffer<Communicator> grads(comm, ncclkit::testing::model_layout("resnet50"));
    GradientSync<Communicator> sync(
        grads, BucketPlan::compute(grads.layout()),
        {.reducer = ncclkit::compression::compressed({.codec = ncclkit::compression::Codec::kFloat16})});
    if (sync.reducer().name() != "fp16 fused kernel") {
      std::printf("rank %d: %s runs, not the fused kernel\n", world.rank, sync.reducer().name().c_str());
      std::fflush(stdout);
      return kNoFusedKernel;
    }
    const std::uint32_t tensors = static_cast<std::uint32_t>(grads.layout().size());
    const cudaStream_t compute = comm.default_stream();
    // Step 1 whole on every rank.
    for (std::uint32_t i = tensors; i-- > 0;) sync.mark_ready(Slot{i}, compute);
    sync.finish(compute);
    comm.synchronize(compute);
    if (world.rank == 1) {
      // Step 2: half the tensors (the first buckets launch), then gone.
      for (std::uint32_t i = tensors; i-- > tensors / 2;) sync.mark_ready(Slot{i}, compute);
      std::fflush(stdout);
      if (failure == Failure::kExit) ::_exit(0);
      std::this_thread::sleep_for(2 * kDrillTimeout + std::chrono::seconds(1));
      ::_exit(0);  // its peer gave up long ago; what it would do next is not the drill
    }
    for (std::uint32_t i = tensors; i-- > 0;) sync.mark_ready(Slot{i}, compute);
    const auto start = Clock::now();
    try {
      sync.finish(compute);
      comm.synchronize(compute);
      checker.expect(false, "the step completed without its peer");
    } catch (const CommError& e) {
      const double waited = std::chrono::duration<double>(Clock::now() - start).count();
      checker.expect(waited < 3 * 3.0 + 5, "CommError after " + std::to_string(waited) + " s");
    } catch (const std::exception& e) {
      checker.expect(false, std::string("not a CommError: ") + e.what());
    }
    // Every later call: CommError, never a raw CUDA error.
    try {
      comm.all_reduce(static_cast<float*>(grads.data(ncclkit::DataType::kFloat32)),
                      static_cast<float*>(grads.data(ncclkit::DataType::kFloat32)), 16, ncclkit::ReduceOp::kSum);
      comm.synchronize();
      checker.expect(false, "an all_reduce after the failure completed");
    } catch (const CommError&) {
    } catch (const std::exception& e) {
      checker.expect(false, std::string("a later call threw something else than CommError: ") + e.what());
    }
    checker.expect(gpu_usable(device), "the GPU is usable after the failure");
  }
  checker.expect(cudaGetLastError() == cudaSuccess, "no CUDA error left after teardown");
  checker.expect(gpu_usable(device), "the GPU is usable after teardown");
  return checker.finish("fused drill");
}

void run_fused_drill(Failure failure) {
  if (!have_gpus(2, "the fused reduction's failure drill")) return;
  constexpr int kTrials = 4;
  for (int trial = 0; trial < kTrials; ++trial) {
    CAPTURE(trial);
    const auto result = ncclkit::spawn(
        2,
        [&](const WorldInfo& world) {
          return fused_failure_worker(world, ncclkit::make_store(world.init_url, world), failure);
        },
        ncclkit::SpawnOptions{.timeout = std::chrono::seconds(60)});
    REQUIRE(result.workers.size() == 2);
    const auto& survivor = result.workers[0];
    if (survivor.exited && survivor.exit_code == kNoFusedKernel) {
      fused_kernel_unavailable("the fused reduction's failure drill");
      return;
    }
    CHECK_MESSAGE(survivor.ok(), result.describe());
    CHECK_MESSAGE(!result.timed_out, result.describe());
    if (!survivor.ok()) break;
  }
}

}  // namespace gradient_sync_gpu

using namespace gradient_sync_gpu;

TEST_CASE("finish's per-bucket callback over NCCL: work it issues runs after that bucket has landed") {
  for (bool defer : {false, true}) {
    for (int n : world_sizes()) {
      CAPTURE(defer);
      CAPTURE(n);
      run_workers(n, [defer](const WorldInfo& world, const std::shared_ptr<Store>& store) {
        return bucket_callback_worker(world, store, defer);
      });
    }
  }
}

TEST_CASE("a peer exits during the fused fp16 reduction: CommError, later calls CommError, the GPU usable (4 trials)") {
  run_fused_drill(Failure::kExit);
}

TEST_CASE("a peer stalls during the fused fp16 reduction: CommError, later calls CommError, the GPU usable (4 trials)") {
  run_fused_drill(Failure::kStall);
}
