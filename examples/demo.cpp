// ncclkit's demo: trains a classifier of handwritten digits (the 8x8 digits set, an MLP
// 64-128-10) data-parallel with N processes, and prints the progress and the test accuracy.
//
//   demo [--nprocs N] [--backend gloo|nccl] [--epochs E] [--codec none|fp16|bf16]
//        [--checkpoints DIR] [--metrics FILE] [--data PATH] [--init-url URL]
//
// Run directly, it forks N workers that rendezvous through a private FileStore. Run under a
// launcher (RANK and WORLD_SIZE set: ncclkit-run, torchrun, srun), it is one of the workers.
// --backend gloo trains on CPUs (plain loops); --backend nccl (a build with CUDA and NCCL:
// the target demo_gpu) trains on one GPU per worker. --checkpoints DIR: rank 0 writes a
// checkpoint there after every epoch, and a run started with the same DIR (a launcher's restart,
// or by hand) goes on from the newest. Exit status 0 when the test accuracy reaches 95%.
#include <cstdio>
#include <string>
#include <string_view>

#include <ncclkit/gloo.hpp>
#include <ncclkit/trainer.hpp>

#include "digits/data.hpp"
#include "digits/mlp_cpu.hpp"
#include "digits/train.hpp"

#if NCCLKIT_DEMO_WITH_NCCL
namespace digits {
// digits/demo_nccl.cu: the same training with one GPU per worker.
double train_on_gpus(const ncclkit::WorldInfo& world, const Samples& train, const Samples& test, const RunOptions& run);
}  // namespace digits
#endif

namespace {

struct Arguments {
  int nprocs = 4;
  std::string backend = "gloo";
  std::string data = NCCLKIT_DIGITS_CSV;
  std::string init_url;
  digits::RunOptions run;
};

int worker(const ncclkit::WorldInfo& world, const Arguments& args) {
  const auto [train, test] = digits::split(digits::read_csv(digits::locate(args.data)), 0.2, 1234);
  if (world.rank == 0) {
    std::printf("demo: %zu training and %zu test digits, %d ranks over %s\n", train.size(), test.size(),
                world.world_size, args.backend.c_str());
  }
  double accuracy = 0;
  if (args.backend == "nccl") {
#if NCCLKIT_DEMO_WITH_NCCL
    accuracy = digits::train_on_gpus(world, train, test, args.run);
#endif
  } else {
    ncclkit::gloo::Options options;
    if (world.num_nodes == 1 && !ncclkit::env_string("NCCLKIT_GLOO_HOSTNAME") &&
        !ncclkit::env_string("NCCLKIT_GLOO_SOCKET_IFNAME")) {
      options.hostname = "127.0.0.1";  // all ranks on this host: loopback always works
    }
    auto [me, store, comm] = ncclkit::init<ncclkit::gloo::Communicator>(world, options);
    digits::MlpCpu<ncclkit::gloo::Communicator> model(128, 7);
    const digits::HostData train_data(train), test_data(test);
    accuracy = digits::train(comm, model, train_data, test_data, args.run);
  }
  return accuracy >= 0.95 ? 0 : 3;
}

void usage() {
  std::printf(
      "usage: demo [--nprocs N] [--backend gloo|nccl] [--epochs E] [--codec none|fp16|bf16] [--checkpoints DIR]\n"
      "            [--metrics FILE] [--data PATH] [--init-url URL]\n");
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
#if NCCLKIT_DEMO_WITH_NCCL
  args.backend = "nccl";
#endif
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      const auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw ncclkit::ConfigError("demo: " + std::string(arg) + " needs a value");
        return argv[++i];
      };
      const auto number = [&](long low, long high) {
        const std::string text = value();
        const auto n = ncclkit::parse_int(text);
        if (!n || *n < low || *n > high) {
          throw ncclkit::ConfigError("demo: " + std::string(arg) + " wants a number from " + std::to_string(low) +
                                     " to " + std::to_string(high) + ", not '" + text + "'");
        }
        return *n;
      };
      if (arg == "--nprocs") {
        args.nprocs = static_cast<int>(number(1, 1024));
      } else if (arg == "--backend") {
        args.backend = value();
        if (args.backend != "gloo" && args.backend != "nccl") {
          throw ncclkit::ConfigError("demo: --backend is gloo or nccl, not '" + args.backend + "'");
        }
#if !NCCLKIT_DEMO_WITH_NCCL
        if (args.backend == "nccl") {
          throw ncclkit::ConfigError("demo: this build has no NCCL backend; build the target demo_gpu (CUDA and NCCL)");
        }
#endif
      } else if (arg == "--epochs") {
        args.run.epochs = static_cast<std::size_t>(number(1, 100000));
      } else if (arg == "--codec") {
        args.run.codec = ncclkit::compression::codec_named(value());
      } else if (arg == "--checkpoints") {
        args.run.checkpoints = value();
      } else if (arg == "--metrics") {
        args.run.metrics_file = value();
      } else if (arg == "--data") {
        args.data = value();
      } else if (arg == "--init-url") {
        args.init_url = value();
      } else {
        usage();
        return arg == "--help" || arg == "-h" ? 0 : 2;
      }
    }
    const auto run_worker = [&](const ncclkit::WorldInfo& world) { return worker(world, args); };
    if (ncclkit::env_string("RANK") || ncclkit::env_string("OMPI_COMM_WORLD_RANK") ||
        ncclkit::env_string("SLURM_PROCID")) {
      auto world = ncclkit::detect_world();
      if (!args.init_url.empty()) world.init_url = args.init_url;
      return run_worker(world);
    }
    std::printf("demo: training on %d local processes\n", args.nprocs);
    const auto result = ncclkit::spawn(args.nprocs, run_worker);
    std::printf("demo: %s\n", result.ok() ? "done, test accuracy of 95% or more" : result.describe().c_str());
    return result.ok() ? 0 : 1;
  } catch (const ncclkit::Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
