// The cuBLAS MLP of examples/mlp_cublas as a trainer Model: on one GPU, its gradients (float32
// GEMMs, TF32 off) against a float64 host reference of the same MLP, added to what the gradient
// buffers held, each tensor marked ready in backward order once its gradient is complete on the
// stream, also at sizes that are multiples of nothing; with TF32, within TF32's tolerance; with
// bf16 compute, within bf16's, and each call computing with the float32 values as they are then.
// On 2 GPUs, the trainer over it: the loss falls over 20 steps and both ranks end with identical
// parameters, with float32 and fp16 gradients.
// ncclkit-test: labels=nccl timeout=300
#include <doctest/doctest.h>

#include <algorithm>   // std::max
#include <chrono>      // std::chrono::seconds
#include <cstdint>     // std::uint64_t
#include <cstdio>      // std::printf
#include <cmath>       // std::fabs, std::sqrt
#include <fstream>     // std::ofstream, std::ifstream
#include <iterator>    // std::istreambuf_iterator
#include <map>         // std::map
#include <memory>      // std::shared_ptr
#include <string>      // std::string
#include <utility>     // std::pair, std::move
#include <vector>      // std::vector

#include "gpu/nccl_support.hpp"
#include "mlp_cublas/mlp_cublas.cuh"
#include "mlp_cublas/synthetic_data.cuh"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/trainer.hpp"
#include "support/temp_dir.hpp"

namespace mlp_cublas_test {

using Communicator = ncclkit::nccl::Communicator;
using Model = mlp_cublas::MlpCublas<Communicator>;

// Small and not square, so that a transposed operand or a swapped leading dimension shows.
constexpr mlp_cublas::MlpOptions kShape{.input = 24, .width = 32, .output = 16, .depth = 3};
constexpr std::size_t kBatch = 8;

std::vector<float> download(Communicator& comm, const void* data, std::size_t count) {
  std::vector<float> host(count);
  comm.copy_to_host(host.data(), data, count * sizeof(float));
  comm.synchronize();
  return host;
}

/// The gradients of loss_weight × Σ_s ℓ_s, ℓ_s = Σ_o (p_o − y_o)² / output, of the MLP with the
/// given float32 weights, in float64: plain loops over row-major arrays, nothing shared with the
/// model's cuBLAS calls.
struct Reference {
  std::vector<std::vector<double>> weight, bias;  // per layer
  double loss_sum = 0;
};

Reference reference_gradients(const mlp_cublas::MlpOptions& o, const std::vector<std::vector<float>>& weights,
                              const std::vector<std::vector<float>>& biases, const std::vector<float>& x,
                              const std::vector<float>& y, std::size_t n, double loss_weight) {
  // a[l]: the input of layer l (a[0] = x); z[l]: layer l's pre-activation.
  std::vector<std::vector<double>> a(o.depth + 1), z(o.depth);
  a[0].assign(x.begin(), x.end());
  for (std::size_t l = 0; l < o.depth; ++l) {
    const std::size_t in = o.in_features(l), out = o.out_features(l);
    z[l].assign(n * out, 0.0);
    a[l + 1].assign(n * out, 0.0);
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t j = 0; j < out; ++j) {
        double sum = biases[l][j];
        for (std::size_t i = 0; i < in; ++i) sum += double(weights[l][j * in + i]) * a[l][s * in + i];
        z[l][s * out + j] = sum;
        a[l + 1][s * out + j] = l + 1 < o.depth ? std::max(sum, 0.0) : sum;
      }
    }
  }
  Reference r;
  r.weight.resize(o.depth);
  r.bias.resize(o.depth);
  std::vector<double> delta(n * o.output);
  for (std::size_t i = 0; i < n * o.output; ++i) {
    const double d = a[o.depth][i] - double(y[i]);
    r.loss_sum += d * d / double(o.output);
    delta[i] = loss_weight * 2.0 * d / double(o.output);
  }
  for (std::size_t l = o.depth; l-- > 0;) {
    const std::size_t in = o.in_features(l), out = o.out_features(l);
    r.weight[l].assign(out * in, 0.0);
    r.bias[l].assign(out, 0.0);
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t j = 0; j < out; ++j) {
        r.bias[l][j] += delta[s * out + j];
        for (std::size_t i = 0; i < in; ++i) r.weight[l][j * in + i] += delta[s * out + j] * a[l][s * in + i];
      }
    }
    if (l == 0) break;
    std::vector<double> below(n * in, 0.0);
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t i = 0; i < in; ++i) {
        if (!(z[l - 1][s * in + i] > 0)) continue;
        double sum = 0;
        for (std::size_t j = 0; j < out; ++j) sum += delta[s * out + j] * double(weights[l][j * in + i]);
        below[s * in + i] = sum;
      }
    }
    delta = std::move(below);
  }
  return r;
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::fabs(e));
  return m;
}

