#pragma once
// Element-wise error bounds of reductions computed in floating point, and a check that applies
// them element by element. A norm-relative error over a whole vector lets a few wrong elements
// through (a norm of 16-bit roundings is large enough to hide them); a bound per element does
// not. Host code with no backend, so that the Gloo tests and the GPU tests can share it.
//
// The bound of a sum of n values x_r, each addition rounded to a type of unit roundoff u, in any
// order or tree: |computed - exact| <= gamma(n - 1) * sum |x_r|, gamma(k) = k u / (1 - k u)
// (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2). The tests use
// c * u * (n - 1) * sum |x_r| with c = kBoundSlack, which covers gamma's higher-order terms and
// the double rounding of 16-bit sums computed in float and rounded back.

#include <cmath>    // std::fabs, std::sqrt
#include <cstddef>  // std::size_t
#include <cstdio>   // std::snprintf
#include <limits>   // std::numeric_limits
#include <string>   // std::string, std::to_string

#include "ncclkit/core/dtype.hpp"

namespace ncclkit_test {

/// The unit roundoff u of a floating element type: half the distance from 1 to the next value,
/// 2^-p for p significand bits (the implicit one included). 0 for integer types (exact).
constexpr double unit_roundoff(ncclkit::DataType type) {
  switch (type) {
    case ncclkit::DataType::kFloat16:
      return 0x1p-11;
    case ncclkit::DataType::kBFloat16:
      return 0x1p-8;
    case ncclkit::DataType::kFloat32:
      return 0x1p-24;
    case ncclkit::DataType::kFloat64:
      return 0x1p-53;
    default:
      return 0.0;
  }
}

/// Half the smallest positive (subnormal) value of a floating element type: the largest error
/// of one rounding into the subnormal range, where u no longer bounds the relative error (a
/// product or a scaling can land there; a sum of values of the type cannot round there).
constexpr double underflow_unit(ncclkit::DataType type) {
  switch (type) {
    case ncclkit::DataType::kFloat16:
      return 0x1p-25;
    case ncclkit::DataType::kBFloat16:
      return 0x1p-134;
    case ncclkit::DataType::kFloat32:
      return 0x1p-150;
    case ncclkit::DataType::kFloat64:
      return 0x1p-1074;  // half of it is no double: the smallest one bounds it
    default:
      return 0.0;
  }
}

/// The factor c over the first-order worst case (see the top of this file).
inline constexpr double kBoundSlack = 2.0;

/// The largest |computed - exact| of one element of a sum of `terms` values of `type`, each
/// addition rounded to `type`: c * u * (terms - 1 + term_roundings) * magnitude_sum.
/// `magnitude_sum` is sum |x_r| of the terms as they are summed (for an average pre-scaled by
/// 1/n: sum |x_r| / n). `term_roundings` is how many roundings each term went through before
/// the sum (a scaling by a rounded factor: 2), each also allowed an underflow.
constexpr double sum_bound(ncclkit::DataType type, int terms, double magnitude_sum, int term_roundings = 0) {
  const double u = unit_roundoff(type);
  const double roundings = static_cast<double>(terms - 1 + term_roundings);
  return kBoundSlack * (u * roundings * magnitude_sum + terms * term_roundings * underflow_unit(type));
}

/// The largest |computed - exact| of one element of a product of `terms` values of `type`,
/// each multiplication rounded to `type`: c * u * (terms - 1) * |exact| (plus an underflow per
/// multiplication).
constexpr double product_bound(ncclkit::DataType type, int terms, double exact) {
  const double u = unit_roundoff(type);
  const double multiplications = static_cast<double>(terms - 1);
  return kBoundSlack * multiplications * (u * (exact < 0 ? -exact : exact) + underflow_unit(type));
}

/// Compares results with references element by element, each against its own bound, and keeps
/// the norm-relative error ||got - want|| / ||want|| for a second guard. A NaN result is
/// outside every bound.
class BoundCheck {
 public:
  /// Records element `index`: `got` against `want`, allowed `bound`.
  void add(std::size_t index, double got, double want, double bound) {
    ++elements_;
    const double difference = got - want;
    if (!(std::fabs(difference) <= bound)) {
      if (outside_ == 0) {
        first_index_ = index;
        first_got_ = got;
        first_want_ = want;
        first_bound_ = bound;
      }
      ++outside_;
    }
    squared_difference_ += difference * difference;
    squared_norm_ += want * want;
  }

  std::size_t elements() const { return elements_; }
  /// How many elements lie outside their bound.
  std::size_t outside() const { return outside_; }
  /// ||got - want|| / ||want||: 0 when both are zero, infinity when only want is.
  double relative_error() const {
    if (squared_norm_ == 0) return squared_difference_ == 0 ? 0.0 : std::numeric_limits<double>::infinity();
    return std::sqrt(squared_difference_ / squared_norm_);
  }
  /// Every element within its bound, and the norm-relative error within `norm_tolerance`.
  bool ok(double norm_tolerance) const { return outside_ == 0 && relative_error() <= norm_tolerance; }

  /// What failed, for a test's message: the count outside their bound, the first of them, and
  /// the norm-relative error.
  std::string describe(double norm_tolerance) const {
    std::string text;
    if (outside_ > 0) {
      text += std::to_string(outside_) + " of " + std::to_string(elements_) + " elements outside their bound; first [" +
              std::to_string(first_index_) + "]: got " + number(first_got_) + ", want " + number(first_want_) +
              ", |difference| " + number(std::fabs(first_got_ - first_want_)) + " > bound " + number(first_bound_);
    }
    if (!(relative_error() <= norm_tolerance)) {
      if (!text.empty()) text += "; ";
      text += "norm-relative error " + number(relative_error()) + " > " + number(norm_tolerance);
    }
    return text.empty() ? "within bounds" : text;
  }

 private:
  static std::string number(double value) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", value);
    return text;
  }

  std::size_t elements_ = 0;
  std::size_t outside_ = 0;
  std::size_t first_index_ = 0;
  double first_got_ = 0, first_want_ = 0, first_bound_ = 0;
  double squared_difference_ = 0, squared_norm_ = 0;
};

}  // namespace ncclkit_test
