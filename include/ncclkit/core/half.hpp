#pragma once
/// Host-side 16-bit floating-point storage types: `Half` (IEEE binary16) and `BFloat16`.
/// Both are trivially copyable 2-byte values with the same bit layout as CUDA's `__half` and
/// `__nv_bfloat16`, so buffers can be shared between host code and kernels. Conversions round
/// to nearest even; arithmetic happens in float.

#include <bit>          // std::bit_cast
#include <cstdint>      // std::uint16_t, std::uint32_t
#include <type_traits>  // std::is_same_v

#include "ncclkit/core/error.hpp"  // (stops a pre-C++20 build with one message)

namespace ncclkit {

/// IEEE 754 binary16.
struct Half {
  std::uint16_t bits = 0;

  Half() = default;
  /// Rounds `value` to the nearest binary16 (ties to even); overflow gives infinity.
  explicit Half(float value) : bits(from_float(value)) {}
  explicit operator float() const { return to_float(bits); }
  static constexpr Half from_bits(std::uint16_t b) {
    Half h;
    h.bits = b;
    return h;
  }

  static std::uint16_t from_float(float value) {
    std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    std::uint32_t sign = (f >> 16) & 0x8000u;
    std::uint32_t abs = f & 0x7fffffffu;
    if (abs >= 0x7f800000u) {  // inf or nan
      return static_cast<std::uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
    }
    if (abs >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
    if (abs < 0x38800000u) {                                                    // subnormal half (or zero)
      if (abs < 0x33000000u) return static_cast<std::uint16_t>(sign);           // below half of min subnormal
      std::uint32_t exponent = abs >> 23;
      std::uint32_t mantissa = (abs & 0x7fffffu) | 0x800000u;
      std::uint32_t shift = 126u - exponent;  // 14 - (exponent - 127) + 13 ... into 10-bit field
      std::uint32_t result = mantissa >> shift;
      std::uint32_t rest = mantissa & ((1u << shift) - 1u);
      std::uint32_t halfway = 1u << (shift - 1u);
      if (rest > halfway || (rest == halfway && (result & 1u))) ++result;
      return static_cast<std::uint16_t>(sign | result);
    }
    std::uint32_t result = ((abs - 0x38000000u) >> 13);
    std::uint32_t rest = abs & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (result & 1u))) ++result;
    return static_cast<std::uint16_t>(sign | result);
  }

  static float to_float(std::uint16_t h) {
    std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
    std::uint32_t exponent = (h >> 10) & 0x1fu;
    std::uint32_t mantissa = h & 0x3ffu;
    std::uint32_t f;
    if (exponent == 0x1fu) {
      f = sign | 0x7f800000u | (mantissa << 13);
    } else if (exponent != 0) {
      f = sign | ((exponent + 112u) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
      f = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        ++e;
        mantissa <<= 1;
      } while ((mantissa & 0x400u) == 0);
      f = sign | ((112u - static_cast<std::uint32_t>(e)) << 23) | ((mantissa & 0x3ffu) << 13);
    }
    return std::bit_cast<float>(f);
  }
};

/// bfloat16: the upper half of an IEEE binary32.
struct BFloat16 {
  std::uint16_t bits = 0;

  BFloat16() = default;
  /// Rounds `value` to the nearest bfloat16 (ties to even); NaN stays NaN.
  explicit BFloat16(float value) : bits(from_float(value)) {}
  explicit operator float() const { return to_float(bits); }
  static constexpr BFloat16 from_bits(std::uint16_t b) {
    BFloat16 h;
    h.bits = b;
    return h;
  }

  static std::uint16_t from_float(float value) {
    std::uint32_t f = std::bit_cast<std::uint32_t>(value);
    if ((f & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((f >> 16) | 0x40u);
    std::uint32_t rounding = 0x7fffu + ((f >> 16) & 1u);
    return static_cast<std::uint16_t>((f + rounding) >> 16);
  }
  static float to_float(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }
};

static_assert(sizeof(Half) == 2 && sizeof(BFloat16) == 2);

/// Whether `T` is one of the 16-bit floating-point storage types (arithmetic happens in float).
template <class T>
inline constexpr bool is_16bit_float_v = std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

}  // namespace ncclkit
