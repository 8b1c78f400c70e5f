// The cuBLAS MLP of examples/mlp_cublas as a trainer Model: on one GPU, its gradients (float32
// GEMMs, TF32 off) against a float64 host reference of the same MLP, added to what the gradient
// buffers held, each tensor marked ready in backward order once its gradient is complete on the
// stream, also at sizes that are multiples of nothing; with TF32, within TF32's tolerance; with
// bf16 compute, within bf16's, and each call computing with the float32 values as they are then.
// On 2 GPUs, the trainer over it: the loss falls over 20 steps and both ranks end with identical
// parameters, with float32 and fp16 gradients. On 1 and 2 GPUs, the trainer's parameters after 4
// SGD steps and the last step's gradients against the same MLP trained in float64 on the host.
// Marking order: a test model that marks tensors ready before their weight-gradient GEMM has
// run, on 2 GPUs, must leave exactly those tensors off that reference, so the comparison is shown
// to catch an ordering bug. With fp16 gradients on 2 GPUs, the update fused into the reduction
// (TrainerOptions::fuse_update) ends at the parameters and state of the optimizer's own pass, bit
// for bit, with SGD (momentum, weight decay, Nesterov) and AdamW.
// ncclkit-test: labels=nccl timeout=300
#include <doctest/doctest.h>

#include <algorithm>   // std::max, std::find, std::count_if
#include <chrono>      // std::chrono::seconds
#include <cmath>       // std::fabs, std::sqrt, std::isnan
#include <cstddef>     // std::size_t, std::ptrdiff_t
#include <cstdint>     // std::uint64_t
#include <cstdio>      // std::printf, std::snprintf
#include <fstream>     // std::ofstream, std::ifstream
#include <iterator>    // std::istreambuf_iterator
#include <limits>      // std::numeric_limits
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

/// Every layer's weight (row-major [out, in]) and bias, on the host, in layer order.
template <class T>
struct LayerTensors {
  std::vector<std::vector<T>> weight, bias;
};

/// The gradients of loss_weight × Σ_s ℓ_s, ℓ_s = Σ_o (p_o − y_o)² / output, of the MLP with the
/// given weights (float32 as the GPU holds them, or float64 as the reference trains them), in
/// float64: plain loops over row-major arrays, nothing shared with the model's cuBLAS calls.
struct Reference : LayerTensors<double> {
  double loss_sum = 0;
};

template <class T>
Reference reference_gradients(const mlp_cublas::MlpOptions& o, const LayerTensors<T>& parameters,
                              const std::vector<float>& x, const std::vector<float>& y, std::size_t n,
                              double loss_weight) {
  const std::vector<std::vector<T>>& weights = parameters.weight;
  const std::vector<std::vector<T>>& biases = parameters.bias;
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

/// Every layer's tensors of `buffer` (the trainer's or a test's values or gradients).
LayerTensors<float> download_tensors(Communicator& comm, const ncclkit::fusion::FusedBuffer<Communicator>& buffer,
                                     const mlp_cublas::MlpOptions& shape) {
  LayerTensors<float> host;
  for (std::size_t l = 0; l < shape.depth; ++l) {
    host.weight.push_back(
        download(comm, buffer.view(mlp_cublas::weight_name(l)).data, shape.in_features(l) * shape.out_features(l)));
    host.bias.push_back(download(comm, buffer.view(mlp_cublas::bias_name(l)).data, shape.out_features(l)));
  }
  return host;
}

/// A tolerance or an error in a message: "4e-05".
std::string number(double x) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", x);
  return text;
}

/// How far a tensor from the GPU is from its float64 reference: its worst element, measured
/// relative to the largest magnitude in the reference tensor (an element-wise relative error
/// would blow up at elements near zero, which a sum of many terms produces).
struct TensorError {
  std::string name;
  std::size_t index = 0;  // the worst element
  double got = 0, expected = 0;
  double scale = 0;     // the reference tensor's largest magnitude
  double relative = 0;  // |got − expected| / scale at the worst element (infinite for NaN)

