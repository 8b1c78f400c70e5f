#pragma once
/// The bucket-reducer seam: what happens to a bucket of gradients once `GradientSync` finds it
/// ready. `GradientSync` keeps the step's bookkeeping (which tensors are marked, which buckets
/// may launch, in plan order on every rank), the loose tensors' packing and the observers; a
/// reducer decides how a ready bucket travels and when its result is there:
///   - `fusion::AllReduceReducer` (the default): one all_reduce per bucket, in place, on the
///     comm stream;
///   - compression/ (compression::compressed): 16-bit encodings of float32 buckets, as separate
///     casts around a 16-bit all_reduce, as one fused kernel, or with a float32 rerun of chunks
///     whose 16-bit result is not finite;
///   - a reduce-scatter, whose result lands on each rank's shard of a bucket (sharded optimizer
///     state), fits the same seam: `complete` then makes the shard visible, and what a caller
///     updates per bucket (`GradientSync::finish`'s callback) is that shard.
///
/// A reducer is made once per plan by a `ReducerFactory` (GradientSyncOptions::reducer), after
/// every rank has checked that its factory's settings match rank 0's. It is a small virtual
/// interface rather than a template parameter of GradientSync because the choice is made at
/// run time from options (one GradientSync type for users to learn), and it is called a few
/// times per bucket, where a virtual call costs nothing next to a collective; the element-wise
/// work stays in the backend's kernels, resolved at compile time.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t, std::uint32_t
#include <memory>   // std::unique_ptr, std::shared_ptr
#include <span>     // std::span
#include <string>   // std::string, std::to_string
#include <vector>   // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/core/update.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/observer.hpp"
#include "ncclkit/fusion/ready_tracker.hpp"

namespace ncclkit::fusion {

/// One bucket as a reducer finds it.
struct BucketData {
  /// What to reduce, in the buffer: the bucket's range (for a bucket of one tensor, that
  /// tensor's elements alone, not the alignment padding after it: then a rank whose tensor is
  /// loose and one whose tensor is in the buffer reduce the same count).
  TensorView data;
  /// The bucket's whole range, its padding included (zeroed, so it sums to zero), starting and
  /// ending on the layout's alignment: for reducers that cut a bucket into aligned pieces.
  TensorView whole;
  /// Where the bucket is exactly one loose tensor: that tensor (the type and count of `data`),
  /// which a reducer may reduce where it lives instead (BucketReducer::reduces_in_place);
  /// null otherwise.
  void* loose = nullptr;
};

/// What a reducer is made with. Valid for the reducer's lifetime (GradientSync owns it).
template <Backend B>
struct ReducerSetup {
  B* backend = nullptr;
  /// Where the sync's collectives run (GradientSyncOptions::comm_stream).
  typename B::Stream comm{};
  const BucketPlan* plan = nullptr;
  /// Per bucket of the plan.
  std::vector<BucketData> buckets;
  /// kAvg or kSum.
  ReduceOp op = ReduceOp::kAvg;
  /// Where a reducer reports the phases it issues (Phase::kEncode ... kDecode, per piece).
  Observers<B>* observers = nullptr;
  /// GradientSyncOptions::defer_gather: a reducer that can splits a bucket's reduction in two
  /// halves, `launch` issuing the reduce-scatter and `complete` the all-gather (on the comm
  /// stream, where GradientSync then calls it, in reverse plan order). One that cannot, or a
  /// bucket that does not split, reduces whole in `launch` as usual: the results are the same.
  bool defer_gather = false;

  void observe(Phase phase, std::size_t index, bool end, typename B::Stream stream) const {
    if (!observers->empty()) observers->phase(phase, index, end, stream);
  }
};

/// One reduction of a step, as a timeline draws it: a whole bucket, or chunk `chunk` of the
/// `chunks` that a reducer cut it into.
struct ReducerPiece {
  std::size_t bucket = 0;
  std::size_t chunk = 0;
  std::size_t chunks = 1;
  /// Bytes its collective moves per rank.
  std::uint64_t bytes = 0;
};

/// The reduction of a plan's buckets, step after step. See the header comment.
template <Backend B>
class BucketReducer {
 public:
  using Stream = typename B::Stream;
  virtual ~BucketReducer() = default;

