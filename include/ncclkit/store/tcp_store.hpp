#pragma once
/// TcpStore: a key-value store served over TCP. A TcpStoreServer (inside rank 0, standalone,
/// or started by spawn()) holds the keys; every process talks to it through a TcpStore
/// client. The wire format is in ncclkit/store/detail/tcp_protocol.hpp.
///
/// Server: one thread running an epoll loop over non-blocking sockets, so one slow or hostile
/// peer never stalls the others. Blocking requests (get, wait) are parked per key and answered
/// when the key appears or their deadline passes; the loop itself never blocks. A peer that
/// sends a malformed frame, a wrong magic or version, or a length over the limits is
/// disconnected with a logged reason; nothing is allocated from a length a peer claims before
/// that length is checked against the limits. What one peer can make the server hold is
/// bounded before it is allocated: before its hello only a hello frame (kMaxHelloFrameBytes);
/// after it, one frame in and, unless the peer reads its replies, one reply out (a second
/// reply that would queue behind more than kMaxQueuedReplyBytes disconnects it). A connection
/// that does not finish its hello within the handshake timeout, or stops sending in the
/// middle of a frame for that long, is closed. Out of file descriptors, the server refuses
/// new connections (accepting and closing them with a spare descriptor) and keeps serving
/// those it has. Warnings a peer can provoke are rate-limited.
///
/// Client: one connection, guarded by a mutex (a TcpStore may be shared by threads; their
/// calls are serialised). Blocking calls send their timeout to the server, which answers
/// "timeout" with the keys still missing; the client also polls its socket against its own
/// deadline, and if the server does not answer in time it drops the connection (the next call
/// reconnects), so a late reply can never be taken for the answer to a later request. A lost
/// connection (server gone) is a StoreError naming the address, for this and every later call.
///
/// Security: with a shared token (TcpStoreServerOptions::token, default NCCLKIT_STORE_TOKEN),
/// a client must present it before anything else; a stray process without it can neither read
/// nor write keys. The token travels in clear text: it guards against accidents and stray
/// processes, not against someone who can watch the network.

#include <sys/epoll.h>    // epoll_create1, epoll_ctl, epoll_wait
#include <sys/eventfd.h>  // eventfd
#include <sys/resource.h> // getrlimit (the descriptor limit, for the message when it is reached)
#include <sys/socket.h>   // accept4, send, recv, getsockopt
#include <fcntl.h>        // open (the spare descriptor)
#include <unistd.h>       // close, read, write

#include <algorithm>      // std::remove, std::min, std::max
#include <atomic>         // std::atomic
#include <cerrno>         // errno
#include <chrono>         // std::chrono
#include <cstdint>        // std::uint64_t, std::int64_t
#include <functional>     // std::equal_to, std::hash
#include <memory>         // std::unique_ptr
#include <mutex>          // std::mutex, std::lock_guard
#include <optional>       // std::optional
#include <random>         // std::random_device, std::minstd_rand (connect backoff jitter)
#include <set>            // std::set (deadlines in order)
#include <span>           // std::span
#include <string>         // std::string
#include <string_view>    // std::string_view
#include <thread>         // std::thread, std::this_thread::sleep_for
#include <unordered_map>  // std::unordered_map
#include <utility>        // std::pair, std::move
#include <vector>         // std::vector

#include "ncclkit/core/deadline.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/rate_limiter.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/detail/socket.hpp"
#include "ncclkit/store/detail/tcp_protocol.hpp"
#include "ncclkit/store/store.hpp"

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
                      std::to_string(detail::tcp::kMaxTokenBytes) + "; use a shorter secret (32 random hex digits are plenty)");
  }
  return resolved;
}

namespace detail {

/// A printable, bounded form of a key for messages (keys are bytes and may be long).
inline std::string printable_key(std::string_view key) {
  std::string text = "'";
  const std::size_t shown = std::min<std::size_t>(key.size(), 120);
  for (std::size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') {
      text.push_back(static_cast<char>(c));
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      text += "\\x";
      text.push_back(kHex[c >> 4]);
      text.push_back(kHex[c & 0xF]);
    }
  }
  if (shown < key.size()) text += "...(" + std::to_string(key.size()) + " bytes)";
  return text + "'";
}

/// "'a', 'b', 'c'" for at most 32 keys, then how many in all.
template <class Keys>
std::string printable_key_list(const Keys& keys) {
  std::string text;
  std::size_t count = 0;
  for (const auto& key : keys) {
    if (count < 32) text += (count == 0 ? "" : ", ") + printable_key(std::string_view(key));
    ++count;
  }
  if (count > 32) text += ", ... (" + std::to_string(count) + " in all)";
  return text;
}

/// Hash that accepts string_view lookups in a map keyed by std::string.
struct KeyHash {
  using is_transparent = void;
  std::size_t operator()(std::string_view key) const noexcept { return std::hash<std::string_view>{}(key); }
};

template <class Value>
using KeyMap = std::unordered_map<std::string, Value, KeyHash, std::equal_to<>>;

/// Constant-time comparison, so the reply time does not tell how much of a guess was right.
inline bool same_secret(std::span<const std::uint8_t> given, std::string_view expected) {
  std::uint8_t difference = given.size() == expected.size() ? 0 : 1;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    const std::uint8_t g = i < given.size() ? given[i] : 0;
    difference |= static_cast<std::uint8_t>(g ^ static_cast<std::uint8_t>(expected[i]));
  }
  return difference == 0;
}

