// Tests of ncclkit/core/half.hpp against the compiler's own _Float16 and exact bfloat16 rules.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <random>

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/half.hpp"

using ncclkit::BFloat16;
using ncclkit::Half;

TEST_CASE("Half to float is exact for every one of the 65536 bit patterns") {
  for (std::uint32_t bits = 0; bits < 65536; ++bits) {
    _Float16 reference = std::bit_cast<_Float16>(static_cast<std::uint16_t>(bits));
    float expected = static_cast<float>(reference);
    float got = Half::to_float(static_cast<std::uint16_t>(bits));
    if (std::isnan(expected)) {
      CHECK(std::isnan(got));
    } else {
      CHECK(std::bit_cast<std::uint32_t>(got) == std::bit_cast<std::uint32_t>(expected));
    }
  }
}

TEST_CASE("float to Half rounds to nearest even like the compiler, on random and edge values") {
  std::mt19937 rng(1234);
  std::uniform_int_distribution<std::uint32_t> any_bits;
  auto check_one = [](float value) {
    _Float16 reference = static_cast<_Float16>(value);
    std::uint16_t expected = std::bit_cast<std::uint16_t>(reference);
    std::uint16_t got = Half::from_float(value);
    if (std::isnan(value)) {
      CHECK((got & 0x7c00u) == 0x7c00u);
      CHECK((got & 0x3ffu) != 0);
    } else {
      CHECK_MESSAGE(got == expected, "value " << value);
    }
  };
  for (int i = 0; i < 200000; ++i) check_one(std::bit_cast<float>(any_bits(rng)));
  // Around every half value: exact, halfway above and below, and a hair off halfway.
  for (std::uint32_t bits = 0; bits < 0x7c00; ++bits) {
    float value = Half::to_float(static_cast<std::uint16_t>(bits));
    float next = Half::to_float(static_cast<std::uint16_t>(bits + 1));
    float mid = value + (next - value) / 2;
    for (float v : {value, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), -value, -mid}) check_one(v);
  }
  for (float v : {65504.0f, 65519.99f, 65520.0f, 1e10f, -1e10f, 5.96e-8f, 2.98e-8f, 2.99e-8f, 0.0f, -0.0f})
    check_one(v);
}

TEST_CASE("BFloat16 keeps the upper half with round to nearest even") {
  CHECK(BFloat16::from_float(1.0f) == 0x3f80);
  CHECK(BFloat16::to_float(0x3f80) == 1.0f);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
  CHECK(BFloat16::from_float(1.0f + 0.00390625f) == 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: ties to even (up).
  CHECK(BFloat16::from_float(1.0f + 3 * 0.00390625f) == 0x3f82);
  CHECK(std::isnan(BFloat16::to_float(BFloat16::from_float(std::nanf("")))));
  std::mt19937 rng(99);
  std::uniform_real_distribution<float> dist(-1e6f, 1e6f);
  for (int i = 0; i < 100000; ++i) {
    float v = dist(rng);
    float back = BFloat16::to_float(BFloat16::from_float(v));
    CHECK(std::fabs(back - v) <= std::fabs(v) * (1.0f / 256.0f));
  }
}

TEST_CASE("data types map to sizes and nccl-tests names") {
  using namespace ncclkit;
  CHECK(data_type_v<float> == DataType::kFloat32);
  CHECK(data_type_v<Half> == DataType::kFloat16);
  CHECK(data_type_v<const std::int64_t> == DataType::kInt64);
  CHECK(size_of(DataType::kBFloat16) == 2);
  CHECK(size_of(DataType::kFloat64) == 8);
  CHECK(name_of(DataType::kFloat32) == "float");
  CHECK(name_of(ReduceOp::kAvg) == "avg");
}
