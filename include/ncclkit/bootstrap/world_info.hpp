#pragma once
/// WorldInfo: who this process is in the job (rank, world size, local rank, node) and how to
/// reach the rendezvous store. Filled from arguments, from the environment
/// (ncclkit/bootstrap/environment.hpp: torchrun, SLURM, Open MPI) or by spawn().

#include <string>  // std::string

#include "ncclkit/core/error.hpp"

namespace ncclkit {

struct WorldInfo {
  int rank = 0;                      ///< global rank, 0 <= rank < world_size
  int world_size = 1;                ///< number of processes in the job
  int local_rank = 0;                ///< rank among the processes of this node
  int local_world_size = 1;          ///< processes on this node
  int node_rank = 0;                 ///< index of this node
  int num_nodes = 1;                 ///< number of nodes
  std::string master_addr{};         ///< host of the TCP store (torchrun's MASTER_ADDR), if any
  int master_port = 0;               ///< port of the TCP store (MASTER_PORT), if any
  std::string init_url{};            ///< rendezvous store: "env://", "tcp://host:port" or "file:///dir"
  std::string source = "arguments";  ///< where the values came from, for error messages

  /// Throws ConfigError listing every inconsistent field, e.g. rank >= world_size.
  void validate() const {
    std::string problems;
    auto add = [&](const std::string& p) { problems += (problems.empty() ? "" : "; ") + p; };
    if (world_size < 1) add("world_size=" + std::to_string(world_size) + " must be >= 1");
    if (rank < 0 || rank >= world_size)
      add("rank=" + std::to_string(rank) + " must be in [0, world_size=" + std::to_string(world_size) + ")");
    if (local_world_size < 1 || local_world_size > world_size)
      add("local_world_size=" + std::to_string(local_world_size) + " must be in [1, world_size]");
    if (local_rank < 0 || local_rank >= local_world_size)
      add("local_rank=" + std::to_string(local_rank) +
          " must be in [0, local_world_size=" + std::to_string(local_world_size) + ")");
    if (num_nodes < 1 || node_rank < 0 || node_rank >= num_nodes)
      add("node_rank=" + std::to_string(node_rank) + " must be in [0, num_nodes=" + std::to_string(num_nodes) + ")");
    if (master_port < 0 || master_port > 65535)
      add("master_port=" + std::to_string(master_port) + " must be in [0, 65535]");
    if (!problems.empty()) {
      throw ConfigError("invalid WorldInfo (from " + source + "): " + problems);
    }
  }
};

}  // namespace ncclkit
