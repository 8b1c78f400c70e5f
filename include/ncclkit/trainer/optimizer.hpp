#pragma once
/// `Optimizer<B>`: SGD (momentum, Nesterov, weight decay) and AdamW (decoupled weight decay,
/// bias correction) over the trainer's fused float32 parameters, their state kept in fused
/// buffers laid out like the gradients (one for SGD with momentum, two for AdamW), so that a
/// bucket's parameters, gradients and state are the same range of three allocations. The update
/// of a bucket is one pass over that range by the backend's `update` (core/update.hpp: a kernel
/// on GPUs, a loop on CPUs), and it may run as soon as that bucket's gradients have landed
/// (GradientSync::finish's per-bucket callback). Sharded optimizer state (ZeRO) will update a
/// rank's shard of each bucket by the same call over a smaller range.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cmath>     // std::pow, std::isfinite
#include <cstdio>    // std::snprintf
#include <cstddef>   // std::size_t, std::byte
#include <cstdint>   // std::uint64_t
#include <optional>  // std::optional
#include <string>    // std::string, std::to_string
#include <vector>    // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/core/update.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"

namespace ncclkit::trainer {

/// Designated initialisers: `{.kind = OptimizerKind::kAdamW, .weight_decay = 0.01}`. The learning
/// rate comes from the schedule (trainer/schedule.hpp).
enum class OptimizerKind { kSgd, kAdamW };
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::kSgd;
  /// SGD: added to the gradient as weight_decay·p; AdamW: decoupled, p ·= 1 − lr·weight_decay.
  double weight_decay = 0.0;
  // SGD
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;
  // AdamW
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;

  /// Why these options cannot run, naming the field; empty when they can.
  std::string problem() const {
    const std::string who = "ncclkit: OptimizerOptions: ";
    const auto in = [](double x, double lo, double hi) { return x >= lo && x <= hi; };
    if (!in(weight_decay, 0, 1e6)) return who + "weight_decay must be a non-negative number";
    if (kind == OptimizerKind::kSgd) {
      if (!in(momentum, 0, 1) || !in(dampening, 0, 1)) return who + "momentum and dampening must lie in [0, 1]";
      if (nesterov && (momentum == 0 || dampening != 0)) {
        return who + "Nesterov momentum needs momentum above 0 and no dampening (as PyTorch's SGD)";
      }
    } else if (!(beta1 >= 0 && beta1 < 1) || !(beta2 >= 0 && beta2 < 1) || !(eps > 0)) {
      return who + "AdamW needs beta1 and beta2 in [0, 1) and eps above 0";
    }
    return {};
  }
  /// "sgd momentum 0.9 ...": what checkpoints record and ranks compare.
  std::string describe() const {
    const auto f = [](double x) {
      char text[32];
      std::snprintf(text, sizeof text, "%.9g", x);
      return std::string(text);
    };
    if (kind == OptimizerKind::kSgd) {
      return "sgd momentum " + f(momentum) + " dampening " + f(dampening) + " nesterov " + (nesterov ? "on" : "off") +
             " weight_decay " + f(weight_decay);
    }
    return "adamw beta1 " + f(beta1) + " beta2 " + f(beta2) + " eps " + f(eps) + " weight_decay " + f(weight_decay);
  }
};

template <Backend B>
class Optimizer {
 public:
  using Stream = typename B::Stream;

  /// State for `params` (float32 tensors only: ConfigError naming another), zeroed on `stream`.
  Optimizer(fusion::FusedBuffer<B>& params, fusion::FusedBuffer<B>& gradients, OptimizerOptions options, Stream stream)
      : params_(&params), gradients_(&gradients), options_(options) {
    for (DataType type : params.layout().element_types()) {
      if (type != DataType::kFloat32) {
        throw ConfigError("ncclkit: Optimizer: the trainer updates float32 parameters; the model declares " +
                          std::string(name_of(type)) + " ones (keep them as buffers, or declare them float32)");
      }
    }
    const int states = rule(0.0, 1.0).state_count();
    for (int i = 0; i < states; ++i) {
      state_.emplace_back(params.backend(), params.layout());
      params.backend().fill_zero(state_.back().all(DataType::kFloat32), stream);
    }
  }

