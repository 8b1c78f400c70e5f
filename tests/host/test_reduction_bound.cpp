// The element-wise bounds of the GPU tests' reductions (tests/support/reduction_bound.hpp, on
// summation_bound.hpp): they hold for reductions rounded the way NCCL rounds them, in any order,
// and fail a result that misses one rank's input in a few elements, which the norm-relative
// check they replace let through.
#include <doctest/doctest.h>

#include <cmath>    // std::fabs
#include <cstdint>  // std::uint64_t
#include <vector>   // std::vector

#include "support/element_conversions.hpp"
#include "support/reduction_bound.hpp"
#include "support/summation_bound.hpp"

namespace {

using ncclkit::BFloat16;
using ncclkit::DataType;
using ncclkit::Half;
using ncclkit::ReduceOp;
using ncclkit_test::as_double;
using ncclkit_test::BoundCheck;
using ncclkit_test::reduction_bound;
using ncclkit_test::round_nearest_even;

/// Every rank's inputs for `count` elements, uniform in [-1, 1) and rounded to T.
template <class T>
std::vector<std::vector<T>> inputs(int world, std::size_t count, std::uint64_t seed) {
  std::vector<std::vector<T>> all(static_cast<std::size_t>(world), std::vector<T>(count));
  std::uint64_t state = seed;
  for (auto& rank : all) {
    for (T& value : rank) {
      std::uint64_t x = (state += 0x9E3779B97F4A7C15ull);  // splitmix64
      x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
      x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
      x ^= x >> 31;
      value = ncclkit_test::from_double<T>(static_cast<double>(x >> 11) * 0x1p-52 - 1.0);
    }
  }
  return all;
}

/// a + b rounded once to T (exact in double for these inputs, then rounded once), as a GPU's
/// 16-bit addition does.
template <class T>
T add_rounded(T a, T b) {
  if constexpr (ncclkit::is_16bit_float_v<T>) {
    return round_nearest_even<T>(as_double(a) + as_double(b));
  } else {
    return a + b;
  }
}

/// A ring all_reduce (sum) of element i as NCCL computes it: starting at a rank that depends on
/// the element's chunk, each hop adds its input and rounds. `add` rounds one addition.
template <class T, class Add>
std::vector<T> ring_sum(const std::vector<std::vector<T>>& all, Add&& add) {
  const std::size_t world = all.size(), count = all[0].size();
  std::vector<T> result(count);
  for (std::size_t i = 0; i < count; ++i) {
    const std::size_t start = (i / 97) % world;
    T acc = all[start][i];
    for (std::size_t step = 1; step < world; ++step) acc = add(acc, all[(start + step) % world][i]);
    result[i] = acc;
  }
  return result;
}

/// The exact sums over the ranks, and the sums of absolute values, of every element.
struct Sums {
  std::vector<double> exact, magnitude;
  int world = 0;
};
template <class T>
Sums sums_of(const std::vector<std::vector<T>>& all) {
  Sums sums{std::vector<double>(all[0].size(), 0.0), std::vector<double>(all[0].size(), 0.0),
            static_cast<int>(all.size())};
  for (const auto& rank : all) {
    for (std::size_t i = 0; i < rank.size(); ++i) {
      sums.exact[i] += as_double(rank[i]);  // exact: at most 8 values of 8 to 24 bits in [-1, 1)
      sums.magnitude[i] += std::fabs(as_double(rank[i]));
    }
  }
  return sums;
}

/// `got` against the sums, each element within reduction_bound (sum), and by norm.
template <class T>
BoundCheck check_sum(const std::vector<T>& got, const Sums& sums) {
  BoundCheck check;
  for (std::size_t i = 0; i < got.size(); ++i) {
    check.add(i, as_double(got[i]), sums.exact[i],
              reduction_bound<T>(ReduceOp::kSum, sums.world, sums.magnitude[i], sums.exact[i]));
  }
  return check;
}

/// The largest |got - exact| / bound: a correctly rounded sum reaches at most 1/c of the bound
/// (each of its n - 1 roundings errs by at most u times a partial sum, so by u * sum |x_r|).
template <class T>
double worst_ratio(const std::vector<T>& got, const Sums& sums) {
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double bound = reduction_bound<T>(ReduceOp::kSum, sums.world, sums.magnitude[i], sums.exact[i]);
    if (bound > 0) worst = std::max(worst, std::fabs(as_double(got[i]) - sums.exact[i]) / bound);
  }
  return worst;
}

}  // namespace

