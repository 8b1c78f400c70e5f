// The GPU tests' decisions (tests/support/gpu_verdict.hpp): the runner (tests/gpu/gpu_main.cpp)
// skips only where no GPU is visible, and fails where the driver shows a GPU CUDA cannot count;
// a test skips a world size or a feature that needs more GPUs with a SKIP line, which becomes a
// failure where the run requires that many GPUs (NCCLKIT_TEST_REQUIRE_GPUS).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "support/gpu_verdict.hpp"
#include "support/text.hpp"

using ncclkit_test::CudaGpuCount;
using ncclkit_test::gpu_verdict;
using ncclkit_test::GpuVerdict;

TEST_CASE("GPUs that CUDA counts run the tests, whatever the driver's listing says") {
  CHECK(gpu_verdict(2, "2 x NVIDIA H100", CudaGpuCount{2, ""}).kind == GpuVerdict::Kind::kRun);
  CHECK(gpu_verdict(0, "none", CudaGpuCount{1, ""}).kind == GpuVerdict::Kind::kRun);
  CHECK(gpu_verdict(2, "2 x NVIDIA H100", CudaGpuCount{2, ""}).exit_code() == 0);
}

TEST_CASE("no GPU visible to the driver is a skip (77), whatever CUDA says") {
  for (const CudaGpuCount& cuda : {CudaGpuCount{0, ""}, CudaGpuCount{0, "cudaErrorNoDevice (no CUDA-capable device)"},
                                   CudaGpuCount{0, "cudaErrorInsufficientDriver (driver too old)"}}) {
    const GpuVerdict verdict = gpu_verdict(0, "none, from none", cuda);
    CHECK(verdict.kind == GpuVerdict::Kind::kSkip);
    CHECK(verdict.exit_code() == 77);
    CHECK(ncclkit_test::contains(verdict.message, "SKIPPED: no GPU visible"));
  }
}

TEST_CASE("a GPU the driver shows and CUDA fails to count is a failure naming CUDA's error") {
  const GpuVerdict failed = gpu_verdict(4, "4 x NVIDIA H100, from nvidia-smi",
                                        CudaGpuCount{0, "cudaErrorInsufficientDriver (driver too old)"});
  CHECK(failed.kind == GpuVerdict::Kind::kFail);
  CHECK(failed.exit_code() == 1);
  CHECK(ncclkit_test::contains(failed.message, "cudaErrorInsufficientDriver"));
  CHECK(ncclkit_test::contains(failed.message, "4 GPU(s) visible"));
  // CUDA answering, but with no device: a failure too.
  const GpuVerdict none = gpu_verdict(1, "1 x NVIDIA H200, from /dev/nvidia*", CudaGpuCount{0, ""});
  CHECK(none.kind == GpuVerdict::Kind::kFail);
  CHECK(ncclkit_test::contains(none.message, "CUDA counts 0 devices"));
}

TEST_CASE("world sizes that need more GPUs than are visible are SKIP lines, unless the run requires them") {
  using ncclkit_test::plan_world_sizes;
  // 2 GPUs, nothing required: worlds 1 and 2 run, 4 is a SKIP line.
  const auto free = plan_world_sizes(2, nullptr, nullptr);
  CHECK(free.sizes == std::vector<int>{1, 2});
  REQUIRE(free.skips.size() == 1);
  CHECK(free.skips[0] == "world size 4 needs 4 GPUs, 2 visible");
  CHECK(free.failures.empty());
  // The run requires 2 GPUs: world 4 still needs more than that, a SKIP line.
  const auto two = plan_world_sizes(2, nullptr, "2");
  CHECK(two.sizes == std::vector<int>{1, 2});
  CHECK(two.skips.size() == 1);
  CHECK(two.failures.empty());
  // The run requires 4 and only 2 are visible: skipping world 4 is a failure.
  const auto four = plan_world_sizes(2, nullptr, "4");
  CHECK(four.sizes == std::vector<int>{1, 2});
  CHECK(four.skips.empty());
  REQUIRE(four.failures.size() == 1);
  CHECK(ncclkit_test::contains(four.failures[0], "world size 4 needs 4 GPUs and NCCLKIT_TEST_REQUIRE_GPUS=4"));
}

TEST_CASE("a NCCLKIT_TEST_WORLD_SIZES that leaves nothing to run, or is no list, is a failure") {
  using ncclkit_test::plan_world_sizes;
  CHECK(plan_world_sizes(4, "2,4", nullptr).sizes == std::vector<int>{2, 4});
  CHECK(plan_world_sizes(4, "2,4", nullptr).failures.empty());
  // "2,4" on 1 GPU: nothing fits.
  const auto nothing = plan_world_sizes(1, "2,4", nullptr);
  CHECK(nothing.sizes.empty());
  CHECK(nothing.skips.size() == 2);
  REQUIRE(nothing.failures.size() == 1);
  CHECK(ncclkit_test::contains(nothing.failures[0], "the test would run nothing"));
  for (const std::string bad : {"two", "2;4", "0", "8", "2,", "2,x"}) {
    CAPTURE(bad);
    const auto plan = plan_world_sizes(4, bad.c_str(), nullptr);
    CHECK(plan.sizes.empty());
    CHECK_FALSE(plan.failures.empty());
  }
  // No GPU counted at all (CUDA failed): nothing to run is a failure too.
  CHECK_FALSE(plan_world_sizes(0, nullptr, nullptr).failures.empty());
}

TEST_CASE("a feature that needs more GPUs is a SKIP line, or a failure where the run requires that many") {
  using ncclkit_test::plan_feature;
  const auto skipped = plan_feature(2, 3, "peer failure through the store", "2");
  CHECK_FALSE(skipped.run);
  CHECK(skipped.skips == std::vector<std::string>{"peer failure through the store needs 3 GPUs, 2 visible"});
  CHECK(skipped.failures.empty());
  const auto failed = plan_feature(1, 2, "the collective argument check", "2");
  CHECK_FALSE(failed.run);
  CHECK(failed.skips.empty());
  CHECK(failed.failures.size() == 1);
  const auto runs = plan_feature(4, 3, "the late-rank drill", "4");
  CHECK(runs.run);
  CHECK(runs.skips.empty());
  CHECK(runs.failures.empty());
  // A required count that is not one is a failure, whatever runs.
  const auto garbled = plan_feature(4, 2, "x", "four");
  CHECK(garbled.run);
  CHECK(garbled.failures.size() == 1);
}
