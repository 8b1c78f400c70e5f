// The worker environment (launch/worker_env.hpp) and GPU discovery without CUDA
// (launch/gpus.hpp), over fake inputs.
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "launch/gpus.hpp"
#include "launch/launch_test_support.hpp"
#include "launch/worker_env.hpp"

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

TEST_CASE("nvidia-smi -L is parsed into GPUs; MIG lines are not GPUs") {
  const std::string listing =
      "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)\n"
      "  MIG 3g.40gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)\n"
      "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-7777-8888-9999-000000000000)\n"
      "GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-abcdef00-0000-0000-0000-000000000000)\n";
  const auto gpus = detail::parse_nvidia_smi_list(listing);
  REQUIRE(gpus.size() == 3);
  CHECK(gpus[1].index == 1);
  CHECK(gpus[1].name == "NVIDIA H100 80GB HBM3");
  CHECK(gpus[2].uuid == "GPU-abcdef00-0000-0000-0000-000000000000");

  SUBCASE("CUDA_VISIBLE_DEVICES: unset, indices, UUID prefixes, cut at the first invalid entry, empty") {
    using detail::apply_cuda_visible_devices;
    CHECK(apply_cuda_visible_devices(gpus, std::nullopt).size() == 3);
    auto visible = apply_cuda_visible_devices(gpus, "2,0");
    REQUIRE(visible.size() == 2);
    CHECK(visible[0].name == "NVIDIA A100-SXM4-40GB");
    CHECK(apply_cuda_visible_devices(gpus, "GPU-6666,1").size() == 1);  // 1 repeats GPU-6666...: cut
    CHECK(apply_cuda_visible_devices(gpus, "0,7,1").size() == 1);       // 7 does not exist: cut
    CHECK(apply_cuda_visible_devices(gpus, "").empty());
    CHECK(apply_cuda_visible_devices(gpus, "-1").empty());
    CHECK(apply_cuda_visible_devices(gpus, "NoDevFiles").empty());
    CHECK(apply_cuda_visible_devices(gpus, " 1 , 2 ").size() == 2);
  }

  SUBCASE("describe() groups models; auto is one worker per visible GPU, 1 without any") {
    GpuInventory inventory;
    inventory.physical = gpus;
    inventory.visible = gpus;
    CHECK(inventory.describe() == "2 x NVIDIA H100 80GB HBM3, 1 x NVIDIA A100-SXM4-40GB");
    CHECK(resolve_nproc_per_node(std::nullopt, inventory) == 3);
    CHECK(resolve_nproc_per_node(5, inventory) == 5);
    inventory.visible.clear();
    inventory.cuda_visible_devices = "";
    CHECK(inventory.describe() == "none visible (3 present; CUDA_VISIBLE_DEVICES='')");
    CHECK(resolve_nproc_per_node(std::nullopt, inventory) == 1);
    CHECK(GpuInventory{}.describe() == "none");
  }
}

TEST_CASE("GPUs from /proc/driver/nvidia and from /dev/nvidia* when nvidia-smi is absent") {
  launch_test::TempDir dir;
  for (const char* bus : {"0000:18:00.0", "0000:3b:00.0"}) {
    std::filesystem::create_directories(dir / ("gpus/" + std::string(bus)));
    std::ofstream(dir / ("gpus/" + std::string(bus) + "/information"))
        << "Model: \t\t NVIDIA H200\nIRQ:   42\nGPU UUID: \t GPU-" << bus << "\n";
  }
  const auto from_proc = detail::read_proc_driver_gpus(dir / "gpus");
  REQUIRE(from_proc.size() == 2);
  CHECK(from_proc[0].name == "NVIDIA H200");
  CHECK(from_proc[1].uuid == "GPU-0000:3b:00.0");
  CHECK(from_proc[1].index == 1);

  std::filesystem::create_directories(dir / "dev");
  for (const char* node : {"nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-caps", "null"}) {
    std::ofstream(dir / ("dev/" + std::string(node))) << "";
  }
  const auto from_dev = detail::read_dev_nodes(dir / "dev");
  REQUIRE(from_dev.size() == 2);
  CHECK(from_dev[0].index == 0);
  CHECK(from_dev[1].index == 3);
  CHECK(detail::read_proc_driver_gpus(dir / "missing").empty());
}

TEST_CASE("find_gpus() on this machine never throws and agrees with the device nodes") {
  const GpuInventory inventory = find_gpus();
  CHECK(!inventory.source.empty());
  if (inventory.source == "none") {
    CHECK(inventory.visible.empty());
    CHECK(detail::read_dev_nodes().empty());
  } else {
    CHECK(!inventory.physical.empty());
  }
}