/// The server's event loop and state; TcpStoreServer owns one through a pointer so that the
/// server object can move while the loop thread keeps a stable `this`.
class TcpStoreServerLoop {
 public:
  TcpStoreServerLoop(Socket listener, TcpStoreServerOptions options)
      : listener_(std::move(listener)),
        token_(resolve_store_token(options.token)),
        port_(local_port(listener_.get())),
        host_(local_host(listener_.get())),
        handshake_timeout_(options.handshake_timeout) {
    if (options.max_value_bytes == 0 || options.max_value_bytes > (std::size_t{1} << 40)) {
      throw ConfigError("TcpStoreServerOptions::max_value_bytes=" + std::to_string(options.max_value_bytes) +
                        " must be in [1, 2^40]");
    }
    if (handshake_timeout_ <= std::chrono::milliseconds(0)) {
      throw ConfigError("TcpStoreServerOptions::handshake_timeout=" + format_seconds(handshake_timeout_) +
                        " must be positive");
    }
    limits_.max_value_bytes = options.max_value_bytes;
    hello_limits_.max_value_bytes = options.max_value_bytes;
    hello_limits_.hello_only = true;
    address_ = format_host_port(host_, port_);
    set_nonblocking(listener_.get());
    epoll_ = Socket(::epoll_create1(EPOLL_CLOEXEC));
    wake_ = Socket(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    // A spare descriptor to give back when accept fails for lack of descriptors (EMFILE), so
    // the pending connection can be accepted and closed instead of waking the loop forever.
    spare_ = Socket(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!epoll_ || !wake_) {
      throw StoreError("TcpStore server on " + address_ + ": cannot create its event loop: " + errno_text(errno));
    }
    watch(listener_.get(), kListenerId, EPOLLIN);
    watch(wake_.get(), kWakeId, EPOLLIN);
    thread_ = std::thread([this] { run(); });
  }

  ~TcpStoreServerLoop() {
    stop_.store(true);
    const std::uint64_t one = 1;
    [[maybe_unused]] ssize_t ignored = ::write(wake_.get(), &one, sizeof one);
    if (thread_.joinable()) thread_.join();
  }

  TcpStoreServerLoop(const TcpStoreServerLoop&) = delete;
  TcpStoreServerLoop& operator=(const TcpStoreServerLoop&) = delete;

  int port() const { return port_; }
  const std::string& host() const { return host_; }
  bool requires_token() const { return !token_.empty(); }

  /// Client connections open at the end of the loop's last iteration.
  std::size_t open_connections() const { return open_connections_.load(std::memory_order_acquire); }

 private:
  static constexpr std::uint64_t kListenerId = 0;
  static constexpr std::uint64_t kWakeId = 1;
  static constexpr std::size_t kReadChunk = 64 * 1024;
  /// Connections accepted (or refused) per wake-up, so a flood of them cannot keep the loop
  /// from serving the connections it has, or from seeing that it must stop.
  static constexpr int kAcceptBatch = 64;
  /// Reply bytes that may wait unsent behind a new reply. A TcpStore client reads each reply
  /// before it sends its next request, so it never has any waiting; one that pipelines
  /// requests without reading is disconnected before its replies pile up in memory.
  static constexpr std::size_t kMaxQueuedReplyBytes = std::size_t{1} << 20;
  /// How long the listener rests when accepting fails for lack of resources.
  static constexpr std::chrono::milliseconds kListenerRest{100};
  static constexpr SteadyClock::time_point kNoDeadline = SteadyClock::time_point::max();

  /// A get or wait parked until its keys exist or its deadline passes.
  struct PendingWait {
    bool active = false;
    bool is_get = false;
    std::vector<std::string> keys;  // get: the key; wait: every key asked for
    std::size_t missing = 0;        // registrations not yet satisfied
    SteadyClock::time_point deadline{};
  };

  struct Connection {
    std::uint64_t id = 0;
    Socket socket;
    std::string peer;
    ByteBuffer in;
    std::vector<std::uint8_t> out;
    std::size_t out_sent = 0;
    bool authenticated = false;
    bool closing = false;  // close once `out` is sent (after rejecting a token)
    bool dead = false;
    bool want_write = false;
    std::size_t expected = 0;  // size of the incomplete frame in `in`, once its header is in
    // Handshake (from accept) or mid-frame stall (from the last byte) deadline; see idle_deadlines_.
    SteadyClock::time_point idle_deadline = kNoDeadline;
    PendingWait pending;
  };

  void watch(int fd, std::uint64_t id, std::uint32_t events) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      throw StoreError("TcpStore server on " + address_ + ": epoll_ctl: " + errno_text(errno));
    }
  }

  void run() noexcept {
    try {
      loop();
    } catch (const std::exception& e) {
      // Only allocation failure can get here; the clients see their connections close.
      log_error("TcpStore server on " + address_ + " stopped: " + e.what());
    }
    connections_.clear();
  }

  void loop() {
    epoll_event events[256];
    while (!stop_.load(std::memory_order_relaxed)) {
      SteadyClock::time_point wake_at = kNoDeadline;
      if (!deadlines_.empty()) wake_at = deadlines_.begin()->first;
      if (!idle_deadlines_.empty()) wake_at = std::min(wake_at, idle_deadlines_.begin()->first);
      if (listener_paused_) wake_at = std::min(wake_at, listener_resume_at_);
      const int timeout = wake_at == kNoDeadline ? -1 : poll_timeout_ms(wake_at);
      const int count = ::epoll_wait(epoll_.get(), events, 256, timeout);
      if (count < 0 && errno != EINTR) {
        log_error("TcpStore server on " + address_ + ": epoll_wait failed: " + errno_text(errno));
        return;
      }
      for (int i = 0; i < count; ++i) {
        const std::uint64_t id = events[i].data.u64;
        if (id == kListenerId) {
          accept_all();
        } else if (id == kWakeId) {
          std::uint64_t value = 0;
          [[maybe_unused]] ssize_t ignored = ::read(wake_.get(), &value, sizeof value);
        } else {
          auto found = connections_.find(id);
          if (found == connections_.end() || found->second.dead) continue;
          Connection& connection = found->second;
          if (events[i].events & EPOLLOUT) flush(connection);
          if (!connection.dead && (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR | EPOLLRDHUP))) {
            read_from(connection);
          }
        }
      }
      expire_deadlines();
      expire_idle_connections();
      resume_listener();
      resume_parked();
      for (std::uint64_t id : dead_) connections_.erase(id);
      dead_.clear();
      open_connections_.store(connections_.size(), std::memory_order_release);
    }
  }

  void accept_all() {
    for (int attempt = 0; attempt < kAcceptBatch; ++attempt) {
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      const int fd = ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&address), &length,
                               SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        const int error = errno;
        if (error == EAGAIN || error == EWOULDBLOCK) return;
        if (error == EMFILE || error == ENFILE) return refuse_without_descriptors(error);
        // The pending connection failed (it was reset, or its network went away): the next.
        if (error == EINTR || error == ECONNABORTED || error == EPROTO || error == ENETDOWN || error == ENOPROTOOPT ||
            error == EHOSTDOWN || error == ENONET || error == EHOSTUNREACH || error == ENETUNREACH || error == EPERM) {
          continue;
        }
        // Out of kernel memory or another lasting failure: rest rather than spin on it.
        std::string note;
        if (resource_log_.admit(note)) {
          log_warn("TcpStore server on " + address_ + ": accepting a connection failed: " + errno_text(error) +
                   "; not accepting new connections for " + format_seconds(kListenerRest) + note);
        }
        return pause_listener();
      }
      set_nodelay(fd);
      const std::uint64_t id = next_id_++;
      Connection& connection = connections_[id];
      connection.id = id;
      connection.socket = Socket(fd);
      connection.peer = format_sockaddr(address);
      try {
        watch(fd, id, EPOLLIN | EPOLLRDHUP);
      } catch (const StoreError& e) {
        log_warn(e.what());
        connections_.erase(id);
        continue;
      }
      set_idle_deadline(connection, deadline_after(handshake_timeout_));
      if (log_enabled(LogLevel::kDebug)) log_debug("TcpStore server on " + address_ + ": connection from " + connection.peer);
    }
  }

  /// accept failed for lack of descriptors. Accepting takes one even to find the queue empty,
  /// so the pending connections are accepted with the spare descriptor and closed at once
  /// (their clients see the connection close and retry), a batch per wake-up, so the loop
  /// keeps serving the connections it has. When no spare is left (another thread took the
  /// descriptor it freed), the listener rests a moment rather than wake the loop for nothing.
  void refuse_without_descriptors(int error) {
    bool queue_empty = false;
    std::uint64_t refused = 0;
    for (int attempt = 0; attempt < kAcceptBatch && spare_; ++attempt) {
      spare_.reset();
      const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC);
      const int accept_error = errno;
      if (fd >= 0) {
        ::close(fd);
        ++refused;
      }
      spare_ = Socket(::open("/dev/null", O_RDONLY | O_CLOEXEC));
      if (fd < 0) {
        queue_empty = accept_error == EAGAIN || accept_error == EWOULDBLOCK;
        break;
      }
    }
    refused_connections_ += refused;
    if (!spare_ || (refused == 0 && !queue_empty)) pause_listener();
    std::string note;
    if (!descriptor_log_.admit(note)) return;
    std::string limit;
    if (error == ENFILE) {
      limit = "the system's limit on open files (fs.file-max) is reached";
    } else {
      rlimit descriptors{};
      limit = ::getrlimit(RLIMIT_NOFILE, &descriptors) == 0 && descriptors.rlim_cur != RLIM_INFINITY
                  ? "this process has reached its limit of " + std::to_string(descriptors.rlim_cur) +
                        " open files (RLIMIT_NOFILE)"
                  : "this process has reached its limit on open files (RLIMIT_NOFILE)";
    }
    log_warn("TcpStore server on " + address_ + ": out of file descriptors: " + limit + ", with " +
             std::to_string(connections_.size()) + " client connection(s) open. Refusing new connections until some " +
             "close (" + std::to_string(refused_connections_) + " refused since the last such message); the open ones are still served. " +
             "Raise the limit (ulimit -n) if the job needs more connections; connections that do not complete " +
             "their handshake are closed after " + format_seconds(handshake_timeout_) +
             " (NCCLKIT_STORE_HANDSHAKE_TIMEOUT)" + note);
    refused_connections_ = 0;
  }

  void pause_listener() {
    if (listener_paused_) return;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, listener_.get(), nullptr);
    listener_paused_ = true;
    listener_resume_at_ = SteadyClock::now() + kListenerRest;
  }

  void resume_listener() {
    if (!listener_paused_ || SteadyClock::now() < listener_resume_at_) return;
    if (!spare_) spare_ = Socket(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kListenerId;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &event) == 0) {
      listener_paused_ = false;
    } else {
      listener_resume_at_ = SteadyClock::now() + kListenerRest;
    }
  }

  /// A warning a peer can provoke: rate-limited, so that no peer can flood the log.
  void warn_about_peer(const std::string& message) {
    std::string note;
    if (peer_log_.admit(note)) log_warn(message + note);
  }

  // ---- handshake and mid-frame timeouts ---------------------------------------------------

  void set_idle_deadline(Connection& connection, SteadyClock::time_point deadline) {
    if (connection.idle_deadline == deadline) return;
    if (connection.idle_deadline != kNoDeadline) idle_deadlines_.erase({connection.idle_deadline, connection.id});
    connection.idle_deadline = deadline;
    if (deadline != kNoDeadline) idle_deadlines_.emplace(deadline, connection.id);
  }

  /// After bytes arrived: an authenticated client in the middle of a frame gets the handshake
  /// timeout from now to send more; between frames (or parked) it may stay idle for good. Until
  /// it is authenticated the deadline set at accept stands.
  void refresh_idle_deadline(Connection& connection) {
    if (connection.dead || !connection.authenticated) return;
    const bool mid_frame = connection.in.size() > 0 && !connection.pending.active;
    set_idle_deadline(connection, mid_frame ? deadline_after(handshake_timeout_) : kNoDeadline);
  }

  void expire_idle_connections() {
    const auto now = SteadyClock::now();
    while (!idle_deadlines_.empty() && idle_deadlines_.begin()->first <= now) {
      const std::uint64_t id = idle_deadlines_.begin()->second;
      idle_deadlines_.erase(idle_deadlines_.begin());
      auto found = connections_.find(id);
      if (found == connections_.end() || found->second.dead) continue;
      Connection& connection = found->second;
      connection.idle_deadline = kNoDeadline;
      close_connection(connection,
                       (connection.authenticated ? "it sent part of a frame, then nothing more for "
                                                 : "it did not complete the hello handshake within ") +
                           format_seconds(handshake_timeout_) + " (the handshake timeout, NCCLKIT_STORE_HANDSHAKE_TIMEOUT)",
                       true);
    }
  }

  void close_connection(Connection& connection, const std::string& reason, bool warn) {
    if (connection.dead) return;
    if (warn) {
      warn_about_peer("TcpStore server on " + address_ + ": closing the connection from " + connection.peer + ": " + reason);
    } else if (log_enabled(LogLevel::kDebug)) {
      log_debug("TcpStore server on " + address_ + ": connection from " + connection.peer + " ended: " + reason);
    }
    if (connection.pending.active) unpark(connection);
    set_idle_deadline(connection, kNoDeadline);
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, connection.socket.get(), nullptr);
    connection.socket.reset();
    connection.dead = true;
    dead_.push_back(connection.id);
  }

  void read_from(Connection& connection) {
    // Read what is there; a large frame arrives over several wake-ups, and the buffer grows
    // with the bytes received, never ahead of them to a size the peer merely announced. Before
    // the hello, reads are no larger than a hello can be.
    const std::size_t chunk = connection.authenticated ? kReadChunk : tcp::kMaxHelloFrameBytes;
    std::uint8_t* into = connection.in.prepare(connection.in.next_read_size(connection.expected, chunk));
    ssize_t got;
    do {
      got = ::recv(connection.socket.get(), into, connection.in.writable(), 0);
    } while (got < 0 && errno == EINTR);
    if (got == 0) return close_connection(connection, "peer closed the connection", false);
    if (got < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return close_connection(connection, "receive failed: " + errno_text(errno), false);
    }
    connection.in.commit(static_cast<std::size_t>(got));
    if (connection.closing) {
      connection.in.clear();  // rejected peer: its bytes mean nothing now
      return;
    }
    if (connection.pending.active) {
      // A well-behaved client never sends while its get/wait is parked; bound what a
      // misbehaving one can make us hold.
      if (connection.in.size() > limits_.max_payload_bytes() + tcp::kHeaderBytes) {
        close_connection(connection, "it sent more than one frame's worth of bytes while its request was parked", true);
      }
      return;
    }
    parse_all(connection);
  }

  void parse_all(Connection& connection) {
    while (!connection.dead && !connection.closing && !connection.pending.active) {
      auto result = tcp::parse_frame(connection.in.readable(), connection.authenticated ? limits_ : hello_limits_);
      if (result.status == tcp::ParseStatus::kNeedMore) {
        connection.expected = result.frame_bytes;  // validated against the limits; 0 if unknown yet
        break;
      }
      connection.expected = 0;
      if (result.status == tcp::ParseStatus::kError) {
        return close_connection(connection, result.error, true);
      }
      handle(connection, result.frame);
      connection.in.consume(result.frame_bytes);
    }
    if (!connection.dead && connection.in.size() == 0) connection.in.trim(4 * kReadChunk);
    refresh_idle_deadline(connection);
  }

  // ---- replies ----------------------------------------------------------------------------

  void flush(Connection& connection) {
    while (connection.out_sent < connection.out.size()) {
      const ssize_t sent = ::send(connection.socket.get(), connection.out.data() + connection.out_sent,
                                  connection.out.size() - connection.out_sent, MSG_NOSIGNAL);
      if (sent > 0) {
        connection.out_sent += static_cast<std::size_t>(sent);
        continue;
      }
      if (sent < 0 && errno == EINTR) continue;
      if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        if (!connection.want_write) set_events(connection, EPOLLIN | EPOLLRDHUP | EPOLLOUT, true);
        return;
      }
      return close_connection(connection, "send failed: " + errno_text(errno), false);
    }
    connection.out.clear();
    connection.out_sent = 0;
    if (connection.out.capacity() > 4 * kReadChunk) std::vector<std::uint8_t>().swap(connection.out);
    if (connection.want_write) set_events(connection, EPOLLIN | EPOLLRDHUP, false);
    if (connection.closing) close_connection(connection, "rejected", false);
  }

  void set_events(Connection& connection, std::uint32_t events, bool want_write) {
    epoll_event event{};
    event.events = events;
    event.data.u64 = connection.id;
    ::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, connection.socket.get(), &event);
    connection.want_write = want_write;
  }

  /// Whether a reply of `payload_bytes` may be queued: always when nothing waits unsent (a
  /// value reply is as large as the largest value), else while what waits stays within
  /// kMaxQueuedReplyBytes. Otherwise the peer is not reading its replies: it is disconnected
  /// before the reply is built, so no peer can make the server hold more than one large reply.
  bool room_for_reply(Connection& connection, std::size_t payload_bytes) {
    const std::size_t queued = connection.out.size() - connection.out_sent;
    const std::size_t frame = tcp::kHeaderBytes + payload_bytes;
    if (queued == 0 || (queued <= kMaxQueuedReplyBytes && frame <= kMaxQueuedReplyBytes - queued)) return true;
    close_connection(connection, "it does not read its replies: " + std::to_string(queued) +
                                     " bytes of them wait unsent and the next needs " + std::to_string(frame) +
                                     " more (at most " + std::to_string(kMaxQueuedReplyBytes) +
                                     " may wait behind a new one; a TcpStore client reads each reply before its next request)",
                     true);
    return false;
  }

  /// Appends a reply of `payload_bytes` written by `fill`, then sends what the socket takes.
  template <class Fill>
  void send_reply(Connection& connection, tcp::MessageType type, std::size_t payload_bytes, Fill&& fill) {
    if (connection.dead || !room_for_reply(connection, payload_bytes)) return;
    tcp::FrameWriter writer(connection.out);
    writer.begin(type);
    fill(writer);
    writer.finish();
    flush(connection);
  }
  void reply_ok(Connection& connection) {
    send_reply(connection, tcp::MessageType::kOk, 0, [](tcp::FrameWriter&) {});
  }
  void reply_integer(Connection& connection, std::int64_t value) {
    send_reply(connection, tcp::MessageType::kInteger, 8, [&](tcp::FrameWriter& w) { w.i64(value); });
  }
  void reply_value(Connection& connection, std::span<const std::uint8_t> value) {
    send_reply(connection, tcp::MessageType::kValue, 8 + value.size(), [&](tcp::FrameWriter& w) { w.bytes(value); });
  }
  void reply_error(Connection& connection, std::string_view message) {
    send_reply(connection, tcp::MessageType::kError, 8 + message.size(), [&](tcp::FrameWriter& w) { w.bytes(message); });
  }

  // ---- requests ---------------------------------------------------------------------------

  void handle(Connection& connection, const tcp::Frame& frame) {
    using tcp::MessageType;
    if (!connection.authenticated) {
      if (frame.type != MessageType::kHello) {
        return close_connection(connection, "its first frame was '" + tcp::message_type_name(static_cast<std::uint8_t>(frame.type)) +
                                                "', not the hello handshake", true);
      }
      if (!token_.empty() && !same_secret(frame.value, token_)) {
        warn_about_peer("TcpStore server on " + address_ + ": rejected a client from " + connection.peer +
                        (frame.value.empty() ? ": it presented no token" : ": it presented a wrong token") +
                        " (NCCLKIT_STORE_TOKEN differs between this job's processes, or a stray process tried to connect)");
        connection.closing = true;
        reply_error(connection, "token rejected");
        return;
      }
      connection.authenticated = true;
      set_idle_deadline(connection, kNoDeadline);
      return send_reply(connection, MessageType::kHelloOk, 8,
                        [&](tcp::FrameWriter& w) { w.u64(limits_.max_value_bytes); });
    }
    switch (frame.type) {
      case MessageType::kSet: {
        const std::string_view key = frame.keys[0];
        auto found = data_.find(key);
        if (found != data_.end()) {
          found->second.assign(frame.value.begin(), frame.value.end());
          return reply_ok(connection);
        }
        data_.emplace(std::string(key), Bytes(frame.value.begin(), frame.value.end()));
        reply_ok(connection);
        return key_created(key);
      }
      case MessageType::kGet: {
        auto found = data_.find(frame.keys[0]);
        if (found != data_.end()) return reply_value(connection, found->second);
        return park(connection, frame, true);
      }
      case MessageType::kWait: {
        for (std::string_view key : frame.keys) {
          if (data_.find(key) == data_.end()) return park(connection, frame, false);
        }
        return reply_ok(connection);
      }
      case MessageType::kCheck: {
        bool all = true;
        for (std::string_view key : frame.keys) all = all && data_.find(key) != data_.end();
        return reply_integer(connection, all ? 1 : 0);
      }
      case MessageType::kAdd: {
        const std::string_view key = frame.keys[0];
        auto found = data_.find(key);
        std::int64_t value = 0;
        if (found != data_.end()) {
          const std::string_view text(reinterpret_cast<const char*>(found->second.data()), found->second.size());
          auto parsed = parse_int(text);
          if (!parsed) {
            return reply_error(connection, "add on key " + printable_key(key) + ": its value " +
                                               printable_key(text) + " is not a decimal integer");
          }
          value = *parsed;
        }
        std::int64_t sum = 0;
        if (__builtin_add_overflow(value, frame.integer, &sum)) {
          return reply_error(connection, "add on key " + printable_key(key) + ": " + std::to_string(value) + " + " +
                                             std::to_string(frame.integer) + " overflows int64");
        }
        const std::string text = std::to_string(sum);
        if (found != data_.end()) {
          found->second.assign(text.begin(), text.end());
          return reply_integer(connection, sum);
        }
        data_.emplace(std::string(key), Bytes(text.begin(), text.end()));
        reply_integer(connection, sum);
        return key_created(key);
      }
      case MessageType::kCompareSet: {
        const std::string_view key = frame.keys[0];
        auto found = data_.find(key);
        if (found == data_.end()) {
          if (!frame.value.empty()) return reply_value(connection, frame.value);
          data_.emplace(std::string(key), Bytes(frame.second_value.begin(), frame.second_value.end()));
          reply_value(connection, frame.second_value);
          return key_created(key);
        }
        if (std::equal(found->second.begin(), found->second.end(), frame.value.begin(), frame.value.end())) {
          found->second.assign(frame.second_value.begin(), frame.second_value.end());
        }
        return reply_value(connection, found->second);
      }
      case MessageType::kDelete: {
        auto found = data_.find(frame.keys[0]);
        if (found == data_.end()) return reply_integer(connection, 0);
        data_.erase(found);
        return reply_integer(connection, 1);
      }
      case MessageType::kNumKeys:
        return reply_integer(connection, static_cast<std::int64_t>(data_.size()));
      case MessageType::kHello:
        return close_connection(connection, "it sent a second hello", true);
      default:
        return close_connection(connection, "it sent a '" + tcp::message_type_name(static_cast<std::uint8_t>(frame.type)) +
                                                "' frame, which only a server sends", true);
    }
  }

  // ---- parked gets and waits --------------------------------------------------------------

  void park(Connection& connection, const tcp::Frame& frame, bool is_get) {
    PendingWait& pending = connection.pending;
    pending.is_get = is_get;
    pending.keys.assign(frame.keys.begin(), frame.keys.end());
    pending.missing = 0;
    if (frame.timeout_ms == 0) {
      pending.active = true;  // so that time_out() reports the keys
      pending.deadline = SteadyClock::now();
      return time_out(connection);
    }
    for (const std::string& key : pending.keys) {
      if (data_.find(key) != data_.end()) continue;
      waiters_[key].push_back(connection.id);
      ++pending.missing;
    }
    pending.active = true;
    pending.deadline = deadline_after(std::chrono::milliseconds(
        static_cast<std::int64_t>(std::min<std::uint64_t>(frame.timeout_ms, std::uint64_t{1} << 52))));
    deadlines_.emplace(pending.deadline, connection.id);
  }

  /// Forgets a parked request: its waiter registrations and its deadline.
  void unpark(Connection& connection) {
    PendingWait& pending = connection.pending;
    for (const std::string& key : pending.keys) {
      auto found = waiters_.find(key);
      if (found == waiters_.end()) continue;
      auto& ids = found->second;
      ids.erase(std::remove(ids.begin(), ids.end(), connection.id), ids.end());
      if (ids.empty()) waiters_.erase(found);
    }
    deadlines_.erase({pending.deadline, connection.id});
    pending.active = false;
    pending.keys.clear();
  }

  /// A key that did not exist now does: answer the parked requests waiting for it.
  void key_created(std::string_view key) {
    auto found = waiters_.find(key);
    if (found == waiters_.end()) return;
    std::vector<std::uint64_t> ids = std::move(found->second);
    waiters_.erase(found);
    for (std::uint64_t id : ids) {
      auto it = connections_.find(id);
      if (it == connections_.end() || it->second.dead || !it->second.pending.active) continue;
      Connection& connection = it->second;
      if (--connection.pending.missing > 0) continue;
      complete(connection);
    }
  }

  void complete(Connection& connection) {
    PendingWait& pending = connection.pending;
    deadlines_.erase({pending.deadline, connection.id});
    pending.active = false;
    if (pending.is_get) {
      auto found = data_.find(pending.keys[0]);
      // The key may have been deleted since it appeared; report it as missing then.
      if (found == data_.end()) {
        send_timeout_reply(connection, pending.keys);
      } else {
        reply_value(connection, found->second);
      }
    } else {
      reply_ok(connection);
    }
    pending.keys.clear();
    // Frames the client sent while parked (it should not, but may) are handled next round.
    if (!connection.dead && connection.in.size() > 0) parked_with_input_.push_back(connection.id);
  }

  void send_timeout_reply(Connection& connection, const std::vector<std::string>& keys) {
    std::vector<std::string_view> missing;
    std::size_t payload_bytes = 4;
    for (const std::string& key : keys) {
      if (data_.find(key) != data_.end()) continue;
      missing.emplace_back(key);
      payload_bytes += 4 + key.size();
    }
    send_reply(connection, tcp::MessageType::kTimeout, payload_bytes, [&](tcp::FrameWriter& w) { w.keys(missing); });
  }

  void time_out(Connection& connection) {
    std::vector<std::string> keys = std::move(connection.pending.keys);
    unpark(connection);
    send_timeout_reply(connection, keys);
    if (!connection.dead && connection.in.size() > 0) parked_with_input_.push_back(connection.id);
  }

  void expire_deadlines() {
    const auto now = SteadyClock::now();
    while (!deadlines_.empty() && deadlines_.begin()->first <= now) {
      const std::uint64_t id = deadlines_.begin()->second;
      deadlines_.erase(deadlines_.begin());
      auto found = connections_.find(id);
      if (found == connections_.end() || found->second.dead || !found->second.pending.active) continue;
      time_out(found->second);
    }
  }

  void resume_parked() {
    std::vector<std::uint64_t> ids = std::move(parked_with_input_);
    parked_with_input_.clear();
    for (std::uint64_t id : ids) {
      auto found = connections_.find(id);
      if (found != connections_.end() && !found->second.dead) parse_all(found->second);
    }
  }

  Socket listener_;
  Socket epoll_;
  Socket wake_;
  Socket spare_;
  std::string token_;
  int port_;
  std::string host_;
  std::string address_;
  std::chrono::milliseconds handshake_timeout_;
  tcp::ParseLimits limits_;
  tcp::ParseLimits hello_limits_;  // before the hello: only a hello, of bounded size
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> open_connections_{0};

  std::unordered_map<std::uint64_t, Connection> connections_;
  std::uint64_t next_id_ = 2;
  std::vector<std::uint64_t> dead_;
  std::vector<std::uint64_t> parked_with_input_;
  KeyMap<Bytes> data_;
  KeyMap<std::vector<std::uint64_t>> waiters_;
  std::set<std::pair<SteadyClock::time_point, std::uint64_t>> deadlines_;
  // Handshake and mid-frame deadlines, per connection (Connection::idle_deadline).
  std::set<std::pair<SteadyClock::time_point, std::uint64_t>> idle_deadlines_;

  bool listener_paused_ = false;  // taken out of epoll after accept failed for lack of resources
  SteadyClock::time_point listener_resume_at_{};
  std::uint64_t refused_connections_ = 0;  // refused for lack of descriptors since the last log line
  RateLimiter peer_log_{10, std::chrono::seconds(10)};      // warnings about what peers did
  RateLimiter descriptor_log_{1, std::chrono::seconds(10)}; // out of file descriptors
  RateLimiter resource_log_{1, std::chrono::seconds(10)};   // other accept failures

  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace detail

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
    const auto deadline = detail::deadline_after(limit);  // saturates: max() must not wrap
    auto pause = std::chrono::microseconds(200);
    while (loop_->open_connections() > 0) {
      if (std::chrono::steady_clock::now() >= deadline) return false;
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(20));
    }
    return true;
  }

 private:
  explicit TcpStoreServer(std::unique_ptr<detail::TcpStoreServerLoop> loop) : loop_(std::move(loop)) {}
  std::unique_ptr<detail::TcpStoreServerLoop> loop_;
};

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

