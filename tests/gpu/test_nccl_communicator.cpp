// nccl::Communicator beyond the collective matrix: compile-time type maps and the Backend
// concept, misuse caught before NCCL sees it, bounded init, split,
// CUDA graph capture, options, several communicators on one store, and the single-process
// multi-GPU group. Host code (the C++ compiler builds it); the kernels are tested in
// test_nccl_kernels.cu, which also registers them for comm.scale() in this executable.
// ncclkit-test: labels=nccl timeout=300
#include <doctest/doctest.h>

#include <cuda_bf16.h>  // __nv_bfloat16
#include <cuda_fp16.h>  // __half

#include <algorithm>  // std::max, std::all_of
#include <chrono>     // std::chrono
#include <cmath>      // std::nearbyint, std::fabs
#include <cstdio>     // std::printf, std::fopen, std::fgets, std::fclose
#include <cstdlib>    // setenv, unsetenv, std::atoi
#include <limits>     // std::numeric_limits
#include <optional>   // std::optional
#include <string>     // std::string
#include <thread>     // std::this_thread::sleep_for
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/bootstrap/init.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/detail/driver_calls.hpp"
#include "ncclkit/nccl/device_buffer.hpp"
#include "ncclkit/nccl/group.hpp"
#include "ncclkit/nccl/local_group.hpp"
#include "ncclkit/nccl/detail/rendezvous.hpp"
#include "ncclkit/nccl/types.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "support/temp_dir.hpp"

