// Tests of ncclkit/trainer/data_parallel.hpp over the Gloo backend in real processes, on the
// digits classifier of examples/digits (real data): N processes with a global batch B reach the
// parameters of one process with batch B (N = 2, 4), also with defer_gather; the example trains
// past 95% test accuracy on four processes with a loss that falls epoch after epoch; a resume
// from a mid-epoch checkpoint continues the uninterrupted run bit for bit, and at another world
// size trains on with the samples not seen yet; a rank given fewer samples makes every rank fail
// at once with an error naming the ranks and step counts, not a hang; a rank that dies or hangs
// mid-fit makes the others raise CommError (naming it within seconds, or at their timeout), leaves
// the checkpoints whole, and the restarted job ends as the uninterrupted run bit for bit. Workers
// send their parameters and findings back to the parent as files in a temp folder.
#include <doctest/doctest.h>

#include <unistd.h>  // _exit: the drill's rank dies

#include <algorithm>   // std::sort
#include <array>       // std::array
#include <chrono>      // std::chrono
#include <cmath>       // std::sqrt
#include <cstddef>     // std::size_t
#include <cstdint>     // std::uint64_t
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <span>        // std::span
#include <string>      // std::string
#include <thread>      // std::this_thread: the hung rank waits
#include <vector>      // std::vector

#include "digits/data.hpp"
#include "digits/mlp_cpu.hpp"
#include "ncclkit/trainer/data_parallel.hpp"
#include "support/gloo_testing.hpp"
#include "support/json_value.hpp"
#include "support/temp_dir.hpp"
#include "support/waiting_mlp.hpp"

namespace gloo_trainer_tests {

namespace fs = std::filesystem;
using ncclkit::WorldInfo;
using ncclkit::gloo::Communicator;
using ncclkit::testing::Checker;
using ncclkit::testing::run_gloo;
using ncclkit::trainer::DataParallelTrainer;
using ncclkit::trainer::Decay;
using ncclkit::trainer::DistributedSampler;
using ncclkit::trainer::OptimizerKind;
using ncclkit::trainer::SamplerPosition;
using ncclkit::trainer::TrainerOptions;
using ncclkit_test::TempDir;
using Mlp = digits::MlpCpu<Communicator>;
using Trainer = DataParallelTrainer<Mlp, Communicator>;

// A collective that waits longer than this is a hang: the cases that must not hang finish well
// inside it.
constexpr std::chrono::seconds kGlooTimeout{30};

// The digits split (1438 training, 359 test samples), read in the parent before the workers
// fork, so that they share it.
const std::array<digits::Samples, 2>& gloo_digits() {
  static const std::array<digits::Samples, 2> parts =
      digits::split(digits::read_csv(NCCLKIT_TEST_DIGITS_CSV), 0.2, 1234);
  return parts;
}

// Every parameter of a trainer, tensor after tensor.
template <class Model>
std::vector<float> parameters_of(const DataParallelTrainer<Model, Communicator>& trainer) {
  std::vector<float> out;
  for (std::uint32_t i = 0; i < trainer.values().layout().size(); ++i) {
    const auto t = trainer.values().template span<float>(ncclkit::fusion::Slot{i});
    out.insert(out.end(), t.begin(), t.end());
  }
  return out;
}

void write_floats(const std::string& path, const std::vector<float>& values) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(values.size() * sizeof(float)));
  ncclkit_test::require(static_cast<bool>(out), "cannot write " + path);
}
std::vector<float> read_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  REQUIRE_MESSAGE(in, "a worker wrote no " << path);
  const auto bytes = static_cast<std::size_t>(fs::file_size(path));
  std::vector<float> values(bytes / sizeof(float));
  in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(bytes));
  return values;
}
// The file in which rank `rank` of run `run` reports to the parent, named by `suffix`.
std::string rank_file(const std::string& dir, const std::string& run, int rank, const std::string& suffix) {
  return dir + "/" + run + ".rank" + std::to_string(rank) + suffix;
}
std::string parameters_file(const TempDir& dir, const std::string& run, int rank) {
  return rank_file(dir.path, run, rank, ".f32");
}
// A rank reports the step its trainer started from (a resume's); the parent reads it back.
void write_started(const TempDir& dir, const std::string& run, int rank, std::uint64_t step) {
  std::ofstream(rank_file(dir.path, run, rank, ".started")) << step;
}
std::uint64_t started_at(const TempDir& dir, const std::string& run, int rank) {
  std::uint64_t step = ~std::uint64_t{0};
  std::ifstream(rank_file(dir.path, run, rank, ".started")) >> step;
  return step;
}

