// The kernels of ncclkit/nccl/kernels.cuh against the host: scale and fill for every element
// type, the update kernel for every rule, and the fused 16-bit kernel's registers and its ranks
// (2 to 4 of them as launches on one GPU: bits, the fused update, a missing rank, the host's
// stop); and collectives without a stream between kernels of the test's own. Including the
// kernels here registers their launchers for the whole GPU test executable.
// ncclkit-test: labels=nccl timeout=300
#include <doctest/doctest.h>

#include <algorithm>   // std::all_of
#include <chrono>      // std::chrono
#include <cmath>       // std::nearbyint
#include <limits>      // std::numeric_limits
#include <memory>      // std::shared_ptr
#include <cstdio>      // std::printf
#include <cstring>     // std::memcmp
#include <functional>  // std::function
#include <string>      // std::string
#include <thread>      // std::this_thread
#include <vector>      // std::vector

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
    if (!checker.expect(
            cudaGetDevice(&device) == cudaSuccess &&
                cudaDeviceGetAttribute(&per_sm, cudaDevAttrMaxRegistersPerMultiprocessor, device) == cudaSuccess,
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
      if (!checker.expect(cudaFuncGetAttributes(&attributes, v.kernel) == cudaSuccess, v.name + ": attributes"))
        continue;
      std::printf("the fused kernel, %s: %d registers a thread\n", v.name.c_str(), attributes.numRegs);
      checker.expect(attributes.numRegs <= 64 &&
                         2 * ncclkit::nccl::detail::kCompressedReduceThreads * attributes.numRegs <= per_sm,
                     v.name + ": " + std::to_string(attributes.numRegs) +
                         " registers a thread, more than two blocks of " +
                         std::to_string(ncclkit::nccl::detail::kCompressedReduceThreads) + " threads per SM allow");
    }
    return checker.finish("the fused kernel's registers");
  });
}

// ---- the fused kernel's ranks on one GPU ----------------------------------------------------
// NCCL refuses two ranks on one GPU, so a communicator runs the fused kernel's exchange only where
// two GPUs are. Here its ranks are launches on one GPU, on streams of their own, reaching each
// other's windows through a table of pointers (PointerTableWindow): the exchange, the barriers and
// their epochs from call to call, the fused update and the timeout run at 2, 3 and 4 ranks on a
// machine with one GPU. (The kernel's code is the same template; only the two lines that turn an
// offset into an address differ.) Each rank runs few blocks (4 or 8), so that every rank's blocks
// are on the GPU at once, as the barriers need: a block that waited for a place while its partners
// wait for it would end the call at its deadline, a failure here, never a hang.

/// `world` ranks of the fused kernel, each with its own window, data, epochs and counters, all in
/// this GPU's memory.
struct TableRanks {
  int world;
  int blocks;
  std::size_t count, shard, slot, window_bytes;
  DeviceBuffer<char> windows;  // world windows of window_bytes
  DeviceBuffer<char*> bases;
  DeviceBuffer<std::uint32_t> epochs;  // per rank: blocks epochs, then its stop word
  DeviceBuffer<std::uint64_t> nonfinite;
  std::vector<DeviceBuffer<float>> data;
  int* gave_up = nullptr;  // mapped host memory, one word per rank
  std::vector<cudaStream_t> streams;