namespace {

using namespace ncclkit_test;
using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::MemoryKind;
using ncclkit::Store;
using ncclkit::TensorView;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;
using ncclkit::nccl::GroupGuard;
using ncclkit::nccl::LocalGroup;
using ncclkit::nccl::Options;

// ---- compile time ---------------------------------------------------------------------------

static_assert(ncclkit::Backend<Communicator>, "nccl::Communicator models the Backend concept");
static_assert(Communicator::memory_kind == MemoryKind::kDevice);
static_assert(ncclkit::nccl::nccl_type_v<float> == ncclFloat32);
static_assert(ncclkit::nccl::nccl_type_v<double> == ncclFloat64);
static_assert(ncclkit::nccl::nccl_type_v<__half> == ncclFloat16);
static_assert(ncclkit::nccl::nccl_type_v<__nv_bfloat16> == ncclBfloat16);
static_assert(ncclkit::nccl::nccl_type_v<ncclkit::Half> == ncclFloat16);
static_assert(ncclkit::nccl::nccl_type_v<ncclkit::BFloat16> == ncclBfloat16);
static_assert(ncclkit::nccl::nccl_type_v<std::int8_t> == ncclInt8);
static_assert(ncclkit::nccl::nccl_type_v<std::uint8_t> == ncclUint8);
static_assert(ncclkit::nccl::nccl_type_v<std::int32_t> == ncclInt32);
static_assert(ncclkit::nccl::nccl_type_v<std::int64_t> == ncclInt64);
static_assert(ncclkit::nccl::nccl_type_v<const float> == ncclFloat32);
static_assert(ncclkit::nccl::to_nccl(ReduceOp::kAvg) == ncclAvg);
static_assert(ncclkit::nccl::to_nccl(ReduceOp::kProd) == ncclProd);

TEST_CASE("rank lists are written as ranges") {
  CHECK(ncclkit::nccl::detail::format_ranks({0, 1, 2, 5, 7, 8}) == "0-2, 5, 7-8");
}

// ---- misuse -----------------------------------------------------------------------------------

/// Runs `call`, expecting a ConfigError whose message contains `needle`.
template <class Call>
void expect_misuse(Checker& checker, const std::string& what, const std::string& needle, Call&& call) {
  try {
    call();
    checker.expect(false, what + ": no error");
  } catch (const ConfigError& e) {
    checker.expect(std::string(e.what()).find(needle) != std::string::npos,
                   what + ": message lacks '" + needle + "': " + e.what());
  } catch (const std::exception& e) {
    checker.expect(false, what + ": wrong exception type: " + e.what());
  }
}

TEST_CASE("init() gives world, store and a working NCCL communicator in one call") {
  if (!have_gpus(2, "init() over NCCL")) return;
  const auto result = ncclkit::spawn(2, [](const WorldInfo& spawned) -> int {
    auto [world, store, comm] = ncclkit::init<Communicator>(spawned, Options{.timeout = std::chrono::seconds(60)});
    Checker checker(world.rank);
    checker.expect(world.rank == spawned.rank && world.world_size == 2 && comm.rank() == world.rank && comm.size() == 2,
                   "init's world and communicator agree with the spawned world");
    checker.expect(store != nullptr, "init returns the store");
    const cudaStream_t s = comm.default_stream();
    const auto input = make_input<float>(11, world.rank, 4099);
    DeviceBuffer<float> buffer(input.size(), comm.device());
    upload(buffer, input, s);
    comm.all_reduce(buffer.data(), buffer.data(), buffer.size(), ReduceOp::kSum, s);
    const auto got = download(comm, buffer, s);
    const auto other = make_input<float>(11, 1 - world.rank, 4099);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < got.size(); ++i) wrong += got[i] != input[i] + other[i];
    checker.expect(wrong == 0, "all_reduce after init: " + std::to_string(wrong) + " wrong elements");
    return checker.finish("init");
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}
TEST_CASE("misuse is reported with a clear error before NCCL sees it") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "misuse"});
    Checker checker(world.rank);
    const int device = comm.device();
    DeviceBuffer<float> a(64, device), b(64, device);
    std::vector<float> host(64, 1.0f);

    expect_misuse(checker, "root out of range", "root 3 is outside [0, 1)",
                  [&] { comm.broadcast(a.data(), b.data(), 64, 3); });
    expect_misuse(checker, "negative root", "root -1 is outside",
                  [&] { comm.reduce(a.data(), b.data(), 64, ReduceOp::kSum, -1); });
    expect_misuse(checker, "peer out of range", "peer 1 is outside", [&] { comm.send(a.data(), 64, 1); });
    expect_misuse(checker, "null input", "null pointer with count 64",
                  [&] { comm.all_reduce(static_cast<const float*>(nullptr), b.data(), 64); });
    expect_misuse(checker, "null output", "null pointer with count 64",
                  [&] { comm.all_reduce(a.data(), static_cast<float*>(nullptr), 64); });
    expect_misuse(checker, "pageable host input", "is host memory",
                  [&] { comm.all_reduce(host.data(), b.data(), 64); });
    float* pinned = nullptr;
    NCCLKIT_CUDA_CHECK(cudaMallocHost(&pinned, 64 * sizeof(float)));
    expect_misuse(checker, "pinned host output", "is host memory", [&] { comm.all_reduce(a.data(), pinned, 64); });
    NCCLKIT_CUDA_CHECK(cudaFreeHost(pinned));
    expect_misuse(checker, "view marked host", "marked as host memory",
                  [&] { comm.all_reduce(TensorView::of(a.data(), 64, MemoryKind::kHost), b.view(), ReduceOp::kSum); });
    expect_misuse(checker, "size mismatch", "sizes do not match", [&] {
      comm.all_reduce(a.view(), TensorView::of(b.data(), 63, MemoryKind::kDevice), ReduceOp::kSum);
    });
    expect_misuse(checker, "all_gather size", "out.count == in.count * size()",
                  [&] { comm.all_gather(TensorView::of(a.data(), 32, MemoryKind::kDevice), b.view()); });
    expect_misuse(checker, "type mismatch", "element types differ", [&] {
      comm.all_reduce(a.view(), TensorView{b.data(), 64, DataType::kInt32, MemoryKind::kDevice}, ReduceOp::kSum);
    });
    expect_misuse(checker, "invalid op", "invalid ReduceOp",
                  [&] { comm.all_reduce(a.data(), b.data(), 64, static_cast<ReduceOp>(42)); });
    expect_misuse(checker, "all_to_all in place", "out of place only",
                  [&] { comm.all_to_all(a.data(), a.data(), 64); });
    expect_misuse(checker, "uneven counts", "one per rank", [&] {
      std::vector<std::size_t> counts{32, 32};
      comm.all_gather_uneven(a.view(), b.view(), counts);
    });

    // The communicator is still usable after misuse.
    upload(a, make_input<float>(1, 0, 64), comm.default_stream());
    comm.all_reduce(a.data(), b.data(), 64, ReduceOp::kSum);
    check_reduction<float>(checker, download(comm, b, comm.default_stream()), 1, 1, 0, ReduceOp::kSum,
                           "all_reduce after misuse");
    checker.expect(!comm.failed(), "misuse does not fail the communicator");

    // Buffers found good are remembered (detail/checked_pointers.hpp), which must not let bad
    // ones through: a host buffer after good calls, in place and out of place, and a buffer
    // freed through ncclkit after it was checked.
    comm.all_reduce(a.data(), a.data(), 64, ReduceOp::kSum);
    expect_misuse(checker, "host input after good calls", "is host memory",
                  [&] { comm.all_reduce(host.data(), a.data(), 64); });
    expect_misuse(checker, "host buffer in place after good calls", "is host memory",
                  [&] { comm.all_reduce(host.data(), host.data(), 64); });
    {
      DeviceBuffer<float> freed(64, device);
      float* address = freed.data();
      comm.all_reduce(address, address, 64, ReduceOp::kSum);  // checked and remembered
      comm.synchronize();
      freed = DeviceBuffer<float>();  // freed through ncclkit: forgotten
      expect_misuse(checker, "buffer freed after it was checked", "device memory already freed",
                    [&] { comm.all_reduce(address, address, 64); });
    }

    // Calls that wait on the host refuse an open group and a capturing stream, leaving the
    // group and the capture usable.
    {
      GroupGuard group;
      comm.all_reduce(a.data(), a.data(), 64, ReduceOp::kSum);
      expect_misuse(checker, "barrier inside a group", "inside an open GroupGuard", [&] { comm.barrier(); });
      group.end();
      comm.synchronize();
    }
    {
      ncclkit::nccl::Stream capture_stream(device);
      comm.all_reduce(a.data(), a.data(), 64, ReduceOp::kSum, capture_stream);  // NCCL connects eagerly first
      comm.synchronize(capture_stream);
      NCCLKIT_CUDA_CHECK(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeRelaxed));
      expect_misuse(checker, "synchronize while capturing", "capturing a CUDA graph",
                    [&] { comm.synchronize(capture_stream); });
      expect_misuse(checker, "barrier while capturing", "capturing a CUDA graph",
                    [&] { comm.barrier(capture_stream); });
      comm.all_reduce(a.data(), a.data(), 64, ReduceOp::kSum, capture_stream);
      cudaGraph_t graph = nullptr;
      const cudaError_t ended = cudaStreamEndCapture(capture_stream, &graph);
      checker.expect(ended == cudaSuccess, std::string("the capture survives the refused calls: ") +
                                               ncclkit::nccl::describe_cuda_error(ended));
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
    }
    // A timeout too long for deadlines to hold (now + timeout would overflow).
    expect_misuse(checker, "timeout of milliseconds::max()", "is too long", [&] {
      Communicator forever(store, world, Options{.timeout = std::chrono::milliseconds::max(), .name = "forever"});
    });

    // Moved-from communicators say so.
    Communicator moved = std::move(comm);
    expect_misuse(checker, "use after move", "moved from", [&] { (void)comm.rank(); });
    checker.expect(moved.rank() == 0, "the moved-to communicator works");

    // The pointer checks can be switched off, by option or by environment; the environment
    // overrides the field (core/knobs.hpp), as the communicator resolves its options.
    checker.expect(!Options{.check_pointers = false}.check_pointers, "option turns checks off");
    checker.expect(Options{}.check_pointers, "checks are on by default");
    ::setenv("NCCLKIT_CHECK_POINTERS", "0", 1);
    {
      Communicator unchecked(store, world, Options{.timeout = std::chrono::seconds(60), .name = "env-unchecked"});
      checker.expect(!unchecked.options().check_pointers, "NCCLKIT_CHECK_POINTERS=0 turns checks off");
    }
    ::unsetenv("NCCLKIT_CHECK_POINTERS");
    return checker.finish("misuse");
  });
}

TEST_CASE("with the pointer checks off, a pinned host buffer reaches NCCL") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Communicator comm(store, world,
                      Options{.timeout = std::chrono::seconds(60), .name = "unchecked", .check_pointers = false});
    Checker checker(world.rank);
    DeviceBuffer<float> a(64, comm.device());
    upload(a, make_input<float>(3, 0, 64), comm.default_stream());
    float* pinned = nullptr;
    NCCLKIT_CUDA_CHECK(cudaMallocHost(&pinned, 64 * sizeof(float)));
    // Checked, this is a ConfigError (the misuse test). Unchecked, ncclkit passes it on: pinned
    // memory is mapped into the GPU's address space, so NCCL either moves the data through
    // it or refuses it itself (NcclError), but ncclkit says nothing.
    try {
      comm.all_reduce(a.data(), pinned, 64, ReduceOp::kSum);
      comm.synchronize();
      std::vector<float> got(pinned, pinned + 64);
      check_reduction<float>(checker, got, 3, 1, 0, ReduceOp::kSum, "all_reduce into pinned host memory, unchecked");
    } catch (const ConfigError& e) {
      checker.expect(false, std::string("the switched-off check still refused the buffer: ") + e.what());
    } catch (const ncclkit::NcclError& e) {
      std::printf("NCCL itself refused pinned host memory (fine: ncclkit passed it on): %s\n", e.what());
    }
    NCCLKIT_CUDA_CHECK(cudaFreeHost(pinned));
    return checker.finish("unchecked");
  });
}

