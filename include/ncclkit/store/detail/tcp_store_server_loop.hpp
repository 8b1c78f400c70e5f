#pragma once
/// The TcpStoreServer's event loop: one thread running epoll over non-blocking sockets, so one
/// slow or hostile peer never stalls the others. It accepts connections (refusing new ones,
/// not failing, when out of descriptors), checks each peer's hello and token, parses frames
/// within limits, answers requests, parks get and wait until their keys appear or their
/// deadline passes, and closes connections that stall in a handshake or mid-frame. See
/// store/tcp_store.hpp for the guarantees this gives.

#include <sys/epoll.h>     // epoll_create1, epoll_ctl, epoll_wait
#include <sys/eventfd.h>   // eventfd
#include <sys/resource.h>  // getrlimit (the descriptor limit, for the message when it is reached)
#include <sys/socket.h>    // accept4, send, recv
#include <fcntl.h>         // open (the spare descriptor)
#include <unistd.h>        // close, read, write

#include <algorithm>      // std::remove, std::min, std::max
#include <atomic>         // std::atomic
#include <cerrno>         // errno
#include <chrono>         // std::chrono
#include <cstdint>        // std::uint64_t, std::int64_t
#include <functional>     // std::equal_to, std::hash
#include <set>            // std::set (deadlines in order)
#include <span>           // std::span
#include <string>         // std::string
#include <string_view>    // std::string_view
#include <thread>         // std::thread
#include <unordered_map>  // std::unordered_map
#include <utility>        // std::pair, std::move
#include <vector>         // std::vector

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/detail/rate_limiter.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/detail/printable_key.hpp"
#include "ncclkit/store/detail/socket.hpp"
#include "ncclkit/store/detail/tcp_protocol.hpp"
#include "ncclkit/store/store.hpp"
#include "ncclkit/store/tcp_store_options.hpp"

namespace ncclkit::detail {

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
        handshake_timeout_(environment_overrides(knob("NCCLKIT_STORE_HANDSHAKE_TIMEOUT"), options.handshake_timeout)) {
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
      const int fd =
          ::accept4(listener_.get(), reinterpret_cast<sockaddr*>(&address), &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
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
      if (log_enabled(LogLevel::kDebug))
        log_debug("TcpStore server on " + address_ + ": connection from " + connection.peer);
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
             "close (" + std::to_string(refused_connections_) +
             " refused since the last such message); the open ones are still served. " +
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
                           format_seconds(handshake_timeout_) +
                           " (the handshake timeout, NCCLKIT_STORE_HANDSHAKE_TIMEOUT)",
                       true);
    }
  }

  void close_connection(Connection& connection, const std::string& reason, bool warn) {
    if (connection.dead) return;
    if (warn) {
      warn_about_peer("TcpStore server on " + address_ + ": closing the connection from " + connection.peer + ": " +
                      reason);
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
    close_connection(connection,
                     "it does not read its replies: " + std::to_string(queued) +
                         " bytes of them wait unsent and the next needs " + std::to_string(frame) + " more (at most " +
                         std::to_string(kMaxQueuedReplyBytes) +
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
    send_reply(connection, tcp::MessageType::kError, 8 + message.size(),
               [&](tcp::FrameWriter& w) { w.bytes(message); });
  }

  // ---- requests ---------------------------------------------------------------------------

  void handle(Connection& connection, const tcp::Frame& frame) {
    using tcp::MessageType;
    if (!connection.authenticated) {
      if (frame.type != MessageType::kHello) {
        return close_connection(connection,
                                "its first frame was '" +
                                    tcp::message_type_name(static_cast<std::uint8_t>(frame.type)) +
                                    "', not the hello handshake",
                                true);
      }
      if (!token_.empty() && !same_secret(frame.value, token_)) {
        warn_about_peer(
            "TcpStore server on " + address_ + ": rejected a client from " + connection.peer +
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
            return reply_error(connection, "add on key " + printable_key(key) + ": its value " + printable_key(text) +
                                               " is not a decimal integer");
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
        return close_connection(connection,
                                "it sent a '" + tcp::message_type_name(static_cast<std::uint8_t>(frame.type)) +
                                    "' frame, which only a server sends",
                                true);
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
  std::uint64_t refused_connections_ = 0;                    // refused for lack of descriptors since the last log line
  RateLimiter peer_log_{10, std::chrono::seconds(10)};       // warnings about what peers did
  RateLimiter descriptor_log_{1, std::chrono::seconds(10)};  // out of file descriptors
  RateLimiter resource_log_{1, std::chrono::seconds(10)};    // other accept failures

  std::thread thread_;  // last: starts after everything above exists
};

}  // namespace ncclkit::detail
