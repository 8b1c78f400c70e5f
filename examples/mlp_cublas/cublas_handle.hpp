#pragma once
// A cuBLAS handle as a move-only RAII object, and the check of cuBLAS status codes: a failure
// throws ncclkit::CudaError naming the call, the status (cublasGetStatusName) and where it was
// made. Host code: compiles with g++ as well as nvcc, given the CUDA include folder.
#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::exchange

#include <ncclkit/core/error.hpp>
#include <ncclkit/core/log.hpp>
#include <ncclkit/nccl/stream.hpp>  // DeviceGuard

namespace mlp_cublas {

/// "CUBLAS_STATUS_INVALID_VALUE (an invalid value was used as an argument)".
inline std::string describe_cublas_status(cublasStatus_t status) {
  return std::string(cublasGetStatusName(status)) + " (" + cublasGetStatusString(status) + ")";
}

/// Throws CudaError when `status` is not CUBLAS_STATUS_SUCCESS; `what` names the call.
inline void check_cublas(cublasStatus_t status, std::string_view what) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  std::string hint;
  if (status == CUBLAS_STATUS_NOT_INITIALIZED) hint = "; is a GPU visible and the CUDA driver loaded?";
  if (status == CUBLAS_STATUS_ALLOC_FAILED) hint = "; free memory on that GPU or use a smaller model or batch";
  throw ncclkit::CudaError(std::string(what) + " failed: " + describe_cublas_status(status) + hint);
}

}  // namespace mlp_cublas

/// Checks a cuBLAS call: throws ncclkit::CudaError naming the expression, the status and the place.
#define MLP_CUBLAS_CHECK(expr)                                                                              \
  do {                                                                                                      \
    const cublasStatus_t mlp_cublas_status_ = (expr);                                                       \
    if (mlp_cublas_status_ != CUBLAS_STATUS_SUCCESS) {                                                      \
      ::mlp_cublas::check_cublas(mlp_cublas_status_, std::string(#expr " at ") + __FILE__ + ":" +           \
                                                         std::to_string(__LINE__));                         \
    }                                                                                                       \
  } while (0)

namespace mlp_cublas {

/// One cuBLAS handle, made on `device` (cuBLAS binds a handle to the GPU current at creation).
class CublasHandle {
 public:
  CublasHandle() = default;
  explicit CublasHandle(int device) : device_(device) {
    const ncclkit::nccl::DeviceGuard guard(device);
    MLP_CUBLAS_CHECK(cublasCreate(&handle_));
  }
  ~CublasHandle() { reset(); }
  CublasHandle(CublasHandle&& other) noexcept
      : handle_(std::exchange(other.handle_, nullptr)), device_(other.device_) {}
  CublasHandle& operator=(CublasHandle&& other) noexcept {
    if (this != &other) {
      reset();
      handle_ = std::exchange(other.handle_, nullptr);
      device_ = other.device_;
    }
    return *this;
  }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;

  cublasHandle_t get() const { return handle_; }
  int device() const { return device_; }
  explicit operator bool() const { return handle_ != nullptr; }

 private:
  // Destructors never throw: a failure to destroy is logged and forgotten.
  void reset() noexcept {
    if (handle_ == nullptr) return;
    int previous = -1;
    const bool switched = cudaGetDevice(&previous) == cudaSuccess && previous != device_ &&
                          cudaSetDevice(device_) == cudaSuccess;
    if (const cublasStatus_t status = cublasDestroy(handle_); status != CUBLAS_STATUS_SUCCESS) {
      try {
        ncclkit::log_warn("mlp_cublas: cublasDestroy on GPU " + std::to_string(device_) +
                          " failed: " + describe_cublas_status(status));
      } catch (...) {
      }
    }
    if (switched) (void)cudaSetDevice(previous);
    handle_ = nullptr;
  }

  cublasHandle_t handle_ = nullptr;
  int device_ = 0;
};

}  // namespace mlp_cublas
