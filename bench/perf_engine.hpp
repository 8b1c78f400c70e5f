#pragma once
/// The perf engine every backend's perf tool shares (bench/perf_gloo.cpp, bench/perf_nccl.cu):
/// nccl-tests' flags, its table (size, count, type, redop, root, time, algbw, busbw, #wrong, for
/// out-of-place and in-place), its bus-bandwidth factors and its footer, plus what nccl-tests
/// lacks: several implementations timed side by side (ncclkit against the raw library, in
/// interleaved rounds, reported as medians) and CSV/JSON output for plots.
///
/// Backend-agnostic: templated on the `Backend` concept. Buffers come from the backend
/// (`allocate`); filling and checking go through host staging buffers and `HostTransfer<B>`,
/// which is memcpy for host backends and which a device backend specialises (cudaMemcpy). No
/// GPU specifics here.
///
/// Method, per (collective, type, op, size): for each placement (out-of-place, in-place) and
/// implementation, one correctness run (inputs from a formula every rank can evaluate, output
/// poisoned first, a guard zone behind it; the result is compared with a host reference in
/// double), then `-w` warm-up calls, then `-R` rounds in which each implementation in turn runs
/// a timed batch of ceil(n / R) calls (who goes first rotates from round to round); ranks line
/// up before each batch. A batch's time is the host time from its first issue to
/// `synchronize`, divided by the batch size, averaged over ranks (-a); the table shows the
/// median over rounds. A thread that drives several local ranks (one per device, the perf
/// tool's -g) issues each call on all of them inside one group and times the group as one
/// call. algbw = size / time; busbw = algbw x the collective's factor (nccl-tests'
/// PERFORMANCE.md): all_reduce 2(n-1)/n, all_gather, reduce_scatter and all_to_all (n-1)/n,
/// broadcast and reduce 1.

#include <algorithm>    // std::sort, std::max, std::min, std::fill
#include <cctype>       // std::toupper
#include <chrono>       // std::chrono::steady_clock
#include <cmath>        // std::fabs, std::isinf, std::isnan
#include <cstddef>      // std::size_t
#include <cstdint>      // fixed-width integers
#include <cstdio>       // std::printf, std::FILE
#include <cstring>      // std::memcpy, std::memset, std::strcmp
#include <ctime>        // std::time, std::strftime (dates in CSV/JSON)
#include <functional>   // std::function
#include <optional>     // std::optional
#include <stdexcept>    // std::invalid_argument
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::move
#include <vector>       // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/tensor.hpp"

namespace ncclkit::perf {

// ---- what is measured -------------------------------------------------------------------------

enum class Collective { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kAllToAll };

inline std::string_view name_of(Collective c) {
  switch (c) {
    case Collective::kAllReduce:
      return "all_reduce";
    case Collective::kBroadcast:
      return "broadcast";
    case Collective::kReduce:
      return "reduce";
    case Collective::kAllGather:
      return "all_gather";
    case Collective::kReduceScatter:
      return "reduce_scatter";
    case Collective::kAllToAll:
      return "all_to_all";
  }
  return "unknown";
}

inline bool is_reduction(Collective c) {
  return c == Collective::kAllReduce || c == Collective::kReduce || c == Collective::kReduceScatter;
}
inline bool is_rooted(Collective c) { return c == Collective::kBroadcast || c == Collective::kReduce; }
/// Collectives whose `size` is the whole of n per-rank parts (nccl-tests' convention).
inline bool is_partitioned(Collective c) {
  return c == Collective::kAllGather || c == Collective::kReduceScatter || c == Collective::kAllToAll;
}

/// nccl-tests' bus-bandwidth factor: busbw = algbw * factor.
inline double busbw_factor(Collective c, int nranks) {
  const double n = nranks;
  switch (c) {
    case Collective::kAllReduce:
      return nranks > 1 ? 2.0 * (n - 1) / n : 0.0;
    case Collective::kAllGather:
    case Collective::kReduceScatter:
    case Collective::kAllToAll:
      return nranks > 1 ? (n - 1) / n : 0.0;
    case Collective::kBroadcast:
    case Collective::kReduce:
      return 1.0;
  }
  return 1.0;
}

/// Where the result goes: a separate buffer, or the input's own memory.
enum class Placement { kOutOfPlace, kInPlace };

// ---- options (nccl-tests' flags where they apply) ---------------------------------------------

struct PerfOptions {
  std::size_t min_bytes = 32u << 20;                            ///< -b
  std::size_t max_bytes = 32u << 20;                            ///< -e
  double step_factor = 2.0;                                     ///< -f (multiplicative step; used when step_bytes == 0)
  std::size_t step_bytes = 0;                                   ///< -i (additive step)
  int iters = 20;                                               ///< -n: timed calls per implementation and size
  int warmup = 5;                                               ///< -w
  int rounds = 5;                                               ///< -R: the timed calls are split into this many rounds
  int check = 1;                                                ///< -c: 0 = no correctness run
  int average = 1;                                              ///< -a: 0 rank 0, 1 average, 2 min, 3 max over ranks
  int root = 0;                                                 ///< -r: root of broadcast and reduce
  int devices_per_process = 1;                                  ///< -g (device backends)
  std::vector<Collective> collectives{Collective::kAllReduce};  ///< --op
  std::vector<DataType> types{DataType::kFloat32};              ///< -d
  std::vector<ReduceOp> ops{ReduceOp::kSum};                    ///< -o
  bool out_of_place = true;                                     ///< --no-out-of-place clears it
  bool in_place = true;                                         ///< --no-in-place clears it
  std::string csv_path;                                         ///< --csv FILE
  std::string json_path;                                        ///< --json FILE
  std::vector<std::string> unparsed;                            ///< flags left for the tool itself
};

namespace detail {

inline std::size_t parse_size(std::string_view text) {
  if (text.empty()) throw ConfigError("empty size");
  std::size_t digits = 0;
  while (digits < text.size() && ((text[digits] >= '0' && text[digits] <= '9') || text[digits] == '.')) ++digits;
  if (digits == 0) throw ConfigError("size '" + std::string(text) + "' does not start with a number");
  const double value = std::stod(std::string(text.substr(0, digits)));
  std::string unit(text.substr(digits));
  for (auto& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  double scale = 1;
  if (unit.empty() || unit == "B")
    scale = 1;
  else if (unit == "K" || unit == "KB" || unit == "KIB")
    scale = 1024.0;
  else if (unit == "M" || unit == "MB" || unit == "MIB")
    scale = 1024.0 * 1024;
  else if (unit == "G" || unit == "GB" || unit == "GIB")
    scale = 1024.0 * 1024 * 1024;
  else
    throw ConfigError("size '" + std::string(text) + "': unknown unit '" + unit + "' (use K, M or G)");
  return static_cast<std::size_t>(value * scale);
}

inline std::vector<std::string> split_list(std::string_view text) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  while (start <= text.size()) {
    const std::size_t comma = text.find(',', start);
    const std::size_t end = comma == std::string_view::npos ? text.size() : comma;
    if (end > start) parts.emplace_back(text.substr(start, end - start));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  return parts;
}

inline std::vector<DataType> all_types() {
  return {DataType::kInt8,   DataType::kUint8,   DataType::kInt32,    DataType::kUint32,  DataType::kInt64,
          DataType::kUint64, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64};
}

inline DataType parse_type(const std::string& name) {
  for (DataType t : all_types()) {
    if (name == name_of(t)) return t;
  }
  if (name == "float32" || name == "fp32") return DataType::kFloat32;
  if (name == "float16" || name == "fp16") return DataType::kFloat16;
  if (name == "bf16") return DataType::kBFloat16;
  if (name == "float64") return DataType::kFloat64;
  throw ConfigError("unknown type '" + name +
                    "'; use int8, uint8, int32, uint32, int64, uint64, half, bfloat16, "
                    "float, double or all");
}

inline ReduceOp parse_op(const std::string& name) {
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg}) {
    if (name == name_of(op)) return op;
  }
  throw ConfigError("unknown reduction '" + name + "'; use sum, prod, min, max, avg or all");
}

inline Collective parse_collective(const std::string& name) {
  for (Collective c : {Collective::kAllReduce, Collective::kBroadcast, Collective::kReduce, Collective::kAllGather,
                       Collective::kReduceScatter, Collective::kAllToAll}) {
    if (name == name_of(c)) return c;
  }
  throw ConfigError("unknown collective '" + name +
                    "'; use all_reduce, broadcast, reduce, all_gather, reduce_scatter or all_to_all");
}

}  // namespace detail

