#pragma once
// The digits classifier as a trainer Model on host memory (the Gloo backend): an MLP
// 64 -> hidden (ReLU) -> 10 with softmax cross-entropy, in plain loops. Backward marks each
// layer's gradients ready as soon as they are written, output layer first, so that its bucket
// can be reduced while the first layer's gradients are computed.
#include <cmath>    // std::exp, std::log, std::sqrt
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <span>     // std::span
#include <vector>   // std::vector

#include <ncclkit/fusion/layout.hpp>
#include <ncclkit/trainer/model.hpp>
#include <ncclkit/trainer/sampler.hpp>

#include "digits/data.hpp"

namespace digits {

/// A batch in host memory: rows of kPixels features and their labels.
struct HostBatch {
  std::vector<float> features;
  std::vector<int> labels;
  std::size_t size() const { return labels.size(); }
};

/// A Dataset of the trainer over samples in host memory.
class HostData {
 public:
  explicit HostData(Samples samples) : samples_(std::move(samples)) {}
  std::size_t size() const { return samples_.size(); }
  HostBatch batch(std::span<const std::size_t> indices) const {
    HostBatch b;
    for (std::size_t i : indices) {
      b.features.insert(b.features.end(), samples_.features.begin() + static_cast<long>(i * kPixels),
                        samples_.features.begin() + static_cast<long>((i + 1) * kPixels));
      b.labels.push_back(samples_.labels[i]);
    }
    return b;
  }

 private:
  Samples samples_;
};

/// Uniform in [-bound, bound) from a counter-based generator: the same initial weights on every
/// platform (only rank 0's are used: the trainer broadcasts them).
inline float uniform(std::uint64_t seed, std::size_t i, float bound) {
  const std::uint64_t h = ncclkit::trainer::detail::mix64(seed ^ ncclkit::trainer::detail::mix64(i));
  return bound * (static_cast<float>(h >> 40) / static_cast<float>(1u << 24) * 2.0f - 1.0f);
}

template <class B>
class MlpCpu {
 public:
  using Batch = HostBatch;
  explicit MlpCpu(std::size_t hidden = 128, std::uint64_t seed = 1) : hidden_(hidden), seed_(seed) {}

  void declare(ncclkit::fusion::FusedLayout& layout) const {
    const auto h = static_cast<std::int64_t>(hidden_);
    layout.add("fc1.weight", {h, static_cast<std::int64_t>(kPixels)}, ncclkit::DataType::kFloat32);
    layout.add("fc1.bias", {h}, ncclkit::DataType::kFloat32);
    layout.add("fc2.weight", {static_cast<std::int64_t>(kClasses), h}, ncclkit::DataType::kFloat32);
    layout.add("fc2.bias", {static_cast<std::int64_t>(kClasses)}, ncclkit::DataType::kFloat32);
  }

  void bind(const ncclkit::trainer::ModelViews<B>& v) {
    w1_ = v.template value_data<float>("fc1.weight");
    b1_ = v.template value_data<float>("fc1.bias");
    w2_ = v.template value_data<float>("fc2.weight");
    b2_ = v.template value_data<float>("fc2.bias");
    gw1_ = v.template gradient_data<float>("fc1.weight");
    gb1_ = v.template gradient_data<float>("fc1.bias");
    gw2_ = v.template gradient_data<float>("fc2.weight");
    gb2_ = v.template gradient_data<float>("fc2.bias");
    // Kaiming-uniform weights for ReLU, zero biases.
    const float bound1 = std::sqrt(6.0f / static_cast<float>(kPixels));
    const float bound2 = std::sqrt(6.0f / static_cast<float>(hidden_));
    for (std::size_t i = 0; i < hidden_ * kPixels; ++i) w1_[i] = uniform(seed_, i, bound1);
    for (std::size_t i = 0; i < kClasses * hidden_; ++i) w2_[i] = uniform(seed_ + 1, i, bound2);
    for (std::size_t i = 0; i < hidden_; ++i) b1_[i] = 0;
    for (std::size_t i = 0; i < kClasses; ++i) b2_[i] = 0;
  }

