#pragma once
// Helpers shared by the GPU tests.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

namespace ncclkit_test {

/// Number of visible GPUs, counted in a child process so that this process never initialises
/// CUDA before it forks workers. -1 when the count could not be taken.
inline int visible_gpu_count() {
  static int cached = -2;
  if (cached != -2) return cached;
  pid_t pid = ::fork();
  if (pid == 0) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    ::_exit(count > 100 ? 100 : count);
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return cached = -1;
  return cached = WEXITSTATUS(status);
}

}  // namespace ncclkit_test
