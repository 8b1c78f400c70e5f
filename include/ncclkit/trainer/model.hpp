#pragma once
/// The `Model` concept: what a model gives the data-parallel trainer (trainer/data_parallel.hpp),
/// and what the trainer hands it. The model is the user's code, on the backend's memory (CPU
/// loops over Gloo's host memory, kernels or cuBLAS on NCCL's GPU memory); the trainer owns the
/// memory of its parameters and gradients, fused, so that gradients are reduced in buckets with
/// no copies.
///
///   struct Mlp {
///     using Batch = MyBatch;
///     void declare(fusion::FusedLayout& layout);   // once: "fc1.weight" {128, 64}, ... (float32)
///     void bind(const ModelViews<B>& views);        // once: keep the views, write initial values
///     void forward_backward(const Batch& batch, StepContext<B>& step);
///     void evaluate(const Batch& batch, EvalContext<B>& eval);
///   };
///
/// forward_backward computes the batch's loss and **adds** to the gradients the gradient of
/// `step.loss_weight()` × (the sum of the batch's per-sample losses); as each layer's gradients
/// are complete it calls `step.ready(slot)` (or by name), on the stream the work ran on, so that
/// buckets are reduced while backward goes on (on a micro-batch that is not the last of a step,
/// `ready` does nothing: accumulation needs no communication). It adds its sums to
/// `step.metrics()`. evaluate does the forward pass alone and adds the sums. Both run their work
/// on `stream()`, ordered by the stream, with no host wait needed.
///
/// Optional: `declare_buffers(fusion::FusedLayout&)` and `bind_buffers(const ModelViews<B>&)`
/// for state that is not trained but belongs to the model (running statistics): broadcast from
/// rank 0 at the start and kept in checkpoints like parameters.
///
/// Optional: `static constexpr bool overwrites_gradients = true;` promises that forward_backward
/// writes every element of every gradient when `step.accumulate()` is false (the first
/// micro-batch of a step), and adds when it is true. The trainer then skips zeroing the
/// gradients before each step, and a GEMM writes them with beta 0 instead of reading zeros back
/// with beta 1: two passes over the gradients' bytes fewer per step, which is what PyTorch gets
/// from gradients set to None. A model that leaves a gradient unwritten there trains on the
/// previous step's values: declare it only where every gradient is always written.
///
/// Optional: `static constexpr bool done_with_values_when_ready = true;` promises that once
/// forward_backward marks a tensor ready, that call neither reads nor writes the tensor's values
/// again (compute the input gradient, which reads the weight, before the weight gradient that is
/// marked). The trainer may then let the reduction update the parameters while backward still
/// runs (TrainerOptions::fuse_update); without the promise it updates them after backward.
///
/// Optional: `bool bfloat16_copy() const` returning true asks the trainer to keep a bfloat16 copy
/// of every parameter (rounded to nearest, ties to even), for a model that computes in bfloat16
/// from float32 master weights (asked once, before `bind`, so a model may decide by its own
/// options): `views.copy(name)` at `bind` gives a tensor's copy. The optimizer writes it in the
/// same pass as the parameters (the separate update and the one fused into a reduction alike),
/// and the trainer rewrites all of it after anything else changes the parameters (the start's
/// broadcast, a resume); a model reads it, never writes it. After writing the parameters
/// yourself, call the trainer's `refresh_copy()`.
///
/// Optional: `static constexpr bool waits_for_values = true;` promises that forward_backward calls
/// `step.need(slot)` (or by name) for every parameter before it first reads that parameter's
/// values or writes its gradient, on stream(). A trainer with TrainerOptions::defer_gather needs
/// the promise: it issues the second half of each bucket's reduction and the bucket's update
/// after backward, and `need` is where the next forward waits for them, layer by layer.
/// (evaluate needs no such call: the trainer waits for every update before evaluating.)

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <concepts>     // std::convertible_to
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint64_t
#include <functional>   // std::function
#include <string_view>  // std::string_view

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/fusion/layout.hpp"

