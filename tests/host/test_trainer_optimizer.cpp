// Tests of ncclkit/trainer/optimizer.hpp and the element-wise rule under it (core/update.hpp,
// core/detail/update_on_host.hpp), over the loop-back backend: SGD (momentum with the first
// step's buffer equal to the gradient, dampening, Nesterov, weight decay) and AdamW (decoupled
// weight decay, bias correction) on fused float32 tensors of odd sizes, six steps of random
// gradients with a changing learning rate and gradient scale, against a float64 reference
// written from PyTorch's torch.optim.SGD and torch.optim.AdamW formulas (norm-relative error
// <= 1e-6 per tensor, parameters and optimizer state alike); grad_scale equal to gradients
// scaled beforehand, bit for bit; the rule a resumed optimizer makes; a non-float32 layout and
// bad options refused; sum_squares_on_host against a float64 sum; update_problem's messages.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <cmath>    // std::sqrt, std::pow
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <random>   // std::mt19937_64
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/core/detail/update_on_host.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/fused_buffer.hpp"
#include "ncclkit/trainer/optimizer.hpp"
#include "support/loopback_backend.hpp"

namespace optimizer_tests {

using ncclkit::ConfigError;
using ncclkit::DataType;
using ncclkit::TensorView;
using ncclkit::UpdateRule;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::FusedBuffer;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::Slot;
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;
using ncclkit::trainer::Optimizer;
using ncclkit::trainer::OptimizerKind;
using ncclkit::trainer::OptimizerOptions;
using B = LoopbackBackend;

constexpr int kSteps = 6;

// Odd sizes, so that tensors end inside the alignment and buckets hold padding.
FusedLayout odd_layout() {
  FusedLayout layout;
  layout.add("embedding", {7, 13}, DataType::kFloat32);
  layout.add("norm", {5}, DataType::kFloat32);
  layout.add("conv", {3, 3, 3}, DataType::kFloat32);
  layout.add("scalar", {1}, DataType::kFloat32);
  layout.add("head", {11, 3}, DataType::kFloat32);
  layout.finalize();
  return layout;
}

// Uniform in [-1, 1) from the generator's raw bits (the standard fixes mt19937_64's output, not
// what its distributions make of it).
double uniform(std::mt19937_64& random) { return static_cast<double>(random() >> 11) * 0x1p-52 - 1.0; }

// The learning rate and gradient scale of step t: both change, as a schedule and clipping make them.
double lr_of(double base, int t) { return base * (0.5 + 0.25 * t); }
double scale_of(int t) { return t == 3 ? 0.375 : t == 4 ? 2.5 : 1.0; }

// One tensor in float64, as PyTorch's optimizers see it: p, and its state.
struct Reference {
  std::vector<double> p, s0, s1;
};

// One step t (from 1) of PyTorch's torch.optim.SGD / torch.optim.AdamW, in float64, on `ref`
// with gradient `grad` scaled by `scale` first.
void reference_step(const OptimizerOptions& o, Reference& ref, const std::vector<float>& grad, double lr, double scale,
                    int t) {
  for (std::size_t i = 0; i < ref.p.size(); ++i) {
    double g = scale * static_cast<double>(grad[i]);
    double& p = ref.p[i];
    if (o.kind == OptimizerKind::kSgd) {
      g += o.weight_decay * p;
      if (o.momentum != 0) {
        double& buf = ref.s0[i];
        buf = t == 1 ? g : o.momentum * buf + (1 - o.dampening) * g;
        g = o.nesterov ? g + o.momentum * buf : buf;
      }
      p -= lr * g;
    } else {
      p *= 1 - lr * o.weight_decay;
      double& m = ref.s0[i];
      double& v = ref.s1[i];
      m = o.beta1 * m + (1 - o.beta1) * g;
      v = o.beta2 * v + (1 - o.beta2) * g * g;
      const double bias_correction1 = 1 - std::pow(o.beta1, t);
      const double bias_correction2 = 1 - std::pow(o.beta2, t);
      p -= lr / bias_correction1 * m / (std::sqrt(v) / std::sqrt(bias_correction2) + o.eps);
    }
  }
}

// ‖got − want‖ / ‖want‖.
double relative_error(std::span<const float> got, const std::vector<double>& want) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    diff += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    norm += want[i] * want[i];
  }
  return norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
}

