#pragma once
/// CommHandle: the NCCL handles of one communicator, shared by the thread that issues work on
/// them and the watchdog that may abort them; the bracket that marks the issuing thread as
/// inside an NCCL call; the kernels that must stop before an abort. Internal: part of the
/// watchdog (ncclkit/nccl/detail/watchdog.hpp); users include ncclkit/nccl/communicator.hpp.
///
/// Host code only: compiles with g++ given the CUDA and NCCL include folders.

#include <cuda_runtime_api.h>  // cudaEvent_t, cudaEventQuery, cudaMemcpyAsync, cudaSetDevice, capture modes
#include <nccl.h>              // ncclComm_t

#include <atomic>   // std::atomic, std::atomic_thread_fence
#include <chrono>   // std::chrono
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t, std::int64_t
#include <mutex>    // std::mutex, std::timed_mutex, std::lock_guard
#include <string>   // std::string, std::to_string
#include <thread>   // std::this_thread::sleep_for
#include <vector>   // std::vector, std::erase_if

#include "ncclkit/core/detail/coarse_clock.hpp"
#include "ncclkit/core/log.hpp"

namespace ncclkit::nccl::detail {

using Clock = std::chrono::steady_clock;

/// How long an abort waits for the kernels that read memory windows to stop (CommHandle).
inline constexpr std::chrono::milliseconds kWindowKernelStop{1000};

/// The NCCL handles shared by the communicator (which issues work on them) and its watchdog
/// (which may abort them). Every NCCL call on them holds `mutex`, so that an abort never runs
/// while another thread is inside NCCL with the same handle, except when that thread is stuck
/// there (see handle_failure, detail/watchdog_thread.hpp).
///
/// Two NCCL communicators per ncclkit communicator, because NCCL's non-blocking mode costs
/// about 90 us per collective (NCCL 2.28 launches every group of a non-blocking communicator
/// from a helper thread), against about 8 us for a blocking one:
///   - `control`, non-blocking: init, split and finalize, each polled and so bounded;
///   - `comm`, blocking, split from `control` (bounded too, since its parent is non-blocking):
///     every collective. A blocking call that does not return (connection setup waiting for a
///     dead peer) is caught through `issuing_since`.
struct CommHandle {
  std::timed_mutex mutex;
  ncclComm_t control = nullptr;     ///< non-blocking
  ncclComm_t comm = nullptr;        ///< blocking; collectives
  bool aborted = false;             ///< guarded by mutex; both handles are gone when true
  std::atomic<int> open_groups{0};  ///< >0: ops of this comm sit in an open ncclGroupStart
  /// Steady-clock nanoseconds at which the issuing thread entered an NCCL call (0: not in one),
  /// and what that call is. The watchdog and store link threads read them while the issuing
  /// thread rewrites them for its next call: atomics (relaxed; plain stores on x86), the
  /// fields read between two loads of issuing_since (see blocked_call, detail/work_record.hpp).
  std::atomic<std::int64_t> issuing_since{0};
  std::atomic<std::uint64_t> issuing_seq{0};
  std::atomic<const char*> issuing_operation{""};
  std::atomic<std::size_t> issuing_bytes{0};

  /// Marks entry into an NCCL call that may block (written by the issuing thread only).
  /// Returns the time of entry (the issue time the watchdog measures the call from; a coarse
  /// stamp, core/detail/coarse_clock.hpp: cheap on every host, and at most a tick early).
  std::chrono::steady_clock::time_point enter(std::uint64_t seq, const char* operation, std::size_t bytes) {
    // The last leave()'s store of 0 before the fields' new values (free on x86; on weaker
    // CPUs a reader could otherwise see new fields under the old issuing_since).
    std::atomic_thread_fence(std::memory_order_release);
    issuing_seq.store(seq, std::memory_order_relaxed);
    issuing_operation.store(operation, std::memory_order_relaxed);
    issuing_bytes.store(bytes, std::memory_order_relaxed);
    const auto now = ncclkit::detail::coarse_now();
    issuing_since.store(std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count(),
                        std::memory_order_release);
    return now;
  }
  void leave() { issuing_since.store(0, std::memory_order_release); }

