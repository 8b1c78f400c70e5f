// Tests of ncclkit/trainer/data_parallel.hpp, ranks as threads over the loop-back backend, on
// the digits classifier of examples/digits (real data) and on a model whose gradient is known:
// N ranks with a global batch B reach the parameters of one rank with batch B; k micro-batches
// equal one batch k times larger; clipping and the schedule against a hand computation; a resume
// from a mid-epoch checkpoint equals the uninterrupted run bit for bit, at another world size it
// trains on; a checkpoint of another model, a corrupted one, an unwritable folder, ranks with
// other options or another dataset, invalid options on one rank, and non-finite gradients;
// defer_gather reaching the one-pass reduction's parameters bit for bit, and its errors.
#include <doctest/doctest.h>

#include <chrono>      // std::chrono
#include <cmath>       // std::sqrt, std::isnan
#include <cstddef>     // std::size_t
#include <cstdio>      // std::FILE
#include <filesystem>  // std::filesystem
#include <limits>      // std::numeric_limits
#include <span>        // std::span
#include <string>      // std::string
#include <vector>      // std::vector

#include "digits/data.hpp"
#include "digits/mlp_cpu.hpp"
#include "ncclkit/trainer/data_parallel.hpp"
#include "support/loopback_backend.hpp"
#include "support/temp_dir.hpp"
#include "support/waiting_mlp.hpp"