  std::string describe() const {
    char text[256];
    std::snprintf(text, sizeof text,
                  "%s[%zu] is %.9g against the float64 reference's %.9g: off by %.3e of the "
                  "tensor's largest reference magnitude %.6g",
                  name.c_str(), index, got, expected, relative, scale);
    return text;
  }
};

TensorError worst_error(const std::string& name, const std::vector<float>& got, const std::vector<double>& expected) {
  TensorError worst{.name = name, .scale = max_abs(expected)};
  if (got.size() != expected.size()) {
    worst.name +=
        " (" + std::to_string(got.size()) + " elements, the reference " + std::to_string(expected.size()) + ")";
    worst.relative = std::numeric_limits<double>::infinity();
    return worst;
  }
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double off = std::fabs(double(got[i]) - expected[i]);
    const double relative = std::isnan(off)   ? std::numeric_limits<double>::infinity()
                            : worst.scale > 0 ? off / worst.scale
                            : off > 0         ? std::numeric_limits<double>::infinity()
                                              : 0.0;
    if (i == 0 || relative > worst.relative) {
      worst.index = i;
      worst.got = got[i];
      worst.expected = expected[i];
      worst.relative = relative;
    }
  }
  return worst;
}

/// worst_error of every tensor, in layer order, each layer's weight then its bias.
std::vector<TensorError> compare_tensors(const mlp_cublas::MlpOptions& shape, const LayerTensors<float>& got,
                                         const LayerTensors<double>& expected) {
  std::vector<TensorError> errors;
  for (std::size_t l = 0; l < shape.depth; ++l) {
    errors.push_back(worst_error(mlp_cublas::weight_name(l), got.weight[l], expected.weight[l]));
    errors.push_back(worst_error(mlp_cublas::bias_name(l), got.bias[l], expected.bias[l]));
  }
  return errors;
}

/// What the float64 reference of a training run ends with.
struct ReferenceRun {
  LayerTensors<double> parameters;
  Reference last_gradients;  // of the last step, before its update
};

/// `steps` steps of plain SGD (p −= lr·g, no momentum or weight decay: TrainerOptions' default
/// optimizer) of the MLP from `start`, in float64. Step s takes the global batch of samples
/// [s·global_batch, (s+1)·global_batch) of x and y, and g is the gradient of that batch's mean
/// loss (loss weight 1 / global_batch): what the trainer's ranks reach together, each adding
/// world / global_batch (StepContext::loss_weight) times its shard's summed loss gradient, then
/// averaging over the world ranks.
ReferenceRun reference_sgd(const mlp_cublas::MlpOptions& shape, const LayerTensors<float>& start,
                           const std::vector<float>& x, const std::vector<float>& y, std::size_t global_batch,
                           std::size_t steps, double lr) {
  ReferenceRun run;
  for (std::size_t l = 0; l < shape.depth; ++l) {
    run.parameters.weight.emplace_back(start.weight[l].begin(), start.weight[l].end());
    run.parameters.bias.emplace_back(start.bias[l].begin(), start.bias[l].end());
  }
  for (std::size_t s = 0; s < steps; ++s) {
    const auto samples = [&](const std::vector<float>& all, std::size_t features) {
      const auto first = all.begin() + static_cast<std::ptrdiff_t>(s * global_batch * features);
      return std::vector<float>(first, first + static_cast<std::ptrdiff_t>(global_batch * features));
    };
    run.last_gradients = reference_gradients(shape, run.parameters, samples(x, shape.input), samples(y, shape.output),
                                             global_batch, 1.0 / double(global_batch));
    for (std::size_t l = 0; l < shape.depth; ++l) {
      for (std::size_t i = 0; i < run.parameters.weight[l].size(); ++i) {
        run.parameters.weight[l][i] -= lr * run.last_gradients.weight[l][i];
      }
      for (std::size_t i = 0; i < run.parameters.bias[l].size(); ++i) {
        run.parameters.bias[l][i] -= lr * run.last_gradients.bias[l][i];
      }
    }
  }
  return run;
}

