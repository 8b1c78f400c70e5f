#pragma once
/// `DataParallelTrainer<Model, Backend>`: data-parallel training of the user's model
/// (trainer/model.hpp) over any backend: identical replicas, sharded data, gradients averaged in
/// buckets that overlap backward (optionally in 16 bits), accumulation, clipping, a learning-rate
/// schedule, metrics reduced across ranks, rank-0 progress lines and checkpoints that resume
/// exactly. A template that reads top to bottom: a user who wants another loop copies it.
///
/// Construction: the model declares its parameters, the trainer lays them out in one fused
/// buffer per element type (values and gradients alike), hands the model its views, compares
/// its options and plan across ranks, resumes from the newest checkpoint if asked, and
/// broadcasts rank 0's values (and optimizer state), so every replica starts identical.
///
/// A step (`step`): gradients zeroed (unless the model overwrites them: trainer/model.hpp); forward
/// and backward of each micro-batch, adding to the gradients; on the last micro-batch every `ready`
/// marks a tensor for the GradientSync, whose buckets are reduced while backward goes on; `finish`
/// hands each bucket over as it lands and the optimizer updates it there (with clipping, after the
/// norm of them all), unless the reduction applied the update itself (TrainerOptions::fuse_update).
/// Nothing waits on the host but progress lines, checkpoints, clipping and NonFinite::kSkip.
/// With TrainerOptions::defer_gather the step ends after the buckets' first halves: their
/// second halves run on the comm stream, each bucket's update behind its own (beside the comm
/// stream where the backend has a side stream), and the next forward waits for each layer's
/// through StepContext::need; evaluation, checkpoints, progress lines and the accessors of
/// values and state wait for all of them first (`settle`).
///
/// `fit` draws each rank's samples from a DistributedSampler (one global stream: a resume at
/// any world size continues with the unseen samples), agrees the epoch's step count across
/// ranks before it starts, and evaluates after each epoch.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>   // std::min
#include <concepts>    // std::same_as
#include <array>       // std::array
#include <chrono>      // std::chrono::steady_clock
#include <cmath>       // std::sqrt, std::isfinite
#include <cstddef>     // std::size_t, std::byte
#include <cstdint>     // std::uint64_t
#include <cstdio>      // std::printf, std::fopen
#include <memory>      // std::unique_ptr, std::make_shared
#include <optional>    // std::optional
#include <span>        // std::span
#include <string>      // std::string, std::to_string
#include <utility>     // std::as_const
#include <vector>      // std::vector

#include "ncclkit/compression/compressed.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/agreement.hpp"
#include "ncclkit/core/detail/backend_memory.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/update.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/fusion/layout.hpp"
#include "ncclkit/trainer/checkpoint.hpp"
#include "ncclkit/trainer/detail/one_rank_reducer.hpp"
#include "ncclkit/trainer/detail/training_state.hpp"
#include "ncclkit/trainer/model.hpp"
#include "ncclkit/trainer/optimizer.hpp"
#include "ncclkit/trainer/options.hpp"
#include "ncclkit/trainer/progress.hpp"
#include "ncclkit/trainer/sampler.hpp"

namespace ncclkit::trainer {

/// What `fit` did.
struct FitReport {
  std::uint64_t steps = 0;       ///< optimizer steps done in all (a resumed run counts the earlier ones)
  Metrics last_train;            ///< the last progress interval's training metrics
  Metrics validation;            ///< after the last epoch (no samples: no validation set)
  double seconds = 0;            ///< this call's wall time
  std::uint64_t skipped_steps = 0;  ///< steps NonFinite::kSkip left out
};

template <class M, Backend B>
  requires Model<M, B>
class DataParallelTrainer {
 public:
  using Stream = typename B::Stream;
  using Batch = typename M::Batch;

