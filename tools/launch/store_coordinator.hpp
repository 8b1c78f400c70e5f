#pragma once
/// StoreCoordinator: the launchers of several nodes (or one node with --master-addr or
/// --rdzv-dir) agree through a store: node 0's TcpStore or a FileStore in the rendezvous
/// folder. The protocol, all keys under "ncclkit-run/":
///
/// 1. join: each launcher takes a node rank (--node-rank, or in a folder the next free one by
///    add()), claims it with compare_set (two launchers with one node rank is an error),
///    publishes "node/K/info" (workers, host, pid, restart budget) and waits for every other
///    node's; ranks are laid out node by node in node-rank order.
/// 2. each attempt a: every launcher sets "attempt/a/ready/K" once its previous workers are
///    gone, and waits for all (so no worker of attempt a-1 is alive anywhere when attempt a
///    starts). With a TCP store, node 0 then publishes a free port for the workers' own store
///    ("attempt/a/worker_port"; worker rank 0 serves it), so no key of an earlier attempt can
///    be read; with a folder, workers use <dir>/workers, whose FileStore starts a fresh run
///    once every earlier member is dead.
/// 3. while workers run, each launcher bumps "node/K/beat" about once a second and looks for
///    "attempt/a/stop". The first node with a failed worker sets it (compare_set: the first
///    failure wins) to the worker's status and description; every node then stops its
///    workers. The verdict follows from the stop record alone, so all nodes reach the same
///    one without another round: restart while a < --max-restarts (unless a launcher was
///    interrupted or could not start its program, which sets "attempt/a/no_restart"), else
///    fail with the failed worker's status.
/// 4. a node whose workers all succeeded sets "attempt/a/ok/K" and waits until every node has
///    (success), a stop record appears (another node failed: restart or fail with it), or a
///    node that has not finished stops beating for the rendezvous timeout (its launcher died).
/// 5. leave: each launcher sets "left/K"; node 0 keeps serving a TCP store until every node
///    left or the rendezvous timeout passed.

#include <algorithm>   // std::min
#include <chrono>      // std::chrono
#include <cstdlib>     // std::getenv
#include <filesystem>  // std::filesystem::create_directories
#include <functional>  // std::function
#include <map>         // std::map
#include <memory>      // std::shared_ptr, std::unique_ptr
#include <optional>    // std::optional
#include <random>      // std::random_device (launcher id)
#include <sstream>     // std::istringstream
#include <string>      // std::string
#include <vector>      // std::vector

#include <unistd.h>  // gethostname, getpid

#include "launch/coordinator.hpp"
#include "launch/launcher_store.hpp"
#include "launch/options.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/store.hpp"
#include "ncclkit/store/tcp_store.hpp"

namespace ncclkit::launch {

/// What a StoreCoordinator needs to know.
struct StoreCoordinatorOptions {
  int nnodes = 1;
  std::optional<int> node_rank;  ///< nullopt: take the next free one (folder rendezvous)
  int nproc = 1;
  int max_restarts = 0;
  std::chrono::milliseconds timeout = std::chrono::seconds(300);
  RendezvousKind kind = RendezvousKind::kTcp;
  std::string master_addr;    ///< kTcp: where node 0's worker rank 0 serves the workers' store
  std::string worker_folder;  ///< kFolder: the workers' FileStore folder
  /// Messages for the user (default: none).
  std::function<void(const std::string&)> report;
};

namespace detail {

/// This host's name ("?" when unknown).
inline std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "?";
  return name;
}

/// "a=1\nb=x" -> {a: 1, b: x}.
inline std::map<std::string, std::string> parse_record(const std::string& text) {
  std::map<std::string, std::string> fields;
  std::istringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const auto eq = line.find('=');
    if (eq != std::string::npos) fields[line.substr(0, eq)] = line.substr(eq + 1);
  }
  return fields;
}

inline int record_int(const std::map<std::string, std::string>& fields, const std::string& name, int fallback) {
  auto it = fields.find(name);
  if (it == fields.end()) return fallback;
  auto value = parse_int(it->second);
  return value ? static_cast<int>(*value) : fallback;
}

inline std::string record_text(const std::map<std::string, std::string>& fields, const std::string& name) {
  auto it = fields.find(name);
  return it == fields.end() ? std::string() : it->second;
}

/// "1, 3" from {1, 3}.
inline std::string join_ints(const std::vector<int>& values) {
  std::string text;
  for (int v : values) text += (text.empty() ? "" : ", ") + std::to_string(v);
  return text;
}

}  // namespace detail