namespace ncclkit::trainer {

/// The sums a model reports for its batches: what progress lines and evaluation divide, summed
/// exactly across ranks first (never an average of averages).
struct Metrics {
  double loss_sum = 0;  ///< per-sample losses, summed
  double correct = 0;   ///< samples predicted right (classifiers; 0 otherwise)
  double samples = 0;
  double loss() const { return samples > 0 ? loss_sum / samples : 0; }
  double accuracy() const { return samples > 0 ? correct / samples : 0; }
};
/// Metrics as the model adds to them: this many doubles in the backend's memory, in Metrics'
/// order (loss_sum, correct, samples).
inline constexpr std::size_t kMetricWords = 3;

/// What the trainer hands a model at `bind`: views of values and gradients (or of buffers) in
/// the backend's memory, which stay valid for the trainer's lifetime.
template <Backend B>
class ModelViews {
 public:
  /// `copy`: the bfloat16 copy of the float32 values, element for element (null: none).
  ModelViews(const fusion::FusedBuffer<B>& values, const fusion::FusedBuffer<B>* gradients,
             BFloat16* copy = nullptr)
      : values_(&values), gradients_(gradients), copy_(copy) {}
  const fusion::FusedLayout& layout() const { return values_->layout(); }
  TensorView value(fusion::Slot slot) const { return values_->view(slot); }
  TensorView value(std::string_view name) const { return values_->view(name); }
  /// The gradient of a parameter (buffers have none: ConfigError).
  TensorView gradient(fusion::Slot slot) const { return gradients().view(slot); }
  TensorView gradient(std::string_view name) const { return gradients().view(name); }
  /// The bfloat16 copy of a float32 parameter, in the backend's memory, for a model that asks for
  /// one (bfloat16_copy(); ConfigError otherwise).
  TensorView copy(fusion::Slot slot) const {
    if (copy_ == nullptr) {
      throw ConfigError("ncclkit: ModelViews::copy: the trainer keeps no bfloat16 copy of \"" +
                        layout().name(slot) + "\"; give the model `bool bfloat16_copy() const` returning true");
    }
    const TensorView v = value(slot);
    if (v.dtype != DataType::kFloat32) {
      throw ConfigError("ncclkit: ModelViews::copy: \"" + layout().name(slot) + "\" holds " +
                        std::string(name_of(v.dtype)) + "; the bfloat16 copy is of float32 parameters");
    }
    if (v.count == 0) return TensorView{nullptr, 0, DataType::kBFloat16, B::memory_kind};
    const auto first = static_cast<std::size_t>(static_cast<const float*>(v.data) -
                                                static_cast<const float*>(values_->data(DataType::kFloat32)));
    return TensorView{copy_ + first, v.count, DataType::kBFloat16, B::memory_kind};
  }
  TensorView copy(std::string_view name) const { return copy(layout().slot(name)); }
  /// The copy's data as `T*`, a 2-byte bfloat16 type (ncclkit::BFloat16, CUDA's __nv_bfloat16).
  template <class T>
  T* copy_data(std::string_view name) const {
    return static_cast<T*>(checked<T>(copy(name), name).data);
  }
  template <class T>
  T* value_data(std::string_view name) const {
    return static_cast<T*>(checked<T>(value(name), name).data);
  }
  template <class T>
  T* gradient_data(std::string_view name) const {
    return static_cast<T*>(checked<T>(gradient(name), name).data);
  }
  B& backend() const { return values_->backend(); }