  /// Sets up training of `model` over `backend` (see the header comment): a collective every
  /// rank enters with the same options. ConfigError, on every rank at once, for options that
  /// cannot run (naming the field and numbers), options or models that differ between ranks, an
  /// unwritable checkpoint folder, or a checkpoint of another model.
  DataParallelTrainer(B& backend, M& model, TrainerOptions options)
      : backend_(&backend),
        model_(&model),
        options_(std::move(options)),
        compute_(backend.default_stream()),
        values_(backend, declared(model)),
        gradients_(backend, values_.layout()),
        started_(std::chrono::steady_clock::now()) {
    if constexpr (ModelWithBuffers<M, B>) {
      fusion::FusedLayout layout;
      model.declare_buffers(layout);
      layout.finalize();
      buffers_.emplace(backend, std::move(layout));
      buffers_->zero_padding(compute_);
    }
    // The alignment padding holds zeros, which updates keep zero, not whatever memory held. A
    // model that overwrites its gradients never writes their padding, and steps no longer zero
    // them: they start as zeros.
    values_.zero_padding(compute_);
    if constexpr (OverwritesGradients<M>) zero_gradients();
    if constexpr (AsksForBFloat16Copy<M>) {
      if (std::as_const(model).bfloat16_copy()) {
        copy_ = ncclkit::detail::Allocation<B>(backend, values_.all(DataType::kFloat32).count * sizeof(BFloat16));
      }
    }
    model.bind(ModelViews<B>(values_, &gradients_, copy_data()));
    if constexpr (ModelWithBuffers<M, B>) model.bind_buffers(ModelViews<B>(*buffers_, nullptr));
    const std::string who = "ncclkit: DataParallelTrainer on rank " + std::to_string(backend.rank());
    std::string problem = options_.problem(backend.size());
    if (problem.empty() && options_.defer_gather && !WaitsForValues<M>) {
      problem = who +
                ": TrainerOptions::defer_gather needs a model that calls step.need(slot) before it uses each "
                "parameter and says so (static constexpr bool waits_for_values = true; trainer/model.hpp)";
    }
    if (problem.empty() && backend.rank() == 0 && !options_.checkpoint_folder.empty()) {
      folder_.emplace(options_.checkpoint_folder, options_.keep_checkpoints);
      problem = folder_->problem();
    }
    // Every rank takes part, also one whose own options are wrong: every rank fails at once.
    const auto words = detail::option_words(options_, values_.layout());
    const ncclkit::detail::GatheredWords all = ncclkit::detail::gather_agreed(backend, compute_, words, problem, who);
    if (const int r = all.first_differing(0, words.size()); r >= 0) {
      throw ConfigError(who + ": rank " + std::to_string(r) + " was given " + detail::describe_difference(all, r) +
                        " than rank 0; every rank must train the same model with the same options");
    }
    optimizer_.emplace(values_, gradients_, options_.optimizer, compute_);
    optimizer_->set_copy(copy_data());
    metrics_ = ncclkit::detail::Allocation<B>(backend, 2 * kMetricWords * sizeof(double));
    norm_ = ncclkit::detail::Allocation<B>(backend, kSquareSumWords * sizeof(double));
    backend.fill_zero(metric_view(0), compute_);
    backend.fill_zero(metric_view(1), compute_);
    if (options_.resume && !options_.checkpoint_folder.empty()) resume(who);  // the same on every rank: compared
    broadcast_state();
    refresh_copy();
    if (options_.bucket_bytes == 0) {
      auto o = sync_options();
      o.tuning = fusion::TuningOptions{};
      sync_.emplace(gradients_, std::move(o));
    } else {
      const std::size_t cap = options_.bucket_bytes;
      sync_.emplace(gradients_,
                    fusion::BucketPlan::compute(values_.layout(),
                                                {.bucket_bytes = cap,
                                                 .first_bucket_bytes = std::min<std::size_t>(cap, 1 << 20),
                                                 .min_bucket_bytes = options_.min_bucket_bytes}),
                    sync_options());
    }
    backend.synchronize(compute_);
  }

  DataParallelTrainer(const DataParallelTrainer&) = delete;
  DataParallelTrainer& operator=(const DataParallelTrainer&) = delete;
  /// The sync goes first: with defer_gather its destructor waits for the last step's updates,
  /// which write into the parameters, the optimizer state and the bfloat16 copy (bounded by the
  /// backend's timeout; a failure there is a warning).
  ~DataParallelTrainer() { sync_.reset(); }

