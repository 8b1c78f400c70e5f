// Tests of ncclkit::gloo::Communicator beyond the collective x type matrix
// (test_gloo_collectives.cpp): creation and options, misuse errors, a world of one, the chunked
// paths with a tiny chunk limit, 64 MiB buffers, the comm stream (record/wait/synchronize),
// several communicators on one store, moves. Real processes through spawn and FileStore.
// ncclkit-test: timeout=300
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "support/temp_dir.hpp"
#include "ncclkit/store/file_store.hpp"
#include "support/gloo_testing.hpp"

using namespace std::chrono_literals;
using ncclkit::BFloat16;
using ncclkit::CommError;
using ncclkit::ConfigError;
using ncclkit::data_type_v;
using ncclkit::DataType;
using ncclkit::Half;
using ncclkit::ReduceOp;
using ncclkit::TensorView;
using ncclkit::WorldInfo;
using ncclkit::gloo::Communicator;
using ncclkit::testing::Checker;

namespace {

using ncclkit_test::TempDir;

/// A private folder for a FileStore of a single-process test.
/// A deterministic value with an exact float sum over a few ranks: multiples of 1/8 below 128,
/// hashed from (rank, i) so that no two pieces of a buffer repeat each other.
float exact_value(int rank, std::size_t i) {
  std::uint64_t h =
      (static_cast<std::uint64_t>(i) + 1) * 0x9e3779b97f4a7c15ULL ^ (static_cast<std::uint64_t>(rank) << 48);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  h ^= h >> 29;
  return static_cast<float>(h % 1024) / 8.0f;
}

}  // namespace

TEST_CASE("a world of one rank needs no peers: every collective copies, avg divides by one") {
  TempDir dir;
  auto store = std::make_shared<ncclkit::FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = 1});
  Communicator comm(store, WorldInfo{}, {.timeout = 5s});
  CHECK(comm.rank() == 0);
  CHECK(comm.size() == 1);
  CHECK(comm.native_context() == nullptr);
  std::vector<float> in{1.5f, -2.0f, 3.25f}, out(3);
  comm.all_reduce(std::span<const float>(in), std::span<float>(out), ReduceOp::kAvg);
  CHECK(out == in);
  std::vector<std::int32_t> gathered(2);
  std::vector<std::int32_t> mine{7, 8};
  comm.all_gather(std::span<const std::int32_t>(mine), std::span<std::int32_t>(gathered));
  CHECK(gathered == mine);
  std::vector<double> rs(2);
  std::vector<double> rs_in{4.0, 5.0};
  comm.reduce_scatter(std::span<const double>(rs_in), std::span<double>(rs), ReduceOp::kMax);
  CHECK(rs == rs_in);
  comm.broadcast(std::span<float>(in), 0);
  comm.barrier();
  CHECK(comm.issued_sequence() == 5);

  // Memory and element-wise work of the Backend concept, on both streams.
  auto* a = static_cast<float*>(comm.allocate(100 * sizeof(float)));
  auto* b = static_cast<float*>(comm.allocate(100 * sizeof(float)));
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 64 == 0);
  CHECK(reinterpret_cast<std::uintptr_t>(b) % 64 == 0);
  for (int i = 0; i < 100; ++i) a[i] = static_cast<float>(i) - 50.0f;
  comm.copy(b, a, 100 * sizeof(float), comm.default_stream());
  comm.scale(TensorView::of(b, 100), 0.5, comm.default_stream());
  CHECK(b[10] == -20.0f);
  comm.scale(TensorView::of(b, 100), 4.0, comm.comm_stream());
  comm.copy(a, b, 100 * sizeof(float), comm.comm_stream());
  comm.synchronize(comm.comm_stream());
  CHECK(a[10] == -80.0f);
  CHECK(a[99] == 98.0f);
  std::vector<Half> h{Half(1.5f), Half(-3.0f)};
  comm.scale(TensorView::of(h.data(), h.size()), 2.0);
  CHECK(static_cast<float>(h[1]) == -6.0f);
  comm.deallocate(a);
  comm.deallocate(b);
}

