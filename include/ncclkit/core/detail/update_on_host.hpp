#pragma once
/// The host side of the backends' optimizer work (core/update.hpp): the checks every backend
/// makes of an `update`'s views, and the loops of the CPU backends (Gloo, the tests' fakes).

#include <cstddef>  // std::size_t
#include <string>       // std::string, std::to_string
#include <type_traits>  // std::is_same_v

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/core/update.hpp"

namespace ncclkit::detail {

/// Why `update(rule, param, grad, state0, state1, copy)` cannot run, or empty: every view
/// float32 with the parameter's count, as many state views as the rule keeps, and `copy` either
/// none (null data) or bfloat16 of the parameters' count.
inline std::string update_problem(const UpdateRule& rule, const TensorView& param, const TensorView& grad,
                                  const TensorView& state0, const TensorView& state1, const TensorView& copy) {
  const auto fits = [&](const TensorView& v) { return v.dtype == DataType::kFloat32 && v.count == param.count; };
  if (param.dtype != DataType::kFloat32 || !fits(grad)) {
    return "update needs float32 parameters and gradients of one count (" + std::string(name_of(param.dtype)) + " × " +
           std::to_string(param.count) + ", " + std::string(name_of(grad.dtype)) + " × " + std::to_string(grad.count) +
           ")";
  }
  const int states = rule.state_count();
  if ((states > 0 && !fits(state0)) || (states > 1 && !fits(state1))) {
    return "this update keeps " + std::to_string(states) +
           " float32 state values per parameter: give as many state views of the parameters' count";
  }
  if (copy.data != nullptr && (copy.dtype != DataType::kBFloat16 || copy.count != param.count)) {
    return "the copy an update writes is bfloat16 of the parameters' count (" + std::to_string(param.count) +
           "), not " + std::string(name_of(copy.dtype)) + " × " + std::to_string(copy.count) +
           "; give a view with null data for none";
  }
  return {};
}

/// The update of every element, in order, and its bfloat16 copy where `copy` has data.
inline void update_on_host(const UpdateRule& rule, const TensorView& param, const TensorView& grad,
                           const TensorView& state0, const TensorView& state1, const TensorView& copy = {}) {
  auto* p = static_cast<float*>(param.data);
  const auto* g = static_cast<const float*>(grad.data);
  auto* s0 = static_cast<float*>(state0.data);
  auto* s1 = static_cast<float*>(state1.data);
  auto* c = static_cast<BFloat16*>(copy.data);
  float unused0 = 0, unused1 = 0;
  for (std::size_t i = 0; i < param.count; ++i) {
    update_element(rule, p[i], g[i], s0 != nullptr ? s0[i] : unused0, s1 != nullptr ? s1[i] : unused1);
    if (c != nullptr) c[i] = BFloat16(p[i]);
  }
}

/// out[0] += the sum of the squares of `in` (floating types), summed in double in order.
inline void sum_squares_on_host(const TensorView& in, double* out) {
  double sum = 0;
  visit_data_type(in.dtype, [&]<class T>() {
    const auto* x = static_cast<const T*>(in.data);
    for (std::size_t i = 0; i < in.count; ++i) {
      double v;
      if constexpr (std::is_same_v<T, double>) {
        v = x[i];
      } else {
        v = static_cast<double>(static_cast<float>(x[i]));
      }
      sum += v * v;
    }
  });
  out[0] += sum;
}

}  // namespace ncclkit::detail
