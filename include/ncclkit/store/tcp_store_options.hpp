#pragma once
/// Options of the TCP store: where and how a TcpStoreServer listens (TcpStoreServerOptions),
/// how a TcpStore client finds its server (TcpStoreOptions), and the shared token both sides
/// resolve the same way. The NCCLKIT_STORE_* environment variables, where set, override the
/// fields they name (core/knobs.hpp, docs/environment.md).

#include <chrono>    // std::chrono::milliseconds
#include <cstddef>   // std::size_t
#include <optional>  // std::optional
#include <string>    // std::string

#include "ncclkit/core/error.hpp"                 // ConfigError
#include "ncclkit/core/knobs.hpp"                 // knob, knob_default, environment_overrides
#include "ncclkit/store/detail/tcp_protocol.hpp"  // kDefaultMaxValueBytes, kMaxTokenBytes

namespace ncclkit {

/// Where and how a TcpStoreServer listens.
struct TcpStoreServerOptions {
  /// Address, host name or interface name to bind; "" for every address (IPv6 dual-stack
  /// where available). Loopback by default: serving other hosts is a decision to make.
  std::string host = "127.0.0.1";
  /// 0 picks a free port; TcpStoreServer::port() reports it.
  int port = 0;
  /// Shared secret clients must present; "" or nullopt: none. NCCLKIT_STORE_TOKEN overrides it.
  std::optional<std::string> token{};
  /// Largest value accepted; a peer announcing more is disconnected.
  std::size_t max_value_bytes = detail::tcp::kDefaultMaxValueBytes;
  /// How long a new connection may take to complete its hello, and how long a client may
  /// stop sending in the middle of a frame; past it the connection is closed (logged). A
  /// client idle between requests, or waiting in a get or wait, is never timed out.
  /// NCCLKIT_STORE_HANDSHAKE_TIMEOUT overrides it.
  std::chrono::milliseconds handshake_timeout =
      knob_default<std::chrono::milliseconds>("NCCLKIT_STORE_HANDSHAKE_TIMEOUT");
};

/// The store token to use: NCCLKIT_STORE_TOKEN where set, else the options' one, else none
/// (""). A token longer than a hello may carry (4096 bytes) is a ConfigError.
inline std::string resolve_store_token(const std::optional<std::string>& token) {
  const std::optional<std::string> from_environment = knob_text(knob("NCCLKIT_STORE_TOKEN"));
  const std::string resolved = from_environment ? *from_environment : token.value_or("");
  if (resolved.size() > detail::tcp::kMaxTokenBytes) {
    throw ConfigError(
        "the TcpStore token (" + std::string(from_environment ? "NCCLKIT_STORE_TOKEN" : "given in the options") +
        ") is " + std::to_string(resolved.size()) + " bytes, more than the limit of " +
        std::to_string(detail::tcp::kMaxTokenBytes) + "; use a shorter secret (32 random hex digits are plenty)");
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
  /// NCCLKIT_STORE_TIMEOUT overrides it.
  std::chrono::milliseconds timeout = knob_default<std::chrono::milliseconds>("NCCLKIT_STORE_TIMEOUT");
  /// Shared secret to present; nullopt or "": none. NCCLKIT_STORE_TOKEN overrides it.
  std::optional<std::string> token{};
  /// With is_server: how long the destructor keeps serving while other clients are still
  /// connected, so that ranks reading the last keys (a final barrier) are not cut off when
  /// the hosting rank finishes first; 0: none. NCCLKIT_STORE_LINGER overrides it.
  std::chrono::milliseconds linger = knob_default<std::chrono::milliseconds>("NCCLKIT_STORE_LINGER");
};

}  // namespace ncclkit