// Fused parameters, gradients and an optimizer over them, on one loop-back rank.
struct Setup {
  LoopbackWorld world{1};
  B backend{world, 0};
  FusedBuffer<B> params{backend, odd_layout()};
  FusedBuffer<B> grads{backend, params.layout()};
  // Small caps: several buckets, some of one tensor, some of several.
  BucketPlan plan = BucketPlan::compute(params.layout(), {.bucket_bytes = 256, .first_bucket_bytes = 64});

  Setup() {
    backend.fill_zero(params.all(DataType::kFloat32), backend.default_stream());
    backend.fill_zero(grads.all(DataType::kFloat32), backend.default_stream());
  }
  // One optimizer step: the rule of (lr, scale), each bucket updated, the step counted.
  void step(Optimizer<B>& optimizer, double lr, double scale) {
    const UpdateRule rule = optimizer.rule(lr, scale);
    for (const auto& bucket : plan.buckets()) optimizer.update(bucket, rule, backend.default_stream());
    optimizer.finish_step();
  }
  std::span<float> param(std::uint32_t i) const { return params.span<float>(Slot{i}); }
  std::span<float> grad(std::uint32_t i) const { return grads.span<float>(Slot{i}); }
  std::size_t tensors() const { return params.layout().size(); }
};

// Whether every element of the float32 allocation that no tensor covers is 0.
bool padding_is_zero(const FusedBuffer<B>& buffer) {
  const TensorView all = buffer.all(DataType::kFloat32);
  std::vector<bool> covered(all.count, false);
  for (std::uint32_t i = 0; i < buffer.layout().size(); ++i) {
    const std::size_t from = buffer.layout().offset_elements(Slot{i});
    for (std::size_t k = 0; k < buffer.layout().count(Slot{i}); ++k) covered[from + k] = true;
  }
  const auto* data = static_cast<const float*>(all.data);
  for (std::size_t k = 0; k < all.count; ++k) {
    if (!covered[k] && data[k] != 0.0f) return false;
  }
  return true;
}

// Six steps of `options` over the fused tensors and of the float64 reference, from the same
// random parameters and gradients; checks parameters and state per tensor.
void check_against_reference(const OptimizerOptions& options, double base_lr) {
  Setup s;
  std::mt19937_64 random(0x0b7e57 + static_cast<std::uint64_t>(base_lr * 1e6));
  std::vector<Reference> refs(s.tensors());
  for (std::uint32_t i = 0; i < s.tensors(); ++i) {
    for (float& p : s.param(i)) p = static_cast<float>(uniform(random));
    refs[i].p.assign(s.param(i).begin(), s.param(i).end());
    refs[i].s0.assign(refs[i].p.size(), 0.0);
    refs[i].s1.assign(refs[i].p.size(), 0.0);
  }
  Optimizer<B> optimizer(s.params, s.grads, options, s.backend.default_stream());
  const std::size_t states = options.kind == OptimizerKind::kAdamW ? 2 : options.momentum != 0 ? 1 : 0;
  REQUIRE(optimizer.state().size() == states);
  for (int t = 1; t <= kSteps; ++t) {
    CAPTURE(t);
    for (std::uint32_t i = 0; i < s.tensors(); ++i) {
      // Magnitudes from 1e-3 to 1 across tensors, signs mixed, never all zeros.
      const double magnitude = std::pow(10.0, -static_cast<double>(i % 4));
      for (float& g : s.grad(i)) g = static_cast<float>(magnitude * uniform(random));
      reference_step(options, refs[i], std::vector<float>(s.grad(i).begin(), s.grad(i).end()), lr_of(base_lr, t - 1),
                     scale_of(t - 1), t);
    }
    s.step(optimizer, lr_of(base_lr, t - 1), scale_of(t - 1));
    CHECK(optimizer.steps() == static_cast<std::uint64_t>(t));
    for (std::uint32_t i = 0; i < s.tensors(); ++i) {
      CAPTURE(s.params.layout().name(Slot{i}));
      CHECK(relative_error(s.param(i), refs[i].p) <= 1e-6);
      if (states > 0) CHECK(relative_error(optimizer.state()[0].span<float>(Slot{i}), refs[i].s0) <= 1e-6);
      if (states > 1) CHECK(relative_error(optimizer.state()[1].span<float>(Slot{i}), refs[i].s1) <= 1e-6);
    }
  }
  CHECK(padding_is_zero(s.params));
  for (const auto& state : optimizer.state()) CHECK(padding_is_zero(state));
}

}  // namespace optimizer_tests

