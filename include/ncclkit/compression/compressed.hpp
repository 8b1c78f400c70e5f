#pragma once
/// `compression::compressed(options)`: gradients that travel in 16 bits. Given as a
/// GradientSync's reducer (fusion/reducer.hpp), float32 buckets are scaled and cast to fp16 or
/// bf16, summed in 16 bits and cast back into the float32 gradients; buckets of other element
/// types are reduced as they are:
///
///   GradientSync sync(buffer, plan, {.reducer = compression::compressed({.codec = Codec::kFloat16})});
///
/// It picks one of three reducers, once per plan, the same on every rank:
///   - FusedReducer (fused_reducer.hpp): one kernel encodes, moves 16-bit data between GPUs,
///     sums and decodes, where the backend can (the NCCL communicator on one node, NCCL 2.28)
///     and `fused_transfer` is on;
///   - RerunReducer (rerun_reducer.hpp), with `rerun_nonfinite`: separate casts, and a float32
///     rerun of every piece whose 16-bit sum is not finite;
///   - CastReducer (cast_reducer.hpp) elsewhere: cast, 16-bit all_reduce, cast.
/// The fused and the separate paths round differently in the last bit, each the same on every
/// rank. `GradientSync::reducer().name()` says which one runs.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <bit>       // std::bit_cast
#include <cstddef>   // std::size_t
#include <cstdint>   // std::uint64_t
#include <cstdio>    // std::snprintf
#include <memory>    // std::make_shared, std::unique_ptr
#include <optional>  // std::optional
#include <span>      // std::span
#include <string>    // std::string, std::to_string
#include <vector>    // std::vector

#include "ncclkit/compression/cast_reducer.hpp"
#include "ncclkit/compression/codec.hpp"
#include "ncclkit/compression/fused_reducer.hpp"
#include "ncclkit/compression/rerun_reducer.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/fusion/all_reduce_reducer.hpp"
#include "ncclkit/fusion/reducer.hpp"

namespace ncclkit::compression {

/// How gradients are compressed; designated initialisers.
struct CompressionOptions {
  /// kFloat16 (default) or kBFloat16; kNone reduces float32 as it is (the plain all_reduce).
  Codec codec = Codec::kFloat16;
  /// What encode multiplies float32 gradients by; decode divides it out. Default 1/world: the
  /// 16-bit sum of `world` gradients is then no larger than one gradient, so fp16 overflows
  /// only where a single gradient would.
  std::optional<double> prescale = std::nullopt;
  /// Compressed buckets are encoded, reduced and decoded in chunks of at most this many float32
  /// bytes, so encoding one chunk overlaps reducing the one before; 0 (default): one chunk per
  /// bucket (buckets already pipeline against each other).
  std::size_t chunk_bytes = 0;
  /// Reduce again in float32 every chunk whose 16-bit result has a non-finite value (the
  /// float32 gradients are still intact then), so an fp16 overflow costs time, never a step.
  /// It makes `finish` wait on the host for the compressed chunks once a step, and it runs the
  /// separate casts (the fused kernel overwrites the float32 data).
  bool rerun_nonfinite = false;
  /// Use the fused kernel where the backend can run it (see the header comment).
  bool fused_transfer = true;
};

/// The factory of the compressed reducers for backend `B` (what `compressed` converts to).
template <Backend B>
class CompressedFactory final : public fusion::ReducerFactory<B> {
 public:
  explicit CompressedFactory(CompressionOptions options) : options_(options) {}
  const CompressionOptions& options() const { return options_; }

  std::string name() const override { return "compressed"; }
  std::vector<std::uint64_t> settings() const override {
    return {static_cast<std::uint64_t>(options_.codec) | static_cast<std::uint64_t>(options_.rerun_nonfinite) << 8 |
                static_cast<std::uint64_t>(options_.fused_transfer) << 16,
            options_.chunk_bytes, std::bit_cast<std::uint64_t>(options_.prescale.value_or(0.0))};
  }
  std::string describe(std::span<const std::uint64_t> w) const override {
    if (w.size() != 3) return "reducer compressed";
    const double prescale = std::bit_cast<double>(w[2]);
    char value[32];
    std::snprintf(value, sizeof value, "%.17g", prescale);
    return "codec " + std::string(name_of(static_cast<Codec>(w[0] & 0xff))) + ", chunk_bytes " + std::to_string(w[1]) +
           ", prescale " + (prescale == 0.0 ? std::string("default") : std::string(value)) + ", rerun_nonfinite " +
           ((w[0] >> 8 & 0xff) != 0 ? "on" : "off") + ", fused_transfer " + ((w[0] >> 16 & 0xff) != 0 ? "on" : "off");
  }
  std::string problem(const fusion::ReducerSetup<B>& setup) const override {
    const Codec codec = options_.codec;
    if (codec != Codec::kNone && codec != Codec::kFloat16 && codec != Codec::kBFloat16) {
      return "ncclkit: GradientSync: invalid codec value " + std::to_string(static_cast<int>(codec));
    }
    if (options_.rerun_nonfinite && codec == Codec::kNone) {
      return "ncclkit: GradientSync: rerun_nonfinite needs a codec (fp16 or bf16)";
    }
    if (setup.defer_gather && codec != Codec::kNone) {
      return "ncclkit: GradientSync: defer_gather splits float32 all-reduces in two halves; the " +
             std::string(name_of(codec)) + " codec reduces in one pass. Turn one of them off";
    }
    try {
      (void)factors_for(setup);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return {};
  }
  std::unique_ptr<fusion::BucketReducer<B>> make(const fusion::ReducerSetup<B>& setup) const override {
    if (options_.codec == Codec::kNone) return std::make_unique<fusion::AllReduceReducer<B>>(setup);
    const CodecFactors factors = factors_for(setup);
    if (options_.rerun_nonfinite) {
      return std::make_unique<RerunReducer<B>>(setup, options_.codec, factors, options_.chunk_bytes);
    }
    if constexpr (CompressedReduceBackend<B>) {
      if (options_.fused_transfer) {
        std::string why;
        if (auto fused = FusedReducer<B>::make(setup, options_.codec, factors, options_.chunk_bytes, why)) {
          return fused;
        }
        if (!why.empty()) {
          log_info("ncclkit: GradientSync: compression runs as separate casts around a 16-bit all-reduce: " + why);
        }
      }
    }
    return std::make_unique<CastReducer<B>>(setup, options_.codec, factors, options_.chunk_bytes);
  }

 private:
  CodecFactors factors_for(const fusion::ReducerSetup<B>& setup) const {
    return factors(setup.backend->size(), setup.op == ReduceOp::kAvg, options_.prescale);
  }
  CompressionOptions options_;
};

/// Compression for any backend's GradientSync: converts to GradientSyncOptions<B>::reducer.
class Compressed {
 public:
  explicit Compressed(CompressionOptions options) : options_(options) {}
  const CompressionOptions& options() const { return options_; }
  template <Backend B>
  operator std::shared_ptr<const fusion::ReducerFactory<B>>() const {
    return std::make_shared<const CompressedFactory<B>>(options_);
  }

 private:
  CompressionOptions options_;
};

/// `GradientSyncOptions::reducer = compressed({.codec = Codec::kBFloat16})`; see the header.
inline Compressed compressed(CompressionOptions options = {}) { return Compressed(options); }

}  // namespace ncclkit::compression
