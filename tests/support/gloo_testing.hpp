#pragma once
// Helpers for the Gloo backend's multi-process tests: run a function in N forked ranks, each
// with a store and a communicator, and collect per-rank failures as exit codes (doctest's
// assertions do not cross a fork, so workers report through stderr and their exit status).

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "support/checker.hpp"
#include "support/element_conversions.hpp"
#include "support/summation_bound.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/gloo/communicator.hpp"

namespace ncclkit::testing {

using ncclkit_test::Checker;

/// Runs `fn(comm, world, checker)` in `nprocs` ranks, each with the spawn store and a
/// communicator made with `options`. `fn` returns nothing; the exit code is the checker's.
template <class Fn>
SpawnResult run_gloo(int nprocs, Fn fn, gloo::Options options = {},
                     std::chrono::milliseconds limit = std::chrono::seconds(120)) {
  return spawn(
      nprocs,
      [&](const WorldInfo& world) {
        auto store = make_store(world.init_url, world);
        gloo::Communicator comm(store, world, options);
        Checker checker(world.rank);
        fn(comm, world, checker);
        return checker.code();
      },
      SpawnOptions{.timeout = limit});
}

/// Machine epsilon of an element type (0 for integers).
inline double epsilon_of(DataType type) {
  switch (type) {
    case DataType::kFloat16:
      return 0x1p-10;
    case DataType::kBFloat16:
      return 0x1p-7;
    case DataType::kFloat32:
      return 0x1p-23;
    case DataType::kFloat64:
      return 0x1p-52;
    default:
      return 0.0;
  }
}

using ncclkit_test::as_double;
using ncclkit_test::from_double;

/// Random inputs for `op` that keep every reduction over `nranks` ranks in range: sums and
/// averages of integers within the type, products of integers small (factors +-1, and 2 on a
/// few ranks only), floats in [-1, 1] (products: magnitudes in [0.5, 1.5]). Never all zeros.
template <class T>
std::vector<T> random_inputs(std::size_t count, int rank, int nranks, ReduceOp op, std::uint64_t seed) {
  std::mt19937_64 rng(seed * 1000003u + static_cast<std::uint64_t>(rank) * 7919u + 17u);
  std::vector<T> values(count);
  if constexpr (std::is_integral_v<T>) {
    using Limits = std::numeric_limits<T>;
    const double max = static_cast<double>(Limits::max());
    const bool is_signed = Limits::is_signed;
    for (auto& v : values) {
      std::int64_t x = 0;
      if (op == ReduceOp::kProd) {
        // A factor 2 only on the first few ranks, so |product| <= 2^(bits-2) fits.
        const int twos = std::numeric_limits<T>::digits - 2;
        const bool two = rank < twos && (rng() % 3 == 0);
        x = two ? 2 : 1;
        if (is_signed && (rng() & 1)) x = -x;
      } else if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
        const double span = std::min(max / 2, 1e9);
        std::uniform_int_distribution<std::int64_t> d(is_signed ? -static_cast<std::int64_t>(span) : 0,
                                                      static_cast<std::int64_t>(span));
        x = d(rng);
      } else {
        const auto limit = static_cast<std::int64_t>(std::min(max / nranks, 1e9));
        std::uniform_int_distribution<std::int64_t> d(is_signed ? -limit : 0, limit);
        x = d(rng);
      }
      v = static_cast<T>(x);
    }
  } else {
    std::uniform_real_distribution<double> unit(-1.0, 1.0);
    std::uniform_real_distribution<double> magnitude(0.5, 1.5);
    for (auto& v : values) {
      double x = op == ReduceOp::kProd ? magnitude(rng) * ((rng() & 1) ? 1.0 : -1.0) : unit(rng);
      v = from_double<T>(x);
    }
  }
  return values;
}

/// The reduction of rank values in double (floats) or int64 (integers), as `T` holds it:
/// integer averages truncate.
template <class T>
double reduce_reference(const std::vector<double>& per_rank, ReduceOp op) {
  if constexpr (std::is_integral_v<T>) {
    std::int64_t acc = static_cast<std::int64_t>(per_rank[0]);
    for (std::size_t r = 1; r < per_rank.size(); ++r) {
      const auto v = static_cast<std::int64_t>(per_rank[r]);
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
      if (op == ReduceOp::kProd) acc *= v;
      if (op == ReduceOp::kMin) acc = std::min(acc, v);
      if (op == ReduceOp::kMax) acc = std::max(acc, v);
    }
    if (op == ReduceOp::kAvg) acc /= static_cast<std::int64_t>(per_rank.size());
    return static_cast<double>(acc);
  } else {
    double acc = per_rank[0];
    for (std::size_t r = 1; r < per_rank.size(); ++r) {
      const double v = per_rank[r];
      if (op == ReduceOp::kSum || op == ReduceOp::kAvg) acc += v;
      if (op == ReduceOp::kProd) acc *= v;
      if (op == ReduceOp::kMin) acc = std::min(acc, v);
      if (op == ReduceOp::kMax) acc = std::max(acc, v);
    }
    if (op == ReduceOp::kAvg) acc /= static_cast<double>(per_rank.size());
    return acc;
  }
}

