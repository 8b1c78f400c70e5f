// Element conversions of the tests' references (tests/support/element_conversions.hpp):
// round_nearest_even rounds a double once to Half or BFloat16, as the GPU's casts from double
// do, where rounding through float (from_double) rounds twice.
#include <doctest/doctest.h>

#include <bit>      // std::bit_cast
#include <cmath>    // std::ldexp, std::nextafter, std::isinf, std::isfinite, std::signbit
#include <cstdint>  // std::uint16_t, std::uint32_t, std::uint64_t
#include <random>   // std::mt19937_64, std::uniform_int_distribution

#include "support/element_conversions.hpp"

namespace {

using ncclkit::BFloat16;
using ncclkit::Half;
using ncclkit_test::round_nearest_even;

template <class T>
std::uint16_t bits_of(T value) {
  return value.bits;
}

}  // namespace

TEST_CASE("round_nearest_even rounds a double once to the nearest Half, as the compiler's _Float16 does") {
  std::mt19937_64 random(7);
  std::uniform_int_distribution<std::uint64_t> any_bits;
  long checked = 0, wrong = 0;
  double first_wrong = 0;
  const auto check_one = [&](double value) {
    const auto expected = std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
    ++checked;
    if (bits_of(round_nearest_even<Half>(value)) != expected && wrong++ == 0) first_wrong = value;
  };
  // Doubles of every exponent that matters (subnormal Half to overflow), with random
  // significands, and around every tie of Half's values.
  for (int i = 0; i < 200000; ++i) {
    const double significand = 1.0 + static_cast<double>(any_bits(random) >> 12) * 0x1p-52;
    const int exponent = static_cast<int>(any_bits(random) % 50) - 30;
    check_one((i % 2 ? -1.0 : 1.0) * std::ldexp(significand, exponent));
  }
  for (std::uint32_t bits = 0; bits < 0x7c00; ++bits) {
    const double value = Half::to_float(static_cast<std::uint16_t>(bits));
    const double next = Half::to_float(static_cast<std::uint16_t>(bits + 1));
    const double tie = value + (next - value) / 2;
    for (double v : {value, tie, std::nextafter(tie, 0.0), std::nextafter(tie, 1e9), -tie}) check_one(v);
  }
  for (double v : {65504.0, 65519.999, 65520.0, 1e10, -1e10, 0x1p-24, 0x1p-25, 0x1.000001p-25, 0.0, -0.0}) check_one(v);
  CHECK_MESSAGE(wrong == 0, wrong << " of " << checked << " values rounded otherwise, first " << first_wrong);
  CHECK(checked > 300000);
  CHECK(std::isinf(static_cast<float>(round_nearest_even<Half>(65520.0))));
  CHECK(std::signbit(static_cast<float>(round_nearest_even<Half>(-0.0))));
}

TEST_CASE("round_nearest_even rounds once where rounding through float rounds twice") {
  // 1 + 2^-11 + 2^-40: just above the tie between 1 and 1 + 2^-10. Through float it becomes the
  // tie itself (1 + 2^-11), which then goes to the even neighbour, 1.
  const double above_tie = 1.0 + 0x1p-11 + 0x1p-40;
  CHECK(static_cast<float>(round_nearest_even<Half>(above_tie)) == 1.0f + 0x1p-10f);
  CHECK(static_cast<float>(ncclkit_test::from_double<Half>(above_tie)) == 1.0f);
  // The same for bfloat16 around 1 + 2^-8.
  const double bf_above_tie = 1.0 + 0x1p-8 + 0x1p-40;
  CHECK(static_cast<float>(round_nearest_even<BFloat16>(bf_above_tie)) == 1.0f + 0x1p-7f);
  CHECK(static_cast<float>(ncclkit_test::from_double<BFloat16>(bf_above_tie)) == 1.0f);
}

TEST_CASE("round_nearest_even rounds a double once to the nearest BFloat16, ties to even") {
  // Where the double is a float, rounding through float is exact: BFloat16(float) is the
  // reference (tested against the rules in test_half).
  std::mt19937_64 random(11);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  long wrong = 0;
  for (int i = 0; i < 200000; ++i) {
    const float value = std::bit_cast<float>(any_bits(random));
    if (std::isfinite(value) && bits_of(round_nearest_even<BFloat16>(value)) != bits_of(BFloat16(value))) ++wrong;
  }
  CHECK(wrong == 0);
  CHECK(bits_of(round_nearest_even<BFloat16>(1.0 + 0x1p-8)) == 0x3f80);      // tie: to even, down
  CHECK(bits_of(round_nearest_even<BFloat16>(1.0 + 3 * 0x1p-8)) == 0x3f82);  // tie: to even, up
  CHECK(std::isinf(static_cast<float>(round_nearest_even<BFloat16>(0x1.ffp127))));
  CHECK(static_cast<float>(round_nearest_even<BFloat16>(0x1.fep127)) == 0x1.fep127f);
  CHECK(bits_of(round_nearest_even<BFloat16>(0x1p-133)) == 0x0001);  // the smallest subnormal
  CHECK(bits_of(round_nearest_even<BFloat16>(0x1p-134)) == 0x0000);  // its tie with zero: even
}
