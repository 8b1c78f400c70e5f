// The element-wise kernels of ncclkit/nccl/kernels.cuh (scale, fill) against the host, for every
// element type, and collectives without a stream between kernels of the test's own. The only
// GPU test source nvcc compiles: the other GPU tests are host code.
// Including the kernels here registers the scale launcher for the whole GPU test executable.
// ncclkit-test: labels=nccl timeout=300
#include <doctest/doctest.h>

#include <algorithm>  // std::all_of
#include <chrono>     // std::chrono
#include <cmath>      // std::nearbyint
#include <limits>     // std::numeric_limits
#include <memory>     // std::shared_ptr
#include <cstdio>     // std::printf
#include <cstring>    // std::memcmp
#include <string>     // std::string
#include <vector>     // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/core/detail/update_on_host.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"
#include "ncclkit/nccl/kernels.cuh"

namespace {

using namespace ncclkit_test;
using ncclkit::ReduceOp;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;
using ncclkit::nccl::Options;

TEST_CASE("the scale launcher is registered by including the kernels") {
  CHECK(static_cast<bool>(ncclkit::nccl::detail::scale_launcher() != nullptr));
}

// ---- kernels ----------------------------------------------------------------------------------

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
TEST_CASE("every variant of the fused 16-bit kernel fits two blocks per SM: at most 64 registers a thread") {
  // Options::compressed_reduce_blocks allows two blocks of 512 threads per SM, and a block that
  // waited for a place while its partners wait at a barrier would hang the reduction: 2 × 512 ×
  // registers must fit an SM's registers. The variants with an update (and a bfloat16 copy) are
  // the ones that come close. In a worker: the test process must not touch CUDA before forking.
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>&) {
    Checker checker(world.rank);
    using ncclkit::nccl::detail::compressed_reduce_kernel;
    int device = 0, per_sm = 0;
    if (!checker.expect(cudaGetDevice(&device) == cudaSuccess &&
                            cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxRegistersPerMultiprocessor, device) ==
                                cudaSuccess,
                        "the GPU's registers per SM")) {
      return checker.finish("the fused kernel's registers");
    }
    const struct {
      std::string name;
      const void* kernel;
    } variants[] = {
        {"fp16", reinterpret_cast<const void*>(&compressed_reduce_kernel<__half, false>)},
        {"fp16 with an update", reinterpret_cast<const void*>(&compressed_reduce_kernel<__half, true>)},
        {"bf16", reinterpret_cast<const void*>(&compressed_reduce_kernel<__nv_bfloat16, false>)},
        {"bf16 with an update", reinterpret_cast<const void*>(&compressed_reduce_kernel<__nv_bfloat16, true>)},
    };
    for (const auto& v : variants) {
      cudaFuncAttributes attributes{};
      if (!checker.expect(cudaFuncGetAttributes(&attributes, v.kernel) == cudaSuccess, v.name + ": attributes")) continue;
      std::printf("the fused kernel, %s: %d registers a thread\n", v.name.c_str(), attributes.numRegs);
      checker.expect(attributes.numRegs <= 64 &&
                         2 * ncclkit::nccl::detail::kCompressedReduceThreads * attributes.numRegs <= per_sm,
                     v.name + ": " + std::to_string(attributes.numRegs) + " registers a thread, more than two blocks of " +
                         std::to_string(ncclkit::nccl::detail::kCompressedReduceThreads) + " threads per SM allow");
    }
    return checker.finish("the fused kernel's registers");
  });
}
#endif