  /// One optimizer step over this rank's `micro_batches` (TrainerOptions::accumulation of them,
  /// together global_batch / world samples).
  void step(std::span<const Batch> micro_batches) {
    if (micro_batches.size() != options_.accumulation) {
      throw ConfigError("ncclkit: DataParallelTrainer::step: " + std::to_string(micro_batches.size()) +
                        " micro-batches for an accumulation of " + std::to_string(options_.accumulation));
    }
    B& b = *backend_;
    // A model that overwrites its gradients on the first micro-batch needs no zeros to add to.
    constexpr bool overwrites = OverwritesGradients<M>;
    const bool defer = deferred();
    if constexpr (!overwrites) {
      if (defer) settle();  // the last step's updates read the gradients about to be zeroed
      zero_gradients();
    }
    const double lr = options_.schedule.at(static_cast<std::size_t>(steps_));
    const bool after_norm = options_.clip_norm > 0 || options_.nonfinite == NonFinite::kSkip;
    // One rule for the step, whether the reduction or the callback below applies it to a bucket.
    const UpdateRule rule = optimizer_->rule(lr, 1.0);
    // The reduction may write a bucket's parameters while backward goes on: only for a model
    // that reads them no more once marked.
    if (DoneWithValuesWhenReady<M> && !after_norm && options_.fuse_update) sync_->fuse_update(fused_update(rule));
    const double weight = static_cast<double>(backend_->size()) / static_cast<double>(options_.global_batch);
    const std::uint64_t seed = sampler_seed(steps_);
    for (std::size_t k = 0; k < micro_batches.size(); ++k) {
      const bool last = k + 1 == micro_batches.size();
      StepContext<B> context(
          compute_, weight, metric_data(0),
          [this, last](fusion::Slot slot, Stream stream) {
            if (last) sync_->mark_ready(slot, stream);
          },
          values_.layout(), steps_, seed, b.rank(), !(overwrites && k == 0),
          defer
              ? typename StepContext<B>::Ready([this](fusion::Slot slot, Stream stream) { sync_->wait(slot, stream); })
              : typename StepContext<B>::Ready());
      model_->forward_backward(micro_batches[k], context);
    }
    if (after_norm) {
      update_after_norm(lr);
    } else {
      // Deferred, each bucket's update follows its second half, beside the comm stream where
      // the backend has a stream for it.
      const Stream updates = defer ? sync_->update_stream() : compute_;
      sync_->finish(compute_, [&](std::size_t bucket) {
        if (!sync_->updated(bucket)) optimizer_->update(sync_->plan()[bucket], rule, updates);
      });
      optimizer_->finish_step();
    }
    ++steps_;
    last_lr_ = lr;
    ++steps_since_report_;
    if (options_.log_interval > 0 && steps_ % options_.log_interval == 0) report();
    if (folder_ && options_.checkpoint_interval > 0 && steps_ % options_.checkpoint_interval == 0) save_checkpoint();
  }
  void step(const Batch& batch) { step(std::span<const Batch>(&batch, 1)); }

  /// Trains `epochs` epochs of `train` (counting the epochs a resumed run has done), sampled by
  /// a DistributedSampler; evaluates `validation`, when given, after each; saves a checkpoint at
  /// the end (with a checkpoint folder).
  template <class D>
    requires Dataset<D, M>
  FitReport fit(const D& train, std::size_t epochs, const D* validation = nullptr) {
    FitReport report;
    const auto begin = std::chrono::steady_clock::now();
    DistributedSampler& sampler = sampler_for(train.size());
    const std::size_t per_micro = sampler.per_rank() / options_.accumulation;
    while (sampler.position().epoch < epochs) {
      if (sampler.epoch_done()) {
        sampler.seek({sampler.position().epoch + 1, 0});
        continue;
      }
      agree_on_epoch(sampler, train.size());
      fit_steps_left_ = (epochs - sampler.position().epoch) * sampler.steps_per_epoch() - sampler.step_in_epoch();
      while (!sampler.epoch_done()) {
        const std::vector<std::size_t> mine = sampler.next();
        std::vector<Batch> micro;
        for (std::size_t k = 0; k < options_.accumulation; ++k) {
          micro.push_back(train.batch(std::span<const std::size_t>(mine).subspan(k * per_micro, per_micro)));
        }
        step(std::span<const Batch>(micro));
        --fit_steps_left_;
      }
      if (validation != nullptr) report.validation = evaluate(*validation);
    }
    fit_steps_left_ = 0;
    if (folder_) save_checkpoint();
    report.steps = steps_;
    report.last_train = last_train_;
    report.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
    report.skipped_steps = skipped_;
    return report;
  }

