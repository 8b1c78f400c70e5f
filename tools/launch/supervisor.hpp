#pragma once
/// run_worker_group(): starts this node's workers, relays their output, and supervises them
/// until all have ended, one has failed, the launcher was told to stop, or another node asked
/// for a stop. Nothing outlives it: no worker, no process a worker left behind, no zombie.
///
/// How each promise is kept:
/// - Workers die with the launcher, even on SIGKILL: each sets PR_SET_PDEATHSIG(SIGKILL)
///   between fork and exec, then checks getppid() to close the race where the launcher died
///   before the prctl.
/// - One failure stops the group: the others get SIGTERM (to their whole process group, so
///   their own children too), then SIGKILL after the grace period.
/// - No orphans: the launcher is a child subreaper, so whatever a worker leaves running is
///   re-parented to it; when the workers have ended, those leftovers get SIGTERM, then SIGKILL.
/// - No zombies: every child (worker or adopted leftover) is reaped with waitpid().
/// - Output: each worker's stdout and stderr are pipes, read by this loop into whole lines
///   (LinePrefixer), written to the launcher's stdout/stderr with the rank prefix and to the
///   rank's log file.
/// - Blame: when the group did not succeed, a report lists every worker in the order it ended,
///   with its exit code or signal and the time since the start, the ones still running at the
///   stop with the time since their last output, and a worker that exited 0 while the others
///   still ran (before the first failure) first, as the likely cause (launch/group_result.hpp).
/// - Signals: SIGINT/SIGTERM/SIGHUP/SIGQUIT to the launcher are forwarded to every worker's
///   process group and stop the group (SIGKILL after the grace period, or at a second one);
///   SIGUSR1/SIGUSR2 are forwarded only.
///
/// Each worker is the leader of its own process group, so a terminal's Ctrl-C reaches the
/// workers once (forwarded), not twice; their stdin is /dev/null.

#include <fcntl.h>       // open, O_*
#include <poll.h>        // poll, pollfd
#include <signal.h>      // kill, sigprocmask, signal, SIG*
#include <sys/prctl.h>   // prctl, PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER
#include <sys/stat.h>    // mode constants for open
#include <sys/types.h>   // pid_t
#include <sys/wait.h>    // waitpid, W*
#include <unistd.h>      // fork, execvpe, setpgid, pipe2, dup2, read, close, getpid, getppid, _exit

#include <algorithm>   // std::min
#include <cerrno>      // errno
#include <chrono>      // std::chrono
#include <climits>     // INT_MAX
#include <cstring>     // std::strerror
#include <filesystem>  // std::filesystem::create_directories
#include <functional>  // std::function
#include <map>         // std::map
#include <optional>    // std::optional
#include <set>         // std::set
#include <string>      // std::string
#include <vector>      // std::vector

#include "launch/detail/process_tree.hpp"
#include "launch/group_result.hpp"
#include "launch/output.hpp"
#include "launch/signals.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/time_format.hpp"

