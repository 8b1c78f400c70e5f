#pragma once
/// The two CUDA calls every collective makes besides NCCL's own, the capture query and the
/// completion event's record, made through the driver API (cuStreamIsCapturing, cuEventRecord)
/// instead of the runtime's wrappers around them. Internal: the issue path and the watchdog
/// use it.
///
/// Why: one thread driving several GPUs (LocalGroup, perf_nccl -g) makes both calls once per
/// GPU per step, so what the runtime adds to each call counts several times in a step
/// (docs/dev/perf-nccl.md, bench/bench_completion_marks.cu). The functions are resolved once,
/// through cudaGetDriverEntryPointByVersion, so nothing links libcuda.
///
/// Same semantics as the runtime calls: a cudaStream_t is a CUstream and a cudaEvent_t a
/// CUevent, and the capture states have the same values. The handles that name a default
/// stream (null, cudaStreamLegacy, cudaStreamPerThread) mean "the current device's", and the
/// null handle's meaning depends on how the caller was compiled (--default-stream
/// per-thread): they go through the runtime. So does everything when an entry point is
/// missing, and any call the driver fails (the runtime then repeats it and says what is wrong
/// in its own error codes). Each Watchdog looks the entry points up when it is made, so that
/// the lookup never happens during a graph capture.
///
/// Host code only: compiles with g++ given the CUDA include folder.

#include <cuda.h>              // CUresult, CUstream, CUevent, CUstreamCaptureStatus
#include <cuda_runtime_api.h>  // cudaEventRecord, cudaStreamIsCapturing, cudaGetDriverEntryPointByVersion

#include "ncclkit/nccl/stream.hpp"  // is_default_stream_handle

namespace ncclkit::nccl::detail {

struct DriverCalls {
  CUresult (*event_record)(CUevent, CUstream) = nullptr;
  CUresult (*stream_is_capturing)(CUstream, CUstreamCaptureStatus*) = nullptr;

  DriverCalls() {
#if CUDART_VERSION >= 12050
    event_record = reinterpret_cast<decltype(event_record)>(resolve("cuEventRecord"));
    stream_is_capturing = reinterpret_cast<decltype(stream_is_capturing)>(resolve("cuStreamIsCapturing"));
#endif
  }

 private:
#if CUDART_VERSION >= 12050
  static void* resolve(const char* symbol) {
    void* function = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    // The signatures above are those of CUDA 12.0 and later. The legacy-stream variants, in
    // every translation unit alike: only real stream handles reach them, and for those the
    // per-thread-stream variants are the same.
    const cudaError_t status =
        cudaGetDriverEntryPointByVersion(symbol, &function, 12000, cudaEnableLegacyStream, &found);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      return nullptr;
    }
    return found == cudaDriverEntryPointSuccess ? function : nullptr;
  }
#endif
};

inline const DriverCalls& driver_calls() {
  static const DriverCalls calls;
  return calls;
}

/// cudaEventRecord(event, stream), through the driver where it can.
inline cudaError_t record_event(cudaEvent_t event, cudaStream_t stream) {
  const auto& calls = driver_calls();
  if (calls.event_record != nullptr && !is_default_stream_handle(stream) &&
      calls.event_record(event, stream) == CUDA_SUCCESS) {
    return cudaSuccess;
  }
  return cudaEventRecord(event, stream);
}

/// cudaStreamIsCapturing(stream, status), through the driver where it can.
inline cudaError_t stream_is_capturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  const auto& calls = driver_calls();
  CUstreamCaptureStatus state = CU_STREAM_CAPTURE_STATUS_NONE;
  if (calls.stream_is_capturing != nullptr && !is_default_stream_handle(stream) &&
      calls.stream_is_capturing(stream, &state) == CUDA_SUCCESS) {
    *status = static_cast<cudaStreamCaptureStatus>(state);
    return cudaSuccess;
  }
  return cudaStreamIsCapturing(stream, status);
}

constexpr bool same_capture_state(CUstreamCaptureStatus driver, cudaStreamCaptureStatus runtime) {
  return static_cast<int>(driver) == static_cast<int>(runtime);
}
static_assert(same_capture_state(CU_STREAM_CAPTURE_STATUS_NONE, cudaStreamCaptureStatusNone) &&
                  same_capture_state(CU_STREAM_CAPTURE_STATUS_ACTIVE, cudaStreamCaptureStatusActive) &&
                  same_capture_state(CU_STREAM_CAPTURE_STATUS_INVALIDATED, cudaStreamCaptureStatusInvalidated),
              "the driver's and the runtime's capture states are expected to have the same values");

}  // namespace ncclkit::nccl::detail
