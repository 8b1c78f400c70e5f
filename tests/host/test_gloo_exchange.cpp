// The Gloo communicator's all_to_all, gather, scatter, send and recv: values at worlds 2 and 3
// (real processes), in place where it applies, both streams and the typed overloads; bad
// arguments are ConfigErrors that name what is wrong; with the argument check on, their
// mismatches are errors on every rank, and point-to-point calls between two ranks do not put
// the other ranks' checks out of step.
// ncclkit-test: timeout=120
#include <doctest/doctest.h>

#include <chrono>   // std::chrono
#include <cstddef>  // std::size_t
#include <cstdint>  // std::int32_t, std::int64_t
#include <memory>   // std::make_shared
#include <span>     // std::span
#include <string>   // std::string
#include <thread>   // std::this_thread::sleep_for
#include <vector>   // std::vector

#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/store/file_store.hpp"
#include "support/gloo_testing.hpp"
#include "support/text.hpp"
#include "support/temp_dir.hpp"

using namespace std::chrono_literals;
using ncclkit::CollectiveMismatchError;
using ncclkit::ConfigError;
using ncclkit::MemoryKind;
using ncclkit::TensorView;
using ncclkit::WorldInfo;
using ncclkit::gloo::Communicator;
using ncclkit::testing::Checker;
using ncclkit::testing::run_gloo;
using ncclkit_test::contains;

namespace {

/// all_to_all, gather, scatter, send and recv with `per_rank` elements per rank and slice, on
/// `stream`, checked against values every rank can compute.
void exercise_exchange(Communicator& comm, Checker& check, std::size_t per_rank, Communicator::Stream stream) {
  const int n = comm.size();
  const int rank = comm.rank();
  const auto k = per_rank;
  const auto total = k * static_cast<std::size_t>(n);
  const std::string where = " (k=" + std::to_string(k) + (stream == comm.comm_stream() ? ", comm stream)" : ")");

  // all_to_all: slice j of rank r's input holds 1000 r + 100 j + i; it lands on rank j.
  std::vector<std::int32_t> in(total), out(total, -1);
  for (int j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < k; ++i) in[j * k + i] = static_cast<std::int32_t>(1000 * rank + 100 * j + i);
  }
  comm.all_to_all(in.data(), out.data(), k, stream);
  comm.synchronize(stream);
  bool ok = true;
  for (int j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < k; ++i) ok &= out[j * k + i] == static_cast<std::int32_t>(1000 * j + 100 * rank + i);
  }
  check.expect(ok, "all_to_all values" + where);
  std::vector<double> din(total), dout(total);
  for (std::size_t i = 0; i < total; ++i) din[i] = rank + 0.25 * static_cast<double>(i);
  comm.all_to_all(std::span<const double>(din), std::span<double>(dout), stream);
  comm.synchronize(stream);
  ok = true;
  for (int j = 0; j < n; ++j) {
    for (std::size_t i = 0; i < k; ++i) ok &= dout[j * k + i] == j + 0.25 * static_cast<double>(rank * k + i);
  }
  check.expect(ok, "all_to_all over spans" + where);

  for (int root : {0, n - 1}) {
    const std::string at = " root " + std::to_string(root) + where;
    // gather, out of place and in place (the root's input is its slice of the output).
    std::vector<std::int64_t> mine(k), gathered(rank == root ? total : 0, -1);
    for (std::size_t i = 0; i < k; ++i) mine[i] = 10 * rank + static_cast<std::int64_t>(i);
    comm.gather(mine.data(), gathered.data(), k, root, stream);
    comm.synchronize(stream);
    if (rank == root) {
      ok = true;
      for (int j = 0; j < n; ++j) {
        for (std::size_t i = 0; i < k; ++i) ok &= gathered[j * k + i] == 10 * j + static_cast<std::int64_t>(i);
      }
      check.expect(ok, "gather values" + at);
    }
    std::vector<std::int64_t> place(total, -1);
    std::int64_t* slice = place.data() + static_cast<std::size_t>(rank) * k;
    for (std::size_t i = 0; i < k; ++i) slice[i] = 10 * rank + static_cast<std::int64_t>(i) + 1;
    comm.gather(TensorView::of(slice, k), TensorView::of(place.data(), rank == root ? total : 0), root, stream);
    comm.synchronize(stream);
    if (rank == root) {
      ok = true;
      for (int j = 0; j < n; ++j) {
        for (std::size_t i = 0; i < k; ++i) ok &= place[j * k + i] == 10 * j + static_cast<std::int64_t>(i) + 1;
      }
      check.expect(ok, "gather in place" + at);
    }

    // scatter, out of place and in place (the root's output is its slice of the input).
    std::vector<float> source(rank == root ? total : 0), received(k, -1.0f);
    for (std::size_t i = 0; i < source.size(); ++i) source[i] = 0.5f * static_cast<float>(i) + 7.0f;
    comm.scatter(std::span<const float>(source), std::span<float>(received), root, stream);
    comm.synchronize(stream);
    ok = true;
    for (std::size_t i = 0; i < k; ++i) ok &= received[i] == 0.5f * static_cast<float>(rank * k + i) + 7.0f;
    check.expect(ok, "scatter values" + at);
    std::vector<float> whole(total, -1.0f);
    if (rank == root) {
      for (std::size_t i = 0; i < total; ++i) whole[i] = static_cast<float>(i) - 3.0f;
    }
    float* part = whole.data() + static_cast<std::size_t>(rank) * k;
    comm.scatter(TensorView::of(whole.data(), rank == root ? total : 0), TensorView::of(part, k), root, stream);
    comm.synchronize(stream);
    ok = true;
    for (std::size_t i = 0; i < k; ++i) ok &= part[i] == static_cast<float>(rank * k + i) - 3.0f;
    check.expect(ok, "scatter in place" + at);
  }

  // send and recv around a ring: rank 0 sends first, every other rank receives first, so no
  // two ranks wait on each other's send.
  const int next = (rank + 1) % n;
  const int previous = (rank + n - 1) % n;
  std::vector<std::int32_t> outgoing(k), incoming(k, -1);
  for (std::size_t i = 0; i < k; ++i) outgoing[i] = static_cast<std::int32_t>(100 * rank + i);
  if (rank == 0) {
    comm.send(outgoing.data(), k, next, stream);
    comm.recv(std::span<std::int32_t>(incoming), previous, stream);
  } else {
    comm.recv(incoming.data(), k, previous, stream);
    comm.send(std::span<std::int32_t>(outgoing), next, stream);
  }
  comm.synchronize(stream);
  ok = true;
  for (std::size_t i = 0; i < k; ++i) ok &= incoming[i] == static_cast<std::int32_t>(100 * previous + i);
  check.expect(ok, "send/recv around the ring" + where);
  check.expect(
      comm.completed_sequence() == comm.issued_sequence(),
      "completed " + std::to_string(comm.completed_sequence()) + " of " + std::to_string(comm.issued_sequence()));
}

