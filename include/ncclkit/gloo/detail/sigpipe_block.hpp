#pragma once
/// SigpipeBlock: keeps a dead peer's broken connection from killing this process while Gloo
/// writes to it. Internal to the Gloo communicator.

#include <pthread.h>  // pthread_sigmask
#include <signal.h>   // sigset_t, SIGPIPE, sigpending, sigtimedwait

#include <cerrno>  // errno, EINTR

namespace ncclkit::gloo::detail {

/// Blocks SIGPIPE in the calling thread while Gloo uses sockets. Gloo writes with writev(),
/// which raises SIGPIPE when the peer has gone; its default action kills the process, so a
/// dead peer would kill the survivors instead of making them throw CommError. (Python, and so
/// PyTorch, ignores SIGPIPE process-wide; a C++ library must not change the process's signal
/// dispositions.) With SIGPIPE blocked the write fails with EPIPE, which Gloo reports as an
/// IoException. A SIGPIPE left pending by such a write is consumed before the mask is
/// restored. Threads created while it is active (Gloo's device loop thread) inherit the mask.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    active_ = ::pthread_sigmask(SIG_BLOCK, &set, &previous_) == 0 && !sigismember(&previous_, SIGPIPE);
  }
  ~SigpipeBlock() {
    if (!active_) return;  // it was blocked already: leave it so
    sigset_t pending;
    sigemptyset(&pending);
    if (::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGPIPE);
      const timespec zero{0, 0};
      while (::sigtimedwait(&set, nullptr, &zero) == -1 && errno == EINTR) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t previous_{};
  bool active_ = false;
};

}  // namespace ncclkit::gloo::detail