TEST_CASE("a failed communicator in a group fails alone, after the group's launch") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator healthy(store, world, Options{.timeout = std::chrono::seconds(30), .name = "healthy"});
      Communicator doomed(store, world, Options{.timeout = std::chrono::seconds(30), .name = "doomed"});
      const std::size_t count = 4096;
      DeviceBuffer<float> a(count, healthy.device()), b(count, doomed.device());
      upload(a, make_input<float>(21, world.rank, count), healthy.default_stream());
      upload(b, make_input<float>(22, world.rank, count), doomed.default_stream());
      bool threw = false;
      try {
        GroupGuard group;
        healthy.all_reduce(a.data(), a.data(), count, ReduceOp::kSum);
        doomed.all_reduce(b.data(), b.data(), count, ReduceOp::kSum);
        // Queued ops hold the abort back until the group's end has launched them; before the
        // fix the watchdog aborted after 2 s and ncclGroupEnd then used the freed handle.
        doomed.abort("the test aborts it inside an open group");
        std::this_thread::sleep_for(std::chrono::milliseconds(2500));
        checker.expect(doomed.failed(), "doomed is failed at once");
        checker.expect(!doomed.failure_report(), "its abort waits for the group's end");
        group.end();
      } catch (const ncclkit::CommError& e) {
        threw = true;
        checker.expect(std::string(e.what()).find("doomed") != std::string::npos,
                       std::string("the group's end names the failed member: ") + e.what());
      }
      checker.expect(threw, "the group's end throws CommError for the failed member");
      checker.expect(doomed.failure_report().has_value(), "the failed member's report is written after the end");
      checker.expect(!healthy.failed(), "the healthy member of the group is not failed with it");
      check_reduction<float>(checker, download(healthy, a, healthy.default_stream()), 21, world.world_size, 0,
                             ReduceOp::kSum, "the healthy member's grouped all_reduce");
      healthy.barrier();
      return checker.finish("group with a failed member");
    });
  }
}

TEST_CASE("barrier returns only once every rank has called it") {
  for (int n : world_sizes()) {
    if (n < 2) continue;
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "barrier"});
      const int late = comm.size() - 1;
      constexpr auto kLate = std::chrono::milliseconds(1500);
      comm.barrier();  // lines the ranks up (within milliseconds)
      if (comm.rank() == late) std::this_thread::sleep_for(kLate);
      const auto start = std::chrono::steady_clock::now();
      comm.barrier();
      const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (comm.rank() == late) {
        checker.expect(took < 1.0, "the last rank to arrive is not held (took " + std::to_string(took) + " s)");
      } else {
        // 1.5 s late, less what the first barrier's exits may differ by (far under 0.3 s).
        checker.expect(took > 1.2, "rank " + std::to_string(comm.rank()) + " waited " + std::to_string(took) +
                                       " s for a rank 1.5 s late");
      }
      return checker.finish("barrier waits");
    });
  }
}

TEST_CASE("buffers and streams of another GPU are refused") {
  if (!have_gpus(2, "the wrong-device check")) return;
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Communicator comm(store, world, Options{.device = 0, .timeout = std::chrono::seconds(60), .name = "devices"});
    Checker checker(world.rank);
    DeviceBuffer<float> mine(64, 0), other(64, 1);
    expect_misuse(checker, "buffer of GPU 1", "is memory of GPU 1",
                  [&] { comm.all_reduce(mine.data(), other.data(), 64); });
    ncclkit::nccl::Stream stream_of_1(1);
    expect_misuse(checker, "stream of GPU 1", "the stream belongs to GPU 1",
                  [&] { comm.all_reduce(mine.data(), mine.data(), 64, ReduceOp::kSum, stream_of_1); });
    // A caller's stream found good is remembered (detail/checked_pointers.hpp). That must not
    // let another GPU's stream through, not even one that got the handle of a remembered
    // stream destroyed through ncclkit, nor the handles that name the current device's stream
    // (per-thread and legacy), which are asked every call.
    {
      std::optional<ncclkit::nccl::Stream> stream_of_0(std::in_place, 0);
      const cudaStream_t remembered = stream_of_0->get();
      for (int i = 0; i < 3; ++i) comm.all_reduce(mine.data(), mine.data(), 64, ReduceOp::kSum, *stream_of_0);
      comm.synchronize(*stream_of_0);
      expect_misuse(checker, "stream of GPU 1 after a remembered one", "the stream belongs to GPU 1",
                    [&] { comm.all_reduce(mine.data(), mine.data(), 64, ReduceOp::kSum, stream_of_1); });
      stream_of_0.reset();
      ncclkit::nccl::Stream new_of_1(1);
      std::printf("a new stream of GPU 1 %s the handle of the destroyed stream of GPU 0\n",
                  new_of_1.get() == remembered ? "got" : "did not get");
      std::fflush(stdout);
      expect_misuse(checker, "new stream of GPU 1 after a remembered one was destroyed", "the stream belongs to GPU 1",
                    [&] { comm.all_reduce(mine.data(), mine.data(), 64, ReduceOp::kSum, new_of_1); });
      for (const cudaStream_t special : {cudaStreamPerThread, cudaStream_t{nullptr}}) {
        {
          ncclkit::nccl::DeviceGuard on_0(0);
          comm.all_reduce(mine.data(), mine.data(), 64, ReduceOp::kSum, special);
          comm.synchronize(special);
        }
        ncclkit::nccl::DeviceGuard on_1(1);
        expect_misuse(
            checker,
            special == nullptr ? "legacy stream while GPU 1 is current" : "per-thread stream while GPU 1 is current",
            special == nullptr ? "the null stream is the current device's"
                               : "the per-thread default stream is the current device's",
            [&] { comm.all_reduce(mine.data(), mine.data(), 64, ReduceOp::kSum, special); });
      }
    }
    return checker.finish("wrong device");
  });
}

// ---- init ----------------------------------------------------------------------------------------