  TableRanks(int world_size, std::size_t n, int block_count)
      : world(world_size),
        blocks(block_count),
        count(n),
        shard((n + static_cast<std::size_t>(world_size) * 8 - 1) / (static_cast<std::size_t>(world_size) * 8) * 8),
        slot(shard),
        window_bytes(2 * static_cast<std::size_t>(world_size) * shard * 2 +
                     static_cast<std::size_t>(block_count) * world_size * 4),
        windows(world_size * window_bytes, 0),
        bases(world_size, 0),
        epochs(static_cast<std::size_t>(world_size) * (block_count + 1), 0),
        nonfinite(world_size, 0) {
    NCCLKIT_CUDA_CHECK(cudaMemset(windows.data(), 0, windows.size()));
    NCCLKIT_CUDA_CHECK(cudaMemset(epochs.data(), 0, epochs.size() * sizeof(std::uint32_t)));
    std::vector<char*> table;
    for (int r = 0; r < world; ++r) table.push_back(windows.data() + static_cast<std::size_t>(r) * window_bytes);
    NCCLKIT_CUDA_CHECK(cudaMemcpy(bases.data(), table.data(), table.size() * sizeof(char*), cudaMemcpyHostToDevice));
    for (int r = 0; r < world; ++r) data.emplace_back(count, 0);
    NCCLKIT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&gave_up), world * sizeof(int), cudaHostAllocMapped));
    for (int r = 0; r < world; ++r) {
      streams.emplace_back();
      NCCLKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&streams.back(), cudaStreamNonBlocking));
    }
  }
  ~TableRanks() {
    for (cudaStream_t s : streams) cudaStreamDestroy(s);
    cudaFreeHost(gave_up);
  }
  TableRanks(const TableRanks&) = delete;
  TableRanks& operator=(const TableRanks&) = delete;

  /// One call on every rank in `launched` (all when empty), each the same arguments but its own;
  /// `while_running` runs on the host after the launches, before the wait for them.
  void reduce(ncclkit::DataType wire, float encode, float decode, const std::vector<ncclkit::FusedUpdate>& updates,
              std::chrono::nanoseconds timeout, std::vector<int> launched = {},
              const std::function<void()>& while_running = {}) {
    if (launched.empty()) {
      for (int r = 0; r < world; ++r) launched.push_back(r);
    }
    NCCLKIT_CUDA_CHECK(cudaMemset(nonfinite.data(), 0, nonfinite.size() * sizeof(std::uint64_t)));
    NCCLKIT_CUDA_CHECK(cudaDeviceSynchronize());
    for (int r = 0; r < world; ++r) gave_up[r] = 0;
    for (int r : launched) {
      ncclkit::nccl::detail::CompressedReduceArgs a{};
      a.window = bases.data();
      a.data = data[static_cast<std::size_t>(r)].data();
      a.count = count;
      a.slot = slot;
      a.shard = shard;
      a.wire = wire;
      a.encode = encode;
      a.decode = decode;
      a.nonfinite = nonfinite.data() + r;
      a.epochs = epochs.data() + static_cast<std::size_t>(r) * (blocks + 1);
      a.stop = reinterpret_cast<int*>(a.epochs + blocks);
      NCCLKIT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&a.gave_up), gave_up + r, 0));
      a.rank = r;
      a.world = world;
      a.blocks = blocks;
      a.timeout_ns = static_cast<std::uint64_t>(timeout.count());
      if (!updates.empty()) a.update = updates[static_cast<std::size_t>(r)];
      NCCLKIT_CUDA_CHECK((ncclkit::nccl::detail::launch_compressed_reduce<ncclkit::nccl::detail::PointerTableWindow>(
          a, streams[static_cast<std::size_t>(r)])));
    }
    if (while_running) while_running();
    NCCLKIT_CUDA_CHECK(cudaDeviceSynchronize());
  }
};

/// What the fused kernel makes of element i with the ranks' inputs `in`: the owner's float32
/// value plus the others' 16-bit ones, in rank order, rounded once to 16 bits, decoded. `Wire`:
/// ncclkit::Half or ncclkit::BFloat16, the library's host rounding (to nearest, ties to even).
template <class Wire>
float fused_reference(const std::vector<std::vector<float>>& in, std::size_t shard, std::size_t i, float encode,
                      float decode) {
  const auto round = [](float v) { return static_cast<float>(Wire(v)); };
  const std::size_t owner = i / shard;
  float acc = in[owner][i] * encode;
  for (std::size_t q = 0; q < in.size(); ++q) {
    if (q != owner) acc += round(in[q][i] * encode);
  }
  return round(acc) * decode;
}