  const OptimizerOptions& options() const { return options_; }
  /// Steps done (updates of the whole model); what bias correction and SGD's first momentum
  /// step follow. A resume sets it back.
  std::uint64_t steps() const { return steps_; }
  void set_steps(std::uint64_t steps) { steps_ = steps; }
  /// The state buffers (0, 1 or 2), laid out like the parameters.
  std::vector<fusion::FusedBuffer<B>>& state() { return state_; }

  /// The rule of the step being taken, with learning rate `lr` and gradients multiplied by
  /// `grad_scale` first.
  UpdateRule rule(double lr, double grad_scale) const {
    UpdateRule r;
    r.lr = static_cast<float>(lr);
    r.weight_decay = static_cast<float>(options_.weight_decay);
    r.grad_scale = static_cast<float>(grad_scale);
    if (options_.kind == OptimizerKind::kSgd) {
      r.kind = UpdateRule::Kind::kSgd;
      r.momentum = static_cast<float>(options_.momentum);
      r.dampening = static_cast<float>(options_.dampening);
      r.nesterov = options_.nesterov;
      r.first_step = steps_ == 0;
    } else {
      r.kind = UpdateRule::Kind::kAdamW;
      r.beta1 = static_cast<float>(options_.beta1);
      r.beta2 = static_cast<float>(options_.beta2);
      r.one_minus_beta1 = static_cast<float>(1.0 - options_.beta1);
      r.one_minus_beta2 = static_cast<float>(1.0 - options_.beta2);
      r.eps = static_cast<float>(options_.eps);
      const double t = static_cast<double>(steps_ + 1);
      r.bias_correction1 = static_cast<float>(1.0 - std::pow(options_.beta1, t));
      r.bias_correction2 = static_cast<float>(1.0 - std::pow(options_.beta2, t));
    }
    return r;
  }

  /// Updates the parameters of `bucket` (its whole range, padding included: zeros stay zeros)
  /// by `rule`, on `stream`, and their bfloat16 copy where there is one (set_copy).
  void update(const fusion::Bucket& bucket, const UpdateRule& rule, Stream stream) {
    const auto range = [&](const fusion::FusedBuffer<B>& buffer) {
      return TensorView{static_cast<std::byte*>(buffer.data(bucket.dtype)) + bucket.begin_bytes, bucket.count(),
                        bucket.dtype, B::memory_kind};
    };
    const TensorView none{nullptr, 0, DataType::kFloat32, B::memory_kind};
    const TensorView copy = copy_ == nullptr ? TensorView{nullptr, 0, DataType::kBFloat16, B::memory_kind}
                                             : TensorView{copy_ + bucket.begin_bytes / sizeof(float), bucket.count(),
                                                          DataType::kBFloat16, B::memory_kind};
    params_->backend().update(rule, range(*params_), range(*gradients_), state_.size() > 0 ? range(state_[0]) : none,
                              state_.size() > 1 ? range(state_[1]) : none, copy, stream);
  }
  /// A bfloat16 copy of the float32 parameters, element for element, that every update writes
  /// too (null: none); it must outlive the optimizer's use.
  void set_copy(BFloat16* copy) { copy_ = copy; }
  /// Counts a step as done: after every bucket's update.
  void finish_step() { ++steps_; }

 private:
  fusion::FusedBuffer<B>* params_;
  fusion::FusedBuffer<B>* gradients_;
  OptimizerOptions options_;
  std::vector<fusion::FusedBuffer<B>> state_;
  BFloat16* copy_ = nullptr;
  std::uint64_t steps_ = 0;
};

}  // namespace ncclkit::trainer