TEST_CASE("the update kernel gives the host loop's bits: every rule, aligned or not, a tail, a bfloat16 copy") {
  // 4-element vectors where every buffer is aligned (a count that is no multiple of 4 leaves a
  // tail), one element at a time from an offset of one element; each with and without the copy.
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "update"});
    Checker checker(world.rank);
    using ncclkit::DataType;
    using ncclkit::UpdateRule;
    const std::size_t count = 10003;
    const struct {
      std::string name;
      UpdateRule rule;
    } rules[] = {
        {"sgd, weight decay", {.lr = 0.1f, .weight_decay = 0.01f, .grad_scale = 0.5f}},
        {"sgd, momentum, nesterov", {.lr = 0.1f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true}},
        {"adamw", {.kind = UpdateRule::Kind::kAdamW, .lr = 0.01f, .weight_decay = 0.01f, .bias_correction1 = 0.19f,
                   .bias_correction2 = 0.002f}},
    };
    std::vector<std::vector<float>> start(4, std::vector<float>(count + 1));
    for (std::size_t k = 0; k < start.size(); ++k) {
      for (std::size_t i = 0; i <= count; ++i) start[k][i] = static_cast<float>(2 * unit(40 + k, 0, i) - 1);
    }
    for (float& v : start[3]) v = v * v;  // AdamW's second moment is not negative
    for (const auto& r : rules) {
      for (std::size_t offset : {0, 1}) {
        for (bool with_copy : {false, true}) {
          const std::string what = r.name + (offset != 0 ? ", offset by one element" : ", aligned") +
                                   (with_copy ? ", with a copy" : "");
          std::vector<DeviceBuffer<float>> device;
          for (const auto& host : start) {
            device.emplace_back(count + 1, comm.device());
            comm.copy_from_host(device.back().data(), host.data(), (count + 1) * sizeof(float));
          }
          DeviceBuffer<ncclkit::BFloat16> copy(count + 1, comm.device());
          // count elements of `type` from element `offset` of `base`, device or host memory.
          const auto view = [&](void* base, DataType type,
                                ncclkit::MemoryKind where = ncclkit::MemoryKind::kDevice) {
            return ncclkit::TensorView{static_cast<char*>(base) + offset * ncclkit::size_of(type), count, type, where};
          };
          const int states = r.rule.state_count();
          const ncclkit::TensorView none{};
          comm.update(r.rule, view(device[0].data(), DataType::kFloat32), view(device[1].data(), DataType::kFloat32),
                      states > 0 ? view(device[2].data(), DataType::kFloat32) : none,
                      states > 1 ? view(device[3].data(), DataType::kFloat32) : none,
                      with_copy ? view(copy.data(), DataType::kBFloat16) : none);
          std::vector<std::vector<float>> want = start;
          std::vector<ncclkit::BFloat16> want_copy(count + 1);
          const auto host = ncclkit::MemoryKind::kHost;
          ncclkit::detail::update_on_host(r.rule, view(want[0].data(), DataType::kFloat32, host),
                                          view(want[1].data(), DataType::kFloat32, host),
                                          states > 0 ? view(want[2].data(), DataType::kFloat32, host) : none,
                                          states > 1 ? view(want[3].data(), DataType::kFloat32, host) : none,
                                          view(want_copy.data(), DataType::kBFloat16, host));
          std::size_t wrong = 0;
          for (int k : {0, 2, 3}) {
            if (k > 0 && states < k - 1) continue;
            std::vector<float> got(count + 1);
            comm.copy_to_host(got.data(), device[static_cast<std::size_t>(k)].data(), got.size() * sizeof(float));
            comm.synchronize();
            for (std::size_t i = offset; i < offset + count; ++i) {
              wrong += std::memcmp(&got[i], &want[static_cast<std::size_t>(k)][i], sizeof(float)) != 0 ? 1 : 0;
            }
          }
          if (with_copy) {
            std::vector<ncclkit::BFloat16> got(count + 1);
            comm.copy_to_host(got.data(), copy.data(), got.size() * sizeof(ncclkit::BFloat16));
            comm.synchronize();
            for (std::size_t i = offset; i < offset + count; ++i) wrong += got[i].bits != want_copy[i].bits ? 1 : 0;
          }
          checker.expect(wrong == 0, what + ": " + std::to_string(wrong) + " values differ from the host loop's");
        }
      }
    }
    return checker.finish("the update kernel against the host loop");
  });
}

TEST_CASE("scale and fill kernels agree with the host for every type") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "kernels"});
    Checker checker(world.rank);
    const cudaStream_t s = comm.default_stream();
    for_each_type([&]<class T>() {
      const std::size_t count = 100003;
      const auto input = make_input<T>(3, 0, count);
      DeviceBuffer<T> buffer(count, comm.device());
      for (double factor : {0.5, -3.0}) {
        upload(buffer, input, s);
        comm.scale(buffer.view(), factor);
        const auto got = download(comm, buffer, s);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const double x = as_double(input[i]) * factor;
          double expected = 0;
          if constexpr (is_float_v<T>) {
            // float arithmetic, then rounding to T (what the kernel does): compare within 1 ulp of T
            expected = as_double(from_double<T>(static_cast<float>(as_double(input[i])) * static_cast<float>(factor)));
            if constexpr (std::is_same_v<T, double>) expected = x;
          } else {
            double r = std::nearbyint(x);
            const double lo = static_cast<double>(std::numeric_limits<T>::lowest());
            const double hi = static_cast<double>(std::numeric_limits<T>::max());
            expected = r < lo ? lo : (r > hi ? hi : r);
          }
          if (as_double(got[i]) != expected) ++wrong;
        }
        checker.expect(wrong == 0, "scale " + type_name<T>() + " by " + std::to_string(factor) + ": " +
                                       std::to_string(wrong) + " wrong elements");
      }
    });
    DeviceBuffer<float> filled(777, comm.device());
    ncclkit::nccl::fill(filled.data(), filled.size(), 2.5f, s);
    checker.expect(download(comm, filled, s) == std::vector<float>(777, 2.5f), "fill");
    return checker.finish("kernels");
  });
}

