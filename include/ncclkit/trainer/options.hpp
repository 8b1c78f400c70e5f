#pragma once
/// `TrainerOptions`: every knob of the data-parallel trainer (trainer/data_parallel.hpp), with
/// designated initialisers:
///
///   TrainerOptions{.global_batch = 256, .schedule = {.lr = 0.1}, .checkpoint_folder = "ckpt"}
///
/// Every rank must give the same options (the trainer compares them at construction, as it
/// compares the bucket plan), except the logging and checkpoint folders, which only rank 0 uses.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <string>   // std::string

#include "ncclkit/compression/codec.hpp"
#include "ncclkit/fusion/ready_tracker.hpp"
#include "ncclkit/trainer/optimizer.hpp"
#include "ncclkit/trainer/sampler.hpp"
#include "ncclkit/trainer/schedule.hpp"

namespace ncclkit::trainer {

/// What happens when a step's gradients or loss are not finite.
enum class NonFinite {
  kStop,  ///< a NonFiniteError naming the step (default)
  kSkip,  ///< that step updates nothing, on every rank alike (the gradient norm is then checked every step)
};

/// Gradients or a loss that are not finite, found at the same step on every rank.
class NonFiniteError : public Error {
 public:
  using Error::Error;
};

struct TrainerOptions {
  // ---- batches
  /// Samples per optimizer step over all ranks. A multiple of world × accumulation.
  std::size_t global_batch = 0;
  /// Micro-batches per step on each rank: the rank's share of the global batch is cut into this
  /// many, their gradients summed with no communication until the last (PyTorch's no_sync).
  std::size_t accumulation = 1;
  /// Samples per batch of `evaluate` on each rank; 0: the rank's share of a training step.
  std::size_t eval_batch = 0;

  // ---- gradients
  /// How float32 gradients travel: kNone (default), kFloat16 or kBFloat16 (compression/).
  compression::Codec codec = compression::Codec::kNone;
  /// Bucket cap in bytes (DDP's 25 MiB by default); 0: tuned over the first steps (fusion/tuning.hpp).
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// The plan's fusion::BucketOptions::min_bucket_bytes (0: off): a bucket holding less takes in
  /// the next tensor past the cap. Only with a fixed cap (bucket_bytes not 0).
  std::size_t min_bucket_bytes = 0;
  /// Parameters a step does not use (a branch not taken): kError (default) names a tensor never
  /// marked ready; kReduceAsZeros reduces it as zeros.
  fusion::MissingTensors unused_parameters = fusion::MissingTensors::kError;

  // ---- optimizer
  OptimizerOptions optimizer = {};
  LrSchedule schedule = {};
  /// Clip the gradients' global norm to this; 0: no clipping. With clipping, each step reads the
  /// norm on the host, so the updates follow the last bucket rather than each bucket.
  double clip_norm = 0.0;
  NonFinite nonfinite = NonFinite::kStop;
  /// Let the reduction apply the optimizer update where each bucket lands, where it can (the
  /// fused 16-bit kernel of codec kFloat16 / kBFloat16 on GPUs: compression/) and the model
  /// allows it (done_with_values_when_ready: trainer/model.hpp), saving the optimizer's own pass
  /// over the gradients and parameters. Steps with clipping or
  /// NonFinite::kSkip update after the norm, never so. After such a step the gradients hold each
  /// rank's own values, not the average. false: the optimizer's own pass, always.
  bool fuse_update = true;
  /// Reduce each gradient bucket in two halves: a reduce-scatter under backward, then an
  /// all-gather and the bucket's update issued after backward on the comm stream, which the
  /// next step's forward waits for layer by layer (StepContext::need) instead of the step
  /// waiting for all of them at its end. The same bytes travel; the second half overlaps the
  /// next forward. Needs a model that declares waits_for_values (trainer/model.hpp), float32
  /// gradients (codec kNone), and updates that need not wait for the norm (no clipping, no
  /// NonFinite::kSkip). A model that does not overwrite its gradients makes each step wait for
  /// the updates before zeroing them, which leaves forward nothing to overlap. Nothing changes
  /// at one rank.
  bool defer_gather = false;

  // ---- data
  /// Seeds the data order (with the epoch) and each step's randomness (StepContext::seed).
  std::uint64_t seed = 0;
  bool shuffle = true;
  LastBatch last_batch = LastBatch::kDrop;

  // ---- progress (rank 0)
  /// Steps between reductions of the training metrics and progress lines; 0: none.
  std::size_t log_interval = 10;
  /// Progress lines on standard output.
  bool print_progress = true;
  /// A file to append a JSON line to per progress line (for plots); empty: none.
  std::string metrics_file = {};

  // ---- checkpoints (rank 0 writes them)
  /// Where checkpoints go; empty: none.
  std::string checkpoint_folder = {};
  /// Steps between checkpoints; 0: only at the end of `fit`.
  std::size_t checkpoint_interval = 0;
  /// Checkpoints kept (the newest).
  std::size_t keep_checkpoints = 3;
  /// Continue from the newest whole checkpoint of the folder, if any.
  bool resume = true;

  /// Why these options cannot run at `world` ranks, naming the field and the numbers; empty when
  /// they can.
  std::string problem(int world) const {
    const std::string who = "ncclkit: TrainerOptions: ";
    if (global_batch == 0) return who + "global_batch is 0; give the samples per step over all ranks";
    if (accumulation == 0) return who + "accumulation is 0; use 1 for no accumulation";
    const std::size_t split = static_cast<std::size_t>(world) * accumulation;
    if (global_batch % split != 0) {
      return who + "a global batch of " + std::to_string(global_batch) + " does not split into " +
             std::to_string(world) + " ranks × " + std::to_string(accumulation) + " micro-batches (remainder " +
             std::to_string(global_batch % split) + "); use a multiple of " + std::to_string(split);
    }
    if (codec != compression::Codec::kNone && codec != compression::Codec::kFloat16 &&
        codec != compression::Codec::kBFloat16) {
      return who + "codec " + std::to_string(static_cast<int>(codec)) + " is not a codec";
    }
    if (bucket_bytes == 0 && min_bucket_bytes != 0) {
      return who + "min_bucket_bytes (" + std::to_string(min_bucket_bytes) +
             ") shapes a fixed plan, and bucket_bytes 0 asks for a tuned one; set one of them to 0";
    }
    if (!(clip_norm >= 0)) return who + "clip_norm must be 0 (no clipping) or positive";
    if (defer_gather && codec != compression::Codec::kNone) {
      return who +
             "defer_gather splits float32 reductions; the 16-bit codecs reduce in one pass. Set codec to "
             "kNone or defer_gather to false";
    }
    if (defer_gather && (clip_norm > 0 || nonfinite == NonFinite::kSkip)) {
      return who + "defer_gather updates each bucket as its second half lands, and " +
             (clip_norm > 0 ? "clip_norm" : "NonFinite::kSkip") +
             " needs the whole gradient's norm before any update. Turn one of them off";
    }
    if (keep_checkpoints == 0) return who + "keep_checkpoints is 0; keep at least 1";
    if (std::string p = optimizer.problem(); !p.empty()) return p;
    if (std::string p = schedule.problem(); !p.empty()) return p;
    return {};
  }
};

}  // namespace ncclkit::trainer