/// The flags the engine understands, for a tool's --help.
inline const char* perf_usage() {
  return "  -b, --minbytes SIZE     smallest size (bytes; K, M, G suffixes), default 32M\n"
         "  -e, --maxbytes SIZE     largest size, default 32M\n"
         "  -f, --stepfactor F      multiply the size by F each step, default 2\n"
         "  -i, --stepbytes SIZE    add SIZE each step instead\n"
         "  -n, --iters N           timed calls per size and implementation, default 20\n"
         "  -w, --warmup_iters N    untimed calls first, default 5\n"
         "  -R, --rounds N          split the timed calls into N interleaved rounds; report the median, default 5\n"
         "  -c, --check 0/1         check results before timing, default 1 (a wrong value: exit\n"
         "                          status 2; with 0 the footer says \"not checked\")\n"
         "  -a, --average 0/1/2/3   time over ranks: rank 0, average, min, max; default 1\n"
         "  -r, --root R            root of broadcast and reduce, default 0\n"
         "  -d, --datatype T[,T]    int8 uint8 int32 uint32 int64 uint64 half bfloat16 float double, or all\n"
         "  -o, --op OP[,OP]        sum prod min max avg, or all (reductions only), default sum\n"
         "  -O, --collective C[,C]  all_reduce broadcast reduce all_gather reduce_scatter all_to_all, default "
         "all_reduce\n"
         "  -g, --ngpus N           devices per process (device backends)\n"
         "      --no-in-place / --no-out-of-place   skip one placement\n"
         "      --csv FILE / --json FILE            also write every row there (rank 0)\n";
}

/// Parses the engine's flags; anything else lands in `unparsed`, in order, for the tool.
inline PerfOptions parse_perf_options(int argc, char** argv) {
  PerfOptions o;
  auto value = [&](int& i, const std::string& flag) -> std::string {
    if (i + 1 >= argc) throw ConfigError("flag " + flag + " needs a value");
    return argv[++i];
  };
  auto to_int = [](const std::string& flag, const std::string& text) {
    try {
      std::size_t used = 0;
      const int v = std::stoi(text, &used);
      if (used != text.size()) throw std::invalid_argument(text);
      return v;
    } catch (const std::exception&) {
      throw ConfigError("flag " + flag + ": '" + text + "' is not an integer");
    }
  };
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "-b" || flag == "--minbytes")
      o.min_bytes = detail::parse_size(value(i, flag));
    else if (flag == "-e" || flag == "--maxbytes")
      o.max_bytes = detail::parse_size(value(i, flag));
    else if (flag == "-f" || flag == "--stepfactor")
      o.step_factor = std::stod(value(i, flag));
    else if (flag == "-i" || flag == "--stepbytes")
      o.step_bytes = detail::parse_size(value(i, flag));
    else if (flag == "-n" || flag == "--iters")
      o.iters = to_int(flag, value(i, flag));
    else if (flag == "-w" || flag == "--warmup_iters")
      o.warmup = to_int(flag, value(i, flag));
    else if (flag == "-R" || flag == "--rounds")
      o.rounds = to_int(flag, value(i, flag));
    else if (flag == "-c" || flag == "--check")
      o.check = to_int(flag, value(i, flag));
    else if (flag == "-a" || flag == "--average")
      o.average = to_int(flag, value(i, flag));
    else if (flag == "-r" || flag == "--root")
      o.root = to_int(flag, value(i, flag));
    else if (flag == "-g" || flag == "--ngpus")
      o.devices_per_process = to_int(flag, value(i, flag));
    else if (flag == "--no-in-place")
      o.in_place = false;
    else if (flag == "--no-out-of-place")
      o.out_of_place = false;
    else if (flag == "--csv")
      o.csv_path = value(i, flag);
    else if (flag == "--json")
      o.json_path = value(i, flag);
    else if (flag == "-d" || flag == "--datatype") {
      const std::string list = value(i, flag);
      o.types.clear();
      if (list == "all")
        o.types = detail::all_types();
      else
        for (const auto& name : detail::split_list(list)) o.types.push_back(detail::parse_type(name));
    } else if (flag == "-o" || flag == "--op") {
      const std::string list = value(i, flag);
      o.ops.clear();
      if (list == "all")
        o.ops = {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kAvg};
      else
        for (const auto& name : detail::split_list(list)) o.ops.push_back(detail::parse_op(name));
    } else if (flag == "-O" || flag == "--collective") {
      const std::string list = value(i, flag);
      o.collectives.clear();
      if (list == "all") {
        o.collectives = {Collective::kAllReduce, Collective::kBroadcast,     Collective::kReduce,
                         Collective::kAllGather, Collective::kReduceScatter, Collective::kAllToAll};
      } else {
        for (const auto& name : detail::split_list(list)) o.collectives.push_back(detail::parse_collective(name));
      }
    } else {
      o.unparsed.push_back(flag);
    }
  }
  if (o.min_bytes > o.max_bytes) throw ConfigError("-b (minbytes) is larger than -e (maxbytes)");
  if (o.step_bytes == 0 && !(o.step_factor > 1.0)) throw ConfigError("-f (stepfactor) must be > 1");
  if (o.iters < 1 || o.warmup < 0 || o.rounds < 1) throw ConfigError("-n must be >= 1, -w >= 0, -R >= 1");
  if (o.average < 0 || o.average > 3) throw ConfigError("-a must be 0, 1, 2 or 3");
  if (o.types.empty() || o.ops.empty() || o.collectives.empty()) throw ConfigError("empty -d, -o or -O list");
  if (!o.in_place && !o.out_of_place) throw ConfigError("--no-in-place and --no-out-of-place leave nothing to run");
  return o;
}