/// One forward_backward of the model of `shape` on `samples` samples on one GPU, checked against
/// the reference: gradients that held `prior` (random, of the reference's scale) must hold
/// prior + reference afterwards.
/// `element_tolerance` bounds each element's error relative to its tensor's largest reference
/// value (0: no element-wise check); `norm_tolerance` bounds ‖got − expected‖ / ‖reference‖ per
/// tensor.
int check_gradients(const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store,
                    mlp_cublas::MlpOptions shape, std::size_t samples, double element_tolerance,
                    double norm_tolerance) {
  ncclkit_test::Checker checker(me.rank);
  Communicator comm(store, me, ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "mlp-grads"});
  shape.seed = 5;
  Model model(shape);
  ncclkit::fusion::FusedLayout layout;
  model.declare(layout);
  layout.finalize();
  ncclkit::fusion::FusedBuffer<Communicator> values(comm, layout), gradients(comm, values.layout());
  model.bind(ncclkit::trainer::ModelViews<Communicator>(values, &gradients));
  const mlp_cublas::SyntheticData data(shape.input, shape.output, samples, 11, comm.device());
  const mlp_cublas::Batch batch = data.batch(0, samples);
  const double loss_weight = 1.0 / static_cast<double>(samples);

  std::vector<std::vector<float>> weights, biases;
  for (std::size_t l = 0; l < shape.depth; ++l) {
    weights.push_back(download(comm, values.view(mlp_cublas::weight_name(l)).data, shape.in_features(l) * shape.out_features(l)));
    biases.push_back(download(comm, values.view(mlp_cublas::bias_name(l)).data, shape.out_features(l)));
  }
  const std::vector<float> x = download(comm, data.inputs(), samples * shape.input);
  const std::vector<float> y = download(comm, data.targets(), samples * shape.output);
  const Reference ref = reference_gradients(shape, weights, biases, x, y, samples, loss_weight);

  // What the gradients hold before: random values of the reference's scale, so that a model that
  // overwrites them (beta = 0), or adds twice, is off by far more than the tolerance.
  std::map<std::string, std::vector<float>> prior;
  std::uint64_t seed = 1;
  for (std::size_t l = 0; l < shape.depth; ++l) {
    for (const auto& [name, expected] : {std::pair{mlp_cublas::weight_name(l), &ref.weight[l]},
                                         std::pair{mlp_cublas::bias_name(l), &ref.bias[l]}}) {
      std::vector<float> p(expected->size());
      const double scale = max_abs(*expected);
      for (std::size_t i = 0; i < p.size(); ++i) {
        p[i] = static_cast<float>(scale * (2 * ncclkit_test::unit(seed, 0, i) - 1));
      }
      ++seed;
      comm.copy_from_host(gradients.view(name).data, p.data(), p.size() * sizeof(float));
      prior[name] = std::move(p);
    }
  }
  ncclkit::nccl::DeviceBuffer<double> metrics(ncclkit::trainer::kMetricWords, comm.device());
  comm.fill_zero(metrics.view());
  comm.synchronize();

  // Each ready() is checked for what it promises: the gradient is complete on the stream, so a
  // copy taken right then equals the final one.
  std::vector<std::string> order;
  std::map<std::string, std::vector<float>> at_ready;
  ncclkit::trainer::StepContext<Communicator> step(
      comm.default_stream(), loss_weight, metrics.data(),
      [&](ncclkit::fusion::Slot slot, cudaStream_t stream) {
        const std::string name = layout.name(slot);
        order.push_back(name);
        comm.synchronize(stream);
        at_ready[name] = download(comm, gradients.view(slot).data, gradients.view(slot).count);
      },
      layout, 0, 0, me.rank);
  model.forward_backward(batch, step);
  comm.synchronize();

  std::vector<std::string> expected_order;
  for (std::size_t l = shape.depth; l-- > 0;) {
    expected_order.push_back(mlp_cublas::weight_name(l));
    expected_order.push_back(mlp_cublas::bias_name(l));
  }
  checker.expect(order == expected_order, "tensors are marked ready once each, last layer first, weight then bias");
  for (std::size_t l = 0; l < shape.depth; ++l) {
    for (const auto& [name, expected] : {std::pair{mlp_cublas::weight_name(l), &ref.weight[l]},
                                         std::pair{mlp_cublas::bias_name(l), &ref.bias[l]}}) {
      const std::vector<float> got = download(comm, gradients.view(name).data, expected->size());
      const std::vector<float>& p = prior[name];
      const double scale = max_abs(*expected);
      double diff = 0, norm = 0, worst = 0;
      for (std::size_t i = 0; i < got.size(); ++i) {
        const double e = double(got[i]) - double(p[i]) - (*expected)[i];
        diff += e * e;
        norm += (*expected)[i] * (*expected)[i];
        worst = std::max(worst, std::fabs(e));
      }
      const double relative = std::sqrt(diff / norm);
      std::printf("%s: max error %.3e (%.3e of its largest value), norm-relative %.3e\n", name.c_str(), worst,
                  worst / scale, relative);
      checker.expect(scale > 0, name + ": the reference gradient is not all zeros");
      if (element_tolerance > 0) {
        checker.expect(worst <= element_tolerance * scale,
                       name + ": an element is off by " + std::to_string(worst / scale) +
                           " of the largest reference value, more than " + std::to_string(element_tolerance));
      }
      checker.expect(relative <= norm_tolerance, name + ": norm-relative error " + std::to_string(relative) +
                                                     " above " + std::to_string(norm_tolerance));
      checker.expect(at_ready.count(name) == 1 && at_ready[name] == got,
                     name + ": at ready() the gradient already held its final value");
    }
  }
  double host[ncclkit::trainer::kMetricWords] = {};
  comm.copy_to_host(host, metrics.data(), sizeof host);
  comm.synchronize();
  checker.expect(std::fabs(host[0] - ref.loss_sum) <= norm_tolerance * ref.loss_sum,
                 "loss sum " + std::to_string(host[0]) + " against the reference's " + std::to_string(ref.loss_sum));
  checker.expect(host[1] == 0 && host[2] == double(samples), "metrics count the batch's samples");
  return checker.finish("cuBLAS MLP gradients");
}