TEST_CASE("the fused kernel's ranks on one GPU: every rank the reference's bits, three calls in a row, 2 to 4 ranks") {
  // Encode and decode are powers of two, so that the host's arithmetic gives the GPU's bits
  // whether or not the compiler fuses the owner's multiply into its first add.
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>&) {
    Checker checker(world.rank);
    using ncclkit::DataType;
    for (int ranks : {2, 3, 4}) {
      for (DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
        const std::string what = std::to_string(ranks) + " ranks, " + (wire == DataType::kFloat16 ? "fp16" : "bf16");
        const std::size_t count = 100003;  // a tail in the last shard, and past every shard's end
        TableRanks t(ranks, count, 8);
        for (int call = 0; call < 3; ++call) {
          std::vector<std::vector<float>> in(static_cast<std::size_t>(ranks), std::vector<float>(count));
          for (int r = 0; r < ranks; ++r) {
            for (std::size_t i = 0; i < count; ++i) {
              in[static_cast<std::size_t>(r)][i] = static_cast<float>(8 * unit(50 + call, r, i) - 4);
            }
            NCCLKIT_CUDA_CHECK(cudaMemcpy(t.data[static_cast<std::size_t>(r)].data(),
                                          in[static_cast<std::size_t>(r)].data(), count * sizeof(float),
                                          cudaMemcpyHostToDevice));
          }
          t.reduce(wire, 0.5f, 0.25f, {}, std::chrono::seconds(20));
          std::size_t wrong = 0, gave_up = 0;
          std::uint64_t counted[4] = {};
          NCCLKIT_CUDA_CHECK(
              cudaMemcpy(counted, t.nonfinite.data(), ranks * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
          for (int r = 0; r < ranks; ++r) {
            std::vector<float> got(count);
            NCCLKIT_CUDA_CHECK(cudaMemcpy(got.data(), t.data[static_cast<std::size_t>(r)].data(), count * sizeof(float),
                                          cudaMemcpyDeviceToHost));
            for (std::size_t i = 0; i < count; ++i) {
              const float want = wire == DataType::kFloat16
                                     ? fused_reference<ncclkit::Half>(in, t.shard, i, 0.5f, 0.25f)
                                     : fused_reference<ncclkit::BFloat16>(in, t.shard, i, 0.5f, 0.25f);
              wrong += std::memcmp(&got[i], &want, sizeof(float)) != 0 ? 1 : 0;
            }
            gave_up += t.gave_up[r] != 0 ? 1 : 0;
            checker.expect(counted[r] == 0, what + ", call " + std::to_string(call) + ": rank " + std::to_string(r) +
                                                " counted " + std::to_string(counted[r]) + " non-finite values");
          }
          checker.expect(wrong == 0 && gave_up == 0,
                         what + ", call " + std::to_string(call) + ": " + std::to_string(wrong) +
                             " values differ from the reference's, " + std::to_string(gave_up) + " ranks gave up");
        }
        // Non-finite results are counted over the whole tensor, alike on every rank: one inf in
        // each shard, in its owner's float32 value.
        std::vector<float> host(count, 1.0f);
        for (int r = 0; r < ranks; ++r) {
          for (int q = 0; q < ranks; ++q) host[static_cast<std::size_t>(q) * t.shard + 3] = q == r ? INFINITY : 1.0f;
          NCCLKIT_CUDA_CHECK(cudaMemcpy(t.data[static_cast<std::size_t>(r)].data(), host.data(), count * sizeof(float),
                                        cudaMemcpyHostToDevice));
        }
        t.reduce(wire, 0.5f, 0.25f, {}, std::chrono::seconds(20));
        std::uint64_t counted[4] = {};
        NCCLKIT_CUDA_CHECK(
            cudaMemcpy(counted, t.nonfinite.data(), ranks * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
        for (int r = 0; r < ranks; ++r) {
          checker.expect(counted[r] == static_cast<std::uint64_t>(ranks),
                         what + ": rank " + std::to_string(r) + " counted " + std::to_string(counted[r]) + " of " +
                             std::to_string(ranks) + " non-finite results");
        }
      }
    }
    return checker.finish("the fused kernel's ranks on one GPU");
  });
}

TEST_CASE("the fused kernel's ranks on one GPU: the fused update gives reducing, then the host's update") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>&) {
    Checker checker(world.rank);
    using ncclkit::DataType;
    const std::size_t count = 50001;
    const int ranks = 2;
    const ncclkit::UpdateRule rule{.lr = 0.1f, .weight_decay = 0.01f, .momentum = 0.9f};
    TableRanks t(ranks, count, 8);
    std::vector<std::vector<float>> in(ranks, std::vector<float>(count)), param(ranks, std::vector<float>(count)),
        momentum(ranks, std::vector<float>(count));
    std::vector<DeviceBuffer<float>> device_param, device_momentum;
    std::vector<DeviceBuffer<ncclkit::BFloat16>> device_copy;
    std::vector<ncclkit::FusedUpdate> updates;
    for (int r = 0; r < ranks; ++r) {
      const auto k = static_cast<std::size_t>(r);
      for (std::size_t i = 0; i < count; ++i) {
        in[k][i] = static_cast<float>(2 * unit(60, r, i) - 1);
        param[k][i] = static_cast<float>(2 * unit(61, 0, i) - 1);  // replicas start alike
        momentum[k][i] = static_cast<float>(unit(62, 0, i));
      }
      device_param.emplace_back(count, 0);
      device_momentum.emplace_back(count, 0);
      device_copy.emplace_back(count, 0);
      NCCLKIT_CUDA_CHECK(cudaMemcpy(t.data[k].data(), in[k].data(), count * sizeof(float), cudaMemcpyHostToDevice));
      NCCLKIT_CUDA_CHECK(
          cudaMemcpy(device_param[k].data(), param[k].data(), count * sizeof(float), cudaMemcpyHostToDevice));
      NCCLKIT_CUDA_CHECK(
          cudaMemcpy(device_momentum[k].data(), momentum[k].data(), count * sizeof(float), cudaMemcpyHostToDevice));
      updates.push_back({rule, device_param[k].data(), device_momentum[k].data(), nullptr, device_copy[k].data()});
    }
    t.reduce(DataType::kBFloat16, 1.0f, 0.5f, updates, std::chrono::seconds(20));
    std::vector<float> averaged(count);
    for (std::size_t i = 0; i < count; ++i)
      averaged[i] = fused_reference<ncclkit::BFloat16>(in, t.shard, i, 1.0f, 0.5f);
    std::vector<float> want_param = param[0], want_momentum = momentum[0];
    std::vector<ncclkit::BFloat16> want_copy(count);
    const auto host = ncclkit::MemoryKind::kHost;
    const auto f32 = [&](float* p) { return ncclkit::TensorView{p, count, DataType::kFloat32, host}; };
    ncclkit::detail::update_on_host(rule, f32(want_param.data()), f32(averaged.data()), f32(want_momentum.data()), {},
                                    ncclkit::TensorView{want_copy.data(), count, DataType::kBFloat16, host});
    for (int r = 0; r < ranks; ++r) {
      const auto k = static_cast<std::size_t>(r);
      std::vector<float> got_param(count), got_momentum(count), got_in(count);
      std::vector<ncclkit::BFloat16> got_copy(count);
      NCCLKIT_CUDA_CHECK(
          cudaMemcpy(got_param.data(), device_param[k].data(), count * sizeof(float), cudaMemcpyDeviceToHost));
      NCCLKIT_CUDA_CHECK(
          cudaMemcpy(got_momentum.data(), device_momentum[k].data(), count * sizeof(float), cudaMemcpyDeviceToHost));
      NCCLKIT_CUDA_CHECK(cudaMemcpy(got_copy.data(), device_copy[k].data(), count * sizeof(ncclkit::BFloat16),
                                    cudaMemcpyDeviceToHost));
      NCCLKIT_CUDA_CHECK(cudaMemcpy(got_in.data(), t.data[k].data(), count * sizeof(float), cudaMemcpyDeviceToHost));
      std::size_t wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        wrong += std::memcmp(&got_param[i], &want_param[i], sizeof(float)) != 0 ? 1 : 0;
        wrong += std::memcmp(&got_momentum[i], &want_momentum[i], sizeof(float)) != 0 ? 1 : 0;
        wrong += got_copy[i].bits != want_copy[i].bits ? 1 : 0;
      }
      checker.expect(wrong == 0, "rank " + std::to_string(r) + ": " + std::to_string(wrong) +
                                     " parameters, momenta or copies differ from reducing, then updating on the host");
      checker.expect(got_in == in[k], "rank " + std::to_string(r) + ": the gradients changed under a fused update");
    }
    return checker.finish("the fused update at 2 ranks on one GPU");
  });
}