TEST_CASE("init is bounded: a rank that never reaches NCCL init is named") {
  run_workers(2, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Checker checker(world.rank);
    const auto timeout = std::chrono::seconds(3);
    if (world.rank == 1) {
      // Take part in the store rendezvous (so rank 0 gets its id) but never call NCCL.
      const std::string base = "ncclkit/nccl/stuck";
      const auto index = store->add(base + "/instances/1", 1);
      ncclkit::PrefixStore scope(base + "/" + std::to_string(index), store);
      (void)ncclkit::nccl::detail::init_rendezvous(
          scope, 1, 2, ncclkit::nccl::version_text(), timeout, [] { return ncclkit::Bytes(); }, "stuck");
      store->wait({"test/rank0-done"}, std::chrono::seconds(60));
      return checker.finish("init timeout (idle rank)");
    }
    const auto start = std::chrono::steady_clock::now();
    try {
      Communicator comm(store, world, Options{.timeout = timeout, .name = "stuck"});
      checker.expect(false, "init with an absent rank succeeded");
    } catch (const ncclkit::TimeoutError& e) {
      const std::string message = e.what();
      checker.expect(message.find("never reached NCCL init: 1") != std::string::npos, "names rank 1: " + message);
    }
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    checker.expect(waited < 3.0 + 5.0, "init gave up within timeout + 5 s (took " + std::to_string(waited) + " s)");
    store->set("test/rank0-done", "1");
    return checker.finish("init timeout");
  });
}

TEST_CASE("several communicators on one store, concurrently and one after another, never mix") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      for (int round = 0; round < 2; ++round) {
        Communicator first(store, world, Options{.timeout = std::chrono::seconds(60), .name = "same"});
        Communicator second(store, world, Options{.timeout = std::chrono::seconds(60), .name = "same"});
        const std::size_t count = 1000;
        DeviceBuffer<std::int64_t> a(count, first.device()), b(count, second.device());
        upload(a, make_input<std::int64_t>(21 + round, world.rank, count), first.default_stream());
        upload(b, make_input<std::int64_t>(31 + round, world.rank, count), second.default_stream());
        second.all_reduce(b.data(), b.data(), count, ReduceOp::kSum);
        first.all_reduce(a.data(), a.data(), count, ReduceOp::kSum);
        check_reduction<std::int64_t>(checker, download(first, a, first.default_stream()), 21 + round, world.world_size,
                                      0, ReduceOp::kSum, "first communicator, round " + std::to_string(round));
        check_reduction<std::int64_t>(checker, download(second, b, second.default_stream()), 31 + round,
                                      world.world_size, 0, ReduceOp::kSum,
                                      "second communicator, round " + std::to_string(round));
      }
      return checker.finish("several communicators");
    });
  }
}

// ---- split ---------------------------------------------------------------------------------------

TEST_CASE("split makes sub-communicators ordered by key; a negative color opts out") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "parent"});
      Checker checker(world.rank);
      const int n = comm.size(), r = comm.rank();
      // On 4 GPUs rank 3 opts out; the others split by parity, in reverse rank order.
      const bool out = n == 4 && r == 3;
      const int color = out ? -1 : r % 2;
      auto child = comm.split(color, n - r);
      if (out) {
        checker.expect(!child.has_value(), "negative color gets no communicator");
        comm.barrier();  // the parent is still everyone's
        return checker.finish("split");
      }
      std::vector<int> members;
      for (int j = n - 1; j >= 0; --j)
        if (!(n == 4 && j == 3) && j % 2 == color) members.push_back(j);
      int expected_rank = 0;
      for (std::size_t i = 0; i < members.size(); ++i)
        if (members[i] == r) expected_rank = static_cast<int>(i);
      checker.expect(child.has_value() && child->size() == static_cast<int>(members.size()),
                     "child size " + std::to_string(child ? child->size() : -1));
      checker.expect(child && child->rank() == expected_rank, "child rank follows key (reverse order)");
      checker.expect(child && child->device() == comm.device(), "child on the parent's GPU");
      if (child) {
        // Sum over the members of their parent ranks.
        DeviceBuffer<std::int32_t> value(1, comm.device());
        upload(value, std::vector<std::int32_t>{r}, child->default_stream());
        child->all_reduce(value.data(), value.data(), 1, ReduceOp::kSum);
        std::int32_t sum = 0;
        for (int m : members) sum += m;
        checker.expect(download(*child, value, child->default_stream())[0] == sum, "all_reduce in the child");
      }
      // The parent still works alongside.
      comm.barrier();
      return checker.finish("split");
    });
  }
}

// ---- CUDA graphs -----------------------------------------------------------------------------------

/// One capture in `mode` on a fresh communicator: warm up eagerly, capture all_reduce + scale +
/// all_gather, replay three times with fresh inputs. Returns "" when every replay was right,
/// else what went wrong.
std::string capture_round(const WorldInfo& world, const std::shared_ptr<Store>& store, cudaStreamCaptureMode mode,
                          const std::string& mode_name, Checker& checker) {
  Communicator comm(store, world, Options{.timeout = std::chrono::seconds(20), .name = "graph-" + mode_name});
  const int n = comm.size(), r = comm.rank();
  const std::size_t count = 65537;
  DeviceBuffer<float> in(count, comm.device()), out(count, comm.device()), gathered(count * n, comm.device());
  ncclkit::nccl::Stream capture_stream(comm.device());
  // Warm up eagerly (NCCL connects lazily; connection setup must not happen inside capture).
  comm.all_reduce(in.data(), out.data(), count, ReduceOp::kSum, capture_stream);
  comm.all_gather(out.data(), gathered.data(), count, capture_stream);
  comm.synchronize(capture_stream);
  const auto issued_before = comm.issued_sequence();

  cudaGraph_t graph = nullptr;
  NCCLKIT_CUDA_CHECK(cudaStreamBeginCapture(capture_stream, mode));
  try {
    comm.all_reduce(in.data(), out.data(), count, ReduceOp::kSum, capture_stream);
    comm.scale(out.view(), 0.5, capture_stream);
    comm.all_gather(out.data(), gathered.data(), count, capture_stream);
  } catch (const std::exception& e) {
    (void)cudaStreamEndCapture(capture_stream, &graph);
    (void)cudaGetLastError();
    if (graph != nullptr) (void)cudaGraphDestroy(graph);
    return std::string("capture failed: ") + e.what();
  }
  const cudaError_t ended = cudaStreamEndCapture(capture_stream, &graph);
  if (ended != cudaSuccess) {
    (void)cudaGetLastError();
    return "cudaStreamEndCapture: " + ncclkit::nccl::describe_cuda_error(ended);
  }
  cudaGraphExec_t exec = nullptr;
  NCCLKIT_CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
  Checker local(r);
  local.expect(comm.issued_sequence() == issued_before, "captured collectives take no sequence numbers");
  for (int replay = 0; replay < 3; ++replay) {
    const std::uint64_t seed = 500 + static_cast<std::uint64_t>(replay);
    upload(in, make_input<float>(seed, r, count), capture_stream);
    gathered.fill_bytes(0xFF, capture_stream);
    NCCLKIT_CUDA_CHECK(cudaGraphLaunch(exec, capture_stream));
    const auto got = download(comm, gathered, capture_stream);
    // Every slice of `gathered` is half the sum.
    for (int j = 0; j < n; ++j) {
      std::vector<float> slice(got.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(j) * count),
                               got.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(j + 1) * count));
      for (auto& v : slice) v *= 2.0f;
      check_reduction<float>(local, slice, seed, n, 0, ReduceOp::kSum,
                             mode_name + " graph replay " + std::to_string(replay) + " slice " + std::to_string(j));
    }
  }
  NCCLKIT_CUDA_CHECK(cudaGraphExecDestroy(exec));
  NCCLKIT_CUDA_CHECK(cudaGraphDestroy(graph));
  // Eager collectives still work and are watched again.
  comm.barrier();
  local.expect(comm.issued_sequence() == issued_before + 1, "eager collectives after capture take sequence numbers");
  (void)checker;
  return local.failures() == 0 ? "" : std::to_string(local.failures()) + " replay checks failed";
}