/// The model bound to values and gradients of its own, and to a bfloat16 copy of the values
/// where it asks for one, as a trainer binds it (with no trainer).
struct BoundMlp {
  BoundMlp(Communicator& comm, const mlp_cublas::MlpOptions& shape)
      : comm(&comm), model(shape), values(comm, declared(model)), gradients(comm, values.layout()) {
    if (model.bfloat16_copy()) {
      copy = ncclkit::nccl::DeviceBuffer<ncclkit::BFloat16>(values.all(ncclkit::DataType::kFloat32).count,
                                                            comm.device());
    }
    model.bind(ncclkit::trainer::ModelViews<Communicator>(values, &gradients, copy.data()));
    refresh_copy();
  }
  /// The copy rewritten from the values, as the trainer does after writing them (refresh_copy).
  void refresh_copy() {
    if (copy.size() == 0) return;
    comm->cast(values.all(ncclkit::DataType::kFloat32),
               ncclkit::TensorView{copy.data(), copy.size(), ncclkit::DataType::kBFloat16, ncclkit::MemoryKind::kDevice},
               1.0, nullptr);
  }
  static ncclkit::fusion::FusedLayout declared(const Model& model) {
    ncclkit::fusion::FusedLayout layout;
    model.declare(layout);
    layout.finalize();
    return layout;
  }
  Communicator* comm;
  Model model;
  ncclkit::fusion::FusedBuffer<Communicator> values, gradients;
  ncclkit::nccl::DeviceBuffer<ncclkit::BFloat16> copy;  // where the model asks for one
};

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
  BoundMlp bound(comm, shape);
  Model& model = bound.model;
  const ncclkit::fusion::FusedLayout& layout = bound.values.layout();
  ncclkit::fusion::FusedBuffer<Communicator>& values = bound.values;
  ncclkit::fusion::FusedBuffer<Communicator>& gradients = bound.gradients;
  const mlp_cublas::SyntheticData data(shape.input, shape.output, samples, 11, comm.device());
  const mlp_cublas::Batch batch = data.batch(0, samples);
  const double loss_weight = 1.0 / static_cast<double>(samples);

  const LayerTensors<float> parameters = download_tensors(comm, values, shape);
  const std::vector<float> x = download(comm, data.inputs(), samples * shape.input);
  const std::vector<float> y = download(comm, data.targets(), samples * shape.output);
  const Reference ref = reference_gradients(shape, parameters, x, y, samples, loss_weight);

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

// ---- training against the float64 reference ----------------------------------------------

// The reference runs: a global batch of 16 samples a step (one shard of 16 on 1 GPU, two of 8 on
// 2), SGD at the learning rate of the training test below, and 4 steps, enough for the
// gradients of later steps to depend on the updates of earlier ones.
constexpr std::size_t kGlobalBatch = 2 * kBatch;
constexpr double kLearningRate = 0.2;
constexpr std::size_t kReferenceSteps = 4;

// Tolerances of the trained GPU model against reference_sgd, each element's error relative to
// its tensor's largest reference magnitude (worst_error). Gradients: 2e-5, the bound the first
// test case holds one float32 forward and backward to; the last step's are one such backward,
// at parameters within far less of the reference's. Parameters: twice that. A step moves a
// parameter by lr times its gradient, so a weight, dominated by its initial value, carries a
// small share of the gradients' error, while a bias, which starts at 0 and is nothing but the
// steps' sum, carries about all of it, up to k times where the steps' errors add up and its
// largest value is less than k times a step's (2 for these 4 steps). A float32 emulation of
// these runs on the host (the same data and initial values, float accumulation) stays within
// 4e-7 of the reference, at 1 GPU and 2, after 1 step and after 4. A marking-order bug leaves a
// rank's own gradient where the mean belongs: the tensors it touches move by lr times (that
// rank's gradient minus the mean), 4e-2 to 0.6 of their largest value in that emulation, and
// the tensors after them, through the changed forward, by 5e-3 or more within 4 steps.
constexpr double kGradientTolerance = 2e-5;
constexpr double kParameterTolerance = 2 * kGradientTolerance;

/// What a training run on the GPUs ends with, against reference_sgd from the same start.
struct TrainedRun {
  std::vector<TensorError> parameters;      // after the last step
  std::vector<TensorError> last_gradients;  // the last step's, averaged over the ranks
};