/// kBf16 computes with a bfloat16 copy of the float32 values: each forward_backward and evaluate
/// must take the values as they are at that call. Zeroed values give an output of zeros, whose
/// loss sum Σ y² / output the host computes; the values restored give the first loss again. A
/// copy refreshed less often (at bind, or by the other call only) gives the other loss.
int check_bf16_refresh(const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
  ncclkit_test::Checker checker(me.rank);
  Communicator comm(store, me, ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "mlp-bf16"});
  mlp_cublas::MlpOptions shape = kShape;
  shape.precision = mlp_cublas::Precision::kBf16;
  Model model(shape);
  ncclkit::fusion::FusedLayout layout;
  model.declare(layout);
  layout.finalize();
  ncclkit::fusion::FusedBuffer<Communicator> values(comm, layout), gradients(comm, values.layout());
  model.bind(ncclkit::trainer::ModelViews<Communicator>(values, &gradients));
  const mlp_cublas::SyntheticData data(shape.input, shape.output, kBatch, 11, comm.device());
  const mlp_cublas::Batch batch = data.batch(0, kBatch);
  double zeros_loss = 0;
  for (float v : download(comm, data.targets(), kBatch * shape.output)) {
    zeros_loss += double(v) * double(v) / double(shape.output);
  }

  const ncclkit::TensorView all = values.all(ncclkit::DataType::kFloat32);
  const std::vector<float> initial = download(comm, all.data, all.count);
  ncclkit::nccl::DeviceBuffer<double> metrics(ncclkit::trainer::kMetricWords, comm.device());
  const auto loss_sum = [&](bool train) {
    comm.fill_zero(metrics.view());
    if (train) {
      ncclkit::trainer::StepContext<Communicator> step(
          comm.default_stream(), 1.0 / double(kBatch), metrics.data(), [](ncclkit::fusion::Slot, cudaStream_t) {},
          layout, 0, 0, me.rank);
      model.forward_backward(batch, step);
    } else {
      ncclkit::trainer::EvalContext<Communicator> eval(comm.default_stream(), metrics.data());
      model.evaluate(batch, eval);
    }
    double host[ncclkit::trainer::kMetricWords] = {};
    comm.copy_to_host(host, metrics.data(), sizeof host);
    comm.synchronize();
    return host[0];
  };
  const auto near = [](double got, double expected) { return std::fabs(got - expected) <= 1e-6 * expected; };
  const double first = loss_sum(true);
  comm.fill_zero(all);
  const double train_zeroed = loss_sum(true);
  comm.copy_from_host(all.data, initial.data(), initial.size() * sizeof(float));
  const double eval_restored = loss_sum(false);
  comm.fill_zero(all);
  const double eval_zeroed = loss_sum(false);
  std::printf(
      "bf16 loss sums: first %.6f, zero output %.6f; forward_backward on zeroed values %.6f, evaluate on "
      "restored values %.6f, on zeroed values %.6f\n",
      first, zeros_loss, train_zeroed, eval_restored, eval_zeroed);
  checker.expect(std::fabs(first - zeros_loss) > 0.1 * zeros_loss, "the first loss differs from a zero output's");
  checker.expect(near(train_zeroed, zeros_loss), "forward_backward computed with the zeroed values");
  checker.expect(near(eval_restored, first), "evaluate computed with the restored values");
  checker.expect(near(eval_zeroed, zeros_loss), "evaluate computed with the zeroed values");
  return checker.finish("cuBLAS MLP bf16 copy refreshed");
}

