#pragma once
// An MLP of Linear + ReLU layers on cuBLAS as a trainer Model (trainer/model.hpp) on GPU memory
// (the NCCL backend), with mean-squared-error loss: `depth` Linear layers, input → width → … →
// width → output, ReLU after each but the last; the per-sample loss is Σ_o (p_o − y_o)² / output,
// so the gradients are those of PyTorch's nn.MSELoss() (mean over samples and outputs).
//
// Layout: PyTorch's. A layer's weight is row-major [out, in] ("fc<l>.weight"), its bias [out]
// ("fc<l>.bias"), activations are row-major [samples, features]; cuBLAS, column-major, sees each
// of them transposed, so y = x Wᵀ + b is the column-major product Yᶜ = Wᶜᵀ Xᶜ.
//
// Precision: TF32 tensor cores by default (CUBLAS_COMPUTE_32F_FAST_TF32, as PyTorch with
// torch.backends.cuda.matmul.allow_tf32 = True), or float32 (CUBLAS_COMPUTE_32F), with weights,
// gradients and activations in float32; or bf16 compute with float32 master weights
// (Precision::kBf16, as PyTorch's autocast to bfloat16):
// - The trainer's parameters stay float32 (the masters, which the optimizer updates) and so do
//   the gradients (which the trainer reduces); the GEMMs read the weights' bfloat16 copy, which
//   the model asks the trainer for (bfloat16_copy(), trainer/model.hpp), and the biases from the
//   float32 masters.
// - The trainer's optimizer writes that copy in the same pass as it updates the masters (the
//   update kernel, or the fused 16-bit reduction where it applies the update), and refreshes it
//   whole after its broadcast or a resume: no pass of the model's own over the weights (that
//   would be 6 bytes per parameter per call, 0.8 GB for 134 M parameters). The model never
//   writes the copy. Bound without a trainer, whoever binds it keeps the copy, as the tests do.
// - Activations and deltas are bfloat16; the GEMMs take bfloat16 operands and accumulate in
//   float32 (cublasGemmEx with CUDA_R_16BF inputs and CUBLAS_COMPUTE_32F). The weight-gradient
//   GEMM adds straight into the float32 gradient (C of CUDA_R_32F beside bfloat16 A and B, a
//   combination cublasGemmEx supports), the bias gradient is a GEMM with n = 1 against bfloat16
//   ones into the float32 gradient, and the loss is computed in float from the bfloat16 outputs
//   and float32 targets.
//
// Backward, layer by layer from the last: the input-gradient GEMM (the last read of the layer's
// weight in the step), the weight-gradient GEMM (beta = 1: the gradient is added, as the Model
// contract asks; beta = 0 where step.accumulate() is false, since the model declares
// overwrites_gradients), the bias gradient (a GEMV against ones, the same beta), then
// `step.ready` for the weight and the bias at once, so their bucket is reduced while the earlier
// layers run; the input gradient goes to the next layer down. Nothing reads a layer's values
// after its mark, so the model declares done_with_values_when_ready and the reduction may update
// them while backward goes on. Forward asks for each layer's weight and bias (`step.need`) right
// before its GEMM, so that with TrainerOptions::defer_gather the last step's update of a layer
// is waited for just in time, while the gathers of the layers above still run.
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>    // std::max, std::min
#include <cmath>        // std::sqrt
#include <cstddef>      // std::size_t
#include <cstdint>      // std::int64_t, std::uint64_t
#include <limits>       // std::numeric_limits
#include <string>       // std::string, std::to_string
#include <type_traits>  // std::is_same_v
#include <utility>      // std::swap
#include <vector>       // std::vector

#include <ncclkit/core/error.hpp>
#include <ncclkit/fusion/layout.hpp>
#include <ncclkit/nccl/cuda_check.hpp>
#include <ncclkit/nccl/device_buffer.hpp>
#include <ncclkit/nccl/stream.hpp>  // DeviceGuard
#include <ncclkit/trainer/model.hpp>

#include "mlp_cublas/cublas_handle.hpp"
#include "mlp_cublas/kernels.cuh"
#include "mlp_cublas/synthetic_data.cuh"