/// Trains `model` (of `shape`, not yet bound) with the DataParallelTrainer over `comm` for
/// `steps` steps of kGlobalBatch samples, rank r's shard being the r-th slice of each global
/// batch, and compares the result with reference_sgd started from the trainer's initial values
/// (rank 0's, which its constructor broadcasts). `defer`: TrainerOptions::defer_gather.
template <class M>
TrainedRun train_against_reference(Communicator& comm, M& model, const mlp_cublas::MlpOptions& shape, std::size_t steps,
                                   bool defer = false) {
  ncclkit::trainer::DataParallelTrainer<M, Communicator> trainer(comm, model,
                                                                 {.global_batch = kGlobalBatch,
                                                                  .schedule = {.lr = kLearningRate},
                                                                  .defer_gather = defer,
                                                                  .seed = 3,
                                                                  .log_interval = 0,
                                                                  .print_progress = false});
  const LayerTensors<float> start = download_tensors(comm, trainer.values(), shape);
  const auto world = static_cast<std::size_t>(comm.size());
  const std::size_t shard = kGlobalBatch / world;
  const mlp_cublas::SyntheticData data(shape.input, shape.output, steps * kGlobalBatch, 11, comm.device());
  std::vector<mlp_cublas::Batch> shards;
  for (std::size_t s = 0; s < steps; ++s) {
    shards.push_back(data.batch(s * kGlobalBatch + static_cast<std::size_t>(comm.rank()) * shard, shard));
  }
  // The ranks start their steps together: neither's reduction then waits for the other's
  // longer than EarlyMarkingMlp's stalls last.
  comm.barrier();
  for (const mlp_cublas::Batch& batch : shards) trainer.step(batch);
  comm.synchronize();
  const LayerTensors<float> parameters = download_tensors(comm, trainer.values(), shape);
  const LayerTensors<float> gradients = download_tensors(comm, trainer.gradients(), shape);
  const std::vector<float> x = download(comm, data.inputs(), data.size() * shape.input);
  const std::vector<float> y = download(comm, data.targets(), data.size() * shape.output);
  const ReferenceRun reference = reference_sgd(shape, start, x, y, kGlobalBatch, steps, kLearningRate);
  return {compare_tensors(shape, parameters, reference.parameters),
          compare_tensors(shape, gradients, reference.last_gradients)};
}

