#pragma once
// A raw TCP peer of the TcpStore server, for tests that send bytes no client would (garbage,
// half-sent frames, floods) and watch how the server answers: test_tcp_store.cpp and
// test_tcp_store_abuse.cpp.

#include <chrono>   // std::chrono
#include <cstdint>  // std::uint8_t, std::uint64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <doctest/doctest.h>

#include "ncclkit/store/detail/socket.hpp"
#include "ncclkit/store/detail/tcp_protocol.hpp"

namespace ncclkit_test {

/// A raw TCP connection to 127.0.0.1:port (the test fails when none can be made in 5 s).
inline ncclkit::detail::Socket raw_connect(int port) {
  auto addresses = ncclkit::detail::resolve_addresses("127.0.0.1", port, false);
  int error = 0;
  auto socket =
      ncclkit::detail::connect_once(addresses.at(0), std::chrono::steady_clock::now() + std::chrono::seconds(5), error);
  REQUIRE_MESSAGE(socket, "raw connect failed: " << error);
  return socket;
}

/// Whether the server closes `socket` within `limit` (reads and discards what it sends first).
inline bool closed_within(const ncclkit::detail::Socket& socket, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<std::uint8_t> buffer(1 << 16);
  for (;;) {
    std::size_t got = 0;
    int error = 0;
    auto status = ncclkit::detail::receive_some(socket.get(), buffer.data(), buffer.size(), deadline, got, error);
    if (status == ncclkit::detail::IoStatus::kClosed) return true;
    if (status != ncclkit::detail::IoStatus::kDone) return false;
  }
}

/// A complete hello frame presenting `token`.
inline ncclkit::Bytes hello_frame(const std::string& token = "") {
  ncclkit::Bytes out;
  ncclkit::detail::tcp::FrameWriter(out).begin(ncclkit::detail::tcp::MessageType::kHello).bytes(token).finish();
  return out;
}

/// A frame header of message type `type` (any byte, valid or not) announcing `payload_bytes`.
inline ncclkit::Bytes frame_header(std::uint8_t type, std::uint64_t payload_bytes) {
  ncclkit::Bytes out = {'N', 'K', 'T', 'S', ncclkit::detail::tcp::kProtocolVersion, type, 0, 0};
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(payload_bytes >> (8 * i)));
  return out;
}
inline ncclkit::Bytes frame_header(ncclkit::detail::tcp::MessageType type, std::uint64_t payload_bytes) {
  return frame_header(static_cast<std::uint8_t>(type), payload_bytes);
}

}  // namespace ncclkit_test