/// The multi-node protocol in the header comment, over any Store.
class StoreCoordinator final : public NodeCoordinator {
 public:
  /// `store` is the launchers' store; `server`, when given, is the TCP server this launcher
  /// hosts for it (node 0), kept alive until leave() lets the others finish. A server that
  /// other hosts can reach without a token is reported (store_token_warning).
  StoreCoordinator(std::shared_ptr<Store> store, StoreCoordinatorOptions options,
                   std::unique_ptr<TcpStoreServer> server = nullptr)
      : server_(std::move(server)), store_(std::move(store)), options_(std::move(options)) {
    if (server_ != nullptr) {
      if (auto warning = store_token_warning(*server_)) report("warning: " + *warning);
    }
    // Requests that do not wait for other nodes (set, add, check, compare_set) must fail fast
    // when the store is unreachable, since the supervision loop makes them; every wait for
    // other nodes passes the rendezvous timeout explicitly.
    store_->set_default_timeout(std::min<std::chrono::milliseconds>(options_.timeout, std::chrono::seconds(10)));
    std::random_device random;
    id_ = detail::host_name() + ":" + std::to_string(::getpid()) + ":" + std::to_string(random());
  }

  ~StoreCoordinator() override { leave(); }

  std::string describe() const override { return store_->describe(); }

  JobLayout join() override {
    const int nnodes = options_.nnodes;
    int node_rank = 0;
    if (options_.node_rank) {
      node_rank = *options_.node_rank;
    } else if (nnodes > 1) {
      node_rank = static_cast<int>(store_->add(key("next_node"), 1) - 1);
      if (node_rank >= nnodes) {
        throw ConfigError("ncclkit-run: more launchers than --nnodes " + std::to_string(nnodes) +
                          " joined the rendezvous at " + store_->describe() +
                          "; start exactly one per node, all with the same --nnodes");
      }
    }
    node_rank_ = node_rank;
    const std::string claimed = store_->compare_set(key("node/" + std::to_string(node_rank) + "/claim"), "", id_);
    if (claimed != id_) {
      throw ConfigError("ncclkit-run: node rank " + std::to_string(node_rank) + " is taken twice at " +
                        store_->describe() + ": by launcher " + claimed + " and by this one (" + id_ +
                        "); give every node its own --node-rank");
    }
    store_->set(key("node/" + std::to_string(node_rank) + "/info"),
                "nproc=" + std::to_string(options_.nproc) + "\nhost=" + detail::host_name() +
                    "\npid=" + std::to_string(::getpid()) + "\nmax_restarts=" + std::to_string(options_.max_restarts));
    std::vector<std::string> keys;
    for (int n = 0; n < nnodes; ++n) keys.push_back(key("node/" + std::to_string(n) + "/info"));
    wait_for_nodes(
        keys, "the rendezvous of the " + std::to_string(nnodes) + " nodes' launchers",
        "start ncclkit-run on every node with the same --nnodes and " +
            std::string(options_.kind == RendezvousKind::kFolder ? "--rdzv-dir" : "--master-addr/--master-port"));

    JobLayout layout;
    layout.node_rank = node_rank;
    layout.num_nodes = nnodes;
    int next_rank = 0;
    std::string restart_mismatch;
    for (int n = 0; n < nnodes; ++n) {
      auto fields = detail::parse_record(store_->get_string(keys[static_cast<std::size_t>(n)]));
      NodeInfo info;
      info.node_rank = n;
      info.nproc = detail::record_int(fields, "nproc", 1);
      info.host = detail::record_text(fields, "host");
      info.pid = detail::record_int(fields, "pid", 0);
      info.first_rank = next_rank;
      next_rank += info.nproc;
      const int budget = detail::record_int(fields, "max_restarts", 0);
      if (budget != options_.max_restarts) {
        restart_mismatch += " node " + std::to_string(n) + " (" + info.host + "): " + std::to_string(budget) + ";";
      }
      layout.nodes.push_back(info);
    }
    if (!restart_mismatch.empty()) {
      throw ConfigError(
          "ncclkit-run: the nodes disagree on --max-restarts (this node: " + std::to_string(options_.max_restarts) +
          ";" + restart_mismatch + " give every node the same value");
    }
    layout.local_world_size = options_.nproc;
    layout.first_rank = layout.nodes[static_cast<std::size_t>(node_rank)].first_rank;
    layout.world_size = next_rank;
    // The first launcher to get here picks the job's id; the others read it.
    layout.run_id = store_->compare_set(key("run_id"), "", ncclkit::detail::file_store::random_hex_id());
    layout_ = layout;
    layout_joined_ = true;
    return layout;
  }