using namespace optimizer_tests;

TEST_CASE("SGD matches a float64 torch.optim.SGD over six steps: plain, momentum, dampening, Nesterov, weight decay") {
  struct Case {
    const char* what;
    OptimizerOptions options;
    double lr;
  };
  const Case cases[] = {
      {"plain", {}, 0.1},
      {"weight decay", {.weight_decay = 0.05}, 0.1},
      {"momentum (first buffer = gradient)", {.momentum = 0.9}, 0.05},
      {"momentum, dampening, weight decay", {.weight_decay = 0.01, .momentum = 0.8, .dampening = 0.3}, 0.05},
      {"Nesterov", {.momentum = 0.9, .nesterov = true}, 0.05},
      {"Nesterov, weight decay", {.weight_decay = 0.02, .momentum = 0.7, .nesterov = true}, 0.02},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    REQUIRE(c.options.problem() == "");
    check_against_reference(c.options, c.lr);
  }
}

TEST_CASE("AdamW matches a float64 torch.optim.AdamW over six steps: decoupled weight decay, bias correction") {
  struct Case {
    const char* what;
    OptimizerOptions options;
    double lr;
  };
  const Case cases[] = {
      {"defaults", {.kind = OptimizerKind::kAdamW}, 1e-2},
      {"weight decay", {.kind = OptimizerKind::kAdamW, .weight_decay = 0.1}, 3e-2},
      {"other betas and eps", {.kind = OptimizerKind::kAdamW, .weight_decay = 0.01, .beta1 = 0.5, .beta2 = 0.95, .eps = 1e-4},
       1e-2},
      {"beta1 0 (RMSProp-like)", {.kind = OptimizerKind::kAdamW, .beta1 = 0.0, .beta2 = 0.9}, 1e-3},
  };
  for (const Case& c : cases) {
    const std::string what = c.what;
    CAPTURE(what);
    REQUIRE(c.options.problem() == "");
    check_against_reference(c.options, c.lr);
  }
}

TEST_CASE("the rule's grad_scale equals gradients scaled beforehand, bit for bit") {
  for (const OptimizerOptions options : {OptimizerOptions{.weight_decay = 0.01, .momentum = 0.9, .nesterov = true},
                                         OptimizerOptions{.kind = OptimizerKind::kAdamW, .weight_decay = 0.01}}) {
    CAPTURE(options.describe());
    Setup scaled, prescaled;
    std::mt19937_64 random(77);
    for (std::uint32_t i = 0; i < scaled.tensors(); ++i) {
      for (std::size_t k = 0; k < scaled.param(i).size(); ++k) {
        scaled.param(i)[k] = prescaled.param(i)[k] = static_cast<float>(uniform(random));
      }
    }
    Optimizer<B> a(scaled.params, scaled.grads, options, scaled.backend.default_stream());
    Optimizer<B> b(prescaled.params, prescaled.grads, options, prescaled.backend.default_stream());
    constexpr float kScale = 0.3125f;
    for (int t = 0; t < kSteps; ++t) {
      for (std::uint32_t i = 0; i < scaled.tensors(); ++i) {
        for (std::size_t k = 0; k < scaled.grad(i).size(); ++k) {
          const auto g = static_cast<float>(uniform(random));
          scaled.grad(i)[k] = g;
          prescaled.grad(i)[k] = g * kScale;
        }
      }
      scaled.step(a, 0.01, kScale);
      prescaled.step(b, 0.01, 1.0);
    }
    for (std::uint32_t i = 0; i < scaled.tensors(); ++i) {
      CAPTURE(i);
      CHECK(std::vector<float>(scaled.param(i).begin(), scaled.param(i).end()) ==
            std::vector<float>(prescaled.param(i).begin(), prescaled.param(i).end()));
    }
  }
}

