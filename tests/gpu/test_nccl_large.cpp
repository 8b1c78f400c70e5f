// 1 GiB collectives: all_reduce (sum) and all_gather of float and bf16 on every visible GPU
// (up to 4), checked element by element against host references (8 host threads per rank):
// all_reduce within each element's rounding bound (tests/support/reduction_bound.hpp),
// all_gather byte for byte.
// ncclkit-test: labels=nccl,slow timeout=900 serial
#include <doctest/doctest.h>

#include <algorithm>  // std::min, std::max
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono
#include <cstring>    // std::memcmp
#include <string>     // std::string
#include <thread>     // std::thread
#include <vector>     // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"

namespace {

using namespace ncclkit_test;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;
using ncclkit::nccl::Options;

constexpr std::size_t kBytes = std::size_t{1} << 30;
constexpr int kThreads = 8;

/// Runs body(begin, end) over [0, count) in kThreads threads.
template <class Body>
void parallel(std::size_t count, Body body) {
  std::vector<std::thread> threads;
  const std::size_t chunk = (count + kThreads - 1) / kThreads;
  for (int t = 0; t < kThreads; ++t) {
    const std::size_t begin = std::min(count, chunk * static_cast<std::size_t>(t));
    const std::size_t end = std::min(count, begin + chunk);
    threads.emplace_back([=] { body(begin, end); });
  }
  for (auto& thread : threads) thread.join();
}

template <class T>
std::vector<T> generate(std::uint64_t seed, int rank, std::size_t count) {
  std::vector<T> values(count);
  parallel(count, [&](std::size_t begin, std::size_t end) {
    for (std::size_t i = begin; i < end; ++i) values[i] = sample<T>(seed, rank, i, ReduceOp::kSum);
  });
  return values;
}

template <class T>
void large_case(Communicator& comm, Checker& checker) {
  const int n = comm.size(), r = comm.rank();
  const cudaStream_t s = comm.default_stream();
  const std::size_t count = kBytes / sizeof(T);
  const std::string type = type_name<T>();
  DeviceBuffer<T> in(count, comm.device()), out(count, comm.device());

  // all_reduce, out of place, 1 GiB.
  {
    upload(in, generate<T>(7, r, count), s);
    out.fill_bytes(poison_byte<T>(), s);
    const auto start = std::chrono::steady_clock::now();
    comm.all_reduce(in.data(), out.data(), count, ReduceOp::kSum);
    comm.synchronize();
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const auto got = download(comm, out, s);
    // Element by element against each element's rounding bound, with the norm-relative error
    // as a second guard, in kThreads chunks (each chunk's norm within tolerance: so is the
    // whole vector's).
    std::vector<BoundCheck> chunks(kThreads);
    std::vector<std::size_t> firsts(kThreads, 0);
    std::atomic<int> slot{0};
    parallel(count, [&](std::size_t begin, std::size_t end) {
      const auto at = static_cast<std::size_t>(slot.fetch_add(1));
      firsts[at] = begin;
      for (std::size_t i = begin; i < end; ++i) {
        const Expected e = expected_at<T>(7, n, i, ReduceOp::kSum);
        const auto exact = static_cast<double>(e.value);
        chunks[at].add(i, as_double(got[i]), exact, reduction_bound<T>(ReduceOp::kSum, n, e.magnitude, exact));
      }
    });
    double relative = 0;
    for (std::size_t t = 0; t < chunks.size(); ++t) {
      relative = std::max(relative, chunks[t].relative_error());
      checker.expect(chunks[t].ok(tolerance<T>()), "1 GiB all_reduce " + type + ", elements from " +
                                                       std::to_string(firsts[t]) + ": " +
                                                       chunks[t].describe(tolerance<T>()));
    }
    std::printf("rank %d: 1 GiB %s all_reduce on %d GPUs: %.1f ms (first call, includes setup), rel. error %.2e\n", r,
                type.c_str(), n, seconds * 1e3, relative);
  }

  // all_gather into 1 GiB: count / n elements per rank.
  {
    const std::size_t per_rank = count / static_cast<std::size_t>(n);
    upload(in, generate<T>(8, r, per_rank), s);
    out.fill_bytes(poison_byte<T>(), s);
    comm.all_gather(in.data(), out.data(), per_rank);
    const auto got = download(comm, out, s, 0, per_rank * static_cast<std::size_t>(n));
    std::atomic<std::size_t> wrong{0};
    parallel(per_rank * static_cast<std::size_t>(n), [&](std::size_t begin, std::size_t end) {
      std::size_t bad = 0;
      for (std::size_t i = begin; i < end; ++i) {
        const T expected = sample<T>(8, static_cast<int>(i / per_rank), i % per_rank, ReduceOp::kSum);
        if (std::memcmp(&got[i], &expected, sizeof(T)) != 0) ++bad;
      }
      wrong += bad;
    });
    checker.expect(wrong == 0, "1 GiB all_gather " + type + ": " + std::to_string(wrong.load()) + " wrong elements");
  }
}

TEST_CASE("1 GiB all_reduce and all_gather of float and bf16") {
  const auto sizes = world_sizes();
  if (sizes.empty()) return;
  run_workers(
      sizes.back(),
      [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
        Communicator comm(store, world, Options{.timeout = std::chrono::seconds(120), .name = "large"});
        Checker checker(world.rank);
        large_case<float>(comm, checker);
        large_case<ncclkit::BFloat16>(comm, checker);
        return checker.finish("1 GiB collectives");
      },
      std::chrono::minutes(10));
}

}  // namespace