/// The flags every perf tool takes beyond the engine's.
struct ToolFlags {
  int processes = 0;           ///< -p, --nprocs
  bool raw = false;            ///< --raw: also time the library called directly
  double timeout_seconds = 0;  ///< --timeout; 0: the communicator's default
};

/// Parses what the engine left (PerfOptions::unparsed): -h/--help, the ToolFlags, and the
/// tool's own flags through `own(flag, value)`, where `value()` takes the flag's argument and
/// `own` returns false for a flag it does not know. Returns the exit code when the tool should
/// stop (0 after --help; 1 after an unknown flag, with `usage` printed), else nullopt.
template <class Own>
std::optional<int> parse_tool_flags(const PerfOptions& perf, const char* tool, void (*usage)(), ToolFlags& flags,
                                    Own&& own) {
  for (std::size_t i = 0; i < perf.unparsed.size(); ++i) {
    const std::string& flag = perf.unparsed[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= perf.unparsed.size()) throw ConfigError("flag " + flag + " needs a value");
      return perf.unparsed[++i];
    };
    if (flag == "-h" || flag == "--help") {
      usage();
      return 0;
    } else if (flag == "-p" || flag == "--nprocs") {
      flags.processes = std::stoi(value());
    } else if (flag == "--raw") {
      flags.raw = true;
    } else if (flag == "--timeout") {
      flags.timeout_seconds = std::stod(value());
    } else if (!own(flag, value)) {
      std::fprintf(stderr, "%s: unknown flag '%s'\n", tool, flag.c_str());
      usage();
      return 1;
    }
  }
  return std::nullopt;
}

// ---- how bytes reach the backend's memory -----------------------------------------------------

/// Moves bytes between host staging memory and memory from `backend.allocate`. The default
/// serves host backends; a device backend specialises it (e.g. with cudaMemcpy).
template <class B>
struct HostTransfer {
  static_assert(B::memory_kind == MemoryKind::kHost,
                "specialise ncclkit::perf::HostTransfer<YourBackend> for a device backend");
  static void upload(B&, void* backend_memory, const void* host, std::size_t bytes) {
    if (bytes) std::memcpy(backend_memory, host, bytes);
  }
  static void download(B&, void* host, const void* backend_memory, std::size_t bytes) {
    if (bytes) std::memcpy(host, backend_memory, bytes);
  }
};

/// The stream the engine issues and times work on: for a device backend its comm_stream(), a
/// stream of the communicator's own, as nccl-tests times on a stream of its own (the default
/// stream of NCCL's backend is CUDA's legacy stream, which synchronises with every blocking
/// stream of the GPU); for a host backend its default stream (work runs inline, as a caller
/// without a stream gets it).
template <Backend B>
typename B::Stream work_stream(B& backend) {
  if constexpr (B::memory_kind == MemoryKind::kDevice) {
    return backend.comm_stream();
  } else {
    return backend.default_stream();
  }
}

// ---- implementations under test -----------------------------------------------------------------

/// One implementation of the collectives: ncclkit's backend, or a raw library driven in the
/// same harness. `issue` starts one collective on one of the engine's local ranks (`local`
/// indexes run_perf's backends; views of the backend's memory kind); `complete` waits for
/// everything issued on every local rank. With several local ranks (one thread driving several
/// devices, the perf tool's -g), the engine issues one call per local rank between
/// `begin_group` and `end_group` (NCCL's group calls), which must then be set. `supports` says
/// whether a case can run (else the table shows N/A).
struct Implementation {
  std::string name;
  std::function<void(int local, Collective, TensorView in, TensorView out, ReduceOp op, int root)> issue;
  std::function<void()> complete;
  std::function<void()> begin_group, end_group;
  std::function<bool(Collective, Placement, DataType, ReduceOp)> supports = [](Collective, Placement, DataType,
                                                                               ReduceOp) { return true; };
};