TEST_CASE("the rule follows the optimizer's step: SGD's first step, AdamW's bias correction, and after set_steps") {
  Setup s;
  Optimizer<B> sgd(s.params, s.grads, {.weight_decay = 0.25, .momentum = 0.9, .dampening = 0.5}, s.backend.default_stream());
  UpdateRule r = sgd.rule(0.5, 0.75);
  CHECK(r.kind == UpdateRule::Kind::kSgd);
  CHECK(r.first_step);
  CHECK(r.lr == 0.5f);
  CHECK(r.grad_scale == 0.75f);
  CHECK(r.weight_decay == 0.25f);
  CHECK(r.momentum == 0.9f);
  CHECK(r.dampening == 0.5f);
  CHECK(r.state_count() == 1);
  sgd.finish_step();
  CHECK_FALSE(sgd.rule(0.5, 1).first_step);
  sgd.set_steps(0);
  CHECK(sgd.rule(0.5, 1).first_step);

  Optimizer<B> adam(s.params, s.grads, {.kind = OptimizerKind::kAdamW, .beta1 = 0.8, .beta2 = 0.99},
                    s.backend.default_stream());
  r = adam.rule(1e-3, 1);
  CHECK(r.kind == UpdateRule::Kind::kAdamW);
  CHECK(r.state_count() == 2);
  CHECK(r.bias_correction1 == doctest::Approx(0.2).epsilon(1e-7));
  CHECK(r.bias_correction2 == doctest::Approx(0.01).epsilon(1e-6));
  adam.set_steps(9);  // a resume after 9 steps: the 10th step's correction
  r = adam.rule(1e-3, 1);
  CHECK(r.bias_correction1 == doctest::Approx(1 - std::pow(0.8, 10)).epsilon(1e-7));
  CHECK(r.bias_correction2 == doctest::Approx(1 - std::pow(0.99, 10)).epsilon(1e-6));
  CHECK(UpdateRule{}.state_count() == 0);
}

TEST_CASE("an optimizer over parameters that are not all float32 is a ConfigError naming the type") {
  for (const DataType other : {DataType::kFloat16, DataType::kFloat64}) {
    CAPTURE(ncclkit::name_of(other));
    LoopbackWorld world(1);
    B backend(world, 0);
    FusedLayout layout;
    layout.add("w", {3, 5}, DataType::kFloat32);
    layout.add("odd", {7}, other);
    layout.finalize();
    FusedBuffer<B> params(backend, layout);
    FusedBuffer<B> grads(backend, layout);
    const std::string expected = "the trainer updates float32 parameters; the model declares " +
                                 std::string(ncclkit::name_of(other)) + " ones";
    CHECK_THROWS_WITH_AS(Optimizer<B>(params, grads, {.momentum = 0.9}, backend.default_stream()),
                         doctest::Contains(expected.c_str()), ConfigError);
  }
}

TEST_CASE("OptimizerOptions::problem names the field of a value that cannot run") {
  const std::string who = "ncclkit: OptimizerOptions: ";
  CHECK(OptimizerOptions{}.problem() == "");
  CHECK(OptimizerOptions{.momentum = 0.9, .nesterov = true}.problem() == "");
  CHECK(OptimizerOptions{.kind = OptimizerKind::kAdamW, .beta1 = 0, .beta2 = 0}.problem() == "");
  const std::string nesterov = who + "Nesterov momentum needs momentum above 0 and no dampening (as PyTorch's SGD)";
  CHECK(OptimizerOptions{.momentum = 0.9, .dampening = 0.1, .nesterov = true}.problem() == nesterov);
  CHECK(OptimizerOptions{.nesterov = true}.problem() == nesterov);
  const std::string range = who + "momentum and dampening must lie in [0, 1]";
  CHECK(OptimizerOptions{.momentum = 1.5}.problem() == range);
  CHECK(OptimizerOptions{.momentum = -0.1}.problem() == range);
  CHECK(OptimizerOptions{.momentum = 0.9, .dampening = 2}.problem() == range);
  CHECK(OptimizerOptions{.weight_decay = -1e-4}.problem() == who + "weight_decay must be a non-negative number");
  CHECK(OptimizerOptions{.weight_decay = std::nan("")}.problem() == who + "weight_decay must be a non-negative number");
  const std::string betas = who + "AdamW needs beta1 and beta2 in [0, 1) and eps above 0";
  for (const OptimizerOptions bad : {OptimizerOptions{.kind = OptimizerKind::kAdamW, .beta1 = 1.0},
                                     OptimizerOptions{.kind = OptimizerKind::kAdamW, .beta1 = -0.1},
                                     OptimizerOptions{.kind = OptimizerKind::kAdamW, .beta2 = 1.0},
                                     OptimizerOptions{.kind = OptimizerKind::kAdamW, .beta2 = std::nan("")},
                                     OptimizerOptions{.kind = OptimizerKind::kAdamW, .eps = 0},
                                     OptimizerOptions{.kind = OptimizerKind::kAdamW, .eps = -1e-8}}) {
    CAPTURE(bad.describe());
    CHECK(bad.problem() == betas);
  }
  CHECK(OptimizerOptions{.kind = OptimizerKind::kAdamW, .weight_decay = -1}.problem() ==
        who + "weight_decay must be a non-negative number");
}

