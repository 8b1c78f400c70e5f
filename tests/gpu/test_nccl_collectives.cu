// Every collective of nccl::Communicator × element type × reduce op, in and out of place, for
// sizes 0, 1, odd and up to 1 MiB, against host references in higher precision; on 1, 2 and 4
// GPUs (one process per GPU, through spawn), as many as are visible. Outputs are poisoned
// before each call and checked in full.
//
// Run once more with NCCL_P2P_DISABLE=1 NCCL_SHM_DISABLE=1 (scripts/gpu-run.sh does) to go
// through NCCL's network transport, a stand-in for two nodes.
// ncclkit-test: labels=nccl timeout=600
#include <doctest/doctest.h>

#include <cstdint>  // fixed-width integers
#include <numeric>  // std::iota
#include <string>   // std::string
#include <vector>   // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"
#include "ncclkit/nccl/group.hpp"

namespace {

using namespace ncclkit_test;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;
using ncclkit::nccl::GroupGuard;
using ncclkit::nccl::Options;

std::string label(const char* collective, const std::string& type, std::size_t count, const char* detail,
                  bool in_place) {
  return std::string(collective) + " " + type + " count " + std::to_string(count) + " " + detail +
         (in_place ? " in place" : " out of place");
}

/// Reductions: all_reduce, reduce and reduce_scatter for every op.
template <class T>
void check_reductions(Communicator& comm, Checker& checker, std::size_t count, std::uint64_t& seed) {
  const int n = comm.size(), r = comm.rank(), device = comm.device();
  const cudaStream_t s = comm.default_stream();
  const std::string type = type_name<T>();
  const std::size_t total = count * static_cast<std::size_t>(n);
  for (ReduceOp op : kAllOps) {
    ++seed;
    const auto input = make_input<T>(seed, r, count, op);
    DeviceBuffer<T> in(count, device), out(count, device);
    for (bool in_place : {false, true}) {
      upload(in, input, s);
      out.fill_bytes(poison_byte<T>(), s);
      comm.all_reduce(in.data(), in_place ? in.data() : out.data(), count, op);
      check_reduction<T>(checker, download(comm, in_place ? in : out, s), seed, n, 0, op,
                         label("all_reduce", type, count, op_name(op), in_place));
    }
    const int root = static_cast<int>(seed % static_cast<std::uint64_t>(n));
    for (bool in_place : {false, true}) {
      upload(in, input, s);
      out.fill_bytes(poison_byte<T>(), s);
      T* target = in_place ? in.data() : out.data();
      comm.reduce(in.data(), target, count, op, root);
      if (r == root) {
        check_reduction<T>(checker, download(comm, in_place ? in : out, s), seed, n, 0, op,
                           label("reduce", type, count, op_name(op), in_place) + " root " + std::to_string(root));
      } else {
        comm.synchronize(s);
      }
    }
    // reduce_scatter: this rank's input is element range [0, total) of its sample stream;
    // its output is the reduction of range [r * count, (r + 1) * count).
    const auto scatter_input = make_input<T>(seed, r, total, op);
    DeviceBuffer<T> scatter_in(total, device), scatter_out(count, device);
    for (bool in_place : {false, true}) {
      upload(scatter_in, scatter_input, s);
      scatter_out.fill_bytes(poison_byte<T>(), s);
      T* target = in_place ? scatter_in.data() + static_cast<std::size_t>(r) * count : scatter_out.data();
      comm.reduce_scatter(scatter_in.data(), target, count, op);
      const auto got = in_place ? download(comm, scatter_in, s, static_cast<std::size_t>(r) * count, count)
                                : download(comm, scatter_out, s);
      check_reduction<T>(checker, got, seed, n, static_cast<std::size_t>(r) * count, op,
                         label("reduce_scatter", type, count, op_name(op), in_place));
    }
  }
}

/// Data movement: broadcast, all_gather, all_to_all, gather, scatter, send/recv.
template <class T>
void check_movement(Communicator& comm, Checker& checker, std::size_t count, std::uint64_t& seed) {
  const int n = comm.size(), r = comm.rank(), device = comm.device();
  const cudaStream_t s = comm.default_stream();
  const std::string type = type_name<T>();
  const std::size_t total = count * static_cast<std::size_t>(n);
  ++seed;
  const int root = static_cast<int>(seed % static_cast<std::uint64_t>(n));
  // Rank j's contribution of `count` elements, and the concatenation over ranks.
  auto piece = [&](int j) { return make_input<T>(seed, j, count); };
  std::vector<T> all;
  for (int j = 0; j < n; ++j) {
    auto p = piece(j);
    all.insert(all.end(), p.begin(), p.end());
  }

  DeviceBuffer<T> in(count, device), out(count, device);
  for (bool in_place : {false, true}) {
    upload(in, piece(r), s);
    out.fill_bytes(poison_byte<T>(), s);
    if (in_place) {
      if (r != root) in.fill_bytes(poison_byte<T>(), s);
      comm.broadcast(in.data(), count, root);
    } else {
      comm.broadcast(in.data(), out.data(), count, root);
    }
    check_equal(checker, download(comm, in_place ? in : out, s), piece(root),
                label("broadcast", type, count, ("root " + std::to_string(root)).c_str(), in_place));
  }

  DeviceBuffer<T> gathered(total, device);
  for (bool in_place : {false, true}) {
    gathered.fill_bytes(poison_byte<T>(), s);
    upload(in, piece(r), s);
    if (in_place) {
      upload(gathered, piece(r), s, static_cast<std::size_t>(r) * count);
      comm.all_gather(gathered.data() + static_cast<std::size_t>(r) * count, gathered.data(), count);
    } else {
      comm.all_gather(in.data(), gathered.data(), count);
    }
    check_equal(checker, download(comm, gathered, s), all, label("all_gather", type, count, "", in_place));
  }

  // all_to_all: rank r's input is the `total` elements of stream (seed, r); slice j goes to
  // rank j, where it lands as slice r.
  {
    const auto mine = make_input<T>(seed, r, total);
    std::vector<T> expected;
    for (int j = 0; j < n; ++j) {
      const auto theirs = make_input<T>(seed, j, total);
      expected.insert(expected.end(), theirs.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r) * count),
                      theirs.begin() + static_cast<std::ptrdiff_t>(static_cast<std::size_t>(r + 1) * count));
    }
    DeviceBuffer<T> send(total, device), receive(total, device);
    upload(send, mine, s);
    receive.fill_bytes(poison_byte<T>(), s);
    comm.all_to_all(send.data(), receive.data(), count);
    check_equal(checker, download(comm, receive, s), expected, label("all_to_all", type, count, "", false));
  }

  // gather to root, scatter from root.
  for (bool in_place : {false, true}) {
    gathered.fill_bytes(poison_byte<T>(), s);
    upload(in, piece(r), s);
    if (in_place && r == root) {
      upload(gathered, piece(r), s, static_cast<std::size_t>(r) * count);
      comm.gather(gathered.data() + static_cast<std::size_t>(r) * count, gathered.data(), count, root);
    } else {
      comm.gather(in.data(), gathered.data(), count, root);
    }
    if (r == root) {
      check_equal(checker, download(comm, gathered, s), all,
                  label("gather", type, count, ("root " + std::to_string(root)).c_str(), in_place));
    } else {
      comm.synchronize(s);
    }
  }
  for (bool in_place : {false, true}) {
    out.fill_bytes(poison_byte<T>(), s);
    if (r == root) upload(gathered, all, s);
    if (in_place && r == root) {
      comm.scatter(gathered.data(), gathered.data() + static_cast<std::size_t>(r) * count, count, root);
      check_equal(checker, download(comm, gathered, s, static_cast<std::size_t>(r) * count, count), piece(r),
                  label("scatter", type, count, ("root " + std::to_string(root)).c_str(), in_place));
    } else {
      comm.scatter(gathered.data(), out.data(), count, root);
      check_equal(checker, download(comm, out, s), piece(r),
                  label("scatter", type, count, ("root " + std::to_string(root)).c_str(), in_place));
    }
  }

  // send/recv around a ring, in one group so that both directions progress.
  {
    upload(in, piece(r), s);
    out.fill_bytes(poison_byte<T>(), s);
    {
      GroupGuard group;
      comm.send(in.data(), count, (r + 1) % n);
      comm.recv(out.data(), count, (r + n - 1) % n);
      group.end();
    }
    check_equal(checker, download(comm, out, s), piece((r + n - 1) % n), label("send/recv ring", type, count, "", false));
  }
}

