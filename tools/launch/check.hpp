#pragma once
/// `ncclkit-run --check`: the answer to "why does my multi-node job hang at start-up?".
///
/// Every node's launcher (same flags as for a run, no program) reports its host, GPUs (without
/// touching CUDA), driver, CUDA and NCCL versions (launch/versions.hpp), and the network
/// interfaces NCCL would use (launch/interfaces.hpp). With a rendezvous (--master-addr or
/// --rdzv-dir) the nodes then test the paths a real job needs:
///
/// 1. each node reaches the launchers' store (node 0 serves it, or the shared folder);
/// 2. each node opens a TCP listener on every address and publishes its addresses, the one
///    NCCL would pick first, and the listener's port;
/// 3. each node connects to every other node's addresses, NCCL's first, and exchanges a
///    greeting with the listener (so a connection that some other process accepted does not
///    count), and notes through which interface the kernel routes to each peer;
/// 4. every node prints the same table and the same list of problems, each with what to set.
///
/// Exit status 0 when no problem was found, 1 otherwise (2 for a usage error).

#include <poll.h>        // poll
#include <sys/socket.h>  // accept4, send, recv

#include <algorithm>  // std::max, std::sort
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono
#include <cstdio>     // std::snprintf
#include <map>        // std::map
#include <memory>     // std::shared_ptr
#include <optional>   // std::optional
#include <random>     // std::random_device
#include <set>        // std::set
#include <sstream>    // std::istringstream
#include <string>     // std::string
#include <thread>     // std::thread (the listener)
#include <vector>     // std::vector

#include "launch/interfaces.hpp"
#include "launch/launcher_store.hpp"
#include "launch/options.hpp"
#include "launch/output.hpp"
#include "launch/store_coordinator.hpp"
#include "launch/supervisor.hpp"
#include "launch/versions.hpp"
#include "ncclkit/bootstrap/local_gpus.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/detail/socket.hpp"

namespace ncclkit::launch {

/// What one node found out about itself; published to the others through the store.
struct NodeReport {
  int node_rank = 0;
  std::string host;
  std::string id;  ///< random, to recognise this node's listener
  int port = 0;    ///< the listener's port
  std::string gpus = "none";
  int gpu_count = 0;
  SoftwareVersions versions;
  std::string nccl_socket_ifname;                              ///< NCCL_SOCKET_IFNAME as set ("" when unset)
  std::string nccl_interface;                                  ///< the interface NCCL would use first ("" when none)
  std::string nccl_address;                                    ///< its address
  std::vector<std::pair<std::string, std::string>> addresses;  ///< (interface, address) to try
  std::vector<std::string> problems;                           ///< found locally, with the fix

  std::string encode() const {
    std::string text =
        "node=" + std::to_string(node_rank) + "\nhost=" + host + "\nid=" + id + "\nport=" + std::to_string(port) +
        "\ngpus=" + gpus + "\ngpu_count=" + std::to_string(gpu_count) + "\ndriver=" + versions.driver +
        "\ncuda_driver=" + versions.cuda_driver + "\ncuda_runtime=" + versions.cuda_runtime +
        "\nnccl=" + versions.nccl + "\nnccl_path=" + versions.nccl_path + "\nnccl_socket_ifname=" + nccl_socket_ifname +
        "\nnccl_interface=" + nccl_interface + "\nnccl_address=" + nccl_address;
    for (const auto& [name, address] : addresses) text += "\naddress=" + name + " " + address;
    for (const auto& problem : problems) text += "\nproblem=" + problem;
    return text;
  }

