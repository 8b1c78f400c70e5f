// The worker environment (launch/worker_env.hpp) and how many workers `auto` starts
// (launch/options.hpp), over fake inputs.
#include <doctest/doctest.h>

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include "launch/launch_test_support.hpp"
#include "launch/options.hpp"
#include "launch/worker_env.hpp"
#include "ncclkit/bootstrap/local_gpus.hpp"

using namespace ncclkit::launch;

TEST_CASE("the worker environment: launcher variables replaced or removed, everything else kept in order") {
  const std::vector<std::string> base{"PATH=/usr/bin",
                                      "RANK=99",
                                      "NCCL_DEBUG=INFO",
                                      "CUDA_VISIBLE_DEVICES=2,3",
                                      "MASTER_ADDR=stale",
                                      "MASTER_PORT=1",
                                      "NCCLKIT_INIT_URL=file:///stale",
                                      "EMPTY=",
                                      "WITH=EQUALS=SIGNS",
                                      "NCCLKIT_LAUNCH_RUN_ID=stale"};
  WorkerPlacement tcp{.rank = 5,
                      .local_rank = 1,
                      .world_size = 8,
                      .local_world_size = 4,
                      .node_rank = 1,
                      .num_nodes = 2,
                      .master_addr = "10.0.0.1",
                      .master_port = 4242,
                      .init_url = "tcp://10.0.0.1:4242",
                      .restart_count = 2,
                      .max_restarts = 3,
                      .run_id = "0123456789abcdef0123456789abcdef"};
  const auto env = build_worker_environment(base, tcp);
  const std::vector<std::string> expected{"PATH=/usr/bin",
                                          "NCCL_DEBUG=INFO",
                                          "CUDA_VISIBLE_DEVICES=2,3",
                                          "EMPTY=",
                                          "WITH=EQUALS=SIGNS",
                                          "RANK=5",
                                          "LOCAL_RANK=1",
                                          "WORLD_SIZE=8",
                                          "LOCAL_WORLD_SIZE=4",
                                          "GROUP_RANK=1",
                                          "NODE_RANK=1",
                                          "GROUP_WORLD_SIZE=2",
                                          "MASTER_ADDR=10.0.0.1",
                                          "MASTER_PORT=4242",
                                          "NCCLKIT_INIT_URL=tcp://10.0.0.1:4242",
                                          "NCCLKIT_RESTART_COUNT=2",
                                          "NCCLKIT_MAX_RESTARTS=3",
                                          "NCCLKIT_LAUNCH_RUN_ID=0123456789abcdef0123456789abcdef"};
  CHECK(env == expected);

  // A folder rendezvous: no address at all (a stale MASTER_ADDR must not reach the workers).
  WorkerPlacement folder{.rank = 0, .init_url = "file:///shared/rdzv/workers"};
  const auto folder_env = build_worker_environment(base, folder);
  for (const auto& entry : folder_env) {
    CHECK(entry.rfind("MASTER_", 0) != 0);
    CHECK(entry != "RANK=99");
    CHECK(entry != "NCCLKIT_LAUNCH_RUN_ID=stale");  // the launcher's id, or none: never an inherited one
  }
  CHECK(std::find(folder_env.begin(), folder_env.end(), "NCCLKIT_INIT_URL=file:///shared/rdzv/workers") !=
        folder_env.end());
}

TEST_CASE("auto starts one worker per visible GPU, 1 without any; a number asked for wins") {
  ncclkit::GpuInventory inventory;
  inventory.physical = {{0, "NVIDIA H100 80GB HBM3", ""}, {1, "NVIDIA H100 80GB HBM3", ""}, {2, "", ""}};
  inventory.visible = inventory.physical;
  CHECK(resolve_nproc_per_node(std::nullopt, inventory) == 3);
  CHECK(resolve_nproc_per_node(5, inventory) == 5);
  inventory.visible.clear();
  CHECK(resolve_nproc_per_node(std::nullopt, inventory) == 1);
}