TEST_CASE("the dialect's accessors: name, timeout, issued and completed sequence numbers") {
  TempDir dir;
  auto store = std::make_shared<ncclkit::FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = 1});
  Communicator comm(store, WorldInfo{}, {.timeout = 7s, .name = "grads"});
  CHECK(comm.name() == "grads");
  CHECK(comm.timeout() == 7s);
  CHECK(comm.options().timeout == 7s);
  CHECK(comm.issued_sequence() == 0);
  CHECK(comm.completed_sequence() == 0);
  std::vector<float> v{1.0f, 2.0f};
  comm.all_reduce(v.data(), v.size());  // the pointer + count overload, in place
  comm.all_reduce(std::span<float>(v), ReduceOp::kSum, comm.comm_stream());
  CHECK(comm.issued_sequence() == 2);
  comm.synchronize(comm.comm_stream());
  CHECK(comm.completed_sequence() == 2);
  comm.all_reduce(std::span<float>(v.data(), 0));  // nothing to move still counts
  CHECK(comm.completed_sequence() == 3);
}

TEST_CASE("an event is created once and re-recorded: each record marks the work issued so far on that stream") {
  TempDir dir;
  auto store = std::make_shared<ncclkit::FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = 1});
  Communicator comm(store, WorldInfo{}, {.timeout = 5s});
  Communicator::Event event = comm.create_event();
  CHECK(event.query());  // never recorded: complete
  std::vector<float> x(4, 1.0f);
  comm.scale(TensorView::of(x.data(), x.size()), 2.0, comm.comm_stream());
  comm.record(event, comm.comm_stream());
  comm.synchronize(comm.comm_stream());
  CHECK(event.query());
  const auto first_ticket = event.ticket();

  // Hold the comm stream behind a gate (another queue's task that waits for a flag, at most
  // 10 s), then re-record the same event after more work: it marks the new work, not done yet.
  std::atomic<bool> release{false};
  ncclkit::gloo::CommQueue gate("gate");
  gate.submit([&] {
    for (int i = 0; i < 1000 && !release.load(); ++i) std::this_thread::sleep_for(10ms);
  });
  comm.wait(gate.record(), comm.comm_stream());
  comm.scale(TensorView::of(x.data(), x.size()), 2.0, comm.comm_stream());
  comm.record(event, comm.comm_stream());
  CHECK(event.ticket() > first_ticket);
  CHECK_FALSE(event.query());
  release.store(true);
  event.wait();
  CHECK(event.query());
  CHECK(x[0] == 4.0f);

  // Recorded on the inline stream, whose work is done when issued, it is complete at once.
  comm.record(event, comm.default_stream());
  CHECK(event.query());
  comm.synchronize(comm.comm_stream());
}

