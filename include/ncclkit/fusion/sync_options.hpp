#pragma once
/// What a `GradientSync<B>` is made with (`GradientSyncOptions`) and what it reports of a step
/// (`GradientSyncStats`).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>   // std::size_t
#include <optional>  // std::optional

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/fusion/ready_tracker.hpp"
#include "ncclkit/fusion/reducer.hpp"
#include "ncclkit/fusion/timeline.hpp"
#include "ncclkit/fusion/tuning.hpp"

namespace ncclkit::fusion {

/// Options of a `GradientSync<B>`; designated initialisers: `GradientSync sync(buffer, plan,
/// {.op = ReduceOp::kSum, .reducer = compression::compressed({.codec = Codec::kFloat16})})`.
template <Backend B>
struct GradientSyncOptions {
  /// kAvg (default: gradients of the mean loss over the global batch, as DDP gives) or kSum.
  ReduceOp op = ReduceOp::kAvg;
  /// What `finish` does about tensors never marked ready in a step (see MissingTensors).
  MissingTensors missing = MissingTensors::kError;
  /// Where buckets are reduced; the backend's `comm_stream()` when empty.
  std::optional<typename B::Stream> comm_stream = std::nullopt;
  /// Compare the plan's fingerprint and these options across ranks at construction (one
  /// all_gather of a few hundred bytes a rank) and throw ConfigError on every rank when they
  /// differ, or when one rank's own options are invalid. Turn off only where every rank parsed
  /// rank 0's `serialize()`d plan already; the same on every rank.
  bool check_plan = true;
  /// How a ready bucket is reduced (fusion/reducer.hpp): null (default) all-reduces it in
  /// place; `compression::compressed({...})` sends float32 buckets in 16 bits.
  ReducerChoice<B> reducer = nullptr;
  /// Auto-tuning of the bucket cap (fusion/tuning.hpp), for the constructors without a plan.
  std::optional<TuningOptions> tuning = std::nullopt;
  /// A Chrome trace of the first steps (fusion/timeline.hpp): nullopt (default) takes it from
  /// the environment (NCCLKIT_TIMELINE, NCCLKIT_TIMELINE_STEPS; off when unset); a value turns it
  /// on, or off whatever the environment says when its prefix is empty. Need not be the same
  /// on every rank. Off, it costs nothing: no events, no allocations.
  std::optional<TimelineOptions> timeline = std::nullopt;
  /// Reduce each bucket in two halves where the reducer can (the default all_reduce, on buckets
  /// whose padded length splits evenly over the ranks; not the compressed reducers): a
  /// reduce-scatter when the bucket launches, under backward, and an all-gather that `finish`
  /// issues on the comm stream in reverse plan order, the order a forward pass needs the
  /// buckets in. `finish` then makes its stream wait for nothing: `finish`'s callback issues
  /// its work on GradientSync::update_stream() (below), and `wait(slot, stream)` makes a stream
  /// see a bucket's result and that work (`wait_all(stream)`: every bucket's). A trainer's next
  /// forward waits layer by layer, so the second half overlaps forward instead of adding to the
  /// end of backward. The same on every rank (checked).
  bool defer_gather = false;
  /// With defer_gather: where `finish`'s callback runs its work for each bucket, behind that
  /// bucket's second half by an event, so that the next bucket's all-gather on the comm stream
  /// does not queue behind it (the optimizer's update of one layer beside the gather of the
  /// next); default: the comm stream itself. GradientSync::update_stream() says which. Need not
  /// be the same on every rank.
  std::optional<typename B::Stream> update_stream = std::nullopt;
};

/// What the last finished step did.
struct GradientSyncStats {
  /// Buckets in the plan.
  std::size_t buckets = 0;
  /// Buckets launched from `mark_ready`, before `finish` was called: the overlap with backward.
  std::size_t launched_before_finish = 0;
  /// Tensors `finish` reduced as zeros (MissingTensors::kReduceAsZeros).
  std::size_t zeroed = 0;
  /// Steps finished so far.
  std::size_t steps = 0;
  /// Pieces the reducer reduced in a compressed form each step (0 for the plain all_reduce).
  std::size_t compressed_chunks = 0;
  /// Pieces the last step reduced a second time (compression's float32 rerun).
  std::size_t rerun_chunks = 0;
};

}  // namespace ncclkit::fusion
