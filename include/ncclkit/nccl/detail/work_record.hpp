#pragma once
/// WorkRecord: collectives issued together and the event that marks their end, what the
/// watchdog keeps in flight; and blocked_call, the NCCL call the issuing thread is inside, as
/// such a record. Internal: part of the watchdog (ncclkit/nccl/detail/watchdog.hpp).
///
/// Host code only: compiles with g++ given the CUDA and NCCL include folders.

#include <cuda_runtime_api.h>  // cudaEvent_t, cudaStream_t

#include <atomic>    // std::atomic_thread_fence
#include <chrono>    // std::chrono
#include <cstddef>   // std::size_t
#include <cstdint>   // std::uint64_t, std::int64_t
#include <optional>  // std::optional

#include "ncclkit/nccl/detail/comm_handle.hpp"

namespace ncclkit::nccl::detail {

/// Collectives issued together (one, one NCCL group, or a burst: single collectives and
/// one-stream groups issued back to back on one stream) and the event that marks their end.
struct WorkRecord {
  std::uint64_t first_seq = 0;
  std::uint64_t last_seq = 0;
  const char* operation = "";  ///< the first collective's
  int operations = 1;          ///< >1 for a group or a burst
  std::size_t bytes = 0;       ///< the first collective's, or the first group's total
  Clock::time_point issued{};  ///< the first collective's
  cudaEvent_t event = nullptr;
  bool verified = false;          ///< synchronize() already asked the store about it
  cudaStream_t stream = nullptr;  ///< where `event` was recorded
  bool burst = false;             ///< may grow: work issued back to back on one stream (Watchdog::track's `merge`)
  bool merged = false;            ///< has grown: later work joined it (its members' stamps differ)
};

/// The NCCL call the issuing thread is inside (see CommHandle::enter), as a record; none when
/// it is not in one.
/// A call that lasts is what matters here: when the issuing thread moved on to another call
/// while the fields were read (issuing_since changed), the fields may mix two calls, and
/// the newer call is reported as not blocked yet (it has just begun). Two calls begun within
/// one tick of the coarse clock look alike; a mix of those names a call that began then too.
inline std::optional<WorkRecord> blocked_call(const CommHandle& handle) {
  const std::int64_t since = handle.issuing_since.load(std::memory_order_acquire);
  if (since == 0) return std::nullopt;
  const std::uint64_t seq = handle.issuing_seq.load(std::memory_order_relaxed);
  const char* operation = handle.issuing_operation.load(std::memory_order_relaxed);
  const std::size_t bytes = handle.issuing_bytes.load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (handle.issuing_since.load(std::memory_order_relaxed) != since) return std::nullopt;
  return WorkRecord{seq, seq, operation, 1, bytes, Clock::time_point(std::chrono::nanoseconds(since)), nullptr};
}

}  // namespace ncclkit::nccl::detail
