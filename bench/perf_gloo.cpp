// perf_gloo: nccl-tests-style bandwidth tables for ncclkit's Gloo backend, optionally side by
// side with Gloo's own API driven in the same harness (--raw).
//
//   perf_gloo -p 2 -b 1M -e 64M -f 2 -O all_reduce,broadcast,all_gather -d float --raw
//
// Processes: under a launcher (torchrun, mpirun, srun, or RANK/WORLD_SIZE with NCCLKIT_INIT_URL
// or MASTER_ADDR/MASTER_PORT) it is one rank of that job; otherwise it forks -p N local ranks
// (default 2) that rendezvous through a private folder. Rank 0 prints.
//
// --raw adds the implementation "raw": gloo::allreduce / broadcast / allgather / reduce called
// directly on the communicator's own Gloo context, with Gloo's own reduction functions
// (gloo::sum<float>, gloo::sum<gloo::float16>, ...), in-place and out-of-place as Gloo
// supports them. Gloo has no bfloat16, no average and no options-style reduce_scatter: those
// rows show N/A for raw. Both implementations are timed in interleaved rounds (see
// perf_engine.hpp); the footer compares their median times.
#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/math.h>
#include <gloo/reduce.h>
#include <gloo/types.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "perf_engine.hpp"

#include "ncclkit/bootstrap/environment.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/gloo/communicator.hpp"

