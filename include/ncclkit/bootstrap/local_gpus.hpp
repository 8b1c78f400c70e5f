#pragma once
/// Which GPUs this node's workers will see, found without initialising CUDA: a process that
/// forks workers (ncclkit-run, spawn(), a benchmark starting one rank per GPU) must not hold a
/// CUDA context, which forked children inherit in a broken state and which holds memory on
/// every GPU for the whole job. Sources, best first: `nvidia-smi -L` (run as a
/// child process), /proc/driver/nvidia/gpus/ (driver loaded), /dev/nvidia[0-9]* (device nodes).
/// CUDA_VISIBLE_DEVICES is honoured the way the CUDA runtime reads it: a comma-separated list
/// of indices or UUIDs, cut at the first entry that is invalid; empty means no GPU.

#include <algorithm>   // std::sort
#include <cctype>      // std::isspace
#include <chrono>      // std::chrono::seconds
#include <cstdlib>     // std::getenv
#include <filesystem>  // std::filesystem::directory_iterator
#include <fstream>     // std::ifstream
#include <optional>    // std::optional
#include <set>         // std::set
#include <sstream>     // std::istringstream
#include <string>      // std::string
#include <utility>     // std::pair
#include <vector>      // std::vector

#include "ncclkit/bootstrap/detail/subprocess.hpp"  // detail::capture_command
#include "ncclkit/core/env.hpp"                     // parse_int

namespace ncclkit {

/// One physical GPU as the driver lists it.
struct GpuDevice {
  int index = 0;     ///< nvidia-smi's index
  std::string name;  ///< "NVIDIA H100 80GB HBM3"; empty when unknown
  std::string uuid;  ///< "GPU-..."; empty when unknown
};

/// The GPUs of this node and which of them the workers see.
struct GpuInventory {
  std::vector<GpuDevice> physical;                  ///< every GPU of the node
  std::vector<GpuDevice> visible;                   ///< after CUDA_VISIBLE_DEVICES
  std::string source;                               ///< "nvidia-smi", "/proc/driver/nvidia", "/dev/nvidia*" or "none"
  std::optional<std::string> cuda_visible_devices;  ///< the variable's value, if set (even empty)