TEST_CASE("sum_squares_on_host adds the float64 sum of squares of any floating type to out[0]") {
  std::mt19937_64 random(2024);
  std::vector<float> f(1001);
  std::vector<double> d(777);
  std::vector<ncclkit::Half> h(513);
  std::vector<ncclkit::BFloat16> bf(129);
  for (auto& x : f) x = static_cast<float>(10 * uniform(random));
  for (auto& x : d) x = 1e3 * uniform(random);
  for (auto& x : h) x = ncclkit::Half(static_cast<float>(4 * uniform(random)));
  for (auto& x : bf) x = ncclkit::BFloat16(static_cast<float>(4 * uniform(random)));
  const auto check_sum = [](const TensorView& in, auto value_of) {
    double want = 0;
    long double independent = 0;
    for (std::size_t i = 0; i < in.count; ++i) {
      const double v = value_of(i);
      want += v * v;
      independent += static_cast<long double>(v) * v;
    }
    double out[2] = {1.5, -7.0};  // out[0] is added to; out[1] is left alone
    ncclkit::detail::sum_squares_on_host(in, out);
    CHECK(out[0] == 1.5 + want);
    CHECK(out[0] == doctest::Approx(1.5 + static_cast<double>(independent)).epsilon(1e-12));
    CHECK(out[1] == -7.0);
  };
  const auto host = ncclkit::MemoryKind::kHost;
  check_sum(TensorView{f.data(), f.size(), DataType::kFloat32, host}, [&](std::size_t i) { return double(f[i]); });
  check_sum(TensorView{d.data(), d.size(), DataType::kFloat64, host}, [&](std::size_t i) { return d[i]; });
  check_sum(TensorView{h.data(), h.size(), DataType::kFloat16, host},
            [&](std::size_t i) { return double(static_cast<float>(h[i])); });
  check_sum(TensorView{bf.data(), bf.size(), DataType::kBFloat16, host},
            [&](std::size_t i) { return double(static_cast<float>(bf[i])); });
  double out = 3.0;
  ncclkit::detail::sum_squares_on_host(TensorView{nullptr, 0, DataType::kFloat32, host}, &out);
  CHECK(out == 3.0);
}

