#pragma once
// Element <-> double conversions for reference computations in tests (host and GPU tests alike).
#include <type_traits>  // std::is_same_v

#include "ncclkit/core/half.hpp"

namespace ncclkit_test {

/// `value` as a double; Half and BFloat16 go through float, their exact widening.
template <class T>
double as_double(T value) {
  if constexpr (std::is_same_v<T, ncclkit::Half> || std::is_same_v<T, ncclkit::BFloat16>) {
    return static_cast<double>(static_cast<float>(value));
  } else {
    return static_cast<double>(value);
  }
}

/// `value` rounded to T (Half and BFloat16 round through float).
template <class T>
T from_double(double value) {
  if constexpr (std::is_same_v<T, ncclkit::Half> || std::is_same_v<T, ncclkit::BFloat16>) {
    return T(static_cast<float>(value));
  } else {
    return static_cast<T>(value);
  }
}

}  // namespace ncclkit_test
