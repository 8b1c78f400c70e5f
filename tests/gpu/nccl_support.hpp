#pragma once
// Helpers of the NCCL GPU tests: which world sizes to run, workers that report failures
// through their exit code, deterministic random inputs, host references in higher precision
// and the comparisons (floating reductions element by element against their rounding bound,
// with a norm-relative guard; exact for integers and data movement).
//
// All CUDA work happens in spawned workers: the test process itself never initialises CUDA,
// since it forks (gpu_main.cu counts GPUs in a child for the same reason).
#include <doctest/doctest.h>

#include <algorithm>    // std::max, std::min
#include <array>        // std::array (poison bytes)
#include <bit>          // std::bit_cast
#include <chrono>       // std::chrono
#include <cmath>        // std::fabs
#include <cstdint>      // fixed-width integers
#include <cstdio>       // std::printf
#include <cstdlib>      // std::getenv, std::strtol
#include <cstring>      // std::memcmp
#include <span>         // std::span
#include <string>       // std::string
#include <type_traits>  // std::is_integral_v, std::is_same_v, std::is_signed_v, std::type_identity_t
#include <utility>      // std::pair
#include <vector>       // std::vector

#include "gpu/gpu_support.hpp"
#include "support/checker.hpp"
#include "support/element_conversions.hpp"
#include "support/reduction_bound.hpp"
#include "support/gpu_verdict.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"