/// ncclkit's own collectives on each backend's work_stream(). `group`: what brackets one call
/// per backend when there are several (see Implementation).
template <Backend B>
Implementation backend_implementation(std::vector<B*> backends, std::string name = "ncclkit",
                                      std::function<void()> begin_group = {}, std::function<void()> end_group = {}) {
  Implementation impl;
  impl.name = std::move(name);
  impl.issue = [backends](int local, Collective c, TensorView in, TensorView out, ReduceOp op, int root) {
    B& backend = *backends[static_cast<std::size_t>(local)];
    const auto stream = work_stream(backend);
    switch (c) {
      case Collective::kAllReduce:
        return backend.all_reduce(in, out, op, stream);
      case Collective::kBroadcast:
        return backend.broadcast(in, out, root, stream);
      case Collective::kAllGather:
        return backend.all_gather(in, out, stream);
      case Collective::kReduceScatter:
        return backend.reduce_scatter(in, out, op, stream);
      case Collective::kReduce:
        if constexpr (requires { backend.reduce(in, out, op, root, stream); })
          return backend.reduce(in, out, op, root, stream);
        break;
      case Collective::kAllToAll:
        if constexpr (requires { backend.all_to_all(in, out, stream); }) return backend.all_to_all(in, out, stream);
        break;
    }
    throw ConfigError(std::string("this backend has no ") + std::string(name_of(c)));
  };
  impl.complete = [backends] {
    for (B* backend : backends) backend->synchronize(work_stream(*backend));
  };
  impl.begin_group = std::move(begin_group);
  impl.end_group = std::move(end_group);
  impl.supports = [](Collective c, Placement p, DataType, ReduceOp) {
    if (c == Collective::kReduce) return requires(B & b, TensorView v, ReduceOp o, typename B::Stream s) {
        b.reduce(v, v, o, 0, s);
      };
    if (c == Collective::kAllToAll) {
      return p == Placement::kOutOfPlace && requires(B & b, TensorView v, typename B::Stream s) {
        b.all_to_all(v, v, s);
      };
    }
    return true;
  };
  return impl;
}

// ---- results ------------------------------------------------------------------------------------

/// One measured (size, implementation, placement).
struct Measurement {
  double time_us = 0;    ///< median over rounds of the per-call time
  double algbw = 0;      ///< GB/s (1e9 bytes per second)
  double busbw = 0;      ///< GB/s
  long long wrong = -1;  ///< elements that differ from the reference; -1 = not checked
  bool ran = false;
};

/// One table row: a size, for one implementation, both placements.
struct Row {
  Collective collective{};
  DataType type{};
  ReduceOp op{};
  int root = -1;
  std::size_t bytes = 0;
  std::size_t count = 0;
  std::string implementation;
  Measurement out_of_place;
  Measurement in_place;
};

struct PerfSummary {
  std::vector<Row> rows;
  long long wrong = 0;       ///< sum of #wrong over all rows (the "Out of bounds values" line)
  long long checked = 0;     ///< measurements whose results were checked (none with -c 0)
  double average_busbw = 0;  ///< over every measured value of the first implementation
  /// No wrong value among those checked (true where nothing was checked: see `checked`).
  bool ok() const { return wrong == 0; }
  /// The tools' exit code: 2 where a checked value was wrong, else 0 (an unchecked run says
  /// "not checked" in its footer instead of "OK").
  int exit_code() const { return ok() ? 0 : 2; }
  /// The footer's verdict: "0 OK", "12 FAILED", or "not checked" where no result was.
  std::string verdict() const {
    if (checked == 0) return "not checked";
    return std::to_string(wrong) + (wrong == 0 ? " OK" : " FAILED");
  }
};

namespace detail {

// ---- reference values ---------------------------------------------------------------------------

inline std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

/// The value rank `rank` holds at input index `index`: small integers, exact in every type, so
/// sums of up to 31 ranks fit int8 and products of +-1 and +-2 stay exact in floats.
inline double input_value(int rank, std::size_t index, DataType type, ReduceOp op) {
  const std::uint64_t h = mix((static_cast<std::uint64_t>(rank) << 40) ^ index ^ 0x9e3779b97f4a7c15ULL);
  const bool is_unsigned = type == DataType::kUint8 || type == DataType::kUint32 || type == DataType::kUint64;
  if (op == ReduceOp::kProd) {
    const double magnitude = (h % 8 == 0) ? 2.0 : 1.0;
    return is_unsigned ? magnitude : ((h >> 8) & 1 ? magnitude : -magnitude);
  }
  const double v = static_cast<double>(h % 9);
  return is_unsigned ? v : v - 4.0;
}

template <class T>
T from_double(double v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return T(static_cast<float>(v));
  } else if constexpr (std::is_integral_v<T>) {
    // Through int64: conversion to a narrower integer wraps (two's complement, C++20).
    return static_cast<T>(static_cast<std::int64_t>(v));
  } else {
    return static_cast<T>(v);
  }
}
template <class T>
double to_double(T v) {
  if constexpr (std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>) {
    return static_cast<double>(static_cast<float>(v));
  } else {
    return static_cast<double>(v);
  }
}

/// acc op value, for one step of a reference reduction (kAvg sums; the caller divides).
template <class Acc>
Acc reduce_step(Acc acc, Acc value, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return acc + value;
    case ReduceOp::kProd:
      return acc * value;
    case ReduceOp::kMin:
      return std::min(acc, value);
    case ReduceOp::kMax:
      return std::max(acc, value);
  }
  return acc;
}

/// The reduction of rank values at `index`, as the element type would hold it: integers
/// exactly in int64 (so an integer average truncates like the collective), floats in double.
inline double reference_reduction(DataType type, ReduceOp op, int nranks, std::size_t index) {
  auto reduce = [&]<class Acc>() {
    Acc acc = static_cast<Acc>(input_value(0, index, type, op));
    for (int r = 1; r < nranks; ++r) acc = reduce_step(acc, static_cast<Acc>(input_value(r, index, type, op)), op);
    if (op == ReduceOp::kAvg) acc /= nranks;
    return static_cast<double>(acc);
  };
  return is_floating(type) ? reduce.template operator()<double>() : reduce.template operator()<std::int64_t>();
}

/// Absolute tolerance of a result: integers and sums of small integers are exact; the average
/// of floats is rounded once per rank (scaled inputs), at most |value| <= 4 each.
inline double tolerance(DataType type, ReduceOp op, int nranks) {
  if (!is_floating(type) || op != ReduceOp::kAvg) return 0.0;
  const double unit = type == DataType::kFloat16    ? 0x1p-10
                      : type == DataType::kBFloat16 ? 0x1p-7
                      : type == DataType::kFloat32  ? 0x1p-23
                                                    : 0x1p-52;
  return 4.0 * nranks * unit;
}