namespace trainer_tests {

namespace fs = std::filesystem;
using ncclkit::ConfigError;
using ncclkit::testing::LoopbackBackend;
using ncclkit::testing::LoopbackWorld;
using ncclkit::testing::message_of;
using ncclkit::testing::run_ranks;
using ncclkit::trainer::DataParallelTrainer;
using ncclkit::trainer::Decay;
using ncclkit::trainer::NonFinite;
using ncclkit::trainer::NonFiniteError;
using ncclkit::trainer::OptimizerKind;
using ncclkit::trainer::TrainerOptions;
using B = LoopbackBackend;
using Mlp = digits::MlpCpu<B>;
using ncclkit_test::TempDir;

// The digits split once for every test (1438 training, 359 test samples).
const std::array<digits::Samples, 2>& digits_split() {
  static const std::array<digits::Samples, 2> parts =
      digits::split(digits::read_csv(digits::locate(NCCLKIT_TEST_DIGITS_CSV)), 0.2, 1234);
  return parts;
}

using NeedingMlp = ncclkit_test::WaitingMlp<B>;

// Every parameter of a trainer, tensor after tensor.
template <class Model>
std::vector<float> values_of(const DataParallelTrainer<Model, B>& trainer) {
  std::vector<float> out;
  for (std::uint32_t i = 0; i < trainer.values().layout().size(); ++i) {
    const auto t = trainer.values().template span<float>(ncclkit::fusion::Slot{i});
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    norm += double(b[i]) * double(b[i]);
  }
  return std::sqrt(diff / norm);
}

TrainerOptions quiet(TrainerOptions o) {
  o.print_progress = false;
  return o;
}

// Trains `steps` steps at `world` ranks (threads) of the digits MLP and returns rank 0's
// parameters; every rank's must equal rank 0's bit for bit.
template <class Model = Mlp>
std::vector<float> train_digits(int world, TrainerOptions options, std::size_t steps) {
  LoopbackWorld loop(world);
  std::vector<std::vector<float>> values(static_cast<std::size_t>(world));
  const digits::HostData data(digits_split()[0]);
  const auto errors = run_ranks(world, [&](int rank) {
    B backend(loop, rank);
    Model model(32, 7);
    DataParallelTrainer<Model, B> trainer(backend, model, quiet(options));
    ncclkit::trainer::DistributedSampler sampler({.dataset_size = data.size(), .global_batch = options.global_batch,
                                                   .seed = options.seed},
                                                  rank, world);
    for (std::size_t s = 0; s < steps; ++s) {
      const auto mine = sampler.next();
      const std::size_t per = mine.size() / options.accumulation;
      std::vector<digits::HostBatch> micro;
      for (std::size_t k = 0; k < options.accumulation; ++k) {
        micro.push_back(data.batch(std::span<const std::size_t>(mine).subspan(k * per, per)));
      }
      trainer.step(std::span<const digits::HostBatch>(micro));
    }
    values[static_cast<std::size_t>(rank)] = values_of(trainer);
  });
  for (int r = 0; r < world; ++r) {
    CHECK(message_of(errors[static_cast<std::size_t>(r)]) == "");
    CHECK(values[static_cast<std::size_t>(r)] == values[0]);
  }
  return values[0];
}

// ---- a model whose gradient is known: g = (1, 2, 3, 4) per sample, loss 0 ---------------------

struct Count {
  std::size_t samples = 0;
};
struct CountData {
  std::size_t n = 64;
  std::size_t size() const { return n; }
  Count batch(std::span<const std::size_t> indices) const { return {indices.size()}; }
};
template <class Backend>
struct Known {
  using Batch = Count;
  float* w = nullptr;
  float* g = nullptr;
  float scale = 1.0f;  // multiplies the gradient (a NaN: non-finite gradients)
  void declare(ncclkit::fusion::FusedLayout& layout) { layout.add("w", {4}, ncclkit::DataType::kFloat32); }
  void bind(const ncclkit::trainer::ModelViews<Backend>& v) {
    w = v.template value_data<float>("w");
    g = v.template gradient_data<float>("w");
    for (int i = 0; i < 4; ++i) w[i] = 1.0f;
  }
  void forward_backward(const Batch& batch, ncclkit::trainer::StepContext<Backend>& step) {
    for (int i = 0; i < 4; ++i) {
      g[i] += static_cast<float>(step.loss_weight() * static_cast<double>(batch.samples)) * scale * float(i + 1);
    }
    step.ready("w");
    step.metrics()[2] += static_cast<double>(batch.samples);
  }
  void evaluate(const Batch& batch, ncclkit::trainer::EvalContext<Backend>& eval) {
    eval.metrics()[2] += static_cast<double>(batch.samples);
  }
};

// Known, declaring overwrites_gradients: it writes the gradient where step.accumulate() is
// false and adds where it is true, and records whether it ever found the gradient zeroed there
// after the first step (it holds the last step's reduced gradient unless the trainer zeroed it).
template <class Backend>
struct KnownOverwriting : Known<Backend> {
  static constexpr bool overwrites_gradients = true;
  std::size_t calls = 0, written = 0, found_zeroed = 0;
  void forward_backward(const Count& batch, ncclkit::trainer::StepContext<Backend>& step) {
    if (!step.accumulate()) {
      ++written;
      if (calls > 0 && this->g[0] == 0.0f) ++found_zeroed;
      for (int i = 0; i < 4; ++i) this->g[i] = 0.0f;  // written: Known adds to it below
    }
    ++calls;
    Known<Backend>::forward_backward(batch, step);
  }
};

// Known with a bfloat16 copy of its parameters (bfloat16_copy()), which it may update as soon as
// marked (done_with_values_when_ready: the reduction may apply the update). Each
// forward_backward counts the elements whose copy is not the bfloat16 of the parameter: what a
// model computing in bfloat16 would read stale. `start` gives the parameters values that
// bfloat16 rounds (1 + 2^-9 per element step), so a copy left behind shows.
template <class Backend>
struct KnownCopy : Known<Backend> {
  static constexpr bool done_with_values_when_ready = true;
  bool bfloat16_copy() const { return true; }
  ncclkit::BFloat16* copy = nullptr;
  float start = 1.0f;
  std::size_t stale = 0;
  void bind(const ncclkit::trainer::ModelViews<Backend>& v) {
    Known<Backend>::bind(v);
    copy = v.template copy_data<ncclkit::BFloat16>("w");
    for (int i = 0; i < 4; ++i) this->w[i] = start + float(i) * 0x1p-9f;
  }
  std::size_t stale_now() const {
    std::size_t n = 0;
    for (int i = 0; i < 4; ++i) n += copy[i].bits != ncclkit::BFloat16(this->w[i]).bits ? 1 : 0;
    return n;
  }
  void forward_backward(const Count& batch, ncclkit::trainer::StepContext<Backend>& step) {
    stale += stale_now();
    Known<Backend>::forward_backward(batch, step);
  }
};

}  // namespace trainer_tests