/// The largest |out − ref| of one element of `op` over the ranks' values `per_rank`, as the
/// Gloo backend computes it (summation_bound.hpp): integers, min and max exact; sums and
/// products rounded once per rank after the first; averages of floats scaled by 1/n on every
/// rank first (two roundings: the factor and the product), then summed.
template <class T>
double reduce_bound(const std::vector<double>& per_rank, ReduceOp op) {
  constexpr DataType type = data_type_v<T>;
  const int n = static_cast<int>(per_rank.size());
  if (!is_floating(type) || op == ReduceOp::kMin || op == ReduceOp::kMax) return 0.0;
  if (op == ReduceOp::kProd) {
    double product = 1;
    for (double x : per_rank) product *= x;
    return ncclkit_test::product_bound(type, n, product);
  }
  double magnitude_sum = 0;
  for (double x : per_rank) magnitude_sum += std::fabs(x);
  if (op == ReduceOp::kAvg) return ncclkit_test::sum_bound(type, n, magnitude_sum / n, /*term_roundings=*/2);
  return ncclkit_test::sum_bound(type, n, magnitude_sum);
}

/// The second guard beside the element-wise bound: the tolerance of ‖out − ref‖ / ‖ref‖ for
/// `op` over `nranks` ranks. Integers, min and max are exact; sums, products and averages of
/// floats may round once per rank (and once more for the average's scaling), so
/// 4 · nranks · epsilon.
inline double tolerance_of(DataType type, ReduceOp op, int nranks) {
  if (!is_floating(type) || op == ReduceOp::kMin || op == ReduceOp::kMax) return 0.0;
  return 4.0 * nranks * epsilon_of(type);
}

/// A reduction's reference, element by element: the value and how far a correct result may
/// lie from it.
struct Reference {
  std::vector<double> value;
  std::vector<double> bound;
};

/// The reference of `op` for `count` elements, where `rank_value(r, i)` is rank r's element i
/// (as a double) of `nranks` ranks.
template <class T, class RankValue>
Reference reduce_reference_of(std::size_t count, int nranks, ReduceOp op, RankValue&& rank_value) {
  Reference reference;
  reference.value.resize(count);
  reference.bound.resize(count);
  std::vector<double> per_rank(static_cast<std::size_t>(nranks));
  for (std::size_t i = 0; i < count; ++i) {
    for (int r = 0; r < nranks; ++r) per_rank[static_cast<std::size_t>(r)] = rank_value(r, i);
    reference.value[i] = reduce_reference<T>(per_rank, op);
    reference.bound[i] = reduce_bound<T>(per_rank, op);
  }
  return reference;
}

/// Checks `got` against `want` element by element (each within its bound) and by norm-relative
/// error within `norm_tolerance`; the message on failure names what, and the first element
/// outside its bound.
template <class T>
bool expect_within(Checker& check, const T* got, const Reference& want, double norm_tolerance,
                   const std::string& what) {
  ncclkit_test::BoundCheck bounds;
  for (std::size_t i = 0; i < want.value.size(); ++i) bounds.add(i, as_double(got[i]), want.value[i], want.bound[i]);
  return check.expect(bounds.ok(norm_tolerance), what + ": " + bounds.describe(norm_tolerance));
}

/// Calls `fn.template operator()<T>()` for every element type.
template <class Fn>
void for_each_type(Fn&& fn) {
  fn.template operator()<std::int8_t>();
  fn.template operator()<std::uint8_t>();
  fn.template operator()<std::int32_t>();
  fn.template operator()<std::uint32_t>();
  fn.template operator()<std::int64_t>();
  fn.template operator()<std::uint64_t>();
  fn.template operator()<Half>();
  fn.template operator()<BFloat16>();
  fn.template operator()<float>();
  fn.template operator()<double>();
}

inline constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};

}  // namespace ncclkit::testing
