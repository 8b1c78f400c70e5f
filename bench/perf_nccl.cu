// perf_nccl: nccl-tests-style bandwidth tables for ncclkit's NCCL backend, optionally side by
// side with NCCL called directly in the same harness (--raw).
//
//   perf_nccl -p 4 -b 8 -e 1G -f 2 -O all_reduce,all_gather -d float --raw     # 4 processes
//   perf_nccl -g 4 -b 8 -e 1G -f 2 --raw                                         # 4 GPUs, 1 process
//
// Processes: under a launcher (ncclkit-run, torchrun, mpirun, srun) it is one rank of that job,
// on GPU local_rank % visible; otherwise it forks -p N local ranks (default: one per visible GPU,
// counted without initialising CUDA here) that rendezvous through a private folder. With -g G
// one thread drives G GPUs (a LocalGroup), as nccl-tests' -g does: each timed step issues one
// call per GPU inside one group (GroupGuard for ncclkit, ncclGroupStart/End for raw NCCL) and
// is timed as one collective. Rank 0 prints.
//
// --raw adds the implementation "raw": ncclAllReduce, ncclBroadcast, ncclReduce,
// ncclAllGather, ncclReduceScatter and ncclAlltoAll on a second, plain communicator (blocking,
// NCCL's default config, created by ncclCommInitRank or ncclCommInitAll as users do), on the
// same stream, completed with cudaStreamSynchronize. Both are timed in interleaved rounds (see
// perf_engine.hpp); the footer compares their median times.
//
// --raw-event adds "raw+event": the same raw calls, each followed by a cudaEventRecord on its
// stream (as ncclkit records one completion event per collective, or per stream and group).
// It separates what that event costs (on the host and between kernels on the GPU) from the
// rest of ncclkit's work. --event-ring N sets how many events it takes in turn (default 64;
// 1 records the same event every time, thousands stand for the watchdog's pool).
//
// --raw-native adds "raw@ncclkit": the same raw calls on ncclkit's own NCCL communicator
// (Communicator::native(), split from its non-blocking control communicator), unwatched. Set
// beside "raw" it tells whether that communicator runs differently from a plain one; beside
// "ncclkit", what ncclkit's issue path costs on the same NCCL communicator. Those calls take
// none of ncclkit's locks: should ncclkit's watchdog abort the communicator mid-run (a
// collective past its timeout), they may run on a handle being torn down. A benchmark only.
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "perf_engine.hpp"
#include "raw_nccl_comm.hpp"

#include "ncclkit/bootstrap/environment.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/local_gpus.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/group.hpp"
#include "ncclkit/nccl/local_group.hpp"
#include "ncclkit/nccl/types.hpp"

/// Host staging for the engine: stream-ordered copies on the stream the engine works on,
/// completed through synchronize (bounded, and a failed communicator throws), with the
/// communicator's GPU current (one thread may drive several).
template <>
struct ncclkit::perf::HostTransfer<ncclkit::nccl::Communicator> {
  static void upload(ncclkit::nccl::Communicator& comm, void* device, const void* host, std::size_t bytes) {
    if (bytes == 0) return;
    ncclkit::nccl::DeviceGuard guard(comm.device());
    NCCLKIT_CUDA_CHECK(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, comm.comm_stream()));
    comm.synchronize(comm.comm_stream());
  }
  static void download(ncclkit::nccl::Communicator& comm, void* host, const void* device, std::size_t bytes) {
    if (bytes == 0) return;
    ncclkit::nccl::DeviceGuard guard(comm.device());
    NCCLKIT_CUDA_CHECK(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, comm.comm_stream()));
    comm.synchronize(comm.comm_stream());
  }
};