TEST_CASE("the fused kernel's ranks on one GPU: a rank that never launches makes the others give up, not hang") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>&) {
    Checker checker(world.rank);
    TableRanks t(2, 4096, 4);
    const auto start = std::chrono::steady_clock::now();
    t.reduce(ncclkit::DataType::kFloat16, 1.0f, 1.0f, {}, std::chrono::milliseconds(200), {0});
    const auto took = std::chrono::steady_clock::now() - start;
    std::uint64_t counted = 0;
    int stop = 0;
    NCCLKIT_CUDA_CHECK(cudaMemcpy(&counted, t.nonfinite.data(), sizeof(counted), cudaMemcpyDeviceToHost));
    NCCLKIT_CUDA_CHECK(cudaMemcpy(&stop, t.epochs.data() + t.blocks, sizeof(stop), cudaMemcpyDeviceToHost));
    checker.expect(t.gave_up[0] == 1, "rank 0 did not report that it gave up");
    checker.expect(stop == 1, "rank 0 did not raise its stop word for the launches behind it");
    checker.expect(counted >= 1, "rank 0 counted no non-finite value for a result that is not whole");
    checker.expect(took < std::chrono::seconds(10), "rank 0 waited far past its 200 ms deadline");
    // With its stop word raised, the next call returns before touching a window.
    t.reduce(ncclkit::DataType::kFloat16, 1.0f, 1.0f, {}, std::chrono::seconds(20), {0});
    NCCLKIT_CUDA_CHECK(cudaMemcpy(&counted, t.nonfinite.data(), sizeof(counted), cudaMemcpyDeviceToHost));
    checker.expect(counted >= 1 && t.gave_up[0] == 0, "a call after the stop did not return at once as not whole");
    return checker.finish("a missing rank at the fused kernel's barrier");
  });
}