/// Captures one all_reduce issued by `issue` on a fresh stream in relaxed mode after an eager
/// warm-up, replays it, and says what happened ("" when the replay was right).
template <class Issue>
std::string probe_capture(int device, Issue&& issue) {
  const std::size_t count = 4097;
  DeviceBuffer<float> in(count, device), out(count, device);
  ncclkit::nccl::Stream stream(device);
  ncclkit::nccl::DeviceGuard guard(device);
  const auto input = make_input<float>(3, 0, count);
  upload(in, input, stream);
  issue(in.data(), out.data(), count, stream.get());  // eager warm-up
  if (cudaStreamSynchronize(stream) != cudaSuccess) return "eager call failed";
  cudaGraph_t graph = nullptr;
  NCCLKIT_CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
  std::string error;
  try {
    issue(in.data(), out.data(), count, stream.get());
  } catch (const std::exception& e) {
    error = e.what();
  }
  const cudaError_t ended = cudaStreamEndCapture(stream, &graph);
  (void)cudaGetLastError();
  if (!error.empty()) return "issue failed: " + error.substr(0, 200);
  if (ended != cudaSuccess) return "cudaStreamEndCapture: " + ncclkit::nccl::describe_cuda_error(ended);
  cudaGraphExec_t exec = nullptr;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return "instantiate failed";
  out.fill_bytes(0xFF, stream);
  if (cudaGraphLaunch(exec, stream) != cudaSuccess || cudaStreamSynchronize(stream) != cudaSuccess)
    return "replay failed";
  std::vector<float> got(count);
  NCCLKIT_CUDA_CHECK(cudaMemcpy(got.data(), out.data(), count * sizeof(float), cudaMemcpyDeviceToHost));
  (void)cudaGraphExecDestroy(exec);
  (void)cudaGraphDestroy(graph);
  return got == input ? "" : "replay gave wrong values";
}

TEST_CASE("the issue path's driver calls answer as the runtime's do") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>&) {
    Checker checker(world.rank);
    using ncclkit::nccl::detail::record_event;
    using ncclkit::nccl::detail::stream_is_capturing;
    NCCLKIT_CUDA_CHECK(cudaSetDevice(0));
    const auto& calls = ncclkit::nccl::detail::driver_calls();
    std::printf("INFO driver entry points: cuEventRecord %s, cuStreamIsCapturing %s\n",
                calls.event_record != nullptr ? "found" : "missing",
                calls.stream_is_capturing != nullptr ? "found" : "missing");
#if CUDART_VERSION >= 12050  // below, the runtime's calls are used by design
    checker.expect(calls.event_record != nullptr && calls.stream_is_capturing != nullptr,
                   "CUDA 12.5 or later and its driver provide both entry points");
#endif
    ncclkit::nccl::Stream stream(0);
    ncclkit::nccl::Event event(0);
    DeviceBuffer<float> buffer(1 << 20, 0);
    // A real stream (the driver's path) and the default-stream handles (the runtime's).
    for (cudaStream_t s : {stream.get(), static_cast<cudaStream_t>(nullptr), cudaStreamLegacy, cudaStreamPerThread}) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
      checker.expect(stream_is_capturing(s, &status) == cudaSuccess && status == cudaStreamCaptureStatusNone,
                     "a stream that is not capturing is reported as such");
      buffer.fill_bytes(0, s);
      checker.expect(record_event(event.get(), s) == cudaSuccess, "record_event on a stream");
      checker.expect(cudaEventSynchronize(event.get()) == cudaSuccess && cudaEventQuery(event.get()) == cudaSuccess,
                     "the recorded event completes");
    }
    // Capturing: the driver's answer is the runtime's, in every mode of the capturing thread.
    for (auto mode : {cudaStreamCaptureModeRelaxed, cudaStreamCaptureModeThreadLocal, cudaStreamCaptureModeGlobal}) {
      NCCLKIT_CUDA_CHECK(cudaStreamBeginCapture(stream.get(), mode));
      buffer.fill_bytes(1, stream.get());
      cudaStreamCaptureStatus ours = cudaStreamCaptureStatusNone, theirs = cudaStreamCaptureStatusNone;
      const cudaError_t ours_status = stream_is_capturing(stream.get(), &ours);
      const cudaError_t theirs_status = cudaStreamIsCapturing(stream.get(), &theirs);
      checker.expect(ours_status == cudaSuccess && theirs_status == cudaSuccess &&
                         ours == cudaStreamCaptureStatusActive && theirs == ours,
                     "a capturing stream is reported as capturing, as the runtime reports it");
      cudaGraph_t graph = nullptr;
      checker.expect(cudaStreamEndCapture(stream.get(), &graph) == cudaSuccess && graph != nullptr,
                     "the queries left the capture valid");
      if (graph != nullptr) (void)cudaGraphDestroy(graph);
    }
    // One thread driving several GPUs: a stream of GPU 1 while GPU 0 is current. Its own
    // event records; an event of GPU 0 is refused with the runtime's error.
    if (ncclkit::nccl::visible_device_count() >= 2) {
      ncclkit::nccl::Stream other(1);
      ncclkit::nccl::Event event_of_1(1);
      cudaStreamCaptureStatus capture = cudaStreamCaptureStatusActive;
      checker.expect(
          stream_is_capturing(other.get(), &capture) == cudaSuccess && capture == cudaStreamCaptureStatusNone,
          "GPU 1's stream, queried with GPU 0 current, is not capturing");
      checker.expect(record_event(event_of_1.get(), other.get()) == cudaSuccess &&
                         cudaEventSynchronize(event_of_1.get()) == cudaSuccess,
                     "GPU 1's event records on GPU 1's stream with GPU 0 current, and completes");
      const cudaError_t status = record_event(event.get(), other.get());
      checker.expect(status != cudaSuccess, "an event recorded on another GPU's stream is refused");
      std::printf("INFO record_event across GPUs: %s\n", cudaGetErrorName(status));
      (void)cudaGetLastError();
    }
    return checker.finish("driver calls");
  });
}