  /// The metrics of `data` with the current parameters: each rank evaluates its evaluation_shard
  /// (never padded), the sums are reduced exactly across ranks. A collective at its end.
  template <class D>
    requires Dataset<D, M>
  Metrics evaluate(const D& data) {
    const EvaluationShard shard = evaluation_shard(data.size(), backend_->rank(), backend_->size());
    const std::size_t batch = options_.eval_batch > 0 ? options_.eval_batch : options_.global_batch / backend_->size();
    std::vector<std::size_t> indices;
    settle();
    EvalContext<B> context(compute_, metric_data(1));
    for (std::size_t from = shard.begin; from < shard.end; from += batch) {
      indices.clear();
      for (std::size_t i = from; i < std::min(shard.end, from + batch); ++i) indices.push_back(i);
      model_->evaluate(data.batch(std::span<const std::size_t>(indices)), context);
    }
    const Metrics total = reduce_metrics(1);
    if (backend_->rank() == 0) {
      Progress p{.epoch = sampler_ ? sampler_->position().epoch : 0, .step = steps_, .metrics = total,
                 .elapsed_seconds = elapsed(), .kind = "eval"};
      emit(p);
    }
    return total;
  }

  /// Writes a checkpoint now (rank 0; the other ranks return at once). Waits for the step.
  void save_checkpoint() {
    if (!folder_) return;
    settle();
    backend_->synchronize(compute_);
    CheckpointData data = detail::checkpoint_of(*backend_, values_, optimizer_->state(), buffers_ ? &*buffers_ : nullptr,
                                                compute_);
    data.step = steps_;
    const SamplerPosition at = sampler_ ? sampler_->position() : pending_position_.value_or(SamplerPosition{});
    data.epoch = at.epoch;
    data.consumed = at.consumed;
    data.seed = options_.seed;
    data.global_batch = options_.global_batch;
    data.world_size = static_cast<std::uint32_t>(backend_->size());
    data.optimizer = options_.optimizer.describe();
    const auto path = folder_->save(data);
    if (options_.print_progress) log_info("ncclkit: checkpoint " + path.string() + " at step " + std::to_string(steps_));
  }

  /// Rewrites the bfloat16 copy of the parameters from their float32 values, on the trainer's
  /// stream (for a model that asks for one, trainer/model.hpp; nothing otherwise): call it after
  /// writing parameters outside the trainer. The trainer's own changes (updates, the start's
  /// broadcast, a resume) keep the copy fresh themselves.
  void refresh_copy() {
    if (copy_data() == nullptr) return;
    settle();
    backend_->cast(values_.all(DataType::kFloat32), copy(), 1.0, nullptr, compute_);
  }

  /// With defer_gather, makes work issued on the trainer's stream from now on see the last
  /// step's updates, which otherwise only the next step's forward waits for (StepContext::need):
  /// call it before reading the parameters with work of your own (a model's evaluate outside
  /// the trainer, a copy to the host). The trainer's own readers call it themselves. Never
  /// blocks the host on GPUs; does nothing without defer_gather.
  void settle() const {
    if (sync_ && deferred()) sync_->wait_all(compute_);
  }
  /// Optimizer steps done (a resumed run counts the earlier ones).
  std::uint64_t steps() const { return steps_; }
  const TrainerOptions& options() const { return options_; }
  /// The parameters and gradients (with defer_gather, work issued on the default stream after
  /// this call sees the last step's updates).
  const fusion::FusedBuffer<B>& values() const {
    settle();
    return values_;
  }
  const fusion::FusedBuffer<B>& gradients() const {
    settle();
    return gradients_;
  }
  /// The bfloat16 copy of the float32 values, element for element (padding included), of a model
  /// that asks for one; an empty view otherwise.
  TensorView copy() const {
    settle();
    const std::size_t count = copy_data() != nullptr ? values_.all(DataType::kFloat32).count : 0;
    return TensorView{copy_data(), count, DataType::kBFloat16, B::memory_kind};
  }
  Optimizer<B>& optimizer() {
    settle();
    return *optimizer_;
  }
  const fusion::GradientSync<B>& sync() const { return *sync_; }
  /// The sampler `fit` draws from (null before the first `fit`).
  const DistributedSampler* sampler() const { return sampler_ ? &*sampler_ : nullptr; }
  /// Steps NonFinite::kSkip left out so far.
  std::uint64_t skipped_steps() const { return skipped_; }