namespace mlp_cublas {

/// How the GEMMs compute.
enum class Precision {
  kTf32,     ///< TF32 tensor cores, float32 accumulation (default)
  kFloat32,  ///< full float32
  kBf16,     ///< bfloat16 weights copy, activations and deltas, float32 accumulation, masters and gradients
};

/// "TF32", "float32" or "bf16".
inline const char* precision_name(Precision precision) {
  switch (precision) {
    case Precision::kTf32:
      return "TF32";
    case Precision::kFloat32:
      return "float32";
    case Precision::kBf16:
      return "bf16";
  }
  return "unknown";
}

/// The model's shape and precision.
struct MlpOptions {
  std::size_t input = 4096;   ///< features in
  std::size_t width = 4096;   ///< features of every hidden layer
  std::size_t output = 4096;  ///< features out
  std::size_t depth = 8;      ///< Linear layers (at least 1)
  Precision precision = Precision::kTf32;
  /// SMs cuBLAS plans its GEMMs for (cublasSetSmCountTarget), leaving the rest to the reductions
  /// that overlap backward; 0: all of them.
  int cublas_sms = 0;
  /// Seeds the initial weights (rank 0's are broadcast by the trainer, so only rank 0's count).
  std::uint64_t seed = 1;

  std::size_t in_features(std::size_t layer) const { return layer == 0 ? input : width; }
  std::size_t out_features(std::size_t layer) const { return layer + 1 == depth ? output : width; }
  /// Weights and biases of every layer.
  std::size_t parameters() const {
    std::size_t n = 0;
    for (std::size_t l = 0; l < depth; ++l) n += (in_features(l) + 1) * out_features(l);
    return n;
  }
  /// Why this shape cannot be built; empty when it can.
  std::string problem() const {
    if (depth == 0) return "mlp_cublas: depth 0; a model needs at least one layer";
    if (input == 0 || width == 0 || output == 0) return "mlp_cublas: input, width and output must be at least 1";
    constexpr std::size_t kMostFeatures = std::size_t{1} << 20;  // cuBLAS takes int dimensions
    if (input > kMostFeatures || width > kMostFeatures || output > kMostFeatures) {
      return "mlp_cublas: at most " + std::to_string(kMostFeatures) + " features per layer";
    }
    return {};
  }
};

/// The name of layer `l`'s weight ("fc3.weight") or bias ("fc3.bias").
inline std::string weight_name(std::size_t layer) { return "fc" + std::to_string(layer) + ".weight"; }
inline std::string bias_name(std::size_t layer) { return "fc" + std::to_string(layer) + ".bias"; }

template <class B>
class MlpCublas {
 public:
  using Batch = mlp_cublas::Batch;
  /// Every gradient is written whole by a GEMM (trainer/model.hpp): with beta 0 on a step's first
  /// micro-batch, so the trainer neither zeroes them nor do the GEMMs read them back.
  static constexpr bool overwrites_gradients = true;
  /// Backward reads a layer's weight (the input-gradient GEMM) before its gradients are marked.
  static constexpr bool done_with_values_when_ready = true;
  /// Forward calls step.need for each layer's parameters before it reads them.
  static constexpr bool waits_for_values = true;
  /// bf16 compute reads the trainer's bfloat16 copy of the weights (see the header comment).
  bool bfloat16_copy() const { return options_.precision == Precision::kBf16; }

  explicit MlpCublas(MlpOptions options = {}) : options_(options) {
    if (std::string p = options_.problem(); !p.empty()) throw ncclkit::ConfigError(p);
  }

  const MlpOptions& options() const { return options_; }

  /// Layers in forward order: the layout places the last layer's tensors first, so the first
  /// bucket holds what backward writes first.
  void declare(ncclkit::fusion::FusedLayout& layout) const {
    for (std::size_t l = 0; l < options_.depth; ++l) {
      const auto out = static_cast<std::int64_t>(options_.out_features(l));
      const auto in = static_cast<std::int64_t>(options_.in_features(l));
      layout.add(weight_name(l), {out, in}, ncclkit::DataType::kFloat32);
      layout.add(bias_name(l), {out}, ncclkit::DataType::kFloat32);
    }
  }