  /// A kernel that reads this communicator's memory windows by plain loads and stores (the
  /// fused compressed reduction, nccl/compressed_reduce.hpp). ncclCommAbort unmaps the windows:
  /// a kernel still spinning on one then faults, and a fault poisons the whole CUDA context
  /// (no later allocation or copy works in the process). So before an abort each is asked to
  /// stop and waited for (stop_window_kernels).
  struct WindowKernel {
    int* stop = nullptr;            ///< device memory the kernel polls; nonzero: return
    const int* raised = nullptr;    ///< pinned host memory holding 1: what is copied into `stop`
    cudaStream_t stream = nullptr;  ///< a non-blocking stream of the workspace's, to raise `stop` on
    cudaEvent_t landed = nullptr;   ///< recorded on `stream` after the copy into `stop`
    cudaEvent_t done = nullptr;     ///< recorded after the kernel's last launch
    int device = 0;
  };
  void add_window_kernel(WindowKernel kernel) {
    std::lock_guard lock(window_kernels_mutex);
    window_kernels.push_back(kernel);
  }
  void remove_window_kernel(const int* stop) {
    std::lock_guard lock(window_kernels_mutex);
    std::erase_if(window_kernels, [&](const WindowKernel& k) { return k.stop == stop; });
  }
  /// Raises every window kernel's stop flag, then waits, at most `bound` in all, for each flag
  /// to land and for each kernel's last launch to end. A kernel still queued behind a hung
  /// collective cannot end before the abort; it finds its flag raised when it starts and
  /// returns before it touches a window. The flag lives in device memory (every block reads it
  /// at every launch; reads of host memory there cost about 0.1 ms a launch) and is raised by a
  /// copy from pinned memory on a stream of the workspace's own, apart from the streams that
  /// hold the kernel or a hung collective. Where a flag has not landed within the bound (a GPU
  /// whose streams share one hardware queue, CUDA_DEVICE_MAX_CONNECTIONS=1), a warning says that
  /// a queued kernel may still fault after the abort. The calling thread's device is restored.
  void stop_window_kernels(std::chrono::milliseconds bound) noexcept {
    std::lock_guard lock(window_kernels_mutex);
    if (window_kernels.empty()) return;
    int previous_device = -1;
    if (cudaGetDevice(&previous_device) != cudaSuccess) (void)cudaGetLastError();
    // A graph captured in global mode by another thread would refuse the copy.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) (void)cudaGetLastError();
    std::vector<bool> raised(window_kernels.size(), false);
    for (std::size_t i = 0; i < window_kernels.size(); ++i) {
      const WindowKernel& k = window_kernels[i];
      raised[i] = cudaSetDevice(k.device) == cudaSuccess &&
                  cudaMemcpyAsync(k.stop, k.raised, sizeof(int), cudaMemcpyHostToDevice, k.stream) == cudaSuccess &&
                  cudaEventRecord(k.landed, k.stream) == cudaSuccess;
      if (!raised[i]) {
        log_warn(std::string("ncclkit: raising a fused kernel's stop flag failed (") +
                 cudaGetErrorString(cudaGetLastError()) + "); a kernel still queued may fault after the abort");
      }
    }
    const auto deadline = Clock::now() + bound;
    const auto wait_for = [&](cudaEvent_t event) {
      for (;;) {
        const cudaError_t state = cudaEventQuery(event);
        if (state != cudaErrorNotReady) {
          if (state != cudaSuccess) (void)cudaGetLastError();
          return state == cudaSuccess;
        }
        if (Clock::now() >= deadline) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    };
    for (std::size_t i = 0; i < window_kernels.size(); ++i) {
      const WindowKernel& k = window_kernels[i];
      if (cudaSetDevice(k.device) != cudaSuccess) (void)cudaGetLastError();
      if (raised[i] && !wait_for(k.landed)) {
        log_warn("ncclkit: a fused kernel's stop flag did not reach GPU " + std::to_string(k.device) + " within " +
                 std::to_string(bound.count()) + " ms; a kernel still queued may fault after the abort");
      }
      (void)wait_for(k.done);
    }
    if (cudaThreadExchangeStreamCaptureMode(&mode) != cudaSuccess) (void)cudaGetLastError();
    if (previous_device >= 0 && cudaSetDevice(previous_device) != cudaSuccess) (void)cudaGetLastError();
  }

 private:
  std::mutex window_kernels_mutex;
  std::vector<WindowKernel> window_kernels;
};

}  // namespace ncclkit::nccl::detail
