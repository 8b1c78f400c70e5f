#pragma once
/// `nccl::CopyBatch`: a batch of device-to-device copies whose table lives in device memory,
/// made once by `Communicator::prepare_copies` and run by `Communicator::copy_batch` as one
/// kernel (how loose tensors are packed into a bucket and unpacked from it).

#include <cuda_runtime_api.h>  // cudaFree

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <string>   // std::string, std::to_string
#include <utility>  // std::exchange

#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"
#include "ncclkit/nccl/stream.hpp"

namespace ncclkit::nccl {

class Communicator;

/// Move-only; frees its table on destruction (the copies must have run by then: the table is
/// read by the kernel).
class CopyBatch {
 public:
  CopyBatch() = default;
  CopyBatch(CopyBatch&& other) noexcept
      : table_(std::exchange(other.table_, nullptr)),
        count_(std::exchange(other.count_, 0)),
        chunks_(std::exchange(other.chunks_, 0)),
        bytes_(std::exchange(other.bytes_, 0)),
        chunk_bytes_(other.chunk_bytes_),
        device_(other.device_) {}
  CopyBatch& operator=(CopyBatch&& other) noexcept {
    if (this != &other) {
      release();
      table_ = std::exchange(other.table_, nullptr);
      count_ = std::exchange(other.count_, 0);
      chunks_ = std::exchange(other.chunks_, 0);
      bytes_ = std::exchange(other.bytes_, 0);
      chunk_bytes_ = other.chunk_bytes_;
      device_ = other.device_;
    }
    return *this;
  }
  CopyBatch(const CopyBatch&) = delete;
  CopyBatch& operator=(const CopyBatch&) = delete;
  ~CopyBatch() { release(); }

  /// Copies in the batch (empty ones dropped) and the bytes they move.
  std::size_t size() const { return count_; }
  std::uint64_t bytes() const { return bytes_; }
  int device() const { return device_; }

 private:
  friend class Communicator;
  void release() noexcept {
    if (table_ == nullptr) return;
    DeviceGuard guard(device_);
    if (cudaFree(std::exchange(table_, nullptr)) != cudaSuccess) {
      (void)cudaGetLastError();
      log_warn("ncclkit: CopyBatch: cudaFree of its table failed on GPU " + std::to_string(device_));
    }
  }

  detail::DeviceCopy* table_ = nullptr;
  std::size_t count_ = 0;
  std::uint64_t chunks_ = 0;
  std::uint64_t bytes_ = 0;
  std::uint64_t chunk_bytes_ = 0;
  int device_ = 0;
};

}  // namespace ncclkit::nccl
