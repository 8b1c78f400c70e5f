#pragma once
/// open_launcher_store(): the store the launchers of a job meet in (for the run and for
/// --check). See LauncherStore.

#include <filesystem>  // std::filesystem::create_directories, absolute
#include <memory>      // std::unique_ptr, std::shared_ptr
#include <optional>    // std::optional
#include <string>      // std::string

#include "launch/interfaces.hpp"
#include "launch/options.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/store/file_store.hpp"
#include "ncclkit/store/tcp_store.hpp"

namespace ncclkit::launch {

/// The launchers' store: node 0's TCP store (node 0 hosts the server on every address at
/// --master-port; the others connect, retrying until the rendezvous timeout), or a FileStore
/// in <rdzv-dir>/launchers for --nnodes processes. Not for the standalone case.
struct LauncherStore {
  std::unique_ptr<TcpStoreServer> server;  ///< node 0 with --master-addr: the server it hosts
  std::shared_ptr<Store> store;
  std::string worker_folder;     ///< --rdzv-dir: <dir>/workers, the workers' store
  std::optional<int> node_rank;  ///< known before joining (--node-rank, or one node)
};

/// The warning ncclkit-run gives at start and in --check when the launchers' store it hosts
/// can be reached from other hosts and asks for no token (any process that reaches the port
/// could read and change the job's keys); nullopt when it asks for one or listens on loopback.
inline std::optional<std::string> store_token_warning(const TcpStoreServer& server) {
  const std::string host = server.host();
  if (server.requires_token() || is_loopback_address(host)) return std::nullopt;
  const bool everywhere = host == "::" || host == "0.0.0.0";
  return "the launchers' store listens on " + ncclkit::detail::format_host_port(host, server.port()) +
         (everywhere ? " (every address of this host)" : "") +
         " without a token: any process that can reach this port can read and change the job's keys. Set "
         "NCCLKIT_STORE_TOKEN to the same secret on every node before starting ncclkit-run (e.g. "
         "NCCLKIT_STORE_TOKEN=$(openssl rand -hex 16), exported by the job script to all nodes); the workers' "
         "store takes it from there too";
}

/// Opens (node 0 with --master-addr: serves, then connects to) the launchers' store for
/// `options`. ConfigError when node 0 cannot serve on --master-port or the folder cannot be
/// created; TimeoutError naming the address when node 0's store cannot be reached in time.
inline LauncherStore open_launcher_store(const LaunchOptions& options) {
  LauncherStore result;
  result.node_rank = options.nnodes == 1 ? std::optional<int>(0) : options.node_rank;
  if (options.rendezvous() == RendezvousKind::kFolder) {
    namespace fs = std::filesystem;
    std::error_code error;
    const fs::path root = fs::absolute(options.rdzv_dir, error);
    const fs::path launchers = root / "launchers", workers = root / "workers";
    fs::create_directories(launchers, error);
    if (!error) fs::create_directories(workers, error);
    if (error) {
      throw ConfigError("ncclkit-run: cannot create the rendezvous folder '" + root.string() + "': " + error.message() +
                        "; --rdzv-dir must be a folder every node can write");
    }
    result.worker_folder = workers.string();
    result.store = std::make_shared<FileStore>(
        launchers.string(), FileStoreOptions{.world_size = options.nnodes, .timeout = options.rdzv_timeout});
    return result;
  }
  if (result.node_rank.value_or(0) == 0) {
    try {
      TcpStoreServerOptions server_options;
      server_options.host = "";  // every address: the other nodes connect from outside
      server_options.port = options.master_port;
      result.server = std::make_unique<TcpStoreServer>(server_options);
    } catch (const Error& e) {
      throw ConfigError("ncclkit-run (node 0): cannot serve the launchers' store on port " +
                        std::to_string(options.master_port) + ": " + e.what() +
                        "; pick another --master-port, or check that no other job uses it");
    }
    TcpStoreOptions client_options;
    client_options.host = "127.0.0.1";
    client_options.port = result.server->port();
    client_options.timeout = options.rdzv_timeout;
    result.store = std::make_shared<TcpStore>(client_options);
    return result;
  }
  try {
    TcpStoreOptions client_options;
    client_options.host = options.master_addr;
    client_options.port = options.master_port;
    client_options.timeout = options.rdzv_timeout;
    result.store = std::make_shared<TcpStore>(client_options);
  } catch (const Error& e) {
    throw TimeoutError("ncclkit-run (node " + std::to_string(*options.node_rank) +
                       "): cannot reach the launchers' store at " +
                       ncclkit::detail::format_host_port(options.master_addr, options.master_port) + ": " + e.what() +
                       "; is ncclkit-run running on node 0, is --master-addr node 0's address, and does the "
                       "firewall let this port through? (ncclkit-run --check tells)");
  }
  return result;
}

}  // namespace ncclkit::launch
