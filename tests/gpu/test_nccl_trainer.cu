// The data-parallel trainer over NCCL, with the digits classifier of examples/digits in CUDA
// kernels (mlp_gpu.cuh: deterministic sums, no TF32): N GPUs with a global batch B reach the
// parameters of one GPU with batch B; with fp16 gradients within the codec's tolerance; fit
// reaches 95% test accuracy on the GPUs; per-bucket updates land after their bucket (the
// parameters equal the host model's after the same steps).
// ncclkit-test: labels=nccl timeout=300
#include <doctest/doctest.h>

#include <cmath>       // std::sqrt
#include <cstdio>      // std::FILE
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream, std::ifstream
#include <memory>      // std::shared_ptr
#include <string>      // std::string
#include <vector>      // std::vector

#include "digits/data.hpp"
#include "digits/mlp_gpu.cuh"
#include "gpu/nccl_support.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/trainer.hpp"
#include "support/temp_dir.hpp"

namespace trainer_gpu {

using namespace ncclkit_test;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using Mlp = digits::MlpGpu<Communicator>;

const std::array<digits::Samples, 2>& digits_split() {
  static const std::array<digits::Samples, 2> parts =
      digits::split(digits::read_csv(digits::locate(NCCLKIT_TEST_DIGITS_CSV)), 0.2, 1234);
  return parts;
}

// Trains `steps` steps of the digits MLP on `world` GPUs; rank 0 writes its parameters to `out`.
void train_steps(int world, ncclkit::trainer::TrainerOptions options, std::size_t steps, const std::string& out) {
  options.print_progress = false;
  run_workers(world, [&](const WorldInfo& me, const std::shared_ptr<Store>& store) {
    Communicator comm(store, me, ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "trainer"});
    Mlp model(32, 7);
    ncclkit::trainer::DataParallelTrainer<Mlp, Communicator> trainer(comm, model, options);
    const digits::DeviceData data(digits_split()[0], comm.device());
    ncclkit::trainer::DistributedSampler sampler(
        {.dataset_size = data.size(), .global_batch = options.global_batch, .seed = options.seed}, me.rank, me.world_size);
    for (std::size_t s = 0; s < steps; ++s) {
      const auto mine = sampler.next();
      trainer.step(data.batch(mine));
    }
    comm.synchronize();
    std::vector<float> host;
    for (std::uint32_t i = 0; i < trainer.values().layout().size(); ++i) {
      const auto view = trainer.values().view(ncclkit::fusion::Slot{i});
      std::vector<float> t(view.count);
      comm.copy_to_host(t.data(), view.data, view.bytes());
      comm.synchronize();
      host.insert(host.end(), t.begin(), t.end());
    }
    if (me.rank == 0) {
      std::ofstream file(out, std::ios::binary);
      file.write(reinterpret_cast<const char*>(host.data()), static_cast<std::streamsize>(host.size() * 4));
    }
    return 0;
  });
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  std::vector<float> v;
  float x;
  while (file.read(reinterpret_cast<char*>(&x), 4)) v.push_back(x);
  return v;
}

double relative_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, norm = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - double(b[i])) * (double(a[i]) - double(b[i]));
    norm += double(b[i]) * double(b[i]);
  }
  return std::sqrt(diff / norm);
}

}  // namespace trainer_gpu

using namespace trainer_gpu;

TEST_CASE("N GPUs with a global batch B reach the parameters of one GPU with batch B; fp16 gradients within 1e-3") {
  if (!have_gpus(2, "the trainer's N-against-one check")) return;
  TempDir dir("trainer-gpu");
  const ncclkit::trainer::TrainerOptions options{.global_batch = 64,
                                                 .optimizer = {.weight_decay = 1e-4, .momentum = 0.9},
                                                 .schedule = {.lr = 0.1, .warmup_steps = 2},
                                                 .seed = 3};
  train_steps(1, options, 8, dir.path + "/one");
  const auto one = read_floats(dir.path + "/one");
  REQUIRE(one.size() == 32 * 64 + 32 + 10 * 32 + 10);
  for (int world : world_sizes()) {
    if (world == 1) continue;
    CAPTURE(world);
    train_steps(world, options, 8, dir.path + "/many");
    CHECK(relative_difference(read_floats(dir.path + "/many"), one) <= 1e-5);
    auto fp16 = options;
    fp16.codec = ncclkit::compression::Codec::kFloat16;
    train_steps(world, fp16, 8, dir.path + "/fp16");
    const double error = relative_difference(read_floats(dir.path + "/fp16"), one);
    MESSAGE("fp16 gradients at " << world << " GPUs: parameters " << error << " from one GPU's after 8 steps");
    CHECK(error <= 1e-3);
  }
}

TEST_CASE("fit trains the digits classifier to 95% test accuracy on the GPUs, fp32 and bf16 gradients") {
  for (int world : world_sizes()) {
    if (world == 1) continue;
    for (const auto codec : {ncclkit::compression::Codec::kNone, ncclkit::compression::Codec::kBFloat16}) {
      CAPTURE(world);
      run_workers(world, [&](const WorldInfo& me, const std::shared_ptr<Store>& store) {
        Checker checker(me.rank);
        Communicator comm(store, me, ncclkit::nccl::Options{.timeout = std::chrono::seconds(60), .name = "fit"});
        Mlp model(128, 7);
        const std::size_t epochs = 20;
        const std::size_t steps = epochs * (digits_split()[0].size() / 64);
        ncclkit::trainer::DataParallelTrainer<Mlp, Communicator> trainer(
            comm, model,
            {.global_batch = 64,
             .codec = codec,
             .optimizer = {.weight_decay = 1e-4, .momentum = 0.9, .nesterov = true},
             .schedule = {.lr = 0.1, .decay = ncclkit::trainer::Decay::kCosine, .warmup_steps = 20, .total_steps = steps},
             .seed = 42,
             .print_progress = me.rank == 0});
        const digits::DeviceData train(digits_split()[0], comm.device()), test(digits_split()[1], comm.device());
        const auto report = trainer.fit(train, epochs, &test);
        checker.expect(report.validation.accuracy() >= 0.95,
                       "test accuracy " + std::to_string(report.validation.accuracy()));
        if (me.rank == 0) {
          std::printf("fit on %d GPUs, %s gradients: test accuracy %.2f%% in %.2f s\n", me.world_size,
                      std::string(ncclkit::compression::name_of(codec)).c_str(), 100 * report.validation.accuracy(),
                      report.seconds);
        }
        return checker.finish("fit");
      });
    }
  }
}
