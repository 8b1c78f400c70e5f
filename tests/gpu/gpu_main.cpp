// Runner of the GPU tests: reports "skipped" to CTest (exit code 77) where no GPU is visible,
// instead of passing without having run anything. Host code only: the C++ compiler builds it.
//
// The GPU count is taken in a short-lived child process: CUDA must not be initialised in this
// process, since tests fork workers and a CUDA context does not survive fork().
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>

#include "gpu/gpu_support.hpp"
#include "support/doctest_runner.hpp"

int main(int argc, char** argv) {
  int devices = ncclkit_test::visible_gpu_count();
  if (devices <= 0) {
    std::printf("SKIPPED: no GPU visible (CUDA reports %d devices)\n", devices < 0 ? 0 : devices);
    return 77;
  }
  return ncclkit_test::run_doctest(argc, argv);
}