namespace ncclkit::launch {

/// One worker to start.
struct WorkerSpec {
  int rank = 0;
  int local_rank = 0;
  std::vector<std::string> argv;         ///< argv[0] is looked up in PATH
  std::vector<std::string> environment;  ///< "NAME=value" entries (build_worker_environment)
};

/// Knobs of run_worker_group().
struct SuperviseOptions {
  /// Between SIGTERM and SIGKILL when stopping workers and leftovers.
  std::chrono::milliseconds grace = std::chrono::seconds(5);
  /// Where worker output goes (the launcher's stdout and stderr by default).
  int out_fd = 1;
  int err_fd = 2;
  /// When not empty: each rank's output is also appended to <log_dir>/rank_<R>.log.
  std::string log_dir;
  /// Written to each log file before the worker starts (e.g. which attempt this is).
  std::string log_header;
  /// Called about every `check_interval` while workers run (never while stopping); a reason
  /// returned stops the group (kStoppedFromOutside). Must not block for long: the launcher
  /// uses it to look for stop requests from other nodes in the store.
  std::function<std::optional<std::string>()> check_stop;
  std::chrono::milliseconds check_interval = std::chrono::milliseconds(200);
  /// Called once, at the first worker failure, right after SIGTERM went to the others (to
  /// tell the other nodes quickly), with the result so far (`failed` set, failure_summary()
  /// ready). Must not block for long.
  std::function<void(const GroupResult&)> on_failure;
  /// The launcher's own messages ("rank 3 ... failed; stopping ..."); default: a line
  /// "ncclkit-run: <message>" on err_fd.
  std::function<void(const std::string&)> report;
  /// How long to keep reading output once every process has ended, for pipes held open by
  /// something unkillable.
  std::chrono::milliseconds drain_timeout = std::chrono::seconds(2);
};

namespace detail {

/// Sends `sig` to the worker's process group (reaching its children too); to the worker
/// alone when it left the group.
inline void signal_worker(pid_t pid, int sig) {
  if (::kill(-pid, sig) != 0) ::kill(pid, sig);
}

/// What the child does between fork and exec. Only async-signal-safe calls: the launcher
/// may have threads (a TCP store server), and a forked child of a threaded process must not
/// allocate or take locks.
[[noreturn]] inline void exec_worker(char* const* argv, char* const* envp, int out_fd, int err_fd, int null_fd,
                                     int error_fd, pid_t launcher) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(128 + SIGKILL);  // the launcher died before the prctl
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  // Handlers are reset by exec, ignored signals are not: give the worker the defaults.
  for (int sig : kCaughtSignals) ::signal(sig, SIG_DFL);
  ::signal(SIGPIPE, SIG_DFL);
  ::dup2(null_fd, 0);
  ::dup2(out_fd, 1);
  ::dup2(err_fd, 2);
  ::execvpe(argv[0], argv, envp);
  const int err = errno;
  [[maybe_unused]] ssize_t ignored = ::write(error_fd, &err, sizeof err);
  ::_exit(127);
}

/// One running worker's bookkeeping.
struct WorkerSlot {
  pid_t pid = -1;
  bool running = false;
  int out_pipe = -1;  ///< read ends; -1 once closed
  int err_pipe = -1;
  int log_fd = -1;
  std::optional<LinePrefixer> out_lines;
  std::optional<LinePrefixer> err_lines;
};

inline void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

}  // namespace detail

