// Every collective of ncclkit::gloo::Communicator x every element type x every reduction, with
// 2, 4 and 8 real processes, against a reference computed in double (floats) or int64
// (integers) from every rank's random inputs. Checked element by element against the bound of
// gloo_testing.hpp's reduce_bound() (integers, min and max exact; float sums within
// c * u * (n - 1) * sum |x_r|, products within c * u * (n - 1) * |product|, averages like sums of
// the scaled values with two more roundings each: support/summation_bound.hpp), and by
// norm-relative error within tolerance_of() as a second guard. Data movement is bit-exact. Sizes
// 0, 1 and odd; out-of-place and in-place.
// ncclkit-test: timeout=300
#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <cstdint>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "support/gloo_testing.hpp"

using ncclkit::data_type_v;
using ncclkit::DataType;
using ncclkit::ReduceOp;
using ncclkit::TensorView;
using ncclkit::testing::as_double;
using ncclkit::testing::Checker;
using ncclkit::testing::random_inputs;
using ncclkit::testing::Reference;
using ncclkit::testing::tolerance_of;

namespace {

template <class T>
std::string label(const char* op, std::size_t count, ReduceOp reduce, bool in_place, int root = -1) {
  std::string text = std::string(op) + " " + std::string(ncclkit::name_of(data_type_v<T>)) + " " +
                     std::string(ncclkit::name_of(reduce)) + " count=" + std::to_string(count) +
                     (in_place ? " in-place" : " out-of-place");
  if (root >= 0) text += " root=" + std::to_string(root);
  return text;
}

/// Checks `got` against `want`: each element within its bound, and the norm-relative error
/// within the tolerance of `op` over `nranks` ranks.
template <class T>
void compare(Checker& check, const T* got, const Reference& want, ReduceOp op, int nranks, const std::string& what) {
  ncclkit::testing::expect_within(check, got, want, tolerance_of(data_type_v<T>, op, nranks), what);
}

/// The reference of data movement: the values themselves, exact.
Reference exact_reference(std::vector<double> values) {
  std::vector<double> zero(values.size(), 0.0);
  return Reference{std::move(values), std::move(zero)};
}

/// Runs every collective for element type T over `counts` on one communicator.
template <class T>
void exercise_type(ncclkit::gloo::Communicator& comm, Checker& check, const std::vector<std::size_t>& counts,
                   std::uint64_t seed) {
  const int n = comm.size();
  const int rank = comm.rank();
  for (std::size_t count : counts) {
    for (ReduceOp op : ncclkit::testing::kAllOps) {
      ++seed;
      // Every rank's input, so each rank can compute the reference alone.
      std::vector<std::vector<T>> inputs;
      for (int r = 0; r < n; ++r) inputs.push_back(random_inputs<T>(count * n, r, n, op, seed));
      const Reference all_reduce_ref = ncclkit::testing::reduce_reference_of<T>(
          count, n, op, [&](int r, std::size_t i) { return as_double(inputs[r][i]); });
      const Reference reduce_scatter_ref = ncclkit::testing::reduce_reference_of<T>(
          count, n, op,
          [&](int r, std::size_t i) { return as_double(inputs[r][static_cast<std::size_t>(rank) * count + i]); });
      const std::vector<T>& mine = inputs[rank];

      for (bool in_place : {false, true}) {
        // all_reduce
        {
          std::vector<T> in(mine.begin(), mine.begin() + count), out(count);
          if (in_place) {
            comm.all_reduce(std::span<T>(in), op);
            compare(check, in.data(), all_reduce_ref, op, n, label<T>("all_reduce", count, op, true));
          } else {
            comm.all_reduce(std::span<const T>(in), std::span<T>(out), op);
            compare(check, out.data(), all_reduce_ref, op, n, label<T>("all_reduce", count, op, false));
            check.expect(std::equal(in.begin(), in.end(), mine.begin(),
                                    [](T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; }),
                         label<T>("all_reduce", count, op, false) + ": input was modified");
          }
        }
        // reduce, at a root that moves with the seed; non-roots pass no output half the time
        {
          const int root = static_cast<int>(seed % static_cast<std::uint64_t>(n));
          std::vector<T> in(mine.begin(), mine.begin() + count), out(count);
          if (in_place) {
            comm.reduce(TensorView::of(in.data(), count), TensorView::of(in.data(), count), op, root);
            if (rank == root)
              compare(check, in.data(), all_reduce_ref, op, n, label<T>("reduce", count, op, true, root));
          } else {
            const bool give_out = rank == root || (seed & 1);
            comm.reduce(TensorView::of(in.data(), count), give_out ? TensorView::of(out.data(), count) : TensorView{},
                        op, root);
            if (rank == root)
              compare(check, out.data(), all_reduce_ref, op, n, label<T>("reduce", count, op, false, root));
          }
        }
        // reduce_scatter: every rank's input has n chunks of `count`
        {
          std::vector<T> in(mine.begin(), mine.begin() + count * n), out(count);
          if (in_place) {
            T* slice = in.data() + static_cast<std::size_t>(rank) * count;
            comm.reduce_scatter(TensorView::of(in.data(), count * n), TensorView::of(slice, count), op);
            compare(check, slice, reduce_scatter_ref, op, n, label<T>("reduce_scatter", count, op, true));
          } else {
            comm.reduce_scatter(std::span<const T>(in), std::span<T>(out), op);
            compare(check, out.data(), reduce_scatter_ref, op, n, label<T>("reduce_scatter", count, op, false));
          }
        }
      }
    }

    // Data movement, once per count. Results must be bit-exact: bounds 0, and kMin's tolerance, 0.
    ++seed;
    std::vector<std::vector<T>> inputs;
    for (int r = 0; r < n; ++r) inputs.push_back(random_inputs<T>(count, r, n, ReduceOp::kSum, seed));
    const std::vector<T>& mine = inputs[rank];
    for (bool in_place : {false, true}) {
      // broadcast
      {
        const int root = static_cast<int>(seed % static_cast<std::uint64_t>(n));
        std::vector<double> want(count);
        for (std::size_t i = 0; i < count; ++i) want[i] = as_double(inputs[root][i]);
        std::vector<T> in(mine), out(count);
        if (in_place) {
          comm.broadcast(std::span<T>(in), root);
          compare(check, in.data(), exact_reference(want), ReduceOp::kMin, n,
                  label<T>("broadcast", count, ReduceOp::kSum, true, root));
        } else {
          comm.broadcast(std::span<const T>(in), std::span<T>(out), root);
          compare(check, out.data(), exact_reference(want), ReduceOp::kMin, n,
                  label<T>("broadcast", count, ReduceOp::kSum, false, root));
        }
      }
      // all_gather
      {
        std::vector<double> want;
        for (int r = 0; r < n; ++r)
          for (std::size_t i = 0; i < count; ++i) want.push_back(as_double(inputs[r][i]));
        std::vector<T> out(count * n);
        if (in_place) {
          std::copy(mine.begin(), mine.end(), out.begin() + static_cast<std::ptrdiff_t>(rank * count));
          comm.all_gather(TensorView::of(out.data() + rank * count, count), TensorView::of(out.data(), out.size()));
        } else {
          comm.all_gather(std::span<const T>(mine), std::span<T>(out));
        }
        compare(check, out.data(), exact_reference(want), ReduceOp::kMin, n,
                label<T>("all_gather", count, ReduceOp::kSum, in_place));
      }
      // all_gather_uneven: rank r contributes (count + 3r) mod (count + 4) elements; rank 1 none
      {
        std::vector<std::size_t> counts(static_cast<std::size_t>(n));
        for (int r = 0; r < n; ++r) counts[r] = r == 1 ? 0 : (count + 3 * static_cast<std::size_t>(r)) % (count + 4);
        std::vector<std::vector<T>> parts;
        for (int r = 0; r < n; ++r) parts.push_back(random_inputs<T>(counts[r], r, n, ReduceOp::kSum, seed + 99));
        std::vector<double> want;
        for (int r = 0; r < n; ++r)
          for (const T& v : parts[r]) want.push_back(as_double(v));
        const std::size_t total = want.size();
        const std::size_t before = std::accumulate(counts.begin(), counts.begin() + rank, std::size_t{0});
        std::vector<T> out(total);
        if (in_place) {
          std::copy(parts[rank].begin(), parts[rank].end(), out.begin() + static_cast<std::ptrdiff_t>(before));
          comm.all_gather_uneven(TensorView::of(out.data() + before, counts[rank]), TensorView::of(out.data(), total),
                                 counts);
        } else {
          comm.all_gather_uneven(std::span<const T>(parts[rank]), std::span<T>(out), counts);
        }
        compare(check, out.data(), exact_reference(want), ReduceOp::kMin, n,
                label<T>("all_gather_uneven", total, ReduceOp::kSum, in_place));
      }
    }
  }
}

void exercise_all(int nprocs, const std::vector<std::size_t>& counts) {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto result =
      ncclkit::testing::run_gloo(nprocs,
                                 [&](ncclkit::gloo::Communicator& comm, const ncclkit::WorldInfo&, Checker& check) {
                                   std::uint64_t seed = 1000;
                                   ncclkit::testing::for_each_type([&]<class T>() {
                                     exercise_type<T>(comm, check, counts, seed);
                                     seed += 10000;
                                   });
                                   comm.barrier();
                                 },
                                 {.timeout = std::chrono::seconds(60)});
  CHECK_MESSAGE(result.ok(), result.describe());
}

}  // namespace

TEST_CASE("every collective, type and reduction is right with 2 processes (sizes 0, 1, 1001)") {
  exercise_all(2, {0, 1, 1001});
}

TEST_CASE("every collective, type and reduction is right with 4 processes (sizes 0, 1, 257)") {
  exercise_all(4, {0, 1, 257});
}

TEST_CASE("every collective, type and reduction is right with 8 processes (sizes 1, 33)") { exercise_all(8, {1, 33}); }