void exercise_exchanges(Communicator& comm, const WorldInfo&, Checker& check) {
  for (std::size_t k : {std::size_t{0}, std::size_t{1}, std::size_t{5}, std::size_t{40000}}) {
    exercise_exchange(comm, check, k, comm.default_stream());
  }
  exercise_exchange(comm, check, 7, comm.comm_stream());
}

}  // namespace

TEST_CASE("all_to_all, gather, scatter, send and recv give the right values with two and three ranks") {
  for (int n : {2, 3}) {
    CAPTURE(n);
    auto result = run_gloo(n, exercise_exchanges, {.timeout = 20s});
    CHECK_MESSAGE(result.ok(), result.describe());
  }
}

TEST_CASE(
    "with the argument check on they give the same values, and send/recv between two ranks keep the others in step") {
  auto result = run_gloo(3,
                         [](Communicator& comm, const WorldInfo& world, Checker& check) {
                           exercise_exchange(comm, check, 3, comm.default_stream());
                           // Only ranks 0 and 1 exchange; rank 2's next checked collective must still pair up.
                           std::int32_t value = world.rank == 0 ? 42 : 0;
                           if (world.rank == 0) comm.send(&value, 1, 1);
                           if (world.rank == 1) comm.recv(&value, 1, 0);
                           std::vector<std::int32_t> sum{world.rank + 1};
                           try {
                             comm.all_reduce(std::span<std::int32_t>(sum));
                             check.expect(sum[0] == 6, "all_reduce after send/recv: " + std::to_string(sum[0]));
                           } catch (const std::exception& e) {
                             check.expect(false, std::string("all_reduce after send/recv threw: ") + e.what());
                           }
                           check.expect(world.rank != 1 || value == 42, "recv value");
                           // A gather whose root differs between ranks is caught before anything moves.
                           std::vector<std::int32_t> one{1}, all(3);
                           try {
                             comm.gather(one.data(), all.data(), 1, world.rank == 2 ? 1 : 0);
                             check.expect(false, "gather with different roots did not throw");
                           } catch (const CollectiveMismatchError& e) {
                             check.expect(contains(e.what(), "gather") && contains(e.what(), "root"), e.what());
                           }
                           check.expect(!comm.failed(), "a mismatch leaves the communicator usable");
                         },
                         {.timeout = 20s, .check_collectives = true});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a rank whose all_to_all count is bad makes every rank raise at once with the check on") {
  auto result = run_gloo(
      2,
      [](Communicator& comm, const WorldInfo& world, Checker& check) {
        std::vector<float> in(4, 1.0f), out(4);
        const std::size_t count = world.rank == 1 ? 3 : 4;  // 3 is no multiple of two ranks
        try {
          comm.all_to_all(TensorView::of(in.data(), count), TensorView::of(out.data(), count));
          check.expect(false, "no error");
        } catch (const CollectiveMismatchError& e) {
          check.expect(world.rank == 0 && contains(e.what(), "rank 1") && contains(e.what(), "multiple"), e.what());
        } catch (const ConfigError& e) {
          check.expect(world.rank == 1 && contains(e.what(), "not a multiple of size() 2"), e.what());
        }
      },
      {.timeout = 20s, .check_collectives = true});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("bad arguments of all_to_all, gather, scatter, send and recv are ConfigErrors naming what is wrong") {
  // A world of one: the argument checks need no peer.
  ncclkit_test::TempDir dir;
  auto store = std::make_shared<ncclkit::FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = 1});
  Communicator comm(store, WorldInfo{}, {.timeout = 5s, .name = "bad"});
  std::vector<float> a(8), b(8);
  std::vector<double> d(8);
  CHECK_THROWS_WITH_AS(comm.all_to_all(TensorView::of(a.data(), 8), TensorView::of(b.data(), 4)),
                       doctest::Contains("in.count == out.count"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.all_to_all(TensorView::of(a.data(), 8), TensorView::of(a.data(), 8)),
                       doctest::Contains("out of place only"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.all_to_all(TensorView::of(a.data(), 8), TensorView::of(d.data(), 8)),
                       doctest::Contains("same element type"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.gather(TensorView::of(a.data(), 2), TensorView::of(b.data(), 3), 0),
                       doctest::Contains("out.count == in.count * size() on the root"), ConfigError);
  CHECK_THROWS_WITH_AS(
      comm.gather(TensorView::of(a.data(), 2), TensorView::of(b.data(), 2), 1),
      doctest::Contains("ncclkit: gather on gloo communicator 'bad' (rank 0 of 1): root 1 is outside [0, 1)"),
      ConfigError);
  CHECK_THROWS_WITH_AS(comm.gather(TensorView::of(a.data(), 4), TensorView::of(a.data() + 2, 4), 0),
                       doctest::Contains("overlap"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.scatter(TensorView::of(a.data(), 3), TensorView::of(b.data(), 2), 0),
                       doctest::Contains("in.count == out.count * size() on the root"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.scatter(TensorView::of(a.data(), 2), TensorView::of(b.data(), 2), -1),
                       doctest::Contains("scatter on gloo communicator 'bad' (rank 0 of 1): root -1"), ConfigError);
  CHECK_THROWS_WITH_AS(
      comm.scatter(TensorView{nullptr, 2, ncclkit::DataType::kFloat32}, TensorView::of(b.data(), 2), 0),
      doctest::Contains("null pointer"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.send(TensorView::of(a.data(), 8), 0),
                       doctest::Contains("ncclkit: send on gloo communicator 'bad' (rank 0 of 1): peer 0 is this rank"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(comm.send(TensorView::of(a.data(), 8), 2), doctest::Contains("peer 2 is outside [0, 1)"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(comm.recv(TensorView::of(a.data(), 8, MemoryKind::kDevice), 0),
                       doctest::Contains("recv on gloo communicator 'bad' (rank 0 of 1): peer 0"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.recv(TensorView{nullptr, 1, ncclkit::DataType::kFloat32}, -1),
                       doctest::Contains("peer -1 is outside"), ConfigError);
  CHECK_FALSE(comm.failed());

  // A world of one: each copies (all_to_all, gather, scatter move the one slice).
  std::vector<std::int32_t> in{1, 2, 3}, out(3);
  comm.all_to_all(std::span<const std::int32_t>(in), std::span<std::int32_t>(out));
  CHECK(out == in);
  std::vector<std::int32_t> g(3);
  comm.gather(std::span<const std::int32_t>(in), std::span<std::int32_t>(g), 0);
  CHECK(g == in);
  std::vector<std::int32_t> sc(3);
  comm.scatter(std::span<const std::int32_t>(in), std::span<std::int32_t>(sc), 0);
  CHECK(sc == in);
  CHECK(comm.issued_sequence() == 3);
  CHECK(comm.completed_sequence() == 3);
}

TEST_CASE("a recv whose peer never sends fails with CommError within the timeout, naming the call") {
  auto result =
      run_gloo(2,
               [](Communicator& comm, const WorldInfo& world, Checker& check) {
                 std::vector<std::int32_t> data(1000, 1);
                 if (world.rank == 0) {
                   const auto start = std::chrono::steady_clock::now();
                   try {
                     comm.recv(data.data(), data.size(), 1);
                     check.expect(false, "recv completed without a send");
                   } catch (const ncclkit::CommError& e) {
                     check.expect(contains(e.what(), "recv #1") && contains(e.what(), "from rank 1"), e.what());
                   }
                   // At its 1 s timeout: neither sooner (it failed for another reason) nor much later.
                   const auto waited = std::chrono::steady_clock::now() - start;
                   check.expect(waited >= 900ms && waited < 3s,
                                "failed after " + std::to_string(std::chrono::duration<double>(waited).count()) +
                                    " s, not at the 1 s timeout");
                   check.expect(comm.failed(), "the communicator is unusable after a failed recv");
                 } else {
                   std::this_thread::sleep_for(3s);  // never sends; stays connected past rank 0's timeout
                 }
               },
               {.timeout = 1s});
  CHECK_MESSAGE(result.ok(), result.describe());
}