TEST_CASE("options and misuse are ConfigErrors that say what is wrong, before Gloo sees anything") {
  TempDir dir;
  auto store = std::make_shared<ncclkit::FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = 1});
  CHECK_THROWS_AS(Communicator(store, WorldInfo{}, {.timeout = 0ms}), ConfigError);
  CHECK_THROWS_AS(Communicator(store, WorldInfo{}, {.chunk_elements = 0}), ConfigError);
  CHECK_THROWS_AS(Communicator(store, WorldInfo{}, {.chunk_elements = std::size_t{1} << 31}), ConfigError);
  CHECK_THROWS_AS(Communicator(std::shared_ptr<ncclkit::Store>(), WorldInfo{}), ConfigError);
  WorldInfo bad;
  bad.rank = 3;
  CHECK_THROWS_AS(Communicator(store, bad), ConfigError);

  Communicator comm(*store, WorldInfo{}, {.timeout = 5s, .name = "misuse"});
  std::vector<float> a(8), b(4);
  std::vector<double> d(8);
  CHECK_THROWS_WITH_AS(comm.all_reduce(TensorView::of(a.data(), 8), TensorView::of(b.data(), 4)),
                       doctest::Contains("in.count == out.count"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.all_reduce(TensorView::of(a.data(), 8), TensorView::of(d.data(), 8)),
                       doctest::Contains("same element type"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.all_reduce(TensorView::of(a.data(), 8, ncclkit::MemoryKind::kDevice),
                                       TensorView::of(a.data(), 8, ncclkit::MemoryKind::kDevice)),
                       doctest::Contains("host memory"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.all_reduce(TensorView::of(a.data(), 6), TensorView::of(a.data() + 2, 6)),
                       doctest::Contains("overlap"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.all_reduce(TensorView{nullptr, 3, DataType::kFloat32}, TensorView::of(a.data(), 3)),
                       doctest::Contains("null pointer"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.broadcast(std::span<float>(a), 1), doctest::Contains("root 1"), ConfigError);
  CHECK_THROWS_WITH_AS(comm.reduce(TensorView::of(a.data(), 8), TensorView::of(b.data(), 8), ReduceOp::kSum, -1),
                       doctest::Contains("root -1"), ConfigError);
  const std::size_t counts[] = {1, 2};
  CHECK_THROWS_WITH_AS(comm.all_gather_uneven(TensorView::of(a.data(), 1), TensorView::of(b.data(), 3), counts),
                       doctest::Contains("one count per rank"), ConfigError);
  // Errors name the communicator and rank.
  CHECK_THROWS_WITH_AS(comm.all_gather(TensorView::of(a.data(), 2), TensorView::of(b.data(), 3)),
                       doctest::Contains("gloo communicator 'misuse' (rank 0 of 1)"), ConfigError);
  CHECK_FALSE(comm.failed());  // misuse does not break the communicator
  comm.all_reduce(std::span<float>(a));

  Communicator moved(std::move(comm));
  CHECK(moved.size() == 1);
  CHECK_THROWS_AS(comm.rank(), ConfigError);  // NOLINT(bugprone-use-after-move): tested on purpose
}

TEST_CASE("an interface that does not exist is a ConfigError naming it") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::spawn(2, [](const WorldInfo& world) {
    auto store = ncclkit::make_store(world.init_url, world);
    try {
      Communicator comm(store, world, {.timeout = 5s, .interface = "no-such-nic0"});
    } catch (const ConfigError& e) {
      return std::string(e.what()).find("no-such-nic0") != std::string::npos ? 0 : 2;
    }
    return 1;
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

namespace {

/// Every collective with a chunk limit of 7 elements, in `nprocs` ranks.
ncclkit::SpawnResult run_with_tiny_chunks(int nprocs) {
  return ncclkit::testing::run_gloo(
      nprocs,
      [](Communicator& comm, const WorldInfo& world, Checker& check) {
        const int n = comm.size();
        const int rank = world.rank;
        for (std::size_t count : {1u, 7u, 50u, 1001u}) {
          // all_reduce / reduce / reduce_scatter over float and half, sum and avg.
          for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
            std::vector<std::vector<float>> in(n);
            for (int r = 0; r < n; ++r)
              for (std::size_t i = 0; i < count * n; ++i) in[r].push_back(exact_value(r, i));
            auto ref = [&](std::size_t i) {
              double acc = op == ReduceOp::kMax ? -1e300 : 0.0;
              for (int r = 0; r < n; ++r) acc = op == ReduceOp::kMax ? std::max(acc, double(in[r][i])) : acc + in[r][i];
              return op == ReduceOp::kAvg ? acc / n : acc;
            };
            std::vector<float> out(count * n);
            comm.all_reduce(std::span<const float>(in[rank]), std::span<float>(out), op);
            double worst = 0;
            for (std::size_t i = 0; i < count * n; ++i) worst = std::max(worst, std::abs(out[i] - ref(i)));
            check.expect(worst <= 1e-4, "chunked all_reduce count=" + std::to_string(count));
            std::vector<float> root_out(count * n);
            comm.reduce(std::span<const float>(in[rank]), std::span<float>(root_out), op, n - 1);
            if (rank == n - 1) {
              worst = 0;
              for (std::size_t i = 0; i < count * n; ++i) worst = std::max(worst, std::abs(root_out[i] - ref(i)));
              check.expect(worst <= 1e-4, "chunked reduce count=" + std::to_string(count));
            }
            std::vector<float> mine(count);
            comm.reduce_scatter(std::span<const float>(in[rank]), std::span<float>(mine), op);
            worst = 0;
            for (std::size_t i = 0; i < count; ++i) worst = std::max(worst, std::abs(mine[i] - ref(rank * count + i)));
            check.expect(worst <= 1e-4, "chunked reduce_scatter count=" + std::to_string(count));
            std::vector<Half> h(count * n);
            for (std::size_t i = 0; i < h.size(); ++i) h[i] = Half(in[rank][i] / 64.0f);
            comm.all_reduce(std::span<Half>(h), op);
            worst = 0;
            for (std::size_t i = 0; i < h.size(); ++i) worst = std::max(worst, std::abs(float(h[i]) - ref(i) / 64.0));
            check.expect(worst <= 0.05, "chunked half all_reduce count=" + std::to_string(count));
          }
          // broadcast, all_gather (both placements), all_gather_uneven (uneven, one empty part).
          std::vector<std::int64_t> data(count);
          for (std::size_t i = 0; i < count; ++i) data[i] = static_cast<std::int64_t>(i) * 10 + rank;
          std::vector<std::int64_t> b = data;
          comm.broadcast(std::span<std::int64_t>(b), 1);
          bool ok = true;
          for (std::size_t i = 0; i < count; ++i) ok = ok && b[i] == static_cast<std::int64_t>(i) * 10 + 1;
          check.expect(ok, "chunked broadcast count=" + std::to_string(count));
          for (bool in_place : {false, true}) {
            std::vector<std::int64_t> all(count * n);
            if (in_place) {
              std::copy(data.begin(), data.end(), all.begin() + static_cast<std::ptrdiff_t>(rank * count));
              comm.all_gather(TensorView::of(all.data() + rank * count, count), TensorView::of(all.data(), all.size()));
            } else {
              comm.all_gather(std::span<const std::int64_t>(data), std::span<std::int64_t>(all));
            }
            ok = true;
            for (int r = 0; r < n; ++r)
              for (std::size_t i = 0; i < count; ++i)
                ok = ok && all[r * count + i] == static_cast<std::int64_t>(i) * 10 + r;
            check.expect(ok, "chunked all_gather count=" + std::to_string(count) + (in_place ? " in-place" : ""));
          }
          std::vector<std::size_t> counts{count, 0, count / 2 + 3};
          counts.resize(static_cast<std::size_t>(n));
          std::vector<std::int64_t> part(counts[rank]);
          for (std::size_t i = 0; i < part.size(); ++i) part[i] = static_cast<std::int64_t>(i) * 10 + rank;
          std::vector<std::int64_t> v(std::accumulate(counts.begin(), counts.end(), std::size_t{0}));
          comm.all_gather_uneven(std::span<const std::int64_t>(part), std::span<std::int64_t>(v), counts);
          ok = true;
          std::size_t at = 0;
          for (int r = 0; r < n; ++r)
            for (std::size_t i = 0; i < counts[r]; ++i) ok = ok && v[at++] == static_cast<std::int64_t>(i) * 10 + r;
          check.expect(ok, "chunked all_gather_uneven count=" + std::to_string(count));
        }
      },
      {.timeout = 30s, .chunk_elements = 7});
}

}  // namespace

TEST_CASE("a tiny chunk limit splits every collective into many Gloo calls and changes no result") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  // Two ranks take the two-rank all-reduce exchange, three Gloo's ring.
  for (int nprocs : {2, 3}) {
    CAPTURE(nprocs);
    auto result = run_with_tiny_chunks(nprocs);
    CHECK_MESSAGE(result.ok(), result.describe());
  }
}

TEST_CASE("two ranks: the piecewise all-reduce exchange is right for odd counts, every op, both placements") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::testing::run_gloo(
      2,
      [](Communicator& comm, const WorldInfo& world, Checker& check) {
        // Every element against its bound (integers: exactly), so that a piece left unreduced
        // or unsent fails however few elements it holds.
        auto exercise = [&]<class T>(std::size_t count) {
          for (ReduceOp op : ncclkit::testing::kAllOps) {
            const std::uint64_t seed = count * 7 + static_cast<std::uint64_t>(op);
            std::vector<std::vector<T>> inputs;
            for (int r = 0; r < 2; ++r) inputs.push_back(ncclkit::testing::random_inputs<T>(count, r, 2, op, seed));
            const auto want = ncclkit::testing::reduce_reference_of<T>(
                count, 2, op, [&](int r, std::size_t i) { return ncclkit::testing::as_double(inputs[r][i]); });
            const double tolerance = ncclkit::testing::tolerance_of(data_type_v<T>, op, 2);
            const std::string what = std::string(ncclkit::name_of(data_type_v<T>)) + " count " + std::to_string(count) +
                                     " " + std::string(ncclkit::name_of(op));
            std::vector<T> out(count);
            comm.all_reduce(std::span<const T>(inputs[world.rank]), std::span<T>(out), op);
            ncclkit::testing::expect_within(check, out.data(), want, tolerance, "out-of-place " + what);
            std::vector<T> data = inputs[world.rank];
            comm.all_reduce(std::span<T>(data), op);
            ncclkit::testing::expect_within(check, data.data(), want, tolerance, "in-place " + what);
          }
        };
        // Parts of just over 1 MiB (2 pieces; the halves differ by one element), 1.5 MiB (2
        // pieces) and 3.5 MiB (4 pieces), the last both in Half and in int32, which is exact.
        exercise.template operator()<float>((std::size_t{1} << 19) + 5);
        exercise.template operator()<Half>((std::size_t{7} << 19) + 1);
        exercise.template operator()<std::int32_t>((std::size_t{3} << 18) + 3);
        exercise.template operator()<std::int32_t>((std::size_t{7} << 18) + 3);
      },
      {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("64 MiB: a float all_reduce and a bfloat16 all_gather are exact") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::testing::run_gloo(
      2,
      [](Communicator& comm, const WorldInfo& world, Checker& check) {
        const std::size_t count = (64u << 20) / sizeof(float);
        std::vector<float> data(count);
        for (std::size_t i = 0; i < count; ++i) data[i] = exact_value(world.rank, i);
        comm.all_reduce(std::span<float>(data));
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) wrong += data[i] != exact_value(0, i) + exact_value(1, i);
        check.expect(wrong == 0, "64 MiB float all_reduce: " + std::to_string(wrong) + " wrong elements");
        const std::size_t part = (64u << 20) / sizeof(BFloat16) / 2;
        std::vector<BFloat16> mine(part), all(part * 2);
        for (std::size_t i = 0; i < part; ++i) mine[i] = BFloat16(exact_value(world.rank, i));
        comm.all_gather(std::span<const BFloat16>(mine), std::span<BFloat16>(all));
        wrong = 0;
        for (int r = 0; r < 2; ++r)
          for (std::size_t i = 0; i < part; ++i) wrong += all[r * part + i].bits != BFloat16(exact_value(r, i)).bits;
        check.expect(wrong == 0, "64 MiB bfloat16 all_gather: " + std::to_string(wrong) + " wrong elements");
      },
      {.timeout = 60s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("the comm stream runs collectives on the worker; record, wait and synchronize order them") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::testing::run_gloo(
      2,
      [](Communicator& comm, const WorldInfo& world, Checker& check) {
        const auto comm_stream = comm.comm_stream();
        const auto inline_stream = comm.default_stream();
        check.expect(!(comm_stream == inline_stream), "the two streams differ");
        const std::size_t count = 1 << 18;
        std::vector<float> a(count), b(count);
        for (std::size_t i = 0; i < count; ++i) a[i] = exact_value(world.rank, i);
        // Queue: all_reduce(a), scale(a, 0.5), all_reduce(b); the host keeps working meanwhile.
        comm.all_reduce(std::span<float>(a), ReduceOp::kSum, comm_stream);
        comm.scale(TensorView::of(a.data(), count), 0.5, comm_stream);
        auto after_a = comm.record(comm_stream);
        std::fill(b.begin(), b.end(), static_cast<float>(world.rank + 1));
        comm.copy(b.data(), b.data(), 0, comm_stream);
        comm.all_reduce(std::span<float>(b), ReduceOp::kMax, comm_stream);
        comm.wait(after_a, inline_stream);  // blocks the host until a is done
        check.expect(after_a.query(), "the event is complete after wait");
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) wrong += a[i] != 0.5f * (exact_value(0, i) + exact_value(1, i));
        check.expect(wrong == 0, "all_reduce then scale on the comm stream: " + std::to_string(wrong) + " wrong");
        comm.synchronize(comm_stream);
        check.expect(std::all_of(b.begin(), b.end(), [](float x) { return x == 2.0f; }), "max on the comm stream");
        // Inline events are complete at once; wait on the comm stream for its own event is a no-op.
        check.expect(comm.record(inline_stream).query(), "an inline event is complete");
        comm.wait(comm.record(comm_stream), comm_stream);
        comm.synchronize(inline_stream);
        // A second communicator's comm stream waits for the first's event.
        Communicator other(ncclkit::make_store(world.init_url, world), world, {.timeout = 30s, .name = "other"});
        std::vector<double> x(1000, world.rank + 1.0), y(1000, 0.0);
        comm.all_reduce(std::span<double>(x), ReduceOp::kSum, comm_stream);
        auto x_done = comm.record(comm_stream);
        other.wait(x_done, other.comm_stream());
        other.copy(y.data(), x.data(), x.size() * sizeof(double), other.comm_stream());
        other.all_reduce(std::span<double>(y), ReduceOp::kSum, other.comm_stream());
        other.synchronize(other.comm_stream());
        check.expect(std::all_of(y.begin(), y.end(), [](double v) { return v == 6.0; }),
                     "cross-communicator wait orders the copy after the first all_reduce");
        comm.synchronize(comm_stream);
      },
      {.timeout = 30s});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("several communicators on one store, created and destroyed in turn, never mix") {
  auto result = ncclkit::spawn(3, [](const WorldInfo& world) {
    auto store = ncclkit::make_store(world.init_url, world);
    Checker check(world.rank);
    for (int round = 0; round < 3; ++round) {
      Communicator first(store, world, {.timeout = 30s, .name = "same"});
      Communicator second(store, world, {.timeout = 30s, .name = "same"});
      Communicator third(store, world, {.timeout = 30s, .name = "different"});
      std::vector<int> a(100, world.rank + 1), b(100, 10 * (world.rank + 1)), c(100, 100 * (world.rank + 1));
      third.all_reduce(std::span<int>(c));
      second.all_reduce(std::span<int>(b));
      first.all_reduce(std::span<int>(a));
      check.expect(a[0] == 6 && b[0] == 60 && c[0] == 600, "round " + std::to_string(round));
    }
    // Every rank agreed on generations 0, 1, ..., 5 for name "same".
    check.expect(store->add("ncclkit/gloo/same/created", 0) == 3 * 6, "generation counter");
    return check.code();
  });
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("an explicit interface binds there; the native Gloo context is the one in use") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::testing::run_gloo(
      2,
      [](Communicator& comm, const WorldInfo&, Checker& check) {
        auto context = comm.native_context();
        check.expect(context != nullptr && context->size == 2 && context->rank == comm.rank(), "native context");
        std::vector<std::uint8_t> v(3, 1);
        comm.all_reduce(std::span<std::uint8_t>(v));
        check.expect(v[2] == 2, "all_reduce over lo");
      },
      {.timeout = 30s, .interface = "lo"});
  CHECK_MESSAGE(result.ok(), result.describe());
}

TEST_CASE("a timeout of milliseconds::max() means wait as long as it takes, not an instant failure") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result = ncclkit::testing::run_gloo(2,
                                           [](Communicator& comm, const WorldInfo& world, Checker& check) {
                                             std::vector<float> data(1001, static_cast<float>(world.rank + 1));
                                             comm.all_reduce(std::span<float>(data), ReduceOp::kSum);
                                             check.expect(data[0] == 3.0f && data[1000] == 3.0f, "sum of 1 and 2 is 3");
                                             comm.barrier();
                                           },
                                           {.timeout = std::chrono::milliseconds::max(), .hostname = "127.0.0.1"});
  CHECK_MESSAGE(result.ok(), result.describe());
}
