#pragma once
/// A per-communicator memory of the last buffer addresses (up to kSlots) that
/// cudaPointerGetAttributes found to be device memory of the communicator's GPU, so that a
/// training loop, which passes the same gradient buffers every step, pays for that query once
/// per buffer instead of once per call (the query is the largest part of the argument checks;
/// docs/performance.md, "Host cost per NCCL call"). Internal: used by nccl::Communicator.
///
/// Size and lookup. 64 addresses: a loop over more buffers than the memory holds misses on
/// every call (the oldest goes first), and a trainer's buckets, or the layers of a model
/// reduced one by one, easily number dozens. A lookup is a hash
/// table's (about one compare, whatever the order of the calls), not a scan of the 64.
///
/// Forgetting. Memory freed through ncclkit (DeviceBuffer, Communicator::deallocate) bumps a
/// process-wide generation, which empties every memory at its next use. Memory the caller
/// frees with cudaFree directly is not seen: a remembered address then passes unchecked until
/// it leaves the memory (kSlots newer addresses). What that can let through is narrow: CUDA
/// keeps freed device addresses reserved for device allocations, so the address can only be
/// freed memory (NCCL then fails with an illegal address, which the watchdog reports) or a new
/// device allocation, normally of the same GPU.
///
/// The same memory, on a generation of its own, holds the stream handles that
/// cudaStreamGetDevice found to be of the communicator's GPU (unremembered, a caller's stream
/// costs +0.2 to +0.65 us per call for that query and the capture-mode switch around it).
/// Streams destroyed through ncclkit (nccl::Stream) bump it. A
/// stream the caller destroys with cudaStreamDestroy is not seen: should a new stream of
/// another GPU get the same handle, the check lets it through, and the call fails further on
/// with a CUDA error (NCCL's launch, or the completion event's record) instead of the misuse
/// message.
///
/// Host code only: needs nothing from CUDA.

#include <atomic>   // std::atomic
#include <bit>      // std::countr_zero, std::has_single_bit
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t, std::uintptr_t

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
  static constexpr std::size_t kSlots = 64;

  /// Forgets everything when `generation` moves (freed_generation() for buffers,
  /// destroyed_stream_generation() for streams).
  explicit CheckedPointers(const std::atomic<std::uint64_t>& generation = freed_generation())
      : source_(&generation), generation_(generation.load(std::memory_order_relaxed)) {}

  /// Whether `pointer` was found good, and the generation has not moved since.
  bool contains(const void* pointer) {
    if (pointer == nullptr) return false;  // empty entries hold null
    refresh();
    return table_[find(pointer)] == pointer;
  }
  /// Remembers `pointer`, forgetting the oldest address when kSlots are held.
  void insert(const void* pointer) {
    if (pointer == nullptr) return;
    refresh();
    if (table_[find(pointer)] == pointer) return;  // held already
    if (order_[next_] != nullptr) erase(order_[next_]);
    order_[next_] = pointer;
    next_ = (next_ + 1) % kSlots;
    table_[find(pointer)] = pointer;
  }
  void clear() {
    for (const void*& entry : order_) entry = nullptr;
    for (const void*& entry : table_) entry = nullptr;
    next_ = 0;
  }

 private:
  /// Open addressing with linear probing, at most half full.
  static constexpr std::size_t kTable = 2 * kSlots;
  static constexpr int kTableBits = std::countr_zero(kTable);
  static_assert(std::has_single_bit(kTable) && kTableBits >= 1, "the table's size is a power of two, at least 2");

  /// Where `pointer` hashes to (Fibonacci hashing: the multiply spreads even neighbouring
  /// addresses over the table).
  static std::size_t home(const void* pointer) {
    const auto bits = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(pointer));
    return static_cast<std::size_t>((bits * 0x9E3779B97F4A7C15ull) >> (64 - kTableBits));
  }
  /// The entry holding `pointer`, or the empty entry where it would go. (The table is never
  /// more than half full; the bound on the probes only keeps misuse, two threads issuing on
  /// one communicator at once, from looping forever.)
  std::size_t find(const void* pointer) const {
    std::size_t i = home(pointer);
    for (std::size_t probes = 0; probes < kTable && table_[i] != nullptr && table_[i] != pointer; ++probes) {
      i = (i + 1) & (kTable - 1);
    }
    return i;
  }
  /// Removes `pointer` from the table, moving later entries of its probe run back so that
  /// every entry stays reachable from its home.
  void erase(const void* pointer) {
    std::size_t hole = find(pointer);
    if (table_[hole] != pointer) return;
    table_[hole] = nullptr;
    for (std::size_t i = (hole + 1) & (kTable - 1); table_[i] != nullptr; i = (i + 1) & (kTable - 1)) {
      const std::size_t want = home(table_[i]);
      // The entry at i may stay unless the hole lies on its way from `want` to i.
      const bool hole_between = hole <= i ? (want <= hole || want > i) : (want <= hole && want > i);
      if (hole_between) {
        table_[hole] = table_[i];
        table_[i] = nullptr;
        hole = i;
      }
    }
  }
  void refresh() {
    const std::uint64_t now = source_->load(std::memory_order_relaxed);
    if (now != generation_) {
      clear();
      generation_ = now;
    }
  }

  const std::atomic<std::uint64_t>* source_;
  const void* order_[kSlots] = {};  ///< the held addresses, in the order they came
  const void* table_[kTable] = {};  ///< the same addresses, for lookup
  std::size_t next_ = 0;            ///< the entry of order_ the next insert takes (the oldest, once full)
  std::uint64_t generation_;
};

}  // namespace ncclkit::nccl::detail
