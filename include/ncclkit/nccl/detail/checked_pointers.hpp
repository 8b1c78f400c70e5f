#pragma once
/// A per-communicator memory of the last few buffer addresses that cudaPointerGetAttributes
/// found to be device memory of the communicator's GPU, so that a training loop, which passes
/// the same gradient buffers every step, pays for that query once per buffer instead of once
/// per call (measured in docs/perf-nccl.md: the query is the largest part of the argument
/// checks). Internal: used by nccl::Communicator.
///
/// Forgetting. Memory freed through ncclkit (DeviceBuffer, Communicator::deallocate) bumps a
/// process-wide generation, which empties every memory at its next use. Memory the caller
/// frees with cudaFree directly is not seen: a remembered address then passes unchecked until
/// it leaves the memory (8 newer addresses). What that can let through is narrow: CUDA keeps
/// freed device addresses reserved for device allocations, so the address can only be freed
/// memory (NCCL then fails with an illegal address, which the watchdog reports) or a new
/// device allocation, normally of the same GPU.
///
/// The same memory, on a generation of its own, holds the stream handles that
/// cudaStreamGetDevice found to be of the communicator's GPU (a caller's stream passed every
/// call cost +0.2 to +0.65 us per call for that query and the capture-mode switch around it:
/// docs/perf-nccl.md, runs 26-29). Streams destroyed through ncclkit (nccl::Stream) bump it. A
/// stream the caller destroys with cudaStreamDestroy is not seen: should a new stream of
/// another GPU get the same handle, the check lets it through, and the call fails further on
/// with a CUDA error (NCCL's launch, or the completion event's record) instead of the misuse
/// message.
///
/// Host code only: needs nothing from CUDA.

#include <atomic>   // std::atomic
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t

namespace ncclkit::nccl::detail {

/// Bumped whenever ncclkit frees device memory.
inline std::atomic<std::uint64_t>& freed_generation() {
  static std::atomic<std::uint64_t> generation{0};
  return generation;
}
inline void note_device_memory_freed() { freed_generation().fetch_add(1, std::memory_order_relaxed); }

/// Bumped whenever ncclkit destroys a stream.
inline std::atomic<std::uint64_t>& destroyed_stream_generation() {
  static std::atomic<std::uint64_t> generation{0};
  return generation;
}
inline void note_stream_destroyed() { destroyed_stream_generation().fetch_add(1, std::memory_order_relaxed); }

class CheckedPointers {
 public:
  static constexpr std::size_t kSlots = 8;

  /// Forgets everything when `generation` moves (freed_generation() for buffers,
  /// destroyed_stream_generation() for streams).
  explicit CheckedPointers(const std::atomic<std::uint64_t>& generation = freed_generation())
      : source_(&generation), generation_(generation.load(std::memory_order_relaxed)) {}

  /// Whether `pointer` was found good, and the generation has not moved since.
  bool contains(const void* pointer) {
    if (pointer == nullptr) return false;  // empty slots hold null
    refresh();
    for (const void* slot : slots_) {
      if (slot == pointer) return true;
    }
    return false;
  }
  /// Remembers `pointer`, replacing the oldest entry when full.
  void insert(const void* pointer) {
    refresh();
    slots_[next_] = pointer;
    next_ = (next_ + 1) % kSlots;
  }
  void clear() {
    for (const void*& slot : slots_) slot = nullptr;
    next_ = 0;
  }

 private:
  void refresh() {
    const std::uint64_t now = source_->load(std::memory_order_relaxed);
    if (now != generation_) {
      clear();
      generation_ = now;
    }
  }

  const std::atomic<std::uint64_t>* source_;
  const void* slots_[kSlots] = {};
  std::size_t next_ = 0;
  std::uint64_t generation_;
};

}  // namespace ncclkit::nccl::detail
