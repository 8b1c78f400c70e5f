#pragma once
/// detect_world(): this process's WorldInfo from explicit arguments, else from the variables a
/// launcher sets: torchrun (RANK, WORLD_SIZE, ...), Open MPI's mpirun (OMPI_COMM_WORLD_*) or
/// SLURM's srun (SLURM_PROCID, SLURM_NTASKS, ...). docs/bootstrap.md and docs/environment.md
/// describe every variable read.
///
/// Precedence, field by field: explicit arguments > torchrun > Open MPI > SLURM.
/// Launchers nest (`srun torchrun ...`, `mpirun` inside an sbatch job), and the innermost one
/// (the one that started this very process) describes it; the outer launcher's variables
/// describe the outer layer (one torchrun per node, one orted per node) and are ignored rather
/// than reported as contradictions. That is why Open MPI ranks above SLURM: inside an
/// allocation, mpirun's processes inherit SLURM_PROCID from the job step that started mpirun's
/// daemons, which numbers nodes, not processes. Values *within* one launcher's set that
/// contradict each other (RANK >= WORLD_SIZE, task counts per node that do not add up to
/// SLURM_NTASKS) are errors.
///
/// The environment is read through an EnvironmentLookup, so tests (and programs that assemble
/// an environment) need not touch the process environment.

#include <cstdint>           // std::int64_t
#include <functional>        // std::function, std::less
#include <initializer_list>  // std::initializer_list (lists of variable names)
#include <map>               // std::map
#include <optional>          // std::optional
#include <string>            // std::string
#include <string_view>       // std::string_view
#include <utility>           // std::move, std::pair
#include <vector>            // std::vector

#include "ncclkit/bootstrap/slurm_nodelist.hpp"
#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"