/// Holds its stream for `nanoseconds` of the GPU's global timer. One thread: the rest of the
/// GPU stays free for the reductions it lets run ahead.
__global__ void stall(std::uint64_t nanoseconds) {
  std::uint64_t start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

/// A deliberately wrong Model for the marking-order test: the cuBLAS MLP, except that the
/// tensors named in `early` are marked ready at the start of forward_backward, before a single
/// element of their gradients is written; the inner model's own marks of them are dropped
/// (GradientSync takes one mark per tensor per step). After every mark that reaches the
/// trainer, the compute stream stalls for `stall_ns`: a bucket that mark launches is reduced
/// before the work issued after the mark runs, so the race an early mark opens is always lost,
/// never won by luck. With `early` empty it is the correct model, stalls included.
class EarlyMarkingMlp {
 public:
  using Batch = mlp_cublas::Batch;

  EarlyMarkingMlp(const mlp_cublas::MlpOptions& shape, std::vector<std::string> early, int device,
                  std::uint64_t stall_ns)
      : inner_(shape), early_(std::move(early)), device_(device), stall_ns_(stall_ns) {}

  void declare(ncclkit::fusion::FusedLayout& layout) const { inner_.declare(layout); }

  void bind(const ncclkit::trainer::ModelViews<Communicator>& views) {
    inner_.bind(views);
    layout_ = &views.layout();
    early_slots_.clear();
    for (const std::string& name : early_) early_slots_.push_back(layout_->slot(name));
  }

  void forward_backward(const Batch& batch, ncclkit::trainer::StepContext<Communicator>& step) {
    for (const ncclkit::fusion::Slot slot : early_slots_) step.ready(slot);
    if (!early_slots_.empty()) stall_stream(step.stream());
    ncclkit::trainer::StepContext<Communicator> inner(
        step.stream(), step.loss_weight(), step.metrics(),
        [&](ncclkit::fusion::Slot slot, cudaStream_t stream) {
          if (is_early(slot)) return;
          step.ready(slot);
          stall_stream(stream);
        },
        *layout_, step.step(), step.seed(), step.rank());
    inner_.forward_backward(batch, inner);
  }

  void evaluate(const Batch& batch, ncclkit::trainer::EvalContext<Communicator>& eval) { inner_.evaluate(batch, eval); }

 private:
  bool is_early(ncclkit::fusion::Slot slot) const {
    for (const ncclkit::fusion::Slot early : early_slots_) {
      if (early.index == slot.index) return true;
    }
    return false;
  }

  void stall_stream(cudaStream_t stream) {
    // The stream handle may be the legacy default stream, which means the current device's.
    const ncclkit::nccl::DeviceGuard guard(device_);
    stall<<<1, 1, 0, stream>>>(stall_ns_);
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
  }

  Model inner_;
  std::vector<std::string> early_;
  int device_;
  std::uint64_t stall_ns_;
  const ncclkit::fusion::FusedLayout* layout_ = nullptr;
  std::vector<ncclkit::fusion::Slot> early_slots_;
};
/// kBf16 computes with the bfloat16 copy of the float32 values that whoever binds it keeps (the
/// trainer; here BoundMlp): zeroed masters alone leave the loss as it was (the model reads the
/// copy, and writes none of its own); the copy refreshed from them gives the output of zeros,
/// whose loss sum Σ y² / output the host computes, in forward_backward and evaluate alike; the
/// masters restored and the copy refreshed give the first loss again.
int check_bf16_refresh(const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
  ncclkit_test::Checker checker(me.rank);
  Communicator comm(store, me, ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "mlp-bf16"});
  mlp_cublas::MlpOptions shape = kShape;
  shape.precision = mlp_cublas::Precision::kBf16;
  BoundMlp bound(comm, shape);
  Model& model = bound.model;
  ncclkit::fusion::FusedBuffer<Communicator>& values = bound.values;
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
          values.layout(), 0, 0, me.rank);
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
  const double train_masters_zeroed = loss_sum(true);
  bound.refresh_copy();
  const double train_zeroed = loss_sum(true);
  const double eval_zeroed = loss_sum(false);
  comm.copy_from_host(all.data, initial.data(), initial.size() * sizeof(float));
  bound.refresh_copy();
  const double eval_restored = loss_sum(false);
  std::printf(
      "bf16 loss sums: first %.6f, zero output %.6f; masters zeroed %.6f; copy refreshed: forward_backward %.6f, "
      "evaluate %.6f; restored %.6f\n",
      first, zeros_loss, train_masters_zeroed, train_zeroed, eval_zeroed, eval_restored);
  checker.expect(std::fabs(first - zeros_loss) > 0.1 * zeros_loss, "the first loss differs from a zero output's");
  checker.expect(near(train_masters_zeroed, first), "forward_backward computed with the copy, not the masters");
  checker.expect(near(train_zeroed, zeros_loss), "forward_backward computed with the refreshed copy");
  checker.expect(near(eval_zeroed, zeros_loss), "evaluate computed with the refreshed copy");
  checker.expect(near(eval_restored, first), "evaluate computed with the copy of the restored values");
  return checker.finish("cuBLAS MLP bf16 copy read");
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
  SUBCASE("bf16 compute: forward_backward and evaluate compute with the bfloat16 copy the binder keeps") {
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

TEST_CASE("bf16 compute on 2 GPUs: after each step the trainer's weight copy is the rounding of its masters") {
  if (!ncclkit_test::have_gpus(2, "the bf16 copy kept by the trainer on 2 GPUs")) return;
  // float32 gradients (the update kernel), fp16 gradients with the update fused into the
  // reduction and without (the update kernel after the fused reduction); SGD with momentum and
  // AdamW. Every element of the copy (padding included) must be the bfloat16 of its master, bit
  // for bit, after the start's broadcast and after each of 3 steps; and the masters must change.
  struct Case {
    const char* name;
    ncclkit::compression::Codec codec;
    bool fuse_update;
    ncclkit::trainer::OptimizerOptions optimizer;
  };
  const Case cases[] = {
      {"float32 gradients, SGD momentum", ncclkit::compression::Codec::kNone, true, {.momentum = 0.9}},
      {"fp16 gradients, update fused, AdamW", ncclkit::compression::Codec::kFloat16, true,
       {.kind = ncclkit::trainer::OptimizerKind::kAdamW}},
      {"fp16 gradients, update apart, SGD momentum", ncclkit::compression::Codec::kFloat16, false, {.momentum = 0.9}},
  };
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    ncclkit_test::run_workers(2, [&](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
      using namespace mlp_cublas_test;
      ncclkit_test::Checker checker(me.rank);
      Communicator comm(store, me, ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "mlp-copy"});
      mlp_cublas::MlpOptions shape = kShape;
      shape.precision = mlp_cublas::Precision::kBf16;
      shape.seed = 3 + static_cast<std::uint64_t>(me.rank);  // rank 1's own values: the broadcast must win
      Model model(shape);
      ncclkit::trainer::DataParallelTrainer<Model, Communicator> trainer(
          comm, model,
          {.global_batch = 2 * kBatch, .codec = c.codec, .optimizer = c.optimizer, .schedule = {.lr = 0.05},
           .fuse_update = c.fuse_update, .seed = 3, .log_interval = 0, .print_progress = false});
      const ncclkit::TensorView copy = trainer.copy();
      const ncclkit::TensorView masters = trainer.values().all(ncclkit::DataType::kFloat32);
      checker.expect(copy.count == masters.count && copy.dtype == ncclkit::DataType::kBFloat16,
                     "the copy has one bfloat16 per float32 value");
      const auto stale = [&] {
        comm.synchronize(comm.default_stream());
        const std::vector<float> m = download(comm, masters.data, masters.count);
        std::vector<ncclkit::BFloat16> b(copy.count);
        comm.copy_to_host(b.data(), copy.data, copy.bytes());
        comm.synchronize();
        std::size_t n = 0;
        for (std::size_t i = 0; i < m.size(); ++i) n += b[i].bits != ncclkit::BFloat16(m[i]).bits ? 1 : 0;
        return n;
      };
      const mlp_cublas::SyntheticData data(shape.input, shape.output, 64, 11, comm.device());
      std::size_t stale_total = stale();
      const std::vector<float> start = download(comm, masters.data, masters.count);
      for (std::size_t s = 0; s < 3; ++s) {
        trainer.step(data.batch(s * 2 * kBatch + static_cast<std::size_t>(me.rank) * kBatch, kBatch));
        stale_total += stale();
      }
      std::printf("rank %d: %s: %zu of %zu copy elements not the rounding of their master over 4 checks\n", me.rank,
                  c.name, stale_total, copy.count);
      checker.expect(stale_total == 0, std::to_string(stale_total) + " copy elements were not the bfloat16 of their master");
      checker.expect(download(comm, masters.data, masters.count) != start, "the masters changed: it trained");
      return checker.finish("bf16 copy kept by the trainer");
    });
  }
}