/// Per-rank element count and the sizes of the buffers for `bytes` of collective `c`.
struct Shape {
  std::size_t count = 0;      ///< nccl-tests' "count": elements per rank part (partitioned) or total
  std::size_t in_elems = 0;   ///< input buffer elements
  std::size_t out_elems = 0;  ///< output buffer elements
  std::size_t bytes = 0;      ///< nccl-tests' "size" (after rounding to whole elements and parts)
};

inline Shape shape_of(Collective c, std::size_t bytes, DataType type, int nranks) {
  const std::size_t element = size_of(type);
  Shape s;
  if (is_partitioned(c)) {
    s.count = bytes / element / static_cast<std::size_t>(nranks);
    const std::size_t total = s.count * static_cast<std::size_t>(nranks);
    s.in_elems = c == Collective::kAllGather ? s.count : total;
    s.out_elems = c == Collective::kReduceScatter ? s.count : total;
    s.bytes = total * element;
  } else {
    s.count = bytes / element;
    s.in_elems = s.out_elems = s.count;
    s.bytes = s.count * element;
  }
  return s;
}

inline std::string date_string() {
  char text[32];
  const std::time_t now = std::time(nullptr);
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%S", std::localtime(&now));
  return text;
}

}  // namespace detail

// ---- the engine -----------------------------------------------------------------------------------