// ---- streams ------------------------------------------------------------------------------

/// Spins for `cycles` clock cycles, then writes `value` to data[0, count): a kernel slow enough
/// (milliseconds) that work not ordered after it surely starts before it writes. One block, so
/// that every thread writes after the spin.
__global__ void slow_fill(float* data, std::size_t count, float value, long long cycles) {
  if (threadIdx.x == 0) {
    const long long start = clock64();
    while (clock64() - start < cycles) {
    }
  }
  __syncthreads();
  for (std::size_t i = threadIdx.x; i < count; i += blockDim.x) data[i] = value;
}
__global__ void double_values(float* data, std::size_t count) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count; i += gridDim.x * blockDim.x) data[i] *= 2;
}

// The usage of the header's own example, with no stream named anywhere: a kernel on CUDA's
// default stream writes the input, the collective reduces it, a kernel on the default stream
// uses the output, and cudaMemcpy (the default stream too) reads it. A collective that ran on
// a stream of its own, not ordered with stream 0, would start while slow_fill still spins and
// reduce the previous round's input; double_values could also run before the collective wrote.
TEST_CASE("a collective without a stream is ordered after and before the caller's kernels on stream 0") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "stream-0"});
      ncclkit::nccl::DeviceGuard on_its_gpu(comm.device());  // the user's kernels run on the communicator's GPU
      const int r = comm.rank(), size = comm.size();
      constexpr std::size_t kCount = 1 << 14;
      constexpr int kRounds = 20;
      int khz = 0;
      NCCLKIT_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, comm.device()));
      const long long two_ms = 2LL * khz;
      DeviceBuffer<float> in(kCount, comm.device()), out(kCount, comm.device());
      NCCLKIT_CUDA_CHECK(cudaMemset(in.data(), 0, kCount * sizeof(float)));
      NCCLKIT_CUDA_CHECK(cudaMemset(out.data(), 0, kCount * sizeof(float)));
      std::vector<float> got(kCount);
      int wrong_rounds = 0;
      for (int round = 0; round < kRounds; ++round) {
        // Out of place, sum: 2 * sum over ranks of (rank + 1 + round).
        slow_fill<<<1, 256>>>(in.data(), kCount, static_cast<float>(r + 1 + round), two_ms);
        NCCLKIT_CUDA_CHECK(cudaGetLastError());
        comm.all_reduce(in.data(), out.data(), kCount);
        double_values<<<16, 256>>>(out.data(), kCount);
        NCCLKIT_CUDA_CHECK(cudaGetLastError());
        NCCLKIT_CUDA_CHECK(cudaMemcpy(got.data(), out.data(), kCount * sizeof(float), cudaMemcpyDeviceToHost));
        const float sum = 2.0f * static_cast<float>(size * (size + 1) / 2 + size * round);
        bool right = std::all_of(got.begin(), got.end(), [&](float v) { return v == sum; });
        // In place, average, as in the header's example: 3 * ((size + 1) / 2 + round).
        slow_fill<<<1, 256>>>(in.data(), kCount, 3.0f * static_cast<float>(r + 1 + round), two_ms);
        NCCLKIT_CUDA_CHECK(cudaGetLastError());
        comm.all_reduce(in.data(), in.data(), kCount, ReduceOp::kAvg);
        NCCLKIT_CUDA_CHECK(cudaMemcpy(got.data(), in.data(), kCount * sizeof(float), cudaMemcpyDeviceToHost));
        const float average = 3.0f * (static_cast<float>(size + 1) / 2.0f + static_cast<float>(round));
        // Within rounding: NCCL may scale by 1/size before summing.
        right = right &&
                std::all_of(got.begin(), got.end(), [&](float v) { return std::fabs(v - average) <= 1e-5f * average; });
        if (!right) ++wrong_rounds;
      }
      comm.synchronize();
      checker.expect(wrong_rounds == 0, std::to_string(wrong_rounds) + " of " + std::to_string(kRounds) +
                                            " rounds read data not ordered with stream 0");
      return checker.finish("collectives without a stream, between kernels on stream 0");
    });
  }
}

}  // namespace
