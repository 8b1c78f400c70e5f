#pragma once
/// Move-only RAII owners of CUDA streams and events, a scoped current-device switch, and
/// StreamArg, the stream argument of the communicator's calls.
///
/// Host code only: compiles with g++ given the CUDA include folder (link cudart).

#include <cuda_runtime_api.h>  // cudaStream_t, cudaEvent_t, cudaSetDevice, ...

#include <string>   // std::string, std::to_string
#include <utility>  // std::exchange

#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/checked_pointers.hpp"

namespace ncclkit::nccl {

/// Number of GPUs this process sees (0 when none or when the driver is missing). Initialises
/// CUDA: call it only after forking workers.
inline int visible_device_count() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return count;
}

/// Makes `device` current for the scope and restores the previous device at its end. Does
/// nothing (not even a driver call) when `device` is already current.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    NCCLKIT_CUDA_CHECK(cudaGetDevice(&previous_));
    if (previous_ != device) {
      const cudaError_t status = cudaSetDevice(device);
      if (status != cudaSuccess) check_cuda(status, "cudaSetDevice(" + std::to_string(device) + ")");
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_ && cudaSetDevice(previous_) != cudaSuccess) {
      (void)cudaGetLastError();
      log_warn("DeviceGuard: could not switch back to GPU " + std::to_string(previous_));
    }
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = 0;
  bool switched_ = false;
};

/// Whether `s` is a handle that names a default stream, chosen where it is used: the legacy
/// stream (null, cudaStreamLegacy) or the per-thread one (cudaStreamPerThread), both the
/// current device's, the latter also the calling thread's. Such a handle is no one stream.
inline bool is_default_stream_handle(cudaStream_t s) {
  return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread;
}

/// An owned CUDA stream on one device. Created non-blocking with respect to the legacy
/// default stream (work on stream 0 does not implicitly order against it).
class Stream {
 public:
  Stream() = default;
  /// Creates a stream on `device` with `priority` (lower numbers run first; CUDA clamps values
  /// outside cudaDeviceGetStreamPriorityRange).
  explicit Stream(int device, int priority = 0) : device_(device) {
    DeviceGuard guard(device);
    check_cuda(cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, priority),
               "cudaStreamCreateWithPriority on GPU " + std::to_string(device));
  }
  ~Stream() { reset(); }
  Stream(Stream&& other) noexcept : stream_(std::exchange(other.stream_, nullptr)), device_(other.device_) {}
  Stream& operator=(Stream&& other) noexcept {
    if (this != &other) {
      reset();
      stream_ = std::exchange(other.stream_, nullptr);
      device_ = other.device_;
    }
    return *this;
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  cudaStream_t get() const { return stream_; }
  operator cudaStream_t() const { return stream_; }  // NOLINT: a stream handle is what callers want
  int device() const { return device_; }
  explicit operator bool() const { return stream_ != nullptr; }

 private:
  void reset() noexcept {
    if (stream_ == nullptr) return;
    // Communicators forget that they checked this handle (detail/checked_pointers.hpp).
    detail::note_stream_destroyed();
    // Destroying a stream with work pending is allowed: CUDA releases it once the work ends.
    if (cudaStreamDestroy(std::exchange(stream_, nullptr)) != cudaSuccess) {
      (void)cudaGetLastError();
      log_warn("Stream: cudaStreamDestroy failed on GPU " + std::to_string(device_));
    }
  }

  cudaStream_t stream_ = nullptr;
  int device_ = -1;
};

/// An owned CUDA event. Created without timing by default (cheaper to record and query);
/// ask for timing to measure elapsed time between two events.
class Event {
 public:
  Event() = default;
  explicit Event(int device, bool timing = false) : device_(device) {
    DeviceGuard guard(device);
    check_cuda(cudaEventCreateWithFlags(&event_, timing ? cudaEventDefault : cudaEventDisableTiming),
               "cudaEventCreateWithFlags on GPU " + std::to_string(device));
  }
  ~Event() { reset(); }
  Event(Event&& other) noexcept : event_(std::exchange(other.event_, nullptr)), device_(other.device_) {}
  Event& operator=(Event&& other) noexcept {
    if (this != &other) {
      reset();
      event_ = std::exchange(other.event_, nullptr);
      device_ = other.device_;
    }
    return *this;
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  /// Marks the work issued so far on `stream` (which must belong to the event's device).
  /// cudaStreamLegacy, what Communicator::default_stream() returns, means the legacy stream of
  /// the event's GPU, whatever device is current; null and cudaStreamPerThread keep CUDA's
  /// meaning (the current device's), so a mismatch stays an error rather than a silent race.
  void record(cudaStream_t stream) {
    if (stream == cudaStreamLegacy) {
      DeviceGuard guard(device_);
      NCCLKIT_CUDA_CHECK(cudaEventRecord(event_, stream));
      return;
    }
    NCCLKIT_CUDA_CHECK(cudaEventRecord(event_, stream));
  }
  /// Whether the marked work has finished; throws CudaError when it failed.
  bool ready() const {
    cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not-ready is not sticky, but keep the last-error slot clean
      return false;
    }
    NCCLKIT_CUDA_CHECK(status);
    return true;
  }
  /// Milliseconds between `start` and this event (both timing events, both completed).
  float elapsed_ms_since(const Event& start) const {
    float ms = 0.0f;
    NCCLKIT_CUDA_CHECK(cudaEventElapsedTime(&ms, start.event_, event_));
    return ms;
  }

  cudaEvent_t get() const { return event_; }
  operator cudaEvent_t() const { return event_; }  // NOLINT
  int device() const { return device_; }
  explicit operator bool() const { return event_ != nullptr; }

 private:
  void reset() noexcept {
    if (event_ == nullptr) return;
    if (cudaEventDestroy(std::exchange(event_, nullptr)) != cudaSuccess) {
      (void)cudaGetLastError();
      log_warn("Event: cudaEventDestroy failed on GPU " + std::to_string(device_));
    }
  }

  cudaEvent_t event_ = nullptr;
  int device_ = -1;
};

/// The stream argument of every communicator call: a CUDA stream, or none (the default), which
/// means the communicator's default_stream(). A given `nullptr` or `cudaStreamPerThread` means
/// what CUDA says: a default stream of the *current* device.
class StreamArg {
 public:
  StreamArg() = default;
  StreamArg(cudaStream_t stream) : stream_(stream), given_(true) {}               // NOLINT: implicit on purpose
  StreamArg(const nccl::Stream& stream) : stream_(stream.get()), given_(true) {}  // NOLINT
  cudaStream_t resolve(cudaStream_t fallback) const { return given_ ? stream_ : fallback; }
  bool given() const { return given_; }

 private:
  cudaStream_t stream_ = nullptr;
  bool given_ = false;
};

}  // namespace ncclkit::nccl
