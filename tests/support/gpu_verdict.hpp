#pragma once
// The GPU tests' decisions to run, skip or fail, apart from CUDA so that a host test can check
// them (tests/host/test_gpu_verdict.cpp): whether the test program runs at all, from what the
// driver and CUDA say (tests/gpu/gpu_main.cpp), and which world sizes and features a test runs
// with the GPUs it sees (tests/gpu/nccl_support.hpp: world_sizes, have_gpus).
#include <cstdlib>  // std::strtol
#include <string>   // std::string
#include <vector>   // std::vector

namespace ncclkit_test {

/// What CUDA said when asked for the number of devices: `devices`, or `error` (its name and
/// text; empty when the count was taken).
struct CudaGpuCount {
  int devices = 0;
  std::string error;
};

/// Run the tests, report them skipped (exit code 77, which CTest shows as Skipped), or fail.
struct GpuVerdict {
  enum class Kind { kRun, kSkip, kFail };
  Kind kind = Kind::kRun;
  std::string message;  ///< what was found, for the test's output (empty to run)
  int exit_code() const { return kind == Kind::kSkip ? 77 : (kind == Kind::kFail ? 1 : 0); }
};

/// `driver_visible`: the GPUs this process may use by the driver's account (nvidia-smi, /proc,
/// the device nodes /dev/nvidia<N>, after CUDA_VISIBLE_DEVICES), described by `driver`.
/// A skip only where no GPU is visible; where one is, CUDA failing to count it, or counting none,
/// is a failure of the run, not a machine without GPUs.
inline GpuVerdict gpu_verdict(int driver_visible, const std::string& driver, const CudaGpuCount& cuda) {
  if (cuda.error.empty() && cuda.devices > 0) return {};
  const std::string said = cuda.error.empty() ? "CUDA counts " + std::to_string(cuda.devices) + " devices"
                                              : "CUDA failed to count them: " + cuda.error;
  if (driver_visible <= 0) {
    return {GpuVerdict::Kind::kSkip, "SKIPPED: no GPU visible (driver: " + driver + "; " + said + ")"};
  }
  return {GpuVerdict::Kind::kFail,
          "FAILED: " + std::to_string(driver_visible) + " GPU(s) visible to the driver (" + driver + "), but " + said +
              ". The GPU tests cannot run: check the driver and the CUDA runtime (a driver older than the "
              "runtime, a GPU in a bad state); where the GPUs should be hidden, set CUDA_VISIBLE_DEVICES to \"\"."};
}

/// The largest world the GPU tests run: their integer inputs keep results of up to 4 ranks
/// inside their type, and their poison outside every such result (nccl_support.hpp).
inline constexpr int kMaxWorld = 4;

/// What a test runs of what it asks for: `sizes` (world sizes) or `run` (a feature), the
/// `skips` to print as SKIP lines, and the `failures` to report as failed checks.
struct GpuPlan {
  std::vector<int> sizes;
  bool run = false;
  std::vector<std::string> skips, failures;
};

namespace detail {
/// NCCLKIT_TEST_REQUIRE_GPUS's value (`text`; null or empty: 0), or a failure in `plan`.
inline int required_gpus(const char* text, GpuPlan& plan) {
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long n = std::strtol(text, &end, 10);
  if (*end != '\0' || n < 0 || n > 1024) {
    plan.failures.push_back(std::string("NCCLKIT_TEST_REQUIRE_GPUS='") + text +
                            "' is not a GPU count (a whole number, 0 to 1024)");
    return 0;
  }
  return static_cast<int>(n);
}

/// `what` needs `needed` GPUs and `gpus` are visible: a SKIP line, or a failure where the run
/// requires that many (`required`).
inline void not_enough_gpus(const std::string& what, int needed, int gpus, int required, GpuPlan& plan) {
  if (needed <= required) {
    plan.failures.push_back(what + " needs " + std::to_string(needed) + " GPUs and NCCLKIT_TEST_REQUIRE_GPUS=" +
                            std::to_string(required) + " says they must run, but only " + std::to_string(gpus) +
                            " are visible: is CUDA_VISIBLE_DEVICES narrower than the run meant, or is a GPU missing?");
  } else {
    plan.skips.push_back(what + " needs " + std::to_string(needed) + " GPUs, " + std::to_string(gpus) + " visible");
  }
}
}  // namespace detail

/// The world sizes a test runs with `gpus` visible GPUs: 1, 2 and 4, or those of `list` (the
/// value of NCCLKIT_TEST_WORLD_SIZES, e.g. "2,4"; null or empty: the default), each that fits.
/// Skipped sizes are SKIP lines, or failures where `required` (NCCLKIT_TEST_REQUIRE_GPUS's
/// value) asks for that many GPUs: a GPU run on N GPUs cannot pass having run less than N GPUs
/// can. A list that is not one, or that leaves nothing to run, is a failure, not a test of
/// nothing.
inline GpuPlan plan_world_sizes(int gpus, const char* list, const char* required_text) {
  GpuPlan plan;
  const int required = detail::required_gpus(required_text, plan);
  std::vector<int> wanted{1, 2, 4};
  const bool listed = list != nullptr && *list != '\0';
  if (listed) {
    wanted.clear();
    for (const char* p = list; *p != '\0';) {
      char* end = nullptr;
      const long n = std::strtol(p, &end, 10);
      if (end == p || n < 1 || n > kMaxWorld || (*end != ',' && *end != '\0') || (*end == ',' && end[1] == '\0')) {
        plan.failures.push_back(std::string("NCCLKIT_TEST_WORLD_SIZES='") + list +
                                "' is not a comma-separated list of world sizes from 1 to " +
                                std::to_string(kMaxWorld));
        return plan;
      }
      wanted.push_back(static_cast<int>(n));
      p = *end == ',' ? end + 1 : end;
    }
  }
  for (int n : wanted) {
    if (n <= gpus) {
      plan.sizes.push_back(n);
    } else {
      detail::not_enough_gpus("world size " + std::to_string(n), n, gpus, required, plan);
    }
  }
  if (plan.sizes.empty()) {
    plan.failures.push_back("no world size to run with " + std::to_string(gpus) + " visible GPU(s)" +
                            (listed ? std::string(" among NCCLKIT_TEST_WORLD_SIZES=") + list : std::string()) +
                            ": the test would run nothing");
  }
  return plan;
}

/// Whether `what`, which needs `needed` GPUs, runs with `gpus` visible: where not, a SKIP line,
/// or a failure where `required` (NCCLKIT_TEST_REQUIRE_GPUS's value) asks for that many.
inline GpuPlan plan_feature(int gpus, int needed, const std::string& what, const char* required_text) {
  GpuPlan plan;
  const int required = detail::required_gpus(required_text, plan);
  plan.run = gpus >= needed;
  if (!plan.run) detail::not_enough_gpus(what, needed, gpus, required, plan);
  return plan;
}

}  // namespace ncclkit_test
