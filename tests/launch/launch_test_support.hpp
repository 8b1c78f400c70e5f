#pragma once
// Helpers for the launcher's tests: run ncclkit-run (and the test worker) as real processes,
// with output captured in files, and wait for things with deadlines (never a fixed sleep).
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "support/ports.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"

#ifndef NCCLKIT_RUN_EXE
#error "NCCLKIT_RUN_EXE (the launcher's path) is set by tests/launch/CMakeLists.txt"
#endif

namespace launch_test {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline const std::string kLauncher = NCCLKIT_RUN_EXE;
inline const std::string kWorker = NCCLKIT_LAUNCH_WORKER_EXE;

/// The tests' TempDir (support/temp_dir.hpp) with the accessors the launch tests use.
class TempDir {
 public:
  TempDir() : dir_("launch-test") {}
  const std::string& path() const { return dir_.path; }
  std::string operator/(const std::string& name) const { return dir_.path + "/" + name; }

 private:
  ncclkit_test::TempDir dir_;
};

inline std::string read_file(const std::string& path) {
  std::ifstream file(path);
  std::stringstream text;
  text << file.rdbuf();
  return text.str();
}

/// Polls `done` every few ms until it holds or `limit` passes; whether it held.
inline bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (!done()) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(2ms);
  }
  return true;
}

/// Whether `pid` is a living process (a zombie counts as dead: it only awaits reaping).
inline bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const auto close = text.rfind(')');
  if (close == std::string::npos || close + 2 >= text.size()) return false;
  return text[close + 2] != 'Z' && text[close + 2] != 'X';
}

/// The pids in DIR's files matching *.pid, by file name.
inline std::map<std::string, pid_t> read_pids(const std::string& dir) {
  std::map<std::string, pid_t> pids;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(dir, error)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".pid") continue;
    const pid_t pid = std::atoi(read_file(entry.path().string()).c_str());
    if (pid > 0) pids[name] = pid;
  }
  return pids;
}

/// A started process (the launcher, usually) with its output going to files.
struct Process {
  pid_t pid = -1;
  std::string out_path;
  std::string err_path;
  int status = -1;  ///< shell-style: exit code, or 128 + signal; -1 while running
  std::chrono::milliseconds ran{0};
  Clock::time_point started;

  std::string out() const { return read_file(out_path); }
  std::string err() const { return read_file(err_path); }
  std::string output() const { return "--- stdout:\n" + out() + "--- stderr:\n" + err(); }

  /// Waits up to `limit` for the process to end; kills it (SIGKILL) if it does not, and
  /// returns false then.
  bool wait(std::chrono::milliseconds limit = 60s) {
    if (status >= 0) return true;
    const auto deadline = Clock::now() + limit;
    for (;;) {
      int raw = 0;
      const pid_t got = ::waitpid(pid, &raw, WNOHANG);
      if (got == pid) {
        status = WIFEXITED(raw) ? WEXITSTATUS(raw) : 128 + WTERMSIG(raw);
        ran = std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
        return true;
      }
      if (Clock::now() > deadline) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &raw, 0);
        status = 128 + SIGKILL;
        return false;
      }
      std::this_thread::sleep_for(2ms);
    }
  }
};

/// Starts `argv` with the test's environment plus `extra_env` ("NAME=value"; "NAME" alone
/// removes NAME), stdout and stderr into files in `dir` named after `tag`.
inline Process start(const std::vector<std::string>& argv, const std::string& dir, const std::string& tag,
                     const std::vector<std::string>& extra_env = {}) {
  Process process;
  process.out_path = dir + "/" + tag + ".out";
  process.err_path = dir + "/" + tag + ".err";
  std::vector<std::string> environment;
  for (char** entry = environ; *entry != nullptr; ++entry) environment.emplace_back(*entry);
  for (const auto& change : extra_env) {
    const std::string name = change.substr(0, change.find('='));
    std::erase_if(environment, [&](const std::string& e) { return e.substr(0, e.find('=')) == name; });
    if (change.find('=') != std::string::npos) environment.push_back(change);
  }
  std::vector<char*> args, envp;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  for (const auto& e : environment) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  const int out = ::open(process.out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int err = ::open(process.err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  REQUIRE(out >= 0);
  REQUIRE(err >= 0);
  std::fflush(stdout);
  std::fflush(stderr);
  process.started = Clock::now();
  process.pid = ::fork();
  REQUIRE(process.pid >= 0);
  if (process.pid == 0) {
    ::dup2(out, 1);
    ::dup2(err, 2);
    ::execve(args[0], args.data(), envp.data());
    ::_exit(126);
  }
  ::close(out);
  ::close(err);
  return process;
}

/// ncclkit-run with `launcher_args`, then `--`, the test worker and `worker_steps`.
inline Process start_launcher(const std::vector<std::string>& launcher_args,
                              const std::vector<std::string>& worker_steps, const std::string& dir,
                              const std::string& tag = "launcher", const std::vector<std::string>& extra_env = {}) {
  std::vector<std::string> argv{kLauncher};
  argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
  if (!worker_steps.empty()) {
    argv.push_back("--");
    argv.push_back(kWorker);
    argv.insert(argv.end(), worker_steps.begin(), worker_steps.end());
  }
  return start(argv, dir, tag, extra_env);
}

/// Runs the launcher to the end (at most `limit`).
inline Process run_launcher(const std::vector<std::string>& launcher_args, const std::vector<std::string>& worker_steps,
                            const std::string& dir, const std::vector<std::string>& extra_env = {},
                            std::chrono::milliseconds limit = 60s) {
  Process process = start_launcher(launcher_args, worker_steps, dir, "launcher", extra_env);
  const bool ended = process.wait(limit);
  CHECK_MESSAGE(ended, "the launcher did not end within the limit\n", process.output());
  return process;
}

/// Lines of `text` that start with `prefix`.
inline std::vector<std::string> lines_starting_with(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  std::string line;
  while (std::getline(stream, line))
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  return lines;
}

using ncclkit_test::contains;

using ncclkit_test::free_port;

}  // namespace launch_test