// ncclkit's all_reduce, and NCCL's own call on ncclkit's native() handle, must capture and
// replay (docs/collectives.md promises capture); what a plain blocking NCCL communicator does
// is NCCL's behaviour, reported beside them so that a failure of ours can be told from one of
// NCCL's.
TEST_CASE("graph capture probe: ncclkit and its native() handle capture and replay on 1 GPU; plain NCCL reported") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Checker checker(world.rank);
    const int device = 0;
    auto report = [](const char* what, const std::string& result) {
      std::printf("INFO capture probe, %s: %s\n", what, result.empty() ? "works" : result.c_str());
      std::fflush(stdout);
    };
    {
      ncclComm_t plain = nullptr;
      NCCLKIT_NCCL_CHECK(ncclCommInitAll(&plain, 1, &device));
      report("plain blocking NCCL communicator (ncclCommInitAll)",
             probe_capture(device, [&](float* in, float* out, std::size_t n, cudaStream_t st) {
               NCCLKIT_NCCL_CHECK(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, plain, st));
             }));
      (void)ncclCommDestroy(plain);
    }
    {
      Communicator comm(store, world,
                        Options{.device = device, .timeout = std::chrono::seconds(20), .name = "probe-native"});
      const std::string result = probe_capture(device, [&](float* in, float* out, std::size_t n, cudaStream_t st) {
        NCCLKIT_NCCL_CHECK(ncclAllReduce(in, out, n, ncclFloat32, ncclSum, comm.native(), st));
      });
      report("ncclAllReduce on ncclkit's native() handle", result);
      checker.expect(result.empty(), "ncclAllReduce on ncclkit's native() handle captures and replays: " + result);
    }
    {
      Communicator comm(store, world,
                        Options{.device = device, .timeout = std::chrono::seconds(20), .name = "probe-ncclkit"});
      const std::string result = probe_capture(device, [&](float* in, float* out, std::size_t n, cudaStream_t st) {
        comm.all_reduce(in, out, n, ReduceOp::kSum, st);
      });
      report("ncclkit all_reduce", result);
      checker.expect(result.empty(), "ncclkit's all_reduce captures and replays: " + result);
      checker.expect(!comm.failed(), "the communicator is still usable after the capture");
    }
    return checker.finish("capture probe");
  });
}

TEST_CASE("collectives captured in a CUDA graph replay with fresh inputs") {
  const auto sizes = world_sizes();
  if (sizes.empty()) return;
  run_workers(sizes.back(), [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Checker checker(world.rank);
    // Relaxed capture must work. Thread-local and global capture modes are reported, not
    // required: whether NCCL can set up what a captured collective needs (it registers buffers
    // for graphs) under those modes depends on the NCCL version.
    const std::string relaxed = capture_round(world, store, cudaStreamCaptureModeRelaxed, "relaxed", checker);
    checker.expect(relaxed.empty(), "capture in relaxed mode: " + relaxed);
    for (auto [mode, name] : {std::pair{cudaStreamCaptureModeThreadLocal, "thread_local"},
                              std::pair{cudaStreamCaptureModeGlobal, "global"}}) {
      std::string result;
      try {
        result = capture_round(world, store, mode, name, checker);
      } catch (const std::exception& e) {
        result = e.what();
      }
      std::printf("INFO rank %d: capture in %s mode: %s\n", world.rank, name,
                  result.empty() ? "works (3 replays correct)" : result.substr(0, 300).c_str());
    }
    return checker.finish("graph capture");
  });
}

// ---- options -------------------------------------------------------------------------------------

/// Makes NCCL log its INFO lines of `subsystems` to `path`. Call before NCCL's first log line
/// in the process: NCCL reads these variables once. The workers are forked from a test process
/// that never calls NCCL, so each starts with NCCL's logging not yet set up.
void nccl_log_to(const std::string& path, const char* subsystems) {
  ::setenv("NCCL_DEBUG", "INFO", 1);
  ::setenv("NCCL_DEBUG_SUBSYS", subsystems, 1);
  ::setenv("NCCL_DEBUG_FILE", path.c_str(), 1);
}

/// The lines of NCCL's log at `path` that contain `key`. NCCL writes the file line-buffered,
/// so lines of calls that have returned are there.
std::vector<std::string> log_lines(const std::string& path, const std::string& key) {
  std::vector<std::string> lines;
  std::FILE* file = std::fopen(path.c_str(), "r");
  if (file == nullptr) return lines;
  char buffer[2048];
  while (std::fgets(buffer, sizeof buffer, file) != nullptr) {
    std::string line(buffer);
    if (line.find(key) == std::string::npos) continue;
    while (!line.empty() && line.back() == '\n') line.pop_back();
    lines.push_back(line);
  }
  std::fclose(file);
  return lines;
}

/// The highest channel index a tuning line names ("channel{Lo..Hi}={lo..hi}"); -1 if none.
int highest_channel(const std::string& line) {
  const std::string key = "channel{Lo..Hi}={";
  const auto at = line.find(key);
  if (at == std::string::npos) return -1;
  const auto dots = line.find("..", at + key.size());
  if (dots == std::string::npos) return -1;
  return std::atoi(line.c_str() + dots + 2);
}

