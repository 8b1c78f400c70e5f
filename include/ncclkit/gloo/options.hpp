#pragma once
/// ncclkit::gloo::Options: the knobs of a Gloo communicator (gloo/communicator.hpp). The
/// fields both backends have (`timeout`, `name`, `check_collectives`) mean the same as in
/// ncclkit::nccl::Options.

#include <chrono>   // std::chrono::milliseconds
#include <cstddef>  // std::size_t
#include <string>   // std::string

#include "ncclkit/core/collective_check.hpp"  // default_check_collectives
#include "ncclkit/core/env.hpp"               // default_comm_timeout

namespace ncclkit::gloo {

/// Default and largest chunk: Gloo's math loops count in `int`; 2^30 elements keeps every
/// chunk far below 2^31 and chunk boundaries aligned.
inline constexpr std::size_t kDefaultChunkElements = std::size_t{1} << 30;
inline constexpr std::size_t kMaxChunkElements = (std::size_t{1} << 31) - 1;

/// Knobs of a communicator; designated initialisers recommended:
/// `Communicator comm(store, world, {.timeout = 30s, .interface = "eth0"});`
struct Options {
  /// Limit of each collective (and of connecting at creation). Default NCCLKIT_TIMEOUT or
  /// 600 s. Gloo's own default (30 s) is never used.
  std::chrono::milliseconds timeout = default_comm_timeout();
  /// Network interface whose address this rank binds and advertises ("eth0", "lo"). Empty:
  /// NCCLKIT_GLOO_SOCKET_IFNAME if set, else `hostname` is used.
  std::string interface {};
  /// Host name or IP address to bind and advertise when no interface is given. Empty:
  /// NCCLKIT_GLOO_HOSTNAME if set, else this machine's host name (which must resolve to an
  /// address the peers can reach).
  std::string hostname{};
  /// Most elements one Gloo call handles; larger buffers are cut into chunks. Must be in
  /// [1, 2^31 - 1]; tests set it small to exercise the chunked paths.
  std::size_t chunk_elements = kDefaultChunkElements;
  /// Name in logs and errors, and the scope of its store keys: every rank must create its
  /// communicators of one name in the same order.
  std::string name = "gloo";
  /// Compare every collective's arguments across ranks before it runs (sequence number,
  /// collective, element type, count, op, root), through one small allgather on this
  /// communicator; a difference is a CollectiveMismatchError on every rank. Point-to-point
  /// send and recv are not compared (only two ranks take part). Default:
  /// NCCLKIT_CHECK_COLLECTIVES. Every rank must set it alike (checked at creation).
  bool check_collectives = default_check_collectives();
};

}  // namespace ncclkit::gloo