 private:
  static fusion::FusedLayout declared(M& model) {
    fusion::FusedLayout layout;
    model.declare(layout);
    layout.finalize();
    return layout;
  }

  /// Whether steps defer their second halves and updates (TrainerOptions::defer_gather; nothing
  /// to gather at one rank).
  bool deferred() const { return options_.defer_gather && backend_->size() > 1; }
  void zero_gradients() {
    for (DataType type : gradients_.layout().element_types()) backend_->fill_zero(gradients_.all(type), compute_);
  }

  /// `rule` over the parameters and optimizer state it writes, at their float32 allocations'
  /// bases (GradientSync::fuse_update).
  FusedUpdate fused_update(const UpdateRule& rule) {
    auto& state = optimizer_->state();
    const auto f32 = [](fusion::FusedBuffer<B>& buffer) { return static_cast<float*>(buffer.data(DataType::kFloat32)); };
    return {rule, f32(values_), state.size() > 0 ? f32(state[0]) : nullptr, state.size() > 1 ? f32(state[1]) : nullptr,
            copy_data()};
  }

  /// The bfloat16 copy of the float32 values (a model that asks for one), or null.
  BFloat16* copy_data() const { return reinterpret_cast<BFloat16*>(copy_.data()); }

  typename fusion::GradientSync<B>::Options sync_options() const {
    typename fusion::GradientSync<B>::Options o{.op = ReduceOp::kAvg, .missing = options_.unused_parameters};
    o.defer_gather = deferred();
    if constexpr (requires(B& b) {
                    { b.side_stream() } -> std::same_as<Stream>;
                  }) {
      if (o.defer_gather) o.update_stream = backend_->side_stream();
    }
    if (options_.codec != compression::Codec::kNone) {
      o.reducer = compression::compressed({.codec = options_.codec});
    } else if (backend_->size() == 1) {
      o.reducer = std::make_shared<detail::OneRankFactory<B>>();
    }
    return o;
  }

  std::uint64_t sampler_seed(std::uint64_t step) const {
    return detail::mix64(options_.seed ^ detail::mix64(step * 1000003u + static_cast<std::uint64_t>(backend_->rank())));
  }

  TensorView metric_view(int which) const {
    return TensorView{metric_data(which), kMetricWords, DataType::kFloat64, B::memory_kind};
  }
  double* metric_data(int which) const {
    return reinterpret_cast<double*>(metrics_.data()) + static_cast<std::size_t>(which) * kMetricWords;
  }

  /// Sums metric set `which` over every rank, reads it on the host and zeroes it.
  Metrics reduce_metrics(int which) {
    settle();  // its all_reduce after the comm stream's
    const TensorView view = metric_view(which);
    backend_->all_reduce(view, view, ReduceOp::kSum, compute_);
    std::array<double, kMetricWords> host{};
    backend_->copy_to_host(host.data(), view.data, sizeof host, compute_);
    backend_->synchronize(compute_);
    backend_->fill_zero(view, compute_);
    return Metrics{host[0], host[1], host[2]};
  }

  /// The step's update when the gradient norm is needed first (clipping, NonFinite::kSkip): the
  /// squares summed per bucket as it lands, the norm read on the host, then every bucket updated.
  void update_after_norm(double lr) {
    B& b = *backend_;
    const TensorView norm{norm_.data(), kSquareSumWords, DataType::kFloat64, B::memory_kind};
    b.fill_zero(norm, compute_);
    sync_->finish(compute_, [&](std::size_t bucket) {
      const fusion::Bucket& bk = sync_->plan()[bucket];
      b.sum_squares(TensorView{static_cast<std::byte*>(gradients_.data(bk.dtype)) + bk.begin_bytes, bk.count(),
                               bk.dtype, B::memory_kind},
                    reinterpret_cast<double*>(norm_.data()), compute_);
    });
    double squares = 0;
    b.copy_to_host(&squares, norm_.data(), sizeof squares, compute_);
    b.synchronize(compute_);
    const double total = std::sqrt(squares);
    if (!std::isfinite(total)) {
      if (options_.nonfinite == NonFinite::kStop) {
        throw NonFiniteError("ncclkit: DataParallelTrainer: the gradients of step " + std::to_string(steps_) +
                             " are not finite (norm " + std::to_string(total) +
                             "); every rank stops here. Lower the learning rate, or set nonfinite = NonFinite::kSkip");
      }
      ++skipped_;
      return;  // every rank holds the same gradients, so every rank skips alike
    }
    const double scale = options_.clip_norm > 0 && total > options_.clip_norm ? options_.clip_norm / total : 1.0;
    const UpdateRule rule = optimizer_->rule(lr, scale);
    for (std::size_t bucket = 0; bucket < sync_->plan().size(); ++bucket) {
      optimizer_->update(sync_->plan()[bucket], rule, compute_);
    }
    optimizer_->finish_step();
  }