/// A Store client talking to a TcpStoreServer; with is_server it also hosts the server.
/// Thread-safe: calls from several threads are serialised on its one connection.
class TcpStore final : public Store {
 public:
  /// Connects (and with is_server, first starts the server), retrying a refused connection
  /// with backoff until `options.timeout`; then TimeoutError naming host:port. A rejected
  /// token is a StoreError at once.
  explicit TcpStore(TcpStoreOptions options)
      : host_(options.host), port_(options.port), token_(resolve_store_token(options.token)), linger_(options.linger) {
    if (options.is_server) {
      server_.emplace(TcpStoreServerOptions{.host = options.host, .port = options.port, .token = token_});
      port_ = server_->port();
      // A server bound to every address is reached over loopback.
      if (host_.empty() || host_ == "0.0.0.0") host_ = "127.0.0.1";
      if (host_ == "::") host_ = "::1";
    }
    if (port_ <= 0 || port_ > 65535) {
      throw ConfigError("TcpStore: port " + std::to_string(port_) + " is not a valid port to connect to (1..65535); "
                        "give the server's port (MASTER_PORT)");
    }
    address_ = "tcp://" + detail::format_host_port(host_, port_);
    set_default_timeout(options.timeout);
    std::lock_guard<std::mutex> lock(mutex_);
    connect(detail::deadline_after(options.timeout), options.timeout);
  }

