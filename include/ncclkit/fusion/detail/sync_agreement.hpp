#pragma once
/// How the ranks of a `GradientSync` check, at construction, that their own arguments can run and
/// that they will issue the same collectives: one exchange (core/detail/agreement.hpp) of each rank's plan fingerprint, its
/// options (op, missing tensors, defer_gather), its tuning candidates and its reducer's settings, also
/// from a rank whose own arguments were invalid; then the same verdict on every rank.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>  // std::min, std::copy_n
#include <array>      // std::array
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint64_t
#include <cstring>    // std::memcpy
#include <optional>   // std::optional
#include <span>       // std::span
#include <string>     // std::string, std::to_string
#include <vector>     // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/agreement.hpp"
#include "ncclkit/core/detail/hex.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/detail/bucket_tuning.hpp"
#include "ncclkit/fusion/detail/sync_timeline.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/fusion/reducer.hpp"
#include "ncclkit/fusion/sync_options.hpp"

namespace ncclkit::fusion::detail {

/// A reducer factory's settings travel in this many words at most, after two words of its
/// name (cut to 16 characters) and their count.
inline constexpr std::size_t kReducerWords = 8;

/// Why a GradientSync's own arguments cannot run, naming what to change; empty when they can.
/// Checked before the ranks compare, so that a rank with bad arguments still takes part.
template <Backend B>
std::string sync_problem(const GradientSyncOptions<B>& options, const FusedLayout& layout, std::size_t loose,
                         const std::optional<BucketPlan>& plan) {
  const std::string who = "ncclkit: GradientSync: ";
  if (options.op != ReduceOp::kSum && options.op != ReduceOp::kAvg) {
    return who + "op " + std::string(name_of(options.op)) +
           " is not a gradient reduction; use ReduceOp::kAvg or ReduceOp::kSum";
  }
  if (loose != 0 && loose != layout.size()) {
    return who + std::to_string(loose) + " loose pointers for " + std::to_string(layout.size()) +
           " tensors; give one per slot (null for a tensor that lives in the buffer)";
  }
  if (plan && options.tuning) {
    return who + "a plan and GradientSyncOptions::tuning were both given; give the plan, or tuning without one";
  }
  if (options.tuning) {
    if (std::string p = Tuner::problem(*options.tuning); !p.empty()) return p;
  }
  if (options.timeline) {
    if (std::string p = SyncTimeline<B>::problem(*options.timeline); !p.empty()) return p;
  }
  if (!plan) return {};
  try {
    (void)BucketPlan::parse(plan->serialize(), layout);
  } catch (const ConfigError& e) {
    return who + "the plan was not made for this buffer's layout (make it with BucketPlan::compute(buffer.layout())): " +
           e.what();
  }
  return {};
}

/// Compares plan, options, tuning and reducer settings of every rank (see the header comment);
/// ConfigError on every rank when they differ or when any rank's `problem` is not empty.
template <Backend B>
void agree_on_sync(B& backend, typename B::Stream stream, const std::string& who, const std::string& problem,
                   std::uint64_t fingerprint, std::array<std::uint64_t, 2> options, std::array<std::uint64_t, 3> tuning,
                   const ReducerFactory<B>& factory, const std::string& plan_text) {
  const std::vector<std::uint64_t> reducer = factory.settings();
  if (reducer.size() > kReducerWords) {
    throw ConfigError(who + ": a reducer factory gives " + std::to_string(reducer.size()) + " settings words; at most " +
                      std::to_string(kReducerWords) + " are compared");
  }
  // Words: fingerprint | op, missing and defer_gather (bits 0, 1) | tuning (3) | reducer name (2), count, settings (8).
  constexpr std::size_t kOptions = 1, kTuning = 3, kReducer = 6;
  std::vector<std::uint64_t> mine{fingerprint, options[0], options[1], tuning[0], tuning[1], tuning[2], 0, 0};
  const std::string name = factory.name();
  std::memcpy(&mine[kReducer], name.data(), std::min<std::size_t>(name.size(), 16));
  mine.push_back(reducer.size());
  mine.insert(mine.end(), reducer.begin(), reducer.end());
  mine.resize(kReducer + 3 + kReducerWords, 0);
  const ncclkit::detail::GatheredWords all = ncclkit::detail::gather_agreed(backend, stream, mine, problem, who);

  const auto describe = [&](int rank) {
    const std::uint64_t count = all.at(rank, kReducer + 2);
    const bool same_kind = all.at(rank, kReducer) == mine[kReducer] && all.at(rank, kReducer + 1) == mine[kReducer + 1];
    const std::uint64_t flags = all.at(rank, kOptions + 1);
    std::string text = "op " + std::string(name_of(static_cast<ReduceOp>(all.at(rank, kOptions)))) + ", missing " +
                       ((flags & 1) != 0 ? "kReduceAsZeros" : "kError") + ((flags & 2) != 0 ? ", defer_gather" : "") +
                       ", ";
    if (same_kind && count <= kReducerWords) {
      return text + factory.describe(all.of(rank).subspan(kReducer + 3, count));
    }
    const char* raw = reinterpret_cast<const char*>(&all.words[static_cast<std::size_t>(rank) * all.per_rank + kReducer]);
    return text + "reducer " + std::string(raw, strnlen(raw, 16));
  };
  if (const int r = all.first_differing(kOptions, 2); r >= 0 || all.first_differing(kReducer, 3 + kReducerWords) >= 0) {
    const int rank = r >= 0 ? r : all.first_differing(kReducer, 3 + kReducerWords);
    throw ConfigError(
        who + ": rank " + std::to_string(rank) + " uses other GradientSyncOptions than rank 0 (" + describe(rank) +
        " against " + describe(0) +
        "); every rank must give the same op, missing, defer_gather and reducer (with the same settings)");
  }
  if (const int r = all.first_differing(kTuning, 3); r >= 0) {
    const auto tuning_text = [&](int rank) {
      return std::string(all.at(rank, kTuning) == all.at(0, kTuning) ? "the same candidates" : "other candidates") +
             ", warmup_steps " + std::to_string(all.at(rank, kTuning + 1)) + ", measured_steps " +
             std::to_string(all.at(rank, kTuning + 2));
    };
    throw ConfigError(who + ": rank " + std::to_string(r) + " tunes otherwise than rank 0 (" + tuning_text(r) +
                      " against " + tuning_text(0) +
                      "); every rank must give the same TuningOptions candidates, warmup_steps and measured_steps, "
                      "or ranks would switch plans at different steps");
  }
  if (all.first_differing(0, 1) < 0) return;
  std::string listed;
  int shown = 0;
  for (int r = 0; r < backend.size(); ++r) {
    if (r != 0 && all.at(r, 0) == all.at(0, 0)) continue;
    if (++shown > 8) {
      listed += ", ...";
      break;
    }
    listed += (listed.empty() ? "rank " : ", rank ") + std::to_string(r) + " " + ncclkit::detail::hex64(all.at(r, 0));
  }
  throw ConfigError(who + ": the ranks hold different bucket plans (fingerprints: " + listed +
                    "; ranks not listed match rank 0). This rank's plan: " + plan_text +
                    ". Every rank must register the same tensors (names, shapes, element types) in the same "
                    "order and use the same LayoutOptions and BucketOptions, or parse rank 0's serialize()d plan");
}

}  // namespace ncclkit::fusion::detail
