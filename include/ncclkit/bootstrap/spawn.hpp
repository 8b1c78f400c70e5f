#pragma once
/// spawn(): runs a function in N forked worker processes that can rendezvous with each other,
/// and collects how each ended. Tests use it, and the launcher builds on it.
///
/// Fork before anything touches CUDA (or starts threads) in the parent: a forked child gets
/// only the calling thread, and a CUDA context does not survive fork.

#include <fcntl.h>      // open
#include <signal.h>     // kill, SIGTERM, SIGKILL
#include <stdlib.h>     // mkdtemp
#include <sys/prctl.h>  // prctl(PR_SET_PDEATHSIG)
#include <sys/types.h>  // pid_t
#include <sys/wait.h>   // waitpid
#include <unistd.h>     // fork, _exit

#include <cerrno>       // errno
#include <chrono>       // std::chrono
#include <cstdio>       // std::fflush
#include <cstring>      // strsignal
#include <exception>    // std::exception
#include <filesystem>   // std::filesystem::remove_all
#include <optional>     // std::optional (the TcpStore server of SpawnStore::kTcp)
#include <string>       // std::string
#include <type_traits>  // std::invoke_result_t
#include <vector>       // std::vector

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/store/detail/socket.hpp"
#include "ncclkit/store/tcp_store.hpp"

namespace ncclkit {

/// How one worker ended.
struct WorkerStatus {
  int rank = 0;
  pid_t pid = -1;
  bool exited = false;  ///< exited normally, with `exit_code`
  int exit_code = -1;
  int signal = 0;                 ///< killed by this signal (when !exited)
  bool stopped_by_spawn = false;  ///< spawn killed it (another worker failed, or the timeout)

  bool ok() const { return exited && exit_code == 0; }
  /// "rank 3 (pid 123) exited with code 1", "rank 2 (pid 99) was killed by signal 9 (Killed)".
  std::string describe() const {
    std::string text = "rank " + std::to_string(rank) + " (pid " + std::to_string(pid) + ") ";
    if (exited) {
      text += "exited with code " + std::to_string(exit_code);
    } else {
      text += "was killed by signal " + std::to_string(signal) + " (" + ::strsignal(signal) + ")";
    }
    if (stopped_by_spawn) text += ", stopped by spawn";
    return text;
  }
};

/// Which store spawn() gives its workers.
enum class SpawnStore {
  kFile,  ///< a FileStore in a private temporary folder: init_url "file://<dir>"
  kTcp,   ///< a TcpStoreServer in the calling process: init_url "tcp://127.0.0.1:PORT?server=external"
};

struct SpawnOptions {
  /// Whole-run limit; when it passes, every worker still running is killed.
  std::chrono::milliseconds timeout = std::chrono::minutes(10);
  /// After one worker fails, how long the others get between SIGTERM and SIGKILL.
  std::chrono::milliseconds grace = std::chrono::seconds(2);
  /// Rendezvous folder for the workers' FileStore; empty: a fresh temporary folder, removed at
  /// the end.
  std::string rendezvous_dir{};
  /// The workers' store. kTcp: the socket is bound (127.0.0.1, a free port) before forking and
  /// served by a TcpStoreServer thread started only after the last fork, so no process is
  /// forked while it runs threads; the server lives until every worker has ended.
  SpawnStore store = SpawnStore::kFile;
};

/// All workers' statuses, in rank order.
struct SpawnResult {
  std::vector<WorkerStatus> workers;
  bool timed_out = false;

  bool ok() const {
    for (const auto& w : workers)
      if (!w.ok()) return false;
    return !timed_out;
  }
  /// The first failure, for messages; "all N workers succeeded" when none failed.
  std::string describe() const {
    std::string text;
    for (const auto& w : workers) {
      if (!w.ok()) text += (text.empty() ? "" : "; ") + w.describe();
    }
    if (timed_out) text = "spawn timed out; " + text;
    return text.empty() ? "all " + std::to_string(workers.size()) + " workers succeeded" : text;
  }
};

namespace detail {

template <class Fn>
[[noreturn]] void run_spawned_worker(Fn& fn, const WorldInfo& world, pid_t parent) {
  // Die with the parent, even if it is SIGKILLed; then close the race where it died already.
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(1);
  // Start from default signal handling: handlers the parent installed (a test framework's
  // crash reporter, say) would misreport the SIGTERM spawn sends to stop a worker.
  for (int signal_number = 1; signal_number < NSIG; ++signal_number) {
    if (signal_number != SIGKILL && signal_number != SIGSTOP) ::signal(signal_number, SIG_DFL);
  }
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  set_log_rank(world.rank);
  int code = 0;
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<Fn&, const WorldInfo&>>) {
      fn(world);
    } else {
      code = static_cast<int>(fn(world));
    }
  } catch (const std::exception& e) {
    log_error(std::string("worker failed: ") + e.what());
    code = 1;
  } catch (...) {
    log_error("worker failed with an unknown exception");
    code = 1;
  }
  std::fflush(stdout);
  std::fflush(stderr);
  ::_exit(code);
}

