#pragma once
/// The launcher's command line: `LaunchOptions` and `parse_launch_args()`.
///
///   ncclkit-run [--nproc-per-node N|auto] [--nnodes M --node-rank K]
///               [--master-addr HOST --master-port P | --rdzv-dir /shared/dir]
///               [--max-restarts R] [--log-dir DIR] [--grace-period S] [--rdzv-timeout S]
///               [--check] [--] program args...
///
/// Flags take their value as the next argument or after '=' (`--nnodes=2`), and torchrun's
/// spellings with underscores (`--nproc_per_node`) are accepted too. The first argument that
/// is not a flag (or everything after `--`) is the worker program and its arguments.
/// docs/launch.md describes every flag.

#include <chrono>       // std::chrono::milliseconds
#include <cmath>        // std::isfinite
#include <cstdlib>      // std::strtod
#include <optional>     // std::optional
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/bootstrap/local_gpus.hpp"  // GpuInventory
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/knobs.hpp"

namespace ncclkit::launch {

/// Where the nodes' launchers (and the workers) meet.
enum class RendezvousKind {
  kStandalone,  ///< one node and no address: the launcher keeps a private store
  kTcp,         ///< --master-addr/--master-port: a TcpStore that node 0's launcher hosts
  kFolder,      ///< --rdzv-dir: a FileStore in a folder every node can see
};

/// Everything the command line says. Defaults are the values used when a flag is absent.
struct LaunchOptions {
  /// Workers on this node; nullopt means `auto` (one per visible GPU, 1 without GPUs).
  std::optional<int> nproc_per_node;
  int nnodes = 1;
  /// This node's index; nullopt when not given (allowed with --rdzv-dir, where launchers are
  /// numbered in the order they arrive, and for a single node).
  std::optional<int> node_rank;
  std::string master_addr;
  int master_port = 29500;  ///< torchrun's default, so existing firewall rules keep working
  std::string rdzv_dir;
  int max_restarts = 0;
  std::string log_dir;
  /// Between SIGTERM and SIGKILL when the group is stopped.
  std::chrono::milliseconds grace_period = std::chrono::seconds(5);
  /// Limit of every wait for the other nodes (rendezvous, restarts, --check); the launcher's
  /// stores take it too. NCCLKIT_STORE_TIMEOUT overrides it, as it does every store's timeout.
  std::chrono::milliseconds rdzv_timeout = knob_default<std::chrono::milliseconds>("NCCLKIT_STORE_TIMEOUT");
  bool check = false;
  bool help = false;
  bool version = false;
  /// The worker program and its arguments (argv[0] is looked up in PATH).
  std::vector<std::string> program;

  RendezvousKind rendezvous() const {
    if (!rdzv_dir.empty()) return RendezvousKind::kFolder;
    if (!master_addr.empty()) return RendezvousKind::kTcp;
    return RendezvousKind::kStandalone;
  }
};

/// The --help text.
inline std::string launch_usage() {
  return R"(usage: ncclkit-run [options] [--] program [args...]
       ncclkit-run --check [options]

Starts one worker process per GPU (or as many as asked) on this node, gives each its place in
the job through the environment (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
GROUP_WORLD_SIZE, NODE_RANK, MASTER_ADDR/MASTER_PORT or NCCLKIT_INIT_URL), prefixes their output
with the rank, and stops all of them when one fails.

options:
  --nproc-per-node N|auto  workers on this node (default auto: one per visible GPU, 1 without)
  --nnodes M               number of nodes, each running one ncclkit-run (default 1)
  --node-rank K            this node's index in [0, M); required with --master-addr when M > 1
  --master-addr HOST       node 0's address: its launcher hosts the TCP store there
  --master-port P          the store's port (default 29500)
  --rdzv-dir DIR           rendezvous through files in DIR, a folder every node sees
                           (instead of --master-addr); reruns in the same DIR work
  --max-restarts R         restart the whole group up to R times after a failure (default 0)
  --log-dir DIR            also write each rank's output to DIR/rank_<R>.log
  --grace-period S         seconds between SIGTERM and SIGKILL when stopping workers (default 5)
  --rdzv-timeout S         seconds to wait for the other nodes (default 300; NCCLKIT_STORE_TIMEOUT,
                           when set, overrides it)
  --check                  check this node and the connections between nodes, print a report
  --help, --version

exit status: 0 when every worker succeeded; else the first failed worker's status (a signal S
gives 128+S, like a shell); 1 when the launcher itself failed (rendezvous, store); 2 for a
usage error. See docs/launch.md.
)";
}

namespace detail {

inline int parse_count_flag(std::string_view flag, const std::string& value, int minimum, int maximum) {
  auto number = parse_int(value);
  if (!number || *number < minimum || *number > maximum) {
    throw ConfigError("ncclkit-run: " + std::string(flag) + " '" + value + "' must be a whole number in [" +
                      std::to_string(minimum) + ", " + std::to_string(maximum) + "]");
  }
  return static_cast<int>(*number);
}

inline std::chrono::milliseconds parse_seconds_flag(std::string_view flag, const std::string& value) {
  char* end = nullptr;
  const double seconds = std::strtod(value.c_str(), &end);
  if (value.empty() || end != value.c_str() + value.size() || !std::isfinite(seconds) || seconds < 0 || seconds > 1e8) {
    throw ConfigError("ncclkit-run: " + std::string(flag) + " '" + value + "' must be a number of seconds, e.g. " +
                      std::string(flag) + " 30");
  }
  return std::chrono::milliseconds(static_cast<long long>(seconds * 1000.0 + 0.5));
}

}  // namespace detail

