// Runner of the GPU tests: reports "skipped" to CTest (exit code 77) where no GPU is visible,
// instead of passing without having run anything; where a GPU is visible to the driver but
// CUDA cannot count it, fails (exit code 1) with CUDA's error. Host code only: the C++
// compiler builds it.
//
// The GPU count is taken in a short-lived child process: CUDA must not be initialised in this
// process, since tests fork workers and a CUDA context does not survive fork().
#include <cstdio>

#include "gpu/gpu_support.hpp"
#include "ncclkit/bootstrap/local_gpus.hpp"
#include "support/doctest_runner.hpp"
#include "support/gpu_verdict.hpp"

int main(int argc, char** argv) {
  const ncclkit_test::CudaGpuCount cuda = ncclkit_test::cuda_gpu_count();
  if (!cuda.error.empty() || cuda.devices <= 0) {
    // Only now ask the driver (nvidia-smi, /proc, /dev/nvidia<N>): a GPU there that CUDA cannot
    // count is a failure, not a machine without GPUs.
    const auto driver = ncclkit::find_gpus();
    const auto verdict = ncclkit_test::gpu_verdict(static_cast<int>(driver.visible.size()),
                                                   driver.describe() + ", from " + driver.source, cuda);
    std::printf("%s\n", verdict.message.c_str());
    return verdict.exit_code();
  }
  return ncclkit_test::run_doctest(argc, argv);
}