TEST_CASE("the trainer over the cuBLAS MLP ends 4 SGD steps at the float64 reference's parameters and gradients") {
  bool defer = false;
  const auto train = [&defer](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
    using namespace mlp_cublas_test;
    ncclkit_test::Checker checker(me.rank);
    Communicator comm(store, me, ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "mlp-reference"});
    mlp_cublas::MlpOptions shape = kShape;
    shape.precision = mlp_cublas::Precision::kFloat32;
    Model model(shape);
    const TrainedRun run = train_against_reference(comm, model, shape, kReferenceSteps, defer);
    const std::string where = "on " + std::to_string(comm.size()) + " GPU(s)" + (defer ? " with defer_gather" : "") +
                              ", rank " + std::to_string(me.rank) + ", after " + std::to_string(kReferenceSteps) +
                              " steps: ";
    for (const TensorError& e : run.parameters) {
      std::printf("rank %d parameter %s\n", me.rank, e.describe().c_str());
      checker.expect(e.relative <= kParameterTolerance,
                     where + "parameter " + e.describe() + ", above the tolerance " + number(kParameterTolerance));
    }
    for (const TensorError& e : run.last_gradients) {
      std::printf("rank %d last gradient %s\n", me.rank, e.describe().c_str());
      checker.expect(e.relative <= kGradientTolerance, where + "the last step's gradient " + e.describe() +
                                                           ", above the tolerance " + number(kGradientTolerance));
    }
    return checker.finish("cuBLAS MLP against the float64 reference");
  };
  SUBCASE("1 GPU") {
    if (!ncclkit_test::have_gpus(1, "the cuBLAS MLP trained against the float64 reference on 1 GPU")) return;
    ncclkit_test::run_workers(1, train);
  }
  SUBCASE("2 GPUs, each with its half of every global batch") {
    if (!ncclkit_test::have_gpus(2, "the cuBLAS MLP trained against the float64 reference on 2 GPUs")) return;
    ncclkit_test::run_workers(2, train);
  }
  SUBCASE("2 GPUs, each bucket's all-gather and update deferred to the next step's forward") {
    if (!ncclkit_test::have_gpus(2, "the cuBLAS MLP trained with defer_gather on 2 GPUs")) return;
    defer = true;
    ncclkit_test::run_workers(2, train);
  }
}

