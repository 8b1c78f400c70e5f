#pragma once
/// CUDA and NCCL versions for --check, read from the libraries the workers would load, by
/// dlopen() and each library's own version call. None of these calls creates a CUDA context
/// (cudaRuntimeGetVersion, cuDriverGetVersion and ncclGetVersion are documented to work
/// before initialisation). A library that is not found gives "not found", never an error.

#include <dlfcn.h>  // dlopen, dlsym, dlinfo, dlclose, RTLD_*
#include <link.h>   // struct link_map (dlinfo RTLD_DI_LINKMAP: where a library was found)

#include <fstream>  // std::ifstream (/proc/driver/nvidia/version)
#include <sstream>  // std::istringstream
#include <string>   // std::string
#include <vector>   // std::vector

namespace ncclkit::launch {

/// What --check reports about the GPU software stack of one node.
struct SoftwareVersions {
  std::string driver;        ///< "550.54.15" (kernel module), or "not found"
  std::string cuda_driver;   ///< the CUDA version the driver supports ("12.4"), or "not found"
  std::string cuda_runtime;  ///< libcudart's version ("12.4"), or "not found"
  std::string nccl;          ///< libnccl's version ("2.21.5"), or "not found"
  std::string nccl_path;     ///< the file libnccl was loaded from, when found
};

namespace detail {

/// A library opened for a version query: the first of `names` that loads, with `symbol`.
/// RTLD_LOCAL keeps its symbols out of this process's namespace.
struct OpenedLibrary {
  void* handle = nullptr;
  void* symbol = nullptr;
  std::string path;

  OpenedLibrary(const std::vector<std::string>& names, const char* symbol_name) {
    for (const auto& name : names) {
      handle = ::dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (handle == nullptr) continue;
      symbol = ::dlsym(handle, symbol_name);
      if (symbol != nullptr) {
        link_map* map = nullptr;
        if (::dlinfo(handle, RTLD_DI_LINKMAP, &map) == 0 && map != nullptr && map->l_name != nullptr)
          path = map->l_name;
        return;
      }
      ::dlclose(handle);
      handle = nullptr;
    }
  }
  // No dlclose(): unloading CUDA libraries is a known source of crashes in their destructors,
  // and --check ends soon after anyway.
  OpenedLibrary(const OpenedLibrary&) = delete;
  OpenedLibrary& operator=(const OpenedLibrary&) = delete;
};

/// 12040 -> "12.4" (CUDA's encoding: 1000 * major + 10 * minor).
inline std::string cuda_version_text(int version) {
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 10);
}

/// NCCL's encoding: 10000 * major + 100 * minor + patch since 2.9 (1000 * major + 100 * minor
/// + patch before).
inline std::string nccl_version_text(int version) {
  if (version >= 20900) {
    return std::to_string(version / 10000) + "." + std::to_string((version % 10000) / 100) + "." +
           std::to_string(version % 100);
  }
  return std::to_string(version / 1000) + "." + std::to_string((version % 1000) / 100) + "." +
         std::to_string(version % 100);
}

/// "550.54.15" from /proc/driver/nvidia/version, whose first line reads "NVRM version: NVIDIA
/// UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 ..." (proprietary module) or "... Open
/// Kernel Module for x86_64  580.65.06  Release Build ..." (open module): the first word after
/// "Kernel Module" made of digits and dots. "" when there is none.
inline std::string read_driver_version(const std::string& path = "/proc/driver/nvidia/version") {
  std::ifstream file(path);
  std::string line;
  if (!std::getline(file, line)) return "";
  const auto module = line.find("Kernel Module");
  if (module == std::string::npos) return "";
  std::istringstream words(line.substr(module + 13));
  std::string word;
  while (words >> word) {
    bool version = word.find('.') != std::string::npos && word.front() >= '0' && word.front() <= '9';
    for (char c : word) version = version && ((c >= '0' && c <= '9') || c == '.');
    if (version) return word;
  }
  return "";
}

}  // namespace detail

/// This node's driver, CUDA and NCCL versions (see the header comment).
inline SoftwareVersions probe_versions() {
  SoftwareVersions versions;
  versions.driver = detail::read_driver_version();
  if (versions.driver.empty()) versions.driver = "not found";
  using GetVersion = int (*)(int*);
  {
    detail::OpenedLibrary library({"libcuda.so.1", "libcuda.so"}, "cuDriverGetVersion");
    int version = 0;
    versions.cuda_driver = library.symbol != nullptr && reinterpret_cast<GetVersion>(library.symbol)(&version) == 0
                               ? detail::cuda_version_text(version)
                               : "not found";
  }
  {
    detail::OpenedLibrary library({"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"},
                                  "cudaRuntimeGetVersion");
    int version = 0;
    versions.cuda_runtime = library.symbol != nullptr && reinterpret_cast<GetVersion>(library.symbol)(&version) == 0
                                ? detail::cuda_version_text(version)
                                : "not found";
  }
  {
    detail::OpenedLibrary library({"libnccl.so.2", "libnccl.so"}, "ncclGetVersion");
    int version = 0;
    if (library.symbol != nullptr && reinterpret_cast<GetVersion>(library.symbol)(&version) == 0) {
      versions.nccl = detail::nccl_version_text(version);
      versions.nccl_path = library.path;
    } else {
      versions.nccl = "not found";
    }
  }
  return versions;
}

}  // namespace ncclkit::launch