  /// Keeps the views and writes the initial values: weights U(±√(6/in)) (He's bound, for the
  /// ReLU layers) and U(±√(3/in)) for the last layer (unit output variance), biases 0.
  void bind(const ncclkit::trainer::ModelViews<B>& views) {
    layers_.clear();
    for (std::size_t l = 0; l < options_.depth; ++l) {
      layers_.push_back(
          Layer{views.template value_data<float>(weight_name(l)), views.template value_data<float>(bias_name(l)),
                views.template gradient_data<float>(weight_name(l)), views.template gradient_data<float>(bias_name(l)),
                bfloat16_copy() ? views.template copy_data<__nv_bfloat16>(weight_name(l)) : nullptr,
                views.layout().slot(weight_name(l)), views.layout().slot(bias_name(l)),
                options_.in_features(l), options_.out_features(l)});
    }
    // The trainer's memory is on the communicator's GPU, which need not be the current one:
    // every later call switches to it, since kernels, handles and allocations go to the current
    // device.
    cudaPointerAttributes where{};
    NCCLKIT_CUDA_CHECK(cudaPointerGetAttributes(&where, layers_.front().weight));
    if (where.type != cudaMemoryTypeDevice) {
      throw ncclkit::ConfigError("mlp_cublas::MlpCublas: the trainer's parameters are not in GPU memory; "
                                 "this model runs on the NCCL backend");
    }
    if (!handle_ || device_ != where.device) {
      device_ = where.device;
      handle_ = CublasHandle(device_);
      capacity_ = 0;
    }
    const ncclkit::nccl::DeviceGuard guard(device_);
    MLP_CUBLAS_CHECK(cublasSetMathMode(handle_.get(), options_.precision == Precision::kTf32
                                                          ? CUBLAS_TF32_TENSOR_OP_MATH
                                                          : CUBLAS_DEFAULT_MATH));
    MLP_CUBLAS_CHECK(cublasSetSmCountTarget(handle_.get(), options_.cublas_sms));
    using kernels::blocks_for;
    using kernels::kThreads;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      const float gain = l + 1 == layers_.size() ? 3.0f : 6.0f;
      const std::size_t count = layer.in * layer.out;
      kernels::fill_uniform<float><<<blocks_for(count), kThreads>>>(
          layer.weight, count, options_.seed * 1000003u + l, std::sqrt(gain / static_cast<float>(layer.in)));
      kernels::fill_value<float><<<blocks_for(layer.out), kThreads>>>(layer.bias, layer.out, 0.0f);
    }
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    // The trainer broadcasts the values on its own stream next: they must be written by then.
    NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }

  void forward_backward(const Batch& batch, ncclkit::trainer::StepContext<B>& step) {
    if (options_.precision == Precision::kBf16) {
      forward_backward_as<__nv_bfloat16>(batch, step);
    } else {
      forward_backward_as<float>(batch, step);
    }
  }

  void evaluate(const Batch& batch, ncclkit::trainer::EvalContext<B>& eval) {
    if (options_.precision == Precision::kBf16) {
      evaluate_as<__nv_bfloat16>(batch, eval);
    } else {
      evaluate_as<float>(batch, eval);
    }
  }

 private:
  struct Layer {
    float* weight;
    float* bias;
    float* weight_grad;
    float* bias_grad;
    const __nv_bfloat16* weight_bf16;  // the trainer's bfloat16 copy of `weight` (kBf16 only)
    ncclkit::fusion::Slot weight_slot;
    ncclkit::fusion::Slot bias_slot;
    std::size_t in, out;
  };

  // The scratch of one batch in the activations' type T: float, or bfloat16 for kBf16.
  template <class T>
  struct Scratch {
    ncclkit::nccl::DeviceBuffer<T> activations;
    ncclkit::nccl::DeviceBuffer<T> deltas[2];
    ncclkit::nccl::DeviceBuffer<T> ones;
    ncclkit::nccl::DeviceBuffer<T> inputs;  // the batch's inputs cast to T (bfloat16 only)
  };

  static constexpr std::size_t kMostSamples = std::numeric_limits<int>::max();

  static int as_int(std::size_t n) { return static_cast<int>(n); }

  template <class T>
  static constexpr cudaDataType_t kCudaType = std::is_same_v<T, float> ? CUDA_R_32F : CUDA_R_16BF;