TEST_CASE("marking order on 2 GPUs: a tensor marked ready before its gradient GEMM ran is caught by the reference") {
  if (!ncclkit_test::have_gpus(2, "the marking-order test of the cuBLAS MLP")) return;
  // One step on 2 GPUs with EarlyMarkingMlp marking the tensors `early` too soon: those must be
  // off the reference by more than the tolerance, every other one within it. On 1 GPU the bug
  // would go unseen: the mean of one rank's gradient is that gradient, whenever it is read.
  const auto one_step = [](std::vector<std::string> early) {
    ncclkit_test::run_workers(2, [&](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
      using namespace mlp_cublas_test;
      ncclkit_test::Checker checker(me.rank);
      Communicator comm(store, me, ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "mlp-early"});
      mlp_cublas::MlpOptions shape = kShape;
      shape.precision = mlp_cublas::Precision::kFloat32;
      // 10 ms: the ranks leave the barrier within far less, and a reduction of these 10 KB takes
      // tens of microseconds.
      EarlyMarkingMlp model(shape, early, comm.device(), 10'000'000);
      const TrainedRun run = train_against_reference(comm, model, shape, 1);
      for (const TensorError& e : run.parameters) {
        std::printf("rank %d parameter %s\n", me.rank, e.describe().c_str());
        if (std::find(early.begin(), early.end(), e.name) != early.end()) {
          checker.expect(e.relative > kParameterTolerance,
                         "rank " + std::to_string(me.rank) + ": " + e.name +
                             " was marked ready before its gradient was written, yet every element is within " +
                             number(kParameterTolerance) + " of the reference (worst: " + e.describe() +
                             "): the comparison does not catch a marking-order bug");
        } else {
          checker.expect(e.relative <= kParameterTolerance, "rank " + std::to_string(me.rank) + ": " + e.name +
                                                                " was marked in order, yet " + e.describe() +
                                                                ", above the tolerance " + number(kParameterTolerance));
        }
      }
      return checker.finish("cuBLAS MLP marking order");
    });
  };
  SUBCASE("the wrapper marking every tensor after its GEMM, stalls included, matches the reference") { one_step({}); }
  SUBCASE("every tensor marked at the start of the step: every tensor is off") {
    std::vector<std::string> all;
    for (std::size_t l = 0; l < mlp_cublas_test::kShape.depth; ++l) {
      all.push_back(mlp_cublas::weight_name(l));
      all.push_back(mlp_cublas::bias_name(l));
    }
    one_step(all);
  }
  SUBCASE("layer 0, whose weight-gradient GEMM is backward's last, marked at the start: only its tensors are off") {
    one_step({mlp_cublas::weight_name(0), mlp_cublas::bias_name(0)});
  }
}