TEST_CASE(
    "the fused kernel's ranks on one GPU: the host's stop ends a wait for a missing rank long before its deadline") {
  // What a communicator's abort does first (CommHandle::stop_window_kernels): it raises the stop
  // word from a stream of its own while the kernel waits at a barrier, and the kernel must leave
  // the window before the abort unmaps it.
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>&) {
    Checker checker(world.rank);
    TableRanks t(2, 4096, 4);
    cudaStream_t stopper = nullptr;
    NCCLKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&stopper, cudaStreamNonBlocking));
    const auto start = std::chrono::steady_clock::now();
    t.reduce(ncclkit::DataType::kFloat16, 1.0f, 1.0f, {}, std::chrono::seconds(30), {0}, [&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));  // rank 0 is waiting by now
      NCCLKIT_CUDA_CHECK(cudaMemsetAsync(t.epochs.data() + t.blocks, 1, sizeof(int), stopper));
    });
    const auto took = std::chrono::steady_clock::now() - start;
    NCCLKIT_CUDA_CHECK(cudaStreamDestroy(stopper));
    checker.expect(took < std::chrono::seconds(10),
                   "rank 0 waited " +
                       std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()) +
                       " ms after a stop raised at 200 ms (its deadline: 30 s)");
    checker.expect(t.gave_up[0] == 1, "rank 0 did not report that it gave up");
    return checker.finish("the host's stop at the fused kernel's barrier");
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
        {"adamw",
         {.kind = UpdateRule::Kind::kAdamW,
          .lr = 0.01f,
          .weight_decay = 0.01f,
          .bias_correction1 = 0.19f,
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
          const std::string what =
              r.name + (offset != 0 ? ", offset by one element" : ", aligned") + (with_copy ? ", with a copy" : "");
          std::vector<DeviceBuffer<float>> device;
          for (const auto& host : start) {
            device.emplace_back(count + 1, comm.device());
            comm.copy_from_host(device.back().data(), host.data(), (count + 1) * sizeof(float));
          }
          DeviceBuffer<ncclkit::BFloat16> copy(count + 1, comm.device());
          // count elements of `type` from element `offset` of `base`, device or host memory.
          const auto view = [&](void* base, DataType type, ncclkit::MemoryKind where = ncclkit::MemoryKind::kDevice) {
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
