#pragma once
// The digits trainer, one rank's page of code, the same on every backend: the model (CPU loops
// or GPU kernels) and the data (host or GPU memory) are what the backend decides.
#include <chrono>   // std::chrono
#include <cstdio>   // std::printf
#include <string>   // std::string

#include <ncclkit/trainer.hpp>

namespace digits {

struct RunOptions {
  std::size_t epochs = 20;
  std::size_t global_batch = 64;
  ncclkit::compression::Codec codec = ncclkit::compression::Codec::kNone;
  std::string checkpoints;  // a folder, or empty
  std::string metrics_file;  // JSON lines, or empty
};

/// Trains `model` on `train`, evaluating `test` after each epoch; returns the test accuracy.
template <class Backend, class Model, class Data>
double train(Backend& comm, Model& model, const Data& train, const Data& test, const RunOptions& run) {
  using namespace ncclkit::trainer;
  const std::size_t epoch_steps = train.size() / run.global_batch;
  const std::size_t steps = run.epochs * epoch_steps;
  DataParallelTrainer<Model, Backend> trainer(
      comm, model,
      {.global_batch = run.global_batch,
       .codec = run.codec,
       .optimizer = {.weight_decay = 1e-4, .momentum = 0.9, .nesterov = true},
       .schedule = {.lr = 0.1, .decay = Decay::kCosine, .warmup_steps = 20, .total_steps = steps},
       .seed = 42,
       .log_interval = epoch_steps,  // one progress line per epoch
       .metrics_file = run.metrics_file,
       .checkpoint_folder = run.checkpoints,
       .checkpoint_interval = epoch_steps});  // a restart redoes one epoch at most
  const FitReport report = trainer.fit(train, run.epochs, &test);
  if (comm.rank() == 0) {
    std::printf("test accuracy %.2f%% (%.0f of %.0f) after %zu epochs, %llu steps, in %.1f s on %d ranks\n",
                100.0 * report.validation.accuracy(), report.validation.correct, report.validation.samples, run.epochs,
                static_cast<unsigned long long>(report.steps), report.seconds, comm.size());
  }
  return report.validation.accuracy();
}

}  // namespace digits