TEST_CASE("fp16 gradients on 2 GPUs: the update fused into the reduction ends where the optimizer's own pass does") {
  if (!ncclkit_test::have_gpus(2, "the fused update against the optimizer's own pass on 2 GPUs")) return;
  using ncclkit::trainer::OptimizerKind;
  using ncclkit::trainer::OptimizerOptions;
  const std::vector<std::pair<std::string, OptimizerOptions>> optimizers = {
      {"sgd", {.kind = OptimizerKind::kSgd}},
      {"sgd momentum 0.9, weight decay 0.01, nesterov",
       {.kind = OptimizerKind::kSgd, .weight_decay = 0.01, .momentum = 0.9, .nesterov = true}},
      {"adamw, weight decay 0.01", {.kind = OptimizerKind::kAdamW, .weight_decay = 0.01}}};
  for (const auto& [name, optimizer] : optimizers) {
    CAPTURE(name);
    ncclkit_test::run_workers(2, [&](const ncclkit::WorldInfo& me, const std::shared_ptr<ncclkit::Store>& store) {
      using mlp_cublas_test::kBatch;
      ncclkit_test::Checker checker(me.rank);
      ncclkit::nccl::Communicator comm(store, me,
                                       ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "mlp-fused"});
      mlp_cublas::MlpOptions shape = mlp_cublas_test::kShape;
      shape.precision = mlp_cublas::Precision::kFloat32;
      const mlp_cublas::SyntheticData data(shape.input, shape.output, 64, 11, comm.device());
      struct Ended {
        std::vector<float> values;
        std::vector<std::vector<float>> state;
        std::size_t updated = 0;  // buckets the reduction updated in the last step
        std::size_t buckets = 0;
      };
      const auto train = [&](bool fuse) {
        mlp_cublas_test::Model model(shape);
        ncclkit::trainer::DataParallelTrainer<mlp_cublas_test::Model, ncclkit::nccl::Communicator> trainer(
            comm, model,
            // Small buckets: several of them, each tensor's own, lengths that are multiples of nothing.
            {.global_batch = 2 * kBatch, .codec = ncclkit::compression::Codec::kFloat16, .bucket_bytes = 1024,
             .optimizer = optimizer,
             .schedule = {.lr = 0.05}, .fuse_update = fuse, .seed = 3, .log_interval = 0, .print_progress = false});
        for (std::size_t s = 0; s < 4; ++s) {
          trainer.step(data.batch((s % 3) * 2 * kBatch + static_cast<std::size_t>(me.rank) * kBatch, kBatch));
        }
        comm.synchronize();
        Ended ended;
        const auto& all = trainer.values().all(ncclkit::DataType::kFloat32);
        ended.values = mlp_cublas_test::download(comm, all.data, all.count);
        for (auto& state : trainer.optimizer().state()) {
          const auto& view = state.all(ncclkit::DataType::kFloat32);
          ended.state.push_back(mlp_cublas_test::download(comm, view.data, view.count));
        }
        ended.buckets = trainer.sync().plan().size();
        for (std::size_t b = 0; b < ended.buckets; ++b) ended.updated += trainer.sync().updated(b) ? 1 : 0;
        return ended;
      };
      const Ended fused = train(true);
      const Ended separate = train(false);
      checker.expect(fused.buckets > 1 && fused.updated == fused.buckets,
                     "the reduction updated " + std::to_string(fused.updated) + " of " +
                         std::to_string(fused.buckets) + " buckets with fuse_update, not all");
      checker.expect(separate.updated == 0,
                     "the reduction updated " + std::to_string(separate.updated) + " buckets without fuse_update");
      std::size_t differ = 0;
      for (std::size_t i = 0; i < fused.values.size(); ++i) differ += fused.values[i] != separate.values[i] ? 1 : 0;
      checker.expect(fused.values.size() == separate.values.size() && differ == 0,
                     std::to_string(differ) + " parameters differ between the fused update and the optimizer's pass");
      checker.expect(fused.state == separate.state, "the optimizer state differs between the fused update and its pass");
      const auto nan = std::count_if(fused.values.begin(), fused.values.end(), [](float v) { return std::isnan(v); });
      checker.expect(nan == 0, std::to_string(nan) + " parameters are NaN after the fused update");
      return checker.finish("fused update against the optimizer's pass (" + name + ")");
    });
  }
}
