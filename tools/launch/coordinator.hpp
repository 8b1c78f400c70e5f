#pragma once
/// How the launchers of a job agree: on the ranks each node runs, on where the workers'
/// store is, and on whether the group restarts or ends after a failure.
///
/// `NodeCoordinator` is the interface the launcher loop uses; `StandaloneCoordinator` is the
/// single-node case without a store (every decision is local), and `StoreCoordinator`
/// (launch/store_coordinator.hpp) runs the protocol between nodes through a store.

#include <chrono>    // std::chrono::milliseconds
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "launch/supervisor.hpp"
#include "ncclkit/store/detail/socket.hpp"
#include "ncclkit/store/file_store.hpp"  // detail::file_store::random_hex_id

namespace ncclkit::launch {

/// One node as its launcher announced itself.
struct NodeInfo {
  int node_rank = 0;
  int nproc = 1;       ///< workers it runs
  std::string host;    ///< its host name
  int pid = 0;         ///< its launcher's pid
  int first_rank = 0;  ///< global rank of its local rank 0
};

/// Where this node's workers sit in the job.
struct JobLayout {
  int node_rank = 0;
  int num_nodes = 1;
  int local_world_size = 1;
  int first_rank = 0;  ///< global rank of local rank 0
  int world_size = 1;
  std::vector<NodeInfo> nodes;  ///< every node, by node rank
  /// The job's id, the same on every node: the workers get it as NCCLKIT_LAUNCH_RUN_ID, their
  /// job identity (store/run_identity.hpp), so that FileStores of two jobs never mix.
  std::string run_id;
};

/// Where one attempt's workers rendezvous (their store; rank 0 hosts a TCP one).
struct WorkerStoreInfo {
  std::string master_addr;  ///< empty for a shared-folder store
  int master_port = 0;
  std::string init_url;  ///< NCCLKIT_INIT_URL
};

/// What happens after an attempt.
struct AttemptEnd {
  enum class Kind { kSucceeded, kRestart, kFailed };
  Kind kind = Kind::kSucceeded;
  int exit_status = 0;  ///< kFailed: the launcher's exit status
  std::string message;  ///< what failed (and where), for the report
};

/// The launcher's partner in agreeing with the other nodes. Every blocking call is bounded
/// by the rendezvous timeout and throws TimeoutError naming the nodes it waited for.
class NodeCoordinator {
 public:
  virtual ~NodeCoordinator() = default;
  /// Meets the other nodes; returns this node's place. Called once.
  virtual JobLayout join() = 0;
  /// Before starting attempt `attempt`'s workers: waits until every node has stopped the
  /// previous attempt's workers, and says where this attempt's workers rendezvous.
  virtual WorkerStoreInfo prepare_attempt(int attempt) = 0;
  /// While workers run (called every ~200 ms): a reason to stop them, when another node asked.
  virtual std::optional<std::string> check_stop(int attempt) = 0;
  /// At a local worker's failure, at once: tells the other nodes to stop theirs.
  /// `so_far` is the group's result at that moment (`failed` set).
  virtual void announce_failure(int attempt, const GroupResult& so_far) = 0;
  /// After this node's group ended: the job's verdict for this attempt (waiting, when this
  /// node succeeded, until every node has succeeded or one has failed).
  virtual AttemptEnd finish_attempt(int attempt, const GroupResult& result) = 0;
  /// Before exiting: lets a node that hosts the store wait until the others are done with it.
  virtual void leave() noexcept {}
  /// The store, for messages ("none" for the standalone case).
  virtual std::string describe() const = 0;
};

namespace detail {

/// A port that is free on `host` now: bound, read back and released. Someone else may take it
/// before the worker that is told to use it binds it; the window is a few milliseconds and the
/// kernel hands out ephemeral ports in a spread-out order, so a clash is unlikely (and costs
/// one attempt, which a restart covers).
inline int pick_free_port(const std::string& host) {
  ncclkit::detail::Socket socket = ncclkit::detail::listen_tcp(host, 0, 1);
  const int port = ncclkit::detail::local_port(socket.get());
  if (port <= 0) throw ConfigError("ncclkit-run: cannot find a free TCP port on '" + host + "'");
  return port;
}

/// The verdict on a failed attempt when this node decides alone.
inline AttemptEnd local_verdict(const GroupResult& result, int attempt, int max_restarts) {
  AttemptEnd end;
  switch (result.outcome) {
    case GroupOutcome::kSucceeded:
      return end;
    case GroupOutcome::kWorkerFailed: {
      end.message = result.failure_summary();
      end.exit_status = result.exit_status();
      end.kind = attempt < max_restarts ? AttemptEnd::Kind::kRestart : AttemptEnd::Kind::kFailed;
      return end;
    }
    case GroupOutcome::kInterrupted:
    case GroupOutcome::kStartFailed:
    case GroupOutcome::kStoppedFromOutside:
      end.kind = AttemptEnd::Kind::kFailed;
      end.message = result.message;
      end.exit_status = result.exit_status();
      return end;
  }
  return end;
}

}  // namespace detail

/// One node, no --master-addr or --rdzv-dir: nothing to agree with. Each attempt's workers
/// get a fresh TCP store on a free loopback port (rank 0 serves it), so keys of a failed
/// attempt are never seen by the next.
class StandaloneCoordinator final : public NodeCoordinator {
 public:
  StandaloneCoordinator(int nproc, int max_restarts) : nproc_(nproc), max_restarts_(max_restarts) {}

  JobLayout join() override {
    JobLayout layout;
    layout.local_world_size = nproc_;
    layout.world_size = nproc_;
    layout.nodes.push_back(NodeInfo{0, nproc_, "localhost", 0, 0});
    layout.run_id = ncclkit::detail::file_store::random_hex_id();
    return layout;
  }
  WorkerStoreInfo prepare_attempt(int) override {
    const int port = detail::pick_free_port("127.0.0.1");
    return WorkerStoreInfo{"127.0.0.1", port, "tcp://127.0.0.1:" + std::to_string(port)};
  }
  std::optional<std::string> check_stop(int) override { return std::nullopt; }
  void announce_failure(int, const GroupResult&) override {}
  AttemptEnd finish_attempt(int attempt, const GroupResult& result) override {
    return detail::local_verdict(result, attempt, max_restarts_);
  }
  std::string describe() const override { return "none (one node)"; }

 private:
  int nproc_;
  int max_restarts_;
};

}  // namespace ncclkit::launch
