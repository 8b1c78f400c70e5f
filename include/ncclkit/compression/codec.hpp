#pragma once
/// Gradient codecs: how float32 gradients travel in a reduction.
///
///   kNone      as they are (float32).
///   kFloat16   IEEE half: 10 mantissa bits, largest finite 65504. Pre-scaling by 1/world
///              keeps a sum of `world` gradients as large as one of them, so it overflows only
///              where a single gradient would.
///   kBFloat16  bfloat16: float32's range, 7 mantissa bits.
///
/// A codec is stateless: encode = one pass that multiplies by `prescale` and casts to 16 bits;
/// the reduction sums 16-bit values; decode = one pass that casts back to float32 and
/// multiplies by what turns the sum into the wanted result (1 for an average with the default
/// prescale of 1/world). The passes are the backend's `cast` (a CUDA kernel on GPUs, a loop on
/// CPUs), or one fused kernel (compression/fused_reducer.hpp); compression/compressed.hpp makes
/// them a GradientSync's reducer.
///
/// Layer: compression sits above fusion: its reducers implement fusion's bucket-reducer seam
/// (fusion/reducer.hpp), and no file of fusion/ knows a codec. The kernels live with the NCCL
/// backend (nccl/detail/codec_kernels.cuh), reached through the Backend concept.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstdio>       // std::snprintf
#include <limits>       // std::numeric_limits
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/core/dtype.hpp"

namespace ncclkit::compression {

enum class Codec : int { kNone, kFloat16, kBFloat16 };

constexpr std::string_view name_of(Codec codec) {
  switch (codec) {
    case Codec::kNone:
      return "none";
    case Codec::kFloat16:
      return "fp16";
    case Codec::kBFloat16:
      return "bf16";
  }
  return "invalid";
}

/// The codec called `name` ("none", "fp16", "bf16"); ConfigError listing them otherwise.
inline Codec codec_named(std::string_view name) {
  for (Codec codec : {Codec::kNone, Codec::kFloat16, Codec::kBFloat16}) {
    if (name == name_of(codec)) return codec;
  }
  throw ConfigError("ncclkit: unknown codec \"" + std::string(name) + "\"; use none, fp16 or bf16");
}

/// The element type a codec's data travels in (kFloat32 for kNone).
constexpr DataType wire_type(Codec codec) {
  return codec == Codec::kFloat16    ? DataType::kFloat16
         : codec == Codec::kBFloat16 ? DataType::kBFloat16
                                     : DataType::kFloat32;
}

/// The factors of one compressed reduction: encode multiplies by `encode`, the wire is summed,
/// decode multiplies by `decode`.
struct CodecFactors {
  double encode = 1.0;
  double decode = 1.0;
};

/// Factors for reducing over `world` ranks with `average` (kAvg) or a sum, pre-scaling by
/// `prescale` (default 1/world). ConfigError for a prescale that is not a positive finite number.
/// ConfigError for a prescale that is not positive, or whose encode or decode factor does not
/// fit in a float (the casts of float32 data compute in float).
inline CodecFactors factors(int world, bool average, std::optional<double> prescale = std::nullopt) {
  const double encode = prescale.value_or(1.0 / static_cast<double>(world > 0 ? world : 1));
  const double result = average ? 1.0 / static_cast<double>(world > 0 ? world : 1) : 1.0;
  const double decode = result / encode;
  const auto fits = [](double f) {
    return f >= static_cast<double>(std::numeric_limits<float>::min()) &&
           f <= static_cast<double>(std::numeric_limits<float>::max());
  };
  if (!(encode > 0.0) || !fits(encode) || !fits(decode)) {
    char text[64];
    std::snprintf(text, sizeof text, "%.17g", encode);
    throw ConfigError(std::string("ncclkit: compression prescale must be a positive number whose encode and decode "
                                  "factors fit in a float (1/world is the default), not ") +
                      text);
  }
  return CodecFactors{encode, decode};
}

}  // namespace ncclkit::compression
