#pragma once
/// ncclkit-run --check (work in progress).

#include "ncclkit/core/error.hpp"
#include "ncclkit/launch/options.hpp"

namespace ncclkit::launch {

/// Runs the check; returns the exit status.
inline int run_check(const LaunchOptions&) { throw Error("ncclkit-run: --check is not implemented yet"); }

}  // namespace ncclkit::launch