// ‖a − b‖ / ‖b‖.
double norm_relative(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - static_cast<double>(b[i]);
    diff += d * d;
    norm += static_cast<double>(b[i]) * static_cast<double>(b[i]);
  }
  return std::sqrt(diff / norm);
}

// Trains `steps` steps of the digits MLP (hidden 32) at `world` processes, each writing its
// parameters to `dir` as run "world<N>" (with defer_gather "deferred<N>", of the model that
// waits for its values); returns rank 0's, having checked that every rank's equal them bit for
// bit.
std::vector<float> train_steps_on_gloo(const TempDir& dir, int world, const TrainerOptions& options, std::size_t steps) {
  const digits::HostData data(gloo_digits()[0]);
  const std::string run = (options.defer_gather ? "deferred" : "world") + std::to_string(world);
  const auto train = [&]<class Model>(Communicator& comm, const WorldInfo& info) {
    Model model(32, 7);
    DataParallelTrainer<Model, Communicator> trainer(comm, model, options);
    DistributedSampler sampler(
        {.dataset_size = data.size(), .global_batch = options.global_batch, .seed = options.seed}, info.rank,
        info.world_size);
    for (std::size_t s = 0; s < steps; ++s) trainer.step(data.batch(sampler.next()));
    write_floats(parameters_file(dir, run, info.rank), parameters_of(trainer));
  };
  const auto result = run_gloo(world,
                               [&](Communicator& comm, const WorldInfo& info, Checker&) {
                                 if (options.defer_gather) {
                                   train.template operator()<ncclkit_test::WaitingMlp<Communicator>>(comm, info);
                                 } else {
                                   train.template operator()<Mlp>(comm, info);
                                 }
                               },
                               {.timeout = kGlooTimeout});
  REQUIRE_MESSAGE(result.ok(), result.describe());
  const std::vector<float> first = read_floats(parameters_file(dir, run, 0));
  for (int rank = 1; rank < world; ++rank) {
    CAPTURE(rank);
    CHECK(read_floats(parameters_file(dir, run, rank)) == first);
  }
  return first;
}

// The JSON lines of a metrics file, of kind `kind` ("train" or "eval").
std::vector<ncclkit_test::JsonValue> metrics_lines(const std::string& path, const std::string& kind) {
  std::ifstream in(path);
  REQUIRE_MESSAGE(in, "rank 0 wrote no metrics file " << path);
  std::vector<ncclkit_test::JsonValue> lines;
  for (std::string line; std::getline(in, line);) {
    ncclkit_test::JsonValue value = ncclkit_test::parse_json(line);
    if (value["kind"].string == kind) lines.push_back(std::move(value));
  }
  return lines;
}

}  // namespace gloo_trainer_tests

using namespace gloo_trainer_tests;

TEST_CASE("over Gloo, N processes with a global batch B reach the parameters of one process with batch B") {
  gloo_digits();
  TempDir dir("gloo-trainer-same");
  // Small buckets: several, reduced while backward goes on.
  const TrainerOptions options{.global_batch = 48,
                               .bucket_bytes = 4096,
                               .optimizer = {.weight_decay = 1e-4, .momentum = 0.9},
                               .schedule = {.lr = 0.1, .warmup_steps = 2},
                               .seed = 5,
                               .log_interval = 0,
                               .print_progress = false};
  constexpr std::size_t kSteps = 8;
  const std::vector<float> one = train_steps_on_gloo(dir, 1, options, kSteps);
  for (int world : {2, 4}) {
    CAPTURE(world);
    const std::vector<float> many = train_steps_on_gloo(dir, world, options, kSteps);
    CHECK(norm_relative(many, one) <= 1e-6);
    CHECK(many != one);  // the reductions do run on Gloo: sums in another order round differently
    // Each bucket as a reduce-scatter, then an all-gather and its update on the comm queue,
    // which the next forward waits for: the same training.
    TrainerOptions deferred = options;
    deferred.defer_gather = true;
    CHECK(norm_relative(train_steps_on_gloo(dir, world, deferred, kSteps), many) <= 1e-6);
  }
}

