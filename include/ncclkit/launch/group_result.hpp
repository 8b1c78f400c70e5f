#pragma once
/// How a worker group ended (run_worker_group's result), and the failure report built from it.
///
/// The first worker to fail is often a victim: a rank that exited 0 early (its peers then
/// time out waiting for it), or one that hangs while another gives up on it. So the launcher
/// records when each worker ended (time since the workers started, in the order it saw them
/// end) and when each last wrote output, and the report lists every rank of this node in that
/// order: which had already exited (code or signal, time), which failed first, which were
/// still running when the group was stopped and how long they had been silent. A rank that
/// exited 0 while others still ran, before the first failure, is named first, as the likely
/// cause, and the failure after it as what probably followed.

#include <sys/types.h>  // pid_t

#include <chrono>    // std::chrono::milliseconds
#include <cstddef>   // std::size_t
#include <cstring>   // strsignal
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "ncclkit/launch/signals.hpp"

namespace ncclkit::launch {

namespace detail {

/// "5 s", "0.25 s".
inline std::string format_seconds(std::chrono::milliseconds duration) {
  const auto ms = duration.count();
  std::string text = std::to_string(ms / 1000);
  if (ms % 1000 != 0) {
    std::string fraction = std::to_string(1000 + ms % 1000).substr(1);
    while (fraction.back() == '0') fraction.pop_back();
    text += "." + fraction;
  }
  return text + " s";
}

}  // namespace detail

/// How one worker ended.
struct WorkerExit {
  int rank = 0;
  int local_rank = 0;
  pid_t pid = -1;
  bool exited = false;  ///< exited normally with `exit_code`; else killed by `signal`
  int exit_code = 0;
  int signal = 0;
  bool stopped_by_launcher = false;  ///< the launcher was stopping the group when it ended
  /// When the launcher saw it end, since the workers were started.
  std::chrono::milliseconds ended_at{0};
  /// When it last wrote output (stdout or stderr), since the workers were started; nullopt
  /// when it wrote nothing.
  std::optional<std::chrono::milliseconds> last_output_at;

  bool ok() const { return exited && exit_code == 0; }
  /// The status a shell would report: the exit code, or 128 + the signal.
  int shell_status() const { return exited ? exit_code : 128 + signal; }
  /// "exited with code 3", "was killed by signal 6 (SIGABRT: Aborted)".
  std::string how() const {
    if (exited) return "exited with code " + std::to_string(exit_code);
    return "was killed by signal " + std::to_string(signal) + " (" + signal_name(signal) + ": " +
           ::strsignal(signal) + ")";
  }
  /// "rank 3 (local rank 3, pid 4242)".
  std::string who() const {
    return "rank " + std::to_string(rank) + " (local rank " + std::to_string(local_rank) + ", pid " +
           std::to_string(pid) + ")";
  }
  /// "rank 3 (local rank 3, pid 4242) exited with code 3".
  std::string describe() const { return who() + " " + how(); }
  /// "rank 3 (local rank 3, pid 4242) exited with code 3 at 1.25 s".
  std::string describe_with_time() const { return describe() + " at " + detail::format_seconds(ended_at); }
};

/// Why run_worker_group() returned.
enum class GroupOutcome {
  kSucceeded,           ///< every worker exited with code 0
  kWorkerFailed,        ///< a worker failed (non-zero exit or a signal); the others were stopped
  kInterrupted,         ///< the launcher got SIGINT/SIGTERM/SIGHUP/SIGQUIT and stopped the group
  kStoppedFromOutside,  ///< SuperviseOptions::check_stop asked for a stop (another node failed)
  kStartFailed,         ///< a worker could not be started (fork or exec failed)
};

/// How the group ended.
struct GroupResult {
  GroupOutcome outcome = GroupOutcome::kSucceeded;
  std::vector<WorkerExit> workers;  ///< in the order of the specs
  int failed = -1;                  ///< index of the first failed worker (kWorkerFailed)
  int launcher_signal = 0;          ///< the signal that stopped the group (kInterrupted)
  std::string message;              ///< the stop reason or start failure, for reports
  int start_status = 0;             ///< kStartFailed: 127 (not found) or 126 (not executable)
  /// Indices into `workers`, in the order the launcher saw them end (so far, while running).
  std::vector<std::size_t> end_order;
  /// When the launcher started stopping the group (a failure, a signal, a stop from outside).
  std::optional<std::chrono::milliseconds> stopped_at;

  /// The launcher's exit status for this outcome: 0; the failed worker's shell status;
  /// 128 + the launcher's signal; 1 for a stop from outside (the caller knows better).
  int exit_status() const {
    switch (outcome) {
      case GroupOutcome::kSucceeded: return 0;
      case GroupOutcome::kWorkerFailed: return workers[static_cast<std::size_t>(failed)].shell_status();
      case GroupOutcome::kInterrupted: return 128 + launcher_signal;
      case GroupOutcome::kStoppedFromOutside: return 1;
      case GroupOutcome::kStartFailed: return start_status;
    }
    return 1;
  }

