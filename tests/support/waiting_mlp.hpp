#pragma once
// The digits MLP of examples/digits as a model that waits for its values (trainer/model.hpp's
// waits_for_values) and overwrites its gradients, so that nothing but StepContext::need orders
// its forward after the last step's deferred updates (TrainerOptions::defer_gather): it asks for
// every parameter before forward reads any (right, if it overlaps nothing), then zeroes its own
// gradients on a step's first micro-batch. Host memory only (the CPU model).

#include <cstddef>  // std::size_t
#include <cstring>  // std::memset
#include <vector>   // std::vector

#include "digits/mlp_cpu.hpp"
#include "ncclkit/trainer/model.hpp"

namespace ncclkit_test {

template <class B>
struct WaitingMlp : digits::MlpCpu<B> {
  using Base = digits::MlpCpu<B>;
  using Base::Base;
  static constexpr bool waits_for_values = true;
  static constexpr bool overwrites_gradients = true;
  static constexpr const char* kNames[] = {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"};
  std::vector<ncclkit::TensorView> gradients;
  std::size_t needs = 0;  // need calls so far
  void bind(const ncclkit::trainer::ModelViews<B>& v) {
    Base::bind(v);
    for (const char* name : kNames) gradients.push_back(v.gradient(name));
  }
  void forward_backward(const typename Base::Batch& batch, ncclkit::trainer::StepContext<B>& step) {
    for (const char* name : kNames) step.need(name);
    needs += std::size(kNames);
    if (!step.accumulate()) {
      for (const auto& g : gradients) std::memset(g.data, 0, g.bytes());
    }
    Base::forward_backward(batch, step);
  }
};

}  // namespace ncclkit_test
