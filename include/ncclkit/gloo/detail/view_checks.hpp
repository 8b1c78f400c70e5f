#pragma once
/// The local argument checks of the Gloo communicator's collectives: each throws ConfigError
/// naming the communicator, the collective and what to pass instead. Internal to
/// gloo/communicator.hpp, which runs them before a collective is issued.

#include <cstddef>  // std::size_t
#include <string>   // std::string, std::to_string

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/gloo/detail/communicator_state.hpp"

namespace ncclkit::gloo::detail {

inline void check_root(const CommunicatorState& s, const char* op, int root) {
  if (root < 0 || root >= s.size) {
    throw ConfigError(s.who() + ": " + op + " root " + std::to_string(root) + " is outside [0, " +
                      std::to_string(s.size) + ")");
  }
}

/// Point-to-point: `peer` must be another rank of the communicator.
inline void check_peer(const CommunicatorState& s, const char* op, int peer) {
  if (peer < 0 || peer >= s.size) {
    throw ConfigError(s.who() + ": " + op + " peer " + std::to_string(peer) + " is outside [0, " +
                      std::to_string(s.size) + ")");
  }
  if (peer == s.rank) {
    throw ConfigError(s.who() + ": " + op + " peer " + std::to_string(peer) +
                      " is this rank; send and recv need another rank (copy() moves data within a rank)");
  }
}

/// One view: host memory, and a pointer wherever the count is not zero.
inline void check_view(const CommunicatorState& s, const char* op, const TensorView& view) {
  if (view.where != MemoryKind::kHost) {
    throw ConfigError(s.who() + ": " + op +
                      " needs host memory (TensorView::where == kHost); the Gloo "
                      "backend cannot read device memory: copy to the host or use the NCCL backend");
  }
  if (view.count > 0 && view.data == nullptr) {
    throw ConfigError(s.who() + ": " + op + " got a null pointer with a non-zero count");
  }
}

/// Two views: each as check_view, and the same element type.
inline void check_views(const CommunicatorState& s, const char* op, const TensorView& in, const TensorView& out) {
  if (in.where != MemoryKind::kHost || out.where != MemoryKind::kHost) {
    throw ConfigError(s.who() + ": " + op +
                      " needs host memory (TensorView::where == kHost); the Gloo "
                      "backend cannot read device memory: copy to the host or use the NCCL backend");
  }
  if (in.dtype != out.dtype) {
    throw ConfigError(s.who() + ": " + op + " input is " + std::string(name_of(in.dtype)) + " but output is " +
                      std::string(name_of(out.dtype)) + "; both must have the same element type");
  }
  if ((in.count > 0 && in.data == nullptr) || (out.count > 0 && out.data == nullptr)) {
    throw ConfigError(s.who() + ": " + op + " got a null pointer with a non-zero count");
  }
}

[[noreturn]] inline void overlap_error(const CommunicatorState& s, const char* op) {
  throw ConfigError(s.who() + ": " + op +
                    " input and output overlap without being in place; pass the same "
                    "buffer for in-place use or non-overlapping buffers");
}

/// Out-of-place views must not overlap (equal pointers are in place).
inline void check_alias(const CommunicatorState& s, const char* op, const TensorView& in, const TensorView& out) {
  if (in.data != out.data && overlaps(in.data, in.bytes(), out.data, out.bytes())) overlap_error(s, op);
}

[[noreturn]] inline void mismatch(const CommunicatorState& s, const char* op, const char* rule, std::size_t a,
                                  std::size_t b) {
  throw ConfigError(s.who() + ": " + op + " needs " + rule + " (got " + std::to_string(a) + " and " +
                    std::to_string(b) + ")");
}

}  // namespace ncclkit::gloo::detail