using namespace trainer_tests;

TEST_CASE("a model's bfloat16 copy is the rounding of its parameters after every kind of update and change") {
  // Two ranks, 3 steps each of: the separate update (float32 gradients), the update fused into
  // the compressed reduction (fp16), the update after the norm (clipping); AdamW and SGD with
  // momentum. Rank 1 binds other values than rank 0: after the start's broadcast its copy is of
  // rank 0's. A write outside the trainer is followed by refresh_copy.
  struct Case {
    const char* name;
    TrainerOptions options;
    bool fused;
  };
  const Case cases[] = {
      {"separate, SGD momentum", quiet({.global_batch = 8, .optimizer = {.momentum = 0.9}, .schedule = {.lr = 0.01}}),
       false},
      {"fused, AdamW",
       quiet({.global_batch = 8, .codec = ncclkit::compression::Codec::kFloat16,
              .optimizer = {.kind = OptimizerKind::kAdamW}, .schedule = {.lr = 0.01}}),
       true},
      {"after the norm, SGD", quiet({.global_batch = 8, .schedule = {.lr = 0.01}, .clip_norm = 1.0}), false},
  };
  for (const Case& c : cases) {
    const std::string name = c.name;
    CAPTURE(name);
    LoopbackWorld world(2);
    std::vector<std::size_t> stale(2), applied(2), after_start(2), after_write(2);
    std::vector<std::vector<float>> w(2);
    const auto errors = run_ranks(2, [&](int rank) {
      B backend(world, rank);
      backend.allow_compressed_reduce(true);
      KnownCopy<B> model;
      model.start = rank == 0 ? 1.0f : 5.0f;
      DataParallelTrainer<KnownCopy<B>, B> trainer(backend, model, c.options);
      const auto r = static_cast<std::size_t>(rank);
      after_start[r] = model.stale_now();
      for (int s = 0; s < 3; ++s) trainer.step(Count{4});
      stale[r] = model.stale + model.stale_now();
      applied[r] = backend.updates_applied();
      w[r].assign(model.w, model.w + 4);
      model.w[0] = 7.0f + 0x1p-9f;
      trainer.refresh_copy();
      after_write[r] = model.stale_now();
    });
    for (const auto& e : errors) CHECK(message_of(e) == "");
    for (std::size_t r = 0; r < 2; ++r) {
      CAPTURE(r);
      CHECK(after_start[r] == 0);
      CHECK(stale[r] == 0);
      CHECK(after_write[r] == 0);
      CHECK(w[r] == w[0]);
      CHECK(w[r][3] != 1.0f + 3 * 0x1p-9f);  // it trained
      CHECK((applied[r] > 0) == c.fused);    // the path named is the one that ran
    }
  }
}

