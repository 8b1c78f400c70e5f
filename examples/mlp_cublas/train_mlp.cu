// train_mlp: the cuBLAS MLP (mlp_cublas.cuh) trained data-parallel on synthetic regression data,
// one process per GPU, timed: the step of DataParallelTrainer, and the same gradients' reduction
// alone, per configuration (batch per GPU × gradient codec).
//
//   train_mlp [--nprocs N] [--depth 8] [--width 4096] [--input W] [--output W] [--batch 64[,256...]]
//             [--steps 50] [--warmup 10] [--optimizer sgd|adamw] [--lr 0.01] [--codec none[,fp16,bf16]]
//             [--bucket-mb 25|whole | --tune] [--min-bucket-kb 0] [--accumulation 1] [--precision tf32|fp32|bf16]
//             [--reduce-repeats 20] [--comm-priority P] [--max-ctas N] [--reduce-blocks N] [--cublas-sms N]
//             [--add-gradients] [--separate-update] [--defer-gather] [--label NAME]
//             [--csv PATH] [--init-url URL]
//
// Run directly, it forks N workers (one GPU each) that rendezvous through a private FileStore;
// under a launcher (RANK and WORLD_SIZE set: ncclkit-run, torchrun, srun) it is one of the
// workers. --nprocs 1 gives the one-GPU step (the same trainer at world 1).
//
// --batch is per GPU and micro-batch: a step takes batch × accumulation samples on each GPU, the
// global batch is that times the GPUs. Per configuration, rank 0 prints one line and appends a
// CSV row (header first when the file is new; impl is "ncclkit", or "ncclkit/NAME" with --label):
//   impl,gpus,batch,codec,step_ms,samples_per_s,reduce_ms,step_mean_ms,depth,width,accumulation,optimizer,bucket
// step_ms: the median over the timed steps of CUDA-event times on the compute stream (a step
// issued back to back after the one before; its end is the optimizer's last update); reduce_ms:
// the median of --reduce-repeats reductions of a copy of the step's gradients with the same plan
// and codec and no backward (every tensor marked ready at once, then finish): what the step
// would add if nothing overlapped. Share of communication hidden at N GPUs:
// 1 − (step_N − step_1) / reduce_N (scripts/mlp_table.py).
//
// The overlap levers, each a flag so that an ablation turns one off or on at a time:
//   --bucket-mb whole   one bucket for all gradients after a 1 MiB first one: backward, then one
//                       flat all-reduce (no overlap), the baseline overlap must beat
//   --min-bucket-kb KB  a bucket under KB takes in the next tensor past the cap
//                       (TrainerOptions::min_bucket_bytes): each bias shares its weight's bucket
//   --comm-priority P   the comm stream's priority (nccl::Options::stream_priority; CUDA's range
//                       is [-5, 0] on H100/H200, lower runs first; default: the highest)
//   --max-ctas N        NCCL's CTA limit (nccl::Options::max_ctas): SMs left to backward
//   --reduce-blocks N   blocks of the fused 16-bit reduction (nccl::Options::compressed_reduce_blocks;
//                       default: 3 per 2 SMs; 0: one per SM, the communicator's default)
//   --add-gradients     the trainer zeroes the gradients and every GEMM adds to them (beta 1),
//                       instead of the first micro-batch's GEMMs writing them (beta 0)
//   --cublas-sms N      cublasSetSmCountTarget: SMs cuBLAS plans its GEMMs for (0: all)
//   --separate-update   the optimizer's own pass over each bucket after it lands, instead of the
//                       fused 16-bit reduction applying the update (TrainerOptions::fuse_update)
//   --defer-gather      float32 gradients in two halves: a reduce-scatter under backward, the
//                       all-gather and each bucket's update under the next step's forward, which
//                       waits layer by layer (TrainerOptions::defer_gather; --codec none only)
#include <cuda_runtime.h>

