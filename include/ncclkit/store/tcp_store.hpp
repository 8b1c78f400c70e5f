#pragma once
/// TcpStore: a key-value store served over TCP. A TcpStoreServer (inside rank 0, standalone,
/// or started by spawn()) holds the keys; every process talks to it through a TcpStore
/// client. This header is the client and includes the rest: the server
/// (store/tcp_store_server.hpp, its event loop in detail/tcp_store_server_loop.hpp), the
/// options of both (store/tcp_store_options.hpp) and the wire format (detail/tcp_protocol.hpp).
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
/// Security: with a shared token (TcpStoreServerOptions::token, or NCCLKIT_STORE_TOKEN),
/// a client must present it before anything else; a stray process without it can neither read
/// nor write keys. The token travels in clear text: it guards against accidents and stray
/// processes, not against someone who can watch the network.

#include <algorithm>    // std::max
#include <chrono>       // std::chrono
#include <cstdint>      // std::uint64_t, std::int64_t
#include <mutex>        // std::mutex, std::lock_guard
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::move
#include <vector>       // std::vector

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/knobs.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/detail/printable_key.hpp"
#include "ncclkit/store/detail/socket.hpp"
#include "ncclkit/store/detail/tcp_protocol.hpp"
#include "ncclkit/store/store.hpp"
#include "ncclkit/store/tcp_store_options.hpp"
#include "ncclkit/store/tcp_store_server.hpp"