std::string read_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>());
}

}  // namespace mlp_cublas_test

TEST_CASE("the cuBLAS MLP adds the float64 reference's gradients and marks each tensor ready once it is complete") {
  if (!ncclkit_test::have_gpus(1, "the cuBLAS MLP's gradients")) return;
  SUBCASE("float32 GEMMs: every element within 2e-5 of its tensor's largest value") {
    ncclkit_test::run_workers(1, [](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
      mlp_cublas::MlpOptions shape = mlp_cublas_test::kShape;
      shape.precision = mlp_cublas::Precision::kFloat32;
      return mlp_cublas_test::check_gradients(me, store, shape, mlp_cublas_test::kBatch, 2e-5, 1e-5);
    });
  }
  SUBCASE("float32 GEMMs at odd sizes (23 -> 30 -> 30 -> 17, 7 samples): no size must be a multiple of anything") {
    ncclkit_test::run_workers(1, [](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
      const mlp_cublas::MlpOptions shape{.input = 23, .width = 30, .output = 17, .depth = 3,
                                         .precision = mlp_cublas::Precision::kFloat32};
      return mlp_cublas_test::check_gradients(me, store, shape, 7, 2e-5, 1e-5);
    });
  }
  SUBCASE("TF32 GEMMs (the default): norm-relative error within 1e-2") {
    ncclkit_test::run_workers(1, [](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
      mlp_cublas::MlpOptions shape = mlp_cublas_test::kShape;
      shape.precision = mlp_cublas::Precision::kTf32;
      return mlp_cublas_test::check_gradients(me, store, shape, mlp_cublas_test::kBatch, 0, 1e-2);
    });
  }
  // bf16 has 8 significant bits: each rounding (of the inputs, of the weights' copy, of every
  // activation and delta, once or twice per layer) is off by up to 2^-8 relative, about 2e-3
  // rms, and about ten of them lie on each gradient's path: about 6e-3 norm-relative. A host
  // emulation of exactly these roundings on this shape and data gives 5.6e-3 (norm) and 9.2e-3
  // (worst element): the tolerances leave a factor of 3, while a gradient overwritten instead of
  // added (0.58 and more) or a transposed operand lands far outside. The shape is chosen: ReLU's
  // gradient jumps where a pre-activation crosses zero, and one within bf16's error of zero flips
  // its unit for that sample, which moves a tensor's gradient far more than rounding does (on
  // 24 -> 32 -> 32 -> 16 with 8 samples one layer-0 unit of 256 flips and fc0's error is 0.11).
  // Here the closest pre-activation under bf16 is 6.5e-3 from zero, and the GPU's sums differ from
  // the emulation's only in float32 summation order (about 1e-6).
  SUBCASE(
      "bf16 compute with float32 masters (23 -> 30 -> 30 -> 17, 7 samples): norm-relative error within 2e-2, "
      "every element within 3e-2 of its tensor's largest value") {
    ncclkit_test::run_workers(1, [](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
      const mlp_cublas::MlpOptions shape{
          .input = 23, .width = 30, .output = 17, .depth = 3, .precision = mlp_cublas::Precision::kBf16};
      return mlp_cublas_test::check_gradients(me, store, shape, 7, 3e-2, 2e-2);
    });
  }
  SUBCASE("bf16 compute: forward_backward and evaluate compute with the float32 values as they are at each call") {
    ncclkit_test::run_workers(1, [](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
      return mlp_cublas_test::check_bf16_refresh(me, store);
    });
  }
}