TEST_CASE("a model that does not ask for a bfloat16 copy gets an error naming the switch, not a null pointer") {
  struct Asks : Known<B> {
    std::string message;
    void bind(const ncclkit::trainer::ModelViews<B>& v) {
      Known<B>::bind(v);
      try {
        (void)v.copy("w");
      } catch (const ConfigError& e) {
        message = e.what();
      }
    }
  };
  LoopbackWorld world(1);
  const auto errors = run_ranks(1, [&](int rank) {
    B backend(world, rank);
    Asks model;
    DataParallelTrainer<Asks, B> trainer(backend, model, quiet({.global_batch = 4, .schedule = {.lr = 0.1}}));
    CHECK(model.message ==
          "ncclkit: ModelViews::copy: the trainer keeps no bfloat16 copy of \"w\"; give the model `bool "
          "bfloat16_copy() const` returning true");
    trainer.refresh_copy();  // nothing to refresh: no error
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("a model that overwrites its gradients on a step's first micro-batch trains as one that adds to zeros") {
  // Two ranks, 3 micro-batches a step, momentum: the parameters after 3 steps must be the same
  // bits, the first micro-batch of each step must be told to write, and after the first step
  // the gradient it finds must be the last step's (the trainer no longer zeroes it).
  LoopbackWorld world(2);
  std::vector<std::vector<float>> adding(2), writing(2);
  std::vector<std::size_t> written(2), zeroed(2);
  const auto errors = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    const TrainerOptions options =
        quiet({.global_batch = 24, .accumulation = 3, .optimizer = {.momentum = 0.9}, .schedule = {.lr = 0.1}});
    const std::vector<Count> micro(3, Count{4});
    Known<B> plain;
    DataParallelTrainer<Known<B>, B> a(backend, plain, options);
    KnownOverwriting<B> over;
    DataParallelTrainer<KnownOverwriting<B>, B> b(backend, over, options);
    for (int s = 0; s < 3; ++s) {
      a.step(std::span<const Count>(micro));
      b.step(std::span<const Count>(micro));
    }
    const auto r = static_cast<std::size_t>(rank);
    adding[r].assign(plain.w, plain.w + 4);
    writing[r].assign(over.w, over.w + 4);
    written[r] = over.written;
    zeroed[r] = over.found_zeroed;
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
  for (std::size_t r = 0; r < 2; ++r) {
    CAPTURE(r);
    CHECK(writing[r] == adding[r]);
    CHECK(adding[r] != std::vector<float>(4, 1.0f));  // it trained
    CHECK(written[r] == 3);                           // once per step: the first micro-batch
    CHECK(zeroed[r] == 0);
  }
}

TEST_CASE("on one rank, float32 gradients are not sent through a collective: the rank's average is its own") {
  LoopbackWorld world(1);
  const auto errors = run_ranks(1, [&](int rank) {
    B backend(world, rank);
    Known<B> model;
    DataParallelTrainer<Known<B>, B> trainer(backend, model, quiet({.global_batch = 4, .schedule = {.lr = 0.1}}));
    CHECK(trainer.sync().reducer().name() == "none (one rank)");
    const std::vector<Count> micro(1, Count{4});
    trainer.step(std::span<const Count>(micro));
    CHECK(std::vector<float>(model.w, model.w + 4) != std::vector<float>(4, 1.0f));  // it trained
    Known<B> compressed_model;
    DataParallelTrainer<Known<B>, B> compressed(
        backend, compressed_model,
        quiet({.global_batch = 4, .codec = ncclkit::compression::Codec::kFloat16, .schedule = {.lr = 0.1}}));
    CHECK(compressed.sync().reducer().name() != "none (one rank)");  // a codec still rounds, as on N ranks
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("N ranks with a global batch B reach the parameters of one rank with batch B (digits, SGD and AdamW)") {
  for (const auto kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    CAPTURE(static_cast<int>(kind));
    TrainerOptions options{.global_batch = 48,
                           .optimizer = {.kind = kind, .weight_decay = 1e-4, .momentum = 0.9},
                           .schedule = {.lr = kind == OptimizerKind::kSgd ? 0.1 : 1e-3, .warmup_steps = 2},
                           .seed = 5};
    const auto one = train_digits(1, options, 6);
    for (int world : {2, 4}) {
      CAPTURE(world);
      CHECK(relative_difference(train_digits(world, options, 6), one) <= 1e-6);
    }
  }
}

TEST_CASE("accumulating k micro-batches equals one batch k times larger") {
  const TrainerOptions one{.global_batch = 48, .optimizer = {.momentum = 0.9}, .schedule = {.lr = 0.05}, .seed = 3};
  TrainerOptions three = one;
  three.accumulation = 3;
  CHECK(relative_difference(train_digits(2, three, 5), train_digits(2, one, 5)) <= 1e-6);
}

TEST_CASE("clipping by global norm and the warm-up schedule give the hand-computed parameters") {
  // g = (1, 2, 3, 4): |g| = sqrt(30). Clipped to 1, SGD without momentum moves w by lr · g / sqrt(30);
  // the warm-up makes lr 0.1 · 1/2 at step 0 and 0.1 at step 1.
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Known<B> model;
    DataParallelTrainer<Known<B>, B> trainer(
        backend, model, quiet({.global_batch = 8, .schedule = {.lr = 0.1, .warmup_steps = 2}, .clip_norm = 1.0}));
    const Count batch{4};
    trainer.step(batch);
    trainer.step(batch);
    for (int i = 0; i < 4; ++i) {
      const double expected = 1.0 - (0.05 + 0.1) * (i + 1) / std::sqrt(30.0);
      CHECK(model.w[i] == doctest::Approx(expected).epsilon(1e-6));
    }
    // No clipping below the norm: the step is lr · g.
    DataParallelTrainer<Known<B>, B> loose(backend, model, quiet({.global_batch = 8, .schedule = {.lr = 0.1}, .clip_norm = 100}));
    loose.step(batch);
    for (int i = 0; i < 4; ++i) CHECK(model.w[i] == doctest::Approx(1.0 - 0.1 * (i + 1)).epsilon(1e-6));
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("non-finite gradients stop training with an error naming the step, or skip it on every rank") {
  LoopbackWorld world(2);
  const auto errors = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Known<B> model;
    DataParallelTrainer<Known<B>, B> stop(backend, model, quiet({.global_batch = 8, .schedule = {.lr = 0.1}, .clip_norm = 1}));
    stop.step(Count{4});
    model.scale = std::numeric_limits<float>::quiet_NaN();
    CHECK_THROWS_WITH_AS(stop.step(Count{4}), doctest::Contains("the gradients of step 1 are not finite"),
                         NonFiniteError);
    model.scale = 1.0f;
    DataParallelTrainer<Known<B>, B> skip(backend, model,
                                          quiet({.global_batch = 8, .schedule = {.lr = 0.1}, .nonfinite = NonFinite::kSkip}));
    const std::vector<float> before(model.w, model.w + 4);
    model.scale = std::numeric_limits<float>::infinity();
    skip.step(Count{4});
    CHECK(std::vector<float>(model.w, model.w + 4) == before);
    CHECK(skip.skipped_steps() == 1);
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("fit trains the digits classifier past 90% test accuracy in a few epochs, on two ranks") {
  LoopbackWorld world(2);
  std::vector<double> accuracy(2);
  const digits::HostData train(digits_split()[0]);
  const digits::HostData test(digits_split()[1]);
  const auto errors = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Mlp model(64, 1);
    DataParallelTrainer<Mlp, B> trainer(
        backend, model, quiet({.global_batch = 64, .optimizer = {.momentum = 0.9}, .schedule = {.lr = 0.1}, .seed = 2}));
    const auto report = trainer.fit(train, 6, &test);
    accuracy[static_cast<std::size_t>(rank)] = report.validation.accuracy();
    CHECK(report.validation.samples == static_cast<double>(digits_split()[1].size()));
    CHECK(report.steps == 6 * (digits_split()[0].size() / 64));
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
  CHECK(accuracy[0] == accuracy[1]);
  CHECK(accuracy[0] >= 0.9);
}

TEST_CASE("a resume from a mid-epoch checkpoint continues the uninterrupted run bit for bit") {
  TempDir dir("trainer-resume");
  const digits::HostData train(digits_split()[0]);
  const TrainerOptions base{.global_batch = 64,
                            .optimizer = {.kind = OptimizerKind::kAdamW},
                            .schedule = {.lr = 2e-3, .decay = Decay::kCosine, .warmup_steps = 5, .total_steps = 60},
                            .seed = 9,
                            .checkpoint_interval = 30,
                            .keep_checkpoints = 5};
  // Uninterrupted: 2 epochs of 22 steps; checkpoints at steps 30 (mid epoch 1) and 44.
  std::vector<float> whole;
  {
    LoopbackWorld world(2);
    const auto errors = run_ranks(2, [&](int rank) {
      B backend(world, rank);
      Mlp model(32, 4);
      TrainerOptions o = base;
      o.checkpoint_folder = dir.path + "/whole";
      DataParallelTrainer<Mlp, B> trainer(backend, model, quiet(o));
      trainer.fit(train, 2);
      if (rank == 0) whole = values_of(trainer);
    });
    for (const auto& e : errors) CHECK(message_of(e) == "");
  }
  // Interrupted at step 30, then resumed from its checkpoint.
  const fs::path folder = dir.path + "/cut";
  fs::create_directories(folder);
  fs::copy_file(fs::path(dir.path) / "whole" / "step-00000030.ckpt", folder / "step-00000030.ckpt");
  std::vector<float> resumed;
  std::uint64_t resumed_at = 0;
  {
    LoopbackWorld world(2);
    const auto errors = run_ranks(2, [&](int rank) {
      B backend(world, rank);
      Mlp model(32, 99);  // other initial weights: the checkpoint's must win
      TrainerOptions o = base;
      o.checkpoint_folder = folder.string();
      DataParallelTrainer<Mlp, B> trainer(backend, model, quiet(o));
      if (rank == 0) resumed_at = trainer.steps();
      trainer.fit(train, 2);
      if (rank == 0) resumed = values_of(trainer);
    });
    for (const auto& e : errors) CHECK(message_of(e) == "");
  }
  CHECK(resumed_at == 30);
  REQUIRE(resumed.size() == whole.size());
  CHECK(resumed == whole);
  // At four ranks the same checkpoint trains on, from the samples not seen yet.
  const fs::path four_folder = dir.path + "/four";
  fs::create_directories(four_folder);
  fs::copy_file(fs::path(dir.path) / "whole" / "step-00000030.ckpt", four_folder / "step-00000030.ckpt");
  LoopbackWorld four(4);
  const auto errors = run_ranks(4, [&](int rank) {
    B backend(four, rank);
    Mlp model(32, 4);
    TrainerOptions o = base;
    o.checkpoint_folder = four_folder.string();
    o.checkpoint_interval = 0;
    DataParallelTrainer<Mlp, B> trainer(backend, model, quiet(o));
    CHECK(trainer.steps() == 30);
    trainer.fit(train, 2);
    CHECK(trainer.steps() == 44);
    CHECK(trainer.sampler()->position() == ncclkit::trainer::SamplerPosition{2, 0});
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
}

TEST_CASE("a checkpoint of another model, an unwritable folder, other options on one rank: errors on every rank") {
  TempDir dir("trainer-errors");
  const digits::HostData train(digits_split()[0]);
  const TrainerOptions base{.global_batch = 64, .schedule = {.lr = 0.1}, .checkpoint_folder = dir.path + "/ckpt"};
  {
    LoopbackWorld world(1);
    B backend(world, 0);
    Mlp model(32, 1);
    DataParallelTrainer<Mlp, B> trainer(backend, model, quiet(base));
    trainer.step(train.batch(std::vector<std::size_t>{0, 1, 2, 3}));
    trainer.save_checkpoint();
  }
  LoopbackWorld world(2, std::chrono::seconds(20));
  const auto start = std::chrono::steady_clock::now();
  const auto other_model = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Mlp model(48, 1);  // another hidden width
    DataParallelTrainer<Mlp, B> trainer(backend, model, quiet(base));
  });
  for (const auto& e : other_model) {
    CHECK(message_of(e).find("is of another model: tensor \"fc1.weight\": shape [32, 64] in the checkpoint, [48, 64] "
                             "in the model") != std::string::npos);
  }
  const auto unwritable = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Mlp model(32, 1);
    TrainerOptions o = base;
    o.checkpoint_folder = dir.path + "/ckpt/step-00000001.ckpt/below";  // under a file
    DataParallelTrainer<Mlp, B> trainer(backend, model, quiet(o));
  });
  CHECK(message_of(unwritable[0]).find("step-00000001.ckpt/below") != std::string::npos);
  CHECK(message_of(unwritable[1]).find("rank 0 rejected its own arguments") != std::string::npos);
  const auto other_options = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Mlp model(32, 1);
    TrainerOptions o = base;
    o.checkpoint_folder.clear();
    o.seed = static_cast<std::uint64_t>(rank);
    DataParallelTrainer<Mlp, B> trainer(backend, model, quiet(o));
  });
  for (const auto& e : other_options) CHECK(message_of(e).find("rank 1 was given another seed (1 against 0)") != std::string::npos);
  const auto bad_batch = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Mlp model(32, 1);
    TrainerOptions o = base;
    o.checkpoint_folder.clear();
    if (rank == 1) o.global_batch = 63;
    DataParallelTrainer<Mlp, B> trainer(backend, model, quiet(o));
  });
  CHECK(message_of(bad_batch[1]).find("a global batch of 63 does not split into 2 ranks") != std::string::npos);
  CHECK(message_of(bad_batch[0]).find("rank 1 rejected its own arguments") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));  // no rank waited for a timeout
}

TEST_CASE("min_bucket_bytes shapes the trainer's plan, must agree across ranks, and needs a fixed cap") {
  // The digits MLP 64 -> 32 -> 10: backward order fc2.bias (40 bytes), fc2.weight (1280),
  // fc1.bias (128), fc1.weight (8192), 256-byte aligned. Under a 1 KiB cap each weight is over
  // it, so each bias goes alone; with min_bucket_bytes 512 each bias takes its weight in.
  LoopbackWorld one(1);
  const auto buckets = [&](std::size_t min) {
    B backend(one, 0);
    Mlp model(32, 1);
    DataParallelTrainer<Mlp, B> trainer(
        backend, model,
        quiet({.global_batch = 4, .bucket_bytes = 1024, .min_bucket_bytes = min, .schedule = {.lr = 0.1}}));
    return trainer.sync().plan().size();
  };
  CHECK(buckets(0) == 4);
  CHECK(buckets(512) == 2);

  LoopbackWorld world(2, std::chrono::seconds(20));
  const auto start = std::chrono::steady_clock::now();
  const auto other = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Mlp model(32, 1);
    DataParallelTrainer<Mlp, B> trainer(
        backend, model,
        quiet({.global_batch = 4, .bucket_bytes = 1024, .min_bucket_bytes = rank == 1 ? 512u : 0u,
               .schedule = {.lr = 0.1}}));
  });
  for (const auto& e : other) {
    CHECK(message_of(e).find("rank 1 was given another min_bucket_bytes (512 against 0)") != std::string::npos);
  }
  const auto tuned = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Mlp model(32, 1);
    DataParallelTrainer<Mlp, B> trainer(
        backend, model, quiet({.global_batch = 4, .bucket_bytes = 0, .min_bucket_bytes = 512, .schedule = {.lr = 0.1}}));
  });
  CHECK(message_of(tuned[0]).find("min_bucket_bytes (512) shapes a fixed plan, and bucket_bytes 0 asks for a tuned "
                                  "one; set one of them to 0") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));  // no rank waited for a timeout
}

