// The knobs read once per process (ncclkit/core/knobs.hpp): NCCLKIT_LOG_LEVEL and
// NCCLKIT_GLOO_ISA. A value they cannot take is a ConfigError naming the variable, the value and
// what is allowed, raised where it can be (the first store made; the first use of the Gloo
// loops), never from a log line. Each case runs in a child process of its own.
#include <doctest/doctest.h>

#include <sys/wait.h>  // waitpid, WIFEXITED, WEXITSTATUS
#include <unistd.h>    // fork, _exit

#include <cstdlib>     // setenv
#include <cstring>     // std::strstr
#include <functional>  // std::function
#include <string>      // std::string

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/gloo/reduce_kernels.hpp"
#include "ncclkit/store/memory_store.hpp"

namespace knobs_processes_test {

/// Exit status of a child that sets `name` to `value` and runs `body`: 0 when `body` throws a
/// ConfigError whose message holds every one of `expected` (or, with `expected` empty, when it
/// throws nothing), 1 otherwise.
int child_status(const char* name, const char* value, const std::function<void()>& body,
                 std::initializer_list<const char*> expected) {
  const pid_t pid = fork();
  if (pid == 0) {
    ::setenv(name, value, 1);
    try {
      body();
      _exit(expected.size() == 0 ? 0 : 1);
    } catch (const ncclkit::ConfigError& e) {
      for (const char* part : expected) {
        if (std::strstr(e.what(), part) == nullptr) _exit(1);
      }
      _exit(expected.size() == 0 ? 1 : 0);
    } catch (...) {
      _exit(1);
    }
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid) return -1;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

}  // namespace knobs_processes_test

using knobs_processes_test::child_status;

TEST_CASE(
    "NCCLKIT_LOG_LEVEL: read once per process; a bad value is a ConfigError from the first store, not a log line") {
  const auto quiet_then_store = [] {
    ncclkit::log(ncclkit::LogLevel::kError, "a log line never throws");  // level read here
    ncclkit::MemoryStore store;
  };
  CHECK(child_status("NCCLKIT_LOG_LEVEL", "loud", quiet_then_store,
                     {"NCCLKIT_LOG_LEVEL='loud'", "one of: error, warn, warning, info, debug"}) == 0);
  CHECK(child_status("NCCLKIT_LOG_LEVEL", "debug",
                     [] {
                       ncclkit::MemoryStore store;
                       if (!ncclkit::log_enabled(ncclkit::LogLevel::kDebug))
                         throw ncclkit::ConfigError("debug not enabled");
                     },
                     {}) == 0);
  CHECK(child_status("NCCLKIT_LOG_LEVEL", "error",
                     [] {
                       if (ncclkit::log_enabled(ncclkit::LogLevel::kWarn)) throw ncclkit::ConfigError("warn enabled");
                     },
                     {}) == 0);
}

TEST_CASE("NCCLKIT_GLOO_ISA: read once per process; a value that is no ISA is a ConfigError naming it") {
  CHECK(child_status("NCCLKIT_GLOO_ISA", "avx512", [] { (void)ncclkit::gloo::default_isa(); },
                     {"NCCLKIT_GLOO_ISA='avx512'", "one of: generic, avx2"}) == 0);
  CHECK(child_status("NCCLKIT_GLOO_ISA", "generic",
                     [] {
                       if (ncclkit::gloo::default_isa() != ncclkit::gloo::KernelIsa::kGeneric) {
                         throw ncclkit::ConfigError("not generic");
                       }
                     },
                     {}) == 0);
}