  /// With is_server: closes this client's connection, then keeps serving until the other
  /// clients have disconnected or `linger` has passed (logged), then stops the server.
  ~TcpStore() override {
    if (!server_) return;
    socket_.reset();
    if (!server_->wait_for_clients_to_leave(linger_)) {
      log_warn("TcpStore server on " + address_ + ": stopping with " + std::to_string(server_->open_connections()) +
               " client(s) still connected after waiting " + format_seconds(linger_) +
               " for them (NCCLKIT_STORE_LINGER); they will see the store as lost");
    }
  }

  // The base's convenience overloads (strings, initializer lists, default timeouts).
  using Store::check;
  using Store::compare_set;
  using Store::get;
  using Store::set;
  using Store::wait;

  /// The server's port (the one picked when is_server asked for port 0).
  int port() const { return port_; }

  std::string describe() const override { return address_; }

  void set(std::string_view key, std::span<const std::uint8_t> value) override {
    check_key(key, "set");
    std::lock_guard<std::mutex> lock(mutex_);
    check_value(key, value.size(), "set");
    request("set of key " + detail::printable_key(key), [&](detail::tcp::FrameWriter& w) {
      w.begin(detail::tcp::MessageType::kSet).key(key).bytes(value);
    });
    expect_reply(detail::tcp::MessageType::kOk, "set of key " + detail::printable_key(key), [](const auto&) {});
  }