  /// The metrics of the steps since the last report, summed over every rank; a progress line
  /// and a JSON line on rank 0. The same step on every rank.
  void report() {
    const Metrics m = reduce_metrics(0);
    last_train_ = m;
    if (!std::isfinite(m.loss_sum) && options_.nonfinite == NonFinite::kStop) {
      throw NonFiniteError("ncclkit: DataParallelTrainer: the loss is not finite in the " +
                           std::to_string(steps_since_report_) + " steps up to step " + std::to_string(steps_) +
                           "; every rank stops here. Lower the learning rate, or clip the gradients (clip_norm)");
    }
    const double seconds = elapsed();
    const double interval = seconds - last_report_seconds_;
    Progress p{.epoch = sampler_ ? sampler_->position().epoch : 0,
               .step = steps_,
               .step_in_epoch = sampler_ ? sampler_->step_in_epoch() : 0,
               .steps_per_epoch = sampler_ ? sampler_->steps_per_epoch() : 0,
               .metrics = m,
               .learning_rate = last_lr_,
               .samples_per_second = interval > 0 ? static_cast<double>(steps_since_report_ * options_.global_batch) / interval : 0,
               .elapsed_seconds = seconds,
               .left_seconds = fit_steps_left_ > 0 && steps_since_report_ > 0
                                   ? interval / static_cast<double>(steps_since_report_) * static_cast<double>(fit_steps_left_)
                                   : -1};
    last_report_seconds_ = seconds;
    steps_since_report_ = 0;
    if (backend_->rank() == 0) emit(p);
  }

  void emit(const Progress& p) {
    if (options_.print_progress) {
      std::printf("%s\n", progress_line(p).c_str());
      std::fflush(stdout);
    }
    if (!options_.metrics_file.empty()) {
      if (std::FILE* f = std::fopen(options_.metrics_file.c_str(), "a")) {
        std::fprintf(f, "%s\n", progress_json(p).c_str());
        std::fclose(f);
      } else {
        log_warn("ncclkit: DataParallelTrainer: cannot append to metrics_file " + options_.metrics_file);
      }
    }
  }

  double elapsed() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count(); }

  DistributedSampler& sampler_for(std::size_t size) {
    if (!sampler_) {
      sampler_.emplace(SamplerOptions{.dataset_size = size,
                                      .global_batch = options_.global_batch,
                                      .seed = options_.seed,
                                      .shuffle = options_.shuffle,
                                      .last_batch = options_.last_batch},
                       backend_->rank(), backend_->size());
      if (pending_position_) sampler_->seek(*pending_position_);
    } else if (sampler_->options().dataset_size != size) {
      throw ConfigError("ncclkit: DataParallelTrainer::fit: a dataset of " + std::to_string(size) +
                        " samples, where the earlier fit had " + std::to_string(sampler_->options().dataset_size));
    }
    return *sampler_;
  }

  /// Every rank must run the same epoch with the same number of steps: compared once at the
  /// epoch's start, so a rank with another dataset is an error naming it, not a hang.
  void agree_on_epoch(const DistributedSampler& sampler, std::size_t size) {
    const std::array<std::uint64_t, 4> mine{sampler.position().epoch, sampler.position().consumed,
                                            sampler.steps_per_epoch(), size};
    const std::string who = "ncclkit: DataParallelTrainer::fit on rank " + std::to_string(backend_->rank());
    settle();  // its collective after the comm stream's
    const auto all = ncclkit::detail::gather_agreed(*backend_, compute_, mine, std::string(), who);
    if (const int r = all.first_differing(0, mine.size()); r >= 0) {
      throw ConfigError(who + ": rank " + std::to_string(r) + " starts epoch " + std::to_string(all.at(r, 0)) +
                        " at sample " + std::to_string(all.at(r, 1)) + " with " + std::to_string(all.at(r, 2)) +
                        " steps over " + std::to_string(all.at(r, 3)) + " samples, rank 0 epoch " +
                        std::to_string(all.at(0, 0)) + " at sample " + std::to_string(all.at(0, 1)) + " with " +
                        std::to_string(all.at(0, 2)) + " steps over " + std::to_string(all.at(0, 3)) +
                        " samples; every rank must train on the same dataset (size) from the same position");
    }
  }

