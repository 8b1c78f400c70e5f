#pragma once
/// The environment each worker starts with: the launcher's own, unchanged (NCCL_*,
/// CUDA_VISIBLE_DEVICES, PATH, ...), plus the variables that give the worker its place in the
/// job, under torchrun's names so that programs written for torchrun run unchanged:
///
/// | variable | value |
/// |---|---|
/// | RANK, WORLD_SIZE | global rank, number of workers in the job |
/// | LOCAL_RANK, LOCAL_WORLD_SIZE | rank on this node, workers on this node |
/// | GROUP_RANK, NODE_RANK | this node's index (two names, same value) |
/// | GROUP_WORLD_SIZE | number of nodes |
/// | MASTER_ADDR, MASTER_PORT | the workers' TCP store (only where there is one) |
/// | NCCLKIT_INIT_URL | the workers' store as an init URL: tcp://host:port or file:///dir |
/// | NCCLKIT_RESTART_COUNT, NCCLKIT_MAX_RESTARTS | this attempt (0 first), the restart budget |
/// | NCCLKIT_LAUNCH_RUN_ID | the job's id, the same on every node (the workers' job identity) |
///
/// CUDA_VISIBLE_DEVICES is deliberately left alone (as torchrun does): the communicator picks
/// GPU LOCAL_RANK, and narrowing the variable would break peer access between local GPUs.

#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::pair
#include <vector>       // std::vector

#include "ncclkit/store/run_identity.hpp"  // kLaunchRunIdVariable

extern char** environ;  // POSIX: the process environment

namespace ncclkit::launch {

/// One worker's place in the job and how it reaches its store.
struct WorkerPlacement {
  int rank = 0;
  int local_rank = 0;
  int world_size = 1;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string master_addr;  ///< empty: MASTER_ADDR/MASTER_PORT are removed, not set
  int master_port = 0;
  std::string init_url;  ///< NCCLKIT_INIT_URL; empty: removed
  int restart_count = 0;
  int max_restarts = 0;
  std::string run_id;  ///< NCCLKIT_LAUNCH_RUN_ID; empty: removed
};

/// The variables the launcher owns: set (or removed) for every worker, whatever the
/// launcher's own environment says.
inline const std::vector<std::string_view>& launcher_owned_variables() {
  static const std::vector<std::string_view> names = {"RANK",
                                                      "LOCAL_RANK",
                                                      "WORLD_SIZE",
                                                      "LOCAL_WORLD_SIZE",
                                                      "GROUP_RANK",
                                                      "GROUP_WORLD_SIZE",
                                                      "NODE_RANK",
                                                      "MASTER_ADDR",
                                                      "MASTER_PORT",
                                                      "NCCLKIT_INIT_URL",
                                                      "NCCLKIT_RESTART_COUNT",
                                                      "NCCLKIT_MAX_RESTARTS",
                                                      kLaunchRunIdVariable};
  return names;
}

/// This process's environment as "NAME=value" entries.
inline std::vector<std::string> current_environment() {
  std::vector<std::string> entries;
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) entries.emplace_back(*entry);
  return entries;
}

/// The variables the launcher sets for `placement`, in a fixed order.
inline std::vector<std::pair<std::string, std::string>> placement_variables(const WorkerPlacement& placement) {
  std::vector<std::pair<std::string, std::string>> variables = {
      {"RANK", std::to_string(placement.rank)},
      {"LOCAL_RANK", std::to_string(placement.local_rank)},
      {"WORLD_SIZE", std::to_string(placement.world_size)},
      {"LOCAL_WORLD_SIZE", std::to_string(placement.local_world_size)},
      {"GROUP_RANK", std::to_string(placement.node_rank)},
      {"NODE_RANK", std::to_string(placement.node_rank)},
      {"GROUP_WORLD_SIZE", std::to_string(placement.num_nodes)},
  };
  if (!placement.master_addr.empty()) {
    variables.emplace_back("MASTER_ADDR", placement.master_addr);
    variables.emplace_back("MASTER_PORT", std::to_string(placement.master_port));
  }
  if (!placement.init_url.empty()) variables.emplace_back("NCCLKIT_INIT_URL", placement.init_url);
  variables.emplace_back("NCCLKIT_RESTART_COUNT", std::to_string(placement.restart_count));
  variables.emplace_back("NCCLKIT_MAX_RESTARTS", std::to_string(placement.max_restarts));
  if (!placement.run_id.empty()) variables.emplace_back(kLaunchRunIdVariable, placement.run_id);
  return variables;
}

/// `base` (entries "NAME=value", e.g. current_environment()) with every launcher-owned
/// variable replaced by the placement's value or removed; everything else is kept as it was,
/// in its order. The placement's variables come last.
inline std::vector<std::string> build_worker_environment(const std::vector<std::string>& base,
                                                         const WorkerPlacement& placement) {
  std::vector<std::string> result;
  result.reserve(base.size() + 12);
  for (const auto& entry : base) {
    const std::string_view name = std::string_view(entry).substr(0, entry.find('='));
    bool owned = false;
    for (auto owned_name : launcher_owned_variables()) owned = owned || name == owned_name;
    if (!owned) result.push_back(entry);
  }
  for (const auto& [name, value] : placement_variables(placement)) result.push_back(name + "=" + value);
  return result;
}

}  // namespace ncclkit::launch
