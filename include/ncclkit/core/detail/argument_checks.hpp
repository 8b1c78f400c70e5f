#pragma once
/// The one shape of a misuse message on both backends, and the argument checks the two backends
/// share. A call with bad arguments throws ConfigError with
///   "ncclkit: <op> on <communicator>: <what was wrong>; <what to do>"
/// (the communicator as core/detail/communicator_label.hpp names it), whichever the backend, so
/// that a user who switches backends, or greps the logs of both, reads one format. Each check
/// below returns what is wrong and what to do, or "" when the argument is good; a backend runs
/// it and raises the result through its own misuse path (the NCCL backend's CheckedCall, the
/// Gloo backend's validated()), which also publishes it as the rank's rejection reason when
/// the collective argument check is on. Checks only one backend makes stay in its detail/
/// folder (device pointers and streams for NCCL; host memory, self-sends and overlaps for
/// Gloo's in-place rules). Internal.

#include <cstddef>      // std::byte, std::size_t
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view

#include "ncclkit/core/dtype.hpp"   // name_of
#include "ncclkit/core/tensor.hpp"  // TensorView, MemoryKind

namespace ncclkit::detail {

/// "ncclkit: <op> on <who>: <what>".
inline std::string misuse_message(std::string_view op, std::string_view who, std::string_view what) {
  std::string message;
  message.reserve(16 + op.size() + who.size() + what.size());
  message.append("ncclkit: ").append(op).append(" on ").append(who).append(": ").append(what);
  return message;
}

/// The <what> of a message misuse_message(op, who, ...) made, or the whole message when it has
/// another shape: what a rank publishes as the reason it rejected its own call.
inline std::string_view misuse_what(std::string_view message, std::string_view op, std::string_view who) {
  const std::string prefix = misuse_message(op, who, "");
  if (message.starts_with(prefix)) message.remove_prefix(prefix.size());
  return message;
}

inline std::string rank_range(int size) { return "[0, " + std::to_string(size) + ")"; }

/// A root rank of a communicator of `size` ranks.
inline std::string root_problem(int root, int size) {
  if (root >= 0 && root < size) return {};
  return "root " + std::to_string(root) + " is outside " + rank_range(size) +
         "; give a rank of this communicator, the same on every rank";
}

/// The peer of a send or recv in a communicator of `size` ranks.
inline std::string peer_problem(int peer, int size) {
  if (peer >= 0 && peer < size) return {};
  return "peer " + std::to_string(peer) + " is outside " + rank_range(size) + "; give a rank of this communicator";
}

/// Two buffers of one collective hold the same element type.
inline std::string element_types_problem(const TensorView& first, const TensorView& second) {
  if (first.dtype == second.dtype) return {};
  return "element types differ: " + std::string(name_of(first.dtype)) + " and " + std::string(name_of(second.dtype)) +
         "; give both buffers the same element type";
}

/// Two element counts `first` and `second` that must keep `rule` (written as the caller checks
/// it, e.g. "out.count == in.count * size()") do not.
inline std::string sizes_problem(std::string_view rule, std::size_t first, std::size_t second) {
  return "sizes do not match (" + std::string(rule) + "): " + std::to_string(first) + " and " + std::to_string(second) +
         " elements; size the buffers so that " + std::string(rule);
}

/// A buffer (`which`: "input", "output", ...) in the memory the backend moves (`wanted`);
/// `remedy` says what to pass instead.
inline std::string memory_problem(std::string_view which, const TensorView& view, MemoryKind wanted,
                                  std::string_view remedy) {
  if (view.where == wanted) return {};
  const auto kind = [](MemoryKind k) { return k == MemoryKind::kHost ? "host" : "device"; };
  return std::string(which) + " is marked as " + kind(view.where) + " memory (TensorView::where), but this backend " +
         "moves " + kind(wanted) + " memory; " + std::string(remedy);
}

/// A buffer with elements has an address.
inline std::string null_problem(std::string_view which, const TensorView& view) {
  if (view.count == 0 || view.data != nullptr) return {};
  return std::string(which) + " is a null pointer with count " + std::to_string(view.count) +
         "; pass the buffer's address, or a count of 0";
}

/// Whether the byte ranges [a, a + a_bytes) and [b, b + b_bytes) share a byte.
inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

/// What is wrong with buffers that overlap where the call is not in place, and what to do.
inline constexpr std::string_view kOverlapProblem =
    "input and output overlap without being in place; pass the same buffer for in-place use, or buffers that do "
    "not overlap";

/// Out-of-place buffers must not overlap (equal addresses are in place).
inline std::string overlap_problem(const TensorView& in, const TensorView& out) {
  if (in.data == out.data || !overlaps(in.data, in.bytes(), out.data, out.bytes())) return {};
  return std::string(kOverlapProblem);
}

}  // namespace ncclkit::detail