/// Runs the sweep that `options` describes over `implementations` (the first is the one the
/// footer's average refers to) on this thread's `backends`: its local ranks of one job (one,
/// or one per device when one thread drives several; `begin_group` and `end_group` then
/// bracket the engine's own calls on them, as in Implementation). Prints the table on rank 0
/// (to `out`), writes CSV/JSON if asked, and returns every row. Collective: every rank calls it
/// with the same options. Throws what the backend throws (CommError on failure).
template <Backend B>
PerfSummary run_perf(std::vector<B*> backends, std::vector<Implementation> implementations, const PerfOptions& options,
                     std::function<void()> begin_group = {}, std::function<void()> end_group = {},
                     std::FILE* out = stdout) {
  using Clock = std::chrono::steady_clock;
  if (backends.empty()) throw ConfigError("run_perf: no backend");
  const std::size_t locals = backends.size();
  const bool grouped = locals > 1;
  if (grouped && !(begin_group && end_group)) {
    throw ConfigError("run_perf: several local ranks need group calls (begin_group, end_group)");
  }
  for (const auto& impl : implementations) {
    if (grouped && !(impl.begin_group && impl.end_group)) {
      throw ConfigError("run_perf: implementation '" + impl.name + "' has no group calls for several local ranks");
    }
  }
  const int nranks = backends.front()->size();
  const bool printer = backends.front()->rank() == 0;
  auto rank_of = [&](std::size_t local) { return backends[local]->rank(); };
  if (options.root < 0 || options.root >= nranks) {
    throw ConfigError("-r " + std::to_string(options.root) + " is outside [0, " + std::to_string(nranks) + ")");
  }
  if (implementations.empty()) throw ConfigError("run_perf: no implementation to time");
  const bool several = implementations.size() > 1;

  // Buffers sized for the largest case, plus a guard zone behind the output, per local rank.
  constexpr std::size_t kGuardBytes = 64;
  constexpr unsigned char kPoison = 0xA5;
  const std::size_t max_bytes = options.max_bytes;
  const std::size_t buffer_bytes = max_bytes + kGuardBytes + 64;
  struct Buffers {
    B* backend = nullptr;
    void* send = nullptr;
    void* recv = nullptr;
    void* scratch = nullptr;  // lining ranks up and combining times (through the backend itself)
  };
  struct FreeAll {
    std::vector<Buffers> list;
    ~FreeAll() {
      for (auto& b : list) {
        void* const owned[] = {b.send, b.recv, b.scratch};
        for (void* q : owned)
          if (q != nullptr) b.backend->deallocate(q);
      }
    }
  } buffers;
  for (B* backend : backends) {
    Buffers& b = buffers.list.emplace_back();
    b.backend = backend;
    b.send = backend->allocate(buffer_bytes);
    b.recv = backend->allocate(buffer_bytes);
    b.scratch = backend->allocate(64 * sizeof(double));
  }
  auto buffer = [&](std::size_t local) -> Buffers& { return buffers.list[local]; };
  std::vector<unsigned char> staging(buffer_bytes);
  std::vector<unsigned char> poison(buffer_bytes, kPoison);

  // call(j) for every local rank j, inside begin/end when there are several.
  auto grouped_calls = [&](const std::function<void()>& begin, const std::function<void()>& end, auto&& call) {
    if (grouped) begin();
    for (std::size_t j = 0; j < locals; ++j) call(j);
    if (grouped) end();
  };
  // One backend call per local rank (the engine's own: lining up, combining).
  auto on_every_rank = [&](auto&& call) { grouped_calls(begin_group, end_group, call); };
  auto synchronize_all = [&] {
    for (B* backend : backends) backend->synchronize(work_stream(*backend));
  };
  auto issue_all = [&](Implementation& impl, Collective c, const std::vector<TensorView>& in,
                       const std::vector<TensorView>& out, ReduceOp op, int root) {
    grouped_calls(impl.begin_group, impl.end_group,
                  [&](std::size_t j) { impl.issue(static_cast<int>(j), c, in[j], out[j], op, root); });
  };
  // `per_rank(j)` is local rank j's part of a double vector of `n` values; every rank's parts
  // are reduced with `how` and the result returned.
  auto reduce_doubles = [&](std::size_t n, ReduceOp how, auto&& per_rank) {
    std::vector<double> host(n);
    for (std::size_t j = 0; j < locals; ++j) {
      host = per_rank(j);
      HostTransfer<B>::upload(*backends[j], buffer(j).scratch, host.data(), n * sizeof(double));
    }
    on_every_rank([&](std::size_t j) {
      TensorView view{buffer(j).scratch, n, DataType::kFloat64, B::memory_kind};
      backends[j]->all_reduce(view, view, how, work_stream(*backends[j]));
    });
    synchronize_all();
    HostTransfer<B>::download(*backends.front(), host.data(), buffer(0).scratch, n * sizeof(double));
    return host;
  };

  auto line_up = [&] {
    on_every_rank([&](std::size_t j) {
      TensorView view{buffer(j).scratch, 1, DataType::kFloat64, B::memory_kind};
      backends[j]->all_reduce(view, view, ReduceOp::kSum, work_stream(*backends[j]));
    });
    synchronize_all();
  };
  // Combines per-rank values (one per slot; this thread measured them for all its local
  // ranks) as -a says.
  auto combine = [&](std::vector<double>& values) {
    const ReduceOp how = options.average == 2 ? ReduceOp::kMin : options.average == 3 ? ReduceOp::kMax : ReduceOp::kSum;
    const std::vector<double> zeros(values.size(), 0.0);
    const auto result = reduce_doubles(
        values.size(), how, [&](std::size_t j) { return options.average == 0 && rank_of(j) != 0 ? zeros : values; });
    for (std::size_t i = 0; i < values.size(); ++i) values[i] = options.average == 1 ? result[i] / nranks : result[i];
  };

  PerfSummary summary;
  double busbw_sum = 0;
  int busbw_count = 0;

  auto print_header = [&](Collective c, DataType type, ReduceOp op) {
    if (!printer) return;
    std::fprintf(out, "#\n# %s, %s, %s, %d ranks, implementations:", std::string(name_of(c)).c_str(),
                 std::string(name_of(type)).c_str(), is_reduction(c) ? std::string(name_of(op)).c_str() : "none",
                 nranks);
    for (const auto& impl : implementations) std::fprintf(out, " %s", impl.name.c_str());
    std::fprintf(out, "\n#\n");
    std::fprintf(out,
                 "#                                                              out-of-place                       "
                 "in-place          \n");
    std::fprintf(out,
                 "#       size         count      type   redop    root     time   algbw   busbw #wrong     time   "
                 "algbw   busbw #wrong%s\n",
                 several ? "  impl" : "");
    std::fprintf(out,
                 "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  "
                 "(GB/s)  (GB/s)       \n");
  };
  auto print_row = [&](const Row& row) {
    if (!printer) return;
    std::fprintf(out, "%12zu  %12zu  %8s  %6s  %6d", row.bytes, row.count, std::string(name_of(row.type)).c_str(),
                 is_reduction(row.collective) ? std::string(name_of(row.op)).c_str() : "none", row.root);
    for (const Measurement* m : {&row.out_of_place, &row.in_place}) {
      if (!m->ran) {
        std::fprintf(out, "  %7s  %6s  %6s  %5s", "N/A", "N/A", "N/A", "N/A");
        continue;
      }
      char time[16];
      std::snprintf(time, sizeof time,
                    m->time_us >= 10000 ? "%7.0f"
                    : m->time_us >= 100 ? "%7.1f"
                                        : "%7.2f",
                    m->time_us);
      char wrong[16];
      if (m->wrong < 0)
        std::snprintf(wrong, sizeof wrong, "%5s", "N/A");
      else
        std::snprintf(wrong, sizeof wrong, "%5lld", m->wrong);
      std::fprintf(out, "  %7s  %6.2f  %6.2f  %5s", time, m->algbw, m->busbw, wrong);
    }
    if (several) std::fprintf(out, "  %s", row.implementation.c_str());
    std::fprintf(out, "\n");
    std::fflush(out);
  };

  // Where a case's input and output live in local rank j's buffers, for `placement`.
  struct Placed {
    void* in = nullptr;
    void* out = nullptr;
  };
  auto place = [&](std::size_t j, Collective c, const detail::Shape& shape, DataType type, Placement placement) {
    const std::size_t element = size_of(type);
    Placed p{buffer(j).send, buffer(j).recv};
    if (placement == Placement::kInPlace) {
      unsigned char* own_part =
          static_cast<unsigned char*>(buffer(j).recv) + static_cast<std::size_t>(rank_of(j)) * shape.count * element;
      p.in = buffer(j).recv;  // all_reduce, broadcast, reduce, reduce_scatter: the input lives in recv
      if (c == Collective::kAllGather) p.in = own_part;
      if (c == Collective::kReduceScatter) p.out = own_part;
    }
    return p;
  };

  // Fills the inputs (and poisons the outputs) of every local rank for a correctness run;
  // returns their #wrong after it.
  auto check_once = [&](Implementation& impl, Collective c, DataType type, ReduceOp op, const detail::Shape& shape,
                        Placement placement) -> long long {
    const std::size_t element = size_of(type);
    const int root = is_rooted(c) ? options.root : -1;
    std::vector<TensorView> ins, outs;
    std::vector<Placed> placed;
    for (std::size_t j = 0; j < locals; ++j) {
      const int rank = rank_of(j);
      B& backend = *backends[j];
      std::vector<unsigned char> input(shape.in_elems * element);
      visit_data_type(type, [&]<class T>() {
        T* values = reinterpret_cast<T*>(input.data());
        for (std::size_t i = 0; i < shape.in_elems; ++i)
          values[i] = detail::from_double<T>(detail::input_value(rank, i, type, op));
      });
      const Placed p = place(j, c, shape, type, placement);
      void* recv = buffer(j).recv;
      HostTransfer<B>::upload(backend, recv, poison.data(), shape.out_elems * element + kGuardBytes);
      if (placement == Placement::kOutOfPlace) {
        HostTransfer<B>::upload(backend, p.in, input.data(), input.size());
      } else {
        if (c == Collective::kReduceScatter) {
          // The input is the whole buffer; the guard goes behind it.
          HostTransfer<B>::upload(backend, recv, poison.data(), shape.in_elems * element + kGuardBytes);
        }
        if (!(c == Collective::kBroadcast && rank != options.root))
          HostTransfer<B>::upload(backend, p.in, input.data(), input.size());
      }
      TensorView in{p.in, shape.in_elems, type, B::memory_kind};
      if (c == Collective::kBroadcast && rank != options.root && placement == Placement::kOutOfPlace) {
        in = TensorView{buffer(j).send, shape.in_elems, type, B::memory_kind};
      }
      ins.push_back(in);
      outs.push_back(TensorView{p.out, shape.out_elems, type, B::memory_kind});
      placed.push_back(p);
    }
    issue_all(impl, c, ins, outs, op, root);
    impl.complete();
    long long wrong = 0;
    for (std::size_t j = 0; j < locals; ++j) {
      const int rank = rank_of(j);
      void* recv = buffer(j).recv;
      // Download the output and the guard behind the buffer the result lives in.
      const std::size_t checked_elems = shape.out_elems;
      const bool whole_recv_checked = placement == Placement::kInPlace && c == Collective::kReduceScatter;
      const std::size_t download_bytes =
          (whole_recv_checked ? shape.in_elems : shape.out_elems) * element + kGuardBytes;
      HostTransfer<B>::download(*backends[j], staging.data(), recv, download_bytes);
      const unsigned char* result =
          staging.data() + (static_cast<unsigned char*>(placed[j].out) - static_cast<unsigned char*>(recv));
      if (c == Collective::kReduce && rank != options.root) {
        // The output of non-roots is scratch: only the guard is checked.
      } else {
        const double tol = detail::tolerance(type, op, nranks);
        visit_data_type(type, [&]<class T>() {
          for (std::size_t i = 0; i < checked_elems; ++i) {
            double expected = 0;
            switch (c) {
              case Collective::kAllReduce:
              case Collective::kReduce:
                expected = detail::reference_reduction(type, op, nranks, i);
                break;
              case Collective::kBroadcast:
                expected = detail::input_value(options.root, i, type, op);
                break;
              case Collective::kAllGather:
                expected = detail::input_value(static_cast<int>(i / shape.count), i % shape.count, type, op);
                break;
              case Collective::kReduceScatter:
                expected =
                    detail::reference_reduction(type, op, nranks, static_cast<std::size_t>(rank) * shape.count + i);
                break;
              case Collective::kAllToAll:
                expected =
                    detail::input_value(static_cast<int>(i / shape.count),
                                        static_cast<std::size_t>(rank) * shape.count + i % shape.count, type, op);
                break;
            }
            T got_value;
            std::memcpy(&got_value, result + i * element, element);
            const double got = detail::to_double(got_value);
            const double want = detail::to_double(detail::from_double<T>(expected));
            const bool same_inf = std::isinf(got) && std::isinf(want) && (got > 0) == (want > 0);
            if (!same_inf && !(std::fabs(got - want) <= tol)) ++wrong;
          }
        });
      }
      const std::size_t guard_at = download_bytes - kGuardBytes;
      for (std::size_t i = 0; i < kGuardBytes; ++i) {
        if (staging[guard_at + i] != kPoison) ++wrong;
      }
    }
    return wrong;
  };

  for (Collective c : options.collectives) {
    const std::vector<ReduceOp> ops = is_reduction(c) ? options.ops : std::vector<ReduceOp>{ReduceOp::kSum};
    for (DataType type : options.types) {
      for (ReduceOp op : ops) {
        print_header(c, type, op);
        std::vector<std::size_t> sizes;
        for (std::size_t bytes = options.min_bytes; bytes <= options.max_bytes;) {
          sizes.push_back(bytes);
          const std::size_t next = options.step_bytes
                                       ? bytes + options.step_bytes
                                       : static_cast<std::size_t>(static_cast<double>(bytes) * options.step_factor);
          if (next <= bytes) break;
          bytes = next;
        }
        for (std::size_t requested : sizes) {
          const detail::Shape shape = detail::shape_of(c, requested, type, nranks);
          std::vector<Row> rows(implementations.size());
          for (std::size_t k = 0; k < implementations.size(); ++k) {
            rows[k] =
                Row{c,  type, op, is_rooted(c) ? options.root : -1, shape.bytes, shape.count, implementations[k].name,
                    {}, {}};
          }
          for (Placement placement : {Placement::kOutOfPlace, Placement::kInPlace}) {
            if (placement == Placement::kOutOfPlace ? !options.out_of_place : !options.in_place) continue;
            std::vector<bool> runs(implementations.size());
            for (std::size_t k = 0; k < implementations.size(); ++k)
              runs[k] = implementations[k].supports(c, placement, type, op);
            // Correctness first (it also warms the path up).
            std::vector<double> wrong(implementations.size(), 0.0);
            for (std::size_t k = 0; k < implementations.size(); ++k) {
              if (runs[k] && options.check)
                wrong[k] = static_cast<double>(check_once(implementations[k], c, type, op, shape, placement));
            }
            if (options.check) {
              // Sum the wrong counts over ranks (combine() would average them); this thread's
              // count goes in through its first local rank.
              const std::vector<double> zeros(wrong.size(), 0.0);
              wrong =
                  reduce_doubles(wrong.size(), ReduceOp::kSum, [&](std::size_t j) { return j == 0 ? wrong : zeros; });
            }
            // Timed runs on whatever the buffers hold now.
            std::vector<TensorView> ins, outs;
            for (std::size_t j = 0; j < locals; ++j) {
              const Placed p = place(j, c, shape, type, placement);
              ins.push_back(TensorView{p.in, shape.in_elems, type, B::memory_kind});
              outs.push_back(TensorView{p.out, shape.out_elems, type, B::memory_kind});
            }
            const int root = is_rooted(c) ? options.root : -1;
            for (std::size_t k = 0; k < implementations.size(); ++k) {
              if (!runs[k]) continue;
              for (int i = 0; i < options.warmup; ++i) issue_all(implementations[k], c, ins, outs, op, root);
              implementations[k].complete();
            }
            const int batch = (options.iters + options.rounds - 1) / options.rounds;
            std::vector<std::vector<double>> samples(implementations.size());
            for (int round = 0; round < options.rounds; ++round) {
              std::vector<double> times(implementations.size(), 0.0);
              // Rotate which implementation goes first, so neither always follows the other.
              for (std::size_t step = 0; step < implementations.size(); ++step) {
                const std::size_t k = (step + static_cast<std::size_t>(round)) % implementations.size();
                if (!runs[k]) continue;
                line_up();
                const auto start = Clock::now();
                for (int i = 0; i < batch; ++i) issue_all(implementations[k], c, ins, outs, op, root);
                implementations[k].complete();
                times[k] = std::chrono::duration<double, std::micro>(Clock::now() - start).count() / batch;
              }
              combine(times);
              for (std::size_t k = 0; k < implementations.size(); ++k) samples[k].push_back(times[k]);
            }
            for (std::size_t k = 0; k < implementations.size(); ++k) {
              Measurement& m = placement == Placement::kOutOfPlace ? rows[k].out_of_place : rows[k].in_place;
              if (!runs[k]) continue;
              auto sorted = samples[k];
              std::sort(sorted.begin(), sorted.end());
              const std::size_t mid = sorted.size() / 2;
              m.time_us = sorted.size() % 2 ? sorted[mid] : 0.5 * (sorted[mid - 1] + sorted[mid]);
              m.algbw = m.time_us > 0 ? static_cast<double>(shape.bytes) / (m.time_us * 1e3) : 0.0;
              m.busbw = m.algbw * busbw_factor(c, nranks);
              m.wrong = options.check ? static_cast<long long>(wrong[k]) : -1;
              m.ran = true;
              if (m.wrong > 0) summary.wrong += m.wrong;
              if (m.wrong >= 0) ++summary.checked;
              if (k == 0) {
                busbw_sum += m.busbw;
                ++busbw_count;
              }
            }
          }
          for (const Row& row : rows) {
            print_row(row);
            summary.rows.push_back(row);
          }
        }
      }
    }
  }
  summary.average_busbw = busbw_count ? busbw_sum / busbw_count : 0.0;

  if (printer) {
    if (several) {
      // Side by side: the first implementation's time over each other's (lower is better).
      std::fprintf(out, "#\n# Time of '%s' relative to the others (median time ratio; < 1 means faster):\n",
                   implementations[0].name.c_str());
      std::fprintf(out, "# %-14s %-9s %-5s %12s %-10s %12s %10s\n", "collective", "type", "redop", "size(B)", "versus",
                   "out-of-place", "in-place");
      const std::size_t stride = implementations.size();
      for (std::size_t i = 0; i + stride <= summary.rows.size(); i += stride) {
        const Row& base = summary.rows[i];
        for (std::size_t k = 1; k < stride; ++k) {
          const Row& other = summary.rows[i + k];
          auto ratio = [](const Measurement& a, const Measurement& b) {
            char text[16];
            if (a.ran && b.ran && b.time_us > 0)
              std::snprintf(text, sizeof text, "%.3f", a.time_us / b.time_us);
            else
              std::snprintf(text, sizeof text, "N/A");
            return std::string(text);
          };
          std::fprintf(out, "# %-14s %-9s %-5s %12zu %-10s %12s %10s\n", std::string(name_of(base.collective)).c_str(),
                       std::string(name_of(base.type)).c_str(),
                       is_reduction(base.collective) ? std::string(name_of(base.op)).c_str() : "none", base.bytes,
                       other.implementation.c_str(), ratio(base.out_of_place, other.out_of_place).c_str(),
                       ratio(base.in_place, other.in_place).c_str());
        }
      }
    }
    std::fprintf(out, "# Out of bounds values : %s\n", summary.verdict().c_str());
    std::fprintf(out, "# Avg bus bandwidth    : %g \n#\n", summary.average_busbw);
    std::fflush(out);

    const std::string date = detail::date_string();
    if (!options.csv_path.empty()) {
      std::FILE* csv = std::fopen(options.csv_path.c_str(), "w");
      if (!csv) throw ConfigError("cannot write --csv file '" + options.csv_path + "'");
      std::fprintf(csv,
                   "date,collective,implementation,placement,type,redop,root,nranks,bytes,count,time_us,algbw_gbs,"
                   "busbw_gbs,wrong\n");
      for (const Row& row : summary.rows) {
        for (Placement p : {Placement::kOutOfPlace, Placement::kInPlace}) {
          const Measurement& m = p == Placement::kOutOfPlace ? row.out_of_place : row.in_place;
          if (!m.ran) continue;
          std::fprintf(csv, "%s,%s,%s,%s,%s,%s,%d,%d,%zu,%zu,%.3f,%.4f,%.4f,%lld\n", date.c_str(),
                       std::string(name_of(row.collective)).c_str(), row.implementation.c_str(),
                       p == Placement::kOutOfPlace ? "out-of-place" : "in-place",
                       std::string(name_of(row.type)).c_str(), std::string(name_of(row.op)).c_str(), row.root, nranks,
                       row.bytes, row.count, m.time_us, m.algbw, m.busbw, m.wrong);
        }
      }
      std::fclose(csv);
    }
    if (!options.json_path.empty()) {
      std::FILE* json = std::fopen(options.json_path.c_str(), "w");
      if (!json) throw ConfigError("cannot write --json file '" + options.json_path + "'");
      std::fprintf(json, "{\"date\": \"%s\", \"nranks\": %d, \"rows\": [", date.c_str(), nranks);
      bool first = true;
      for (const Row& row : summary.rows) {
        for (Placement p : {Placement::kOutOfPlace, Placement::kInPlace}) {
          const Measurement& m = p == Placement::kOutOfPlace ? row.out_of_place : row.in_place;
          if (!m.ran) continue;
          std::fprintf(
              json,
              "%s\n  {\"collective\": \"%s\", \"implementation\": \"%s\", \"placement\": \"%s\", \"type\": \"%s\", "
              "\"redop\": \"%s\", \"root\": %d, \"bytes\": %zu, \"count\": %zu, \"time_us\": %.3f, "
              "\"algbw_gbs\": %.4f, \"busbw_gbs\": %.4f, \"wrong\": %lld}",
              first ? "" : ",", std::string(name_of(row.collective)).c_str(), row.implementation.c_str(),
              p == Placement::kOutOfPlace ? "out-of-place" : "in-place", std::string(name_of(row.type)).c_str(),
              std::string(name_of(row.op)).c_str(), row.root, row.bytes, row.count, m.time_us, m.algbw, m.busbw,
              m.wrong);
          first = false;
        }
      }
      std::fprintf(json, "\n]}\n");
      std::fclose(json);
    }
  }
  return summary;
}

/// One local rank.
template <Backend B>
PerfSummary run_perf(B& backend, std::vector<Implementation> implementations, const PerfOptions& options,
                     std::FILE* out = stdout) {
  return run_perf(std::vector<B*>{&backend}, std::move(implementations), options, {}, {}, out);
}

}  // namespace ncclkit::perf