  WorkerStoreInfo prepare_attempt(int attempt) override {
    const std::string prefix = attempt_prefix(attempt);
    store_->set(prefix + "ready/" + std::to_string(node_rank_), "1");
    std::vector<std::string> keys;
    for (int n = 0; n < options_.nnodes; ++n) keys.push_back(prefix + "ready/" + std::to_string(n));
    wait_for_nodes(keys, "the start of attempt " + std::to_string(attempt),
                   "a node that does not arrive has probably failed or been stopped; see its output");
    if (options_.kind == RendezvousKind::kFolder) {
      return WorkerStoreInfo{"", 0, "file://" + options_.worker_folder};
    }
    int port = 0;
    if (node_rank_ == 0) {
      try {
        port = detail::pick_free_port(options_.master_addr);
      } catch (const Error& e) {
        throw ConfigError(
            "ncclkit-run: --master-addr " + options_.master_addr +
            " is not an address of node 0 (its worker rank 0 must serve the workers' store there): " + e.what());
      }
      store_->set(prefix + "worker_port", std::to_string(port));
    } else {
      const std::string text = get_from_nodes(prefix + "worker_port", "node 0's port for the workers' store");
      port = static_cast<int>(parse_int(text).value_or(0));
    }
    return WorkerStoreInfo{options_.master_addr, port,
                           "tcp://" + ncclkit::detail::format_host_port(options_.master_addr, port)};
  }

  std::optional<std::string> check_stop(int attempt) override {
    try {
      beat();
      const std::string stop_key = attempt_prefix(attempt) + "stop";
      if (!store_->check({stop_key})) return std::nullopt;
      auto fields = detail::parse_record(store_->get_string(stop_key, options_.timeout));
      return "node " + detail::record_text(fields, "node") + " stopped the job: " + detail::record_text(fields, "what");
    } catch (const std::exception& e) {
      return std::string("lost contact with the launchers' store at ") + store_->describe() + ": " + e.what();
    }
  }

  void announce_failure(int attempt, const GroupResult& so_far) override {
    try {
      announce(attempt, so_far.exit_status(), true,
               so_far.failure_summary() + " on node " + std::to_string(node_rank_));
    } catch (const std::exception& e) {
      report("could not tell the other nodes about the failure: " + std::string(e.what()));
    }
  }

  AttemptEnd finish_attempt(int attempt, const GroupResult& result) override {
    const std::string prefix = attempt_prefix(attempt);
    switch (result.outcome) {
      case GroupOutcome::kSucceeded:
        return wait_for_success(attempt);
      case GroupOutcome::kWorkerFailed: {
        announce(attempt, result.exit_status(), true,
                 result.failure_summary() + " on node " + std::to_string(node_rank_));
        break;
      }
      case GroupOutcome::kInterrupted:
      case GroupOutcome::kStartFailed:
        store_->set(prefix + "no_restart", "1");
        announce(attempt, result.exit_status(), false,
                 result.message + " on node " + std::to_string(node_rank_) + " (" + detail::host_name() + ")");
        break;
      case GroupOutcome::kStoppedFromOutside:
        break;
    }
    return verdict(attempt);
  }

  void leave() noexcept override {
    if (left_ || node_rank_ < 0) return;
    left_ = true;
    try {
      store_->set(key("left/" + std::to_string(node_rank_)), "1");
      if (server_ != nullptr) {
        // Keep serving until every node that joined is done with the store (a bounded wait:
        // a node whose launcher was killed never leaves).
        std::vector<std::string> keys;
        for (int n = 0; n < options_.nnodes; ++n) {
          if (store_->check({key("node/" + std::to_string(n) + "/info")}))
            keys.push_back(key("left/" + std::to_string(n)));
        }
        store_->wait(keys, std::min<std::chrono::milliseconds>(options_.timeout, std::chrono::seconds(60)));
      }
    } catch (const std::exception& e) {
      report(std::string("leaving the rendezvous: ") + e.what());
    }
  }

 private:
  std::string key(const std::string& name) const { return "ncclkit-run/" + name; }
  std::string attempt_prefix(int attempt) const { return key("attempt/" + std::to_string(attempt) + "/"); }

  void report(const std::string& message) const {
    if (options_.report) options_.report(message);
  }

  /// Waits for `keys` (one per node, in node order); on timeout, names the nodes missing.
  void wait_for_nodes(const std::vector<std::string>& keys, const std::string& what, const std::string& advice) {
    try {
      store_->wait(keys, options_.timeout);
    } catch (const TimeoutError&) {
      std::vector<int> missing, present;
      for (std::size_t n = 0; n < keys.size(); ++n) {
        (store_->check({keys[n]}) ? present : missing).push_back(static_cast<int>(n));
      }
      std::string message = "ncclkit-run (node " + std::to_string(node_rank_) + "): " + what + " at " +
                            store_->describe() + " timed out after " + ncclkit::format_seconds(options_.timeout) + ": ";
      if (!options_.node_rank && !layout_joined_) {  // node ranks by arrival: only a count is meaningful
        message += std::to_string(present.size()) + " of " + std::to_string(keys.size()) +
                   " launchers arrived (missing node rank(s) " + detail::join_ints(missing) + ")";
      } else {
        message += "node(s) " + detail::join_ints(missing) + " never arrived";
        if (!present.empty()) message += " (arrived: " + detail::join_ints(present) + ")";
      }
      throw TimeoutError(message + "; " + advice + "; --rdzv-timeout sets the limit");
    }
  }