namespace ncclkit_test {

using ncclkit::BFloat16;
using ncclkit::Half;
using ncclkit::ReduceOp;

/// Prints `plan`'s SKIP lines (visible in the log, counted by scripts/gpu-run.sh) and fails a
/// check for each of its failures.
inline void report_plan(const GpuPlan& plan) {
  for (const std::string& skip : plan.skips) {
    std::printf("SKIP: %s\n", skip.c_str());
    MESSAGE("skipped " << skip);
  }
  std::fflush(stdout);
  for (const std::string& failure : plan.failures) FAIL_CHECK(failure);
}

/// The world sizes 1, 2 and 4 that fit the visible GPUs (plan_world_sizes): says which are
/// skipped, and fails where NCCLKIT_TEST_REQUIRE_GPUS asks for them. NCCLKIT_TEST_WORLD_SIZES
/// (e.g. "2,4") narrows the list, for runs that need only some; one that leaves nothing to run
/// is a failure.
inline std::vector<int> world_sizes() {
  const char* list = std::getenv("NCCLKIT_TEST_WORLD_SIZES");
  if (list != nullptr && *list != '\0')
    std::printf("NCCLKIT_TEST_WORLD_SIZES=%s: testing only these world sizes\n", list);
  const GpuPlan plan =
      plan_world_sizes(std::max(visible_gpu_count(), 0), list, std::getenv("NCCLKIT_TEST_REQUIRE_GPUS"));
  report_plan(plan);
  return plan.sizes;
}

/// Whether `n` GPUs are visible; prints a visible SKIP line when not, or fails where
/// NCCLKIT_TEST_REQUIRE_GPUS asks for n or more (plan_feature).
inline bool have_gpus(int n, const char* what) {
  const GpuPlan plan =
      plan_feature(std::max(visible_gpu_count(), 0), n, what, std::getenv("NCCLKIT_TEST_REQUIRE_GPUS"));
  report_plan(plan);
  return plan.run;
}

/// Runs `fn(world, store)` in `n` worker processes (returning an exit code) and CHECKs that
/// every worker exited 0.
template <class Fn>
ncclkit::SpawnResult run_workers(int n, Fn fn, std::chrono::milliseconds timeout = std::chrono::minutes(5)) {
  auto result = ncclkit::spawn(
      n,
      [&](const ncclkit::WorldInfo& world) -> int {
        auto store = ncclkit::make_store(world.init_url, world);
        return fn(world, store);
      },
      ncclkit::SpawnOptions{.timeout = timeout});
  CHECK_MESSAGE(result.ok(), "world of " << n << ": " << result.describe());
  return result;
}

// ---- deterministic random inputs ---------------------------------------------------------

inline std::uint64_t mix(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
/// A uniform double in [0, 1) for (seed, rank, index).
inline double unit(std::uint64_t seed, int rank, std::size_t index) {
  return static_cast<double>(mix(seed * 0x100000001B3ull ^ mix(static_cast<std::uint64_t>(rank) << 40 ^ index)) >> 11) *
         0x1.0p-53;
}

template <class T>
constexpr bool is_float_v = std::is_floating_point_v<T> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

/// The range [lo, hi] of integer inputs of type T for `op`: results of up to kMaxWorld ranks
/// (prod included) stay inside the type.
template <class T>
constexpr std::pair<long, long> integer_input_range(ReduceOp op) {
  if (op == ReduceOp::kProd) {
    if constexpr (std::is_same_v<T, std::uint8_t>) return {0, 3};
    if constexpr (sizeof(T) == 1) return {-3, 3};
    return {-30, 30};
  }
  if constexpr (std::is_same_v<T, std::uint8_t>) return {0, 50};
  if constexpr (sizeof(T) == 1) return {-25, 25};
  return {-100000, 100000};
}

/// Element `index` of rank `rank`'s input. Never zero-only; ranges keep integer results of
/// up to 4 ranks inside the type (prod included) and keep products of floats well scaled.
template <class T>
T sample(std::uint64_t seed, int rank, std::size_t index, ReduceOp op) {
  const double u = unit(seed, rank, index);
  if constexpr (is_float_v<T>) {
    if (op == ReduceOp::kProd) {
      const double magnitude = 0.5 + 1.5 * u;
      return from_double<T>(unit(seed + 1, rank, index) < 0.5 ? -magnitude : magnitude);
    }
    return from_double<T>(2.0 * u - 1.0);
  } else {
    const auto [lo, hi] = integer_input_range<T>(op);
    return static_cast<T>(lo + static_cast<long>(u * static_cast<double>(hi - lo + 1)));
  }
}

template <class T>
std::vector<T> make_input(std::uint64_t seed, int rank, std::size_t count, ReduceOp op = ReduceOp::kSum) {
  std::vector<T> values(count);
  for (std::size_t i = 0; i < count; ++i) values[i] = sample<T>(seed, rank, i, op);
  return values;
}

/// Element `index` of a reduction's expected result: `value`, the reduction over ranks
/// 0..world-1 in long double (floats) or exact int64 (integers; avg truncates like C++), and
/// `magnitude`, the sum of the inputs' absolute values (what bounds a float sum's rounding).
struct Expected {
  long double value = 0;
  double magnitude = 0;
};

template <class T>
Expected expected_at(std::uint64_t seed, int world, std::size_t index, ReduceOp op) {
  const long double first = as_double(sample<T>(seed, 0, index, op));
  long double acc = first;
  double magnitude = std::fabs(static_cast<double>(first));
  for (int r = 1; r < world; ++r) {
    const long double v = as_double(sample<T>(seed, r, index, op));
    magnitude += std::fabs(static_cast<double>(v));
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg:
        acc += v;
        break;
      case ReduceOp::kProd:
        acc *= v;
        break;
      case ReduceOp::kMin:
        acc = v < acc ? v : acc;
        break;
      case ReduceOp::kMax:
        acc = v > acc ? v : acc;
        break;
    }
  }
  if (op == ReduceOp::kAvg) {
    if constexpr (is_float_v<T>) {
      acc /= world;
    } else {
      acc = static_cast<long double>(static_cast<long long>(acc) / world);
    }
  }
  return {acc, magnitude};
}

/// The reduction over ranks 0..world-1 of element `index` (at `index` in every rank's input).
template <class T>
long double reference(std::uint64_t seed, int world, std::size_t index, ReduceOp op) {
  return expected_at<T>(seed, world, index, op).value;
}

/// Norm-relative tolerance of a floating reduction over at most 4 ranks, the second guard
/// beside the element-wise bound: a few roundings of the type's unit roundoff.
template <class T>
constexpr double tolerance() {
  if constexpr (std::is_same_v<T, double>) return 1e-12;
  if constexpr (std::is_same_v<T, float>) return 1e-5;
  if constexpr (std::is_same_v<T, Half>) return 4e-3;
  if constexpr (std::is_same_v<T, BFloat16>) return 3e-2;
  return 0;
}

/// expected_at() for elements first .. first + count - 1 of a reduction over `world` ranks,
/// computed once and shared by every check of the same inputs (the matrix checks one reduction
/// on several ranks and in and out of place; the reference is most of the host's work).
struct References {
  int world = 0;
  std::vector<Expected> values;
};

template <class T>
References reference_values(std::uint64_t seed, int world, std::size_t first, std::size_t count, ReduceOp op) {
  References references{world, std::vector<Expected>(count)};
  for (std::size_t i = 0; i < count; ++i) references.values[i] = expected_at<T>(seed, world, first + i, op);
  return references;
}

namespace detail {
/// check_reduction's comparison; `expected_at(i)` is the Expected of got[i].
template <class T, class ExpectedAt>
bool check_reduction_against(Checker& checker, const std::vector<T>& got, ExpectedAt&& expected_at, int world,
                             ReduceOp op, const std::string& what) {
  if constexpr (is_float_v<T>) {
    // Every element within the rounding bound of its own reduction; the norm-relative error
    // over the whole vector as a second guard. NaN (the outputs' poison) is outside any bound.
    BoundCheck bounds;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const Expected e = expected_at(i);
      const auto exact = static_cast<double>(e.value);
      bounds.add(i, as_double(got[i]), exact, reduction_bound<T>(op, world, e.magnitude, exact));
    }
    return checker.expect(bounds.ok(tolerance<T>()), what + ": " + bounds.describe(tolerance<T>()));
  } else {
    std::size_t wrong = 0, first_wrong = 0;
    for (std::size_t i = 0; i < got.size(); ++i) {
      const long double ref = expected_at(i).value;
      const long double value = as_double(got[i]);
      const long double diff = value > ref ? value - ref : ref - value;
      if (diff > (op == ReduceOp::kAvg ? 1 : 0)) {
        if (wrong++ == 0) first_wrong = i;
      }
    }
    return checker.expect(
        wrong == 0, what + ": " + std::to_string(wrong) + " wrong elements, first at " + std::to_string(first_wrong));
  }
}
}  // namespace detail

