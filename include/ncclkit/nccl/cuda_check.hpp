#pragma once
/// Checking CUDA runtime and NCCL return codes: every call's status is checked, and a failure
/// becomes a `CudaError` / `NcclError` whose message names the call, the code, its meaning
/// and where it was made.
///
/// Host code only (no kernels): compiles with g++ as well as nvcc, given the CUDA and NCCL
/// include folders.

#include <cuda_runtime_api.h>  // cudaError_t, cudaGetErrorName, cudaGetErrorString
#include <nccl.h>              // ncclResult_t, ncclGetErrorString, ncclGetLastError

#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/core/error.hpp"

namespace ncclkit::nccl {

namespace detail {

inline std::string where_text(const char* file, int line) { return std::string(file) + ":" + std::to_string(line); }

}  // namespace detail

/// "cudaErrorInvalidValue (invalid argument)".
inline std::string describe_cuda_error(cudaError_t status) {
  return std::string(cudaGetErrorName(status)) + " (" + cudaGetErrorString(status) + ")";
}

/// "ncclInvalidArgument (invalid argument (run with NCCL_DEBUG=WARN for details))", plus NCCL's
/// last error text for `comm` when it has one.
inline std::string describe_nccl_error(ncclResult_t status, ncclComm_t comm = nullptr) {
  static constexpr const char* kNames[] = {"ncclSuccess",       "ncclUnhandledCudaError", "ncclSystemError",
                                           "ncclInternalError", "ncclInvalidArgument",    "ncclInvalidUsage",
                                           "ncclRemoteError",   "ncclInProgress"};
  std::string text = static_cast<int>(status) >= 0 && static_cast<int>(status) < 8
                         ? kNames[static_cast<int>(status)]
                         : "ncclResult " + std::to_string(static_cast<int>(status));
  text += std::string(" (") + ncclGetErrorString(status) + ")";
  const char* last = ncclGetLastError(comm);
  if (last != nullptr && *last != '\0') text += std::string("; NCCL says: ") + last;
  return text;
}

/// Throws CudaError when `status` is not cudaSuccess. `what` names the call and its context.
inline void check_cuda(cudaError_t status, std::string_view what) {
  if (status == cudaSuccess) return;
  // Clear the sticky "last error" so that a later, unrelated check does not report it again.
  (void)cudaGetLastError();
  throw CudaError(std::string(what) + " failed: " + describe_cuda_error(status));
}

/// Throws NcclError when `status` is neither ncclSuccess nor ncclInProgress (a non-blocking
/// communicator's "still working"; callers that must wait for it poll, see communicator.hpp).
inline void check_nccl(ncclResult_t status, std::string_view what, ncclComm_t comm = nullptr) {
  if (status == ncclSuccess || status == ncclInProgress) return;
  throw NcclError(std::string(what) + " failed: " + describe_nccl_error(status, comm) +
                  "; set NCCL_DEBUG=WARN (or INFO) to see NCCL's own account");
}

}  // namespace ncclkit::nccl

/// Checks a CUDA runtime call: throws ncclkit::CudaError naming the expression and its place.
/// The message is built only on failure, so the check costs one comparison on success.
#define NCCLKIT_CUDA_CHECK(expr)                                                                                 \
  do {                                                                                                           \
    const cudaError_t ncclkit_status_ = (expr);                                                                  \
    if (ncclkit_status_ != cudaSuccess) {                                                                        \
      ::ncclkit::nccl::check_cuda(                                                                               \
          ncclkit_status_, std::string(#expr " at ") + ::ncclkit::nccl::detail::where_text(__FILE__, __LINE__)); \
    }                                                                                                            \
  } while (0)

/// Checks an NCCL call: throws ncclkit::NcclError naming the expression and its place.
/// ncclInProgress passes (see check_nccl).
#define NCCLKIT_NCCL_CHECK(expr)                                                                                 \
  do {                                                                                                           \
    const ncclResult_t ncclkit_status_ = (expr);                                                                 \
    if (ncclkit_status_ != ncclSuccess) {                                                                        \
      ::ncclkit::nccl::check_nccl(                                                                               \
          ncclkit_status_, std::string(#expr " at ") + ::ncclkit::nccl::detail::where_text(__FILE__, __LINE__)); \
    }                                                                                                            \
  } while (0)
