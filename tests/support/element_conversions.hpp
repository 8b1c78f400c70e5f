#pragma once
// Element <-> double conversions for reference computations in tests (host and GPU tests alike).
#include <cmath>        // std::isfinite, std::frexp, std::ldexp, std::nearbyint, std::fabs, std::copysign
#include <limits>       // std::numeric_limits
#include <type_traits>  // std::is_same_v

#include "ncclkit/core/half.hpp"

namespace ncclkit_test {

/// `value` as a double; Half and BFloat16 go through float, their exact widening.
template <class T>
double as_double(T value) {
  if constexpr (ncclkit::is_16bit_float_v<T>) {
    return static_cast<double>(static_cast<float>(value));
  } else {
    return static_cast<double>(value);
  }
}

/// `value` rounded to T (Half and BFloat16 round through float).
template <class T>
T from_double(double value) {
  if constexpr (ncclkit::is_16bit_float_v<T>) {
    return T(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

/// `value` rounded once to the nearest Half or BFloat16, ties to even, overflow to infinity:
/// the reference for a cast from double, which from_double (through float) misses where the
/// first rounding lands on a tie of the second.
template <class T>
T round_nearest_even(double value) {
  static_assert(ncclkit::is_16bit_float_v<T>, "round_nearest_even: Half or BFloat16");
  constexpr int kSignificandBits = std::is_same_v<T, ncclkit::Half> ? 11 : 8;
  constexpr int kMinExponent = std::is_same_v<T, ncclkit::Half> ? -14 : -126;  // of the smallest normal
  const double largest = std::is_same_v<T, ncclkit::Half> ? 65504.0 : 0x1.fep127;
  if (!std::isfinite(value) || value == 0) return T(static_cast<float>(value));
  int exponent = 0;
  (void)std::frexp(value, &exponent);  // |value| in [2^(exponent-1), 2^exponent)
  // The spacing of T's values around `value`; subnormals share the smallest normals' spacing.
  const int spacing = (exponent - 1 > kMinExponent ? exponent - 1 : kMinExponent) - (kSignificandBits - 1);
  // Scaling by a power of two is exact; nearbyint rounds to an integer, ties to even (the
  // default rounding mode).
  const double rounded = std::ldexp(std::nearbyint(std::ldexp(value, -spacing)), spacing);
  if (std::fabs(rounded) > largest) {
    return T(static_cast<float>(std::copysign(std::numeric_limits<double>::infinity(), value)));
  }
  return T(static_cast<float>(rounded));  // exact: `rounded` is a value of T
}

}  // namespace ncclkit_test