TEST_CASE("the digits example trains past 95% test accuracy on four Gloo processes, its loss falling epoch by epoch") {
  gloo_digits();
  TempDir dir("gloo-trainer-digits");
  const digits::HostData train(gloo_digits()[0]);
  const digits::HostData test(gloo_digits()[1]);
  constexpr std::size_t kEpochs = 8;
  const std::size_t steps_per_epoch = train.size() / 64;
  const std::string metrics = dir.path + "/metrics.jsonl";
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_gloo(
      4,
      [&](Communicator& comm, const WorldInfo&, Checker& check) {
        Mlp model(128, 1);
        Trainer trainer(comm, model,
                        {.global_batch = 64,
                         .optimizer = {.momentum = 0.9},
                         .schedule = {.lr = 0.1,
                                      .decay = Decay::kCosine,
                                      .warmup_steps = 10,
                                      .total_steps = kEpochs * steps_per_epoch},
                         .seed = 2,
                         .log_interval = steps_per_epoch,
                         .print_progress = false,
                         .metrics_file = metrics});
        const auto report = trainer.fit(train, kEpochs, &test);
        check.expect(report.steps == kEpochs * steps_per_epoch, "steps: " + std::to_string(report.steps));
        check.expect(report.validation.samples == static_cast<double>(test.size()),
                     "every test sample counted once: " + std::to_string(report.validation.samples));
        check.expect(report.validation.accuracy() >= 0.95,
                     "test accuracy " + std::to_string(report.validation.accuracy()) + " < 0.95");
      },
      {.timeout = kGlooTimeout});
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  REQUIRE_MESSAGE(result.ok(), result.describe());
  const auto trained = metrics_lines(metrics, "train");
  const auto evaluated = metrics_lines(metrics, "eval");
  REQUIRE(trained.size() == kEpochs);
  REQUIRE(evaluated.size() == kEpochs);
  std::string curve;
  for (std::size_t e = 0; e < kEpochs; ++e) {
    curve += "epoch " + std::to_string(e) + ": train loss " + std::to_string(trained[e]["loss"].number) +
             ", test loss " + std::to_string(evaluated[e]["loss"].number) + ", test accuracy " +
             std::to_string(evaluated[e]["accuracy"].number) + "\n";
  }
  curve += "in " + std::to_string(seconds) + " s";
  CAPTURE(curve);
  for (std::size_t e = 0; e < kEpochs; ++e) {
    CHECK(trained[e]["epoch"].number == static_cast<double>(e));
    CHECK(trained[e]["samples"].number == static_cast<double>(steps_per_epoch * 64));
    CHECK(evaluated[e]["samples"].number == static_cast<double>(test.size()));
    // Monotone enough to be believed: no epoch's training loss above the one before (2% slack
    // for the flat end of the cosine), and a tenth of the first epoch's at the end.
    if (e > 0) CHECK(trained[e]["loss"].number <= 1.02 * trained[e - 1]["loss"].number);
  }
  CHECK(trained.back()["loss"].number < 0.1 * trained.front()["loss"].number);
  CHECK(evaluated.back()["accuracy"].number >= 0.95);
}

