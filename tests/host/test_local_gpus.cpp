// This node's GPUs found without CUDA (ncclkit/bootstrap/local_gpus.hpp): nvidia-smi's list,
// CUDA_VISIBLE_DEVICES, the driver's /proc folder and the device nodes, over fake inputs.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "ncclkit/bootstrap/local_gpus.hpp"
#include "support/temp_dir.hpp"

using ncclkit::GpuInventory;

TEST_CASE("nvidia-smi -L is parsed into GPUs; MIG lines are not GPUs") {
  const std::string listing =
      "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-11111111-2222-3333-4444-555555555555)\n"
      "  MIG 3g.40gb     Device  0: (UUID: MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee)\n"
      "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-66666666-7777-8888-9999-000000000000)\n"
      "GPU 2: NVIDIA A100-SXM4-40GB (UUID: GPU-abcdef00-0000-0000-0000-000000000000)\n";
  const auto gpus = ncclkit::detail::parse_nvidia_smi_list(listing);
  REQUIRE(gpus.size() == 3);
  CHECK(gpus[1].index == 1);
  CHECK(gpus[1].name == "NVIDIA H100 80GB HBM3");
  CHECK(gpus[2].uuid == "GPU-abcdef00-0000-0000-0000-000000000000");

  SUBCASE("CUDA_VISIBLE_DEVICES: unset, indices, UUID prefixes, cut at the first invalid entry, empty") {
    using ncclkit::detail::apply_cuda_visible_devices;
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

  SUBCASE("describe() groups models and says when none is visible") {
    GpuInventory inventory;
    inventory.physical = gpus;
    inventory.visible = gpus;
    CHECK(inventory.describe() == "2 x NVIDIA H100 80GB HBM3, 1 x NVIDIA A100-SXM4-40GB");
    inventory.visible.clear();
    inventory.cuda_visible_devices = "";
    CHECK(inventory.describe() == "none visible (3 present; CUDA_VISIBLE_DEVICES='')");
    CHECK(GpuInventory{}.describe() == "none");
  }
}

TEST_CASE("GPUs from /proc/driver/nvidia and from /dev/nvidia* when nvidia-smi is absent") {
  ncclkit_test::TempDir dir("local-gpus");
  const std::filesystem::path root(dir.path);
  for (const char* bus : {"0000:18:00.0", "0000:3b:00.0"}) {
    std::filesystem::create_directories(root / ("gpus/" + std::string(bus)));
    std::ofstream(root / ("gpus/" + std::string(bus) + "/information"))
        << "Model: \t\t NVIDIA H200\nIRQ:   42\nGPU UUID: \t GPU-" << bus << "\n";
  }
  const auto from_proc = ncclkit::detail::read_proc_driver_gpus(root / "gpus");
  REQUIRE(from_proc.size() == 2);
  CHECK(from_proc[0].name == "NVIDIA H200");
  CHECK(from_proc[1].uuid == "GPU-0000:3b:00.0");
  CHECK(from_proc[1].index == 1);

  std::filesystem::create_directories(root / "dev");
  for (const char* node : {"nvidia0", "nvidia3", "nvidiactl", "nvidia-uvm", "nvidia-caps", "null"}) {
    std::ofstream(root / ("dev/" + std::string(node))) << "";
  }
  const auto from_dev = ncclkit::detail::read_dev_nodes(root / "dev");
  REQUIRE(from_dev.size() == 2);
  CHECK(from_dev[0].index == 0);
  CHECK(from_dev[1].index == 3);
  CHECK(ncclkit::detail::read_proc_driver_gpus(root / "missing").empty());
}

TEST_CASE("find_gpus() on this machine never throws and agrees with the device nodes") {
  const GpuInventory inventory = ncclkit::find_gpus();
  CHECK(!inventory.source.empty());
  if (inventory.source == "none") {
    CHECK(inventory.visible.empty());
    CHECK(ncclkit::detail::read_dev_nodes().empty());
  } else {
    CHECK(!inventory.physical.empty());
  }
}