namespace {

using ncclkit::DataType;
using ncclkit::ReduceOp;
using ncclkit::TensorView;
using ncclkit::nccl::Communicator;
using ncclkit::perf::Collective;
using ncclkit::perf::Placement;

struct ToolOptions : ncclkit::perf::ToolFlags {  // processes 0: one per visible GPU
  bool check_pointers = true;
  bool raw_event = false;   ///< --raw-event
  bool raw_native = false;  ///< --raw-native
  int event_ring = 64;      ///< --event-ring
};

void usage() {
  std::printf(
      "usage: perf_nccl [flags]\n"
      "  -p, --nprocs N          local processes to fork when not started by a launcher (default: one per GPU)\n"
      "  -g, --ngpus G           GPUs driven by one process (then -p must be 1)\n"
      "      --raw               also time NCCL called directly on a plain communicator\n"
      "      --raw-event         also time those raw calls each followed by a cudaEventRecord\n"
      "      --event-ring N      events --raw-event takes in turn (default 64)\n"
      "      --raw-native        also time raw NCCL calls on ncclkit's own NCCL communicator\n"
      "      --timeout SECONDS   collective timeout of ncclkit's communicator (default NCCLKIT_TIMEOUT or 600)\n"
      "      --no-check-pointers skip ncclkit's cudaPointerGetAttributes checks (NCCLKIT_CHECK_POINTERS=0)\n"
      "%s",
      ncclkit::perf::perf_usage());
}

/// A plain NCCL communicator, as users make one: blocking, default config.
struct RawComm {
  ncclComm_t comm = nullptr;
  RawComm() = default;
  explicit RawComm(ncclComm_t c) : comm(c) {}
  RawComm(RawComm&& other) noexcept : comm(std::exchange(other.comm, nullptr)) {}
  RawComm& operator=(RawComm&& other) noexcept {
    std::swap(comm, other.comm);
    return *this;
  }
  ~RawComm() {
    if (comm != nullptr) (void)ncclCommDestroy(comm);
  }
};

/// One raw NCCL call of collective `c` on `comm`, on `stream`.
void issue_raw(ncclComm_t comm, cudaStream_t stream, Collective c, TensorView in, TensorView out, ReduceOp op,
               int root) {
  const ncclDataType_t type = ncclkit::nccl::to_nccl(in.dtype);
  switch (c) {
    case Collective::kAllReduce:
      NCCLKIT_NCCL_CHECK(ncclAllReduce(in.data, out.data, in.count, type, ncclkit::nccl::to_nccl(op), comm, stream));
      return;
    case Collective::kBroadcast:
      NCCLKIT_NCCL_CHECK(ncclBroadcast(in.data, out.data, out.count, type, root, comm, stream));
      return;
    case Collective::kReduce:
      NCCLKIT_NCCL_CHECK(ncclReduce(in.data, out.data, in.count, type, ncclkit::nccl::to_nccl(op), root, comm, stream));
      return;
    case Collective::kAllGather:
      NCCLKIT_NCCL_CHECK(ncclAllGather(in.data, out.data, in.count, type, comm, stream));
      return;
    case Collective::kReduceScatter:
      NCCLKIT_NCCL_CHECK(
          ncclReduceScatter(in.data, out.data, out.count, type, ncclkit::nccl::to_nccl(op), comm, stream));
      return;
    case Collective::kAllToAll: {
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
      int n = 1;
      NCCLKIT_NCCL_CHECK(ncclCommCount(comm, &n));
      NCCLKIT_NCCL_CHECK(ncclAlltoAll(in.data, out.data, in.count / static_cast<std::size_t>(n), type, comm, stream));
      return;
#else
      throw ncclkit::ConfigError("raw all_to_all needs NCCL >= 2.28");
#endif
    }
  }
}

/// NCCL called directly on `raw[local]`, on `streams[local]`; several are grouped with
/// ncclGroupStart/End.
ncclkit::perf::Implementation raw_nccl(std::vector<ncclComm_t> raw, std::vector<cudaStream_t> streams,
                                       std::string name = "raw") {
  ncclkit::perf::Implementation impl;
  impl.name = std::move(name);
  impl.issue = [raw, streams](int local, Collective c, TensorView in, TensorView out, ReduceOp op, int root) {
    issue_raw(raw[static_cast<std::size_t>(local)], streams[static_cast<std::size_t>(local)], c, in, out, op, root);
  };
  impl.complete = [streams] {
    for (cudaStream_t stream : streams) NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
  };
  impl.begin_group = [] { NCCLKIT_NCCL_CHECK(ncclGroupStart()); };
  impl.end_group = [] { NCCLKIT_NCCL_CHECK(ncclGroupEnd()); };
  impl.supports = [](Collective c, Placement p, DataType, ReduceOp) {
    return !(c == Collective::kAllToAll && p == Placement::kInPlace);
  };
  return impl;
}

/// Timing-free events, a ring per GPU, recorded in turn. (The watchdog never records a
/// pending event again; here one may be, which CUDA allows.)
struct EventRing {
  std::vector<std::vector<ncclkit::nccl::Event>> events;  // [local][slot]
  std::vector<std::size_t> next;
  EventRing(const std::vector<int>& devices, int size) : events(devices.size()), next(devices.size(), 0) {
    for (std::size_t i = 0; i < devices.size(); ++i)
      for (int k = 0; k < size; ++k) events[i].emplace_back(devices[i]);
  }
  void record(int local, cudaStream_t stream) {
    const auto i = static_cast<std::size_t>(local);
    events[i][next[i]].record(stream);
    next[i] = (next[i] + 1) % events[i].size();
  }
};

/// raw_nccl plus one event recorded after every call on its stream; in a group (-g) after the
/// group's end, one per GPU, as ncclkit's GroupGuard records them.
ncclkit::perf::Implementation raw_nccl_with_events(std::vector<ncclComm_t> raw, std::vector<cudaStream_t> streams,
                                                   std::vector<int> devices, int ring_size) {
  auto ring = std::make_shared<EventRing>(devices, ring_size);
  auto grouped = std::make_shared<bool>(false);
  ncclkit::perf::Implementation impl = raw_nccl(raw, streams);
  impl.name = "raw+event";
  impl.issue = [raw, streams, ring, grouped](int local, Collective c, TensorView in, TensorView out, ReduceOp op,
                                             int root) {
    const cudaStream_t stream = streams[static_cast<std::size_t>(local)];
    issue_raw(raw[static_cast<std::size_t>(local)], stream, c, in, out, op, root);
    if (!*grouped) ring->record(local, stream);
  };
  impl.begin_group = [grouped] {
    NCCLKIT_NCCL_CHECK(ncclGroupStart());
    *grouped = true;
  };
  impl.end_group = [streams, ring, grouped] {
    *grouped = false;
    NCCLKIT_NCCL_CHECK(ncclGroupEnd());
    for (std::size_t i = 0; i < streams.size(); ++i) ring->record(static_cast<int>(i), streams[i]);
  };
  return impl;
}

ncclkit::nccl::Options comm_options(const ToolOptions& tool) {
  ncclkit::nccl::Options options;
  options.name = "perf";
  options.check_pointers = tool.check_pointers;
  if (tool.timeout_seconds > 0) {
    options.timeout = std::chrono::milliseconds(static_cast<long long>(tool.timeout_seconds * 1000));
  }
  return options;
}

void print_banner(const Communicator& comm, const ToolOptions& tool, const char* mode) {
  cudaDeviceProp prop{};
  NCCLKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, comm.device()));
  std::printf("# perf_nccl: %d ranks (%s), %s, %s, pointer checks %s, timeout %.0f s\n", comm.size(), mode, prop.name,
              ncclkit::nccl::version_text().c_str(), tool.check_pointers ? "on" : "off",
              std::chrono::duration<double>(comm.timeout()).count());
  std::fflush(stdout);
}

