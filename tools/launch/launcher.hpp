#pragma once
/// run_launcher(): the whole of `ncclkit-run` except argument parsing and --check. Joins the
/// other nodes (if any), then runs attempts of the worker group until one succeeds, the
/// restart budget is spent, or the launcher is told to stop:
///
///   join -> [prepare attempt -> start and supervise workers -> verdict] -> restart | exit
///
/// Exit status: 0 when every worker of every node succeeded; the first failed worker's status
/// (128 + signal for a signal, like a shell) when the budget is spent; 128 + S when the
/// launcher got signal S; 127/126 when the program cannot be found/executed.
/// Launcher errors (rendezvous timeouts, store failures) are thrown as ncclkit::Error; the
/// program turns them into exit status 1.

#include <memory>    // std::unique_ptr, std::make_unique
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "launch/coordinator.hpp"
#include "launch/launcher_store.hpp"
#include "launch/options.hpp"
#include "launch/signals.hpp"
#include "launch/store_coordinator.hpp"
#include "launch/supervisor.hpp"
#include "launch/worker_env.hpp"
#include "ncclkit/bootstrap/local_gpus.hpp"
#include "ncclkit/core/log.hpp"

namespace ncclkit::launch {

/// Writes "ncclkit-run: <message>" to stderr as one line.
inline void report_line(const std::string& message) { detail::write_fully(2, "ncclkit-run: " + message + "\n"); }

/// The coordinator for `options`: standalone for one node without a rendezvous, otherwise a
/// StoreCoordinator over the launchers' store (open_launcher_store).
inline std::unique_ptr<NodeCoordinator> make_coordinator(const LaunchOptions& options, int nproc) {
  const RendezvousKind kind = options.rendezvous();
  if (kind == RendezvousKind::kStandalone) return std::make_unique<StandaloneCoordinator>(nproc, options.max_restarts);
  LauncherStore opened = open_launcher_store(options);
  StoreCoordinatorOptions coordinator_options{
      .nnodes = options.nnodes,
      .node_rank = opened.node_rank,
      .nproc = nproc,
      .max_restarts = options.max_restarts,
      .timeout = options.rdzv_timeout,
      .kind = kind,
      .master_addr = options.master_addr,
      .worker_folder = opened.worker_folder,
      .report = report_line,
  };
  return std::make_unique<StoreCoordinator>(std::move(opened.store), std::move(coordinator_options),
                                            std::move(opened.server));
}

/// Runs the job described by `options` (not --check) and returns the launcher's exit status.
/// `signals` must be installed before anything else happens (see SignalCatcher).
inline int run_launcher(const LaunchOptions& options, SignalCatcher& signals) {
  const GpuInventory gpus = find_gpus();
  const int nproc = resolve_nproc_per_node(options.nproc_per_node, gpus);
  std::unique_ptr<NodeCoordinator> coordinator = make_coordinator(options, nproc);
  const JobLayout layout = coordinator->join();
  if (log_enabled(LogLevel::kInfo) || layout.num_nodes > 1) {
    report_line("node " + std::to_string(layout.node_rank) + " of " + std::to_string(layout.num_nodes) + ": ranks " +
                std::to_string(layout.first_rank) + "-" + std::to_string(layout.first_rank + nproc - 1) + " of " +
                std::to_string(layout.world_size) + "; GPUs: " + gpus.describe() +
                "; store: " + coordinator->describe());
  }

  const std::vector<std::string> base_environment = current_environment();
  for (int attempt = 0;; ++attempt) {
    const WorkerStoreInfo worker_store = coordinator->prepare_attempt(attempt);
    std::vector<WorkerSpec> specs;
    for (int local = 0; local < nproc; ++local) {
      WorkerPlacement placement{
          .rank = layout.first_rank + local,
          .local_rank = local,
          .world_size = layout.world_size,
          .local_world_size = nproc,
          .node_rank = layout.node_rank,
          .num_nodes = layout.num_nodes,
          .master_addr = worker_store.master_addr,
          .master_port = worker_store.master_port,
          .init_url = worker_store.init_url,
          .restart_count = attempt,
          .max_restarts = options.max_restarts,
          .run_id = layout.run_id,
      };
      specs.push_back(
          WorkerSpec{placement.rank, local, options.program, build_worker_environment(base_environment, placement)});
    }
    SuperviseOptions supervise{
        .grace = options.grace_period,
        .log_dir = options.log_dir,
        .log_header = attempt == 0 ? std::string()
                                   : "---- ncclkit-run: restart " + std::to_string(attempt) + " of " +
                                         std::to_string(options.max_restarts) + " ----",
        .check_stop = [&]() { return coordinator->check_stop(attempt); },
        .on_failure = [&](const GroupResult& so_far) { coordinator->announce_failure(attempt, so_far); },
        .report = report_line,
    };
    const GroupResult result = run_worker_group(specs, signals, supervise);
    const AttemptEnd end = coordinator->finish_attempt(attempt, result);
    switch (end.kind) {
      case AttemptEnd::Kind::kSucceeded:
        coordinator->leave();
        return 0;
      case AttemptEnd::Kind::kRestart:
        report_line("restarting the worker group (restart " + std::to_string(attempt + 1) + " of " +
                    std::to_string(options.max_restarts) + ") after: " + end.message);
        continue;
      case AttemptEnd::Kind::kFailed: {
        const int status = result.outcome == GroupOutcome::kInterrupted ? result.exit_status() : end.exit_status;
        std::string why = end.message;
        if (options.max_restarts > 0 && result.outcome != GroupOutcome::kInterrupted) {
          why += " (after " + std::to_string(attempt) + " restart" + (attempt == 1 ? "" : "s") + " of " +
                 std::to_string(options.max_restarts) + ")";
        }
        report_line("job failed: " + why + "; exit status " + std::to_string(status));
        coordinator->leave();
        return status;
      }
    }
  }
}

}  // namespace ncclkit::launch
