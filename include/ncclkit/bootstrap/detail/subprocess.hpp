#pragma once
/// Runs a helper command (nvidia-smi) and captures its standard output, with a deadline: a
/// wedged driver can make nvidia-smi hang, and the launcher must not hang with it.

#include <fcntl.h>     // open, O_RDWR, O_CLOEXEC
#include <poll.h>      // poll
#include <signal.h>    // kill, SIGKILL
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, execvp, pipe2, dup2, read, close, _exit

#include <cerrno>    // errno, EINTR
#include <chrono>    // std::chrono
#include <climits>   // INT_MAX
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

namespace ncclkit::detail {

/// The standard output of `argv` (looked up in PATH) when it exits with status 0 within
/// `timeout`; nullopt when it cannot be started, fails, or runs too long (it is killed then).
/// Standard error is discarded. Forks: call it before worker processes are started.
inline std::optional<std::string> capture_command(const std::vector<std::string>& argv,
                                                  std::chrono::milliseconds timeout) {
  if (argv.empty()) return std::nullopt;
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0) return std::nullopt;
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], 1);
    if (null_fd >= 0) {
      ::dup2(null_fd, 0);
      ::dup2(null_fd, 2);
    }
    ::execvp(args[0], args.data());
    ::_exit(127);
  }
  ::close(fds[1]);
  if (null_fd >= 0) ::close(null_fd);
  if (pid < 0) {
    ::close(fds[0]);
    return std::nullopt;
  }
  using Clock = std::chrono::steady_clock;
  const auto deadline = Clock::now() + timeout;
  std::string output;
  bool timed_out = false;
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = ::poll(&p, 1, left > INT_MAX ? INT_MAX : static_cast<int>(left));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) continue;  // re-check the deadline
    char buffer[4096];
    const ssize_t n = ::read(fds[0], buffer, sizeof buffer);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;  // EOF: the command closed its output (normally: it exited)
    output.append(buffer, static_cast<std::size_t>(n));
    if (output.size() > (1u << 20)) {
      timed_out = true;  // more than any sane answer: treat as broken
      break;
    }
  }
  ::close(fds[0]);
  if (timed_out) ::kill(pid, SIGKILL);
  int status = 0;
  // After EOF the command exits promptly; bound the wait anyway and kill it when it does not.
  const auto reap_deadline = Clock::now() + std::chrono::seconds(2);
  for (;;) {
    const pid_t got = ::waitpid(pid, &status, WNOHANG);
    if (got == pid) break;
    if (got < 0 && errno != EINTR) return std::nullopt;
    if (Clock::now() >= reap_deadline) {
      ::kill(pid, SIGKILL);
      timed_out = true;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    ::poll(nullptr, 0, 5);
  }
  if (timed_out || !WIFEXITED(status) || WEXITSTATUS(status) != 0) return std::nullopt;
  return output;
}

}  // namespace ncclkit::detail