/// While alive, SIGCHLD has its default disposition: with SIG_IGN or SA_NOCLDWAIT (set by some
/// daemons and frameworks) the kernel reaps children itself, and spawn could not learn how its
/// workers ended. Restores the caller's disposition afterwards. Changes process-wide state for
/// the length of a spawn, like the fork itself.
class DefaultChildSignal {
 public:
  DefaultChildSignal() {
    if (::sigaction(SIGCHLD, nullptr, &saved_) != 0) return;
    if (saved_.sa_handler != SIG_IGN && (saved_.sa_flags & SA_NOCLDWAIT) == 0) return;
    struct sigaction plain {};
    plain.sa_handler = SIG_DFL;
    sigemptyset(&plain.sa_mask);
    changed_ = ::sigaction(SIGCHLD, &plain, nullptr) == 0;
  }
  ~DefaultChildSignal() {
    if (changed_) ::sigaction(SIGCHLD, &saved_, nullptr);
  }
  DefaultChildSignal(const DefaultChildSignal&) = delete;
  DefaultChildSignal& operator=(const DefaultChildSignal&) = delete;

 private:
  struct sigaction saved_ {};
  bool changed_ = false;
};

inline void record_wait_status(WorkerStatus& worker, int status) {
  if (WIFEXITED(status)) {
    worker.exited = true;
    worker.exit_code = WEXITSTATUS(status);
  } else if (WIFSIGNALED(status)) {
    worker.exited = false;
    worker.signal = WTERMSIG(status);
  }
}

}  // namespace detail

