#pragma once
/// `SignalCatcher`: turns the signals the launcher cares about into bytes on a pipe (the
/// self-pipe pattern), so that the supervision loop waits for worker output, child exits and
/// SIGINT/SIGTERM in one poll() and handles all of them outside signal context.
///
/// Caught: SIGCHLD (a worker ended), SIGINT, SIGTERM, SIGHUP, SIGQUIT (forwarded to the
/// workers, then the group is stopped), SIGUSR1, SIGUSR2 (forwarded only). SIGPIPE is ignored:
/// a closed output must not kill the launcher; workers get it back at its default.
///
/// While no workers run (`set_workers_running(false)`, e.g. during the rendezvous), SIGINT,
/// SIGTERM, SIGHUP and SIGQUIT take their default action at once: there is nothing to forward
/// them to, and a launcher blocked in a store wait must still die when asked.

#include <fcntl.h>   // O_CLOEXEC, O_NONBLOCK
#include <signal.h>  // sigaction, raise, SIG*
#include <unistd.h>  // pipe2, read, write, close

#include <array>    // std::array
#include <atomic>   // std::atomic
#include <cerrno>   // errno
#include <cstring>  // std::strerror
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/core/error.hpp"

namespace ncclkit::launch {

namespace detail {

inline std::atomic<int>& signal_pipe_write_end() {
  static std::atomic<int> fd{-1};
  return fd;
}
inline std::atomic<bool>& workers_running_flag() {
  static std::atomic<bool> running{false};
  return running;
}

inline constexpr std::array<int, 7> kCaughtSignals = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

inline bool is_stop_signal(int sig) { return sig == SIGINT || sig == SIGTERM || sig == SIGHUP || sig == SIGQUIT; }

/// The handler: async-signal-safe (write, signal, raise only).
inline void on_caught_signal(int sig) {
  const int saved_errno = errno;
  if (is_stop_signal(sig) && !workers_running_flag().load()) {
    ::signal(sig, SIG_DFL);
    ::raise(sig);
  }
  const int fd = signal_pipe_write_end().load();
  if (fd >= 0) {
    const unsigned char byte = static_cast<unsigned char>(sig);
    [[maybe_unused]] ssize_t ignored = ::write(fd, &byte, 1);  // a full pipe loses a duplicate: fine
  }
  errno = saved_errno;
}

}  // namespace detail

/// Installs the handlers for its lifetime and restores the previous ones afterwards. At most
/// one may exist at a time in a process (the handlers are process-wide).
class SignalCatcher {
 public:
  SignalCatcher() {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
      throw Error(std::string("ncclkit-run: cannot create the signal pipe: ") + std::strerror(errno));
    }
    int expected = -1;
    if (!detail::signal_pipe_write_end().compare_exchange_strong(expected, fds[1])) {
      ::close(fds[0]);
      ::close(fds[1]);
      throw Error("ncclkit-run: a SignalCatcher exists already in this process (only one at a time)");
    }
    read_fd_ = fds[0];
    write_fd_ = fds[1];
    struct sigaction action {};
    action.sa_handler = detail::on_caught_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART | SA_NOCLDSTOP;
    for (std::size_t i = 0; i < detail::kCaughtSignals.size(); ++i) {
      ::sigaction(detail::kCaughtSignals[i], &action, &previous_[i]);
    }
    struct sigaction ignore {};
    ignore.sa_handler = SIG_IGN;
    sigemptyset(&ignore.sa_mask);
    ::sigaction(SIGPIPE, &ignore, &previous_pipe_);
  }

  ~SignalCatcher() {
    for (std::size_t i = 0; i < detail::kCaughtSignals.size(); ++i) {
      ::sigaction(detail::kCaughtSignals[i], &previous_[i], nullptr);
    }
    ::sigaction(SIGPIPE, &previous_pipe_, nullptr);
    detail::workers_running_flag().store(false);
    detail::signal_pipe_write_end().store(-1);
    ::close(read_fd_);
    ::close(write_fd_);
  }

  SignalCatcher(const SignalCatcher&) = delete;
  SignalCatcher& operator=(const SignalCatcher&) = delete;

  /// Readable when a signal arrived; poll() it, then call take().
  int fd() const { return read_fd_; }

  /// The signals that arrived since the last call, in order (duplicates may be merged).
  std::vector<int> take() {
    std::vector<int> signals;
    unsigned char buffer[256];
    for (;;) {
      const ssize_t n = ::read(read_fd_, buffer, sizeof buffer);
      if (n > 0) {
        for (ssize_t i = 0; i < n; ++i) signals.push_back(buffer[i]);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      break;  // EAGAIN: empty
    }
    return signals;
  }

  /// See the header comment: whether stop signals are forwarded (true) or kill the launcher.
  static void set_workers_running(bool running) { detail::workers_running_flag().store(running); }

 private:
  int read_fd_ = -1;
  int write_fd_ = -1;
  std::array<struct sigaction, detail::kCaughtSignals.size()> previous_{};
  struct sigaction previous_pipe_ {};
};

/// "SIGABRT" for 6, "signal 77" for an unnamed one.
inline std::string signal_name(int sig) {
  switch (sig) {
    case SIGHUP:
      return "SIGHUP";
    case SIGINT:
      return "SIGINT";
    case SIGQUIT:
      return "SIGQUIT";
    case SIGILL:
      return "SIGILL";
    case SIGTRAP:
      return "SIGTRAP";
    case SIGABRT:
      return "SIGABRT";
    case SIGBUS:
      return "SIGBUS";
    case SIGFPE:
      return "SIGFPE";
    case SIGKILL:
      return "SIGKILL";
    case SIGUSR1:
      return "SIGUSR1";
    case SIGSEGV:
      return "SIGSEGV";
    case SIGUSR2:
      return "SIGUSR2";
    case SIGPIPE:
      return "SIGPIPE";
    case SIGALRM:
      return "SIGALRM";
    case SIGTERM:
      return "SIGTERM";
    case SIGCHLD:
      return "SIGCHLD";
    case SIGXCPU:
      return "SIGXCPU";
    case SIGXFSZ:
      return "SIGXFSZ";
    case SIGSYS:
      return "SIGSYS";
    default:
      return "signal " + std::to_string(sig);
  }
}

}  // namespace ncclkit::launch