  Bytes get(std::string_view key, Duration timeout) override {
    check_key(key, "get");
    std::lock_guard<std::mutex> lock(mutex_);
    const std::vector<std::string> keys{std::string(key)};
    Bytes value;
    blocking_request("get of key " + detail::printable_key(key), keys, timeout, [&](detail::tcp::FrameWriter& w) {
      w.begin(detail::tcp::MessageType::kGet).u64(timeout_ms(timeout)).key(key);
    }, detail::tcp::MessageType::kValue, [&](const detail::tcp::Frame& frame) {
      value.assign(frame.value.begin(), frame.value.end());
    });
    return value;
  }

  void wait(std::span<const std::string> keys, Duration timeout) override {
    if (keys.empty()) return;
    for (const auto& key : keys) check_key(key, "wait");
    std::lock_guard<std::mutex> lock(mutex_);
    blocking_request("wait for " + std::to_string(keys.size()) + " key(s)", keys, timeout, [&](detail::tcp::FrameWriter& w) {
      w.begin(detail::tcp::MessageType::kWait).u64(timeout_ms(timeout)).keys(keys);
    }, detail::tcp::MessageType::kOk, [](const detail::tcp::Frame&) {});
  }

  bool check(std::span<const std::string> keys) override {
    for (const auto& key : keys) check_key(key, "check");
    std::lock_guard<std::mutex> lock(mutex_);
    request("check of " + std::to_string(keys.size()) + " key(s)", [&](detail::tcp::FrameWriter& w) {
      w.begin(detail::tcp::MessageType::kCheck).keys(keys);
    });
    bool all = false;
    expect_reply(detail::tcp::MessageType::kInteger, "check", [&](const detail::tcp::Frame& f) { all = f.integer != 0; });
    return all;
  }