TEST_CASE("options reach NCCL and CUDA: CTAs, CGA, network, name, priority, user stream") {
  // NCCL's log shows what it took: its ENV lines name each config field it was given, and its
  // TUNING lines (rank 0, one per collective) the channels a collective runs on, at most
  // max_ctas. (NCCL 2.28 logs no effect of the CGA cluster size.)
  ncclkit_test::TempDir logs("nccl-log");
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [&logs](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      const std::string log_path =
          logs.path + "/options." + std::to_string(world.world_size) + "." + std::to_string(world.rank) + ".log";
      nccl_log_to(log_path, "TUNING,ENV");
      Checker checker(world.rank);
      int device = world.local_rank % ncclkit::nccl::visible_device_count();
      ncclkit::nccl::Stream user_stream(device);
      Communicator comm(store, world,
                        Options{.timeout = std::chrono::seconds(60),
                                .cga_cluster_size = 2,
                                .min_ctas = 2,
                                .max_ctas = 2,
                                .net_name = "Socket",
                                .stream_priority = -1,
                                .name = "tuned",
                                .stream = user_stream.get()});
      checker.expect(comm.name() == "tuned", "name");
      checker.expect(comm.default_stream() == user_stream.get(), "Options::stream is the default stream");
      int least = 0, greatest = 0;
      NCCLKIT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
      int priority = 0;
      NCCLKIT_CUDA_CHECK(cudaStreamGetPriority(comm.comm_stream(), &priority));
      checker.expect(priority == std::max(-1, greatest), "comm stream priority " + std::to_string(priority));
      for (const char* line : {"Comm config CGA cluster size set to 2", "Comm config Min CTAs set to 2",
                               "Comm config Max CTAs set to 2", "Comm config Net name set to Socket"}) {
        checker.expect(!log_lines(log_path, line).empty(),
                       std::string("NCCL logs \"") + line + "\" (" + log_path + ")");
      }
      // 4 MiB on the tuned communicator, 16 MiB on a default one: the sizes tell their lines apart.
      const std::size_t count = 1 << 20, plain_count = 1 << 22;
      DeviceBuffer<float> a(count, device);
      upload(a, make_input<float>(41, world.rank, count), comm.default_stream());
      comm.all_reduce(a.data(), a.data(), count, ReduceOp::kSum);
      check_reduction<float>(checker, download(comm, a, comm.default_stream()), 41, world.world_size, 0, ReduceOp::kSum,
                             "all_reduce with max 2 CTAs");

      Communicator plain(store, world, Options{.timeout = std::chrono::seconds(60), .name = "plain"});
      NCCLKIT_CUDA_CHECK(cudaStreamGetPriority(plain.comm_stream(), &priority));
      checker.expect(priority == greatest && plain.options().stream_priority == greatest,
                     "by default the comm stream has the GPU's highest priority, " + std::to_string(greatest) +
                         ": it has " + std::to_string(priority) + ", options() says " +
                         std::to_string(plain.options().stream_priority));
      DeviceBuffer<float> b(plain_count, device);
      upload(b, make_input<float>(42, world.rank, plain_count), plain.default_stream());
      plain.all_reduce(b.data(), b.data(), plain_count, ReduceOp::kSum);
      check_reduction<float>(checker, download(plain, b, plain.default_stream()), 42, world.world_size, 0,
                             ReduceOp::kSum, "all_reduce with NCCL's defaults");

      // One rank runs no NCCL kernel (and logs no tuning line).
      if (world.rank == 0 && world.world_size > 1) {
        const auto tuned_lines =
            log_lines(log_path, "AllReduce: " + std::to_string(count * sizeof(float)) + " Bytes -> ");
        const auto plain_lines =
            log_lines(log_path, "AllReduce: " + std::to_string(plain_count * sizeof(float)) + " Bytes -> ");
        for (const auto& line : tuned_lines) std::printf("INFO tuned (max 2 CTAs): %s\n", line.c_str());
        for (const auto& line : plain_lines) std::printf("INFO default: %s\n", line.c_str());
        if (checker.expect(!tuned_lines.empty() && !plain_lines.empty(),
                           "NCCL's TUNING log in " + log_path + " has both all_reduce lines")) {
          const int tuned_high = highest_channel(tuned_lines.front());
          const int plain_high = highest_channel(plain_lines.front());
          checker.expect(tuned_high >= 0 && tuned_high <= 1,
                         "max_ctas = 2: channels up to " + std::to_string(tuned_high));
          checker.expect(plain_high > 1, "NCCL's default uses more than 2 channels: up to " +
                                             std::to_string(plain_high) + " (else the max_ctas check shows nothing)");
        }
      }
      return checker.finish("options");
    });
  }
}

TEST_CASE("min_ctas alone makes a working communicator; an unknown net_name fails init, naming it") {
  ncclkit_test::TempDir logs("nccl-log");
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [&logs](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      const std::string log_path =
          logs.path + "/min-ctas." + std::to_string(world.world_size) + "." + std::to_string(world.rank) + ".log";
      nccl_log_to(log_path, "ENV");
      Checker checker(world.rank);
      const int device = world.local_rank % ncclkit::nccl::visible_device_count();
      {
        // NCCL 2.28 refuses a minimum above an undefined maximum; ncclkit fills the maximum in.
        Communicator comm(store, world,
                          Options{.timeout = std::chrono::seconds(60), .min_ctas = 4, .name = "min-only"});
        const std::size_t count = 4099;
        DeviceBuffer<float> a(count, device);
        upload(a, make_input<float>(43, world.rank, count), comm.default_stream());
        comm.all_reduce(a.data(), a.data(), count, ReduceOp::kSum);
        check_reduction<float>(checker, download(comm, a, comm.default_stream()), 43, world.world_size, 0,
                               ReduceOp::kSum, "all_reduce with min_ctas 4 alone");
      }
      checker.expect(!log_lines(log_path, "Comm config Min CTAs set to 4").empty(),
                     "NCCL took min_ctas 4 (" + log_path + ")");
      // The maximum ncclkit fills in stands for "no limit": NCCL caps it to its channel limit.
      const auto capped = log_lines(log_path, "maxCTAs 1024 is larger than #channels upper limit");
      for (const auto& line : capped) std::printf("INFO rank %d: %s\n", world.rank, line.c_str());
      checker.expect(!capped.empty(), "NCCL caps the filled-in maximum of 1024 CTAs (" + log_path + ")");
      std::string error;
      const auto start = std::chrono::steady_clock::now();
      try {
        Communicator comm(store, world,
                          Options{.timeout = std::chrono::seconds(30), .net_name = "NoSuchNet", .name = "no-net"});
      } catch (const ncclkit::NcclError& e) {
        error = e.what();
      }
      const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      std::printf("INFO rank %d: net_name NoSuchNet after %.1f s: %s\n", world.rank, waited,
                  error.substr(0, 400).c_str());
      checker.expect(error.find("net_name is 'NoSuchNet'") != std::string::npos,
                     "unknown net_name: NcclError naming it");
      return checker.finish("min_ctas and net_name");
    });
  }
}

// ---- single process, several GPUs ----------------------------------------------------------------

