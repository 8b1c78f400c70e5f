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

#include <fcntl.h>      // open, O_*
#include <poll.h>       // poll, pollfd
#include <signal.h>     // kill, sigprocmask, signal, SIG*
#include <sys/prctl.h>  // prctl, PR_SET_PDEATHSIG, PR_SET_CHILD_SUBREAPER
#include <sys/stat.h>   // mode constants for open
#include <sys/types.h>  // pid_t
#include <sys/wait.h>   // waitpid, W*
#include <unistd.h>     // fork, execvpe, setpgid, pipe2, dup2, read, close, getpid, getppid, _exit

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

/// One run of run_worker_group(), in its steps: prepare() what the children need before the
/// first fork, start() the workers, watch() them until everything has ended, and give the
/// verdict() (the result and the report). Each step leaves the state the next one needs; the
/// destructor closes whatever descriptors an exception left open.
class WorkerGroup {
 public:
  using Clock = std::chrono::steady_clock;

  WorkerGroup(const std::vector<WorkerSpec>& specs, SignalCatcher& signals, const SuperviseOptions& options)
      : specs_(specs), signals_(signals), options_(options), slots_(specs.size()) {
    result_.workers.resize(specs.size());
  }
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;
  ~WorkerGroup() {
    close_pipes_and_logs();
    close_fd(null_fd_);
  }

