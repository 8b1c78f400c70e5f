#pragma once
/// TcpStoreServer: the server that holds a TcpStore's keys, inside rank 0 (TcpStore with
/// is_server), standalone, or started by spawn(). It serves on its own thread
/// (detail/tcp_store_server_loop.hpp) until destroyed; store/tcp_store.hpp describes what it
/// guarantees against slow, stalled or hostile peers.

#include <sys/socket.h>  // getsockopt (SO_ACCEPTCONN)

#include <chrono>   // std::chrono
#include <cstddef>  // std::size_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <utility>  // std::move

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/store/detail/socket.hpp"
#include "ncclkit/store/detail/tcp_store_server_loop.hpp"
#include "ncclkit/store/tcp_store_options.hpp"

namespace ncclkit {

/// A TcpStore server: binds, then serves on its own thread until destroyed. Move-only RAII;
/// the destructor stops the loop and closes every connection, and never hangs.
///
/// Fork safety: the constructor starts a thread, so create the server after forking workers
/// (spawn() binds the socket before forking and adopts it afterwards: from_listening_socket).
class TcpStoreServer {
 public:
  /// Binds `options.host`:`options.port` and starts serving. ConfigError when the port is in
  /// use or the host cannot be resolved.
  explicit TcpStoreServer(TcpStoreServerOptions options = {})
      : loop_(std::make_unique<detail::TcpStoreServerLoop>(detail::listen_tcp(options.host, options.port), options)) {}

  /// Serves on `fd`, an already bound and listening socket, taking ownership of it (it is
  /// closed even when this throws). `options.host` and `options.port` are ignored.
  static TcpStoreServer from_listening_socket(int fd, TcpStoreServerOptions options = {}) {
    detail::Socket socket(fd);
    int listening = 0;
    socklen_t length = sizeof listening;
    if (fd < 0 || ::getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &length) != 0 || listening == 0) {
      throw ConfigError("TcpStoreServer::from_listening_socket: descriptor " + std::to_string(fd) +
                        " is not a listening socket; bind and listen() it first");
    }
    return TcpStoreServer(std::make_unique<detail::TcpStoreServerLoop>(std::move(socket), std::move(options)));
  }

  TcpStoreServer(TcpStoreServer&&) noexcept = default;
  TcpStoreServer& operator=(TcpStoreServer&&) noexcept = default;
  ~TcpStoreServer() = default;

  /// The port it listens on (the real one when 0 was asked for).
  int port() const { return loop_->port(); }
  /// The address it is bound to, numeric ("127.0.0.1", "::").
  std::string host() const { return loop_->host(); }

  /// Client connections currently open (updated by the server thread after each event).
  std::size_t open_connections() const { return loop_->open_connections(); }

  /// Whether clients must present a token (TcpStoreServerOptions::token, NCCLKIT_STORE_TOKEN).
  bool requires_token() const { return loop_->requires_token(); }

  /// Waits until no client is connected or `limit` has passed; returns whether none is left.
  /// Lets the process that hosts the store outlive the other ranks' last requests.
  bool wait_for_clients_to_leave(std::chrono::milliseconds limit) const {
    // deadline_after saturates: a limit of milliseconds::max() must not wrap.
    return detail::poll_until(
        detail::deadline_after(limit),
        detail::BackoffPolicy{.first = std::chrono::microseconds(200), .cap = std::chrono::milliseconds(20)},
        [&] { return loop_->open_connections() == 0; });
  }

 private:
  explicit TcpStoreServer(std::unique_ptr<detail::TcpStoreServerLoop> loop) : loop_(std::move(loop)) {}
  std::unique_ptr<detail::TcpStoreServerLoop> loop_;
};
}  // namespace ncclkit
