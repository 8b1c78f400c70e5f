#pragma once
/// The local argument checks of the Gloo communicator's collectives: each throws ConfigError in
/// the shape both backends share ("ncclkit: <op> on <communicator>: <what>; <what to do>"), from
/// the checks both make (core/detail/argument_checks.hpp) and those only Gloo's needs (host
/// memory, a peer that is this rank, in-place rules). Internal to gloo/communicator.hpp, which
/// runs them before a collective is issued.

#include <cstddef>      // std::size_t
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view

#include "ncclkit/core/detail/argument_checks.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/gloo/detail/communicator_state.hpp"

namespace ncclkit::gloo::detail {

/// What to pass instead of device memory.
inline constexpr std::string_view kHostMemoryRemedy =
    "the Gloo backend cannot read device memory: copy it to the host, or use the NCCL backend";

/// Throws the ConfigError of `op` on this communicator: `what` was wrong (and what to do).
[[noreturn]] inline void misuse(const CommunicatorState& s, std::string_view op, const std::string& what) {
  throw ConfigError(ncclkit::detail::misuse_message(op, s.who(), what));
}

/// misuse() unless `problem` (a check of core/detail/argument_checks.hpp) is empty.
inline void misuse_if(const CommunicatorState& s, std::string_view op, const std::string& problem) {
  if (!problem.empty()) misuse(s, op, problem);
}

inline void check_root(const CommunicatorState& s, const char* op, int root) {
  misuse_if(s, op, ncclkit::detail::root_problem(root, s.size));
}

/// Point-to-point: `peer` must be another rank of the communicator.
inline void check_peer(const CommunicatorState& s, const char* op, int peer) {
  misuse_if(s, op, ncclkit::detail::peer_problem(peer, s.size));
  if (peer == s.rank) {
    misuse(s, op,
           "peer " + std::to_string(peer) +
               " is this rank; send and recv need another rank (copy() moves data within a rank)");
  }
}

/// One view (`which`: "input", "output", ...): host memory, and a pointer wherever the count
/// is not zero.
inline void check_view(const CommunicatorState& s, const char* op, const TensorView& view,
                       std::string_view which = "buffer") {
  misuse_if(s, op, ncclkit::detail::memory_problem(which, view, MemoryKind::kHost, kHostMemoryRemedy));
  misuse_if(s, op, ncclkit::detail::null_problem(which, view));
}

/// Two views: each as check_view, and the same element type.
inline void check_views(const CommunicatorState& s, const char* op, const TensorView& in, const TensorView& out) {
  misuse_if(s, op, ncclkit::detail::memory_problem("input", in, MemoryKind::kHost, kHostMemoryRemedy));
  misuse_if(s, op, ncclkit::detail::memory_problem("output", out, MemoryKind::kHost, kHostMemoryRemedy));
  misuse_if(s, op, ncclkit::detail::element_types_problem(in, out));
  misuse_if(s, op, ncclkit::detail::null_problem("input", in));
  misuse_if(s, op, ncclkit::detail::null_problem("output", out));
}

/// Input and output overlap, and the collective's in-place rule does not call it in place.
[[noreturn]] inline void overlap_error(const CommunicatorState& s, const char* op) {
  misuse(s, op, std::string(ncclkit::detail::kOverlapProblem));
}

/// Out-of-place views must not overlap (equal pointers are in place).
inline void check_alias(const CommunicatorState& s, const char* op, const TensorView& in, const TensorView& out) {
  misuse_if(s, op, ncclkit::detail::overlap_problem(in, out));
}

/// Element counts `a` and `b` that must keep `rule` do not.
[[noreturn]] inline void mismatch(const CommunicatorState& s, const char* op, const char* rule, std::size_t a,
                                  std::size_t b) {
  misuse(s, op, ncclkit::detail::sizes_problem(rule, a, b));
}

}  // namespace ncclkit::gloo::detail