TEST_CASE("sums rounded at every hop, in any order, stay inside the element-wise bound on 2 to 8 ranks") {
  for (int world : {2, 3, 4, 8}) {
    CAPTURE(world);
    const std::size_t count = 20000;
    {
      const auto all = inputs<Half>(world, count, 100 + static_cast<std::uint64_t>(world));
      const Sums sums = sums_of(all);
      const auto got = ring_sum(all, add_rounded<Half>);
      const BoundCheck check = check_sum(got, sums);
      CHECK_MESSAGE(check.outside() == 0, "Half: " << check.describe(1.0));
      CHECK(worst_ratio(got, sums) <= 1.0 / ncclkit_test::kBoundSlack);
    }
    {
      const auto all = inputs<BFloat16>(world, count, 200 + static_cast<std::uint64_t>(world));
      const Sums sums = sums_of(all);
      const auto once = check_sum(ring_sum(all, add_rounded<BFloat16>), sums);
      CHECK_MESSAGE(once.outside() == 0, "bf16: " << once.describe(1.0));
      // NCCL's bf16 addition: in float, then rounded to bf16 (two roundings).
      const auto through_float = check_sum(
          ring_sum(all, [](BFloat16 a, BFloat16 b) { return BFloat16(static_cast<float>(a) + static_cast<float>(b)); }),
          sums);
      CHECK_MESSAGE(through_float.outside() == 0, "bf16 through float: " << through_float.describe(1.0));
    }
    {
      const auto all = inputs<float>(world, count, 300 + static_cast<std::uint64_t>(world));
      const auto check = check_sum(ring_sum(all, add_rounded<float>), sums_of(all));
      CHECK_MESSAGE(check.outside() == 0, "float: " << check.describe(1.0));
    }
  }
}

// The audit's case: 524,287 elements on 4 ranks, the last 1,500 (bf16) or 30 (Half) elements of
// the result missing rank 3's input. Their norm-relative error stays under the tolerance the GPU
// tests used before (3e-2, 4e-3); the element-wise bound catches nearly every one.
template <class T>
void check_missing_input(std::size_t wrong, double old_tolerance, std::uint64_t seed) {
  const std::size_t count = 524287;
  const auto all = inputs<T>(4, count, seed);
  const Sums sums = sums_of(all);
  auto got = ring_sum(all, add_rounded<T>);
  REQUIRE(check_sum(got, sums).outside() == 0);
  for (std::size_t i = count - wrong; i < count; ++i)
    got[i] = add_rounded(add_rounded(all[0][i], all[1][i]), all[2][i]);
  const BoundCheck check = check_sum(got, sums);
  CHECK(check.relative_error() <= old_tolerance);
  CHECK_FALSE(check.ok(old_tolerance));
  CHECK(check.outside() >= wrong * 9 / 10);
  CHECK(check.outside() <= wrong);
  MESSAGE(wrong << " elements missing rank 3: " << check.describe(old_tolerance) << "; norm-relative error "
                << check.relative_error());
}

TEST_CASE("a bf16 all_reduce whose last 1,500 elements miss one rank's input fails element by element") {
  check_missing_input<BFloat16>(1500, 3e-2, 5);
}

TEST_CASE("a Half all_reduce whose last 30 elements miss one rank's input fails element by element") {
  check_missing_input<Half>(30, 4e-3, 6);
}