TEST_CASE("a rank with another dataset is an error naming the ranks and step counts, not a hang") {
  LoopbackWorld world(2, std::chrono::seconds(20));
  const auto start = std::chrono::steady_clock::now();
  const auto errors = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Known<B> model;
    DataParallelTrainer<Known<B>, B> trainer(backend, model, quiet({.global_batch = 8, .schedule = {.lr = 0.1}}));
    trainer.fit(CountData{rank == 0 ? 64u : 40u}, 1);
  });
  for (const auto& e : errors) {
    CHECK(message_of(e).find("rank 1 starts epoch 0 at sample 0 with 5 steps over 40 samples, rank 0 epoch 0 at sample "
                             "0 with 8 steps over 64 samples") != std::string::npos);
  }
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("defer_gather reaches the parameters of the one-pass reduction bit for bit, and fit evaluates alike") {
  // The loop-back backend sums a reduce-scatter as it sums an all_reduce: two halves change when
  // the result lands, not its bits. SGD with momentum and AdamW, accumulation, 2 and 4 ranks.
  for (const auto kind : {OptimizerKind::kSgd, OptimizerKind::kAdamW}) {
    CAPTURE(static_cast<int>(kind));
    TrainerOptions options{.global_batch = 48,
                           .accumulation = 2,
                           .optimizer = {.kind = kind, .weight_decay = 1e-4, .momentum = 0.9},
                           .schedule = {.lr = kind == OptimizerKind::kSgd ? 0.1 : 1e-3},
                           .seed = 5};
    for (int world : {2, 4}) {
      CAPTURE(world);
      const auto plain = train_digits(world, options, 5);
      TrainerOptions deferred = options;
      deferred.defer_gather = true;
      CHECK(train_digits<NeedingMlp>(world, deferred, 5) == plain);
    }
  }
  // fit: progress lines, evaluation after each epoch and a checkpoint at the end wait for the
  // last step's updates; its validation metrics are the one-pass run's.
  TempDir dir("trainer-defer");
  const digits::HostData train(digits_split()[0]);
  const digits::HostData test(digits_split()[1]);
  LoopbackWorld world(2);
  std::vector<double> loss(4);
  std::vector<std::size_t> needs(2);
  const auto errors = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    for (bool defer : {false, true}) {
      NeedingMlp model(32, 1);
      TrainerOptions o{.global_batch = 64,
                       .optimizer = {.momentum = 0.9},
                       .schedule = {.lr = 0.1},
                       .seed = 2,
                       .log_interval = 7,
                       .checkpoint_folder = dir.path + (defer ? "/defer" : "/plain")};
      o.defer_gather = defer;
      DataParallelTrainer<NeedingMlp, B> trainer(backend, model, quiet(o));
      CHECK(trainer.sync().options().defer_gather == defer);
      const auto report = trainer.fit(train, 2, &test);
      loss[static_cast<std::size_t>(rank) * 2 + (defer ? 1 : 0)] = report.validation.loss();
      if (defer) needs[static_cast<std::size_t>(rank)] = model.needs;
    }
  });
  for (const auto& e : errors) CHECK(message_of(e) == "");
  CHECK(loss[1] == loss[0]);
  CHECK(loss[3] == loss[2]);
  CHECK(loss[0] == loss[2]);
  CHECK(needs[0] == 4 * 2 * (digits_split()[0].size() / 64));
  // One rank has nothing to gather: the option is accepted and changes nothing.
  TrainerOptions one{.global_batch = 16, .schedule = {.lr = 0.1}, .seed = 4};
  TrainerOptions one_deferred = one;
  one_deferred.defer_gather = true;
  CHECK(train_digits<NeedingMlp>(1, one_deferred, 3) == train_digits(1, one, 3));
}