/// One rank per process.
int run_rank(const ncclkit::WorldInfo& world, const ncclkit::perf::PerfOptions& perf, const ToolOptions& tool) {
  auto store = ncclkit::make_store(world.init_url, world);
  Communicator comm(store, world, comm_options(tool));
  if (world.rank == 0) print_banner(comm, tool, "one process per GPU");
  std::vector<ncclkit::perf::Implementation> impls;
  impls.push_back(ncclkit::perf::backend_implementation(std::vector{&comm}));
  RawComm raw;
  if (tool.raw || tool.raw_event) {
    // The raw communicator's id travels through the same store, under a key of its own.
    ncclkit::nccl::DeviceGuard guard(comm.device());
    raw = RawComm(ncclkit::bench::init_raw_comm(*store, world, "perf_nccl/raw_id"));
    if (tool.raw) impls.push_back(raw_nccl({raw.comm}, {comm.comm_stream()}));
    if (tool.raw_event)
      impls.push_back(raw_nccl_with_events({raw.comm}, {comm.comm_stream()}, {comm.device()}, tool.event_ring));
  }
  if (tool.raw_native) impls.push_back(raw_nccl({comm.native()}, {comm.comm_stream()}, "raw@ncclkit"));
  ncclkit::nccl::DeviceGuard guard(comm.device());
  auto summary = ncclkit::perf::run_perf(comm, std::move(impls), perf);
  return summary.exit_code();
}

/// ncclkit's group calls for one thread driving several communicators: a GroupGuard held
/// between begin and end; end() throws what the group's end throws.
struct GroupCalls {
  std::shared_ptr<std::optional<ncclkit::nccl::GroupGuard>> guard =
      std::make_shared<std::optional<ncclkit::nccl::GroupGuard>>();
  std::function<void()> begin() const {
    return [guard = guard] { guard->emplace(); };
  }
  std::function<void()> end() const {
    return [guard = guard] {
      struct Reset {
        std::optional<ncclkit::nccl::GroupGuard>& g;
        ~Reset() { g.reset(); }
      } reset{*guard};
      (*guard)->end();
    };
  }
};