  static NodeReport decode(const std::string& text) {
    NodeReport report;
    std::istringstream lines(text);
    std::string line;
    while (std::getline(lines, line)) {
      const auto eq = line.find('=');
      if (eq == std::string::npos) continue;
      const std::string name = line.substr(0, eq), value = line.substr(eq + 1);
      auto number = [&] { return static_cast<int>(parse_int(value).value_or(0)); };
      if (name == "node")
        report.node_rank = number();
      else if (name == "host")
        report.host = value;
      else if (name == "id")
        report.id = value;
      else if (name == "port")
        report.port = number();
      else if (name == "gpus")
        report.gpus = value;
      else if (name == "gpu_count")
        report.gpu_count = number();
      else if (name == "driver")
        report.versions.driver = value;
      else if (name == "cuda_driver")
        report.versions.cuda_driver = value;
      else if (name == "cuda_runtime")
        report.versions.cuda_runtime = value;
      else if (name == "nccl")
        report.versions.nccl = value;
      else if (name == "nccl_path")
        report.versions.nccl_path = value;
      else if (name == "nccl_socket_ifname")
        report.nccl_socket_ifname = value;
      else if (name == "nccl_interface")
        report.nccl_interface = value;
      else if (name == "nccl_address")
        report.nccl_address = value;
      else if (name == "address") {
        const auto space = value.find(' ');
        report.addresses.emplace_back(value.substr(0, space),
                                      space == std::string::npos ? "" : value.substr(space + 1));
      } else if (name == "problem")
        report.problems.push_back(value);
    }
    return report;
  }
};

/// One node's attempt to reach another node at one address.
struct ReachResult {
  int from = 0;
  int to = 0;
  std::string interface;  ///< the target's interface holding `address`
  std::string address;
  bool ok = false;
  std::string error;  ///< why not
};

/// Through which local interface a node's kernel routes to a peer's NCCL address.
struct RouteResult {
  int from = 0;
  int to = 0;
  std::string interface;  ///< "" when there is no route
};

namespace detail {

/// A TCP listener that answers "ncclkit-check <id>" with "ok <its id>", on its own thread,
/// until destroyed.
class CheckListener {
 public:
  explicit CheckListener(std::string id)
      : id_(std::move(id)),
        socket_(ncclkit::detail::listen_tcp("", 0)),
        port_(ncclkit::detail::local_port(socket_.get())) {
    thread_ = std::thread([this] { serve(); });
  }
  ~CheckListener() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  CheckListener(const CheckListener&) = delete;
  CheckListener& operator=(const CheckListener&) = delete;
  int port() const { return port_; }

 private:
  void serve() {
    while (!stop_.load()) {
      pollfd p{socket_.get(), POLLIN, 0};
      if (::poll(&p, 1, 100) <= 0) continue;
      ncclkit::detail::Socket peer(::accept4(socket_.get(), nullptr, nullptr, SOCK_CLOEXEC));
      if (!peer) continue;
      // One short exchange per connection, bounded so a silent peer cannot stall the others.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
      const std::string greeting = read_line(peer.get(), deadline);
      if (greeting.rfind("ncclkit-check ", 0) == 0) send_text(peer.get(), "ok " + id_ + "\n", deadline);
    }
  }

  std::string id_;
  ncclkit::detail::Socket socket_;
  int port_;
  std::atomic<bool> stop_{false};
  std::thread thread_;

