#pragma once
/// What rank 0 prints and writes about training: a progress line per log interval ("epoch 2,
/// step 40/112: loss 0.3121, accuracy 91.4%, 5120 samples/s, 0:07 elapsed, 0:12 left") and, for
/// plots, a JSON line with the same numbers. Pure formatting; the trainer decides when.

#include <chrono>   // std::chrono
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <cstdio>   // std::snprintf, std::FILE
#include <string>   // std::string

#include "ncclkit/trainer/model.hpp"

namespace ncclkit::trainer {

/// One progress report: where training is, and the metrics of the steps since the last one.
struct Progress {
  std::uint64_t epoch = 0;
  std::uint64_t step = 0;              ///< steps done in all
  std::size_t step_in_epoch = 0;
  std::size_t steps_per_epoch = 0;     ///< 0: unknown (steps outside `fit`)
  Metrics metrics;                     ///< summed over every rank, since the last report
  double learning_rate = 0;
  double samples_per_second = 0;
  double elapsed_seconds = 0;
  double left_seconds = -1;            ///< negative: unknown
  const char* kind = "train";          ///< "train" or "eval"
};

/// "1:05" or "1:02:03".
inline std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(seconds + 0.5);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof text, "%lld:%02lld:%02lld", s / 3600, s / 60 % 60, s % 60);
  } else {
    std::snprintf(text, sizeof text, "%lld:%02lld", s / 60, s % 60);
  }
  return text;
}

/// The line printed for `p`.
inline std::string progress_line(const Progress& p) {
  char text[256];
  std::string line = std::string(p.kind) + " epoch " + std::to_string(p.epoch);
  if (p.steps_per_epoch > 0) {
    line += ", step " + std::to_string(p.step_in_epoch) + "/" + std::to_string(p.steps_per_epoch);
  } else {
    line += ", step " + std::to_string(p.step);
  }
  std::snprintf(text, sizeof text, ": loss %.4f", p.metrics.loss());
  line += text;
  if (p.metrics.correct > 0) {
    std::snprintf(text, sizeof text, ", accuracy %.2f%%", 100.0 * p.metrics.accuracy());
    line += text;
  }
  if (p.samples_per_second > 0) {
    std::snprintf(text, sizeof text, ", %.0f samples/s", p.samples_per_second);
    line += text;
  }
  line += ", " + format_duration(p.elapsed_seconds) + " elapsed";
  if (p.left_seconds >= 0) line += ", " + format_duration(p.left_seconds) + " left";
  return line;
}

/// One JSON object on one line, for plots.
inline std::string progress_json(const Progress& p) {
  char text[512];
  std::snprintf(text, sizeof text,
                "{\"kind\": \"%s\", \"epoch\": %llu, \"step\": %llu, \"loss\": %.9g, \"accuracy\": %.9g, "
                "\"samples\": %.0f, \"lr\": %.9g, \"samples_per_s\": %.6g, \"elapsed_s\": %.6g}",
                p.kind, static_cast<unsigned long long>(p.epoch), static_cast<unsigned long long>(p.step),
                p.metrics.loss(), p.metrics.accuracy(), p.metrics.samples, p.learning_rate, p.samples_per_second,
                p.elapsed_seconds);
  return text;
}

}  // namespace ncclkit::trainer