/// Compares `got` with the reduction of the inputs (element i of the result is element
/// `first + i` of the inputs): floats element by element within their rounding bound
/// (reduction_bound; no NaN, the outputs' poison) and by norm-relative error within
/// tolerance<T>(); integers exactly (avg within 1).
template <class T>
bool check_reduction(Checker& checker, const std::vector<T>& got, std::uint64_t seed, int world, std::size_t first,
                     ReduceOp op, const std::string& what) {
  return detail::check_reduction_against(
      checker, got, [&](std::size_t i) { return expected_at<T>(seed, world, first + i, op); }, world, op, what);
}
/// The same against precomputed references (reference_values), one per element of `got`.
template <class T>
bool check_reduction(Checker& checker, const std::vector<T>& got, const References& expected, ReduceOp op,
                     const std::string& what) {
  if (got.size() != expected.values.size()) return checker.expect(false, what + ": sizes differ");
  return detail::check_reduction_against(
      checker, got, [&](std::size_t i) { return expected.values[i]; }, expected.world, op, what);
}

/// Exact comparison of moved data, byte for byte.
template <class T>
bool check_equal(Checker& checker, const std::vector<T>& got, const std::vector<T>& expected, const std::string& what) {
  if (got.size() != expected.size()) return checker.expect(false, what + ": sizes differ");
  std::size_t wrong = 0, first_wrong = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &expected[i], sizeof(T)) != 0 && wrong++ == 0) first_wrong = i;
  }
  return checker.expect(wrong == 0, what + ": " + std::to_string(wrong) + " of " + std::to_string(got.size()) +
                                        " elements differ, first at " + std::to_string(first_wrong));
}

/// Poison byte for outputs: NaN for floating types; for integers a value outside every input
/// and every result of up to kMaxWorld ranks (uint8 0xFF = 255 above sums of at most 200; int8
/// 0x80 = -128 below sums of at least -100; wider types the same pattern, far outside), so that
/// an element the collective did not write is always caught.
template <class T>
constexpr unsigned char poison_byte() {
  if constexpr (is_float_v<T>) return 0xFF;
  if constexpr (std::is_unsigned_v<T>) return 0xFF;
  return 0x80;
}

