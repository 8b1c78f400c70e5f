#pragma once
/// How a worker group ended (run_worker_group's result), and the failure report built from it.
///
/// The first worker to fail is often a victim: a rank that exited 0 early (its peers then
/// time out waiting for it), or one that hangs while another gives up on it. So the launcher
/// records when each worker ended (time since the workers started, in the order it saw them
/// end) and when each last wrote output, and the report lists every rank of this node in that
/// order: which had already exited (code or signal, time, how long before the failure), which
/// failed first, which were still running when the group was stopped and how long they had
/// been silent. The verdict names the failed rank (its status is the job's) and the ranks that
/// had exited before it. An earlier exit 0 is named as the likely cause only where it plausibly
/// is one (early_exits()): ranks that all finished together, leaving one rank that fails in its
/// teardown, are a finished job whose last rank failed, and are not blamed.

#include <sys/types.h>  // pid_t

#include <algorithm>  // std::sort, std::minmax_element
#include <chrono>     // std::chrono::milliseconds
#include <cstddef>    // std::size_t
#include <cstring>    // strsignal
#include <optional>   // std::optional
#include <string>     // std::string
#include <vector>     // std::vector

#include "launch/signals.hpp"
#include "ncclkit/core/detail/rank_list.hpp"
#include "ncclkit/core/time_format.hpp"