/// Parses the arguments after the program name (argv[1..]). Throws ConfigError naming the flag
/// and the value at fault; contradictions between flags (both --master-addr and --rdzv-dir,
/// --node-rank >= --nnodes, no program without --check) are errors too.
inline LaunchOptions parse_launch_args(const std::vector<std::string>& args) {
  LaunchOptions options;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-' || arg[1] != '-') {
      if (!arg.empty() && arg[0] == '-' && arg.size() > 1) {
        throw ConfigError("ncclkit-run: unknown option '" + arg + "' (options start with --; see --help)");
      }
      break;  // the program
    }
    std::string name = arg;
    std::optional<std::string> inline_value;
    if (auto eq = name.find('='); eq != std::string::npos) {
      inline_value = name.substr(eq + 1);
      name.resize(eq);
    }
    for (auto& c : name)
      if (c == '_') c = '-';  // torchrun's --nproc_per_node
    auto value = [&]() -> std::string {
      if (inline_value) return *inline_value;
      if (i + 1 >= args.size()) throw ConfigError("ncclkit-run: " + name + " needs a value (see --help)");
      return args[++i];
    };
    auto no_value = [&]() {
      if (inline_value) throw ConfigError("ncclkit-run: " + name + " takes no value");
    };
    if (name == "--nproc-per-node") {
      std::string v = value();
      if (v == "auto" || v == "gpu") {
        options.nproc_per_node.reset();
      } else {
        options.nproc_per_node = detail::parse_count_flag(name, v, 1, 4096);
      }
    } else if (name == "--nnodes") {
      std::string v = value();
      if (v.find(':') != std::string::npos) {
        throw ConfigError("ncclkit-run: --nnodes '" + v +
                          "': elastic ranges (MIN:MAX) are not supported; give the number of nodes");
      }
      options.nnodes = detail::parse_count_flag(name, v, 1, 1 << 20);
    } else if (name == "--node-rank") {
      options.node_rank = detail::parse_count_flag(name, value(), 0, 1 << 20);
    } else if (name == "--master-addr") {
      options.master_addr = value();
      if (options.master_addr.empty()) throw ConfigError("ncclkit-run: --master-addr is empty");
    } else if (name == "--master-port") {
      options.master_port = detail::parse_count_flag(name, value(), 1, 65535);
    } else if (name == "--rdzv-dir") {
      options.rdzv_dir = value();
      if (options.rdzv_dir.empty()) throw ConfigError("ncclkit-run: --rdzv-dir is empty");
    } else if (name == "--max-restarts") {
      options.max_restarts = detail::parse_count_flag(name, value(), 0, 1 << 20);
    } else if (name == "--log-dir") {
      options.log_dir = value();
      if (options.log_dir.empty()) throw ConfigError("ncclkit-run: --log-dir is empty");
    } else if (name == "--grace-period") {
      options.grace_period = detail::parse_seconds_flag(name, value());
    } else if (name == "--rdzv-timeout") {
      options.rdzv_timeout = detail::parse_seconds_flag(name, value());
      if (options.rdzv_timeout.count() == 0) throw ConfigError("ncclkit-run: --rdzv-timeout must be above 0");
    } else if (name == "--check") {
      no_value();
      options.check = true;
    } else if (name == "--help") {
      no_value();
      options.help = true;
    } else if (name == "--version") {
      no_value();
      options.version = true;
    } else {
      throw ConfigError("ncclkit-run: unknown option '" + arg + "' (see --help)");
    }
  }
  options.program.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (options.help || options.version) return options;
  options.rdzv_timeout = environment_overrides(knob("NCCLKIT_STORE_TIMEOUT"), options.rdzv_timeout);

  if (!options.master_addr.empty() && !options.rdzv_dir.empty()) {
    throw ConfigError(
        "ncclkit-run: give either --master-addr (a TCP store) or --rdzv-dir (a shared folder), "
        "not both");
  }
  if (options.node_rank && *options.node_rank >= options.nnodes) {
    throw ConfigError("ncclkit-run: --node-rank " + std::to_string(*options.node_rank) + " must be below --nnodes " +
                      std::to_string(options.nnodes));
  }
  if (options.nnodes > 1 && options.rendezvous() == RendezvousKind::kStandalone) {
    throw ConfigError("ncclkit-run: --nnodes " + std::to_string(options.nnodes) +
                      " needs a place where the nodes meet: --master-addr HOST (node 0's address) "
                      "with --node-rank, or --rdzv-dir DIR (a folder on a shared file system)");
  }
  if (options.nnodes > 1 && options.rendezvous() == RendezvousKind::kTcp && !options.node_rank) {
    throw ConfigError("ncclkit-run: with --master-addr and --nnodes " + std::to_string(options.nnodes) +
                      ", give --node-rank K (0 on the node at --master-addr, which hosts the store); "
                      "under SLURM: --node-rank $SLURM_NODEID");
  }
  if (options.check && !options.program.empty()) {
    throw ConfigError("ncclkit-run: --check runs no program, but '" + options.program.front() +
                      "' was given; drop one of them");
  }
  if (!options.check && options.program.empty()) {
    throw ConfigError(
        "ncclkit-run: no program to run; usage: ncclkit-run [options] [--] program [args...] "
        "(see --help)");
  }
  return options;
}

/// parse_launch_args() over main()'s argc/argv.
inline LaunchOptions parse_launch_args(int argc, const char* const* argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return parse_launch_args(args);
}

/// Workers to start on this node: the number asked for, or for `auto` (nullopt) one per
/// visible GPU, and 1 where no GPU is visible.
inline int resolve_nproc_per_node(const std::optional<int>& requested, const GpuInventory& gpus) {
  if (requested) return *requested;
  return gpus.visible.empty() ? 1 : static_cast<int>(gpus.visible.size());
}

}  // namespace ncclkit::launch