  /// Rank 0 looks for the newest whole checkpoint; every rank learns what it found (and any
  /// problem with it) from one exchange, then takes its tensors by the broadcast that follows.
  void resume(const std::string& who) {
    std::optional<std::pair<std::filesystem::path, CheckpointData>> found;
    std::string problem;
    if (backend_->rank() == 0) {
      found = folder_->load_latest();
      if (found) {
        problem = detail::checkpoint_problem(found->second, values_, optimizer_->state().size(),
                                             buffers_ ? &*buffers_ : nullptr, options_);
        if (problem.empty()) {
          detail::restore(*backend_, found->second, values_, optimizer_->state(), buffers_ ? &*buffers_ : nullptr,
                          compute_);
        }
      }
    }
    std::array<std::uint64_t, 5> mine{};
    if (found) {
      const CheckpointData& c = found->second;
      mine = {1, c.step, c.epoch, c.consumed, c.world_size};
    }
    const auto all = ncclkit::detail::gather_agreed(*backend_, compute_, mine, problem, who);
    if (all.at(0, 0) == 0) return;
    steps_ = all.at(0, 1);
    optimizer_->set_steps(steps_);
    pending_position_ = SamplerPosition{all.at(0, 2), all.at(0, 3)};
    if (backend_->rank() == 0) {
      std::string line = "ncclkit: resuming from " + found->first.string() + " at step " + std::to_string(steps_) +
                         " (epoch " + std::to_string(all.at(0, 2)) + ", sample " + std::to_string(all.at(0, 3)) + ")";
      if (all.at(0, 4) != static_cast<std::uint64_t>(backend_->size())) {
        line += "; it was written at " + std::to_string(all.at(0, 4)) + " ranks, these are " +
                std::to_string(backend_->size()) + ": the data is re-sharded";
      }
      log_info(line);
      if (options_.print_progress) std::printf("%s\n", line.c_str());
    }
  }

  /// Rank 0's parameter values, optimizer state and buffers to every rank.
  void broadcast_state() {
    const auto all_of = [&](fusion::FusedBuffer<B>& buffer) {
      for (DataType type : buffer.layout().element_types()) {
        const TensorView v = buffer.all(type);
        backend_->broadcast(v, v, 0, compute_);
      }
    };
    all_of(values_);
    for (auto& state : optimizer_->state()) all_of(state);
    if (buffers_) all_of(*buffers_);
  }

  B* backend_;
  M* model_;
  TrainerOptions options_;
  Stream compute_;
  fusion::FusedBuffer<B> values_;
  fusion::FusedBuffer<B> gradients_;
  std::optional<fusion::FusedBuffer<B>> buffers_;
  std::optional<Optimizer<B>> optimizer_;
  std::optional<fusion::GradientSync<B>> sync_;
  std::optional<CheckpointFolder> folder_;  // rank 0, with a checkpoint folder
  std::optional<DistributedSampler> sampler_;
  std::optional<SamplerPosition> pending_position_;  // from a checkpoint, until fit makes the sampler
  ncclkit::detail::Allocation<B> metrics_;  // two sets of kMetricWords doubles: training, evaluation
  ncclkit::detail::Allocation<B> norm_;     // kSquareSumWords doubles
  ncclkit::detail::Allocation<B> copy_;     // a BFloat16 per float32 value where the model asks, else none
  std::uint64_t steps_ = 0;
  std::uint64_t skipped_ = 0;
  std::uint64_t steps_since_report_ = 0;
  std::size_t fit_steps_left_ = 0;
  double last_lr_ = 0;
  double last_report_seconds_ = 0;
  Metrics last_train_;
  std::chrono::steady_clock::time_point started_;
};

}  // namespace ncclkit::trainer
