#pragma once
// Helpers shared by the GPU tests.
#include <cuda_runtime.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>    // std::snprintf, std::sscanf
#include <cstring>   // std::strlen
#include <optional>  // std::optional
#include <string>    // std::string

#include "support/gpu_verdict.hpp"

namespace ncclkit_test {

/// What cudaGetDeviceCount says, asked in a child process so that this process never
/// initialises CUDA before it forks workers (a CUDA context does not survive fork()).
inline CudaGpuCount cuda_gpu_count() {
  static std::optional<CudaGpuCount> cached;
  if (cached) return *cached;
  CudaGpuCount result;
  int fds[2];
  if (::pipe(fds) != 0) return *(cached = CudaGpuCount{0, "pipe() failed: cannot ask CUDA in a child process"});
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    char text[512];
    if (status == cudaSuccess) {
      std::snprintf(text, sizeof text, "%d", count);
    } else {
      std::snprintf(text, sizeof text, "error %s (%s)", cudaGetErrorName(status), cudaGetErrorString(status));
    }
    const bool written = ::write(fds[1], text, std::strlen(text)) == static_cast<ssize_t>(std::strlen(text));
    ::_exit(written ? 0 : 1);
  }
  ::close(fds[1]);
  std::string said;
  char buffer[256];
  for (ssize_t n; pid > 0 && (n = ::read(fds[0], buffer, sizeof buffer)) > 0;)
    said.append(buffer, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  if (pid < 0) {
    result.error = "fork() failed: cannot ask CUDA in a child process";
  } else if (::waitpid(pid, &status, 0) != pid || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    result.error =
        "the process asking CUDA for the device count did not end normally (status " + std::to_string(status) + ")";
  } else if (said.rfind("error ", 0) == 0) {
    result.error = said.substr(6);
  } else if (std::sscanf(said.c_str(), "%d", &result.devices) != 1) {
    result.error = "no answer from the process asking CUDA for the device count";
  }
  return *(cached = result);
}

/// Number of GPUs CUDA sees, counted in a child process (cuda_gpu_count); -1 when the count
/// could not be taken.
inline int visible_gpu_count() {
  const CudaGpuCount count = cuda_gpu_count();
  return count.error.empty() ? count.devices : -1;
}

}  // namespace ncclkit_test
