// Where the knobs of ncclkit/core/knobs.hpp are read: the stores take the table's defaults and
// let the variable override their options when made, and a bad value is an error there. The
// knobs read once per process, NCCLKIT_LOG_LEVEL and NCCLKIT_GLOO_ISA, in child processes of
// their own: a value they cannot take is a ConfigError naming the variable, the value and what
// is allowed, raised where it can be (the first store made; the first use of the Gloo loops),
// never from a log line.
#include <doctest/doctest.h>

#include <sys/wait.h>  // waitpid, WIFEXITED, WEXITSTATUS
#include <unistd.h>    // fork, _exit

#include <chrono>      // std::chrono
#include <cstdlib>     // setenv
#include <cstring>     // std::strstr
#include <functional>  // std::function
#include <string>      // std::string

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/gloo/reduce_kernels.hpp"
#include "ncclkit/store/file_store.hpp"
#include "ncclkit/store/memory_store.hpp"
#include "ncclkit/store/tcp_store_options.hpp"
#include "support/env_variable.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"

namespace knob_readers_test {

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

}  // namespace knob_readers_test

using knob_readers_test::child_status;
using ncclkit_test::config_error_of;
using ncclkit_test::contains;
using ncclkit_test::EnvVariable;

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

TEST_CASE("the stores take the table's defaults, and the variable overrides the options they are given") {
  CHECK(ncclkit::TcpStoreOptions{}.timeout == std::chrono::seconds(300));
  CHECK(ncclkit::TcpStoreOptions{}.linger == std::chrono::seconds(30));
  CHECK(ncclkit::TcpStoreServerOptions{}.handshake_timeout == std::chrono::seconds(10));
  ncclkit_test::TempDir dir("knobs");
  {
    EnvVariable set("NCCLKIT_STORE_TIMEOUT", "1.5");
    CHECK(ncclkit::MemoryStore().default_timeout() == std::chrono::milliseconds(1500));
    ncclkit::FileStore store(dir.path, ncclkit::FileStoreOptions{.world_size = 1, .timeout = std::chrono::seconds(9)});
    CHECK(store.default_timeout() == std::chrono::milliseconds(1500));
  }
  CHECK(ncclkit::MemoryStore().default_timeout() == std::chrono::seconds(300));
}

TEST_CASE("a bad variable is an error where the object it configures is made, naming the variable") {
  ncclkit_test::TempDir dir("knobs");
  {
    EnvVariable bad("NCCLKIT_STORE_TIMEOUT", "soon");
    CHECK(contains(config_error_of([&] { ncclkit::FileStore store(dir.path, {.world_size = 1}); }),
                   "NCCLKIT_STORE_TIMEOUT='soon'"));
    CHECK(contains(config_error_of([] { ncclkit::MemoryStore store; }), "NCCLKIT_STORE_TIMEOUT='soon'"));
  }
  {
    EnvVariable bad("NCCLKIT_RUN_ID", "job-7");  // kText: anything is a value
    CHECK(config_error_of([&] { ncclkit::FileStore store(dir.path, {.world_size = 1}); }).empty());
  }
}