int matrix_worker(const WorldInfo& world, const std::shared_ptr<Store>& store) {
  Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "matrix"});
  Checker checker(world.rank);
  std::uint64_t seed = 1000;
  for_each_type([&]<class T>() {
    for (std::size_t count : test_counts<T>()) {
      check_reductions<T>(comm, checker, count, seed);
      check_movement<T>(comm, checker, count, seed);
    }
  });
  checker.expect(comm.completed_seq() <= comm.issued_seq() && comm.issued_seq() > 0,
                 "sequence numbers advance (issued " + std::to_string(comm.issued_seq()) + ")");
  comm.barrier();
  return checker.finish("collective matrix on " + std::to_string(comm.size()) + " GPUs");
}

/// Generic code written against the Backend concept only, as fusion and the trainer use it.
template <ncclkit::Backend B>
void backend_round_trip(B& backend, Checker& checker) {
  const int n = backend.size(), r = backend.rank();
  const std::size_t count = 4099;
  const auto input = make_input<float>(77, r, count);
  auto* device_in = static_cast<float*>(backend.allocate(count * sizeof(float)));
  auto* device_out = static_cast<float*>(backend.allocate(count * n * sizeof(float)));
  auto compute = backend.default_stream();
  auto comm = backend.comm_stream();
  NCCLKIT_CUDA_CHECK(cudaMemcpyAsync(device_in, input.data(), count * sizeof(float), cudaMemcpyHostToDevice, compute));
  NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(compute));
  // Hand over from the compute stream to the comm stream and back, by events.
  backend.scale(ncclkit::TensorView::of(device_in, count, ncclkit::MemoryKind::kDevice), 2.0, compute);
  auto ready = backend.record(compute);
  backend.wait(ready, comm);
  const auto view = ncclkit::TensorView::of(device_in, count, ncclkit::MemoryKind::kDevice);
  backend.all_reduce(view, view, ReduceOp::kSum, comm);
  backend.all_gather(view, ncclkit::TensorView::of(device_out, count * n, ncclkit::MemoryKind::kDevice), comm);
  auto done = backend.record(comm);
  backend.wait(done, compute);
  backend.copy(device_in, device_out + static_cast<std::size_t>(r) * count, count * sizeof(float), compute);
  backend.synchronize(compute);
  std::vector<float> got(count);
  NCCLKIT_CUDA_CHECK(cudaMemcpy(got.data(), device_in, count * sizeof(float), cudaMemcpyDeviceToHost));
  long double error = 0, norm = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const long double ref = 2 * reference<float>(77, n, i, ReduceOp::kSum);
    error += (got[i] - ref) * (got[i] - ref);
    norm += ref * ref;
  }
  checker.expect(std::sqrt(static_cast<double>(error / norm)) < 1e-5, "Backend-generic scale + all_reduce + all_gather + copy");
  backend.deallocate(device_in);
  backend.deallocate(device_out);
}