 public:
  /// Reads up to a '\n' (at most 256 bytes) by `deadline`; "" on failure.
  static std::string read_line(int fd, std::chrono::steady_clock::time_point deadline) {
    std::string line;
    while (line.size() < 256) {
      pollfd p{fd, POLLIN, 0};
      const int ready = ::poll(&p, 1, ncclkit::detail::poll_timeout_ms(deadline));
      if (ready <= 0) return "";
      char c;
      const ssize_t n = ::recv(fd, &c, 1, 0);
      if (n <= 0) return "";
      if (c == '\n') return line;
      line.push_back(c);
    }
    return "";
  }
  static bool send_text(int fd, const std::string& text, std::chrono::steady_clock::time_point deadline) {
    std::size_t done = 0;
    while (done < text.size()) {
      pollfd p{fd, POLLOUT, 0};
      if (::poll(&p, 1, ncclkit::detail::poll_timeout_ms(deadline)) <= 0) return false;
      const ssize_t n = ::send(fd, text.data() + done, text.size() - done, MSG_NOSIGNAL);
      if (n <= 0) return false;
      done += static_cast<std::size_t>(n);
    }
    return true;
  }
};

/// Connects to `address`:`port` and greets the listener of node `expected_id`; "" on
/// success, else what went wrong.
inline std::string probe_peer(const std::string& address, int port, const std::string& expected_id,
                              std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<ncclkit::detail::SocketAddress> targets;
  try {
    targets = ncclkit::detail::resolve_addresses(address, port, false);
  } catch (const Error& e) {
    return e.what();
  }
  std::string error = "no address";
  for (const auto& target : targets) {
    int err = 0;
    ncclkit::detail::Socket socket = ncclkit::detail::connect_once(target, deadline, err);
    if (!socket) {
      error = err == ETIMEDOUT
                  ? "connection timed out after " + ncclkit::format_seconds(limit) + " (a firewall dropping packets?)"
                  : ncclkit::detail::errno_text(err);
      continue;
    }
    if (!CheckListener::send_text(socket.get(), "ncclkit-check " + expected_id + "\n", deadline)) {
      error = "connected, but the greeting could not be sent";
      continue;
    }
    const std::string reply = CheckListener::read_line(socket.get(), deadline);
    if (reply == "ok " + expected_id) return "";
    error = reply.empty() ? "connected, but no answer from ncclkit-run --check (another program owns the port?)"
                          : "answered by another ncclkit-run --check ('" + reply + "'): two checks at once?";
  }
  return error;
}

/// "a, b and c".
inline std::string join_words(const std::vector<std::string>& words) {
  std::string text;
  for (std::size_t i = 0; i < words.size(); ++i) {
    if (i > 0) text += i + 1 == words.size() ? " and " : ", ";
    text += words[i];
  }
  return text;
}

/// Left-aligned columns, two spaces apart.
inline std::string format_table(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::size_t> widths;
  for (const auto& row : rows) {
    widths.resize(std::max(widths.size(), row.size()), 0);
    for (std::size_t c = 0; c < row.size(); ++c) widths[c] = std::max(widths[c], row[c].size());
  }
  std::string text;
  for (const auto& row : rows) {
    std::string line;
    for (std::size_t c = 0; c < row.size(); ++c) {
      line += row[c];
      if (c + 1 < row.size()) line += std::string(widths[c] - row[c].size() + 2, ' ');
    }
    text += line + "\n";
  }
  return text;
}

}  // namespace detail

/// Builds this node's report: GPUs, versions, interfaces, and the problems visible locally.
inline NodeReport local_report(const LaunchOptions& options, int node_rank, int port, const std::string& id) {
  NodeReport report;
  report.node_rank = node_rank;
  report.host = detail::host_name();
  report.id = id;
  report.port = port;
  const GpuInventory gpus = find_gpus();
  report.gpus = gpus.describe();
  report.gpu_count = static_cast<int>(gpus.visible.size());
  report.versions = probe_versions();

  const auto interfaces = list_interfaces();
  const auto ifname = env_string("NCCL_SOCKET_IFNAME");
  report.nccl_socket_ifname = ifname.value_or("");
  const auto candidates = nccl_interface_candidates(interfaces, ifname);
  if (!candidates.empty()) {
    report.nccl_interface = candidates.front().name;
    report.nccl_address = candidates.front().address;
  }
  // Addresses to be tried by the others: NCCL's first, then the rest (loopback only when it is
  // all there is, as for nodes that share one host in a test).
  if (!report.nccl_address.empty()) report.addresses.emplace_back(report.nccl_interface, report.nccl_address);
  for (const auto& i : interfaces) {
    if (!i.up || i.loopback || i.address == report.nccl_address) continue;
    report.addresses.emplace_back(i.name, i.address);
  }
  if (report.addresses.empty()) {
    for (const auto& i : interfaces)
      if (i.up && i.loopback) report.addresses.emplace_back(i.name, i.address);
  }

  std::vector<std::string> up_names;
  for (const auto& i : interfaces)
    if (i.up && std::find(up_names.begin(), up_names.end(), i.name) == up_names.end()) up_names.push_back(i.name);
  if (ifname && candidates.empty()) {
    const auto defaults = nccl_interface_candidates(interfaces, std::nullopt);
    report.problems.push_back("NCCL_SOCKET_IFNAME=" + *ifname + " matches no interface that is up (this host has " +
                              detail::join_words(up_names) + "); NCCL will fail to start. Set NCCL_SOCKET_IFNAME=" +
                              (defaults.empty() ? std::string("<interface>") : defaults.front().name) +
                              " (or the interface that reaches the other nodes), or unset it");
  }
  if (options.nnodes > 1 && !candidates.empty() &&
      (candidates.front().loopback || is_loopback_address(candidates.front().address))) {
    report.problems.push_back("NCCL would use the loopback interface " + candidates.front().name +
                              ", which other hosts cannot reach. Set NCCL_SOCKET_IFNAME to the interface that "
                              "reaches the other nodes");
  }
  if (options.nproc_per_node && report.gpu_count > 0 && *options.nproc_per_node > report.gpu_count) {
    report.problems.push_back("--nproc-per-node " + std::to_string(*options.nproc_per_node) + " but only " +
                              std::to_string(report.gpu_count) +
                              " GPU(s) are visible: ranks would share GPUs, "
                              "which NCCL refuses. Use --nproc-per-node auto");
  }
  if (options.rendezvous() == RendezvousKind::kTcp && node_rank == 0) {
    const auto resolved = resolve_host(options.master_addr);
    if (resolved.empty()) {
      report.problems.push_back("--master-addr " + options.master_addr +
                                " does not resolve on node 0. Give node 0's "
                                "IP address or a name every node resolves");
    } else {
      bool local = false;
      for (const auto& address : resolved)
        local = local || !interface_of(interfaces, address).empty() || address == "127.0.0.1" || address == "::1";
      if (!local) {
        const std::string shown = resolved.size() == 1 && resolved.front() == options.master_addr
                                      ? options.master_addr
                                      : options.master_addr + " (" + detail::join_words(resolved) + ")";
        report.problems.push_back("--master-addr " + shown +
                                  " is not an address of this host, node 0, which serves the store there. Give "
                                  "node 0's own address (this host has " +
                                  detail::join_words([&] {
                                    std::vector<std::string> list;
                                    for (const auto& [name, address] : report.addresses) list.push_back(address);
                                    return list;
                                  }()) +
                                  ")");
      }
    }
  }
  return report;
}

/// Every problem the table lists, with what to set: each node's own, the connection
/// failures, route mismatches and version differences. Deterministic: every node computes
/// the same list from the same records.
inline std::vector<std::string> cross_node_problems(const LaunchOptions& options, const std::vector<NodeReport>& nodes,
                                                    const std::vector<ReachResult>& reach,
                                                    const std::vector<RouteResult>& routes) {
  std::vector<std::string> problems;
  for (const auto& node : nodes)
    for (const auto& problem : node.problems)
      problems.push_back("[node " + std::to_string(node.node_rank) + "] " + problem);

  std::map<std::pair<int, int>, std::vector<const ReachResult*>> by_pair;
  for (const auto& r : reach) by_pair[{r.from, r.to}].push_back(&r);
  for (const auto& [pair, results] : by_pair) {
    const auto& target = nodes[static_cast<std::size_t>(pair.second)];
    const ReachResult* nccl_result = nullptr;
    const ReachResult* any_ok = nullptr;
    for (const auto* r : results) {
      if (r->address == target.nccl_address) nccl_result = r;
      if (r->ok && any_ok == nullptr) any_ok = r;
    }
    const std::string who = "[node " + std::to_string(pair.first) + " -> node " + std::to_string(pair.second) + "] ";
    if (nccl_result != nullptr && nccl_result->ok) continue;
    if (any_ok != nullptr && nccl_result != nullptr) {
      problems.push_back(who + "cannot connect to node " + std::to_string(pair.second) + "'s NCCL interface " +
                         target.nccl_interface + " (" + nccl_result->address + "): " + nccl_result->error + ". Node " +
                         std::to_string(pair.second) + " is reachable at " + any_ok->address + " (" +
                         any_ok->interface + "): set NCCL_SOCKET_IFNAME=" + any_ok->interface + " on node " +
                         std::to_string(pair.second));
    } else if (any_ok == nullptr) {
      std::vector<std::string> tried;
      for (const auto* r : results) tried.push_back(r->address + " (" + r->interface + "): " + r->error);
      problems.push_back(who + "cannot connect to node " + std::to_string(pair.second) +
                         " at any of its addresses: " + detail::join_words(tried) +
                         ". A firewall or a routing problem between the nodes: allow TCP between them on all ports "
                         "(the store, NCCL's bootstrap and its socket transport use ephemeral ports)");
    }
  }
  for (const auto& route : routes) {
    const auto& node = nodes[static_cast<std::size_t>(route.from)];
    if (route.interface.empty()) {
      problems.push_back("[node " + std::to_string(route.from) + "] has no route to node " + std::to_string(route.to) +
                         "'s NCCL address " + nodes[static_cast<std::size_t>(route.to)].nccl_address +
                         ". Set NCCL_SOCKET_IFNAME on node " + std::to_string(route.to) +
                         " to an interface this node can reach");
    } else if (!node.nccl_interface.empty() && route.interface != node.nccl_interface &&
               route.interface.rfind("lo", 0) != 0) {
      problems.push_back("[node " + std::to_string(route.from) + "] reaches node " + std::to_string(route.to) +
                         " through " + route.interface + ", but NCCL would use " + node.nccl_interface +
                         " here. Set NCCL_SOCKET_IFNAME=" + route.interface + " on node " + std::to_string(route.from));
    }
  }

  std::map<std::string, std::vector<std::string>> nccl_versions;
  for (const auto& node : nodes) nccl_versions[node.versions.nccl].push_back(std::to_string(node.node_rank));
  if (nccl_versions.size() > 1) {
    std::vector<std::string> parts;
    for (const auto& [version, on] : nccl_versions) parts.push_back(version + " on node(s) " + detail::join_words(on));
    problems.push_back("[all] NCCL differs between nodes: " + detail::join_words(parts) +
                       ". Install the same NCCL version on every node (mixed versions hang or fail at init)");
  }
  if (options.rendezvous() == RendezvousKind::kTcp && !nodes.empty()) {
    const auto resolved = resolve_host(options.master_addr);
    bool loopback = !resolved.empty();
    for (const auto& address : resolved) loopback = loopback && is_loopback_address(address);
    bool several_hosts = false;
    for (const auto& node : nodes) several_hosts = several_hosts || node.host != nodes.front().host;
    if (loopback && several_hosts) {
      problems.push_back(
          "[all] --master-addr " + options.master_addr + " is a loopback address (" + detail::join_words(resolved) +
          "), but the nodes are on different hosts. Give node 0's "
          "network address (e.g. " +
          (nodes.front().nccl_address.empty() ? std::string("its IP") : nodes.front().nccl_address) + ")");
    }
  }
  return problems;
}

/// The report: a header, one row per node, the connections, then warnings (things to fix that
/// do not stop a job, so they leave the exit status alone) and the problems.
inline std::string format_check_report(const std::string& store_text, const std::vector<NodeReport>& nodes,
                                       const std::vector<ReachResult>& reach, const std::vector<std::string>& problems,
                                       const std::vector<std::string>& warnings = {}) {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"node", "host", "GPUs", "driver", "CUDA (driver/runtime)", "NCCL", "NCCL interface", "reaches"});
  for (const auto& node : nodes) {
    // Per peer: ok (at its NCCL address), "other interface" (only at another address), FAILED.
    std::vector<std::string> ok, other, failed;
    std::set<int> seen_nccl_ok, seen_ok, seen_any;
    for (const auto& r : reach) {
      if (r.from != node.node_rank) continue;
      seen_any.insert(r.to);
      if (!r.ok) continue;
      seen_ok.insert(r.to);
      for (const auto& peer : nodes)
        if (peer.node_rank == r.to && peer.nccl_address == r.address) seen_nccl_ok.insert(r.to);
    }
    for (int to : seen_any) {
      (seen_nccl_ok.count(to) ? ok : seen_ok.count(to) ? other : failed).push_back(std::to_string(to));
    }
    std::string reaches = nodes.size() == 1 ? "-" : "";
    auto add = [&](const std::vector<std::string>& list, const std::string& what) {
      if (!list.empty())
        reaches += std::string(reaches.empty() ? "" : "; ") + "node " + detail::join_words(list) + " " + what;
    };
    add(ok, "ok");
    add(other, "only on another interface");
    add(failed, "FAILED");
    if (reaches.empty()) reaches = "not tested";
    rows.push_back(
        {std::to_string(node.node_rank), node.host, node.gpus, node.versions.driver,
         node.versions.cuda_driver + " / " + node.versions.cuda_runtime, node.versions.nccl,
         node.nccl_interface.empty()
             ? "none"
             : node.nccl_interface + " " + node.nccl_address +
                   (node.nccl_socket_ifname.empty() ? "" : " (NCCL_SOCKET_IFNAME=" + node.nccl_socket_ifname + ")"),
         reaches});
  }
  std::string text = "ncclkit-run --check: " + std::to_string(nodes.size()) + " node(s); store: " + store_text + "\n";
  text += detail::format_table(rows);
  if (!warnings.empty()) {
    text += "warnings (" + std::to_string(warnings.size()) + "):\n";
    for (const auto& warning : warnings) text += "  - " + warning + "\n";
  }
  if (problems.empty()) {
    text += "problems: none found\n";
  } else {
    text += "problems (" + std::to_string(problems.size()) + "):\n";
    for (const auto& problem : problems) text += "  - " + problem + "\n";
  }
  return text;
}