/// Starts `specs` and supervises them as described in the header comment. Returns when every
/// worker and every leftover process has ended and their output has been written. Uses (and
/// requires) the process's SignalCatcher. Throws Error only before any worker starts (log
/// folder or pipes cannot be created); a worker that cannot be executed is kStartFailed.
inline GroupResult run_worker_group(const std::vector<WorkerSpec>& specs, SignalCatcher& signals,
                                    const SuperviseOptions& options = {}) {
  using Clock = std::chrono::steady_clock;
  auto report = [&](const std::string& message) {
    if (options.report) {
      options.report(message);
    } else {
      detail::write_fully(options.err_fd, "ncclkit-run: " + message + "\n");
    }
  };

  GroupResult result;
  const std::size_t count = specs.size();
  result.workers.resize(count);
  std::vector<detail::WorkerSlot> slots(count);

  // The launcher adopts whatever its workers leave behind (see the header comment).
  ::prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t self = ::getpid();
  // Children the caller had before: not ours to clean up.
  const std::set<pid_t> earlier_children = detail::children_of(self);

  if (!options.log_dir.empty()) {
    std::error_code error;
    std::filesystem::create_directories(options.log_dir, error);
    if (error) {
      throw ConfigError("ncclkit-run: cannot create --log-dir '" + options.log_dir + "': " + error.message());
    }
  }
  auto close_everything = [&]() {
    for (auto& slot : slots) {
      detail::close_fd(slot.out_pipe);
      detail::close_fd(slot.err_pipe);
      detail::close_fd(slot.log_fd);
    }
  };

  // Everything the children need is prepared before the first fork (see exec_worker).
  const int null_fd = ::open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd < 0) throw Error(std::string("ncclkit-run: cannot open /dev/null: ") + std::strerror(errno));
  std::vector<std::vector<char*>> argvs(count), envps(count);
  for (std::size_t i = 0; i < count; ++i) {
    if (specs[i].argv.empty()) {
      ::close(null_fd);
      throw ConfigError("ncclkit-run: worker " + std::to_string(specs[i].rank) + " has no program");
    }
    for (const auto& a : specs[i].argv) argvs[i].push_back(const_cast<char*>(a.c_str()));
    argvs[i].push_back(nullptr);
    for (const auto& e : specs[i].environment) envps[i].push_back(const_cast<char*>(e.c_str()));
    envps[i].push_back(nullptr);
    auto& slot = slots[i];
    if (!options.log_dir.empty()) {
      const std::string path = options.log_dir + "/rank_" + std::to_string(specs[i].rank) + ".log";
      slot.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
      if (slot.log_fd < 0) {
        const int err = errno;
        close_everything();
        ::close(null_fd);
        throw ConfigError("ncclkit-run: cannot open log file '" + path + "': " + std::strerror(err));
      }
      if (!options.log_header.empty()) detail::write_fully(slot.log_fd, options.log_header + "\n");
    }
    const std::string prefix = "[rank " + std::to_string(specs[i].rank) + "] ";
    slot.out_lines.emplace(prefix, options.out_fd, slot.log_fd);
    slot.err_lines.emplace(prefix, options.err_fd, slot.log_fd);
  }

  SignalCatcher::set_workers_running(true);
  // Times in the report count from here.
  const Clock::time_point started = Clock::now();
  auto since_start = [&]() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started);
  };
  for (std::size_t i = 0; i < count; ++i) {
    auto& slot = slots[i];
    auto& worker = result.workers[i];
    worker.rank = specs[i].rank;
    worker.local_rank = specs[i].local_rank;
    int out_fds[2] = {-1, -1}, err_fds[2] = {-1, -1}, error_fds[2] = {-1, -1};
    bool piped = ::pipe2(out_fds, O_CLOEXEC) == 0 && ::pipe2(err_fds, O_CLOEXEC) == 0 &&
                 ::pipe2(error_fds, O_CLOEXEC) == 0;
    pid_t pid = -1;
    int fork_errno = 0;
    if (piped) {
      pid = ::fork();
      if (pid == 0) {
        detail::exec_worker(argvs[i].data(), envps[i].data(), out_fds[1], err_fds[1], null_fd, error_fds[1], self);
      }
      fork_errno = errno;
    } else {
      fork_errno = errno;
    }
    for (int fd : {out_fds[1], err_fds[1], error_fds[1]})
      if (fd >= 0) ::close(fd);
    int exec_errno = 0;
    if (pid > 0) {
      ::setpgid(pid, pid);  // also here: whichever of parent and child runs first wins the race
      // The error pipe closes on a successful exec; otherwise it carries exec's errno.
      ssize_t n;
      do {
        n = ::read(error_fds[0], &exec_errno, sizeof exec_errno);
      } while (n < 0 && errno == EINTR);
      if (n != static_cast<ssize_t>(sizeof exec_errno)) exec_errno = 0;
    }
    if (error_fds[0] >= 0) ::close(error_fds[0]);
    if (pid <= 0 || exec_errno != 0) {
      for (int fd : {out_fds[0], err_fds[0]})
        if (fd >= 0) ::close(fd);
      result.outcome = GroupOutcome::kStartFailed;
      if (pid <= 0) {
        result.message = "cannot start worker rank " + std::to_string(specs[i].rank) + ": " +
                         (piped ? "fork failed: " : "pipe failed: ") + std::strerror(fork_errno) +
                         " (too many processes or open files? check ulimit -u and ulimit -n)";
        result.start_status = 1;
      } else {
        int status = 0;
        while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
        }
        result.message = "cannot execute '" + specs[i].argv[0] + "' for rank " + std::to_string(specs[i].rank) +
                         ": " + std::strerror(exec_errno) +
                         (exec_errno == ENOENT ? " (not found: give a path, or check PATH)" : "");
        result.start_status = exec_errno == ENOENT ? 127 : 126;
      }
      worker.pid = pid;
      break;
    }
    slot.pid = pid;
    slot.running = true;
    worker.pid = pid;
    slot.out_pipe = out_fds[0];
    slot.err_pipe = err_fds[0];
    ::fcntl(slot.out_pipe, F_SETFL, O_NONBLOCK);
    ::fcntl(slot.err_pipe, F_SETFL, O_NONBLOCK);
  }
  ::close(null_fd);

  std::map<pid_t, std::size_t> index_of;
  for (std::size_t i = 0; i < count; ++i)
    if (slots[i].running) index_of[slots[i].pid] = i;
  std::size_t running = index_of.size();

  bool stopping = false;
  bool killed = false;
  Clock::time_point kill_at{};
  auto stop_group = [&](int sig) {
    stopping = true;
    if (!result.stopped_at) result.stopped_at = since_start();
    kill_at = Clock::now() + options.grace;
    for (auto& slot : slots)
      if (slot.running) detail::signal_worker(slot.pid, sig);
  };
  if (result.outcome == GroupOutcome::kStartFailed) {
    report(result.message + "; stopping the workers already started");
    stop_group(SIGKILL);
  }

  auto read_pipe = [&](int& fd, LinePrefixer& lines, WorkerExit& worker) {
    char buffer[65536];
    for (int rounds = 0; rounds < 16; ++rounds) {  // bounded: other pipes get their turn
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n > 0) {
        // Output is the only sign of progress the launcher sees; what comes after the stop
        // (a worker reporting its SIGTERM) is not progress.
        if (!stopping) worker.last_output_at = since_start();
        lines.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      lines.finish();  // EOF (or an error): flush the unfinished last line
      detail::close_fd(fd);
      return;
    }
  };

  // Reaps every ended child of ours: workers, and leftovers adopted as subreaper. Where the
  // caller had children of its own, only ours are waited for (their statuses are the caller's).
  auto next_ended_child = [&](int& status) -> pid_t {
    if (earlier_children.empty()) {
      for (;;) {
        const pid_t pid = ::waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR) continue;
        return pid;
      }
    }
    std::set<pid_t> candidates = detail::children_of(self, /*include_zombies=*/true);
    for (const auto& [pid, index] : index_of) candidates.insert(pid);
    for (pid_t pid : candidates) {
      if (earlier_children.count(pid) != 0) continue;
      const pid_t got = ::waitpid(pid, &status, WNOHANG);
      if (got > 0) return got;
    }
    return 0;
  };
  auto reap = [&]() {
    for (;;) {
      int status = 0;
      const pid_t pid = next_ended_child(status);
      if (pid <= 0) return;
      auto it = index_of.find(pid);
      if (it == index_of.end() || !slots[it->second].running) continue;  // an adopted leftover
      auto& slot = slots[it->second];
      auto& worker = result.workers[it->second];
      slot.running = false;
      --running;
      worker.ended_at = since_start();
      result.end_order.push_back(it->second);
      if (WIFEXITED(status)) {
        worker.exited = true;
        worker.exit_code = WEXITSTATUS(status);
      } else {
        worker.exited = false;
        worker.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
      }
      worker.stopped_by_launcher = stopping;
      if (!worker.ok() && !stopping) {
        // What the workers wrote before this failure is in their pipes now: read it first, so
        // that it counts as their last progress and comes out before the failure's report.
        for (std::size_t i = 0; i < count; ++i) {
          if (slots[i].out_pipe >= 0) read_pipe(slots[i].out_pipe, *slots[i].out_lines, result.workers[i]);
          if (slots[i].err_pipe >= 0) read_pipe(slots[i].err_pipe, *slots[i].err_lines, result.workers[i]);
        }
        result.outcome = GroupOutcome::kWorkerFailed;
        result.failed = static_cast<int>(it->second);
        std::string message = result.failure_summary();
        if (running > 0) {
          message += "; stopping the other " + std::to_string(running) + " worker" + (running == 1 ? "" : "s") +
                     " (SIGTERM now, SIGKILL after " + ncclkit::format_seconds(options.grace) + ")";
        }
        report(message);
        // Local workers first: telling the other nodes goes through the store, which may be slow.
        stop_group(SIGTERM);
        if (options.on_failure) options.on_failure(result);
      }
    }
  };

  // Leftovers: processes below the launcher, other than the caller's earlier children, once
  // every worker has ended.
  bool leftovers_signalled = false;
  Clock::time_point leftovers_kill_at{};
  std::optional<Clock::time_point> drain_deadline;
  auto next_check = Clock::now() + options.check_interval;

  for (;;) {
    const auto now = Clock::now();
    // Stop requests from outside, only while the group runs normally.
    if (!stopping && running > 0 && options.check_stop && now >= next_check) {
      if (auto reason = options.check_stop()) {
        result.outcome = GroupOutcome::kStoppedFromOutside;
        result.message = *reason;
        report(*reason + "; stopping this node's " + std::to_string(running) + " worker" +
               (running == 1 ? "" : "s"));
        stop_group(SIGTERM);
      }
      next_check = Clock::now() + options.check_interval;
    }
    if (stopping && running > 0 && Clock::now() >= kill_at) {
      if (!killed) {
        std::string stuck;
        for (std::size_t i = 0; i < count; ++i)
          if (slots[i].running) stuck += (stuck.empty() ? "" : ", ") + std::to_string(specs[i].rank);
        report("rank(s) " + stuck + " still running after the grace period; sending SIGKILL");
      }
      killed = true;
      for (auto& slot : slots)
        if (slot.running) detail::signal_worker(slot.pid, SIGKILL);
      kill_at = Clock::now() + std::chrono::seconds(1);  // again, should one be slow to die
    }

    bool pipes_open = false;
    for (auto& slot : slots) pipes_open = pipes_open || slot.out_pipe >= 0 || slot.err_pipe >= 0;
    if (running == 0) {
      const auto leftovers = detail::descendants_of(self, earlier_children);
      if (!leftovers.empty()) {
        if (!leftovers_signalled) {
          report(std::to_string(leftovers.size()) + " process(es) left behind by the workers; sending SIGTERM");
          for (pid_t pid : leftovers) ::kill(pid, SIGTERM);
          leftovers_signalled = true;
          leftovers_kill_at = Clock::now() + options.grace;
        } else if (Clock::now() >= leftovers_kill_at) {
          for (pid_t pid : leftovers) ::kill(pid, SIGKILL);
          leftovers_kill_at = Clock::now() + std::chrono::seconds(1);
        }
      } else {
        if (!pipes_open) break;
        if (!drain_deadline) drain_deadline = Clock::now() + options.drain_timeout;
        if (Clock::now() >= *drain_deadline) break;
      }
    }

    // Wait for output, a signal, or the next deadline.
    std::vector<pollfd> fds;
    std::vector<std::pair<std::size_t, bool>> owners;  // worker index, is stderr
    fds.push_back(pollfd{signals.fd(), POLLIN, 0});
    for (std::size_t i = 0; i < count; ++i) {
      if (slots[i].out_pipe >= 0) {
        fds.push_back(pollfd{slots[i].out_pipe, POLLIN, 0});
        owners.emplace_back(i, false);
      }
      if (slots[i].err_pipe >= 0) {
        fds.push_back(pollfd{slots[i].err_pipe, POLLIN, 0});
        owners.emplace_back(i, true);
      }
    }
    auto wake = Clock::now() + std::chrono::milliseconds(500);
    if (!stopping && running > 0 && options.check_stop) wake = std::min(wake, next_check);
    if (stopping && running > 0) wake = std::min(wake, kill_at);
    if (running == 0) wake = std::min(wake, Clock::now() + std::chrono::milliseconds(20));
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(wait_ms, 0, INT_MAX)));
    if (ready < 0 && errno != EINTR) {
      report(std::string("poll failed: ") + std::strerror(errno));
    }

    for (int sig : signals.take()) {
      if (sig == SIGCHLD) continue;  // reaped below, every round
      if (sig == SIGUSR1 || sig == SIGUSR2) {
        for (auto& slot : slots)
          if (slot.running) detail::signal_worker(slot.pid, sig);
        continue;
      }
      if (!stopping) {
        result.outcome = GroupOutcome::kInterrupted;
        result.launcher_signal = sig;
        result.message = "the launcher got " + signal_name(sig);
        report("got " + signal_name(sig) + "; forwarding it to " + std::to_string(running) + " worker" +
               (running == 1 ? "" : "s") + " (SIGKILL after the grace period or at a second signal)");
        stop_group(sig);
      } else if (running > 0) {
        kill_at = Clock::now();  // a second signal: no more grace
      }
    }
    if (ready > 0) {
      for (std::size_t k = 1; k < fds.size(); ++k) {
        if (fds[k].revents == 0) continue;
        auto& slot = slots[owners[k - 1].first];
        auto& worker = result.workers[owners[k - 1].first];
        if (owners[k - 1].second) {
          read_pipe(slot.err_pipe, *slot.err_lines, worker);
        } else {
          read_pipe(slot.out_pipe, *slot.out_lines, worker);
        }
      }
    }
    reap();
  }

  // Pipes still open here belong to something that could not be killed: flush what came.
  for (auto& slot : slots) {
    if (slot.out_pipe >= 0) slot.out_lines->finish();
    if (slot.err_pipe >= 0) slot.err_lines->finish();
  }
  close_everything();
  reap();
  SignalCatcher::set_workers_running(false);
  for (const std::string& line : result.report_lines()) report(line);
  return result;
}

}  // namespace ncclkit::launch