TEST_CASE("averages, products, minima and maxima get the bound of their own roundings") {
  const int world = 4;
  const std::size_t count = 20000;
  const auto all = inputs<BFloat16>(world, count, 9);
  const auto value = [&](int r, std::size_t i) { return as_double(all[static_cast<std::size_t>(r)][i]); };
  // Average, premultiplied by 1/4 (exact) then summed hop by hop; and summed, then divided.
  std::vector<double> premultiplied(count), divided(count), reference(count), magnitude(count);
  for (std::size_t i = 0; i < count; ++i) {
    BFloat16 acc = round_nearest_even<BFloat16>(value(0, i) / world);
    double sum = value(0, i);
    BFloat16 total = all[0][i];
    magnitude[i] = std::fabs(value(0, i));
    for (int r = 1; r < world; ++r) {
      acc = add_rounded(acc, round_nearest_even<BFloat16>(value(r, i) / world));
      total = add_rounded(total, all[static_cast<std::size_t>(r)][i]);
      sum += value(r, i);
      magnitude[i] += std::fabs(value(r, i));
    }
    premultiplied[i] = as_double(acc);
    divided[i] = as_double(round_nearest_even<BFloat16>(as_double(total) / world));
    reference[i] = sum / world;
  }
  const auto check_average = [&](double scale, const std::vector<double>& got) {
    BoundCheck check;
    for (std::size_t i = 0; i < count; ++i) {
      check.add(i, got[i] * scale, reference[i],
                reduction_bound<BFloat16>(ReduceOp::kAvg, world, magnitude[i], reference[i]));
    }
    return check;
  };
  CHECK_MESSAGE(check_average(1, premultiplied).outside() == 0, check_average(1, premultiplied).describe(1.0));
  CHECK_MESSAGE(check_average(1, divided).outside() == 0, check_average(1, divided).describe(1.0));
  // A sum where an average was asked for is far outside; so is an average over n - 1.
  CHECK(check_average(world, divided).outside() > count / 2);
  CHECK(check_average(static_cast<double>(world) / (world - 1), divided).outside() > count / 2);
  // Products: relative to the result; min and max: exact.
  CHECK(reduction_bound<BFloat16>(ReduceOp::kProd, world, 3.0, -0.5) >= 3 * 0x1p-8 * 0.5);
  CHECK(reduction_bound<BFloat16>(ReduceOp::kProd, world, 3.0, -0.5) <= 2 * 3 * 0x1p-8 * 0.5 * 1.001);
  CHECK(reduction_bound<float>(ReduceOp::kMax, world, 3.0, 0.5) == 0.0);
  CHECK(reduction_bound<Half>(ReduceOp::kMin, world, 3.0, 0.5) == 0.0);
  // A sum of one rank is a copy: exact.
  CHECK(reduction_bound<float>(ReduceOp::kSum, 1, 3.0, 3.0) == 0.0);
}

TEST_CASE("a float32 average that crossed in 16 bits stays inside the compressed bound, and one rank's loss does not") {
  // The separate casts of GradientSync: scale by 1/n in float, cast to fp16, add hop by hop in
  // fp16, cast back. N(0, 1e-3)-like values: many fall below fp16's smallest normal once scaled.
  const int world = 4;
  const std::size_t count = 20000;
  const auto all = inputs<float>(world, count, 13);
  BoundCheck good, lost;
  for (std::size_t i = 0; i < count; ++i) {
    double average = 0, magnitude = 0;
    Half acc{}, without_last{};
    for (int r = 0; r < world; ++r) {
      const double x = all[static_cast<std::size_t>(r)][i] * 2e-3;
      average += x / world;
      magnitude += std::fabs(x) / world;
      const Half encoded = round_nearest_even<Half>(static_cast<float>(x) * (1.0f / world));
      acc = r == 0 ? encoded : add_rounded(acc, encoded);
      if (r == world - 2) without_last = acc;
    }
    const double bound = ncclkit_test::compressed_average_bound(DataType::kFloat16, world, magnitude);
    good.add(i, as_double(acc), average, bound);
    lost.add(i, as_double(without_last), average, bound);
  }
  CHECK_MESSAGE(good.outside() == 0, good.describe(1e-3));
  CHECK(lost.outside() > count * 9 / 10);
}