  std::int64_t add(std::string_view key, std::int64_t delta) override {
    check_key(key, "add");
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string what = "add on key " + detail::printable_key(key);
    request(what, [&](detail::tcp::FrameWriter& w) { w.begin(detail::tcp::MessageType::kAdd).key(key).i64(delta); });
    std::int64_t value = 0;
    expect_reply(detail::tcp::MessageType::kInteger, what, [&](const detail::tcp::Frame& f) { value = f.integer; });
    return value;
  }

  Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override {
    check_key(key, "compare_set");
    std::lock_guard<std::mutex> lock(mutex_);
    check_value(key, std::max(expected.size(), desired.size()), "compare_set");
    const std::string what = "compare_set of key " + detail::printable_key(key);
    request(what, [&](detail::tcp::FrameWriter& w) {
      w.begin(detail::tcp::MessageType::kCompareSet).key(key).bytes(expected).bytes(desired);
    });
    Bytes value;
    expect_reply(detail::tcp::MessageType::kValue, what,
                 [&](const detail::tcp::Frame& f) { value.assign(f.value.begin(), f.value.end()); });
    return value;
  }

  bool delete_key(std::string_view key) override {
    check_key(key, "delete_key");
    std::lock_guard<std::mutex> lock(mutex_);
    const std::string what = "delete_key of key " + detail::printable_key(key);
    request(what, [&](detail::tcp::FrameWriter& w) { w.begin(detail::tcp::MessageType::kDelete).key(key); });
    bool existed = false;
    expect_reply(detail::tcp::MessageType::kInteger, what, [&](const detail::tcp::Frame& f) { existed = f.integer != 0; });
    return existed;
  }