TEST_CASE("over Gloo a resume from a mid-epoch checkpoint equals the uninterrupted run bit for bit; at 4 processes it "
          "trains on") {
  gloo_digits();
  TempDir dir("gloo-trainer-resume");
  const digits::HostData train(gloo_digits()[0]);
  // 22 steps an epoch: the checkpoint of step 30 is 8 steps into epoch 1.
  const TrainerOptions base{.global_batch = 64,
                            .optimizer = {.weight_decay = 1e-4, .momentum = 0.9},
                            .schedule = {.lr = 0.05, .decay = Decay::kCosine, .warmup_steps = 5, .total_steps = 60},
                            .seed = 9,
                            .log_interval = 0,
                            .print_progress = false,
                            .checkpoint_interval = 30,
                            .keep_checkpoints = 5};
  // Trains 2 epochs at `world` processes from the checkpoints in `folder`; every rank writes its
  // parameters, and the step it started from, as run `run`.
  const auto run_two_epochs = [&](int world, const std::string& folder, const std::string& run,
                                  std::size_t interval, std::uint64_t init_seed) {
    const auto result = run_gloo(
        world,
        [&](Communicator& comm, const WorldInfo& info, Checker& check) {
          Mlp model(32, init_seed);
          TrainerOptions o = base;
          o.checkpoint_folder = folder;
          o.checkpoint_interval = interval;
          Trainer trainer(comm, model, o);
          const std::uint64_t started = trainer.steps();
          trainer.fit(train, 2);
          check.expect(trainer.steps() == 44, "44 steps in 2 epochs, not " + std::to_string(trainer.steps()));
          check.expect(trainer.sampler()->position() == SamplerPosition{2, 0}, "the sampler at the start of epoch 2");
          write_floats(parameters_file(dir, run, info.rank), parameters_of(trainer));
          write_started(dir, run, info.rank, started);
        },
        {.timeout = kGlooTimeout});
    REQUIRE_MESSAGE(result.ok(), result.describe());
  };

  run_two_epochs(2, dir.path + "/whole", "whole", 30, 4);
  CHECK(started_at(dir, "whole", 0) == 0);
  const std::vector<float> whole = read_floats(parameters_file(dir, "whole", 0));
  CHECK(read_floats(parameters_file(dir, "whole", 1)) == whole);
  const fs::path checkpoint = fs::path(dir.path) / "whole" / "step-00000030.ckpt";
  REQUIRE(fs::exists(checkpoint));

  // Interrupted at step 30: a folder with that checkpoint alone, and other initial weights,
  // which the checkpoint's must replace.
  fs::create_directories(dir.path + "/cut");
  fs::copy_file(checkpoint, dir.path + "/cut/step-00000030.ckpt");
  run_two_epochs(2, dir.path + "/cut", "cut", 30, 99);
  for (int rank = 0; rank < 2; ++rank) {
    CAPTURE(rank);
    CHECK(started_at(dir, "cut", rank) == 30);
    CHECK(read_floats(parameters_file(dir, "cut", rank)) == whole);
  }

  // At four processes the same checkpoint goes on with the 14 global batches not seen yet: the
  // same samples and sums as the uninterrupted run, added in another order.
  fs::create_directories(dir.path + "/four");
  fs::copy_file(checkpoint, dir.path + "/four/step-00000030.ckpt");
  run_two_epochs(4, dir.path + "/four", "four", 0, 99);
  const std::vector<float> four = read_floats(parameters_file(dir, "four", 0));
  for (int rank = 0; rank < 4; ++rank) {
    CAPTURE(rank);
    CHECK(started_at(dir, "four", rank) == 30);
    CHECK(read_floats(parameters_file(dir, "four", rank)) == four);
  }
  CHECK(norm_relative(four, whole) <= 1e-6);
}

TEST_CASE("over Gloo a rank given fewer samples makes every rank fail at once, naming the ranks and step counts") {
  gloo_digits();
  const digits::Samples& all = gloo_digits()[0];
  digits::Samples fewer;
  fewer.features.assign(all.features.begin(), all.features.begin() + 1000 * static_cast<long>(digits::kPixels));
  fewer.labels.assign(all.labels.begin(), all.labels.begin() + 1000);
  const digits::HostData full(all);
  const digits::HostData shorter(std::move(fewer));
  const auto start = std::chrono::steady_clock::now();
  const auto result = run_gloo(
      4,
      [&](Communicator& comm, const WorldInfo& info, Checker& check) {
        Mlp model(32, 1);
        Trainer trainer(comm, model, {.global_batch = 64, .schedule = {.lr = 0.1}, .print_progress = false});
        const auto fit_start = std::chrono::steady_clock::now();
        try {
          trainer.fit(info.rank == 3 ? shorter : full, 1);
          check.expect(false, "fit ran with rank 3 given 1000 samples and the others 1438");
        } catch (const ncclkit::ConfigError& e) {
          const std::string message = e.what();
          check.expect(message.find("rank 3 starts epoch 0 at sample 0 with 15 steps over 1000 samples, rank 0 epoch 0 "
                                    "at sample 0 with 22 steps over 1438 samples") != std::string::npos,
                       "the message names the ranks and step counts: " + message);
          const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - fit_start).count();
          check.expect(seconds < 5, "failed after " + std::to_string(seconds) + " s");
        }
      },
      {.timeout = kGlooTimeout});
  CHECK_MESSAGE(result.ok(), result.describe());
  CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(15));  // far inside the 30 s timeout
}

