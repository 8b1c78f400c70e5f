#pragma once
/// ncclkit::gloo::Options: the knobs of a Gloo communicator (gloo/communicator.hpp). The
/// fields both backends have (`timeout`, `name`, `check_collectives`) mean the same as in
/// ncclkit::nccl::Options.

#include <chrono>   // std::chrono::milliseconds
#include <cstddef>  // std::size_t
#include <string>   // std::string
#include <utility>  // std::move

#include "ncclkit/core/knobs.hpp"  // knob_default, environment_overrides

namespace ncclkit::gloo {

/// Default and largest chunk: Gloo's math loops count in `int`; 2^30 elements keeps every
/// chunk far below 2^31 and chunk boundaries aligned.
inline constexpr std::size_t kDefaultChunkElements = std::size_t{1} << 30;
inline constexpr std::size_t kMaxChunkElements = (std::size_t{1} << 31) - 1;

/// Knobs of a communicator; designated initialisers recommended:
/// `Communicator comm(store, world, {.timeout = 30s, .interface = "eth0"});`
/// An NCCLKIT_ environment variable that names a field overrides it, when set, at the
/// communicator's creation (core/knobs.hpp); options() returns the values in force.
struct Options {
  /// Limit of each collective (and of connecting at creation). Gloo's own default (30 s) is
  /// never used. NCCLKIT_TIMEOUT overrides it.
  std::chrono::milliseconds timeout = knob_default<std::chrono::milliseconds>("NCCLKIT_TIMEOUT");
  /// Network interface whose address this rank binds and advertises ("eth0", "lo"). Empty:
  /// `hostname` is used. NCCLKIT_GLOO_SOCKET_IFNAME overrides it.
  std::string interface {};
  /// Host name or IP address to bind and advertise when no interface is given. Empty: this
  /// machine's host name (which must resolve to an address the peers can reach).
  /// NCCLKIT_GLOO_HOSTNAME overrides it (an interface, given or from the environment, still
  /// comes first, as in Gloo).
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
  /// send and recv are not compared (only two ranks take part). NCCLKIT_CHECK_COLLECTIVES
  /// overrides it. Every rank must set it alike (checked at creation).
  bool check_collectives = knob_default<bool>("NCCLKIT_CHECK_COLLECTIVES");
};

namespace detail {

/// `options` with the environment's overrides applied (the rule of core/knobs.hpp); a variable
/// set to a value it cannot take is a ConfigError naming it.
inline Options with_environment(Options options) {
  options.timeout = environment_overrides(knob("NCCLKIT_TIMEOUT"), options.timeout);
  options.interface = environment_overrides(knob("NCCLKIT_GLOO_SOCKET_IFNAME"), std::move(options.interface));
  options.hostname = environment_overrides(knob("NCCLKIT_GLOO_HOSTNAME"), std::move(options.hostname));
  options.check_collectives = environment_overrides(knob("NCCLKIT_CHECK_COLLECTIVES"), options.check_collectives);
  return options;
}

}  // namespace detail

}  // namespace ncclkit::gloo