/// Runs --check (see the header comment) and returns the exit status: 0 healthy, 1 otherwise.
/// Prints the report to stdout.
inline int run_check(const LaunchOptions& options) {
  std::random_device random;
  const std::string id = detail::host_name() + ":" + std::to_string(::getpid()) + ":" + std::to_string(random());
  auto print = [](const std::string& text) { detail::write_fully(1, text); };

  if (options.rendezvous() == RendezvousKind::kStandalone) {
    NodeReport report = local_report(options, 0, 0, id);
    const auto problems = cross_node_problems(options, {report}, {}, {});
    print(format_check_report("none (one node, no --master-addr or --rdzv-dir)", {report}, {}, problems));
    return problems.empty() ? 0 : 1;
  }

  detail::CheckListener listener(id);
  const int known_rank = options.nnodes == 1 ? 0 : options.node_rank.value_or(-1);
  LauncherStore opened;
  try {
    opened = open_launcher_store(options);
  } catch (const Error& e) {
    NodeReport report = local_report(options, std::max(known_rank, 0), listener.port(), id);
    report.problems.push_back(std::string("cannot reach the launchers' store: ") + e.what());
    const auto problems = cross_node_problems(options, {report}, {}, {});
    print(format_check_report("unreachable", {report}, {}, problems));
    return 1;
  }
  Store& store = *opened.store;
  const std::string prefix = "ncclkit-check/";
  int node_rank = known_rank;
  if (node_rank < 0) node_rank = static_cast<int>(store.add(prefix + "next_node", 1) - 1);
  std::vector<std::string> warnings;
  if (opened.server != nullptr) {
    if (auto warning = store_token_warning(*opened.server))
      warnings.push_back("[node " + std::to_string(node_rank) + "] " + *warning);
  } else if (options.rendezvous() == RendezvousKind::kTcp && resolve_store_token(std::nullopt).empty()) {
    warnings.push_back("[node " + std::to_string(node_rank) +
                       "] joined the launchers' store without a token "
                       "(NCCLKIT_STORE_TOKEN is unset here), so node 0's store asks for none: any process that can "
                       "reach it can read and change the job's keys. Set NCCLKIT_STORE_TOKEN to the same secret on "
                       "every node");
  }
  std::vector<std::string> extra_problems;
  if (node_rank >= options.nnodes) {
    print("ncclkit-run --check: more launchers than --nnodes " + std::to_string(options.nnodes) +
          " joined the check at " + store.describe() + "; start exactly one per node\n");
    return 1;
  }
  const std::string claimed = store.compare_set(prefix + "claim/" + std::to_string(node_rank), "", id);
  if (claimed != id) {
    print("ncclkit-run --check: node rank " + std::to_string(node_rank) + " is taken twice (by " + claimed +
          " and by " + id + "); give every node its own --node-rank\n");
    return 1;
  }

  // Store round trip, for the header.
  std::vector<double> round_trips;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    store.add(prefix + "ping/" + std::to_string(node_rank), 1);
    round_trips.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(round_trips.begin(), round_trips.end());
  char round_trip[64];
  std::snprintf(round_trip, sizeof round_trip, " (round trip %.2f ms, median of 5)", round_trips[2]);
  const std::string store_text = store.describe() + round_trip;

  NodeReport self = local_report(options, node_rank, listener.port(), id);
  store.set(prefix + "node/" + std::to_string(node_rank), self.encode());

  // Wait for every node's record; on timeout, go on with those present.
  auto wait_all = [&](const std::string& what) -> std::vector<int> {
    std::vector<std::string> keys;
    for (int n = 0; n < options.nnodes; ++n) keys.push_back(prefix + what + "/" + std::to_string(n));
    try {
      store.wait(keys, options.rdzv_timeout);
      return {};
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (int n = 0; n < options.nnodes; ++n)
        if (!store.check({keys[static_cast<std::size_t>(n)]})) missing.push_back(n);
      return missing;
    }
  };
  std::vector<int> missing = wait_all("node");
  std::vector<NodeReport> nodes;
  for (int n = 0; n < options.nnodes; ++n) {
    if (std::find(missing.begin(), missing.end(), n) != missing.end()) continue;
    NodeReport node = NodeReport::decode(store.get_string(prefix + "node/" + std::to_string(n), options.rdzv_timeout));
    nodes.push_back(node);
  }

  // Reach every other node at each of its addresses; note the route to its NCCL address.
  std::string reach_record;
  for (const auto& node : nodes) {
    if (node.node_rank == node_rank) continue;
    for (const auto& [name, address] : node.addresses) {
      const std::string error = detail::probe_peer(address, node.port, node.id, std::chrono::seconds(3));
      reach_record += "reach=" + std::to_string(node.node_rank) + " " + name + " " + address + " " +
                      (error.empty() ? "ok" : "failed " + error) + "\n";
    }
    std::string via;
    if (auto source = route_source_address(node.nccl_address)) via = interface_of(list_interfaces(), *source);
    reach_record += "route=" + std::to_string(node.node_rank) + " " + via + "\n";
  }
  store.set(prefix + "reach/" + std::to_string(node_rank), reach_record.empty() ? "none=1" : reach_record);
  std::vector<int> missing_reach = wait_all("reach");

  std::vector<ReachResult> reach;
  std::vector<RouteResult> routes;
  for (const auto& node : nodes) {
    if (std::find(missing_reach.begin(), missing_reach.end(), node.node_rank) != missing_reach.end()) continue;
    std::istringstream lines(
        store.get_string(prefix + "reach/" + std::to_string(node.node_rank), options.rdzv_timeout));
    std::string line;
    while (std::getline(lines, line)) {
      std::istringstream fields(line.substr(line.find('=') + 1));
      if (line.rfind("reach=", 0) == 0) {
        ReachResult r;
        std::string status;
        r.from = node.node_rank;
        fields >> r.to >> r.interface >> r.address >> status;
        std::getline(fields, r.error);
        if (!r.error.empty() && r.error.front() == ' ') r.error.erase(0, 1);
        r.ok = status == "ok";
        reach.push_back(r);
      } else if (line.rfind("route=", 0) == 0) {
        RouteResult route;
        route.from = node.node_rank;
        fields >> route.to >> route.interface;
        routes.push_back(route);
      }
    }
  }

  // Records of missing nodes are absent: drop what refers to them, and say who is missing.
  std::vector<NodeReport> by_rank(static_cast<std::size_t>(options.nnodes));
  for (const auto& node : nodes) by_rank[static_cast<std::size_t>(node.node_rank)] = node;
  std::erase_if(reach,
                [&](const ReachResult& r) { return std::find(missing.begin(), missing.end(), r.to) != missing.end(); });
  std::erase_if(routes,
                [&](const RouteResult& r) { return std::find(missing.begin(), missing.end(), r.to) != missing.end(); });
  std::vector<std::string> problems;
  if (missing.empty()) {
    problems = cross_node_problems(options, by_rank, reach, routes);
  } else {
    problems = cross_node_problems(options, nodes, {}, {});
    std::vector<std::string> names;
    for (int n : missing) names.push_back(std::to_string(n));
    problems.push_back(
        "[all] node(s) " + detail::join_words(names) + " did not join the check at " + store.describe() + " within " +
        ncclkit::format_seconds(options.rdzv_timeout) +
        ": start ncclkit-run --check on every node with the same --nnodes and " +
        (options.rendezvous() == RendezvousKind::kFolder ? "--rdzv-dir" : "--master-addr/--master-port") +
        " (--rdzv-timeout sets how long to wait)");
  }
  if (!missing_reach.empty() && missing.empty()) {
    problems.push_back("[all] some nodes did not finish their connection tests in time; run the check again");
  }
  print(format_check_report(store_text, nodes, reach, problems, warnings));

  // Leave; node 0 keeps serving a TCP store until the others have read everything.
  store.set(prefix + "left/" + std::to_string(node_rank), "1");
  if (opened.server != nullptr) {
    std::vector<std::string> keys;
    for (const auto& node : nodes) keys.push_back(prefix + "left/" + std::to_string(node.node_rank));
    try {
      store.wait(keys, std::min<std::chrono::milliseconds>(options.rdzv_timeout, std::chrono::seconds(30)));
    } catch (const TimeoutError&) {
    }
  }
  return problems.empty() ? 0 : 1;
}

}  // namespace ncclkit::launch
