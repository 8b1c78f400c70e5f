#pragma once
/// Small POSIX socket helpers for TcpStore: an RAII file descriptor, address resolution
/// (IPv4, IPv6, interface names), listening and connecting with deadlines (poll, never an
/// unbounded blocking call), and sending/receiving with a deadline.

#include <arpa/inet.h>    // inet_ntop
#include <fcntl.h>        // fcntl, O_NONBLOCK
#include <ifaddrs.h>      // getifaddrs
#include <netdb.h>        // getaddrinfo, gai_strerror
#include <netinet/in.h>   // sockaddr_in, sockaddr_in6, IPPROTO_TCP
#include <netinet/tcp.h>  // TCP_NODELAY
#include <poll.h>         // poll
#include <sys/socket.h>   // socket, bind, listen, connect, send, recv
#include <unistd.h>       // close

#include <algorithm>  // std::max, std::min
#include <cerrno>     // errno
#include <chrono>     // std::chrono::steady_clock
#include <climits>    // INT_MAX
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint8_t
#include <cstring>    // std::strerror, std::memcpy, std::memmove
#include <memory>     // std::unique_ptr
#include <span>       // std::span
#include <string>     // std::string
#include <utility>    // std::exchange
#include <vector>     // std::vector

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/error.hpp"

namespace ncclkit::detail {

/// An owned file descriptor: closed by the destructor, move-only.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket() { reset(); }
  Socket(Socket&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Socket& operator=(Socket&& other) noexcept {
    if (this != &other) {
      reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  /// Gives up ownership without closing.
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

using SteadyClock = std::chrono::steady_clock;

/// Milliseconds until `deadline` for poll(), rounded up so that a poll never returns before
/// the deadline; 0 when it has passed.
inline int poll_timeout_ms(SteadyClock::time_point deadline) {
  const auto left = deadline - SteadyClock::now();
  if (left <= SteadyClock::duration::zero()) return 0;
  const auto ms = std::chrono::ceil<std::chrono::milliseconds>(left).count();
  return ms > INT_MAX ? INT_MAX : static_cast<int>(ms);
}

inline std::string errno_text(int err) { return std::string(std::strerror(err)); }

/// "host:port", with IPv6 literals in brackets: "[::1]:29500".
inline std::string format_host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

/// A socket address as numeric text and port, for logs ("127.0.0.1:51234", "[::1]:51234").
inline std::string format_sockaddr(const sockaddr_storage& address) {
  char text[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
    port = ntohs(v4.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
    port = ntohs(v6.sin6_port);
  }
  return format_host_port(text, port);
}

/// One resolved address to bind or connect to.
struct SocketAddress {
  sockaddr_storage storage{};
  socklen_t length = 0;
  int family = AF_UNSPEC;

  std::string numeric_host() const {
    char text[INET6_ADDRSTRLEN] = "?";
    if (family == AF_INET) {
      ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in&>(storage).sin_addr, text, sizeof text);
    } else if (family == AF_INET6) {
      ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6&>(storage).sin6_addr, text, sizeof text);
    }
    return text;
  }
};

/// The first IPv4 (else IPv6) address of network interface `name` ("eth0"), if there is one.
inline bool interface_address(const std::string& name, int port, SocketAddress& out) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (int wanted : {AF_INET, AF_INET6}) {
    for (ifaddrs* entry = list; entry != nullptr && !found; entry = entry->ifa_next) {
      if (entry->ifa_addr == nullptr || entry->ifa_addr->sa_family != wanted || name != entry->ifa_name) continue;
      out = SocketAddress{};
      out.family = wanted;
      out.length = wanted == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
      std::memcpy(&out.storage, entry->ifa_addr, out.length);
      if (wanted == AF_INET) {
        reinterpret_cast<sockaddr_in&>(out.storage).sin_port = htons(static_cast<std::uint16_t>(port));
      } else {
        reinterpret_cast<sockaddr_in6&>(out.storage).sin6_port = htons(static_cast<std::uint16_t>(port));
      }
      found = true;
    }
    if (found) break;
  }
  ::freeifaddrs(list);
  return found;
}

/// Addresses for `host` and `port`: a numeric IPv4/IPv6 address, a host name, or (when
/// `passive`) an interface name. ConfigError when nothing matches.
inline std::vector<SocketAddress> resolve_addresses(const std::string& host, int port, bool passive) {
  std::vector<SocketAddress> addresses;
  if (passive) {
    SocketAddress by_interface;
    if (!host.empty() && interface_address(host, port, by_interface)) return {by_interface};
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* list = nullptr;
  const std::string service = std::to_string(port);
  const int rc = ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &list);
  if (rc != 0) {
    throw ConfigError("cannot resolve TcpStore host '" + host + "': " + ::gai_strerror(rc) +
                      "; give a numeric address (127.0.0.1, ::1), a host name or (to bind) an interface name");
  }
  for (addrinfo* entry = list; entry != nullptr; entry = entry->ai_next) {
    if (entry->ai_family != AF_INET && entry->ai_family != AF_INET6) continue;
    SocketAddress address;
    address.family = entry->ai_family;
    address.length = static_cast<socklen_t>(entry->ai_addrlen);
    std::memcpy(&address.storage, entry->ai_addr, entry->ai_addrlen);
    addresses.push_back(address);
  }
  ::freeaddrinfo(list);
  if (addresses.empty()) {
    throw ConfigError("TcpStore host '" + host + "' has no IPv4 or IPv6 address");
  }
  return addresses;
}

inline void set_nonblocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

/// Small request/reply messages must not wait for Nagle's algorithm.
inline void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/// The port a bound socket got (resolves port 0); -1 on error.
inline int local_port(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return -1;
  if (address.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in&>(address).sin_port);
  if (address.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6&>(address).sin6_port);
  return -1;
}

/// The address a bound socket has, as numeric text ("127.0.0.1", "::").
inline std::string local_host(int fd) {
  sockaddr_storage address{};
  socklen_t length = sizeof address;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0) return "?";
  std::string text = format_sockaddr(address);
  // format_sockaddr gives "host:port" or "[host]:port": strip the port again.
  const auto colon = text.rfind(':');
  text.resize(colon);
  if (!text.empty() && text.front() == '[') text = text.substr(1, text.size() - 2);
  return text;
}

/// A listening TCP socket on `host`:`port` (SO_REUSEADDR, close-on-exec). `host`: an address,
/// a host name or an interface name; "" binds every address (IPv6 dual-stack where available,
/// else IPv4). Port 0 picks a free port (see local_port). A port in use is a ConfigError
/// naming it.
inline Socket listen_tcp(const std::string& host, int port, int backlog = 4096) {
  if (port < 0 || port > 65535) {
    throw ConfigError("TcpStore port " + std::to_string(port) + " is outside [0, 65535]");
  }
  std::vector<SocketAddress> candidates;
  if (host.empty()) {
    // All addresses: one dual-stack IPv6 socket takes IPv4 too; fall back to IPv4 only.
    candidates = resolve_addresses("::", port, true);
    auto v4 = resolve_addresses("0.0.0.0", port, true);
    candidates.insert(candidates.end(), v4.begin(), v4.end());
  } else {
    candidates = resolve_addresses(host, port, true);
  }
  std::string failures;
  for (const auto& address : candidates) {
    Socket socket(::socket(address.family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!socket) {
      failures += (failures.empty() ? "" : "; ") + address.numeric_host() + ": socket: " + errno_text(errno);
      continue;
    }
    int one = 1;
    ::setsockopt(socket.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (address.family == AF_INET6 && host.empty()) {
      int zero = 0;
      ::setsockopt(socket.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (::bind(socket.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
      const int err = errno;
      if (err == EADDRINUSE) {
        throw ConfigError("TcpStore cannot listen on " + format_host_port(address.numeric_host(), port) + ": port " +
                          std::to_string(port) +
                          " is already in use; pick another port (MASTER_PORT) or 0 for a free one, or stop "
                          "the process holding it");
      }
      failures += (failures.empty() ? "" : "; ") + format_host_port(address.numeric_host(), port) +
                  ": bind: " + errno_text(err);
      continue;
    }
    if (::listen(socket.get(), backlog) != 0) {
      failures += (failures.empty() ? "" : "; ") + format_host_port(address.numeric_host(), port) +
                  ": listen: " + errno_text(errno);
      continue;
    }
    return socket;
  }
  throw ConfigError("TcpStore cannot listen on '" + host + "' port " + std::to_string(port) + ": " + failures);
}

/// One non-blocking connect attempt to `address`, bounded by `deadline`. Returns a connected,
/// non-blocking socket with TCP_NODELAY, or an empty one with `error` set to the errno.
inline Socket connect_once(const SocketAddress& address, SteadyClock::time_point deadline, int& error) {
  Socket socket(::socket(address.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!socket) {
    error = errno;
    return {};
  }
  if (::connect(socket.get(), reinterpret_cast<const sockaddr*>(&address.storage), address.length) != 0) {
    if (errno != EINPROGRESS) {
      error = errno;
      return {};
    }
    pollfd entry{socket.get(), POLLOUT, 0};
    int ready;
    do {
      ready = ::poll(&entry, 1, poll_timeout_ms(deadline));
    } while (ready < 0 && errno == EINTR);
    if (ready <= 0) {
      error = ready == 0 ? ETIMEDOUT : errno;
      return {};
    }
    int so_error = 0;
    socklen_t length = sizeof so_error;
    ::getsockopt(socket.get(), SOL_SOCKET, SO_ERROR, &so_error, &length);
    if (so_error != 0) {
      error = so_error;
      return {};
    }
  }
  set_nodelay(socket.get());
  error = 0;
  return socket;
}

/// Outcome of a deadline-bounded socket transfer.
enum class IoStatus { kDone, kTimedOut, kClosed, kError };

/// Sends all of `data` on non-blocking `fd` by `deadline`. `error` gets errno on kError.
inline IoStatus send_all(int fd, const std::uint8_t* data, std::size_t size, SteadyClock::time_point deadline,
                         int& error) {
  while (size > 0) {
    const ssize_t sent = ::send(fd, data, size, MSG_NOSIGNAL);
    if (sent > 0) {
      data += sent;
      size -= static_cast<std::size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      pollfd entry{fd, POLLOUT, 0};
      const int ready = ::poll(&entry, 1, poll_timeout_ms(deadline));
      if (ready == 0) return IoStatus::kTimedOut;
      if (ready < 0 && errno != EINTR) {
        error = errno;
        return IoStatus::kError;
      }
      continue;
    }
    error = sent < 0 ? errno : EPIPE;
    return (error == EPIPE || error == ECONNRESET) ? IoStatus::kClosed : IoStatus::kError;
  }
  return IoStatus::kDone;
}

/// Receives what is available on non-blocking `fd` (at most `capacity` bytes) once some is,
/// by `deadline`. `received` gets the byte count on kDone; kClosed when the peer closed.
/// Polls before reading: a caller reads right after sending a request, when the reply is
/// almost never there yet, so a recv first would be a wasted system call.
inline IoStatus receive_some(int fd, std::uint8_t* buffer, std::size_t capacity, SteadyClock::time_point deadline,
                             std::size_t& received, int& error) {
  for (;;) {
    pollfd entry{fd, POLLIN, 0};
    const int ready = ::poll(&entry, 1, poll_timeout_ms(deadline));
    if (ready == 0) return IoStatus::kTimedOut;
    if (ready < 0) {
      if (errno == EINTR) continue;
      error = errno;
      return IoStatus::kError;
    }
    const ssize_t got = ::recv(fd, buffer, capacity, 0);
    if (got > 0) {
      received = static_cast<std::size_t>(got);
      return IoStatus::kDone;
    }
    if (got == 0) return IoStatus::kClosed;
    if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) continue;
    error = errno;
    return error == ECONNRESET ? IoStatus::kClosed : IoStatus::kError;
  }
}

/// A byte queue for socket input: append at the end (prepare + commit), take from the front
/// (consume). Unlike std::vector, growing does not zero the new bytes, which would cost a
/// memset per read.
class ByteBuffer {
 public:
  std::span<const std::uint8_t> readable() const { return {data_.get() + begin_, end_ - begin_}; }
  std::size_t size() const { return end_ - begin_; }
  std::size_t writable() const { return capacity_ - end_; }

  void consume(std::size_t bytes) {
    begin_ += bytes;
    if (begin_ >= end_) begin_ = end_ = 0;
  }
  /// Room for at least `bytes` more; returns where to write them (then call commit). Grows to
  /// exactly what is asked (at least 4 KiB), so callers control the growth policy (see
  /// next_read_size).
  std::uint8_t* prepare(std::size_t bytes) {
    if (capacity_ - end_ >= bytes) return data_.get() + end_;
    const std::size_t used = end_ - begin_;
    if (capacity_ - used >= bytes && capacity_ >= 2 * used) {
      std::memmove(data_.get(), data_.get() + begin_, used);
    } else {
      std::size_t capacity = std::max<std::size_t>(used + bytes, 4096);
      std::unique_ptr<std::uint8_t[]> grown(new std::uint8_t[capacity]);
      if (used > 0) std::memcpy(grown.get(), data_.get() + begin_, used);
      data_ = std::move(grown);
      capacity_ = capacity;
    }
    begin_ = 0;
    end_ = used;
    return data_.get() + end_;
  }
  void commit(std::size_t bytes) { end_ += bytes; }
  /// Frees the memory when empty and larger than `keep` (after a large value went through).
  void trim(std::size_t keep) {
    if (size() == 0 && capacity_ > keep) {
      data_.reset();
      capacity_ = begin_ = end_ = 0;
    }
  }
  void clear() { begin_ = end_ = 0; }

  /// How much room to ask for before the next read, given the size of the frame being
  /// received (`frame_bytes`, 0 while unknown): the rest of the frame, but at most as much as
  /// has arrived already (and at least `chunk`). So the buffer doubles as data comes in, and
  /// a peer announcing a large frame makes the reader hold memory in proportion to what it
  /// actually sent, never to what it claimed.
  std::size_t next_read_size(std::size_t frame_bytes, std::size_t chunk) const {
    if (frame_bytes <= size()) return chunk;
    return std::min(frame_bytes - size(), std::max(chunk, size()));
  }

 private:
  std::unique_ptr<std::uint8_t[]> data_;
  std::size_t capacity_ = 0;
  std::size_t begin_ = 0;
  std::size_t end_ = 0;
};

}  // namespace ncclkit::detail
