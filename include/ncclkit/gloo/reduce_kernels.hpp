#pragma once
/// Element-wise reduction, scaling and averaging loops on host memory for every ncclkit element
/// type: what the Gloo backend hands to Gloo as its reduction callback, and what it uses for
/// `scale` and the average.
///
/// Why ncclkit has its own: the Gloo snapshot Debian ships (0.0~git20220518) has no bfloat16,
/// its float16 sum converts one element at a time (about 15x slower than its float32 sum), and
/// its loops count in `int`, so they misbehave past 2^31 elements. These loops count in
/// `std::size_t` and work on GCC/Clang vector types a register at a time
/// (detail/reduce_loops.inc). Half and BFloat16 are widened to float with branch-free integer
/// code, reduced in float and rounded back to nearest even, so every result equals the scalar
/// `Half(float(a) op float(b))`.
///
/// On x86-64 the loops are compiled twice: for the base instruction set (SSE2) and for AVX2 with
/// F16C (hardware Half conversions); the second is chosen at run time when the CPU has both.
/// `NCCLKIT_GLOO_ISA=generic` forces the first. Both give bit-identical results (tested).
///
/// Integer sums and products wrap around (two's complement), as NCCL's do. Min and max of
/// floating-point values are `a < b ? a : b` and `a > b ? a : b`: a NaN in `a` may be dropped.
/// Thread safety: all functions are reentrant.

#include <bit>          // std::bit_cast
#include <cmath>        // std::llround
#include <cstddef>      // std::size_t
#include <cstdint>      // fixed-width integers
#include <cstring>      // std::memcpy (vector loads and stores)
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <type_traits>  // std::is_same_v, std::make_unsigned_t, std::common_type_t
#include <utility>      // std::index_sequence (vector shuffles)

#include "ncclkit/core/detail/cast.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/knobs.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/tensor.hpp"

#if !(defined(__GNUC__) || defined(__clang__))
#error "ncclkit/gloo/reduce_kernels.hpp needs GCC or Clang (vector extensions)"
#endif

#if defined(__x86_64__)
#define NCCLKIT_GLOO_X86_DISPATCH 1
#include <cpuid.h>      // __get_cpuid (F16C detection)
#include <immintrin.h>  // F16C intrinsics, used in the AVX2 copy only
#else
#define NCCLKIT_GLOO_X86_DISPATCH 0
#endif

#define NCCLKIT_GLOO_ALWAYS_INLINE inline __attribute__((always_inline))

namespace ncclkit::gloo {

/// A reduction callback in Gloo's shape: `out[i] = a[i] op b[i]` for i < count. `out` may
/// equal `a` or `b` (exactly; not a partial overlap).
using ReduceFunction = void (*)(void* out, const void* a, const void* b, std::size_t count);

/// Which compiled copy of the loops runs.
enum class KernelIsa : int {
  kGeneric,   ///< the base instruction set (SSE2 on x86-64), 16-byte vectors
  kAvx2F16c,  ///< x86-64 with AVX2 and F16C, 32-byte vectors, chosen at run time
};

/// Scalar Half/BFloat16 bit conversions, branch-free, identical to ncclkit::Half's and
/// ncclkit::BFloat16's (round to nearest even; NaN stays a quiet NaN).
namespace detail {

inline float half_bits_to_float(std::uint16_t h) {
  const std::uint32_t x = h;
  const std::uint32_t sign = (x & 0x8000u) << 16;
  const std::uint32_t magnitude = x & 0x7fffu;
  const std::uint32_t normal = (magnitude << 13) + 0x38000000u;
  const std::uint32_t inf_nan = normal + 0x38000000u;
  const float subnormal = static_cast<float>(static_cast<std::int32_t>(magnitude)) * 0x1p-24f;
  std::uint32_t bits = magnitude >= 0x7c00u ? inf_nan : normal;
  bits = magnitude < 0x0400u ? std::bit_cast<std::uint32_t>(subnormal) : bits;
  return std::bit_cast<float>(bits | sign);
}

inline std::uint16_t float_to_half_bits(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (f >> 16) & 0x8000u;
  const std::uint32_t a = f & 0x7fffffffu;
  // Normal results: rebias, add the round-to-nearest-even increment, shift; a carry out of the
  // mantissa correctly bumps the exponent.
  const std::uint32_t normal = (a - 0x38000000u + 0xfffu + ((a >> 13) & 1u)) >> 13;
  // Subnormal results: adding 0.5f lines binary16's subnormal step up with float's last
  // mantissa bit, so the FPU's own round-to-nearest-even does the rounding.
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(std::bit_cast<float>(a) + 0.5f) - 0x3f000000u;
  std::uint32_t bits = a < 0x38800000u ? subnormal : normal;
  bits = a >= 0x477ff000u ? 0x7c00u : bits;  // 65520 and above round to infinity
  bits = a > 0x7f800000u ? 0x7e00u : bits;   // NaN
  return static_cast<std::uint16_t>(bits | sign);
}

inline float bfloat16_bits_to_float(std::uint16_t b) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16);
}

