#pragma once
/// Options of the TCP store: where and how a TcpStoreServer listens (TcpStoreServerOptions),
/// how a TcpStore client finds its server (TcpStoreOptions), and the shared token both sides
/// resolve the same way. Defaults come from NCCLKIT_STORE_* environment variables
/// (docs/environment.md).

#include <chrono>    // std::chrono::milliseconds
#include <cstddef>   // std::size_t
#include <optional>  // std::optional
#include <string>    // std::string

#include "ncclkit/core/env.hpp"                   // env_seconds, env_string, default_store_timeout
#include "ncclkit/core/error.hpp"                 // ConfigError
#include "ncclkit/store/detail/tcp_protocol.hpp"  // kDefaultMaxValueBytes, kMaxTokenBytes

namespace ncclkit {

/// Default handshake timeout of a TcpStoreServer: NCCLKIT_STORE_HANDSHAKE_TIMEOUT seconds, else 10 s.
inline std::chrono::milliseconds default_store_handshake_timeout() {
  return env_seconds("NCCLKIT_STORE_HANDSHAKE_TIMEOUT", std::chrono::seconds(10));
}

/// Where and how a TcpStoreServer listens.
struct TcpStoreServerOptions {
  /// Address, host name or interface name to bind; "" for every address (IPv6 dual-stack
  /// where available). Loopback by default: serving other hosts is a decision to make.
  std::string host = "127.0.0.1";
  /// 0 picks a free port; TcpStoreServer::port() reports it.
  int port = 0;
  /// Shared secret clients must present; default NCCLKIT_STORE_TOKEN when set. "" means none.
  std::optional<std::string> token{};
  /// Largest value accepted; a peer announcing more is disconnected.
  std::size_t max_value_bytes = detail::tcp::kDefaultMaxValueBytes;
  /// How long a new connection may take to complete its hello, and how long a client may
  /// stop sending in the middle of a frame; past it the connection is closed (logged). A
  /// client idle between requests, or waiting in a get or wait, is never timed out.
  /// Default NCCLKIT_STORE_HANDSHAKE_TIMEOUT seconds, else 10 s.
  std::chrono::milliseconds handshake_timeout = default_store_handshake_timeout();
};

/// The store token to use: the explicit one, else NCCLKIT_STORE_TOKEN, else none (""). A
/// token longer than a hello may carry (4096 bytes) is a ConfigError.
inline std::string resolve_store_token(const std::optional<std::string>& token) {
  std::string resolved = token ? *token : env_string("NCCLKIT_STORE_TOKEN").value_or("");
  if (resolved.size() > detail::tcp::kMaxTokenBytes) {
    throw ConfigError("the TcpStore token (" + std::string(token ? "given in the options" : "NCCLKIT_STORE_TOKEN") +
                      ") is " + std::to_string(resolved.size()) + " bytes, more than the limit of " +
                      std::to_string(detail::tcp::kMaxTokenBytes) +
                      "; use a shorter secret (32 random hex digits are plenty)");
  }
  return resolved;
}

/// How a TcpStore client finds its server.
struct TcpStoreOptions {
  std::string host = "127.0.0.1";
  int port = 0;
  /// This object also hosts the server (rank 0), bound to `host`:`port` (port 0: a free one).
  bool is_server = false;
  /// How long connecting may take (retried with backoff), and the default of blocking calls.
  std::chrono::milliseconds timeout = default_store_timeout();
  /// Shared secret to present; default NCCLKIT_STORE_TOKEN when set.
  std::optional<std::string> token{};
  /// With is_server: how long the destructor keeps serving while other clients are still
  /// connected, so that ranks reading the last keys (a final barrier) are not cut off when
  /// the hosting rank finishes first. Default NCCLKIT_STORE_LINGER seconds (0: none), else 30 s.
  std::chrono::milliseconds linger = default_store_linger();
};

}  // namespace ncclkit
