#pragma once
/// `LrSchedule`: the learning rate of each optimizer step. Constant, or a linear warm-up then
/// a cosine decay or a step decay. A pure function of the step number, so a resumed run (which
/// knows its step) continues the same schedule with nothing else saved.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cmath>    // std::cos, std::pow, std::isfinite
#include <cstddef>  // std::size_t
#include <numbers>  // std::numbers::pi
#include <string>   // std::string, std::to_string

namespace ncclkit::trainer {

enum class Decay {
  kConstant,  ///< `lr` after the warm-up
  kCosine,    ///< from `lr` to `min_lr` over the steps up to `total_steps`, as half a cosine; then `min_lr`
  kStep,      ///< `lr` × `gamma` to the power (steps after the warm-up) / `step_size`, rounded down
};

/// Designated initialisers: `{.lr = 0.1, .decay = Decay::kCosine, .warmup_steps = 100, .total_steps = 5000}`.
struct LrSchedule {
  double lr = 0.01;
  Decay decay = Decay::kConstant;
  /// Steps of a linear warm-up first: step s < warmup_steps has lr × (s + 1) / warmup_steps.
  std::size_t warmup_steps = 0;
  /// kCosine: the step at which the decay reaches `min_lr` (more than warmup_steps).
  std::size_t total_steps = 0;
  double min_lr = 0.0;
  /// kStep: steps between decays, and the factor of each.
  std::size_t step_size = 0;
  double gamma = 0.1;

  /// Why this schedule cannot run, naming the field; empty when it can.
  std::string problem() const {
    const std::string who = "ncclkit: LrSchedule: ";
    if (!(lr > 0) || !std::isfinite(lr)) return who + "lr must be a positive number, not " + std::to_string(lr);
    if (decay == Decay::kCosine && total_steps <= warmup_steps) {
      return who + "a cosine decay needs total_steps (" + std::to_string(total_steps) + ") above warmup_steps (" +
             std::to_string(warmup_steps) + ")";
    }
    if (decay == Decay::kCosine && !(min_lr >= 0 && min_lr <= lr)) {
      return who + "min_lr must lie in [0, lr], not " + std::to_string(min_lr);
    }
    if (decay == Decay::kStep && step_size == 0) return who + "a step decay needs step_size above 0";
    if (decay == Decay::kStep && !(gamma > 0 && gamma <= 1)) {
      return who + "gamma must lie in (0, 1], not " + std::to_string(gamma);
    }
    return {};
  }

  /// The learning rate of step `step` (counted from 0).
  double at(std::size_t step) const {
    if (step < warmup_steps) return lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
    const std::size_t after = step - warmup_steps;
    switch (decay) {
      case Decay::kConstant:
        return lr;
      case Decay::kCosine: {
        const std::size_t span = total_steps - warmup_steps;
        if (after >= span) return min_lr;
        const double t = static_cast<double>(after) / static_cast<double>(span);
        return min_lr + (lr - min_lr) * 0.5 * (1.0 + std::cos(std::numbers::pi * t));
      }
      case Decay::kStep:
        return lr * std::pow(gamma, static_cast<double>(after / step_size));
    }
    return lr;
  }
};

}  // namespace ncclkit::trainer
