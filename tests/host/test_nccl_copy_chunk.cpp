// The batched copy's chunk size (ncclkit/nccl/detail/kernel_hooks.hpp): 16 KiB by default,
// NCCLKIT_COPY_CHUNK_KB to change it, a ConfigError naming the variable for a value it cannot
// take. The value is read once per process, so each case runs in a child of its own.
#include <doctest/doctest.h>

#include <sys/wait.h>  // waitpid, WIFEXITED, WEXITSTATUS
#include <unistd.h>    // fork, _exit

#include <cstdlib>  // setenv, unsetenv
#include <cstring>  // std::strstr
#include <string>   // std::string

#include "ncclkit/core/error.hpp"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"

namespace {

// In a child process: with NCCLKIT_COPY_CHUNK_KB set to `value` (unset when null), 0 when
// copy_chunk_bytes() gives `bytes` (0: when it throws a ConfigError that names the variable),
// 1 otherwise.
int child_status(const char* value, unsigned long long bytes) {
  const pid_t pid = fork();
  if (pid == 0) {
    if (value != nullptr) {
      setenv("NCCLKIT_COPY_CHUNK_KB", value, 1);
    } else {
      unsetenv("NCCLKIT_COPY_CHUNK_KB");
    }
    try {
      _exit(ncclkit::nccl::detail::copy_chunk_bytes() == bytes && bytes != 0 ? 0 : 1);
    } catch (const ncclkit::ConfigError& e) {
      _exit(bytes == 0 && std::strstr(e.what(), "NCCLKIT_COPY_CHUNK_KB") != nullptr ? 0 : 1);
    } catch (...) {
      _exit(1);
    }
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace

TEST_CASE("copy chunk: 16 KiB by default, NCCLKIT_COPY_CHUNK_KB to change it, bad values named") {
  CHECK(child_status(nullptr, 16 << 10) == 0);
  CHECK(child_status("4", 4 << 10) == 0);
  CHECK(child_status("1024", 1024 << 10) == 0);
  for (const char* bad : {"0", "2", "48", "2048", "-16", "16k", "lots"}) {
    CAPTURE(std::string(bad));
    CHECK(child_status(bad, 0) == 0);
  }
}