int api_worker(const WorldInfo& world, const std::shared_ptr<Store>& store) {
  Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "api"});
  Checker checker(world.rank);
  const int n = comm.size(), r = comm.rank(), device = comm.device();
  const cudaStream_t s = comm.default_stream();

  backend_round_trip(comm, checker);

  // std::span overloads.
  {
    const std::size_t count = 513;
    const auto input = make_input<float>(5, r, count);
    DeviceBuffer<float> in(count, device), out(count, device), gathered(count * n, device);
    upload(in, input, s);
    out.fill_bytes(0xFF, s);
    comm.all_reduce(std::span<const float>(in.data(), count), out.span(), ReduceOp::kMax);
    check_reduction<float>(checker, download(comm, out, s), 5, n, 0, ReduceOp::kMax, "all_reduce(span, span)");
    comm.all_reduce(in.span(), ReduceOp::kMin);
    check_reduction<float>(checker, download(comm, in, s), 5, n, 0, ReduceOp::kMin, "all_reduce(span) in place");
    upload(in, input, s);
    comm.all_gather(std::span<const float>(in.data(), count), gathered.span());
    std::vector<float> all;
    for (int j = 0; j < n; ++j) {
      auto p = make_input<float>(5, j, count);
      all.insert(all.end(), p.begin(), p.end());
    }
    check_equal(checker, download(comm, gathered, s), all, "all_gather(span, span)");
    upload(in, input, s);
    comm.broadcast(in.span(), n - 1);
    check_equal(checker, download(comm, in, s), make_input<float>(5, n - 1, count), "broadcast(span)");
  }

  // Uneven all_gather: rank j contributes 3 * j + 1 elements, and (when n > 1) rank 1 none.
  for_each_type([&]<class T>() {
    std::vector<std::size_t> counts(static_cast<std::size_t>(n));
    for (int j = 0; j < n; ++j) counts[static_cast<std::size_t>(j)] = j == 1 ? 0 : 3 * static_cast<std::size_t>(j) + 1001;
    std::size_t total = 0;
    std::vector<T> expected;
    for (int j = 0; j < n; ++j) {
      auto p = make_input<T>(9, j, counts[static_cast<std::size_t>(j)]);
      expected.insert(expected.end(), p.begin(), p.end());
      total += counts[static_cast<std::size_t>(j)];
    }
    const std::size_t mine = counts[static_cast<std::size_t>(r)];
    DeviceBuffer<T> in(mine, device), out(total, device);
    upload(in, make_input<T>(9, r, mine), s);
    out.fill_bytes(poison_byte<T>(), s);
    comm.all_gather_uneven(in.view(), out.view(), counts);
    check_equal(checker, download(comm, out, s), expected, "all_gather_uneven " + type_name<T>());
  });

  // Several collectives fused in one group, on two streams.
  {
    const std::size_t count = 10000;
    DeviceBuffer<double> a(count, device), b(count, device);
    upload(a, make_input<double>(11, r, count), s);
    upload(b, make_input<double>(12, r, count), s);
    const auto issued_before = comm.issued_seq();
    {
      GroupGuard group;
      comm.all_reduce(a.data(), a.data(), count, ReduceOp::kSum);
      comm.all_reduce(b.data(), b.data(), count, ReduceOp::kMax, comm.comm_stream());
      group.end();
    }
    checker.expect(comm.issued_seq() == issued_before + 2, "a group of 2 collectives takes 2 sequence numbers");
    check_reduction<double>(checker, download(comm, a, s), 11, n, 0, ReduceOp::kSum, "grouped all_reduce (default stream)");
    check_reduction<double>(checker, download(comm, b, comm.comm_stream()), 12, n, 0, ReduceOp::kMax,
                            "grouped all_reduce (comm stream)");
  }

  comm.barrier();
  comm.barrier();
  checker.expect(comm.completed_seq() <= comm.issued_seq(), "completed <= issued");
  return checker.finish("API on " + std::to_string(n) + " GPUs");
}

TEST_CASE("every collective, type and op against a host reference, 1/2/4 GPUs") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, matrix_worker, std::chrono::minutes(8));
  }
}

TEST_CASE("span API, uneven all_gather, groups, barrier and Backend-generic use") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, api_worker);
  }
}

}  // namespace