TEST_CASE("a single-process group drives 1, 2 and 4 GPUs") {
  const auto sizes = world_sizes();
  for (int n : sizes) {
    CAPTURE(n);
    // In a worker: this test process must not initialise CUDA (other cases fork).
    run_workers(1, [n](const WorldInfo&, const std::shared_ptr<Store>&) {
      Checker checker(0);
      std::vector<int> devices;
      for (int d = 0; d < n; ++d) devices.push_back(d);
      LocalGroup local(devices, Options{.timeout = std::chrono::seconds(60), .name = "local"});
      checker.expect(local.size() == n, "group size");
      const std::size_t count = 300007;
      std::vector<DeviceBuffer<float>> buffers;
      std::vector<DeviceBuffer<float>> gathered;
      std::vector<DeviceBuffer<ncclkit::BFloat16>> halves;
      for (int i = 0; i < n; ++i) {
        ncclkit::nccl::DeviceGuard guard(local[i].device());  // copies and memsets go to member i's streams
        checker.expect(
            local[i].rank() == i && local[i].size() == n && local[i].device() == devices[static_cast<std::size_t>(i)],
            "member " + std::to_string(i) + " identity");
        buffers.emplace_back(count, local[i].device());
        gathered.emplace_back(count * n, local[i].device());
        halves.emplace_back(count, local[i].device());
        upload(buffers.back(), make_input<float>(61, i, count), local[i].default_stream());
        upload(halves.back(), make_input<ncclkit::BFloat16>(62, i, count), local[i].default_stream());
        gathered.back().fill_bytes(0xFF, local[i].default_stream());
      }
      {
        GroupGuard group;
        for (int i = 0; i < n; ++i) {
          local[i].all_reduce(buffers[static_cast<std::size_t>(i)].data(), buffers[static_cast<std::size_t>(i)].data(),
                              count, ReduceOp::kSum);
          local[i].all_reduce(halves[static_cast<std::size_t>(i)].data(), halves[static_cast<std::size_t>(i)].data(),
                              count, ReduceOp::kAvg);
        }
        group.end();
      }
      {
        GroupGuard group;
        for (int i = 0; i < n; ++i)
          local[i].all_gather(buffers[static_cast<std::size_t>(i)].data(), gathered[static_cast<std::size_t>(i)].data(),
                              count);
      }
      for (int i = 0; i < n; ++i) {
        ncclkit::nccl::DeviceGuard guard(local[i].device());
        auto& comm = local[i];
        const auto sum = download(comm, buffers[static_cast<std::size_t>(i)], comm.default_stream());
        check_reduction<float>(checker, sum, 61, n, 0, ReduceOp::kSum, "local all_reduce member " + std::to_string(i));
        check_reduction<ncclkit::BFloat16>(checker,
                                           download(comm, halves[static_cast<std::size_t>(i)], comm.default_stream()),
                                           62, n, 0, ReduceOp::kAvg, "local bf16 avg member " + std::to_string(i));
        const auto all = download(comm, gathered[static_cast<std::size_t>(i)], comm.default_stream());
        for (int j = 0; j < n; ++j) {
          std::vector<float> slice(all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(j) * count),
                                   all.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(j + 1) * count));
          check_equal(checker, slice, sum,
                      "local all_gather member " + std::to_string(i) + " slice " + std::to_string(j));
        }
      }
      // One group per step on one stream (as perf_nccl -g issues them): each member's watchdog
      // folds consecutive steps into one record (Watchdog::track's merge). Then a group whose
      // work spans two streams, which is never folded. Every member must end with all of it
      // known complete, and with the data right.
      {
        constexpr int kSteps = 300;
        std::vector<std::uint64_t> before;
        for (int i = 0; i < n; ++i) before.push_back(local[i].issued_sequence());
        for (int step = 0; step < kSteps; ++step) {
          GroupGuard group;
          for (int i = 0; i < n; ++i)
            local[i].all_reduce(buffers[static_cast<std::size_t>(i)].data(),
                                buffers[static_cast<std::size_t>(i)].data(), 64, ReduceOp::kMax);
        }
        // comm_stream() is not ordered after the default stream: let it catch up first.
        for (int i = 0; i < n; ++i) local[i].wait(local[i].record(local[i].default_stream()), local[i].comm_stream());
        {
          GroupGuard group;
          // Streams alternate (default, comm, default): the per-stream records' seq ranges
          // overlap, and the published progress must still end at the last one.
          for (int i = 0; i < n; ++i) {
            local[i].all_reduce(buffers[static_cast<std::size_t>(i)].data(),
                                buffers[static_cast<std::size_t>(i)].data(), 64, ReduceOp::kMax,
                                local[i].default_stream());
            local[i].all_reduce(halves[static_cast<std::size_t>(i)].data(), halves[static_cast<std::size_t>(i)].data(),
                                64, ReduceOp::kMax, local[i].comm_stream());
            local[i].all_reduce(buffers[static_cast<std::size_t>(i)].data(),
                                buffers[static_cast<std::size_t>(i)].data(), 64, ReduceOp::kMax,
                                local[i].default_stream());
          }
        }
        for (int i = 0; i < n; ++i) {
          auto& comm = local[i];
          comm.synchronize(comm.default_stream());
          comm.synchronize(comm.comm_stream());
          checker.expect(comm.issued_sequence() == before[static_cast<std::size_t>(i)] + kSteps + 3,
                         "member " + std::to_string(i) + " issued " + std::to_string(comm.issued_sequence()) +
                             ", expected " + std::to_string(before[static_cast<std::size_t>(i)] + kSteps + 3));
          // The watchdog retires what completed on its next poll (every timeout / 20 at most).
          const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
          while (comm.completed_sequence() != comm.issued_sequence() && std::chrono::steady_clock::now() < deadline)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
          checker.expect(comm.completed_sequence() == comm.issued_sequence(),
                         "member " + std::to_string(i) + " completed " + std::to_string(comm.completed_sequence()) +
                             " of " + std::to_string(comm.issued_sequence()) + " after synchronize");
        }
        // Max over ranks of the all_reduce sums above is the sum itself: unchanged.
        for (int i = 0; i < n; ++i) {
          ncclkit::nccl::DeviceGuard guard(local[i].device());
          auto& comm = local[i];
          const auto after = download(comm, buffers[static_cast<std::size_t>(i)], comm.default_stream());
          check_reduction<float>(checker, after, 61, n, 0, ReduceOp::kSum,
                                 "local all_reduce member " + std::to_string(i) + " after the max steps");
        }
      }
      return checker.finish("single-process group of " + std::to_string(n));
    });
  }
}

}  // namespace
