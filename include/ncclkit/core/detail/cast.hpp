#pragma once
/// The argument rules of the Backend concept's cast and copy batches (one place, for every backend) and their host
/// implementation (the Gloo backend and the tests' loop-back backend run them on the CPU).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cmath>        // std::isfinite
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint64_t
#include <cstring>      // std::memcpy
#include <span>         // std::span
#include <string>       // std::string, std::to_string
#include <type_traits>  // std::is_same_v, std::conditional_t, std::is_floating_point_v

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/tensor.hpp"

namespace ncclkit::detail {

/// What is wrong with `cast(in, out, ...)`'s views, or "" when nothing is.
inline std::string cast_problem(const TensorView& in, const TensorView& out) {
  if (!is_floating(in.dtype) || !is_floating(out.dtype)) {
    return "cast converts between floating types (float16, bfloat16, float32, float64), not " +
           std::string(name_of(in.dtype)) + " to " + std::string(name_of(out.dtype));
  }
  if (in.count != out.count) {
    return "cast needs as many outputs as inputs: " + std::to_string(in.count) + " and " + std::to_string(out.count);
  }
  if (in.count != 0 && (in.data == nullptr || out.data == nullptr)) return "cast of a null buffer";
  if (in.data != out.data && in.count != 0) {
    const auto* a = static_cast<const std::byte*>(in.data);
    const auto* b = static_cast<const std::byte*>(out.data);
    if (a < b + out.bytes() && b < a + in.bytes()) {
      return "cast's input and output overlap without being one buffer; cast in place (same type) or into "
             "separate memory";
    }
  }
  if (in.data == out.data && in.count != 0 && in.dtype != out.dtype) {
    return "cast in place needs one element type; cast " + std::string(name_of(in.dtype)) + " to " +
           std::string(name_of(out.dtype)) + " into separate memory";
  }
  return {};
}

/// What is wrong with a batch of copies, or "" when nothing is.
inline std::string copy_batch_problem(std::span<const CopyItem> items) {
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (items[i].bytes != 0 && (items[i].to == nullptr || items[i].from == nullptr)) {
      return "copy " + std::to_string(i) + " of the batch has a null pointer and " + std::to_string(items[i].bytes) +
             " bytes";
    }
  }
  return {};
}

/// `value` as the arithmetic type a cast computes in (double, or float for 16-bit types).
template <class T>
auto widen(T value) {
  if constexpr (is_16bit_float_v<T>) {
    return static_cast<float>(value);
  } else {
    return value;
  }
}

template <class In, class Out>
std::uint64_t cast_typed(const In* in, Out* out, std::size_t count, double factor) {
  // Computed in double where either side is double, else in float (as the GPU kernels do).
  using Compute = std::conditional_t<std::is_same_v<In, double> || std::is_same_v<Out, double>, double, float>;
  const auto f = static_cast<Compute>(factor);
  std::uint64_t nonfinite = 0;
  for (std::size_t i = 0; i < count; ++i) {
    const Compute value = static_cast<Compute>(widen(in[i])) * f;
    const Out result = Out(value);
    nonfinite += std::isfinite(static_cast<double>(widen(result))) ? 0 : 1;
    out[i] = result;
  }
  return nonfinite;
}

/// out[i] = in[i] * factor in out's type, on the CPU; returns how many outputs are not finite.
/// Precondition: cast_problem(in, out) is empty.
inline std::uint64_t cast_on_host(const TensorView& in, const TensorView& out, double factor) {
  std::uint64_t nonfinite = 0;
  const auto floating = [&]<class In>() {
    visit_data_type(out.dtype, [&]<class Out>() {
      if constexpr ((std::is_floating_point_v<Out> || is_16bit_float_v<Out>)&&(std::is_floating_point_v<In> ||
                                                                               is_16bit_float_v<In>)) {
        nonfinite = cast_typed(static_cast<const In*>(in.data), static_cast<Out*>(out.data), in.count, factor);
      }
    });
  };
  visit_data_type(in.dtype, floating);
  return nonfinite;
}

/// Runs a batch of copies on the CPU.
inline void copy_batch_on_host(std::span<const CopyItem> items) {
  for (const CopyItem& item : items) {
    if (item.bytes != 0) std::memcpy(item.to, item.from, item.bytes);
  }
}

}  // namespace ncclkit::detail