  std::int64_t num_keys() override {
    std::lock_guard<std::mutex> lock(mutex_);
    request("num_keys", [&](detail::tcp::FrameWriter& w) { w.begin(detail::tcp::MessageType::kNumKeys); });
    std::int64_t count = 0;
    expect_reply(detail::tcp::MessageType::kInteger, "num_keys", [&](const detail::tcp::Frame& f) { count = f.integer; });
    return count;
  }

 private:
  using Clock = detail::SteadyClock;

  static std::uint64_t timeout_ms(Duration timeout) {
    return timeout.count() <= 0 ? 0 : static_cast<std::uint64_t>(timeout.count());
  }

  /// How long past a blocking call's timeout the client waits for the server's own "timeout"
  /// reply before giving up on it: half the allowed lateness, max(10%, 250 ms).
  static Duration reply_grace(Duration timeout) {
    return std::max<Duration>(timeout / 10, std::chrono::milliseconds(250)) / 2;
  }

  void check_key(std::string_view key, const char* op) const {
    if (key.size() > detail::tcp::kMaxKeyBytes) {
      throw StoreError(std::string(op) + " on " + address_ + ": key " + detail::printable_key(key) + " is " +
                       std::to_string(key.size()) + " bytes, more than the limit of " +
                       std::to_string(detail::tcp::kMaxKeyBytes) + "; use shorter keys");
    }
  }
  void check_value(std::string_view key, std::size_t bytes, const char* op) {
    ensure_connected();
    if (bytes > limits_.max_value_bytes) {
      throw StoreError(std::string(op) + " of key " + detail::printable_key(key) + " on " + address_ + ": value of " +
                       std::to_string(bytes) + " bytes exceeds the server's limit of " +
                       std::to_string(limits_.max_value_bytes) + " bytes (TcpStoreServerOptions::max_value_bytes)");
    }
  }

  // ---- connection -------------------------------------------------------------------------

  /// Connects with retries until `deadline`, then says hello. Caller holds mutex_.
  void connect(Clock::time_point deadline, Duration timeout) {
    const auto start = Clock::now();
    auto backoff = std::chrono::milliseconds(5);
    std::minstd_rand jitter(std::random_device{}());
    std::string last_error = "none";
    int attempts = 0;
    for (;;) {
      ++attempts;
      try {
        for (const auto& address : detail::resolve_addresses(host_, port_, false)) {
          int error = 0;
          detail::Socket socket = detail::connect_once(address, deadline, error);
          if (!socket) {
            last_error = detail::errno_text(error);
            continue;
          }
          if (handshake(socket, deadline, last_error)) {
            socket_ = std::move(socket);
            return;
          }
        }
      } catch (const ConfigError& e) {
        last_error = e.what();  // a name that does not resolve yet may resolve later
      }
      const auto now = Clock::now();
      if (now >= deadline) {
        throw TimeoutError("TcpStore could not connect to " + detail::format_host_port(host_, port_) + " (" + address_ +
                           ") within " + format_seconds(timeout) + " (waited " + format_seconds(now - start) + ", " + std::to_string(attempts) + " attempts; last error: " + last_error +
                           "). Is the store server (rank 0) running and reachable from this host? Check "
                           "MASTER_ADDR/MASTER_PORT or the init URL");
      }
      auto pause = backoff + std::chrono::milliseconds(jitter() % (backoff.count() / 2 + 1));
      std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
      backoff = std::min<std::chrono::milliseconds>(backoff * 2, std::chrono::milliseconds(250));
    }
  }

  /// Sends hello with the token and reads the answer. True when accepted; false (with
  /// `error` set) on a transient failure worth retrying; throws when the token is rejected.
  bool handshake(detail::Socket& socket, Clock::time_point deadline, std::string& error) {
    out_.clear();
    detail::tcp::FrameWriter writer(out_);
    writer.begin(detail::tcp::MessageType::kHello).bytes(token_);
    writer.finish();
    int err = 0;
    if (detail::send_all(socket.get(), out_.data(), out_.size(), deadline, err) != detail::IoStatus::kDone) {
      error = "sending the handshake failed: " + (err ? detail::errno_text(err) : std::string("timed out"));
      return false;
    }
    in_.clear();
    detail::tcp::ParseLimits limits;  // the hello reply is small
    for (;;) {
      auto result = detail::tcp::parse_frame(in_.readable(), limits);
      if (result.status == detail::tcp::ParseStatus::kError) {
        throw StoreError("TcpStore handshake with " + address_ + " failed: " + result.error);
      }
      if (result.status == detail::tcp::ParseStatus::kParsed) {
        const auto& frame = result.frame;
        if (frame.type == detail::tcp::MessageType::kError) {
          const std::string said(frame.value.begin(), frame.value.end());
          throw StoreError("token rejected by " + address_ + ": set NCCLKIT_STORE_TOKEN to the job's token (server said: " +
                           said + ")");
        }
        if (frame.type != detail::tcp::MessageType::kHelloOk || frame.integer <= 0) {
          throw StoreError("TcpStore handshake with " + address_ + " failed: unexpected '" +
                           detail::tcp::message_type_name(static_cast<std::uint8_t>(frame.type)) + "' reply");
        }
        limits_.max_value_bytes = static_cast<std::size_t>(frame.integer);
        in_.consume(result.frame_bytes);
        return true;
      }
      std::size_t got = 0;
      std::uint8_t* into = in_.prepare(256);  // before writable(): it changes what that returns
      auto status = detail::receive_some(socket.get(), into, in_.writable(), deadline, got, err);
      if (status != detail::IoStatus::kDone) {
        error = status == detail::IoStatus::kTimedOut ? "no handshake reply in time"
                : status == detail::IoStatus::kClosed ? "the server closed the connection during the handshake"
                                                      : "receive failed: " + detail::errno_text(err);
        return false;
      }
      in_.commit(got);
    }
  }

  /// Reconnects after a deliberate drop (a blocking call that ran out of time); a lost
  /// connection stays lost. Caller holds mutex_.
  void ensure_connected() {
    if (!lost_.empty()) {
      throw StoreError("TcpStore " + address_ + " is unusable: the connection to the server was lost earlier (" +
                       lost_ + "); the server (rank 0) has probably exited");
    }
    if (!socket_) connect(detail::deadline_after(default_timeout()), default_timeout());
  }