  /// "2 x NVIDIA H100 80GB HBM3", "none", "4 (names unknown)".
  std::string describe() const {
    if (visible.empty()) {
      return physical.empty() ? std::string("none")
                              : "none visible (" + std::to_string(physical.size()) +
                                    " present; CUDA_VISIBLE_DEVICES='" + cuda_visible_devices.value_or("") + "')";
    }
    std::vector<std::pair<std::string, int>> groups;  // name, count, in order of appearance
    for (const auto& gpu : visible) {
      const std::string name = gpu.name.empty() ? "unknown model" : gpu.name;
      if (!groups.empty() && groups.back().first == name) {
        ++groups.back().second;
      } else {
        groups.emplace_back(name, 1);
      }
    }
    std::string text;
    for (const auto& [name, count] : groups) {
      text += (text.empty() ? "" : ", ") + std::to_string(count) + " x " + name;
    }
    return text;
  }
};

namespace detail {

/// `text` without its leading and trailing blanks.
inline std::string trim_blanks(std::string text) {
  std::size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

/// Parses `nvidia-smi -L`: "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-1234...)" per GPU; MIG
/// lines (indented, "MIG ...") are skipped: each MIG instance belongs to the GPU above it.
inline std::vector<GpuDevice> parse_nvidia_smi_list(const std::string& output) {
  std::vector<GpuDevice> gpus;
  std::istringstream lines(output);
  std::string line;
  while (std::getline(lines, line)) {
    if (line.rfind("GPU ", 0) != 0) continue;
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    auto index = parse_int(trim_blanks(line.substr(4, colon - 4)));
    if (!index) continue;
    GpuDevice gpu;
    gpu.index = static_cast<int>(*index);
    std::string rest = line.substr(colon + 1);
    const auto uuid_at = rest.find("(UUID:");
    if (uuid_at != std::string::npos) {
      const auto close = rest.find(')', uuid_at);
      gpu.uuid = trim_blanks(rest.substr(uuid_at + 6, close == std::string::npos ? std::string::npos : close - uuid_at - 6));
      rest.resize(uuid_at);
    }
    gpu.name = trim_blanks(rest);
    gpus.push_back(gpu);
  }
  return gpus;
}

/// Applies CUDA_VISIBLE_DEVICES (`value`; nullopt when unset) to the physical GPUs, the way
/// the CUDA runtime does: entries are indices or (prefixes of) UUIDs; the list is cut at the
/// first entry that names no GPU or repeats one; "" (or "-1", "NoDevFiles") hides every GPU.
inline std::vector<GpuDevice> apply_cuda_visible_devices(const std::vector<GpuDevice>& physical,
                                                         const std::optional<std::string>& value) {
  if (!value) return physical;
  std::vector<GpuDevice> visible;
  std::set<int> taken;
  std::istringstream entries(*value);
  std::string entry;
  while (std::getline(entries, entry, ',')) {
    entry = trim_blanks(entry);
    const GpuDevice* match = nullptr;
    if (auto index = parse_int(entry)) {
      for (const auto& gpu : physical)
        if (gpu.index == *index) match = &gpu;
    } else if (entry.rfind("GPU-", 0) == 0 || entry.rfind("MIG-", 0) == 0) {
      for (const auto& gpu : physical)
        if (!gpu.uuid.empty() && gpu.uuid.rfind(entry, 0) == 0) match = &gpu;
      if (!match && entry.rfind("MIG-", 0) == 0) {
        // A MIG instance: its UUID is not in the GPU list; count it as a device of unknown model.
        visible.push_back(GpuDevice{static_cast<int>(visible.size()), "MIG instance", entry});
        continue;
      }
    }
    if (match == nullptr || !taken.insert(match->index).second) break;
    visible.push_back(*match);
  }
  return visible;
}

/// GPU models from /proc/driver/nvidia/gpus/<pci>/information ("Model:  NVIDIA H100 ...").
inline std::vector<GpuDevice> read_proc_driver_gpus(const std::string& root = "/proc/driver/nvidia/gpus") {
  std::vector<GpuDevice> gpus;
  std::error_code error;
  std::vector<std::string> folders;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) folders.push_back(entry.path().string());
  std::sort(folders.begin(), folders.end());  // PCI bus order, which nvidia-smi uses too
  for (const auto& folder : folders) {
    GpuDevice gpu;
    gpu.index = static_cast<int>(gpus.size());
    std::ifstream info(folder + "/information");
    std::string line;
    while (std::getline(info, line)) {
      if (line.rfind("Model:", 0) == 0) gpu.name = trim_blanks(line.substr(6));
      if (line.rfind("GPU UUID:", 0) == 0) gpu.uuid = trim_blanks(line.substr(9));
    }
    gpus.push_back(gpu);
  }
  return gpus;
}

/// /dev/nvidia0, /dev/nvidia1, ...: one node per GPU (nvidiactl, nvidia-uvm are not GPUs).
inline std::vector<GpuDevice> read_dev_nodes(const std::string& root = "/dev") {
  std::vector<int> indices;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(root, error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("nvidia", 0) != 0 || name.size() == 6) continue;
    if (auto index = parse_int(name.substr(6)); index && *index >= 0) indices.push_back(static_cast<int>(*index));
  }
  std::sort(indices.begin(), indices.end());
  std::vector<GpuDevice> gpus;
  for (int index : indices) gpus.push_back(GpuDevice{index, "", ""});
  return gpus;
}

}  // namespace detail

/// This node's GPUs, found without touching CUDA (see the header comment). Runs `nvidia-smi -L`
/// when it is on PATH (at most 10 s). Never throws; "none" is a valid answer.
inline GpuInventory find_gpus() {
  GpuInventory inventory;
  if (const char* value = std::getenv("CUDA_VISIBLE_DEVICES")) inventory.cuda_visible_devices = std::string(value);
  if (auto listing = detail::capture_command({"nvidia-smi", "-L"}, std::chrono::seconds(10))) {
    inventory.physical = detail::parse_nvidia_smi_list(*listing);
    if (!inventory.physical.empty()) inventory.source = "nvidia-smi";
  }
  if (inventory.physical.empty()) {
    inventory.physical = detail::read_proc_driver_gpus();
    if (!inventory.physical.empty()) inventory.source = "/proc/driver/nvidia";
  }
  if (inventory.physical.empty()) {
    inventory.physical = detail::read_dev_nodes();
    if (!inventory.physical.empty()) inventory.source = "/dev/nvidia*";
  }
  if (inventory.physical.empty()) inventory.source = "none";
  inventory.visible = detail::apply_cuda_visible_devices(inventory.physical, inventory.cuda_visible_devices);
  return inventory;
}

}  // namespace ncclkit
