#pragma once
// Loopback TCP ports for tests that run in parallel with other tests: one to listen on, and one
// that refuses connections.
//
// A port the kernel hands out for bind(0) lies in its ephemeral range, where every other test's
// port-0 server and every outgoing connection also take theirs: released, it may be taken by a
// stranger before the test uses it, and a client retrying it may even connect to itself.

#include <doctest/doctest.h>
#include <arpa/inet.h>   // htonl, htons, ntohs
#include <netinet/in.h>  // sockaddr_in, INADDR_ANY, INADDR_LOOPBACK
#include <sys/socket.h>  // socket, bind, getsockname, setsockopt
#include <unistd.h>      // close, getpid

#include <cerrno>    // errno
#include <cstdint>   // std::uint16_t
#include <cstring>   // std::strerror
#include <fstream>   // std::ifstream: the ephemeral range
#include <random>    // std::mt19937: the draw
#include <string>    // std::string, std::to_string

namespace ncclkit_test {

/// A TCP port free on every address now, for a server to listen on: drawn outside the kernel's
/// ephemeral range (below it, or above it where little room is left below), so that the ports
/// others bind to port 0 and the source ports of connections cannot take it before the server
/// binds it. Another test's `free_port` could still draw the same port, once in thousands.
inline int free_port() {
  int low = 32768, high = 60999;
  std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low >> high;
  constexpr int kFirst = 10000, kRoom = 1000;
  int from = kFirst, to = low - 1;
  if (to - from < kRoom) {
    from = high + 1;
    to = 65535;
  }
  REQUIRE_MESSAGE(to - from >= kRoom, "the ephemeral port range ", low, "-", high, " leaves no room for a test's port");
  std::mt19937 random(std::random_device{}() ^ static_cast<unsigned>(::getpid()));
  std::uniform_int_distribution<int> draw(from, to);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_ANY);  // free on every address, where a launcher listens
    const int port = draw(random);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    ::close(fd);
    if (free) return port;
  }
  FAIL("no free TCP port in ", from, "-", to, " after 200 draws");
  return 0;
}

/// A loopback port that refuses connections for as long as the object lives: bound, never put
/// into listen(), so the kernel answers a connect() with a reset ("Connection refused").
///
/// Held without SO_REUSEADDR (port 0: any port the kernel picks), no other socket can bind it. A
/// given port may have connections in TIME_WAIT from a server that has exited, so it is bound
/// with SO_REUSEADDR; then only port-0 binds and sockets without that option are kept off it (a
/// server that binds this very port with SO_REUSEADDR could still share it), so give a port no
/// other test names, such as one the kernel handed out.
class ClosedPort {
 public:
  explicit ClosedPort(int port = 0) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    const int socket_error = errno;
    REQUIRE_MESSAGE(fd_ >= 0, "socket: ", std::strerror(socket_error));
    if (port != 0) {
      const int one = 1;
      ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool bound = ::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    const int bind_error = errno;
    REQUIRE_MESSAGE(bound, "cannot hold 127.0.0.1:", port, " (", std::strerror(bind_error),
                    "): another socket holds it");
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port_ = ntohs(address.sin_port);
  }
  ClosedPort(const ClosedPort&) = delete;
  ClosedPort& operator=(const ClosedPort&) = delete;
  ~ClosedPort() {
    if (fd_ >= 0) ::close(fd_);
  }

  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

}  // namespace ncclkit_test