namespace gloo_trainer_tests {

enum class Failure { kDies, kHangs };

// steady_clock's time in nanoseconds: the same clock in every process of the machine.
std::int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A model that fails at the start of its `fail_at`-th forward_backward (0-based, so after
// `fail_at` whole steps without accumulation) on rank `victim`: it writes the time (steady_clock,
// which every process of the machine shares) to `time_file`, then exits (kDies), or stops calling
// anything until every other rank has written its ".heard" file of run `run` in `dir` (kHangs, at
// most 60 s) and exits then. The exit status is 0, so that spawn lets the other ranks run on and
// show what they do about it.
template <class Base>
struct FailsAt : Base {
  using Base::Base;
  int rank = -1;
  int victim = -1;
  int world = 0;
  Failure failure = Failure::kDies;
  std::size_t fail_at = 0;
  std::string time_file;
  std::string dir;
  std::string run;
  std::size_t calls = 0;
  void forward_backward(const typename Base::Batch& batch, ncclkit::trainer::StepContext<Communicator>& step) {
    if (rank == victim && calls == fail_at) {
      std::ofstream(time_file) << now_ns();
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      const auto all_heard = [&] {
        for (int r = 0; r < world; ++r)
          if (r != victim && !fs::exists(rank_file(dir, run, r, ".heard"))) return false;
        return true;
      };
      while (failure == Failure::kHangs && !all_heard() && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      ::_exit(0);
    }
    ++calls;
    Base::forward_backward(batch, step);
  }
};

}  // namespace gloo_trainer_tests

TEST_CASE("over Gloo a rank that dies or hangs mid-fit: the others raise CommError naming it or the timeout, the "
          "checkpoints stay whole, and the restarted job ends as the uninterrupted run bit for bit") {
  gloo_digits();
  TempDir dir("gloo-trainer-drill");
  const digits::HostData train(gloo_digits()[0]);
  constexpr int kWorld = 4;
  constexpr int kVictim = 3;
  constexpr std::size_t kFailAt = 25;  // 5 steps after the checkpoint of step 20
  // The communicators' timeout in the hang drill: what the others wait before they give up. It
  // also bounds the communicators' set-up and every step before the hang, which must fit in it
  // on 2 loaded cores under ASan.
  constexpr std::chrono::seconds kHangTimeout{4};
  for (const bool deferred : {false, true}) {
    CAPTURE(deferred);
    const std::string tag = deferred ? "deferred" : "plain";
    const TrainerOptions options{.global_batch = 64,
                                 .bucket_bytes = 4096,  // several buckets in flight when the peer fails
                                 .optimizer = {.momentum = 0.9},
                                 .schedule = {.lr = 0.05, .warmup_steps = 5},
                                 .defer_gather = deferred,
                                 .seed = 3,
                                 .log_interval = 0,
                                 .print_progress = false,
                                 .checkpoint_interval = 10,
                                 .keep_checkpoints = 5};
    // Trains 2 epochs (44 steps) from the checkpoints in `folder`, `victim` failing as FailsAt
    // says (-1: nobody fails); every rank that finishes writes its parameters and the step it
    // started from as run `run`, and every other rank writes how long it took to hear of the
    // failure.
    const auto attempt = [&]<class Model>(const std::string& folder, const std::string& run, int victim,
                                          Failure failure) {
      const auto timeout = victim >= 0 && failure == Failure::kHangs ? kHangTimeout : kGlooTimeout;
      return run_gloo(
          kWorld,
          [&](Communicator& comm, const WorldInfo& info, Checker& check) {
            FailsAt<Model> model(32, 7);
            model.rank = info.rank;
            model.victim = victim;
            model.world = info.world_size;
            model.failure = failure;
            model.fail_at = kFailAt;
            model.time_file = dir.path + "/" + run + ".failed";
            model.dir = dir.path;
            model.run = run;
            TrainerOptions o = options;
            o.checkpoint_folder = folder;
            DataParallelTrainer<FailsAt<Model>, Communicator> trainer(comm, model, o);
            const std::uint64_t started = trainer.steps();
            try {
              trainer.fit(train, 2);
            } catch (const ncclkit::CommError& e) {
              const std::int64_t heard = now_ns();
              const std::string message = e.what();
              std::int64_t failed = 0;
              std::ifstream(model.time_file) >> failed;
              check.expect(failed != 0, "CommError, but rank " + std::to_string(victim) + " did not fail: " + message);
              const double seconds = static_cast<double>(heard - failed) / 1e9;
              const std::string after = "heard after " + std::to_string(seconds) + " s: " + message;
              if (failure == Failure::kDies) {
                check.expect(seconds < 5, after);
                check.expect(message.find("connection to rank " + std::to_string(victim)) != std::string::npos,
                             "the message does not name rank " + std::to_string(victim) + ": " + message);
              } else {
                const double limit = std::chrono::duration<double>(timeout).count();
                check.expect(seconds > limit - 0.5 && seconds < limit + 5, after);
                // The first rank to give up closes its connections: one a little behind it may hear
                // of that before its own deadline, and name that rank instead.
                const bool timed_out = message.find("Timed out") != std::string::npos;
                check.expect(timed_out || message.find("connection to rank") != std::string::npos,
                             "neither a timeout nor a broken connection: " + message);
                if (timed_out) std::ofstream(rank_file(dir.path, run, info.rank, ".timed_out"));
              }
              // With defer_gather a step returns with its second half still on the comm queue: a
              // failure there (the hang's timeout comes late) is met by the next step's need.
              const bool stopped_right =
                  trainer.steps() == kFailAt || (deferred && trainer.steps() == kFailAt + 1);
              check.expect(stopped_right, "stopped at step " + std::to_string(trainer.steps()));
              std::ofstream(rank_file(dir.path, run, info.rank, ".heard")) << seconds;
              return;  // the trainer and the communicator go out of scope with the peer gone
            }
            check.expect(victim < 0, "fit finished although rank " + std::to_string(victim) + " failed");
            check.expect(trainer.steps() == 44, "44 steps in 2 epochs, not " + std::to_string(trainer.steps()));
            write_floats(parameters_file(dir, run, info.rank), parameters_of(trainer));
            write_started(dir, run, info.rank, started);
          },
          {.timeout = timeout});
    };
    const auto run_attempt = [&](const std::string& folder, const std::string& run, int victim, Failure failure) {
      if (deferred)
        return attempt.template operator()<ncclkit_test::WaitingMlp<Communicator>>(folder, run, victim, failure);
      return attempt.template operator()<Mlp>(folder, run, victim, failure);
    };

    const auto whole_result = run_attempt(dir.path + "/" + tag + "-whole", tag + "-whole", -1, Failure::kDies);
    REQUIRE_MESSAGE(whole_result.ok(), whole_result.describe());
    const std::vector<float> whole = read_floats(parameters_file(dir, tag + "-whole", 0));

    for (const Failure failure : {Failure::kDies, Failure::kHangs}) {
      const std::string run = tag + (failure == Failure::kDies ? "-dies" : "-hangs");
      CAPTURE(run);
      // run_gloo's own limit (120 s) is far away: the check of the time taken is what catches a rank
      // that waited for the hung one beyond its timeout (until the hung rank's 60 s are up).
      const auto start = std::chrono::steady_clock::now();
      const std::string folder = dir.path + "/" + run;
      const auto drill = run_attempt(folder, run, kVictim, failure);
      CHECK_MESSAGE(drill.ok(), drill.describe());
      CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(40));
      for (int rank = 0; rank < kWorld; ++rank) {
        if (rank == kVictim) continue;
        CAPTURE(rank);
        CHECK(fs::exists(rank_file(dir.path, run, rank, ".heard")));
      }
      if (failure == Failure::kHangs) {
        int timed_out = 0;
        for (int rank = 0; rank < kWorld; ++rank)
          timed_out += fs::exists(rank_file(dir.path, run, rank, ".timed_out")) ? 1 : 0;
        CHECK_MESSAGE(timed_out >= 1, "no rank said that it timed out");
      }
      // Rank 0 wrote steps 10 and 20, whole, and nothing after the failure.
      std::vector<std::string> files;
      for (const auto& entry : fs::directory_iterator(folder)) files.push_back(entry.path().filename().string());
      std::sort(files.begin(), files.end());
      CHECK(files == std::vector<std::string>{"step-00000010.ckpt", "step-00000020.ckpt"});

      // The restart, as a launcher's --max-restarts would do it: the same job from the same folder
      // (after the death only: the hang left the same checkpoints).
      if (failure == Failure::kHangs) continue;
      const auto restart = run_attempt(folder, run + "-restart", -1, failure);
      REQUIRE_MESSAGE(restart.ok(), restart.describe());
      for (int rank = 0; rank < kWorld; ++rank) {
        CAPTURE(rank);
        CHECK(started_at(dir, run + "-restart", rank) == 20);
        CHECK(read_floats(parameters_file(dir, run + "-restart", rank)) == whole);
      }
    }
  }
}