  std::string get_from_nodes(const std::string& name, const std::string& what) {
    try {
      return store_->get_string(name, options_.timeout);
    } catch (const TimeoutError&) {
      throw TimeoutError("ncclkit-run (node " + std::to_string(node_rank_) + "): " + what + " did not come within " +
                         ncclkit::format_seconds(options_.timeout) + " at " + store_->describe());
    }
  }

  /// Bumps this node's heartbeat, at most about once a second.
  void beat() {
    const auto now = std::chrono::steady_clock::now();
    if (now - last_beat_ < std::chrono::seconds(1)) return;
    last_beat_ = now;
    store_->add(key("node/" + std::to_string(node_rank_) + "/beat"), 1);
  }

  /// Records the first failure of `attempt` (later ones keep the first).
  void announce(int attempt, int status, bool restartable, const std::string& what) {
    store_->compare_set(attempt_prefix(attempt) + "stop", "",
                        "status=" + std::to_string(status) + "\nrestartable=" + (restartable ? "1" : "0") +
                            "\nnode=" + std::to_string(node_rank_) + "\nwhat=" + what);
  }

  /// The verdict once a stop record exists.
  AttemptEnd verdict(int attempt) {
    const std::string prefix = attempt_prefix(attempt);
    auto fields =
        detail::parse_record(get_from_nodes(prefix + "stop", "the stop record of attempt " + std::to_string(attempt)));
    AttemptEnd end;
    end.exit_status = detail::record_int(fields, "status", 1);
    end.message = detail::record_text(fields, "what");
    const bool restartable =
        detail::record_text(fields, "restartable") == "1" && !store_->check({prefix + "no_restart"});
    end.kind = restartable && attempt < options_.max_restarts ? AttemptEnd::Kind::kRestart : AttemptEnd::Kind::kFailed;
    return end;
  }

  /// This node succeeded: wait for the others' verdicts (see the header comment, step 4).
  AttemptEnd wait_for_success(int attempt) {
    using Clock = std::chrono::steady_clock;
    const std::string prefix = attempt_prefix(attempt);
    store_->set(prefix + "ok/" + std::to_string(node_rank_), "1");
    std::map<int, std::pair<std::int64_t, Clock::time_point>> last_beats;
    // No deadline of its own: a node that stops beating is what ends the wait.
    ncclkit::detail::Backoff backoff({.first = std::chrono::milliseconds(5), .cap = std::chrono::milliseconds(200)});
    bool announced_wait = false;
    const auto started = Clock::now();
    for (;;) {
      if (store_->check({prefix + "stop"})) return verdict(attempt);
      std::vector<int> pending;
      for (int n = 0; n < options_.nnodes; ++n)
        if (!store_->check({prefix + "ok/" + std::to_string(n)})) pending.push_back(n);
      if (pending.empty()) return AttemptEnd{};
      beat();
      const auto now = Clock::now();
      for (int n : pending) {
        const std::int64_t value = store_->add(key("node/" + std::to_string(n) + "/beat"), 0);
        auto it = last_beats.find(n);
        if (it == last_beats.end() || it->second.first != value) {
          last_beats[n] = {value, now};
        } else if (now - it->second.second > options_.timeout) {
          throw TimeoutError("ncclkit-run (node " + std::to_string(node_rank_) + "): node " + std::to_string(n) +
                             " stopped responding (no heartbeat for " + ncclkit::format_seconds(options_.timeout) +
                             ") before its workers finished; its launcher was probably killed");
        }
      }
      if (!announced_wait && now - started > std::chrono::seconds(10)) {
        report("this node's workers succeeded; waiting for node(s) " + detail::join_ints(pending) + " to finish");
        announced_wait = true;
      }
      backoff.sleep();
    }
  }

  // Declared before the store: destroyed after it, so the client disconnects first.
  std::unique_ptr<TcpStoreServer> server_;
  std::shared_ptr<Store> store_;
  StoreCoordinatorOptions options_;
  std::string id_;
  int node_rank_ = -1;
  bool left_ = false;
  JobLayout layout_;
  bool layout_joined_ = false;
  std::chrono::steady_clock::time_point last_beat_{};
};

}  // namespace ncclkit::launch