/// Forks `nprocs` workers, each running `fn(const WorldInfo&)` (returning void or an exit
/// code; an exception counts as exit code 1 and is logged). Each worker's WorldInfo has its
/// rank, world_size = local_world_size = nprocs and init_url "file://<dir>" of a private
/// rendezvous folder (with SpawnStore::kTcp: "tcp://127.0.0.1:PORT?server=external" of a server in the
/// caller), so `make_store(world.init_url, ...)` gives every worker the same store.
///
/// Returns when all workers have ended. When one fails (non-zero exit or a signal), the others
/// get SIGTERM, then SIGKILL after `options.grace`; when `options.timeout` passes, all get
/// SIGKILL. Workers die with the calling process (PR_SET_PDEATHSIG). Not thread-safe with
/// respect to other fork()s in the same process. A caller's SIGCHLD set to SIG_IGN (or
/// SA_NOCLDWAIT) is switched to the default while spawn runs, so that workers' exit statuses
/// can be collected, and restored when it returns.
template <class Fn>
SpawnResult spawn(int nprocs, Fn&& fn, const SpawnOptions& options = {}) {
  if (nprocs < 1) {
    throw ConfigError("spawn: nprocs=" + std::to_string(nprocs) + " must be at least 1");
  }
  const bool tcp = options.store == SpawnStore::kTcp;
  detail::DefaultChildSignal child_signal;  // before the first fork: no worker may be auto-reaped
  // Bound and listening before the fork: workers' connections queue in its backlog until the
  // server thread (started after the last fork) accepts them.
  detail::Socket listener;
  int tcp_port = 0;
  if (tcp) {
    listener = detail::listen_tcp("127.0.0.1", 0);
    tcp_port = detail::local_port(listener.get());
  }
  std::string dir = options.rendezvous_dir;
  const bool own_dir = dir.empty() && !tcp;
  if (own_dir) {
    char pattern[] = "/tmp/ncclkit-spawn-XXXXXX";
    if (::mkdtemp(pattern) == nullptr) {
      throw ConfigError(std::string("spawn: cannot create a temporary rendezvous folder in /tmp: ") +
                        std::strerror(errno));
    }
    dir = pattern;
  }

  SpawnResult result;
  result.workers.resize(static_cast<std::size_t>(nprocs));
  std::fflush(stdout);
  std::fflush(stderr);
  for (int rank = 0; rank < nprocs; ++rank) {
    WorldInfo world;
    world.rank = rank;
    world.world_size = nprocs;
    world.local_rank = rank;
    world.local_world_size = nprocs;
    // server=external: the caller serves the store, so rank 0 must not start a second server.
    world.init_url = tcp ? "tcp://127.0.0.1:" + std::to_string(tcp_port) + "?server=external" : "file://" + dir;
    if (tcp) {
      world.master_addr = "127.0.0.1";
      world.master_port = tcp_port;
    }
    world.source = "spawn";
    const pid_t parent = ::getpid();
    // Signals stay blocked across fork until the child has reset its handlers, so an early
    // SIGTERM reaches the worker's default action, not a handler inherited from the caller.
    sigset_t all_signals, caller_mask;
    sigfillset(&all_signals);
    ::pthread_sigmask(SIG_BLOCK, &all_signals, &caller_mask);
    pid_t pid = ::fork();
    if (pid != 0) ::pthread_sigmask(SIG_SETMASK, &caller_mask, nullptr);
    if (pid == 0) {
      if (listener) ::close(listener.get());  // the parent serves it; _exit skips destructors
      detail::run_spawned_worker(fn, world, parent);
    }
    if (pid < 0) {
      int err = errno;
      for (int r = 0; r < rank; ++r) ::kill(result.workers[static_cast<std::size_t>(r)].pid, SIGKILL);
      for (int r = 0; r < rank; ++r) ::waitpid(result.workers[static_cast<std::size_t>(r)].pid, nullptr, 0);
      std::error_code ignored;
      if (own_dir) std::filesystem::remove_all(dir, ignored);
      throw ConfigError("spawn: fork of worker " + std::to_string(rank) + " of " + std::to_string(nprocs) +
                        " failed: " + std::strerror(err) + " (too many processes? check ulimit -u)");
    }
    result.workers[static_cast<std::size_t>(rank)].rank = rank;
    result.workers[static_cast<std::size_t>(rank)].pid = pid;
  }

  std::optional<TcpStoreServer> server;
  if (tcp) {
    try {
      server.emplace(TcpStoreServer::from_listening_socket(listener.release()));
    } catch (...) {
      for (const auto& w : result.workers) ::kill(w.pid, SIGKILL);
      for (const auto& w : result.workers) ::waitpid(w.pid, nullptr, 0);
      throw;
    }
  }

  using Clock = std::chrono::steady_clock;
  // Saturating: a huge timeout (milliseconds::max()) must not wrap into one already passed.
  const auto deadline = detail::deadline_after(options.timeout);
  std::vector<bool> done(static_cast<std::size_t>(nprocs), false);
  int remaining = nprocs;
  bool terminating = false;
  Clock::time_point kill_at{};
  // Children are polled (waitpid WNOHANG): from 200 µs, so that quick workers are reaped
  // quickly, doubling up to 10 ms while nothing happens, and from the start after each exit.
  detail::Backoff backoff(
      detail::BackoffPolicy{.first = std::chrono::microseconds(200), .cap = std::chrono::milliseconds(10)});
  while (remaining > 0) {
    bool progressed = false;
    for (int rank = 0; rank < nprocs; ++rank) {
      auto& worker = result.workers[static_cast<std::size_t>(rank)];
      if (done[static_cast<std::size_t>(rank)]) continue;
      int status = 0;
      pid_t got = ::waitpid(worker.pid, &status, WNOHANG);
      if (got == 0) continue;
      done[static_cast<std::size_t>(rank)] = true;
      --remaining;
      progressed = true;
      if (got < 0) {  // should not happen: our own child
        worker.exited = true;
        worker.exit_code = -1;
        continue;
      }
      detail::record_wait_status(worker, status);
      if (!worker.ok() && !terminating) {
        if (!worker.stopped_by_spawn) log_warn("spawn: " + worker.describe() + "; stopping the other workers");
        terminating = true;
        kill_at = detail::deadline_after(options.grace);
        for (int other = 0; other < nprocs; ++other) {
          if (done[static_cast<std::size_t>(other)]) continue;
          result.workers[static_cast<std::size_t>(other)].stopped_by_spawn = true;
          ::kill(result.workers[static_cast<std::size_t>(other)].pid, SIGTERM);
        }
      }
    }
    if (remaining == 0) break;
    const auto now = Clock::now();
    if (!terminating && now >= deadline) {
      result.timed_out = true;
      terminating = true;
      kill_at = now;
      for (int other = 0; other < nprocs; ++other)
        if (!done[static_cast<std::size_t>(other)])
          result.workers[static_cast<std::size_t>(other)].stopped_by_spawn = true;
    }
    if (terminating && now >= kill_at) {
      for (int other = 0; other < nprocs; ++other)
        if (!done[static_cast<std::size_t>(other)])
          ::kill(result.workers[static_cast<std::size_t>(other)].pid, SIGKILL);
      kill_at = now + std::chrono::seconds(1);  // re-send if something is slow to die
    }
    if (progressed) {
      backoff.reset();
    } else {
      backoff.sleep(terminating ? kill_at : deadline);
    }
  }
  if (own_dir) {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  }
  return result;
}

}  // namespace ncclkit
