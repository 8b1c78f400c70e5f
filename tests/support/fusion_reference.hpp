#pragma once
// The float64 reference of the fusion tests over real backends in host memory (Gloo): how far a
// fused buffer's float32 results are from the average of every rank's gradients.

#include <cmath>    // std::sqrt
#include <cstdint>  // std::uint32_t
#include <vector>   // std::vector

#include "ncclkit/fusion/layout.hpp"

namespace ncclkit::testing {

/// Norm-relative error of `grads` (a FusedBuffer in host memory, float32 tensors) against the
/// float64 average over `world_size` ranks of `gradient(rank, slot_index, step, count)`.
template <class Buffer, class Gradient>
double error_against_average(const Buffer& grads, int world_size, int step, Gradient gradient) {
  const fusion::FusedLayout& layout = grads.layout();
  double error = 0, norm = 0;
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const fusion::Slot slot{i};
    std::vector<double> reference(layout.count(slot), 0.0);
    for (int r = 0; r < world_size; ++r) {
      const auto values = gradient(r, i, step, layout.count(slot));
      for (std::size_t j = 0; j < values.size(); ++j) reference[j] += values[j] / world_size;
    }
    const auto out = grads.template span<float>(slot);
    for (std::size_t j = 0; j < reference.size(); ++j) {
      error += (out[j] - reference[j]) * (out[j] - reference[j]);
      norm += reference[j] * reference[j];
    }
  }
  return std::sqrt(error / norm);
}

}  // namespace ncclkit::testing