namespace ncclkit::launch {

/// An exit 0 is named as the likely cause of a later failure only if it came at least this long
/// before it: a rank that a peer's departure makes fail needs a moment to notice (a timeout, a
/// lost connection, a failed send), whereas ranks that finish and a last rank that crashes
/// while tearing down end within milliseconds of each other.
inline constexpr std::chrono::milliseconds kLikelyCauseLead{1000};

/// When every rank but the failed one exited 0, and all within this window of each other, the
/// job had finished: its last rank failed (in its teardown or last steps), and no early exit is
/// blamed for it.
inline constexpr std::chrono::milliseconds kFinishedTogetherWindow{1000};

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
    return "was killed by signal " + std::to_string(signal) + " (" + signal_name(signal) + ": " + ::strsignal(signal) +
           ")";
  }
  /// "rank 3 (local rank 3, pid 4242)".
  std::string who() const {
    return "rank " + std::to_string(rank) + " (local rank " + std::to_string(local_rank) + ", pid " +
           std::to_string(pid) + ")";
  }
  /// "rank 3 (local rank 3, pid 4242) exited with code 3".
  std::string describe() const { return who() + " " + how(); }
  /// "rank 3 (local rank 3, pid 4242) exited with code 3 at 1.250 s".
  std::string describe_with_time() const { return describe() + " at " + ncclkit::format_seconds(ended_at); }
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
      case GroupOutcome::kSucceeded:
        return 0;
      case GroupOutcome::kWorkerFailed:
        return workers[static_cast<std::size_t>(failed)].shell_status();
      case GroupOutcome::kInterrupted:
        return 128 + launcher_signal;
      case GroupOutcome::kStoppedFromOutside:
        return 1;
      case GroupOutcome::kStartFailed:
        return start_status;
    }
    return 1;
  }

  /// Workers that exited with code 0 before the first failure (kWorkerFailed), in end order.
  std::vector<std::size_t> exits_before_failure() const {
    std::vector<std::size_t> before;
    if (outcome != GroupOutcome::kWorkerFailed || failed < 0) return before;
    for (std::size_t index : end_order) {
      if (static_cast<int>(index) == failed) break;
      if (workers[index].ok() && !workers[index].stopped_by_launcher) before.push_back(index);
    }
    return before;
  }

  /// Every rank but the failed one exited 0 before it, all within kFinishedTogetherWindow of
  /// each other: a job that finished, whose last rank failed.
  bool finished_before_failure() const {
    const std::vector<std::size_t> before = exits_before_failure();
    if (before.empty() || before.size() + 1 != workers.size()) return false;
    return workers[before.back()].ended_at - workers[before.front()].ended_at <= kFinishedTogetherWindow;
  }

  /// Exits 0 that are plausibly the cause of what followed, in end order; a rank that leaves
  /// early makes its peers fail (they time out, or lose the connection). After a failure
  /// (kWorkerFailed): exits 0 while the failed rank still ran, at least kLikelyCauseLead before
  /// it, unless the job had finished (finished_before_failure()). After a stop (a signal to the
  /// launcher, another node): exits 0 while others still ran, since those others may have
  /// been waiting for them. None when the group succeeded.
  std::vector<std::size_t> early_exits() const {
    std::vector<std::size_t> early;
    if (outcome == GroupOutcome::kSucceeded) return early;
    if (outcome == GroupOutcome::kWorkerFailed) {
      if (failed < 0 || finished_before_failure()) return early;
      const WorkerExit& failure = workers[static_cast<std::size_t>(failed)];
      for (std::size_t index : exits_before_failure())
        if (failure.ended_at - workers[index].ended_at >= kLikelyCauseLead) early.push_back(index);
      return early;
    }
    for (std::size_t k = 0; k < end_order.size(); ++k) {
      const WorkerExit& worker = workers[end_order[k]];
      const bool others_ran = k + 1 < workers.size();
      if (worker.ok() && !worker.stopped_by_launcher && others_ran) early.push_back(end_order[k]);
    }
    return early;
  }

  /// The failure in one sentence (kWorkerFailed): the failed worker first, then the ranks that
  /// had exited before it and the likely cause, if any: "rank 3 (local rank 3, pid 9) was killed
  /// by signal 11 (SIGSEGV: Segmentation fault) at 12.031 s; before it, ranks 0-2 had exited with
  /// code 0 (at 12.000-12.002 s, 0.029-0.031 s before it)", "rank 0 (...) exited with code 1 at
  /// 1.848 s; before it, rank 1 had exited with code 0 (at 0.344 s, 1.504 s before it); the
  /// likely cause is rank 1's early exit". Other outcomes: `message`.
  std::string failure_summary() const {
    if (outcome != GroupOutcome::kWorkerFailed || failed < 0) return message;
    const WorkerExit& failure = workers[static_cast<std::size_t>(failed)];
    std::string text = failure.describe_with_time();
    const std::vector<std::size_t> before = exits_before_failure();
    if (before.empty()) return text;
    std::vector<int> ranks;
    for (std::size_t index : before) ranks.push_back(workers[index].rank);
    std::sort(ranks.begin(), ranks.end());
    const auto first = workers[before.front()].ended_at;
    const auto last = workers[before.back()].ended_at;
    text += "; before it, " + ncclkit::detail::rank_or_ranks(ranks) + " had exited with code 0 (at " +
            time_range(first, last) + ", " + time_range(failure.ended_at - last, failure.ended_at - first) +
            " before it)";
    const std::vector<std::size_t> early = early_exits();
    if (!early.empty())
      text += "; the likely cause is rank " + std::to_string(workers[early.front()].rank) + "'s early exit";
    return text;
  }

  /// The report: one line per worker of this node, in the order they ended, then what is
  /// likely the cause. Empty for kSucceeded and kStartFailed (the start failure says it all).
  std::vector<std::string> report_lines() const {
    std::vector<std::string> lines;
    if (outcome == GroupOutcome::kSucceeded || outcome == GroupOutcome::kStartFailed) return lines;
    const std::vector<std::size_t> early = early_exits();
    const std::vector<std::size_t> before = exits_before_failure();
    auto is_in = [](const std::vector<std::size_t>& list, std::size_t index) {
      return std::find(list.begin(), list.end(), index) != list.end();
    };
    lines.push_back("how this node's ranks ended, in order (times since the workers started):");
    std::vector<std::size_t> order = end_order;
    for (std::size_t i = 0; i < workers.size(); ++i) {  // never seen to end: listed last
      if (!is_in(order, i)) order.push_back(i);
    }
    for (std::size_t k = 0; k < order.size(); ++k) {
      const std::size_t index = order[k];
      const WorkerExit& worker = workers[index];
      std::string line = "  " + worker.describe_with_time();
      if (is_in(early, index)) {
        const std::size_t others = workers.size() - k - 1;
        line += " while " + std::to_string(others) + " other rank" + (others == 1 ? "" : "s") + " still ran";
        line += index == early.front() ? ": an early exit, the first event" : ": an early exit";
      } else if (is_in(before, index)) {
        line += ", " + ncclkit::format_seconds(workers[static_cast<std::size_t>(failed)].ended_at - worker.ended_at) +
                " before the first failure";
      } else if (outcome == GroupOutcome::kWorkerFailed && static_cast<int>(index) == failed) {
        line += ": the first failure";
        if (!early.empty()) {
          line += ", " + ncclkit::format_seconds(worker.ended_at - workers[early.front()].ended_at) + " after rank " +
                  std::to_string(workers[early.front()].rank) + " exited early";
        } else if (finished_before_failure()) {
          line +=
              ", after every other rank had finished with code 0 (the job had finished; this rank failed in "
              "its last steps or its teardown)";
        }
      } else if (worker.stopped_by_launcher && stopped_at) {
        line += "; it was still running when the group was stopped at " + ncclkit::format_seconds(*stopped_at);
        if (!worker.last_output_at) {
          line += " (it wrote no output at all)";
        } else {
          const auto silent = *stopped_at - *worker.last_output_at;
          line +=
              " (last output at " + ncclkit::format_seconds(*worker.last_output_at) + ", silent for " +
              ncclkit::format_seconds(silent < std::chrono::milliseconds(0) ? std::chrono::milliseconds(0) : silent) +
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
                          ncclkit::format_seconds(first.ended_at) + " while other ranks still ran";
      if (outcome == GroupOutcome::kWorkerFailed) {
        const WorkerExit& failure = workers[static_cast<std::size_t>(failed)];
        cause += "; the failure of rank " + std::to_string(failure.rank) + " " +
                 ncclkit::format_seconds(failure.ended_at - first.ended_at) +
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

 private:
  /// "12.000 s", or "12.000-12.002 s" when the two differ.
  static std::string time_range(std::chrono::milliseconds low, std::chrono::milliseconds high) {
    const std::string high_text = ncclkit::format_seconds(high);
    if (low == high) return high_text;
    std::string low_text = ncclkit::format_seconds(low);
    return low_text.substr(0, low_text.size() - 2) + "-" + high_text;
  }
};

}  // namespace ncclkit::launch
