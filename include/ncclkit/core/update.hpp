#pragma once
/// `UpdateRule`: one optimizer update of float32 parameters, element by element, as a backend's
/// `update` runs it (a CUDA kernel on GPUs, a loop on CPUs; core/backend.hpp), and the
/// arithmetic both share (`update_element`), so that CPU and GPU results agree to the rounding
/// of float. trainer/optimizer.hpp fills the rule from its options, the step and the schedule.
/// An update may also write each new parameter rounded to bfloat16 into a copy (a backend's
/// `update` takes it as a view, FusedUpdate as `copy`): the weights a model with bfloat16
/// compute reads, written in the same pass over the parameters.
///
/// SGD, PyTorch's `torch.optim.SGD`: g = scale·grad (+ weight_decay·p); with momentum,
/// buf = g on the first step, momentum·buf + (1 − dampening)·g after; g = g + momentum·buf
/// (Nesterov) or buf; p −= lr·g.
/// AdamW, PyTorch's `torch.optim.AdamW`: p ·= 1 − lr·weight_decay; m = β1·m + (1 − β1)·g;
/// v = β2·v + (1 − β2)·g²; p −= (lr / (1 − β1^t)) · m / (√v / √(1 − β2^t) + ε).

#include <cmath>        // std::sqrt
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint8_t
#include <type_traits>  // std::is_trivially_copyable_v

#include "ncclkit/core/half.hpp"  // BFloat16

namespace ncclkit {

struct UpdateRule {
  enum class Kind : std::uint8_t { kSgd, kAdamW };
  Kind kind = Kind::kSgd;
  float lr = 0.0f;
  /// SGD: L2 added to the gradient; AdamW: decoupled (parameters shrink by lr·weight_decay).
  float weight_decay = 0.0f;
  /// Multiplies every gradient before anything else (a clipping factor, an accumulation factor).
  float grad_scale = 1.0f;
  // SGD
  float momentum = 0.0f;
  float dampening = 0.0f;
  bool nesterov = false;
  /// The momentum buffer is the first step's gradient, not a blend with the zeros it holds.
  bool first_step = false;
  // AdamW
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  /// 1 − β1 and 1 − β2, computed on the host in double: in float, 1 − 0.999f is 1.3e-5 away
  /// from 0.001 (PyTorch rounds the double 1 − β2 once).
  float one_minus_beta1 = 0.1f;
  float one_minus_beta2 = 0.001f;
  float eps = 1e-8f;
  /// 1 − β1^t and 1 − β2^t for step t (from 1), computed on the host in double.
  float bias_correction1 = 1.0f;
  float bias_correction2 = 1.0f;

  /// How many float32 state values per parameter the rule keeps: 0 (SGD without momentum), 1
  /// (SGD's momentum buffer), 2 (AdamW's m and v).
  int state_count() const { return kind == Kind::kAdamW ? 2 : momentum != 0.0f ? 1 : 0; }
};

/// An update that a reduction applies itself, where its result lands (a reducer that can:
/// fusion/reducer.hpp, BucketReducer::can_update): `rule` over float32 `values` and state laid
/// out like the reduced data, element i of each belonging to the data's element i; `state0` and
/// `state1` null where the rule keeps fewer (UpdateRule::state_count); `copy`, where not null,
/// gets each updated value rounded to bfloat16 (to nearest, ties to even). Kernels take it by
/// value: it stays trivially copyable.
struct FusedUpdate {
  UpdateRule rule;
  float* values = nullptr;
  float* state0 = nullptr;
  float* state1 = nullptr;
  BFloat16* copy = nullptr;

  /// The name of the first buffer the rule needs that is null ("values", "state0", "state1"),
  /// or null when all are given: the one check of every API that takes an update.
  const char* missing() const {
    const int states = rule.state_count();
    if (values == nullptr) return "values";
    if (states > 0 && state0 == nullptr) return "state0";
    if (states > 1 && state1 == nullptr) return "state1";
    return nullptr;
  }
  /// The same update from element `first` on: every given pointer moved by `first` (a bucket's or
  /// a piece's part of a larger update), the null ones left null.
  FusedUpdate from(std::size_t first) const {
    const auto at = [first](auto* p) { return p == nullptr ? nullptr : p + first; };
    return {rule, at(values), at(state0), at(state1), at(copy)};
  }
};
static_assert(std::is_trivially_copyable_v<FusedUpdate>);

/// One element's update: `p` the parameter, `g` its gradient, `s0` and `s1` its state (only the
/// rule's state_count() of them are touched). Host and device code alike (CUDA: __host__
/// __device__ through the macro the kernels define).
#if defined(__CUDACC__)
#define NCCLKIT_UPDATE_FN __host__ __device__ inline
#else
#define NCCLKIT_UPDATE_FN inline
#endif
namespace detail::rounded {
// Each product and sum rounded on its own, never contracted into one FMA: nvcc contracts
// a·b + c differently in each kernel that inlines update_element, so the separate update kernel
// and the one fused into a reduction (nccl/compressed_reduce.hpp) would round differently. With
// these every GPU context computes the same bits, and those of the CPU's loop wherever the host
// compiler does not contract either (x86-64 without FMA instructions, or -ffp-contract=off).
NCCLKIT_UPDATE_FN float mul(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
NCCLKIT_UPDATE_FN float add(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
NCCLKIT_UPDATE_FN float sub(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
NCCLKIT_UPDATE_FN float div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}
NCCLKIT_UPDATE_FN float root(float a) {
#if defined(__CUDA_ARCH__)
  return __fsqrt_rn(a);
#else
  return std::sqrt(a);
#endif
}
}  // namespace detail::rounded

NCCLKIT_UPDATE_FN void update_element(const UpdateRule& r, float& p, float grad, float& s0, float& s1) {
  using detail::rounded::add, detail::rounded::sub, detail::rounded::mul, detail::rounded::div, detail::rounded::root;
  float g = mul(grad, r.grad_scale);
  if (r.kind == UpdateRule::Kind::kSgd) {
    if (r.weight_decay != 0.0f) g = add(g, mul(r.weight_decay, p));
    if (r.momentum != 0.0f) {
      s0 = r.first_step ? g : add(mul(r.momentum, s0), mul(sub(1.0f, r.dampening), g));
      g = r.nesterov ? add(g, mul(r.momentum, s0)) : s0;
    }
    p = sub(p, mul(r.lr, g));
    return;
  }
  p = mul(p, sub(1.0f, mul(r.lr, r.weight_decay)));
  s0 = add(mul(r.beta1, s0), mul(r.one_minus_beta1, g));
  s1 = add(mul(r.beta2, s1), mul(mul(r.one_minus_beta2, g), g));
  const float denominator = add(div(root(s1), root(r.bias_correction2)), r.eps);
  p = sub(p, div(mul(div(r.lr, r.bias_correction1), s0), denominator));
}
#undef NCCLKIT_UPDATE_FN

/// A backend's `sum_squares(in, out, stream)` takes `out` as this many doubles of its memory:
/// out[0] gets the sum of squares of `in` added to it; the rest is its scratch (the GPU kernel's
/// per-block partial sums, added in a fixed order so that every rank gets the same bits).
inline constexpr std::size_t kSquareSumWords = 1 + 256;

}  // namespace ncclkit
