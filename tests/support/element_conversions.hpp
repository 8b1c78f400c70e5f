#pragma once
// Element <-> double conversions for reference computations in tests (host and GPU tests alike).
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

}  // namespace ncclkit_test
