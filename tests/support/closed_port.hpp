#pragma once
// A loopback TCP port that refuses connections for as long as the test holds it.
//
// A port that was free a moment ago is no proof that nothing listens there later: the tests run in
// parallel, and another test's server may bind it in between (CI once saw a "nobody listens here"
// check reach a stranger's store). A socket bound without SO_REUSEADDR and never put into listen()
// keeps every other socket off the port, and the kernel answers a connect() to it with a reset
// ("Connection refused").

#include <doctest/doctest.h>
#include <arpa/inet.h>   // htonl, htons, ntohs
#include <netinet/in.h>  // sockaddr_in, INADDR_LOOPBACK
#include <sys/socket.h>  // socket, bind, getsockname, setsockopt
#include <unistd.h>      // close

#include <cerrno>   // errno
#include <cstdint>  // std::uint16_t
#include <cstring>  // std::strerror
#include <string>   // std::to_string

namespace ncclkit_test {

class ClosedPort {
 public:
  /// Holds `port` on 127.0.0.1, or a port the kernel picks when it is 0. A given port may still have
  /// connections in TIME_WAIT from a server that has exited, so it is bound with SO_REUSEADDR; that
  /// still fails while anything listens there, and a socket that later asks for any free port is
  /// not given this one.
  explicit ClosedPort(int port = 0) : fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    REQUIRE_MESSAGE(fd_ >= 0, "socket: ", std::strerror(errno));
    if (port != 0) {
      const int one = 1;
      ::setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    }
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(static_cast<std::uint16_t>(port));
    REQUIRE_MESSAGE(::bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0,
                    "cannot hold 127.0.0.1:", std::to_string(port), " (", std::strerror(errno),
                    "): something still listens there");
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd_, reinterpret_cast<sockaddr*>(&address), &length) == 0);
    port_ = ntohs(address.sin_port);
  }
  ClosedPort(const ClosedPort&) = delete;
  ClosedPort& operator=(const ClosedPort&) = delete;
  ~ClosedPort() { ::close(fd_); }

  int port() const { return port_; }

 private:
  int fd_;
  int port_ = 0;
};

}  // namespace ncclkit_test
