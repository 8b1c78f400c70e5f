#pragma once
// Runs a shell command for the tests of the project's scripts: what it printed and its exit status.
#include <doctest/doctest.h>

#include <stdio.h>     // popen, pclose
#include <sys/wait.h>  // WIFEXITED, WEXITSTATUS

#include <cstddef>  // std::size_t
#include <cstdio>   // std::fread
#include <string>   // std::string

namespace ncclkit_test {

/// What a shell command did.
struct ShellRun {
  int status = -1;     ///< its exit status; -1 where it did not exit (a signal ended it)
  std::string output;  ///< standard output and standard error together, in the order written
};

/// Runs `command` with `sh -c` and waits for it to end. Its standard error goes where its
/// standard output goes, so that a test sees a script's message beside what it printed.
/// Blocks as long as the command runs: a command that can hang carries its own `timeout`.
inline ShellRun run_shell(const std::string& command) {
  const std::string both = "{ " + command + "\n} 2>&1";
  std::FILE* pipe = ::popen(both.c_str(), "r");
  REQUIRE_MESSAGE(pipe != nullptr, "popen failed for: " << command);
  ShellRun result;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;) result.output.append(buffer, n);
  const int status = ::pclose(pipe);
  result.status = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return result;
}

}  // namespace ncclkit_test
