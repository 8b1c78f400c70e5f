#pragma once
/// DeviceBuffer<T>: a move-only owner of `count` elements of GPU memory (cudaMalloc), for
/// tests, benchmarks and users who want RAII without a framework's tensors.
///
/// Host code only: compiles with g++ given the CUDA include folder (link cudart).

#include <cuda_runtime_api.h>  // cudaMalloc, cudaFree, cudaMemcpy*

#include <cstddef>  // std::size_t
#include <span>     // std::span
#include <string>   // std::to_string
#include <utility>  // std::exchange
#include <vector>   // std::vector

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/checked_pointers.hpp"
#include "ncclkit/nccl/stream.hpp"

namespace ncclkit::nccl {

template <class T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  /// Allocates `count` elements on `device` (uninitialised). Zero elements allocate nothing.
  DeviceBuffer(std::size_t count, int device) : count_(count), device_(device) {
    if (count == 0) return;
    DeviceGuard guard(device);
    void* pointer = nullptr;
    cudaError_t status = cudaMalloc(&pointer, count * sizeof(T));
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      throw CudaError("cudaMalloc of " + std::to_string(count * sizeof(T)) + " bytes on GPU " + std::to_string(device) +
                      " failed: " + describe_cuda_error(status) +
                      (status == cudaErrorMemoryAllocation ? "; free memory on that GPU or use smaller buffers" : ""));
    }
    data_ = static_cast<T*>(pointer);
  }
  ~DeviceBuffer() { reset(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept
      : data_(std::exchange(other.data_, nullptr)), count_(std::exchange(other.count_, 0)), device_(other.device_) {}
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept {
    if (this != &other) {
      reset();
      data_ = std::exchange(other.data_, nullptr);
      count_ = std::exchange(other.count_, 0);
      device_ = other.device_;
    }
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  T* data() const { return data_; }
  std::size_t size() const { return count_; }
  std::size_t bytes() const { return count_ * sizeof(T); }
  int device() const { return device_; }
  std::span<T> span() const { return std::span<T>(data_, count_); }
  /// A TensorView of the whole buffer (element type from T).
  TensorView view() const { return TensorView::of(data_, count_, MemoryKind::kDevice); }

  /// Copies `host` (exactly size() elements) into the buffer; blocks until done.
  void upload(std::span<const T> host) {
    check_size(host.size(), "upload");
    if (count_ != 0) NCCLKIT_CUDA_CHECK(cudaMemcpy(data_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  /// The buffer's contents; blocks until copied (the copy orders after all work on the
  /// legacy default stream only: synchronise your own streams first).
  std::vector<T> download() const {
    std::vector<T> host(count_);
    if (count_ != 0) NCCLKIT_CUDA_CHECK(cudaMemcpy(host.data(), data_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  /// Sets every byte to `byte` on `stream` (used to poison outputs before a collective).
  void fill_bytes(unsigned char byte, cudaStream_t stream = nullptr) {
    if (count_ == 0) return;
    // A default-stream handle (a communicator's default_stream() among them) then means the
    // buffer's GPU's stream, whatever device is current.
    if (is_default_stream_handle(stream)) {
      DeviceGuard guard(device_);
      NCCLKIT_CUDA_CHECK(cudaMemsetAsync(data_, byte, bytes(), stream));
    } else {
      NCCLKIT_CUDA_CHECK(cudaMemsetAsync(data_, byte, bytes(), stream));
    }
  }

 private:
  void check_size(std::size_t got, const char* what) const {
    if (got != count_) {
      throw ConfigError("DeviceBuffer::" + std::string(what) + ": host data has " + std::to_string(got) +
                        " elements, the buffer " + std::to_string(count_));
    }
  }
  void reset() noexcept {
    if (data_ == nullptr) return;
    detail::note_device_memory_freed();  // communicators forget the addresses they checked
    if (cudaFree(std::exchange(data_, nullptr)) != cudaSuccess) {
      (void)cudaGetLastError();
      log_warn("DeviceBuffer: cudaFree failed on GPU " + std::to_string(device_));
    }
    count_ = 0;
  }

  T* data_ = nullptr;
  std::size_t count_ = 0;
  int device_ = -1;
};

}  // namespace ncclkit::nccl
