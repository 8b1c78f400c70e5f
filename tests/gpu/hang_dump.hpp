#pragma once
// A test-only diagnostic for calls that may hang: if the guarded scope has not ended within
// a limit, every thread of this process prints its call stack to stderr (glibc's backtrace;
// exported symbols only, e.g. NCCL's and CUDA's entry points, addresses elsewhere), so a
// GPU run that hangs says where it waits. It never ends the process: the test's own timeout
// does that.
#include <dirent.h>       // opendir, readdir: the threads in /proc/self/task
#include <execinfo.h>     // backtrace, backtrace_symbols_fd
#include <signal.h>       // sigaction, sigemptyset, SIGUSR2
#include <sys/syscall.h>  // SYS_gettid, SYS_tgkill
#include <unistd.h>       // syscall, write, getpid

#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstdio>              // std::snprintf, std::fprintf
#include <cstdlib>             // std::atol
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::thread, std::this_thread
#include <utility>             // std::move

namespace ncclkit_test {

namespace detail {
inline void print_own_stack(int) {
  // backtrace() and backtrace_symbols_fd() write no heap once libgcc is loaded (HangDump's
  // constructor loads it); good enough for a diagnostic of a process that is hung anyway.
  void* frames[48];
  const int depth = ::backtrace(frames, 48);
  char head[64];
  const int length = std::snprintf(head, sizeof head, "--- thread %ld:\n", static_cast<long>(::syscall(SYS_gettid)));
  if (length > 0) (void)!::write(2, head, static_cast<std::size_t>(length));
  ::backtrace_symbols_fd(frames, depth, 2);
}
}  // namespace detail

/// While alive, dumps every thread's stack once if `limit` passes before destruction.
class HangDump {
 public:
  HangDump(std::string what, std::chrono::milliseconds limit) : what_(std::move(what)) {
    void* warm[1];
    (void)::backtrace(warm, 1);  // loads libgcc now, not inside the signal handler
    struct sigaction action {};
    action.sa_handler = detail::print_own_stack;
    ::sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(SIGUSR2, &action, nullptr);
    thread_ = std::thread([this, limit] {
      std::unique_lock lock(mutex_);
      if (done_cv_.wait_for(lock, limit, [this] { return done_; })) return;
      std::fprintf(stderr, "HANG: %s still running after %lld ms; stacks of pid %d:\n", what_.c_str(),
                   static_cast<long long>(limit.count()), static_cast<int>(::getpid()));
      std::fflush(stderr);
      const long self = static_cast<long>(::syscall(SYS_gettid));
      if (DIR* tasks = ::opendir("/proc/self/task")) {
        while (const dirent* entry = ::readdir(tasks)) {
          const long tid = std::atol(entry->d_name);
          if (tid <= 0 || tid == self) continue;
          ::syscall(SYS_tgkill, ::getpid(), tid, SIGUSR2);
          std::this_thread::sleep_for(std::chrono::milliseconds(50));  // one thread's lines at a time
        }
        ::closedir(tasks);
      }
      std::fprintf(stderr, "HANG: end of stacks (%s)\n", what_.c_str());
      std::fflush(stderr);
    });
  }
  HangDump(const HangDump&) = delete;
  HangDump& operator=(const HangDump&) = delete;
  ~HangDump() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }

 private:
  std::string what_;
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

}  // namespace ncclkit_test