  void forward_backward(const Batch& batch, ncclkit::trainer::StepContext<B>& step) {
    const std::size_t n = batch.size();
    forward(batch);
    // d(weight × summed loss) / d(logits) = weight × (softmax − one hot).
    const auto weight = static_cast<float>(step.loss_weight());
    std::vector<float> dlogits(n * kClasses);
    double loss = 0, correct = 0;
    for (std::size_t s = 0; s < n; ++s) {
      const float* p = &probs_[s * kClasses];
      const auto label = static_cast<std::size_t>(batch.labels[s]);
      loss -= std::log(std::max(p[label], 1e-30f));
      correct += argmax(p) == label ? 1 : 0;
      for (std::size_t c = 0; c < kClasses; ++c) dlogits[s * kClasses + c] = weight * (p[c] - (c == label ? 1.0f : 0.0f));
    }
    // Output layer: its gradients, then ready (its bucket may go now).
    for (std::size_t s = 0; s < n; ++s) {
      for (std::size_t c = 0; c < kClasses; ++c) {
        const float d = dlogits[s * kClasses + c];
        gb2_[c] += d;
        for (std::size_t j = 0; j < hidden_; ++j) gw2_[c * hidden_ + j] += d * hidden_out_[s * hidden_ + j];
      }
    }
    step.ready("fc2.weight");
    step.ready("fc2.bias");
    // Hidden layer.
    for (std::size_t s = 0; s < n; ++s) {
      const float* x = &batch.features[s * kPixels];
      for (std::size_t j = 0; j < hidden_; ++j) {
        if (hidden_out_[s * hidden_ + j] <= 0) continue;  // ReLU
        float d = 0;
        for (std::size_t c = 0; c < kClasses; ++c) d += w2_[c * hidden_ + j] * dlogits[s * kClasses + c];
        gb1_[j] += d;
        for (std::size_t i = 0; i < kPixels; ++i) gw1_[j * kPixels + i] += d * x[i];
      }
    }
    step.ready("fc1.weight");
    step.ready("fc1.bias");
    add_metrics(step.metrics(), loss, correct, static_cast<double>(n));
  }

  void evaluate(const Batch& batch, ncclkit::trainer::EvalContext<B>& eval) {
    forward(batch);
    double loss = 0, correct = 0;
    for (std::size_t s = 0; s < batch.size(); ++s) {
      const float* p = &probs_[s * kClasses];
      const auto label = static_cast<std::size_t>(batch.labels[s]);
      loss -= std::log(std::max(p[label], 1e-30f));
      correct += argmax(p) == label ? 1 : 0;
    }
    add_metrics(eval.metrics(), loss, correct, static_cast<double>(batch.size()));
  }

 private:
  static std::size_t argmax(const float* p) {
    std::size_t best = 0;
    for (std::size_t c = 1; c < kClasses; ++c) best = p[c] > p[best] ? c : best;
    return best;
  }
  // Host memory: the sums go straight into the trainer's metric words.
  static void add_metrics(double* metrics, double loss, double correct, double samples) {
    metrics[0] += loss;
    metrics[1] += correct;
    metrics[2] += samples;
  }

  void forward(const Batch& batch) {
    const std::size_t n = batch.size();
    hidden_out_.assign(n * hidden_, 0.0f);
    probs_.assign(n * kClasses, 0.0f);
    for (std::size_t s = 0; s < n; ++s) {
      const float* x = &batch.features[s * kPixels];
      for (std::size_t j = 0; j < hidden_; ++j) {
        float a = b1_[j];
        for (std::size_t i = 0; i < kPixels; ++i) a += w1_[j * kPixels + i] * x[i];
        hidden_out_[s * hidden_ + j] = a > 0 ? a : 0;
      }
      float* logits = &probs_[s * kClasses];
      float top = -1e30f;
      for (std::size_t c = 0; c < kClasses; ++c) {
        float a = b2_[c];
        for (std::size_t j = 0; j < hidden_; ++j) a += w2_[c * hidden_ + j] * hidden_out_[s * hidden_ + j];
        logits[c] = a;
        top = std::max(top, a);
      }
      float sum = 0;
      for (std::size_t c = 0; c < kClasses; ++c) sum += logits[c] = std::exp(logits[c] - top);
      for (std::size_t c = 0; c < kClasses; ++c) logits[c] /= sum;
    }
  }

  std::size_t hidden_;
  std::uint64_t seed_;
  float *w1_ = nullptr, *b1_ = nullptr, *w2_ = nullptr, *b2_ = nullptr;
  float *gw1_ = nullptr, *gb1_ = nullptr, *gw2_ = nullptr, *gb2_ = nullptr;
  std::vector<float> hidden_out_;
  std::vector<float> probs_;
};

}  // namespace digits
