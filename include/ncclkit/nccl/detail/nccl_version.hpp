#pragma once
/// NCCL's version codes (NCCL_VERSION_CODE, ncclGetVersion) in words, and whether the fused
/// compressed all-reduce's kernel, compiled against one NCCL, may run with another. Plain C++:
/// no NCCL header needed.

#include <string>  // std::string

namespace ncclkit::nccl::detail {

/// "2.28.9" for NCCL's version code 22809 (NCCL_VERSION(2, 28, 9); from 2.9 on, major * 10000 +
/// minor * 100 + patch).
inline std::string nccl_version_text(int code) {
  return std::to_string(code / 10000) + "." + std::to_string(code / 100 % 100) + "." + std::to_string(code % 100);
}

/// Why the fused kernel, compiled against NCCL `built` (NCCL_VERSION_CODE), cannot run with NCCL
/// `running` (ncclGetVersion), or empty where it may: the same major and minor version. The
/// kernel reads NCCL's window structure as the headers it was compiled against lay it out;
/// patch releases have kept the fields it reads in place while adding others, and
/// CompressedReduce::create checks them on every rank before the kernel runs.
inline std::string device_api_version_verdict(int built, int running) {
  if (built / 100 == running / 100) return {};
  return "ncclkit was built against NCCL " + nccl_version_text(built) + " and runs with NCCL " +
         nccl_version_text(running) +
         "; the fused kernel reads NCCL's device structures and needs the same major and minor version: build "
         "ncclkit against the headers of the NCCL it runs with";
}

/// Why the window's structure, read as the kernel reads it, does not lead this rank to the memory
/// it registered (CompressedReduce::create's check).
inline std::string window_layout_problem(int built, int running, const std::string& what) {
  return "NCCL " + nccl_version_text(running) + " lays out its window structure otherwise than the NCCL " +
         nccl_version_text(built) + " headers ncclkit was built against (" + what +
         "): build ncclkit against the headers of the NCCL it runs with";
}

}  // namespace ncclkit::nccl::detail