  /// What this reducer is, for messages and traces: "all_reduce", "fp16 fused kernel", ...
  virtual std::string name() const = 0;
  /// Its reductions, in issue order; the index of a piece is what its phases report.
  virtual std::span<const ReducerPiece> pieces() const = 0;
  /// The per-piece phases it reports (a bit per Phase), so that an observer can prepare.
  virtual std::uint32_t piece_phases() const { return 1u << static_cast<unsigned>(Phase::kReduce); }
  /// Whether bucket `b`, one loose tensor (BucketData::loose), is reduced where it lives; false:
  /// GradientSync packs it into the buffer before `launch` and unpacks it after `complete`.
  virtual bool reduces_in_place(std::size_t bucket) const {
    (void)bucket;
    return false;
  }
  /// Whether `launch` can apply an optimizer update to bucket `b`'s result itself (set_update),
  /// in the pass that writes it: the gradients are then read once and the parameters updated
  /// where the reduction lands, with no separate pass over the bucket.
  virtual bool can_update(std::size_t bucket) const {
    (void)bucket;
    return false;
  }
  /// The update that the next `launch` of bucket `b` (where can_update) applies to its result:
  /// `update`'s pointers belong to the first element of BucketData::data. The result then goes
  /// into the parameters, not the gradients: the bucket's gradients keep this rank's own values.
  /// For one step: `end_step` forgets it. The same on every rank, as the reduction's result is.
  virtual void set_update(std::size_t bucket, const FusedUpdate& update) {
    (void)update;
    throw ConfigError("ncclkit: the " + name() + " reducer cannot apply bucket " + std::to_string(bucket) +
                      "'s update itself (ask can_update first)");
  }
  /// Issues the reduction of buckets `range` (consecutive, in plan order), whose gradients
  /// are written by the work issued so far on `compute`: ordered after that work by events,
  /// never by a host wait. Every rank issues the same collectives for the same ranges.
  virtual void launch(BucketRange range, Stream compute) = 0;
  /// Makes work issued on `stream` after this call see bucket `bucket`'s result. Called once per
  /// bucket and step, in plan order, after the bucket's launch; never blocks the host (but for a
  /// reducer that documents otherwise). With ReducerSetup::defer_gather, called on the comm
  /// stream in reverse plan order, and a bucket's second half (its all-gather) is issued here.
  virtual void complete(std::size_t bucket, Stream stream) = 0;
  /// After the step's last `complete`, on the same stream.
  virtual void end_step(Stream stream) { (void)stream; }
  /// Non-finite values (Inf, NaN) in the results of the last finished step, the same on every
  /// rank; 0 for a reducer that does not count them. May synchronise the stream of the last
  /// `complete`.
  virtual std::uint64_t nonfinite() { return 0; }
  /// Pieces the last finished step reduced in a compressed form, and those it reduced a second
  /// time (0 for a reducer that does neither).
  virtual std::size_t compressed_pieces() const { return 0; }
  virtual std::size_t retried_pieces() const { return 0; }
};

/// Makes the reducer of a GradientSync, once per plan (a tuning sync makes one per candidate
/// plan it tries). Shared by the syncs it is given to; not modified by them.
template <Backend B>
class ReducerFactory {
 public:
  virtual ~ReducerFactory() = default;
  /// What kind of reducer it makes, in a few characters ("all_reduce", "compressed"): ranks
  /// whose factories differ in kind are told so by name.
  virtual std::string name() const = 0;
  /// Words every rank's factory must match (compared with rank 0's at construction of the
  /// sync), and a description of such words for the message that names a difference.
  virtual std::vector<std::uint64_t> settings() const { return {}; }
  virtual std::string describe(std::span<const std::uint64_t> settings) const = 0;
  /// Why these settings cannot run with `setup`, or empty: checked on every rank before the
  /// comparison, so that a rank's bad settings are every rank's ConfigError, at once.
  virtual std::string problem(const ReducerSetup<B>& setup) const {
    (void)setup;
    return {};
  }
  /// The reducer for `setup` (held by the caller, which outlives it). After the comparison; may
  /// be a collective (every rank makes its reducer at the same point).
  virtual std::unique_ptr<BucketReducer<B>> make(const ReducerSetup<B>& setup) const = 0;
};

/// What GradientSyncOptions::reducer holds: a factory, or null for the plain all_reduce.
template <Backend B>
using ReducerChoice = std::shared_ptr<const ReducerFactory<B>>;

}  // namespace ncclkit::fusion