TEST_CASE("update_problem names what an update's views lack, and the backend refuses them with it") {
  std::vector<float> p(5), g(5), g4(4), s0(5), s1(5);
  std::vector<ncclkit::Half> half(5);
  const auto host = ncclkit::MemoryKind::kHost;
  const auto f32 = [&](std::vector<float>& v) { return TensorView{v.data(), v.size(), DataType::kFloat32, host}; };
  const TensorView none{nullptr, 0, DataType::kFloat32, host};
  const TensorView half_view{half.data(), half.size(), DataType::kFloat16, host};
  const UpdateRule plain{};
  const UpdateRule momentum{.momentum = 0.9f};
  const UpdateRule adam{.kind = UpdateRule::Kind::kAdamW};
  using ncclkit::detail::update_problem;
  CHECK(update_problem(plain, f32(p), f32(g), none, none, none) == "");
  CHECK(update_problem(momentum, f32(p), f32(g), f32(s0), none, none) == "");
  CHECK(update_problem(adam, f32(p), f32(g), f32(s0), f32(s1), none) == "");
  CHECK(update_problem(plain, half_view, f32(g), none, none, none) ==
        "update needs float32 parameters and gradients of one count (half × 5, float × 5)");
  CHECK(update_problem(plain, f32(p), f32(g4), none, none, none) ==
        "update needs float32 parameters and gradients of one count (float × 5, float × 4)");
  CHECK(update_problem(plain, f32(p), half_view, none, none, none) ==
        "update needs float32 parameters and gradients of one count (float × 5, half × 5)");
  const std::string one = "this update keeps 1 float32 state values per parameter: give as many state views of the "
                          "parameters' count";
  const std::string two = "this update keeps 2 float32 state values per parameter: give as many state views of the "
                          "parameters' count";
  CHECK(update_problem(momentum, f32(p), f32(g), none, none, none) == one);
  CHECK(update_problem(momentum, f32(p), f32(g), f32(g4), none, none) == one);
  CHECK(update_problem(adam, f32(p), f32(g), f32(s0), none, none) == two);
  CHECK(update_problem(adam, f32(p), f32(g), f32(s0), half_view, none) == two);

  LoopbackWorld world(1);
  B backend(world, 0);
  CHECK_THROWS_WITH_AS(backend.update(adam, f32(p), f32(g), f32(s0), none, none, backend.default_stream()),
                       ("LoopbackBackend::update: " + two).c_str(), ConfigError);

  // The bfloat16 copy: none (null data), or bfloat16 of the parameters' count.
  std::vector<ncclkit::BFloat16> copy5(5), copy4(4);
  const TensorView bf16_5{copy5.data(), 5, DataType::kBFloat16, host};
  const TensorView bf16_4{copy4.data(), 4, DataType::kBFloat16, host};
  CHECK(update_problem(plain, f32(p), f32(g), none, none, bf16_5) == "");
  const std::string copy_problem = "the copy an update writes is bfloat16 of the parameters' count (5), not ";
  CHECK(update_problem(plain, f32(p), f32(g), none, none, bf16_4) ==
        copy_problem + "bfloat16 × 4; give a view with null data for none");
  CHECK(update_problem(plain, f32(p), f32(g), none, none, half_view) ==
        copy_problem + "half × 5; give a view with null data for none");
  CHECK_THROWS_WITH_AS(backend.update(plain, f32(p), f32(g), none, none, f32(s0), backend.default_stream()),
                       ("LoopbackBackend::update: " + copy_problem + "float × 5; give a view with null data for none")
                           .c_str(),
                       ConfigError);
}

TEST_CASE("an update writes each new value's bfloat16 copy, rounded to nearest even, in the same pass") {
  // Values chosen so that the new parameter lands on, beside and between bfloat16 neighbours:
  // 1 + 2^-8 is a tie (rounds to the even 1), 1 + 3·2^-8 a tie that rounds up, 1 + 2^-9 below half.
  const float tie_even = 1.0f + 0x1p-8f, tie_up = 1.0f + 0x1p-7f + 0x1p-8f, below = 1.0f + 0x1p-9f;
  std::vector<float> p{tie_even, tie_up, below, -3.0f, 0.0f}, g(5, 0.0f), p_ref = p;
  g[3] = 1.0f;  // -3 - 0.5 · 1 = -3.5, exact in bfloat16
  std::vector<ncclkit::BFloat16> copy(5, ncclkit::BFloat16::from_bits(0xffff));
  const auto host = ncclkit::MemoryKind::kHost;
  const auto f32 = [&](std::vector<float>& v) { return TensorView{v.data(), v.size(), DataType::kFloat32, host}; };
  const TensorView none{nullptr, 0, DataType::kFloat32, host};
  const UpdateRule sgd{.lr = 0.5f};
  LoopbackWorld world(1);
  B backend(world, 0);
  backend.update(sgd, f32(p), f32(g), none, none, TensorView{copy.data(), 5, DataType::kBFloat16, host},
                 backend.default_stream());
  backend.synchronize(backend.default_stream());
  CHECK(p[3] == -3.5f);
  const std::vector<std::uint16_t> want{0x3f80, 0x3f82, 0x3f80, 0xc060, 0x0000};
  for (std::size_t i = 0; i < 5; ++i) {
    CAPTURE(i);
    CHECK(copy[i].bits == want[i]);
    CHECK(copy[i].bits == ncclkit::BFloat16(p[i]).bits);
  }
  // The parameters get what they get without a copy.
  std::vector<float> g_ref = g;
  backend.update(sgd, f32(p_ref), f32(g_ref), none, none, none, backend.default_stream());
  backend.synchronize(backend.default_stream());
  CHECK(p_ref == p);
}
