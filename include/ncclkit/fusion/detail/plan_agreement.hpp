#pragma once
/// How the ranks of a `GradientSync` check that they will issue the same collectives: one
/// all_gather of each rank's plan fingerprint and of the settings that change what a bucket
/// computes or how it is cut, then the same verdict on every rank.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <array>    // std::array
#include <bit>      // std::bit_cast
#include <cstdint>  // std::uint64_t
#include <cstdio>   // std::snprintf
#include <string>   // std::string, std::to_string
#include <vector>   // std::vector

#include "ncclkit/compression/codec.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/hex.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/detail/backend_memory.hpp"

namespace ncclkit::fusion::detail {

/// The settings every rank must share, as words that travel in the all_gather.
struct SyncSettings {
  ReduceOp op = ReduceOp::kAvg;
  bool zeros_for_missing = false;
  compression::Codec codec = compression::Codec::kNone;
  bool rerun_nonfinite = false;
  std::uint64_t chunk_bytes = 0;
  double prescale = 0.0;  // 0: the default (1/world)
  bool fused_transfer = true;

  std::array<std::uint64_t, 3> words() const {
    return {static_cast<std::uint64_t>(fused_transfer) << 32 | static_cast<std::uint64_t>(op) << 24 |
                static_cast<std::uint64_t>(zeros_for_missing) << 16 | static_cast<std::uint64_t>(codec) << 8 |
                static_cast<std::uint64_t>(rerun_nonfinite),
            chunk_bytes, std::bit_cast<std::uint64_t>(prescale)};
  }
  static SyncSettings from(const std::uint64_t* w) {
    SyncSettings s;
    s.fused_transfer = ((w[0] >> 32) & 0xff) != 0;
    s.op = static_cast<ReduceOp>((w[0] >> 24) & 0xff);
    s.zeros_for_missing = ((w[0] >> 16) & 0xff) != 0;
    s.codec = static_cast<compression::Codec>((w[0] >> 8) & 0xff);
    s.rerun_nonfinite = (w[0] & 0xff) != 0;
    s.chunk_bytes = w[1];
    s.prescale = std::bit_cast<double>(w[2]);
    return s;
  }
  std::string describe() const {
    std::string text = "op " + std::string(name_of(op)) + ", missing " +
                       (zeros_for_missing ? "kReduceAsZeros" : "kError") + ", codec " +
                       std::string(compression::name_of(codec)) + ", chunk_bytes " + std::to_string(chunk_bytes) +
                       ", prescale ";
    char value[32];
    std::snprintf(value, sizeof value, "%.17g", prescale);
    text += prescale == 0.0 ? std::string("default") : std::string(value);
    return text + ", rerun_nonfinite " + (rerun_nonfinite ? "on" : "off") + ", fused_transfer " +
           (fused_transfer ? "on" : "off");
  }
};

/// All-gathers every rank's plan fingerprint and settings on `stream` (synchronising it) and
/// throws ConfigError, on every rank alike, when they differ. `who` starts the messages;
/// `plan_text` describes this rank's plan.
template <Backend B>
void agree_on_plan(B& backend, typename B::Stream stream, std::uint64_t fingerprint, const SyncSettings& settings,
                   const std::string& who, const std::string& plan_text) {
  constexpr std::size_t kWords = 4;
  const int ranks = backend.size();
  const auto w = settings.words();
  const std::array<std::uint64_t, kWords> mine = {fingerprint, w[0], w[1], w[2]};
  const std::vector<std::uint64_t> gathered = ncclkit::detail::all_gather_words(backend, stream, mine);
  const auto at = [&](int rank, std::size_t word) { return gathered[kWords * static_cast<std::size_t>(rank) + word]; };
  for (int r = 1; r < ranks; ++r) {
    if (at(r, 1) != at(0, 1) || at(r, 2) != at(0, 2) || at(r, 3) != at(0, 3)) {
      throw ConfigError(who + ": rank " + std::to_string(r) + " uses other GradientSyncOptions than rank 0 (" +
                        SyncSettings::from(&gathered[kWords * static_cast<std::size_t>(r) + 1]).describe() +
                        " against " + SyncSettings::from(&gathered[1]).describe() +
                        "); every rank must give the same op, missing, codec, prescale, chunk_bytes, "
                        "rerun_nonfinite and fused_transfer");
    }
  }
  bool agree = true;
  for (int r = 1; r < ranks; ++r) agree = agree && at(r, 0) == at(0, 0);
  if (agree) return;
  std::string listed;
  int shown = 0;
  for (int r = 0; r < ranks; ++r) {
    if (r != 0 && at(r, 0) == at(0, 0)) continue;
    if (++shown > 8) {
      listed += ", ...";
      break;
    }
    listed += (listed.empty() ? "rank " : ", rank ") + std::to_string(r) + " " + ncclkit::detail::hex64(at(r, 0));
  }
  throw ConfigError(who + ": the ranks hold different bucket plans (fingerprints: " + listed +
                    "; ranks not listed match rank 0). This rank's plan: " + plan_text +
                    ". Every rank must register the same tensors (names, shapes, element types) in the same "
                    "order and use the same LayoutOptions and BucketOptions, or parse rank 0's serialize()d plan");
}

}  // namespace ncclkit::fusion::detail