  template <class T>
  void forward_backward_as(const Batch& batch, ncclkit::trainer::StepContext<B>& step) {
    const ncclkit::nccl::DeviceGuard guard(device_);
    const cudaStream_t stream = step.stream();
    const std::size_t n = batch.size();
    reserve(n);
    MLP_CUBLAS_CHECK(cublasSetStream(handle_.get(), stream));
    forward<T>(batch, stream, [&](const Layer& layer) {
      step.need(layer.weight_slot);
      step.need(layer.bias_slot);
    });
    // The loss's gradient with respect to the output: loss_weight · 2 (p − y) / output.
    const std::size_t out = options_.output;
    Scratch<T>& scratch = scratch_for<T>();
    T* delta = scratch.deltas[0].data();
    kernels::mean_squared_error<<<kernels::blocks_for(n * out, 1024), kernels::kThreads, 0, stream>>>(
        activation<T>(layers_.size() - 1), batch.targets.data(), n, out,
        static_cast<float>(2.0 * step.loss_weight() / static_cast<double>(out)), delta, step.metrics());
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    T* spare = scratch.deltas[1].data();
    const float one = 1.0f, zero = 0.0f;
    const float grad_beta = step.accumulate() ? 1.0f : 0.0f;
    for (std::size_t l = layers_.size(); l-- > 0;) {
      const Layer& layer = layers_[l];
      const T* in = input_of<T>(batch, l);
      // dX = dZ W (row-major [n, in]): column-major dXᶜ (in × n) = Wᶜ dZᶜ, before the mark below.
      if (l > 0) {
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, layer.in, n, layer.out, weight_of<T>(layer), layer.in, delta, layer.out, zero,
             spare, layer.in);
      }
      // dW += dZᵀ X (row-major [out, in]): column-major dWᶜ (in × out) += Xᶜ dZᶜᵀ.
      gemm(CUBLAS_OP_N, CUBLAS_OP_T, layer.in, layer.out, n, in, layer.in, delta, layer.out, grad_beta,
           layer.weight_grad, layer.in);
      // db += Σ_s dZ[s]: column-major dZᶜ (out × n) times a vector of n ones.
      if constexpr (std::is_same_v<T, float>) {
        MLP_CUBLAS_CHECK(cublasSgemv(handle_.get(), CUBLAS_OP_N, as_int(layer.out), as_int(n), &one, delta,
                                     as_int(layer.out), scratch.ones.data(), 1, &grad_beta, layer.bias_grad, 1));
      } else {
        gemm(CUBLAS_OP_N, CUBLAS_OP_N, layer.out, 1, n, delta, layer.out, scratch.ones.data(), n, grad_beta,
             layer.bias_grad, layer.out);
      }
      step.ready(layer.weight_slot);
      step.ready(layer.bias_slot);
      if (l == 0) break;
      // ReLU's backward through the layer below, whose output is this layer's input.
      kernels::relu_backward<<<kernels::blocks_for(n * layer.in), kernels::kThreads, 0, stream>>>(
          spare, activation<T>(l - 1), n * layer.in);
      NCCLKIT_CUDA_CHECK(cudaGetLastError());
      std::swap(delta, spare);
    }
  }

  template <class T>
  void evaluate_as(const Batch& batch, ncclkit::trainer::EvalContext<B>& eval) {
    const ncclkit::nccl::DeviceGuard guard(device_);
    const cudaStream_t stream = eval.stream();
    const std::size_t n = batch.size();
    reserve(n);
    MLP_CUBLAS_CHECK(cublasSetStream(handle_.get(), stream));
    forward<T>(batch, stream);
    kernels::mean_squared_error<<<kernels::blocks_for(n * options_.output, 1024), kernels::kThreads, 0, stream>>>(
        activation<T>(layers_.size() - 1), batch.targets.data(), n, options_.output, 0.0f, static_cast<T*>(nullptr),
        eval.metrics());
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
  }

  // C = A B (with the given transpositions) + beta C, float32 accumulation: A and B in the
  // activations' type, C float32 (gradients) or the activations' type.
  template <class AB, class C>
  void gemm(cublasOperation_t a_op, cublasOperation_t b_op, std::size_t m, std::size_t n, std::size_t k, const AB* a,
            std::size_t lda, const AB* b, std::size_t ldb, float beta, C* c, std::size_t ldc) {
    const float alpha = 1.0f;
    const cublasComputeType_t compute =
        options_.precision == Precision::kTf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    MLP_CUBLAS_CHECK(cublasGemmEx(handle_.get(), a_op, b_op, as_int(m), as_int(n), as_int(k), &alpha, a, kCudaType<AB>,
                                  as_int(lda), b, kCudaType<AB>, as_int(ldb), &beta, c, kCudaType<C>, as_int(ldc),
                                  compute, CUBLAS_GEMM_DEFAULT));
  }

  // y = act(x Wᵀ + b) for every layer, each layer's output kept for backward; `need(layer)`
  // right before a layer reads its parameters.
  template <class T>
  void forward(const Batch& batch, cudaStream_t stream) {
    forward<T>(batch, stream, [](const Layer&) {});
  }
  template <class T, class Need>
  void forward(const Batch& batch, cudaStream_t stream, Need need) {
    const std::size_t n = batch.size();
    if (batch.inputs.size() != n * options_.input || batch.targets.size() != n * options_.output) {
      throw ncclkit::ConfigError("mlp_cublas::MlpCublas: a batch of " + std::to_string(n) + " samples holds " +
                                 std::to_string(batch.inputs.size()) + " inputs and " +
                                 std::to_string(batch.targets.size()) + " targets; the model takes " +
                                 std::to_string(options_.input) + " and gives " + std::to_string(options_.output) +
                                 " per sample");
    }
    if constexpr (!std::is_same_v<T, float>) {
      // The batch's inputs in bfloat16 (the weights' copy is the trainer's: see the header comment).
      kernels::cast<<<kernels::blocks_for(n * options_.input), kernels::kThreads, 0, stream>>>(
          batch.inputs.data(), scratch_for<T>().inputs.data(), n * options_.input);
    }
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      const Layer& layer = layers_[l];
      T* out = activation<T>(l);
      need(layer);
      gemm(CUBLAS_OP_T, CUBLAS_OP_N, layer.out, n, layer.in, weight_of<T>(layer), layer.in, input_of<T>(batch, l),
           layer.in, 0.0f, out, layer.out);
      kernels::bias_activation<<<kernels::blocks_for(n * layer.out), kernels::kThreads, 0, stream>>>(
          out, layer.bias, n, layer.out, l + 1 < layers_.size());
    }
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
  }

  // The weight the GEMMs read: the float32 master, or its bfloat16 copy.
  template <class T>
  const T* weight_of(const Layer& layer) const {
    if constexpr (std::is_same_v<T, float>) {
      return layer.weight;
    } else {
      return layer.weight_bf16;
    }
  }

  // Layer l's input: the batch's (cast to T for bfloat16), or the output of the layer below.
  template <class T>
  const T* input_of(const Batch& batch, std::size_t l) {
    if (l > 0) return activation<T>(l - 1);
    if constexpr (std::is_same_v<T, float>) {
      return batch.inputs.data();
    } else {
      return scratch_for<T>().inputs.data();
    }
  }

  template <class T>
  Scratch<T>& scratch_for() {
    if constexpr (std::is_same_v<T, float>) {
      return float_scratch_;
    } else {
      return bf16_scratch_;
    }
  }

  // Layer l's output (after its activation) for the current batch: [n, out_features(l)].
  template <class T>
  T* activation(std::size_t l) {
    return scratch_for<T>().activations.data() + capacity_ * activation_offsets_[l];
  }

  void reserve(std::size_t n) {
    if (n == 0) throw ncclkit::ConfigError("mlp_cublas::MlpCublas: an empty batch");
    if (n > kMostSamples) {
      throw ncclkit::ConfigError("mlp_cublas::MlpCublas: a batch of " + std::to_string(n) + " samples; cuBLAS takes " +
                                 "at most " + std::to_string(kMostSamples) + " (int dimensions): split it");
    }
    if (n <= capacity_) return;
    // The stream may still use the old scratch: let it finish before it goes.
    NCCLKIT_CUDA_CHECK(cudaDeviceSynchronize());
    activation_offsets_.assign(layers_.size(), 0);
    std::size_t features = 0, widest = options_.input;
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      activation_offsets_[l] = features;
      features += layers_[l].out;
      widest = std::max(widest, layers_[l].out);
    }
    if (options_.precision == Precision::kBf16) {
      allocate(bf16_scratch_, n, features, widest);
      bf16_scratch_.inputs = ncclkit::nccl::DeviceBuffer<__nv_bfloat16>(n * options_.input, device_);
    } else {
      allocate(float_scratch_, n, features, widest);
    }
    capacity_ = n;
  }

  template <class T>
  void allocate(Scratch<T>& scratch, std::size_t n, std::size_t features, std::size_t widest) {
    scratch.activations = ncclkit::nccl::DeviceBuffer<T>(n * features, device_);
    scratch.deltas[0] = ncclkit::nccl::DeviceBuffer<T>(n * widest, device_);
    scratch.deltas[1] = ncclkit::nccl::DeviceBuffer<T>(n * widest, device_);
    scratch.ones = ncclkit::nccl::DeviceBuffer<T>(n, device_);
    kernels::fill_value<T><<<kernels::blocks_for(n), kernels::kThreads>>>(scratch.ones.data(), n, static_cast<T>(1.0f));
    NCCLKIT_CUDA_CHECK(cudaGetLastError());
    NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(cudaStreamLegacy));
  }

  MlpOptions options_;
  std::vector<Layer> layers_;
  int device_ = -1;
  CublasHandle handle_;
  std::size_t capacity_ = 0;  // samples the scratch holds
  std::vector<std::size_t> activation_offsets_;
  Scratch<float> float_scratch_;         // every precision but kBf16
  Scratch<__nv_bfloat16> bf16_scratch_;  // kBf16
};

}  // namespace mlp_cublas