TEST_CASE(
    "defer_gather without a model that waits, with a codec, with clipping, or on one rank only: errors on every rank") {
  LoopbackWorld world(2, std::chrono::seconds(20));
  const auto start = std::chrono::steady_clock::now();
  TrainerOptions base{.global_batch = 64, .schedule = {.lr = 0.1}};
  base.defer_gather = true;
  const auto not_waiting = run_ranks(2, [&](int rank) {
    B backend(world, rank);
    Mlp model(32, 1);
    DataParallelTrainer<Mlp, B> trainer(backend, model, quiet(base));
  });
  CHECK(message_of(not_waiting[0]).find("defer_gather needs a model that calls step.need(slot)") != std::string::npos);
  CHECK(message_of(not_waiting[0]).find("waits_for_values") != std::string::npos);
  CHECK(message_of(not_waiting[1]).find("defer_gather needs a model") != std::string::npos);
  const auto with = [&](auto change) {
    return run_ranks(2, [&](int rank) {
      B backend(world, rank);
      NeedingMlp model(32, 1);
      TrainerOptions o = base;
      change(o, rank);
      DataParallelTrainer<NeedingMlp, B> trainer(backend, model, quiet(o));
    });
  };
  const auto codec = with([](TrainerOptions& o, int) { o.codec = ncclkit::compression::Codec::kFloat16; });
  for (const auto& e : codec) CHECK(message_of(e).find("defer_gather splits float32 reductions") != std::string::npos);
  const auto clipping = with([](TrainerOptions& o, int) { o.clip_norm = 1.0; });
  for (const auto& e : clipping)
    CHECK(message_of(e).find("and clip_norm needs the whole gradient's norm") != std::string::npos);
  const auto skip = with([](TrainerOptions& o, int) { o.nonfinite = NonFinite::kSkip; });
  for (const auto& e : skip) CHECK(message_of(e).find("and NonFinite::kSkip needs") != std::string::npos);
  const auto one_rank = with([](TrainerOptions& o, int rank) { o.defer_gather = rank == 1; });
  for (const auto& e : one_rank)
    CHECK(message_of(e).find("rank 1 was given another defer_gather (1 against 0)") != std::string::npos);
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));  // no rank waited for a timeout
}
