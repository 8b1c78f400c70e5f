// Tests of tests/support/loopback_backend.hpp, the in-process fake backend the fusion tests run
// ranks on as threads: it models the Backend concept, its collectives compute the right values
// over all ranks, its comm stream really runs later (events and waits order it), and a rank
// that never arrives fails the others with TimeoutError instead of hanging, and abort() ends a
// collective in flight and refuses later calls, as a communicator's does.
#include <doctest/doctest.h>

#include <chrono>     // std::chrono
#include <cstdint>    // std::uint64_t
#include <exception>  // std::exception_ptr
#include <string>     // std::string
#include <thread>     // std::thread, std::this_thread::sleep_for
#include <vector>     // std::vector

#include "support/loopback_backend.hpp"

using ncclkit::BFloat16;
using ncclkit::Half;
using ncclkit::MemoryKind;
using ncclkit::ReduceOp;
using ncclkit::TensorView;
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;
using ncclkit::testing::message_of;
using ncclkit::testing::run_ranks;

static_assert(ncclkit::Backend<LoopbackBackend>);

TEST_CASE("loopback collectives reduce, gather and broadcast over every rank") {
  LoopbackWorld world(3);
  const auto errors = run_ranks(3, [&](int rank) {
    LoopbackBackend backend(world, rank);
    std::vector<float> values = {float(rank + 1), float(-rank), 0.5f};
    backend.all_reduce(TensorView::of(std::span(values)), TensorView::of(std::span(values)), ReduceOp::kSum,
                       backend.default_stream());
    CHECK(values == std::vector<float>{6.f, -3.f, 1.5f});

    std::vector<double> avg = {double(rank)};
    backend.all_reduce(TensorView::of(std::span(avg)), TensorView::of(std::span(avg)), ReduceOp::kAvg,
                       backend.comm_stream());
    backend.synchronize(backend.comm_stream());
    CHECK(avg[0] == 1.0);

    std::vector<std::uint64_t> big = {rank == 1 ? ~std::uint64_t{0} : std::uint64_t(rank)};
    std::vector<std::uint64_t> lo = big;
    backend.all_reduce(TensorView::of(std::span(big)), TensorView::of(std::span(big)), ReduceOp::kMax,
                       backend.default_stream());
    backend.all_reduce(TensorView::of(std::span(lo)), TensorView::of(std::span(lo)), ReduceOp::kMin,
                       backend.default_stream());
    CHECK(big[0] == ~std::uint64_t{0});
    CHECK(lo[0] == 0);

    std::vector<Half> halves = {Half(0.25f * float(rank + 1))};
    backend.all_reduce(TensorView::of(std::span(halves)), TensorView::of(std::span(halves)), ReduceOp::kSum,
                       backend.default_stream());
    CHECK(static_cast<float>(halves[0]) == 1.5f);
    std::vector<BFloat16> brains = {BFloat16(2.0f)};
    backend.all_reduce(TensorView::of(std::span(brains)), TensorView::of(std::span(brains)), ReduceOp::kAvg,
                       backend.default_stream());
    CHECK(static_cast<float>(brains[0]) == 2.0f);

    std::vector<int> mine = {rank * 10};
    std::vector<int> gathered(3);
    backend.all_gather(TensorView::of(std::span(mine)), TensorView::of(std::span(gathered)), backend.default_stream());
    CHECK(gathered == std::vector<int>{0, 10, 20});

    std::vector<int> root_value = {rank == 2 ? 42 : -1};
    backend.broadcast(TensorView::of(std::span(root_value)), TensorView::of(std::span(root_value)), 2,
                      backend.default_stream());
    CHECK(root_value[0] == 42);

    std::vector<float> parts = {1.f, 2.f, 3.f};
    std::vector<float> part(1);
    backend.reduce_scatter(TensorView::of(std::span(parts)), TensorView::of(std::span(part)), ReduceOp::kSum,
                           backend.default_stream());
    CHECK(part[0] == 3.f * float(rank + 1));
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("loopback comm stream runs later, in order, and events order it against the host") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  std::vector<float> data = {1.f, 2.f, 3.f, 4.f};
  std::vector<float> copy(4);
  auto event = backend.create_event();
  CHECK(event.query());  // never recorded: complete
  backend.scale(TensorView::of(std::span(data)), 2.0, backend.comm_stream());
  backend.copy(copy.data(), data.data(), sizeof(float) * 4, backend.comm_stream());
  backend.record(event, backend.comm_stream());
  backend.wait(event, backend.default_stream());  // blocks until the worker has run both
  CHECK(copy == std::vector<float>{2.f, 4.f, 6.f, 8.f});
  CHECK(backend.events_created() == 1);
  (void)backend.record(backend.comm_stream());
  CHECK(backend.events_created() == 2);
}

TEST_CASE("a loopback rank that never arrives makes the others fail with TimeoutError, not hang") {
  LoopbackWorld world(2, std::chrono::milliseconds(200));
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    if (rank == 1) return;
    std::vector<float> v = {1.f};
    backend.all_reduce(TensorView::of(std::span(v)), TensorView::of(std::span(v)), ReduceOp::kSum,
                       backend.comm_stream());
    backend.synchronize(backend.comm_stream());
  });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(5));
  INFO(message_of(errors[0]));
  CHECK(message_of(errors[0]).find("waited 200 ms in collective 0") != std::string::npos);
  CHECK(message_of(errors[1]) == "");
}