#include <algorithm>     // std::sort, std::min, std::max
#include <cmath>         // std::isfinite
#include <cstdio>        // std::printf, std::FILE
#include <cstdlib>       // std::strtod
#include <exception>     // std::exception
#include <filesystem>    // std::filesystem::file_size
#include <numeric>       // std::accumulate
#include <optional>      // std::optional
#include <span>          // std::span
#include <string>        // std::string
#include <string_view>   // std::string_view
#include <system_error>  // std::error_code
#include <vector>        // std::vector

#include <ncclkit/compression.hpp>
#include <ncclkit/nccl.hpp>
#include <ncclkit/trainer.hpp>

#include "mlp_cublas/mlp_cublas.cuh"
#include "mlp_cublas/synthetic_data.cuh"

namespace {

using ncclkit::nccl::Communicator;
using Model = mlp_cublas::MlpCublas<Communicator>;
/// The same model without overwrites_gradients (--add-gradients): the trainer zeroes the
/// gradients before each step and every GEMM adds to them, for the ablation.
struct AddingModel : Model {
  using Model::Model;
  static constexpr bool overwrites_gradients = false;
};
static_assert(ncclkit::trainer::OverwritesGradients<Model> && !AddingModel::overwrites_gradients &&
              !ncclkit::trainer::OverwritesGradients<AddingModel>);
template <class M>
using TrainerOf = ncclkit::trainer::DataParallelTrainer<M, Communicator>;

struct Arguments {
  int nprocs = 1;
  mlp_cublas::MlpOptions model;
  bool input_given = false, output_given = false;
  std::vector<std::size_t> batches{64};
  std::size_t steps = 50;
  std::size_t warmup = 10;
  ncclkit::trainer::OptimizerKind optimizer = ncclkit::trainer::OptimizerKind::kSgd;
  double lr = 0.01;
  std::vector<ncclkit::compression::Codec> codecs{ncclkit::compression::Codec::kNone};
  std::size_t bucket_mb = 25;
  std::size_t min_bucket_kb = 0;
  bool whole = false;  // --bucket-mb whole
  bool tune = false;
  std::optional<int> comm_priority;
  int max_ctas = -1;
  std::optional<int> reduce_blocks;
  bool add_gradients = false;
  bool defer_gather = false;
  bool separate_update = false;
  std::string label;
  std::size_t accumulation = 1;
  std::size_t reduce_repeats = 20;
  std::string csv;
  std::string init_url;
};

/// Tuning ends after a fixed number of steps (fusion/tuning.hpp); this many more is a bug.
constexpr std::size_t kMostTuningSteps = 500;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0 : n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}
double mean(const std::vector<double>& v) {
  return v.empty() ? 0 : std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

/// The loss of `batch` under the current parameters, evaluated on `stream` (host wait).
template <class M>
double loss_of(Communicator& comm, M& model, const mlp_cublas::Batch& batch, cudaStream_t stream) {
  ncclkit::nccl::DeviceBuffer<double> metrics(ncclkit::trainer::kMetricWords, comm.device());
  comm.fill_zero(metrics.view(), stream);
  ncclkit::trainer::EvalContext<Communicator> eval(stream, metrics.data());
  model.evaluate(batch, eval);
  double host[ncclkit::trainer::kMetricWords] = {};
  comm.copy_to_host(host, metrics.data(), sizeof host, stream);
  comm.synchronize(stream);
  return host[2] > 0 ? host[0] / host[2] : 0;
}

/// Milliseconds per reduction of a copy of the trainer's gradients, with its plan and codec and
/// no backward, the median of `repeats` (after 3 untimed).
template <class Trainer>
double reduce_alone_ms(Communicator& comm, const Trainer& trainer, ncclkit::compression::Codec codec,
                       std::size_t repeats, cudaStream_t stream) {
  const ncclkit::fusion::FusedBuffer<Communicator>& gradients = trainer.gradients();
  ncclkit::fusion::FusedBuffer<Communicator> copy(comm, gradients.layout());
  // A real step's gradients: their magnitudes are what a 16-bit codec meets in training.
  for (ncclkit::DataType type : gradients.layout().element_types()) {
    comm.copy(copy.all(type).data, gradients.all(type).data, gradients.all(type).bytes(), stream);
  }
  ncclkit::fusion::GradientSync<Communicator>::Options options{.op = ncclkit::ReduceOp::kAvg};
  if (codec != ncclkit::compression::Codec::kNone) options.reducer = ncclkit::compression::compressed({.codec = codec});
  ncclkit::fusion::GradientSync<Communicator> sync(copy, trainer.sync().plan(), std::move(options));
  const auto once = [&] {
    for (std::uint32_t i = 0; i < copy.layout().size(); ++i) sync.mark_ready(ncclkit::fusion::Slot{i}, stream);
    sync.finish(stream);
  };
  for (int i = 0; i < 3; ++i) once();
  std::vector<Communicator::Event> starts, stops;
  for (std::size_t i = 0; i < repeats; ++i) {
    starts.push_back(comm.create_timing_event());
    stops.push_back(comm.create_timing_event());
  }
  comm.synchronize(stream);
  for (std::size_t i = 0; i < repeats; ++i) {
    comm.record(starts[i], stream);
    once();
    comm.record(stops[i], stream);
  }
  std::vector<double> ms;
  for (std::size_t i = 0; i < repeats; ++i) ms.push_back(comm.elapsed_ms(starts[i], stops[i]));
  comm.synchronize(stream);
  return median(ms);
}

template <class Trainer>
std::string bucket_text(const Arguments& args, const Trainer& trainer) {
  if (args.whole) return "whole buffer";
  if (!args.tune) return std::to_string(args.bucket_mb) + " MiB";
  const auto& tuning = trainer.sync().tuning();
  if (!tuning.done()) return "tuning";
  const auto& caps = tuning.candidates[*tuning.chosen].caps;
  return caps.bucket_bytes == ncclkit::fusion::kWholeBuffer ? std::string("tuned: whole buffer")
                                                            : "tuned: " + ncclkit::format_bytes(caps.bucket_bytes);
}

template <class M>
void run_configuration(Communicator& comm, M& model, cudaStream_t stream, const Arguments& args, std::size_t batch,
                       ncclkit::compression::Codec codec) {
  const int world = comm.size(), rank = comm.rank();
  const std::size_t per_rank = batch * args.accumulation;
  const std::size_t global = per_rank * static_cast<std::size_t>(world);
  TrainerOf<M> trainer(comm, model,
                       {.global_batch = global,
                        .accumulation = args.accumulation,
                        .codec = codec,
                        .bucket_bytes = args.tune    ? 0
                                        : args.whole ? ncclkit::fusion::kWholeBuffer
                                                     : args.bucket_mb << 20,
                        .min_bucket_bytes = args.min_bucket_kb << 10,
                        .optimizer = {.kind = args.optimizer},
                        .schedule = {.lr = args.lr},
                        .fuse_update = !args.separate_update,
                        .defer_gather = args.defer_gather,
                        .seed = 42,
                        .log_interval = 0,
                        .print_progress = false});
  // One step's samples: this rank's micro-batches, made once (the timing is of training, not of
  // data loading).
  const mlp_cublas::SyntheticData data(model.options().input, model.options().output, global, 7, comm.device());
  std::vector<mlp_cublas::Batch> micro;
  for (std::size_t k = 0; k < args.accumulation; ++k) {
    micro.push_back(data.batch(static_cast<std::size_t>(rank) * per_rank + k * batch, batch));
  }
  const std::span<const mlp_cublas::Batch> step_batches(micro);
  const double loss_before = loss_of(comm, model, micro.front(), stream);

  std::size_t warm = 0;
  while (warm < args.warmup || (args.tune && !trainer.sync().tuning().done())) {
    if (warm >= args.warmup + kMostTuningSteps) {
      throw ncclkit::ConfigError("train_mlp: bucket tuning has not ended after " + std::to_string(warm) + " steps");
    }
    trainer.step(step_batches);
    ++warm;
  }
  std::vector<Communicator::Event> starts, stops;
  for (std::size_t i = 0; i < args.steps; ++i) {
    starts.push_back(comm.create_timing_event());
    stops.push_back(comm.create_timing_event());
  }
  comm.synchronize(stream);
  for (std::size_t i = 0; i < args.steps; ++i) {
    comm.record(starts[i], stream);
    trainer.step(step_batches);
    comm.record(stops[i], stream);
  }
  std::vector<double> step_ms;
  for (std::size_t i = 0; i < args.steps; ++i) step_ms.push_back(comm.elapsed_ms(starts[i], stops[i]));
  trainer.settle();  // the model's evaluate below reads the last step's (deferred) updates
  comm.synchronize(stream);
  const double loss_after = loss_of(comm, model, micro.front(), stream);
  const double reduce_ms = reduce_alone_ms(comm, trainer, codec, args.reduce_repeats, stream);

  if (rank != 0) return;
  const double step = median(step_ms);
  const double samples_per_s = step > 0 ? static_cast<double>(global) / (step / 1000.0) : 0;
  const std::string optimizer = args.optimizer == ncclkit::trainer::OptimizerKind::kSgd ? "sgd" : "adamw";
  const std::string codec_name(ncclkit::compression::name_of(codec));
  const std::string bucket = bucket_text(args, trainer);
  // The reducer that ran: a 16-bit codec runs as separate casts where the fused kernel cannot
  // (NCCLKIT_LOG_LEVEL=info says why), at a cost a benchmark must show.
  const std::string reducer = trainer.sync().reducer().name();
  std::printf(
      "train_mlp: %d GPU(s), batch %zu/GPU x %zu, %s gradients (%s), %s, buckets %s: step %.3f ms median "
      "(%.3f mean, %zu steps), %.0f samples/s; reduction alone %.3f ms; loss %.4f -> %.4f\n",
      world, batch, args.accumulation, codec_name.c_str(), reducer.c_str(), optimizer.c_str(), bucket.c_str(), step,
      mean(step_ms), args.steps, samples_per_s, reduce_ms, loss_before, loss_after);
  std::fflush(stdout);
  if (args.csv.empty()) return;
  // main() made the file: the header goes first where it is still empty.
  std::error_code unknown_size;
  const bool fresh = std::filesystem::file_size(args.csv, unknown_size) == 0 && !unknown_size;
  std::FILE* f = std::fopen(args.csv.c_str(), "a");
  if (f == nullptr) throw ncclkit::ConfigError("train_mlp: cannot append to --csv " + args.csv);
  if (fresh) {
    std::fprintf(f, "impl,gpus,batch,codec,step_ms,samples_per_s,reduce_ms,step_mean_ms,depth,width,accumulation,"
                    "optimizer,bucket\n");
  }
  const std::string impl = args.label.empty() ? "ncclkit" : "ncclkit/" + args.label;
  std::fprintf(f, "%s,%d,%zu,%s,%.4f,%.1f,%.4f,%.4f,%zu,%zu,%zu,%s,%s\n", impl.c_str(), world, batch,
               codec_name.c_str(), step, samples_per_s, reduce_ms, mean(step_ms), model.options().depth,
               model.options().width, args.accumulation, optimizer.c_str(), bucket.c_str());
  std::fclose(f);
}

int worker(const ncclkit::WorldInfo& world, const Arguments& args) {
  try {
    int visible = 0;
    NCCLKIT_CUDA_CHECK(cudaGetDeviceCount(&visible));
    if (world.local_world_size > visible) {
      throw ncclkit::ConfigError("train_mlp: " + std::to_string(world.local_world_size) +
                                 " processes on this node need as many GPUs, " + std::to_string(visible) +
                                 " visible; lower --nprocs or show more GPUs (CUDA_VISIBLE_DEVICES)");
    }
    const int device = world.local_rank % visible;
    // The compute stream: a non-blocking one of our own, so that nothing on the legacy default
    // stream orders itself with the step.
    ncclkit::nccl::Stream compute(device);
    ncclkit::nccl::Options options{
        .device = device, .max_ctas = args.max_ctas, .name = "train_mlp", .stream = compute.get()};
    int lowest = 0, highest = 0;
    NCCLKIT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    if (args.comm_priority) options.stream_priority = *args.comm_priority;  // else the GPU's highest
    // The fused 16-bit reduction on three blocks per two SMs unless asked otherwise: beside
    // backward's GEMMs that gives a faster step than one per SM (the communicator's default,
    // tuned for the reduction alone) or two, and the reduction alone is as fast
    // (docs/performance.md, "The fused reduction's blocks").
    int sms = 0;
    NCCLKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
    options.compressed_reduce_blocks = args.reduce_blocks.value_or(3 * sms / 2);
    auto [me, store, comm] = ncclkit::init<Communicator>(world, std::move(options));
    if (me.rank == 0) {
      cudaDeviceProp properties{};
      NCCLKIT_CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
      const auto& m = args.model;
      std::printf(
          "train_mlp: %d rank(s) on %s; MLP %zu -> %zu x %zu -> %zu (%zu layers, %.1f M parameters, "
          "%.0f MB of float32 gradients), %s GEMMs, lr %g; comm stream priority %d (range %d to %d), "
          "NCCL max CTAs %d, fused reduction blocks %d (0: one per SM), cuBLAS SMs %d, gradients %s, update %s%s%s\n",
          me.world_size, properties.name, m.input, m.width, m.depth - 1, m.output, m.depth,
          static_cast<double>(m.parameters()) / 1e6, static_cast<double>(m.parameters()) * 4 / 1e6,
          mlp_cublas::precision_name(m.precision), args.lr, comm.options().stream_priority, lowest, highest,
          comm.options().max_ctas, comm.options().compressed_reduce_blocks, m.cublas_sms,
          args.add_gradients ? "zeroed, then added to" : "written by the first micro-batch",
          args.defer_gather && me.world_size > 1 ? "after the all-gather under the next forward"
          : args.separate_update                 ? "the optimizer's own pass"
                                                 : "fused into the 16-bit reduction where it can",
          args.label.empty() ? "" : ", label ", args.label.c_str());
      std::fflush(stdout);
    }
    const auto run_all = [&](auto& model) {
      for (std::size_t batch : args.batches) {
        for (ncclkit::compression::Codec codec : args.codecs) {
          run_configuration(comm, model, comm.default_stream(), args, batch, codec);
        }
      }
    };
    if (args.add_gradients) {
      AddingModel model(args.model);
      run_all(model);
    } else {
      Model model(args.model);
      run_all(model);
    }
    comm.synchronize();
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_mlp: rank %d: %s\n", world.rank, e.what());
    return 2;
  }
}

void usage(std::FILE* out) {
  std::fprintf(
      out,
      "usage: train_mlp [--nprocs N] [--depth 8] [--width 4096] [--input W] [--output W] [--batch 64[,256...]]\n"
      "                 [--steps 50] [--warmup 10] [--optimizer sgd|adamw] [--lr 0.01] [--codec none[,fp16,bf16]]\n"
      "                 [--bucket-mb 25|whole | --tune] [--min-bucket-kb 0] [--accumulation 1]\n"
      "                 [--precision tf32|fp32|bf16]\n"
      "                 [--reduce-repeats 20] [--comm-priority P] [--max-ctas N] [--reduce-blocks N]\n"
      "                 [--cublas-sms N] [--add-gradients] [--separate-update] [--defer-gather] [--label NAME]\n"
      "                 [--csv PATH]\n"
      "                 [--init-url URL]\n");
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> parts;
  std::size_t begin = 0;
  while (begin <= text.size()) {
    const std::size_t end = std::min(text.find(',', begin), text.size());
    parts.push_back(text.substr(begin, end - begin));
    begin = end + 1;
  }
  return parts;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments args;
  bool bucket_given = false;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string_view arg = argv[i];
      const auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw ncclkit::ConfigError("train_mlp: " + std::string(arg) + " needs a value");
        return argv[++i];
      };
      const auto whole = [&](const std::string& text, long low, long high) {
        const auto n = ncclkit::parse_int(text);
        if (!n || *n < low || *n > high) {
          throw ncclkit::ConfigError("train_mlp: " + std::string(arg) + " wants a number from " +
                                     std::to_string(low) + " to " + std::to_string(high) + ", not '" + text + "'");
        }
        return static_cast<std::size_t>(*n);
      };
      const auto number = [&](long low, long high) { return whole(value(), low, high); };
      if (arg == "--nprocs") {
        args.nprocs = static_cast<int>(number(1, 1024));
      } else if (arg == "--depth") {
        args.model.depth = number(1, 1000);
      } else if (arg == "--width") {
        args.model.width = number(1, 1 << 20);
      } else if (arg == "--input") {
        args.model.input = number(1, 1 << 20);
        args.input_given = true;
      } else if (arg == "--output") {
        args.model.output = number(1, 1 << 20);
        args.output_given = true;
      } else if (arg == "--batch") {
        args.batches.clear();
        for (const std::string& part : split_list(value())) args.batches.push_back(whole(part, 1, 1 << 20));
      } else if (arg == "--steps") {
        args.steps = number(1, 1000000);
      } else if (arg == "--warmup") {
        args.warmup = number(0, 1000000);
      } else if (arg == "--optimizer") {
        const std::string name = value();
        if (name == "sgd") {
          args.optimizer = ncclkit::trainer::OptimizerKind::kSgd;
        } else if (name == "adamw") {
          args.optimizer = ncclkit::trainer::OptimizerKind::kAdamW;
        } else {
          throw ncclkit::ConfigError("train_mlp: --optimizer is sgd or adamw, not '" + name + "'");
        }
      } else if (arg == "--lr") {
        const std::string text = value();
        char* end = nullptr;
        args.lr = std::strtod(text.c_str(), &end);
        if (end == text.c_str() || *end != '\0' || !(args.lr > 0) || !std::isfinite(args.lr)) {
          throw ncclkit::ConfigError("train_mlp: --lr wants a positive number, not '" + text + "'");
        }
      } else if (arg == "--codec") {
        args.codecs.clear();
        for (const std::string& part : split_list(value())) {
          try {
            args.codecs.push_back(ncclkit::compression::codec_named(part));
          } catch (const ncclkit::ConfigError&) {
            throw ncclkit::ConfigError("train_mlp: --codec takes none, fp16 and bf16, comma separated, not '" + part +
                                       "'");
          }
        }
      } else if (arg == "--bucket-mb") {
        const std::string text = value();
        if (text == "whole") {
          args.whole = true;
        } else {
          args.bucket_mb = whole(text, 1, 1 << 20);
        }
        bucket_given = true;
      } else if (arg == "--min-bucket-kb") {
        args.min_bucket_kb = whole(value(), 0, 1 << 30);
      } else if (arg == "--comm-priority") {
        const auto p = ncclkit::parse_int(value());
        if (!p || *p < -1000 || *p > 1000) {
          throw ncclkit::ConfigError(
              "train_mlp: --comm-priority wants a stream priority (CUDA clamps it to the "
              "device's range, lower runs first), not '" +
              std::string(argv[i]) + "'");
        }
        args.comm_priority = static_cast<int>(*p);
      } else if (arg == "--max-ctas") {
        args.max_ctas = static_cast<int>(number(1, 64));
      } else if (arg == "--reduce-blocks") {
        args.reduce_blocks = static_cast<int>(number(0, 1024));
      } else if (arg == "--add-gradients") {
        args.add_gradients = true;
      } else if (arg == "--separate-update") {
        args.separate_update = true;
      } else if (arg == "--defer-gather") {
        args.defer_gather = true;
      } else if (arg == "--cublas-sms") {
        args.model.cublas_sms = static_cast<int>(number(0, 1024));
      } else if (arg == "--label") {
        args.label = value();
        if (args.label.empty() || args.label.find_first_of(",\"\n/") != std::string::npos) {
          throw ncclkit::ConfigError("train_mlp: --label names a CSV row: a word without commas, quotes or slashes");
        }
      } else if (arg == "--tune") {
        args.tune = true;
      } else if (arg == "--accumulation") {
        args.accumulation = number(1, 1024);
      } else if (arg == "--precision") {
        const std::string name = value();
        if (name == "tf32") {
          args.model.precision = mlp_cublas::Precision::kTf32;
        } else if (name == "fp32") {
          args.model.precision = mlp_cublas::Precision::kFloat32;
        } else if (name == "bf16") {
          args.model.precision = mlp_cublas::Precision::kBf16;
        } else {
          throw ncclkit::ConfigError("train_mlp: --precision is tf32, fp32 or bf16, not '" + name + "'");
        }
      } else if (arg == "--reduce-repeats") {
        args.reduce_repeats = number(1, 100000);
      } else if (arg == "--csv") {
        args.csv = value();
      } else if (arg == "--init-url") {
        args.init_url = value();
      } else if (arg == "--help" || arg == "-h") {
        usage(stdout);
        return 0;
      } else {
        std::fprintf(stderr, "train_mlp: unknown argument '%s'\n", argv[i]);
        usage(stderr);
        return 2;
      }
    }
    if (args.tune && bucket_given) {
      throw ncclkit::ConfigError("train_mlp: --bucket-mb fixes the bucket cap, --tune chooses it: give one of them");
    }
    if (args.defer_gather) {
      for (const auto codec : args.codecs) {
        if (codec != ncclkit::compression::Codec::kNone) {
          throw ncclkit::ConfigError("train_mlp: --defer-gather splits float32 reductions; give --codec none");
        }
      }
    }
    if (!args.input_given) args.model.input = args.model.width;
    if (!args.output_given) args.model.output = args.model.width;
    if (std::string p = args.model.problem(); !p.empty()) throw ncclkit::ConfigError(p);
    // Rank 0 appends to it after the first configuration: a path that cannot take it fails now.
    if (!args.csv.empty()) {
      std::FILE* f = std::fopen(args.csv.c_str(), "a");
      if (f == nullptr) throw ncclkit::ConfigError("train_mlp: cannot append to --csv " + args.csv);
      std::fclose(f);
    }
    const bool launched = ncclkit::env_string("RANK") || ncclkit::env_string("OMPI_COMM_WORLD_RANK") ||
                          ncclkit::env_string("SLURM_PROCID");
    if (!args.init_url.empty() && !launched) {
      throw ncclkit::ConfigError("train_mlp: --init-url is for workers started by a launcher (RANK set); run "
                                 "alone, train_mlp starts its --nprocs workers through a private folder");
    }

    const auto run_worker = [&](const ncclkit::WorldInfo& world) { return worker(world, args); };
    if (launched) {
      auto world = ncclkit::detect_world();
      if (!args.init_url.empty()) world.init_url = args.init_url;
      return run_worker(world);
    }
    const auto result = ncclkit::spawn(args.nprocs, run_worker);
    if (!result.ok()) std::fprintf(stderr, "train_mlp: %s\n", result.describe().c_str());
    return result.ok() ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  }
}