namespace ncclkit {

/// A Store client talking to a TcpStoreServer; with is_server it also hosts the server.
/// Thread-safe: calls from several threads are serialised on its one connection.
class TcpStore final : public Store {
 public:
  /// Connects (and with is_server, first starts the server), retrying a refused connection
  /// with backoff until `options.timeout`; then TimeoutError naming host:port. A rejected
  /// token is a StoreError at once.
  explicit TcpStore(TcpStoreOptions options)
      : host_(options.host),
        port_(options.port),
        token_(resolve_store_token(options.token)),
        linger_(environment_overrides(knob("NCCLKIT_STORE_LINGER"), options.linger)) {
    options.timeout = environment_overrides(knob("NCCLKIT_STORE_TIMEOUT"), options.timeout);
    if (options.is_server) {
      server_.emplace(TcpStoreServerOptions{.host = options.host, .port = options.port, .token = token_});
      port_ = server_->port();
      // A server bound to every address is reached over loopback.
      if (host_.empty() || host_ == "0.0.0.0") host_ = "127.0.0.1";
      if (host_ == "::") host_ = "::1";
    }
    if (port_ <= 0 || port_ > 65535) {
      throw ConfigError("TcpStore: port " + std::to_string(port_) +
                        " is not a valid port to connect to (1..65535); "
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
    request("set of key " + detail::printable_key(key),
            [&](detail::tcp::FrameWriter& w) { w.begin(detail::tcp::MessageType::kSet).key(key).bytes(value); });
    expect_reply(detail::tcp::MessageType::kOk, "set of key " + detail::printable_key(key), [](const auto&) {});
  }

  Bytes get(std::string_view key, Duration timeout) override {
    check_key(key, "get");
    std::lock_guard<std::mutex> lock(mutex_);
    const std::vector<std::string> keys{std::string(key)};
    Bytes value;
    blocking_request(
        "get of key " + detail::printable_key(key), keys, timeout,
        [&](detail::tcp::FrameWriter& w) { w.begin(detail::tcp::MessageType::kGet).u64(timeout_ms(timeout)).key(key); },
        detail::tcp::MessageType::kValue,
        [&](const detail::tcp::Frame& frame) { value.assign(frame.value.begin(), frame.value.end()); });
    return value;
  }

  void wait(std::span<const std::string> keys, Duration timeout) override {
    if (keys.empty()) return;
    for (const auto& key : keys) check_key(key, "wait");
    std::lock_guard<std::mutex> lock(mutex_);
    blocking_request(
        "wait for " + std::to_string(keys.size()) + " key(s)", keys, timeout,
        [&](detail::tcp::FrameWriter& w) {
          w.begin(detail::tcp::MessageType::kWait).u64(timeout_ms(timeout)).keys(keys);
        },
        detail::tcp::MessageType::kOk, [](const detail::tcp::Frame&) {});
  }

  bool check(std::span<const std::string> keys) override {
    for (const auto& key : keys) check_key(key, "check");
    std::lock_guard<std::mutex> lock(mutex_);
    request("check of " + std::to_string(keys.size()) + " key(s)",
            [&](detail::tcp::FrameWriter& w) { w.begin(detail::tcp::MessageType::kCheck).keys(keys); });
    bool all = false;
    expect_reply(detail::tcp::MessageType::kInteger, "check",
                 [&](const detail::tcp::Frame& f) { all = f.integer != 0; });
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
    expect_reply(detail::tcp::MessageType::kInteger, what,
                 [&](const detail::tcp::Frame& f) { existed = f.integer != 0; });
    return existed;
  }

  std::int64_t num_keys() override {
    std::lock_guard<std::mutex> lock(mutex_);
    request("num_keys", [&](detail::tcp::FrameWriter& w) { w.begin(detail::tcp::MessageType::kNumKeys); });
    std::int64_t count = 0;
    expect_reply(detail::tcp::MessageType::kInteger, "num_keys",
                 [&](const detail::tcp::Frame& f) { count = f.integer; });
    return count;
  }

 private:
  using Clock = detail::SteadyClock;

  /// A refused connect is retried after 5 ms, doubling up to 250 ms, with jitter so that the
  /// ranks of a large job do not knock on a server that starts late in lock step.
  static constexpr detail::BackoffPolicy kConnectPoll{
      .first = std::chrono::milliseconds(5), .cap = std::chrono::milliseconds(250), .jitter = true};

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
    std::string last_error = "none";
    int attempts = 0;
    const bool connected = detail::poll_until(deadline, kConnectPoll, [&] {
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
            return true;
          }
        }
      } catch (const ConfigError& e) {
        last_error = e.what();  // a name that does not resolve yet may resolve later
      }
      return false;
    });
    if (!connected) {
      throw TimeoutError("TcpStore could not connect to " + detail::format_host_port(host_, port_) + " (" + address_ +
                         ") within " + format_seconds(timeout) + " (waited " + format_seconds(Clock::now() - start) +
                         ", " + std::to_string(attempts) + " attempts; last error: " + last_error +
                         "). Is the store server (rank 0) running and reachable from this host? Check "
                         "MASTER_ADDR/MASTER_PORT or the init URL");
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
          throw StoreError("token rejected by " + address_ +
                           ": set NCCLKIT_STORE_TOKEN to the job's token (server said: " + said + ")");
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
    const auto status =
        read_reply(what, detail::deadline_after(default_timeout()), [&](const detail::tcp::Frame& frame) {
          if (frame.type == expected) {
            on_frame(frame);
          } else if (frame.type == detail::tcp::MessageType::kError) {
            server_error.assign(frame.value.begin(), frame.value.end());
          } else {
            server_error =
                "unexpected '" + detail::tcp::message_type_name(static_cast<std::uint8_t>(frame.type)) + "' reply";
          }
        });
    if (status == ReplyStatus::kTimedOut) {
      throw TimeoutError("TcpStore " + what + " on " + address_ + ": no reply from the server within " +
                         format_seconds(Clock::now() - start) +
                         " (the store timeout); the server may be overloaded or hung");
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
        server_error =
            "unexpected '" + detail::tcp::message_type_name(static_cast<std::uint8_t>(frame.type)) + "' reply";
      }
    });
    if (!server_error.empty()) throw StoreError("TcpStore " + what + " on " + address_ + " failed: " + server_error);
    if (status == ReplyStatus::kTimedOut || timed_out) {
      std::string text = "TcpStore " + what + " on " + address_ + " timed out after " +
                         format_seconds(Clock::now() - start) + " (timeout " + format_seconds(timeout) +
                         "); key(s) still missing: ";
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