 private:
  const fusion::FusedBuffer<B>& gradients() const {
    if (gradients_ == nullptr) throw ConfigError("ncclkit: ModelViews: buffers have no gradients");
    return *gradients_;
  }
  template <class T>
  static TensorView checked(TensorView view, std::string_view name) {
    if (view.dtype != data_type_v<T>) {
      throw ConfigError("ncclkit: ModelViews: tensor \"" + std::string(name) + "\" holds " +
                        std::string(name_of(view.dtype)) + ", not " + std::string(name_of(data_type_v<T>)));
    }
    return view;
  }
  const fusion::FusedBuffer<B>* values_;
  const fusion::FusedBuffer<B>* gradients_;
  BFloat16* copy_;
};

/// What a model's forward_backward gets for one micro-batch.
template <Backend B>
class StepContext {
 public:
  using Stream = typename B::Stream;
  using Ready = std::function<void(fusion::Slot, Stream)>;
  /// `need`: what `need(slot)` does (nothing when empty).
  StepContext(Stream stream, double loss_weight, double* metrics, Ready ready, const fusion::FusedLayout& layout,
              std::uint64_t step, std::uint64_t seed, int rank, bool accumulate = true, Ready need = {})
      : stream_(stream),
        loss_weight_(loss_weight),
        metrics_(metrics),
        ready_(std::move(ready)),
        layout_(&layout),
        step_(step),
        seed_(seed),
        rank_(rank),
        accumulate_(accumulate),
        need_(std::move(need)) {}
  /// Where the model's work runs: the trainer's compute stream.
  Stream stream() const { return stream_; }
  /// What the gradient of the summed per-sample loss is multiplied by: one over the samples this
  /// rank contributes to the step (its micro-batches together), so that after averaging across
  /// ranks the gradients are those of the mean loss over the global batch.
  double loss_weight() const { return loss_weight_; }
  /// kMetricWords doubles in the backend's memory to add this batch's sums to (on stream()).
  double* metrics() const { return metrics_; }
  /// `slot`'s gradient is complete (written by work issued so far on stream()).
  void ready(fusion::Slot slot) { ready_(slot, stream_); }
  void ready(std::string_view name) { ready(layout_->slot(name)); }
  /// Forward is about to read `slot`'s values: work issued on stream() from now on sees the last
  /// step's update of them where the trainer defers it (TrainerOptions::defer_gather; a model
  /// that declares waits_for_values), and this does nothing otherwise. Never blocks the host on
  /// GPUs.
  void need(fusion::Slot slot) {
    if (need_) need_(slot, stream_);
  }
  void need(std::string_view name) { need(layout_->slot(name)); }
  /// The optimizer steps done before this one.
  std::uint64_t step() const { return step_; }
  /// A seed for this step's randomness (dropout, say): the same on every run of the same step,
  /// different per rank and step.
  std::uint64_t seed() const { return seed_; }
  int rank() const { return rank_; }
  /// True: add to the gradients. False (only for a model that declares overwrites_gradients, on
  /// the first micro-batch of a step): write them, since they hold the last step's values.
  bool accumulate() const { return accumulate_; }

 private:
  Stream stream_;
  double loss_weight_;
  double* metrics_;
  Ready ready_;
  const fusion::FusedLayout* layout_;
  std::uint64_t step_;
  std::uint64_t seed_;
  int rank_;
  bool accumulate_;
  Ready need_;
};

/// What a model's evaluate gets.
template <Backend B>
class EvalContext {
 public:
  using Stream = typename B::Stream;
  EvalContext(Stream stream, double* metrics) : stream_(stream), metrics_(metrics) {}
  Stream stream() const { return stream_; }
  double* metrics() const { return metrics_; }

 private:
  Stream stream_;
  double* metrics_;
};

template <class M, class B>
concept Model = Backend<B> && requires(M& model, fusion::FusedLayout& layout, const ModelViews<B>& views,
                                       const typename M::Batch& batch, StepContext<B>& step, EvalContext<B>& eval) {
  typename M::Batch;
  model.declare(layout);
  model.bind(views);
  model.forward_backward(batch, step);
  model.evaluate(batch, eval);
};

/// A model that writes its gradients on a step's first micro-batch (see the header comment).
template <class M>
concept OverwritesGradients = requires { requires static_cast<bool>(M::overwrites_gradients); };

/// A model whose parameters may be updated as soon as they are marked ready (see the header comment).
template <class M>
concept DoneWithValuesWhenReady = requires { requires static_cast<bool>(M::done_with_values_when_ready); };

/// A model that calls StepContext::need before it uses each parameter (see the header comment).
template <class M>
concept WaitsForValues = requires { requires static_cast<bool>(M::waits_for_values); };

/// A model that may ask for a bfloat16 copy of its parameters (see the header comment).
template <class M>
concept AsksForBFloat16Copy = requires(const M& model) {
  { model.bfloat16_copy() } -> std::convertible_to<bool>;
};

/// A model with state that is not trained (see the header comment).
template <class M, class B>
concept ModelWithBuffers = Model<M, B> && requires(M& model, fusion::FusedLayout& layout, const ModelViews<B>& views) {
  model.declare_buffers(layout);
  model.bind_buffers(views);
};

/// Where a trainer takes batches from: `size()` samples, and the batch of the given samples.
template <class D, class M>
concept Dataset = requires(const D& data, std::span<const std::size_t> indices) {
  { data.size() } -> std::convertible_to<std::size_t>;
  { data.batch(indices) } -> std::convertible_to<typename M::Batch>;
};

}  // namespace ncclkit::trainer