  [[noreturn]] void fail_lost(const std::string& what, const std::string& why) {
    lost_ = why;
    socket_.reset();
    throw StoreError("TcpStore " + what + " on " + address_ + " failed: " + why +
                     "; the server (rank 0) has probably exited or the network failed");
  }

  /// Builds a request with `build` and sends it within the default timeout. Caller holds mutex_.
  template <class Build>
  void request(const std::string& what, Build&& build) {
    ensure_connected();
    out_.clear();
    detail::tcp::FrameWriter writer(out_);
    build(writer);
    writer.finish();
    int err = 0;
    switch (detail::send_all(socket_.get(), out_.data(), out_.size(), detail::deadline_after(default_timeout()), err)) {
      case detail::IoStatus::kDone:
        break;
      case detail::IoStatus::kTimedOut:
        socket_.reset();
        throw TimeoutError("TcpStore " + what + " on " + address_ + ": could not send the request within " +
                           format_seconds(default_timeout()) + "; the server is not reading");
      case detail::IoStatus::kClosed:
        fail_lost(what, "the server closed the connection");
      case detail::IoStatus::kError:
        fail_lost(what, "send failed: " + detail::errno_text(err));
    }
    if (out_.capacity() > (std::size_t{1} << 20)) Bytes().swap(out_);
  }

  /// Outcome of reading one reply.
  enum class ReplyStatus { kReceived, kTimedOut };

  /// Reads one reply frame by `deadline` and hands it to `on_frame` (its views are valid only
  /// during that call). Caller holds mutex_.
  template <class OnFrame>
  ReplyStatus read_reply(const std::string& what, Clock::time_point deadline, OnFrame&& on_frame) {
    for (;;) {
      auto result = detail::tcp::parse_frame(in_.readable(), limits_);
      if (result.status == detail::tcp::ParseStatus::kParsed) {
        on_frame(result.frame);
        in_.consume(result.frame_bytes);
        if (in_.size() == 0) in_.trim(std::size_t{1} << 20);
        return ReplyStatus::kReceived;
      }
      if (result.status == detail::tcp::ParseStatus::kError) {
        fail_lost(what, "protocol error in the server's reply: " + result.error);
      }
      std::size_t got = 0;
      int err = 0;
      // Before writable(): prepare changes what that returns.
      std::uint8_t* into = in_.prepare(in_.next_read_size(result.frame_bytes, 64 * 1024));
      switch (detail::receive_some(socket_.get(), into, in_.writable(), deadline, got, err)) {
        case detail::IoStatus::kDone:
          in_.commit(got);
          break;
        case detail::IoStatus::kTimedOut:
          // Drop the connection: a reply arriving later must not be read as the answer to the
          // next request. The next call reconnects.
          socket_.reset();
          in_.clear();
          return ReplyStatus::kTimedOut;
        case detail::IoStatus::kClosed:
          fail_lost(what, "the server closed the connection");
        case detail::IoStatus::kError:
          fail_lost(what, "receive failed: " + detail::errno_text(err));
      }
    }
  }

  /// Reads the reply to a non-blocking request; `expected` is the only good reply type (kError
  /// becomes a StoreError with the server's text).
  template <class OnFrame>
  void expect_reply(detail::tcp::MessageType expected, const std::string& what, OnFrame&& on_frame) {
    const auto start = Clock::now();
    std::string server_error;
    const auto status = read_reply(what, detail::deadline_after(default_timeout()), [&](const detail::tcp::Frame& frame) {
      if (frame.type == expected) {
        on_frame(frame);
      } else if (frame.type == detail::tcp::MessageType::kError) {
        server_error.assign(frame.value.begin(), frame.value.end());
      } else {
        server_error = "unexpected '" + detail::tcp::message_type_name(static_cast<std::uint8_t>(frame.type)) + "' reply";
      }
    });
    if (status == ReplyStatus::kTimedOut) {
      throw TimeoutError("TcpStore " + what + " on " + address_ + ": no reply from the server within " +
                         format_seconds(Clock::now() - start) + " (the store timeout); the server may be overloaded or hung");
    }
    if (!server_error.empty()) throw StoreError("TcpStore " + what + " on " + address_ + " failed: " + server_error);
  }

  /// A get or wait: the server parks it until the keys exist or `timeout` passes.
  template <class Keys, class Build, class OnFrame>
  void blocking_request(const std::string& what, const Keys& keys, Duration timeout, Build&& build,
                        detail::tcp::MessageType expected, OnFrame&& on_frame) {
    const auto start = Clock::now();
    request(what, build);
    std::vector<std::string> missing;
    bool timed_out = false;
    std::string server_error;
    // Bounded first: timeout + grace must not overflow for a huge timeout (milliseconds::max()).
    const auto bounded = detail::bounded_timeout(timeout);
    const auto hard_deadline = detail::deadline_after(bounded + reply_grace(bounded));
    const auto status = read_reply(what, hard_deadline, [&](const detail::tcp::Frame& frame) {
      if (frame.type == expected) {
        on_frame(frame);
      } else if (frame.type == detail::tcp::MessageType::kTimeout) {
        timed_out = true;
        missing.assign(frame.keys.begin(), frame.keys.end());
      } else if (frame.type == detail::tcp::MessageType::kError) {
        server_error.assign(frame.value.begin(), frame.value.end());
      } else {
        server_error = "unexpected '" + detail::tcp::message_type_name(static_cast<std::uint8_t>(frame.type)) + "' reply";
      }
    });
    if (!server_error.empty()) throw StoreError("TcpStore " + what + " on " + address_ + " failed: " + server_error);
    if (status == ReplyStatus::kTimedOut || timed_out) {
      std::string text = "TcpStore " + what + " on " + address_ + " timed out after " +
                         format_seconds(Clock::now() - start) + " (timeout " + format_seconds(timeout) + "); key(s) still missing: ";
      if (status == ReplyStatus::kTimedOut) {
        text += detail::printable_key_list(keys) + " (the server did not answer in time)";
      } else {
        text += missing.empty() ? std::string("none (they appeared just as the timeout fired)")
                                : detail::printable_key_list(missing);
      }
      throw TimeoutError(text);
    }
  }

  // Declared first, destroyed last: clients of the server (this one included) close first.
  std::optional<TcpStoreServer> server_;
  std::string host_;
  int port_;
  std::string token_;
  std::chrono::milliseconds linger_;
  std::string address_;
  std::mutex mutex_;
  detail::Socket socket_;
  detail::ByteBuffer in_;
  Bytes out_;
  detail::tcp::ParseLimits limits_;
  std::string lost_;  // why the connection was lost; empty while usable
};

}  // namespace ncclkit
