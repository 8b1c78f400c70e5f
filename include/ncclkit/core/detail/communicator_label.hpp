#pragma once
/// How every message names a communicator, whichever the backend:
///   "nccl communicator 'grads' (rank 1 of 4, GPU 1)"
///   "gloo communicator 'gloo' (rank 0 of 2)"
/// so a user who switches backends (or greps logs of both) reads one format.

#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view

namespace ncclkit::detail {

/// `backend` is "nccl" or "gloo"; `name` the communicator's Options::name; `place` an optional
/// last detail inside the parentheses ("GPU 1"), empty for none.
inline std::string communicator_label(std::string_view backend, std::string_view name, int rank, int size,
                                      std::string_view place = {}) {
  std::string label;
  label.reserve(64);
  label.append(backend).append(" communicator '").append(name).append("' (rank ");
  label.append(std::to_string(rank)).append(" of ").append(std::to_string(size));
  if (!place.empty()) label.append(", ").append(place);
  label.append(")");
  return label;
}

}  // namespace ncclkit::detail
