#pragma once
/// Shutting NCCL communicators down without hanging: pending work gets the timeout, then a
/// bounded destroy or an abort. Internal: used by Communicator's destructor and LocalGroup's.

#include <cuda_runtime_api.h>  // cudaFree, cudaSetDevice
#include <nccl.h>              // ncclCommDestroy, ncclCommAbort, ncclCommFinalize

#include <algorithm>  // std::min
#include <chrono>     // std::chrono
#include <mutex>      // std::unique_lock
#include <string>     // std::string
#include <vector>     // std::vector, std::erase

#include "ncclkit/core/detail/bounded_call.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"
#include "ncclkit/nccl/group.hpp"

namespace ncclkit::nccl::detail {

/// Shuts communicators down together (a single-process group must finalise all of its
/// members before waiting for any). Never throws, never waits much past each one's timeout:
///   1. the watchdog stops;
///   2. collectives still in flight get the timeout to complete; then the blocking
///      communicator is destroyed or, if they did not complete, or completed only after a
///      peer check interval (a peer's abort may have released them; a blocking destroy
///      could then wait for peers that are gone), aborted. ncclCommDestroy may synchronise
///      with the peers to free resources, so it runs on a helper thread and is waited for at
///      most min(timeout, 10 s); past that it is left running (its resources leak) and the
///      peers are taken as gone;
///   3. the idle control communicators are finalised together (non-blocking, polled for at
///      most min(timeout, 10 s)), then destroyed, or aborted when that fails or when the
///      peers are gone.
inline void shutdown_all(std::vector<CommCore*> cores) noexcept {
  auto& group = group_state();
  std::vector<CommCore*> closing;
  for (auto* core : cores) {
    const bool stopped = core->watchdog.stop();
    auto& handle = core->handle();
    if (!stopped) {
      // Its thread is still running (an abort or a store call that takes long) and may yet
      // touch the handles: mark them aborted, so that it leaves them alone, and leak them.
      std::unique_lock lock(handle.mutex, std::defer_lock);
      const bool locked = lock.try_lock_for(std::chrono::seconds(2));
      if (locked && !handle.aborted) handle.aborted = true;
      log_error(core->who() +
                " destroyed while its watchdog thread was still busy after 10 s (a store that does "
                "not answer?); its NCCL communicators are leaked rather than freed under that thread");
      continue;
    }
    if (handle.open_groups.load() > 0) {
      // Its ops sit in an open group that will still reference the handle: leak it rather
      // than free it under NCCL's feet.
      log_error(core->who() + " destroyed with ops queued in an open group; its NCCL communicators are leaked");
      std::erase(group.members, core);
      continue;
    }
    if (handle.aborted) continue;
    closing.push_back(core);
  }
  const auto limit_of = [](const CommCore* core) {
    return std::min<std::chrono::milliseconds>(core->options.timeout, std::chrono::seconds(10));
  };
  std::vector<bool> peers_gone(closing.size(), false);
  for (std::size_t i = 0; i < closing.size(); ++i) {
    auto* core = closing[i];
    auto& handle = core->handle();
    if (handle.comm == nullptr) continue;
    const auto drained = core->watchdog.drain(Clock::now() + core->options.timeout);
    if (!drained.completed) {
      log_warn(core->who() + ": collectives still in flight at destruction after the timeout; aborting");
    } else if (drained.waited_long) {
      log_warn(core->who() +
               ": collectives in flight at destruction completed only after a long wait (possibly "
               "released by a peer's abort); aborting rather than waiting for the peers");
    }
    const bool clean = drained.completed && !drained.waited_long;
    ncclResult_t status = ncclSuccess;
    if (clean) {
      const auto returned = ncclkit::detail::call_bounded(
          [comm = handle.comm, device = core->device] {
            (void)cudaSetDevice(device);  // a fresh thread: NCCL frees on the current device
            return ncclCommDestroy(comm);
          },
          limit_of(core));
      if (returned) {
        status = *returned;
      } else {
        peers_gone[i] = true;
        log_warn(core->who() + ": ncclCommDestroy did not return within " + std::to_string(limit_of(core).count()) +
                 " ms (NCCL waits for the peers to free resources; one may have died or been stopped after its "
                 "last collective); left to finish in the background, its resources leak");
      }
    } else {
      handle.stop_window_kernels(kWindowKernelStop);
      status = ncclCommAbort(handle.comm);
    }
    if (status != ncclSuccess)
      log_warn(core->who() + ": destroying the NCCL communicator returned " + describe_nccl_error(status));
    handle.comm = nullptr;
  }
  std::vector<bool> finalizing(closing.size(), false);
  for (std::size_t i = 0; i < closing.size(); ++i) {
    if (closing[i]->handle().control == nullptr || peers_gone[i]) continue;
    const ncclResult_t status = ncclCommFinalize(closing[i]->handle().control);
    finalizing[i] = status == ncclSuccess || status == ncclInProgress;
  }
  for (std::size_t i = 0; i < closing.size(); ++i) {
    auto& handle = closing[i]->handle();
    if (handle.control == nullptr) continue;
    bool clean = finalizing[i];
    const auto deadline = Clock::now() + limit_of(closing[i]);
    ncclkit::detail::Backoff backoff({.first = std::chrono::microseconds(10), .cap = std::chrono::milliseconds(2)});
    while (clean) {
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(handle.control, &state) != ncclSuccess) state = ncclInternalError;
      if (state == ncclSuccess) break;
      if (state != ncclInProgress || Clock::now() >= deadline) {
        clean = false;
        log_warn(closing[i]->who() + ": finalize did not complete (" +
                 (state == ncclInProgress ? std::string("timeout") : describe_nccl_error(state)) + "); aborting");
        break;
      }
      backoff.sleep(deadline);
    }
    const ncclResult_t status = clean ? ncclCommDestroy(handle.control) : ncclCommAbort(handle.control);
    if (status != ncclSuccess && status != ncclInProgress) {
      log_warn(closing[i]->who() + ": " + (clean ? "ncclCommDestroy" : "ncclCommAbort") + " returned " +
               describe_nccl_error(status));
    }
    handle.control = nullptr;
  }
  for (auto* core : cores) {
    if (core->scratch != nullptr && cudaFree(core->scratch) != cudaSuccess) (void)cudaGetLastError();
    core->scratch = nullptr;
  }
}

}  // namespace ncclkit::nccl::detail