  /// Becomes the subreaper, creates the log folder and files, opens /dev/null and builds each
  /// worker's argv and environment: everything the children need is ready before the first
  /// fork (see exec_worker). Throws ConfigError or Error; no worker has started then.
  void prepare() {
    // The launcher adopts whatever its workers leave behind (see the header comment).
    ::prctl(PR_SET_CHILD_SUBREAPER, 1);
    self_ = ::getpid();
    // Children the caller had before: not ours to clean up.
    earlier_children_ = children_of(self_);

    if (!options_.log_dir.empty()) {
      std::error_code error;
      std::filesystem::create_directories(options_.log_dir, error);
      if (error) {
        throw ConfigError("ncclkit-run: cannot create --log-dir '" + options_.log_dir + "': " + error.message());
      }
    }
    null_fd_ = ::open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd_ < 0) throw Error(std::string("ncclkit-run: cannot open /dev/null: ") + std::strerror(errno));
    argvs_.resize(specs_.size());
    envps_.resize(specs_.size());
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      if (specs_[i].argv.empty()) {
        throw ConfigError("ncclkit-run: worker " + std::to_string(specs_[i].rank) + " has no program");
      }
      for (const auto& a : specs_[i].argv) argvs_[i].push_back(const_cast<char*>(a.c_str()));
      argvs_[i].push_back(nullptr);
      for (const auto& e : specs_[i].environment) envps_[i].push_back(const_cast<char*>(e.c_str()));
      envps_[i].push_back(nullptr);
      auto& slot = slots_[i];
      if (!options_.log_dir.empty()) {
        const std::string path = options_.log_dir + "/rank_" + std::to_string(specs_[i].rank) + ".log";
        slot.log_fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        if (slot.log_fd < 0) {
          const int err = errno;
          throw ConfigError("ncclkit-run: cannot open log file '" + path + "': " + std::strerror(err));
        }
        if (!options_.log_header.empty()) write_fully(slot.log_fd, options_.log_header + "\n");
      }
      const std::string prefix = "[rank " + std::to_string(specs_[i].rank) + "] ";
      slot.out_lines.emplace(prefix, options_.out_fd, slot.log_fd);
      slot.err_lines.emplace(prefix, options_.err_fd, slot.log_fd);
    }
  }

  /// Starts the workers in rank order. At the first that cannot start (no fork, no pipe, no
  /// exec), the result is kStartFailed and the workers already started get SIGKILL.
  void start() {
    SignalCatcher::set_workers_running(true);
    // Times in the report count from here.
    started_ = Clock::now();
    for (std::size_t i = 0; i < specs_.size(); ++i) {
      if (!start_worker(i)) break;
    }
    close_fd(null_fd_);

    for (std::size_t i = 0; i < slots_.size(); ++i)
      if (slots_[i].running) index_of_[slots_[i].pid] = i;
    running_ = index_of_.size();
    if (result_.outcome == GroupOutcome::kStartFailed) {
      report(result_.message + "; stopping the workers already started");
      stop_group(SIGKILL);
    }
  }

  /// Relays output, reaps, and stops the group at the first failure, a signal to the launcher
  /// or a stop request from outside; then stops what the workers left behind. Returns when
  /// every worker and leftover has ended and the output is drained.
  void watch() {
    next_check_ = Clock::now() + options_.check_interval;
    for (;;) {
      check_for_stop_request();
      kill_after_grace();
      if (running_ == 0 && everything_ended()) break;
      std::vector<pollfd> fds;
      std::vector<PipeOwner> owners;
      const int ready = wait_for_events(fds, owners);
      forward_signals();
      if (ready > 0) read_ready_pipes(fds, owners);
      reap();
    }
  }

  /// Flushes what came last, reaps the last children, reports how the group ended (when it
  /// did not succeed) and returns the result.
  GroupResult verdict() {
    // Pipes still open here belong to something that could not be killed: flush what came.
    for (auto& slot : slots_) {
      if (slot.out_pipe >= 0) slot.out_lines->finish();
      if (slot.err_pipe >= 0) slot.err_lines->finish();
    }
    close_pipes_and_logs();
    reap();
    SignalCatcher::set_workers_running(false);
    for (const std::string& line : result_.report_lines()) report(line);
    return std::move(result_);
  }

 private:
  /// Which worker a polled pipe belongs to, and whether it is its stderr.
  struct PipeOwner {
    std::size_t index = 0;
    bool is_stderr = false;
  };

  void report(const std::string& message) const {
    if (options_.report) {
      options_.report(message);
    } else {
      write_fully(options_.err_fd, "ncclkit-run: " + message + "\n");
    }
  }

  std::chrono::milliseconds since_start() const {
    return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - started_);
  }

  static std::string workers_text(std::size_t count) {
    return std::to_string(count) + " worker" + (count == 1 ? "" : "s");
  }

  void close_pipes_and_logs() {
    for (auto& slot : slots_) {
      close_fd(slot.out_pipe);
      close_fd(slot.err_pipe);
      close_fd(slot.log_fd);
    }
  }

  // ---- start ----------------------------------------------------------------

  /// Forks and execs worker `i`; false (and the result says why) when it did not start.
  bool start_worker(std::size_t i) {
    auto& slot = slots_[i];
    auto& worker = result_.workers[i];
    worker.rank = specs_[i].rank;
    worker.local_rank = specs_[i].local_rank;
    int out_fds[2] = {-1, -1}, err_fds[2] = {-1, -1}, error_fds[2] = {-1, -1};
    const bool piped =
        ::pipe2(out_fds, O_CLOEXEC) == 0 && ::pipe2(err_fds, O_CLOEXEC) == 0 && ::pipe2(error_fds, O_CLOEXEC) == 0;
    pid_t pid = -1;
    int fork_errno = 0;
    if (piped) {
      pid = ::fork();
      if (pid == 0) {
        exec_worker(argvs_[i].data(), envps_[i].data(), out_fds[1], err_fds[1], null_fd_, error_fds[1], self_);
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
      record_start_failure(i, pid, piped, fork_errno, exec_errno);
      return false;
    }
    slot.pid = pid;
    slot.running = true;
    worker.pid = pid;
    slot.out_pipe = out_fds[0];
    slot.err_pipe = err_fds[0];
    ::fcntl(slot.out_pipe, F_SETFL, O_NONBLOCK);
    ::fcntl(slot.err_pipe, F_SETFL, O_NONBLOCK);
    return true;
  }

  /// kStartFailed, with the message and exit status for worker `i`, which was not forked
  /// (pid <= 0) or could not exec (reaped here).
  void record_start_failure(std::size_t i, pid_t pid, bool piped, int fork_errno, int exec_errno) {
    result_.outcome = GroupOutcome::kStartFailed;
    if (pid <= 0) {
      result_.message = "cannot start worker rank " + std::to_string(specs_[i].rank) + ": " +
                        (piped ? "fork failed: " : "pipe failed: ") + std::strerror(fork_errno) +
                        " (too many processes or open files? check ulimit -u and ulimit -n)";
      result_.start_status = 1;
    } else {
      int status = 0;
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      result_.message = "cannot execute '" + specs_[i].argv[0] + "' for rank " + std::to_string(specs_[i].rank) + ": " +
                        std::strerror(exec_errno) +
                        (exec_errno == ENOENT ? " (not found: give a path, or check PATH)" : "");
      result_.start_status = exec_errno == ENOENT ? 127 : 126;
    }
    result_.workers[i].pid = pid;
  }

  // ---- watch ----------------------------------------------------------------

  /// Sends `sig` to every running worker and starts the grace period.
  void stop_group(int sig) {
    stopping_ = true;
    if (!result_.stopped_at) result_.stopped_at = since_start();
    kill_at_ = Clock::now() + options_.grace;
    signal_running_workers(sig);
  }

  void signal_running_workers(int sig) {
    for (auto& slot : slots_)
      if (slot.running) signal_worker(slot.pid, sig);
  }

  /// Stop requests from outside (options.check_stop), only while the group runs normally.
  void check_for_stop_request() {
    if (stopping_ || running_ == 0 || !options_.check_stop || Clock::now() < next_check_) return;
    if (auto reason = options_.check_stop()) {
      result_.outcome = GroupOutcome::kStoppedFromOutside;
      result_.message = *reason;
      report(*reason + "; stopping this node's " + workers_text(running_));
      stop_group(SIGTERM);
    }
    next_check_ = Clock::now() + options_.check_interval;
  }

  /// SIGKILL to the workers still running after the grace period (again every second, should
  /// one be slow to die).
  void kill_after_grace() {
    if (!stopping_ || running_ == 0 || Clock::now() < kill_at_) return;
    if (!killed_) {
      std::string stuck;
      for (std::size_t i = 0; i < slots_.size(); ++i)
        if (slots_[i].running) stuck += (stuck.empty() ? "" : ", ") + std::to_string(specs_[i].rank);
      report("rank(s) " + stuck + " still running after the grace period; sending SIGKILL");
    }
    killed_ = true;
    signal_running_workers(SIGKILL);
    kill_at_ = Clock::now() + std::chrono::seconds(1);
  }

  /// Once every worker has ended: stops the processes they left behind (SIGTERM, then SIGKILL
  /// after the grace period), then drains the pipes. True when nothing is left to wait for.
  bool everything_ended() {
    const auto leftovers = descendants_of(self_, earlier_children_);
    if (!leftovers.empty()) {
      if (!leftovers_signalled_) {
        report(std::to_string(leftovers.size()) + " process(es) left behind by the workers; sending SIGTERM");
        for (pid_t pid : leftovers) ::kill(pid, SIGTERM);
        leftovers_signalled_ = true;
        leftovers_kill_at_ = Clock::now() + options_.grace;
      } else if (Clock::now() >= leftovers_kill_at_) {
        for (pid_t pid : leftovers) ::kill(pid, SIGKILL);
        leftovers_kill_at_ = Clock::now() + std::chrono::seconds(1);
      }
      return false;
    }
    bool pipes_open = false;
    for (const auto& slot : slots_) pipes_open = pipes_open || slot.out_pipe >= 0 || slot.err_pipe >= 0;
    if (!pipes_open) return true;
    if (!drain_deadline_) drain_deadline_ = Clock::now() + options_.drain_timeout;
    return Clock::now() >= *drain_deadline_;
  }

  /// Polls the signal pipe and the open output pipes until one is ready or the next deadline
  /// (a stop check, the end of the grace period, or 500 ms). Returns poll's result.
  int wait_for_events(std::vector<pollfd>& fds, std::vector<PipeOwner>& owners) const {
    fds.push_back(pollfd{signals_.fd(), POLLIN, 0});
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].out_pipe >= 0) {
        fds.push_back(pollfd{slots_[i].out_pipe, POLLIN, 0});
        owners.push_back(PipeOwner{i, false});
      }
      if (slots_[i].err_pipe >= 0) {
        fds.push_back(pollfd{slots_[i].err_pipe, POLLIN, 0});
        owners.push_back(PipeOwner{i, true});
      }
    }
    auto wake = Clock::now() + std::chrono::milliseconds(500);
    if (!stopping_ && running_ > 0 && options_.check_stop) wake = std::min(wake, next_check_);
    if (stopping_ && running_ > 0) wake = std::min(wake, kill_at_);
    if (running_ == 0) wake = std::min(wake, Clock::now() + std::chrono::milliseconds(20));
    const auto wait_ms = std::chrono::ceil<std::chrono::milliseconds>(wake - Clock::now()).count();
    const int ready = ::poll(fds.data(), fds.size(), static_cast<int>(std::clamp<long long>(wait_ms, 0, INT_MAX)));
    if (ready < 0 && errno != EINTR) {
      report(std::string("poll failed: ") + std::strerror(errno));
    }
    return ready;
  }

  /// Signals to the launcher: SIGUSR1/SIGUSR2 are forwarded; the first of the others is
  /// forwarded and stops the group (kInterrupted); a second ends the grace period.
  void forward_signals() {
    for (int sig : signals_.take()) {
      if (sig == SIGCHLD) continue;  // reaped after every round
      if (sig == SIGUSR1 || sig == SIGUSR2) {
        signal_running_workers(sig);
        continue;
      }
      if (!stopping_) {
        result_.outcome = GroupOutcome::kInterrupted;
        result_.launcher_signal = sig;
        result_.message = "the launcher got " + signal_name(sig);
        report("got " + signal_name(sig) + "; forwarding it to " + workers_text(running_) +
               " (SIGKILL after the grace period or at a second signal)");
        stop_group(sig);
      } else if (running_ > 0) {
        kill_at_ = Clock::now();  // a second signal: no more grace
      }
    }
  }

  void read_ready_pipes(const std::vector<pollfd>& fds, const std::vector<PipeOwner>& owners) {
    for (std::size_t k = 1; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const PipeOwner& owner = owners[k - 1];
      auto& slot = slots_[owner.index];
      if (owner.is_stderr) {
        read_pipe(slot.err_pipe, *slot.err_lines, result_.workers[owner.index]);
      } else {
        read_pipe(slot.out_pipe, *slot.out_lines, result_.workers[owner.index]);
      }
    }
  }

  void read_all_pipes() {
    for (std::size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].out_pipe >= 0) read_pipe(slots_[i].out_pipe, *slots_[i].out_lines, result_.workers[i]);
      if (slots_[i].err_pipe >= 0) read_pipe(slots_[i].err_pipe, *slots_[i].err_lines, result_.workers[i]);
    }
  }

  /// Reads what `fd` has (a bounded number of rounds, so that other pipes get their turn) into
  /// whole lines; at EOF flushes the last line and closes `fd`.
  void read_pipe(int& fd, LinePrefixer& lines, WorkerExit& worker) {
    char buffer[65536];
    for (int rounds = 0; rounds < 16; ++rounds) {
      const ssize_t n = ::read(fd, buffer, sizeof buffer);
      if (n > 0) {
        // Output is the only sign of progress the launcher sees; what comes after the stop
        // (a worker reporting its SIGTERM) is not progress.
        if (!stopping_) worker.last_output_at = since_start();
        lines.feed(std::string_view(buffer, static_cast<std::size_t>(n)));
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
      lines.finish();  // EOF (or an error): flush the unfinished last line
      close_fd(fd);
      return;
    }
  }

  /// Reaps every ended child of ours: workers, and leftovers adopted as subreaper.
  void reap() {
    for (;;) {
      int status = 0;
      const pid_t pid = next_ended_child(status);
      if (pid <= 0) return;
      auto it = index_of_.find(pid);
      if (it == index_of_.end() || !slots_[it->second].running) continue;  // an adopted leftover
      record_end(it->second, status);
    }
  }

  /// Where the caller had children of its own, only ours are waited for (their statuses are
  /// the caller's).
  pid_t next_ended_child(int& status) const {
    if (earlier_children_.empty()) {
      for (;;) {
        const pid_t pid = ::waitpid(-1, &status, WNOHANG);
        if (pid < 0 && errno == EINTR) continue;
        return pid;
      }
    }
    std::set<pid_t> candidates = children_of(self_, /*include_zombies=*/true);
    for (const auto& [pid, index] : index_of_) candidates.insert(pid);
    for (pid_t pid : candidates) {
      if (earlier_children_.count(pid) != 0) continue;
      const pid_t got = ::waitpid(pid, &status, WNOHANG);
      if (got > 0) return got;
    }
    return 0;
  }

  /// Worker `index` ended with wait status `status`; the first failure stops the group.
  void record_end(std::size_t index, int status) {
    auto& worker = result_.workers[index];
    slots_[index].running = false;
    --running_;
    worker.ended_at = since_start();
    result_.end_order.push_back(index);
    if (WIFEXITED(status)) {
      worker.exited = true;
      worker.exit_code = WEXITSTATUS(status);
    } else {
      worker.exited = false;
      worker.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
    }
    worker.stopped_by_launcher = stopping_;
    if (!worker.ok() && !stopping_) stop_at_failure(index);
  }

  /// The first failure: reports it, stops the other workers, tells options.on_failure.
  void stop_at_failure(std::size_t index) {
    // What the workers wrote before this failure is in their pipes now: read it first, so
    // that it counts as their last progress and comes out before the failure's report.
    read_all_pipes();
    result_.outcome = GroupOutcome::kWorkerFailed;
    result_.failed = static_cast<int>(index);
    std::string message = result_.failure_summary();
    if (running_ > 0) {
      message += "; stopping the other " + workers_text(running_) + " (SIGTERM now, SIGKILL after " +
                 ncclkit::format_seconds(options_.grace) + ")";
    }
    report(message);
    // Local workers first: telling the other nodes goes through the store, which may be slow.
    stop_group(SIGTERM);
    if (options_.on_failure) options_.on_failure(result_);
  }

  const std::vector<WorkerSpec>& specs_;
  SignalCatcher& signals_;
  const SuperviseOptions& options_;
  GroupResult result_;
  std::vector<WorkerSlot> slots_;

  // prepare()
  pid_t self_ = -1;
  std::set<pid_t> earlier_children_;
  int null_fd_ = -1;
  std::vector<std::vector<char*>> argvs_, envps_;

  // start()
  Clock::time_point started_{};
  std::map<pid_t, std::size_t> index_of_;
  std::size_t running_ = 0;

  // watch(): stopping the group, its leftovers, the drain, the stop checks
  bool stopping_ = false;
  bool killed_ = false;
  Clock::time_point kill_at_{};
  bool leftovers_signalled_ = false;
  Clock::time_point leftovers_kill_at_{};
  std::optional<Clock::time_point> drain_deadline_;
  Clock::time_point next_check_{};
};

}  // namespace detail

/// Starts `specs` and supervises them as described in the header comment. Returns when every
/// worker and every leftover process has ended and their output has been written. Uses (and
/// requires) the process's SignalCatcher. Throws Error only before any worker starts (log
/// folder or pipes cannot be created); a worker that cannot be executed is kStartFailed.
inline GroupResult run_worker_group(const std::vector<WorkerSpec>& specs, SignalCatcher& signals,
                                    const SuperviseOptions& options = {}) {
  detail::WorkerGroup group(specs, signals, options);
  group.prepare();
  group.start();
  group.watch();
  return group.verdict();
}

}  // namespace ncclkit::launch