namespace detail {
/// The value of a T whose every byte is `byte`.
template <class T>
constexpr long long repeated_byte(unsigned char byte) {
  std::array<unsigned char, sizeof(T)> bytes{};
  bytes.fill(byte);
  return static_cast<long long>(std::bit_cast<T>(bytes));
}
/// Whether T's poison lies outside [world * lo, world * hi] for every op's input range and
/// every world up to kMaxWorld (sums, averages, minima and maxima lie there; products in
/// [-hi^world, hi^world], covered by the prod range's powers).
template <class T>
constexpr bool poison_outside_results() {
  const long long poison = repeated_byte<T>(poison_byte<T>());
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
    const auto [lo, hi] = integer_input_range<T>(op);
    long long low = std::min(0L, lo), high = std::max(0L, hi);
    if (op == ReduceOp::kProd) {
      const long long m = std::max(-lo, hi);
      long long power = 1;
      for (int i = 0; i < kMaxWorld; ++i) power *= m;
      low = std::is_unsigned_v<T> ? 0 : -power;
      high = power;
    } else {
      low = std::min<long long>(low * kMaxWorld, lo);
      high = std::max<long long>(high * kMaxWorld, hi);
    }
    if (poison >= low && poison <= high) return false;
  }
  return true;
}
static_assert(poison_outside_results<std::int8_t>() && poison_outside_results<std::uint8_t>() &&
                  poison_outside_results<std::int32_t>() && poison_outside_results<std::int64_t>(),
              "an integer poison value lies inside the results of the tests' inputs: an unwritten element "
              "could pass as written");
}  // namespace detail

// ---- device transfers ordered on a stream --------------------------------------------------

/// Copies `host` into `buffer` at element `offset` on `stream` and waits for the copy.
template <class T>
void upload(ncclkit::nccl::DeviceBuffer<T>& buffer, std::span<const std::type_identity_t<T>> host, cudaStream_t stream,
            std::size_t offset = 0) {
  if (host.empty()) return;
  // A default-stream handle (comm.default_stream()) names the current device's stream: make
  // it the buffer's GPU's, the stream the communicator uses it as.
  ncclkit::nccl::DeviceGuard on_buffer_gpu(buffer.device());
  NCCLKIT_CUDA_CHECK(
      cudaMemcpyAsync(buffer.data() + offset, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice, stream));
  // Pageable uploads may return before the copy ends; the host memory must outlive it.
  NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
}

/// Downloads `count` elements at `offset` after the communicator's work on `stream` (through
/// synchronize, so a failed communicator throws instead of hanging).
template <class T, class Comm>
std::vector<T> download(Comm& comm, const ncclkit::nccl::DeviceBuffer<T>& buffer, cudaStream_t stream,
                        std::size_t offset, std::size_t count) {
  std::vector<T> host(count);
  if (count != 0) {
    ncclkit::nccl::DeviceGuard on_buffer_gpu(buffer.device());  // as in upload
    NCCLKIT_CUDA_CHECK(
        cudaMemcpyAsync(host.data(), buffer.data() + offset, count * sizeof(T), cudaMemcpyDeviceToHost, stream));
  }
  comm.synchronize(stream);
  return host;
}
template <class T, class Comm>
std::vector<T> download(Comm& comm, const ncclkit::nccl::DeviceBuffer<T>& buffer, cudaStream_t stream) {
  return download(comm, buffer, stream, 0, buffer.size());
}

/// Element counts from 0 up to `max_bytes` of T: 0, 1, odd small, odd mid, and odd near the top.
template <class T>
std::vector<std::size_t> test_counts(std::size_t max_bytes = std::size_t{1} << 20) {
  std::size_t top = max_bytes / sizeof(T);
  if (top % 2 == 0) top -= 1;
  return {0, 1, 7, 1001, top};
}

inline const char* op_name(ReduceOp op) { return ncclkit::name_of(op).data(); }

template <class T>
std::string type_name() {
  return std::string(ncclkit::name_of(ncclkit::data_type_v<T>));
}

/// Calls `fn.template operator()<T>()` for every element type the tests cover.
template <class Fn>
void for_each_type(Fn&& fn) {
  fn.template operator()<std::int8_t>();
  fn.template operator()<std::uint8_t>();
  fn.template operator()<std::int32_t>();
  fn.template operator()<std::int64_t>();
  fn.template operator()<Half>();
  fn.template operator()<BFloat16>();
  fn.template operator()<float>();
  fn.template operator()<double>();
}

inline constexpr ReduceOp kAllOps[] = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};

}  // namespace ncclkit_test