namespace {

using ncclkit::DataType;
using ncclkit::ReduceOp;
using ncclkit::TensorView;
using ncclkit::perf::Collective;
using ncclkit::perf::Placement;

struct ToolOptions : ncclkit::perf::ToolFlags {
  ToolOptions() { processes = 2; }
  std::string interface;
  std::size_t chunk_elements = ncclkit::gloo::kDefaultChunkElements;
};

void usage() {
  std::printf(
      "usage: perf_gloo [flags]\n"
      "  -p, --nprocs N          local processes to fork when not started by a launcher, default 2\n"
      "      --raw               also time Gloo's own API on the same connections\n"
      "      --timeout SECONDS   collective timeout (default NCCLKIT_TIMEOUT or 600)\n"
      "      --iface NAME        network interface for Gloo's TCP transport (default: host name)\n"
      "      --chunk ELEMENTS    most elements per Gloo call (default 2^30)\n"
      "%s",
      ncclkit::perf::perf_usage());
}

/// Gloo's own reduction function for `type` and `op`, or null where Gloo has none.
ncclkit::gloo::ReduceFunction gloo_reduction(DataType type, ReduceOp op) {
  auto pick = [op]<class T>() -> ncclkit::gloo::ReduceFunction {
    using Fn = void (*)(void*, const void*, const void*, size_t);
    switch (op) {
      case ReduceOp::kSum:
        return static_cast<Fn>(&gloo::sum<T>);
      case ReduceOp::kProd:
        return static_cast<Fn>(&gloo::product<T>);
      case ReduceOp::kMin:
        return static_cast<Fn>(&gloo::min<T>);
      case ReduceOp::kMax:
        return static_cast<Fn>(&gloo::max<T>);
      case ReduceOp::kAvg:
        return nullptr;
    }
    return nullptr;
  };
  switch (type) {
    case DataType::kInt8:
      return pick.template operator()<int8_t>();
    case DataType::kUint8:
      return pick.template operator()<uint8_t>();
    case DataType::kInt32:
      return pick.template operator()<int32_t>();
    case DataType::kUint32:
      return pick.template operator()<uint32_t>();
    case DataType::kInt64:
      return pick.template operator()<int64_t>();
    case DataType::kUint64:
      return pick.template operator()<uint64_t>();
    case DataType::kFloat16:
      return pick.template operator()<gloo::float16>();
    case DataType::kFloat32:
      return pick.template operator()<float>();
    case DataType::kFloat64:
      return pick.template operator()<double>();
    case DataType::kBFloat16:
      return nullptr;
  }
  return nullptr;
}

/// Calls `fn` with a typed null pointer of the element width (Gloo's setters use sizeof only).
template <class Fn>
void with_width(DataType type, Fn&& fn) {
  switch (ncclkit::size_of(type)) {
    case 1:
      return fn(static_cast<uint8_t*>(nullptr));
    case 2:
      return fn(static_cast<uint16_t*>(nullptr));
    case 4:
      return fn(static_cast<uint32_t*>(nullptr));
    default:
      return fn(static_cast<uint64_t*>(nullptr));
  }
}

/// Gloo's own collectives on the communicator's context.
ncclkit::perf::Implementation raw_gloo(ncclkit::gloo::Communicator& comm) {
  ncclkit::perf::Implementation impl;
  impl.name = "raw";
  auto context = comm.native_context();
  const auto timeout = comm.options().timeout;
  const int rank = comm.rank();
  impl.issue = [context, timeout, rank](int /*local: always 0*/, Collective c, TensorView in, TensorView out,
                                        ReduceOp op, int root) {
    // Gloo cannot take empty buffers (its allgather divides by the size): nothing to do.
    if (in.count == 0 || out.count == 0) return;
    const bool in_place = in.data == out.data;
    switch (c) {
      case Collective::kAllReduce: {
        gloo::AllreduceOptions opts(context);
        with_width(in.dtype, [&]<class W>(W*) {
          if (!in_place) opts.setInput(static_cast<W*>(in.data), in.count);
          opts.setOutput(static_cast<W*>(out.data), out.count);
        });
        opts.setReduceFunction(gloo_reduction(in.dtype, op));
        opts.setTimeout(timeout);
        gloo::allreduce(opts);
        return;
      }
      case Collective::kBroadcast: {
        gloo::BroadcastOptions opts(context);
        with_width(out.dtype, [&]<class W>(W*) {
          if (rank == root && !in_place) opts.setInput(static_cast<W*>(in.data), in.count);
          opts.setOutput(static_cast<W*>(out.data), out.count);
        });
        opts.setRoot(root);
        opts.setTimeout(timeout);
        gloo::broadcast(opts);
        return;
      }
      case Collective::kReduce: {
        gloo::ReduceOptions opts(context);
        with_width(in.dtype, [&]<class W>(W*) {
          if (!in_place) opts.setInput(static_cast<W*>(in.data), in.count);
          opts.setOutput(static_cast<W*>(out.data), out.count);
        });
        opts.setRoot(root);
        opts.setReduceFunction(gloo_reduction(in.dtype, op));
        opts.setTimeout(timeout);
        gloo::reduce(opts);
        return;
      }
      case Collective::kAllGather: {
        gloo::AllgatherOptions opts(context);
        const bool gather_in_place =
            static_cast<char*>(in.data) == static_cast<char*>(out.data) + in.bytes() * static_cast<size_t>(rank);
        with_width(out.dtype, [&]<class W>(W*) {
          if (!gather_in_place) opts.setInput(static_cast<W*>(in.data), in.count);
          opts.setOutput(static_cast<W*>(out.data), out.count);
        });
        opts.setTimeout(timeout);
        gloo::allgather(opts);
        return;
      }
      default:
        throw ncclkit::ConfigError("raw Gloo has no options-style " + std::string(ncclkit::perf::name_of(c)));
    }
  };
  impl.complete = [] {};  // Gloo's calls return when done
  impl.supports = [](Collective c, Placement, DataType type, ReduceOp op) {
    switch (c) {
      case Collective::kAllReduce:
      case Collective::kReduce:
        return gloo_reduction(type, op) != nullptr;
      case Collective::kBroadcast:
      case Collective::kAllGather:
        return true;
      default:
        return false;
    }
  };
  return impl;
}

int run_rank(const ncclkit::WorldInfo& world, const ncclkit::perf::PerfOptions& perf, const ToolOptions& tool) {
  auto store = ncclkit::make_store(world.init_url, world);
  ncclkit::gloo::Options options;
  if (tool.timeout_seconds > 0) {
    options.timeout = std::chrono::milliseconds(static_cast<long long>(tool.timeout_seconds * 1000));
  }
  options.interface = tool.interface;
  options.chunk_elements = tool.chunk_elements;
  options.name = "perf";
  ncclkit::gloo::Communicator comm(store, world, options);
  if (world.rank == 0) {
    std::printf("# perf_gloo: %d ranks, reductions %s, timeout %.0f s\n", comm.size(),
                std::string(ncclkit::gloo::name_of(comm.isa())).c_str(),
                std::chrono::duration<double>(comm.options().timeout).count());
  }
  std::vector<ncclkit::perf::Implementation> impls;
  impls.push_back(ncclkit::perf::backend_implementation(std::vector{&comm}));
  if (tool.raw) impls.push_back(raw_gloo(comm));
  auto summary = ncclkit::perf::run_perf(comm, std::move(impls), perf);
  return summary.exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ncclkit::perf::PerfOptions perf = ncclkit::perf::parse_perf_options(argc, argv);
    ToolOptions tool;
    const auto stop =
        ncclkit::perf::parse_tool_flags(perf, "perf_gloo", usage, tool, [&](const std::string& flag, auto&& value) {
          if (flag == "--iface") {
            tool.interface = value();
          } else if (flag == "--chunk") {
            tool.chunk_elements = std::stoull(value());
          } else {
            return false;
          }
          return true;
        });
    if (stop) return *stop;
    if (perf.devices_per_process != 1) throw ncclkit::ConfigError("-g: the Gloo backend has no devices");

    const ncclkit::WorldInfo detected = ncclkit::detect_world();
    if (detected.world_size > 1) return run_rank(detected, perf, tool);
    if (tool.processes < 1) throw ncclkit::ConfigError("-p must be at least 1");
    auto result =
        ncclkit::spawn(tool.processes, [&](const ncclkit::WorldInfo& world) { return run_rank(world, perf, tool); },
                       {.timeout = std::chrono::hours(24)});
    if (!result.ok()) {
      std::fprintf(stderr, "perf_gloo: %s\n", result.describe().c_str());
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "perf_gloo: %s\n", e.what());
    return 1;
  }
}
