// 1 GiB collectives: all_reduce (sum) and all_gather of float and bf16 on every visible GPU
// (up to 4), checked element by element against host references (8 host threads per rank).
// ncclkit-test: labels=nccl,slow timeout=900 serial
#include <doctest/doctest.h>

#include <algorithm>  // std::min
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono
#include <cmath>      // std::sqrt, std::isnan
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
    std::atomic<std::size_t> nan_count{0};
    std::vector<long double> error(kThreads, 0), norm(kThreads, 0);
    std::atomic<int> slot{0};
    parallel(count, [&](std::size_t begin, std::size_t end) {
      const int me = slot.fetch_add(1);
      long double e = 0, m = 0;
      std::size_t nans = 0;
      for (std::size_t i = begin; i < end; ++i) {
        const long double ref = reference<T>(7, n, i, ReduceOp::kSum);
        const long double value = as_double(got[i]);
        if (std::isnan(static_cast<double>(value))) {
          ++nans;
          continue;
        }
        e += (value - ref) * (value - ref);
        m += ref * ref;
      }
      error[static_cast<std::size_t>(me)] = e;
      norm[static_cast<std::size_t>(me)] = m;
      nan_count += nans;
    });
    long double e = 0, m = 0;
    for (int t = 0; t < kThreads; ++t) e += error[static_cast<std::size_t>(t)], m += norm[static_cast<std::size_t>(t)];
    const double relative = std::sqrt(static_cast<double>(e / m));
    checker.expect(nan_count == 0 && relative <= tolerance<T>(), "1 GiB all_reduce " + type + ": relative error " +
                                                                     std::to_string(relative) + ", " +
                                                                     std::to_string(nan_count.load()) + " unwritten");
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