TEST_CASE("loopback abort() ends the collective in flight at once, refuses later calls and fails the other ranks") {
  LoopbackWorld world(3, std::chrono::seconds(30));
  const auto start = std::chrono::steady_clock::now();
  std::vector<std::string> later(3);
  const auto errors = run_ranks(3, [&](int rank) {
    LoopbackBackend backend(world, rank);
    std::vector<float> v = {1.f};
    if (rank == 2) return;  // never arrives: ranks 0 and 1 block until rank 0 aborts
    std::thread aborter;
    if (rank == 0) {
      aborter = std::thread([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        backend.abort("the trainer gave up");
      });
    }
    std::string error;
    try {
      backend.all_reduce(TensorView::of(std::span(v)), TensorView::of(std::span(v)), ReduceOp::kSum,
                         backend.default_stream());
    } catch (const ncclkit::CommError& e) {
      error = e.what();
    }
    if (aborter.joinable()) aborter.join();
    try {
      backend.synchronize(backend.default_stream());
    } catch (const ncclkit::CommError& e) {
      later[static_cast<std::size_t>(rank)] = e.what();
    }
    if (!error.empty()) throw ncclkit::CommError(error);
  });
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
  for (int rank : {0, 1}) {
    CAPTURE(rank);
    CHECK(message_of(errors[static_cast<std::size_t>(rank)]).find("rank 0 was aborted: the trainer gave up") !=
          std::string::npos);
  }
  CHECK(later[0].find("the trainer gave up") != std::string::npos);  // rank 0 refuses later calls
  CHECK(later[1].empty());                                           // rank 1 itself was not aborted
  CHECK(message_of(errors[2]) == "");
}

TEST_CASE("loopback ranks that issue different collectives all get a CommError") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    LoopbackBackend backend(world, rank);
    std::vector<float> v(static_cast<std::size_t>(rank + 1), 1.f);
    backend.all_reduce(TensorView::of(std::span(v)), TensorView::of(std::span(v)), ReduceOp::kSum,
                       backend.default_stream());
  });
  for (const auto& e : errors) CHECK(message_of(e).find("issued a different collective") != std::string::npos);
}

TEST_CASE("loopback memory is host memory, counted until freed") {
  LoopbackWorld world(1);
  LoopbackBackend backend(world, 0);
  CHECK(LoopbackBackend::memory_kind == MemoryKind::kHost);
  void* p = backend.allocate(100);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 64 == 0);
  CHECK(backend.live_allocations() == 1);
  backend.deallocate(p);
  CHECK(backend.live_allocations() == 0);
}