  /// Workers that exited with code 0 while others still ran, before the group was stopped,
  /// in a group that did not succeed: a rank that leaves early makes its peers fail (they time
  /// out, or lose the connection), so such an exit is the first suspect. In end order.
  std::vector<std::size_t> early_exits() const {
    std::vector<std::size_t> early;
    if (outcome == GroupOutcome::kSucceeded) return early;
    for (std::size_t k = 0; k < end_order.size(); ++k) {
      const WorkerExit& worker = workers[end_order[k]];
      const bool others_ran = k + 1 < workers.size();
      if (worker.ok() && !worker.stopped_by_launcher && others_ran) early.push_back(end_order[k]);
    }
    return early;
  }

  /// The failure in one sentence, its likely cause first (kWorkerFailed): "rank 1 (local rank
  /// 1, pid 7) exited early, with code 0 at 0.5 s, while other ranks still ran; then rank 0
  /// (local rank 0, pid 6) exited with code 1 at 2.25 s", or just the failed worker with its
  /// time. Other outcomes: `message`.
  std::string failure_summary() const {
    if (outcome != GroupOutcome::kWorkerFailed || failed < 0) return message;
    const WorkerExit& failure = workers[static_cast<std::size_t>(failed)];
    const std::vector<std::size_t> early = early_exits();
    if (early.empty()) return failure.describe_with_time();
    const WorkerExit& first = workers[early.front()];
    std::string text = first.who() + " exited early, with code 0 at " + detail::format_seconds(first.ended_at) +
                       ", while other ranks still ran";
    if (early.size() > 1) {
      text += " (" + std::to_string(early.size() - 1) + " more rank" + (early.size() == 2 ? "" : "s") +
              " exited with code 0 after it)";
    }
    return text + "; then " + failure.describe_with_time();
  }

  /// The report: one line per worker of this node, in the order they ended, then what is
  /// likely the cause. Empty for kSucceeded and kStartFailed (the start failure says it all).
  std::vector<std::string> report_lines() const {
    std::vector<std::string> lines;
    if (outcome == GroupOutcome::kSucceeded || outcome == GroupOutcome::kStartFailed) return lines;
    const std::vector<std::size_t> early = early_exits();
    auto is_early = [&](std::size_t index) {
      for (std::size_t e : early)
        if (e == index) return true;
      return false;
    };
    lines.push_back("how this node's ranks ended, in order (times since the workers started):");
    std::vector<std::size_t> order = end_order;
    for (std::size_t i = 0; i < workers.size(); ++i) {  // never seen to end: listed last
      bool seen = false;
      for (std::size_t k : order) seen = seen || k == i;
      if (!seen) order.push_back(i);
    }
    for (std::size_t k = 0; k < order.size(); ++k) {
      const std::size_t index = order[k];
      const WorkerExit& worker = workers[index];
      std::string line = "  " + worker.describe_with_time();
      if (is_early(index)) {
        const std::size_t others = workers.size() - k - 1;
        line += " while " + std::to_string(others) + " other rank" + (others == 1 ? "" : "s") + " still ran";
        line += index == early.front() ? ": an early exit, the first event" : ": an early exit";
      } else if (outcome == GroupOutcome::kWorkerFailed && static_cast<int>(index) == failed) {
        line += ": the first failure";
        if (!early.empty()) {
          line += ", " + detail::format_seconds(worker.ended_at - workers[early.front()].ended_at) + " after rank " +
                  std::to_string(workers[early.front()].rank) + " exited early";
        }
      } else if (worker.stopped_by_launcher && stopped_at) {
        line += "; it was still running when the group was stopped at " + detail::format_seconds(*stopped_at);
        if (!worker.last_output_at) {
          line += " (it wrote no output at all)";
        } else {
          const auto silent = *stopped_at - *worker.last_output_at;
          line += " (last output at " + detail::format_seconds(*worker.last_output_at) + ", silent for " +
                  detail::format_seconds(silent < std::chrono::milliseconds(0) ? std::chrono::milliseconds(0) : silent) +
                  " by then)";
        }
      } else if (!worker.ok() && outcome == GroupOutcome::kWorkerFailed) {
        line += ": failed too, after the first failure";
      }
      lines.push_back(line);
    }
    if (!early.empty()) {
      const WorkerExit& first = workers[early.front()];
      std::string cause = "likely cause: rank " + std::to_string(first.rank) + " exited (code 0) at " +
                          detail::format_seconds(first.ended_at) + " while other ranks still ran";
      if (outcome == GroupOutcome::kWorkerFailed) {
        const WorkerExit& failure = workers[static_cast<std::size_t>(failed)];
        cause += "; the failure of rank " + std::to_string(failure.rank) + " " +
                 detail::format_seconds(failure.ended_at - first.ended_at) +
                 " later probably follows from it (a rank waiting for one that has left times out or loses "
                 "its connection). If rank " +
                 std::to_string(first.rank) + " was meant to finish first, look at rank " +
                 std::to_string(failure.rank) + "'s output";
      } else {
        cause += "; if the others were waiting for it, that is why they had not finished";
      }
      lines.push_back(cause);
    }
    return lines;
  }
};

}  // namespace ncclkit::launch