namespace ncclkit {

/// Looks up one environment variable: its value, or nullopt when unset. An empty value counts
/// as unset everywhere in ncclkit.
using EnvironmentLookup = std::function<std::optional<std::string>(std::string_view)>;

/// The lookup of the real process environment (getenv).
inline EnvironmentLookup process_environment() {
  return [](std::string_view name) { return env_string(std::string(name).c_str()); };
}

/// A lookup over a fixed set of variables, e.g. `fixed_environment({{"RANK", "1"}, ...})`.
inline EnvironmentLookup fixed_environment(std::map<std::string, std::string, std::less<>> variables) {
  return [variables = std::move(variables)](std::string_view name) -> std::optional<std::string> {
    auto it = variables.find(name);
    if (it == variables.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

/// Values given explicitly by the program. Each one that is set wins over the environment; the
/// rest still come from it (an override of `rank` alone keeps WORLD_SIZE from the environment).
struct WorldInfoOverrides {
  std::optional<int> rank{};
  std::optional<int> world_size{};
  std::optional<int> local_rank{};
  std::optional<int> local_world_size{};
  std::optional<int> node_rank{};
  std::optional<int> num_nodes{};
  std::optional<std::string> master_addr{};
  std::optional<int> master_port{};
  std::optional<std::string> init_url{};
};

namespace detail {

/// What one launcher's variables say; unset fields are unknown.
struct LauncherValues {
  std::string name;  ///< "torchrun", "Open MPI", "SLURM"
  std::optional<int> rank, world_size, local_rank, local_world_size, node_rank, num_nodes;
  std::optional<std::string> master_addr;  ///< only SLURM derives one (first host of the node list)
  std::vector<std::string> found;          ///< "NAME=value" of every variable read that was set
  std::vector<std::string> notes;          ///< values derived rather than read, for `source`
};

inline std::string join(const std::vector<std::string>& items, std::string_view separator = ", ") {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : std::string(separator)) + item;
  return text;
}

inline const std::string kWhatIsNeeded =
    "needed: RANK and WORLD_SIZE (torchrun), or OMPI_COMM_WORLD_RANK and OMPI_COMM_WORLD_SIZE "
    "(mpirun), or SLURM_PROCID and SLURM_NTASKS (srun), or explicit arguments "
    "(WorldInfoOverrides)";

/// Reads variables through a lookup and remembers which were set, for error messages.
class EnvironmentReader {
 public:
  explicit EnvironmentReader(const EnvironmentLookup& lookup) : lookup_(lookup) {}

  std::optional<std::string> text(std::string_view name, std::vector<std::string>& found) {
    auto value = lookup_(name);
    if (value && value->empty()) value.reset();
    if (value) found.push_back(std::string(name) + "=" + *value);
    return value;
  }

  bool is_set(std::string_view name) {
    auto value = lookup_(name);
    return value && !value->empty();
  }

  /// An integer in [minimum, maximum]; anything else is a ConfigError naming the variable, its
  /// value and everything found so far.
  std::optional<int> integer(std::string_view name, std::vector<std::string>& found, int minimum,
                             int maximum = 1 << 30) {
    auto value = text(name, found);
    if (!value) return std::nullopt;
    auto number = parse_int(*value);
    if (!number || *number < minimum || *number > maximum) {
      throw ConfigError("environment variable " + std::string(name) + "='" + *value + "' is not " +
                        (number ? "in the range [" + std::to_string(minimum) + ", " + std::to_string(maximum) + "]"
                                : std::string("a whole number")) +
                        "; found: " + join(found) + "; fix or unset it");
    }
    return static_cast<int>(*number);
  }

  /// The first of `names` that is set, read as integer(); nullopt when none is.
  std::optional<int> first_integer(std::initializer_list<std::string_view> names, std::vector<std::string>& found,
                                   int minimum) {
    for (auto name : names)
      if (is_set(name)) return integer(name, found, minimum);
    return std::nullopt;
  }

  /// The first of `names` that is set: its name and value; nullopt when none is.
  std::optional<std::pair<std::string, std::string>> first_text(std::initializer_list<std::string_view> names,
                                                                std::vector<std::string>& found) {
    for (auto name : names)
      if (is_set(name)) return std::pair<std::string, std::string>(std::string(name), *text(name, found));
    return std::nullopt;
  }

 private:
  const EnvironmentLookup& lookup_;
};

inline bool torchrun_present(EnvironmentReader& env) {
  for (auto name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE"})
    if (env.is_set(name)) return true;
  return false;
}

inline bool open_mpi_present(EnvironmentReader& env) {
  for (auto name :
       {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"})
    if (env.is_set(name)) return true;
  return false;
}

/// SLURM counts only where SLURM_PROCID is set, i.e. in a task that srun started (or in the
/// batch script itself). An salloc shell has SLURM_NTASKS but no SLURM_PROCID: a program
/// run there directly is one process, not a task of the allocation.
inline bool slurm_present(EnvironmentReader& env) { return env.is_set("SLURM_PROCID"); }

inline LauncherValues read_torchrun(EnvironmentReader& env) {
  LauncherValues v;
  v.name = "torchrun";
  v.rank = env.integer("RANK", v.found, 0);
  v.world_size = env.integer("WORLD_SIZE", v.found, 1);
  v.local_rank = env.integer("LOCAL_RANK", v.found, 0);
  v.local_world_size = env.integer("LOCAL_WORLD_SIZE", v.found, 1);
  v.node_rank = env.integer("GROUP_RANK", v.found, 0);
  v.num_nodes = env.integer("GROUP_WORLD_SIZE", v.found, 1);
  return v;
}

inline LauncherValues read_open_mpi(EnvironmentReader& env) {
  LauncherValues v;
  v.name = "Open MPI";
  v.rank = env.integer("OMPI_COMM_WORLD_RANK", v.found, 0);
  v.world_size = env.integer("OMPI_COMM_WORLD_SIZE", v.found, 1);
  v.local_rank = env.integer("OMPI_COMM_WORLD_LOCAL_RANK", v.found, 0);
  v.local_world_size = env.integer("OMPI_COMM_WORLD_LOCAL_SIZE", v.found, 1);
  // OMPI_COMM_WORLD_NODE_RANK is not a node index (Open MPI defines it as the rank among the
  // processes of *all* jobs on this node), so the node is derived from the local values.
  return v;
}

inline LauncherValues read_slurm(EnvironmentReader& env) {
  LauncherValues v;
  v.name = "SLURM";
  // The job step's values (this srun) before the job's (the whole allocation): `srun -n 2`
  // inside an allocation of 8 tasks starts 2.
  v.rank = env.integer("SLURM_PROCID", v.found, 0);
  v.world_size = env.first_integer({"SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"}, v.found, 1);
  v.local_rank = env.integer("SLURM_LOCALID", v.found, 0);
  v.node_rank = env.integer("SLURM_NODEID", v.found, 0);
  v.num_nodes = env.first_integer({"SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"}, v.found, 1);

  auto fail = [&](const std::string& problem) {
    throw ConfigError("contradictory SLURM environment: " + problem + "; found: " + join(v.found) +
                      "; run the program with srun so that SLURM sets these consistently");
  };
  // A malformed list is reported with the variable that holds it.
  auto parse = [&](const std::pair<std::string, std::string>& variable, auto&& parser) {
    try {
      return parser(variable.second);
    } catch (const ConfigError& e) {
      throw ConfigError("environment variable " + variable.first + ": " + e.what());
    }
  };
  if (auto per_node_variable = env.first_text({"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}, v.found)) {
    const std::string* per_node = &per_node_variable->second;
    std::vector<int> counts =
        parse(*per_node_variable, [](const std::string& text) { return expand_slurm_tasks_per_node(text); });
    std::int64_t total = 0;
    for (int c : counts) total += c;
    if (v.num_nodes && static_cast<std::size_t>(*v.num_nodes) != counts.size()) {
      fail("the task counts '" + *per_node + "' cover " + std::to_string(counts.size()) + " nodes, not " +
           std::to_string(*v.num_nodes));
    }
    if (v.world_size && total != *v.world_size) {
      fail("the task counts '" + *per_node + "' add up to " + std::to_string(total) + " tasks, not " +
           std::to_string(*v.world_size));
    }
    if (!v.num_nodes) v.num_nodes = static_cast<int>(counts.size());
    if (!v.world_size) v.world_size = static_cast<int>(total);
    if (v.node_rank) {
      if (static_cast<std::size_t>(*v.node_rank) >= counts.size()) {
        fail("SLURM_NODEID=" + std::to_string(*v.node_rank) + " but the task counts '" + *per_node + "' cover only " +
             std::to_string(counts.size()) + " nodes");
      }
      v.local_world_size = counts[static_cast<std::size_t>(*v.node_rank)];
    } else if (counts.size() == 1) {
      v.local_world_size = counts[0];
    }
  } else if (auto per_node_count = env.integer("SLURM_NTASKS_PER_NODE", v.found, 1)) {
    v.local_world_size = *per_node_count;
  } else if (v.num_nodes && *v.num_nodes == 1 && v.world_size) {
    v.local_world_size = *v.world_size;
    v.notes.push_back("one node: local_world_size = world_size");
  }

  if (auto list = env.first_text({"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"}, v.found)) {
    v.master_addr = parse(*list, [](const std::string& text) { return first_slurm_host(text); });
  }
  return v;
}

/// The name and found variables of a launcher that lost on precedence, for `source`.
inline std::string describe_ignored(EnvironmentReader& env, std::string_view name,
                                    std::initializer_list<std::string_view> variables) {
  std::vector<std::string> found;
  for (auto variable : variables) env.text(variable, found);
  return std::string(name) + " (" + join(found) + ")";
}

}  // namespace detail

/// This process's place in the job: explicit `overrides` first, then the environment as read
/// by `lookup` (default: the process environment). Order and rules are in the header comment
/// and docs/bootstrap.md. In short:
/// - torchrun: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK/GROUP_WORLD_SIZE (node).
/// - Open MPI: OMPI_COMM_WORLD_RANK/SIZE/LOCAL_RANK/LOCAL_SIZE.
/// - SLURM (where SLURM_PROCID is set): SLURM_PROCID, SLURM_STEP_NUM_TASKS|SLURM_NTASKS,
///   SLURM_LOCALID, SLURM_NODEID, SLURM_STEP_NUM_NODES|SLURM_NNODES, the task counts per node
///   (SLURM_STEP_TASKS_PER_NODE|SLURM_TASKS_PER_NODE|SLURM_NTASKS_PER_NODE) and, for the store's
///   address, the first host of SLURM_STEP_NODELIST|SLURM_JOB_NODELIST.
/// - Any launcher: MASTER_ADDR, MASTER_PORT, NCCLKIT_INIT_URL.
/// Without a node index (GROUP_RANK, SLURM_NODEID), it is derived as rank / local_world_size
/// where ranks are laid out node by node; otherwise node_rank and num_nodes must be given.
/// init_url: the override, else NCCLKIT_INIT_URL, else "env://" (MASTER_ADDR:MASTER_PORT), and
/// for a single process without MASTER_ADDR/MASTER_PORT "tcp://127.0.0.1:0" (a private store
/// on a free loopback port).
/// With no launcher variables and no overrides: a single process, rank 0 of 1.
///
/// Throws ConfigError when a value is malformed, missing or contradictory; the message lists
/// the variables found (NAME=value) and what is needed. The result has passed validate(), and
/// its `source` says where each part came from.
inline WorldInfo detect_world(const WorldInfoOverrides& overrides = {},
                              const EnvironmentLookup& lookup = process_environment()) {
  detail::EnvironmentReader env(lookup);
  const bool torchrun = detail::torchrun_present(env);
  const bool open_mpi = detail::open_mpi_present(env);
  const bool slurm = detail::slurm_present(env);

  std::optional<detail::LauncherValues> launcher;
  std::vector<std::string> ignored;
  if (torchrun) {
    launcher = detail::read_torchrun(env);
  } else if (open_mpi) {
    launcher = detail::read_open_mpi(env);
  } else if (slurm) {
    launcher = detail::read_slurm(env);
  }
  if (open_mpi && torchrun) {
    ignored.push_back(detail::describe_ignored(
        env, "Open MPI",
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"}));
  }
  if (slurm && (torchrun || open_mpi)) {
    ignored.push_back(detail::describe_ignored(
        env, "SLURM", {"SLURM_PROCID", "SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID"}));
  }

  std::vector<std::string> found = launcher ? launcher->found : std::vector<std::string>{};
  std::vector<std::string> notes = launcher ? launcher->notes : std::vector<std::string>{};
  const std::optional<int> master_port_env = env.integer("MASTER_PORT", found, 1, 65535);
  const std::optional<std::string> master_addr_env = env.text("MASTER_ADDR", found);
  const std::optional<std::string> init_url_env = env.text("NCCLKIT_INIT_URL", found);

  // Field by field: the override, else the launcher's value.
  std::vector<std::string> overridden;
  auto pick = [&](const char* field, const std::optional<int>& explicit_value,
                  std::optional<int> launcher_value) -> std::optional<int> {
    if (explicit_value) {
      overridden.push_back(std::string(field) + "=" + std::to_string(*explicit_value) +
                           (launcher_value && *launcher_value != *explicit_value
                                ? " (environment: " + std::to_string(*launcher_value) + ")"
                                : ""));
      return explicit_value;
    }
    return launcher_value;
  };
  using Values = detail::LauncherValues;
  auto launcher_field = [&](std::optional<int> Values::*field) -> std::optional<int> {
    return launcher ? (*launcher).*field : std::nullopt;
  };
  std::optional<int> rank = pick("rank", overrides.rank, launcher_field(&Values::rank));
  std::optional<int> world_size = pick("world_size", overrides.world_size, launcher_field(&Values::world_size));
  std::optional<int> local_rank = pick("local_rank", overrides.local_rank, launcher_field(&Values::local_rank));
  std::optional<int> local_world_size =
      pick("local_world_size", overrides.local_world_size, launcher_field(&Values::local_world_size));
  std::optional<int> node_rank = pick("node_rank", overrides.node_rank, launcher_field(&Values::node_rank));
  std::optional<int> num_nodes = pick("num_nodes", overrides.num_nodes, launcher_field(&Values::num_nodes));

  WorldInfo world;
  {
    std::string source;
    if (launcher) {
      source = launcher->name + " environment (" + detail::join(launcher->found) + ")";
    } else if (!overridden.empty()) {
      source = "arguments";
    } else {
      source = "no launcher environment found: single process (rank 0 of 1)";
    }
    if (launcher && !overridden.empty()) source += "; arguments: " + detail::join(overridden);
    if (!ignored.empty()) {
      source += "; ignored, lower precedence than " + (launcher ? launcher->name : std::string("arguments")) + ": " +
                detail::join(ignored);
    }
    world.source = std::move(source);
  }
  // `needed` defaults to the list of what identifies a process at all.
  auto fail = [&](const std::string& problem, const std::string& needed = detail::kWhatIsNeeded) {
    std::string found_text = found.empty() ? "no launcher variables" : detail::join(found);
    std::string from = launcher ? "the " + launcher->name + " environment" : std::string("the arguments");
    throw ConfigError("cannot determine this process's place in the job from " + from + ": " + problem +
                      "; found: " + found_text +
                      (overridden.empty() ? "" : "; arguments: " + detail::join(overridden)) + "; " + needed);
  };

  const bool single_default = !launcher && overridden.empty();
  if (!single_default) {
    if (!rank && !world_size) fail("the rank and the world size are missing");
    if (!rank) fail("the rank is missing (world size " + std::to_string(*world_size) + " is known)");
    if (!world_size) fail("the world size is missing (rank " + std::to_string(*rank) + " is known)");
  }
  world.rank = rank.value_or(0);
  world.world_size = world_size.value_or(1);

  if (local_rank.has_value() != local_world_size.has_value()) {
    fail(local_rank ? "the local rank is known but not the local world size"
                    : "the local world size is known but "
                      "not the local rank",
         "needed: both LOCAL_RANK and LOCAL_WORLD_SIZE (torchrun), OMPI_COMM_WORLD_LOCAL_RANK and "
         "OMPI_COMM_WORLD_LOCAL_SIZE (mpirun), SLURM_LOCALID and SLURM's task counts per node "
         "(SLURM_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE), or local_rank and local_world_size as arguments");
  }
  if (!local_rank) {
    if (world.world_size > 1) {
      fail("the local rank and local world size are missing; they tell processes on one node apart",
           "needed: LOCAL_RANK and LOCAL_WORLD_SIZE, or local_rank and local_world_size as arguments");
    }
    local_rank = 0;
    local_world_size = 1;
  }
  world.local_rank = *local_rank;
  world.local_world_size = *local_world_size;

  if (node_rank.has_value() != num_nodes.has_value()) {
    fail(node_rank ? "the node index is known but not the number of nodes"
                   : "the number of nodes is known but not the node index",
         "needed: both GROUP_RANK and GROUP_WORLD_SIZE (torchrun), both SLURM_NODEID and SLURM_NNODES (srun), "
         "or node_rank and num_nodes as arguments");
  }
  if (!node_rank) {
    // Derivable only when every node runs local_world_size processes with consecutive ranks.
    const int per_node = world.local_world_size;
    if (per_node >= 1 && world.world_size % per_node == 0 && world.rank % per_node == world.local_rank) {
      node_rank = world.rank / per_node;
      num_nodes = world.world_size / per_node;
      if (num_nodes > 1) notes.push_back("node_rank = rank / local_world_size");
    } else {
      fail("the node index is missing and cannot be derived: rank " + std::to_string(world.rank) + " with local rank " +
               std::to_string(world.local_rank) + " of " + std::to_string(per_node) + " in a world of " +
               std::to_string(world.world_size) + " is not laid out node by node",
           "needed: node_rank and num_nodes as arguments, or GROUP_RANK and GROUP_WORLD_SIZE (with "
           "Open MPI, --map-by slot lays ranks out node by node)");
    }
  }
  world.node_rank = *node_rank;
  world.num_nodes = *num_nodes;

  if (overrides.master_addr) {
    world.master_addr = *overrides.master_addr;
  } else if (master_addr_env) {
    world.master_addr = *master_addr_env;
  } else if (launcher && launcher->master_addr) {
    world.master_addr = *launcher->master_addr;
    notes.push_back("master_addr = first host of the SLURM node list (" + world.master_addr + ")");
  }
  world.master_port = overrides.master_port ? *overrides.master_port : master_port_env.value_or(0);

  if (overrides.init_url) {
    world.init_url = *overrides.init_url;
  } else if (init_url_env) {
    world.init_url = *init_url_env;
  } else if (world.world_size == 1 && world.master_addr.empty() && world.master_port == 0) {
    world.init_url = "tcp://127.0.0.1:0";
  } else {
    world.init_url = "env://";
  }

  if (world.num_nodes > world.world_size) {
    fail("num_nodes=" + std::to_string(world.num_nodes) + " exceeds world_size=" + std::to_string(world.world_size) +
             " (every node runs at least one process)",
         "fix the launcher's variables or the arguments so that they agree");
  }
  if (!notes.empty()) world.source += "; derived: " + detail::join(notes);
  try {
    world.validate();
  } catch (const ConfigError& e) {
    // `source` in the message already lists the variables found.
    throw ConfigError(std::string(e.what()) + "; fix the launcher's variables or the arguments so that they agree");
  }
  return world;
}

}  // namespace ncclkit