inline std::uint16_t float_to_bfloat16_bits(float value) {
  const std::uint32_t f = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t rounded = (f + 0x7fffu + ((f >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (f >> 16) | 0x40u;
  return static_cast<std::uint16_t>((f & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

template <class T>
NCCLKIT_GLOO_ALWAYS_INLINE float to_float_bits(std::uint16_t bits) {
  if constexpr (std::is_same_v<T, Half>) {
    return half_bits_to_float(bits);
  } else {
    return bfloat16_bits_to_float(bits);
  }
}
template <class T>
NCCLKIT_GLOO_ALWAYS_INLINE std::uint16_t from_float_bits(float value) {
  if constexpr (std::is_same_v<T, Half>) {
    return float_to_half_bits(value);
  } else {
    return float_to_bfloat16_bits(value);
  }
}

// ---- the loops, once per instruction set ----------------------------------------------------

namespace generic {
inline constexpr std::size_t kWidth = 16;
#define NCCLKIT_GLOO_F16C 0
#include "ncclkit/gloo/detail/reduce_loops.inc"
#undef NCCLKIT_GLOO_F16C
}  // namespace generic

#if NCCLKIT_GLOO_X86_DISPATCH
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,f16c")
#endif
namespace avx2 {
inline constexpr std::size_t kWidth = 32;
#define NCCLKIT_GLOO_F16C 1
#include "ncclkit/gloo/detail/reduce_loops.inc"
#undef NCCLKIT_GLOO_F16C
}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif

inline bool cpu_has_avx2_f16c() {
#if NCCLKIT_GLOO_X86_DISPATCH
  __builtin_cpu_init();
  // F16C through CPUID leaf 1 (ECX bit 29): Clang 14's __builtin_cpu_supports lacks "f16c".
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & (1u << 29)) != 0;
  return f16c && __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

}  // namespace detail

/// Whether this CPU can run `isa`'s copy of the loops.
inline bool isa_supported(KernelIsa isa) { return isa == KernelIsa::kGeneric || detail::cpu_has_avx2_f16c(); }

/// The copy used by default: AVX2+F16C where the CPU has both, else generic.
/// `NCCLKIT_GLOO_ISA=generic` (or `avx2`) overrides. Decided once per process.
inline KernelIsa default_isa() {
  static const KernelIsa isa = [] {
    const auto wanted = knob_text(knob("NCCLKIT_GLOO_ISA"));
    if (wanted && *wanted == "generic") return KernelIsa::kGeneric;
    if (wanted && !detail::cpu_has_avx2_f16c()) {
      throw ConfigError("NCCLKIT_GLOO_ISA=avx2, but this CPU lacks AVX2 or F16C; unset it");
    }
    return detail::cpu_has_avx2_f16c() ? KernelIsa::kAvx2F16c : KernelIsa::kGeneric;
  }();
  return isa;
}

/// "generic" or "avx2+f16c".
inline std::string_view name_of(KernelIsa isa) { return isa == KernelIsa::kAvx2F16c ? "avx2+f16c" : "generic"; }

/// The element-wise reduction for `type` and `op`. kAvg reduces as kSum: the average's
/// division happens once, outside the callback. Precondition: `isa_supported(isa)`.
inline ReduceFunction reduce_function(DataType type, ReduceOp op, KernelIsa isa = default_isa()) {
  return visit_data_type(type, [&]<class T>() -> ReduceFunction {
#if NCCLKIT_GLOO_X86_DISPATCH
    if (isa == KernelIsa::kAvx2F16c) return detail::avx2::reduce_for<T>(op);
#endif
    return detail::generic::reduce_for<T>(op);
  });
}

/// out[i] = in[i] * factor for i < count, in `type`: computed in float for Half, BFloat16 and
/// float, in double for double; for integers, the double product rounded to nearest (exact up
/// to 2^53). `out` may equal `in`. Precondition: `isa_supported(isa)`.
inline void scale(DataType type, void* out, const void* in, std::size_t count, double factor,
                  KernelIsa isa = default_isa()) {
  visit_data_type(type, [&]<class T>() {
#if NCCLKIT_GLOO_X86_DISPATCH
    if (isa == KernelIsa::kAvx2F16c) return detail::avx2::scale<T>(out, in, count, factor);
#endif
    return detail::generic::scale<T>(out, in, count, factor);
  });
}

/// out = in * factor converted to out's element type, for floating views (see the Backend concept's
/// cast); returns the number of non-finite outputs. Between float and float16/bfloat16 (the
/// codecs' casts) it runs vectorised loops, elsewhere ncclkit's portable loop. Precondition:
/// `ncclkit::detail::cast_problem(in, out)` is empty and `isa_supported(isa)`.
inline std::uint64_t cast(const TensorView& in, const TensorView& out, double factor, KernelIsa isa = default_isa()) {
  const auto run = [&]<class T, bool To16>() -> std::uint64_t {
#if NCCLKIT_GLOO_X86_DISPATCH
    if (isa == KernelIsa::kAvx2F16c) return detail::avx2::cast16<T, To16>(out.data, in.data, in.count, factor);
#endif
    (void)isa;
    return detail::generic::cast16<T, To16>(out.data, in.data, in.count, factor);
  };
  if (in.dtype == DataType::kFloat32 && out.dtype == DataType::kFloat16) return run.template operator()<Half, true>();
  if (in.dtype == DataType::kFloat32 && out.dtype == DataType::kBFloat16) {
    return run.template operator()<BFloat16, true>();
  }
  if (in.dtype == DataType::kFloat16 && out.dtype == DataType::kFloat32) return run.template operator()<Half, false>();
  if (in.dtype == DataType::kBFloat16 && out.dtype == DataType::kFloat32) {
    return run.template operator()<BFloat16, false>();
  }
  return ncclkit::detail::cast_on_host(in, out, factor);
}

/// The integer average's division: data[i] /= divisor, truncating toward zero (as NCCL's
/// ncclAvg does for integers). For a floating-point `type`: data[i] *= 1 / divisor.
inline void divide(DataType type, void* data, std::size_t count, std::int64_t divisor) {
  visit_data_type(type, [&]<class T>() {
    if constexpr (std::is_integral_v<T>) {
      auto* values = static_cast<T*>(data);
      const T d = static_cast<T>(divisor);
      for (std::size_t i = 0; i < count; ++i) values[i] = static_cast<T>(values[i] / d);
    } else {
      scale(type, data, data, count, 1.0 / static_cast<double>(divisor));
    }
  });
}

}  // namespace ncclkit::gloo