/// -g G: one process, one thread, G GPUs.
int run_local(int gpus, const ncclkit::perf::PerfOptions& perf, const ToolOptions& tool) {
  std::vector<int> devices;
  for (int d = 0; d < gpus; ++d) devices.push_back(d);
  ncclkit::nccl::LocalGroup local(devices, comm_options(tool));
  std::vector<Communicator*> members;
  std::vector<cudaStream_t> streams;
  for (auto& member : local) {
    members.push_back(&member);
    streams.push_back(member.comm_stream());
  }
  const GroupCalls group;
  std::vector<ncclkit::perf::Implementation> impls;
  impls.push_back(ncclkit::perf::backend_implementation(members, "ncclkit", group.begin(), group.end()));
  std::vector<RawComm> raw(static_cast<std::size_t>(gpus));
  if (tool.raw || tool.raw_event) {
    std::vector<ncclComm_t> handles(static_cast<std::size_t>(gpus), nullptr);
    NCCLKIT_NCCL_CHECK(ncclCommInitAll(handles.data(), gpus, devices.data()));
    for (int i = 0; i < gpus; ++i) raw[static_cast<std::size_t>(i)] = RawComm(handles[static_cast<std::size_t>(i)]);
    if (tool.raw) impls.push_back(raw_nccl(handles, streams));
    if (tool.raw_event) impls.push_back(raw_nccl_with_events(handles, streams, devices, tool.event_ring));
  }
  if (tool.raw_native) {
    std::vector<ncclComm_t> natives;
    for (auto* member : members) natives.push_back(member->native());
    impls.push_back(raw_nccl(natives, streams, "raw@ncclkit"));
  }
  print_banner(local[0], tool, "one process, one thread, grouped calls");
  auto summary = ncclkit::perf::run_perf(members, std::move(impls), perf, group.begin(), group.end());
  return summary.exit_code();
}

}  // namespace

int main(int argc, char** argv) {
  try {
    ncclkit::perf::PerfOptions perf = ncclkit::perf::parse_perf_options(argc, argv);
    ToolOptions tool;
    const auto stop =
        ncclkit::perf::parse_tool_flags(perf, "perf_nccl", usage, tool, [&](const std::string& flag, auto&& value) {
          if (flag == "--no-check-pointers") {
            tool.check_pointers = false;
          } else if (flag == "--raw-event") {
            tool.raw_event = true;
          } else if (flag == "--raw-native") {
            tool.raw_native = true;
          } else if (flag == "--event-ring") {
            const std::string text = value();
            char* end = nullptr;
            const long events = std::strtol(text.c_str(), &end, 10);
            if (end == text.c_str() || *end != '\0' || events < 1 || events > (1 << 20)) {
              throw ncclkit::ConfigError("--event-ring needs a number of events from 1 to 1048576, not '" + text + "'");
            }
            tool.event_ring = static_cast<int>(events);
          } else {
            return false;
          }
          return true;
        });
    if (stop) return *stop;
    const int gpus = perf.devices_per_process;
    if (gpus < 1) throw ncclkit::ConfigError("-g must be at least 1");

    const ncclkit::WorldInfo detected = ncclkit::detect_world();
    if (gpus > 1) {
      if (detected.world_size > 1 || tool.processes > 1) {
        throw ncclkit::ConfigError("-g G > 1 drives G GPUs from one process; run it alone (-p 1, no launcher)");
      }
      return run_local(gpus, perf, tool);
    }
    if (detected.world_size > 1) return run_rank(detected, perf, tool);
    int processes = tool.processes;
    if (processes == 0) {
      const auto inventory = ncclkit::find_gpus();  // without initialising CUDA before fork
      processes = std::max<int>(1, static_cast<int>(inventory.visible.size()));
    }
    auto result =
        ncclkit::spawn(processes, [&](const ncclkit::WorldInfo& world) { return run_rank(world, perf, tool); },
                       {.timeout = std::chrono::hours(24)});
    if (!result.ok()) {
      std::fprintf(stderr, "perf_nccl: %s\n", result.describe().c_str());
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "perf_nccl: %s\n", e.what());
    return 1;
  }
}