TEST_CASE("the trainer over the cuBLAS MLP on 2 GPUs: the loss falls in 20 steps and the ranks end identical") {
  if (!ncclkit_test::have_gpus(2, "the cuBLAS MLP trained on 2 GPUs")) return;
  for (const auto codec : {ncclkit::compression::Codec::kNone, ncclkit::compression::Codec::kFloat16}) {
    CAPTURE(ncclkit::compression::name_of(codec));
    ncclkit_test::TempDir dir("mlp-cublas");
    ncclkit_test::run_workers(2, [&](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
      using mlp_cublas_test::kBatch;
      ncclkit_test::Checker checker(me.rank);
      ncclkit::nccl::Communicator comm(store, me, ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "mlp-train"});
      mlp_cublas::MlpOptions shape = mlp_cublas_test::kShape;
      shape.precision = mlp_cublas::Precision::kFloat32;
      mlp_cublas_test::Model model(shape);
      // lr 0.2: a float64 model of this training (same shapes, distributions and schedule) ends
      // at 0.39 to 0.60 of its first loss over 20 seeds.
      ncclkit::trainer::DataParallelTrainer<mlp_cublas_test::Model, ncclkit::nccl::Communicator> trainer(
          comm, model,
          {.global_batch = 2 * kBatch, .codec = codec, .schedule = {.lr = 0.2}, .seed = 3, .log_interval = 0,
           .print_progress = false});
      const mlp_cublas::SyntheticData data(shape.input, shape.output, 64, 11, comm.device());
      const mlp_cublas::Batch held_out = data.batch(48, 16);  // the same on both ranks, never trained on
      const auto loss = [&] {
        ncclkit::nccl::DeviceBuffer<double> metrics(ncclkit::trainer::kMetricWords, comm.device());
        comm.fill_zero(metrics.view());
        ncclkit::trainer::EvalContext<ncclkit::nccl::Communicator> eval(comm.default_stream(), metrics.data());
        model.evaluate(held_out, eval);
        double host[ncclkit::trainer::kMetricWords] = {};
        comm.copy_to_host(host, metrics.data(), sizeof host);
        comm.synchronize();
        return host[0] / host[2];
      };
      const double before = loss();
      for (std::size_t s = 0; s < 20; ++s) {
        trainer.step(data.batch((s % 3) * 2 * kBatch + static_cast<std::size_t>(me.rank) * kBatch, kBatch));
      }
      comm.synchronize();
      const double after = loss();
      std::printf("rank %d: held-out loss %.4f -> %.4f after 20 steps\n", me.rank, before, after);
      checker.expect(after < 0.8 * before, "the held-out loss fell to " + std::to_string(after / before) +
                                               " of its first value, not below 0.8");
      const auto& all = trainer.values().all(ncclkit::DataType::kFloat32);
      const std::vector<float> parameters = mlp_cublas_test::download(comm, all.data, all.count);
      std::ofstream(dir.path + "/rank" + std::to_string(me.rank), std::ios::binary)
          .write(reinterpret_cast<const char*>(parameters.data()),
                 static_cast<std::streamsize>(parameters.size() * sizeof(float)));
      return checker.finish("cuBLAS MLP training");
    });
    const std::string zero = mlp_cublas_test::read_file(dir.path + "/rank0");
    CHECK(zero.size() >= mlp_cublas_test::kShape.parameters() * sizeof(float));
    CHECK(zero == mlp_cublas_test::read_file(dir.path + "/rank1"));
  }
}
