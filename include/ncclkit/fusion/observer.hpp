#pragma once
/// What watches a `GradientSync` step: the phases of a step (a bucket ready, packed, reduced,
/// ...) as the sync and its reducer issue them, and the step's begin and end. The timeline
/// (fusion/timeline.hpp) and the NVTX ranges of Nsight Systems are observers; none is made
/// where nothing watches, and then a phase costs a test of an empty list.

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t
#include <memory>   // std::unique_ptr
#include <span>     // std::span
#include <chrono>   // std::chrono::steady_clock
#include <utility>  // std::move
#include <vector>   // std::vector

#include "ncclkit/core/backend.hpp"

namespace ncclkit::fusion {

/// Work of a step that observers see, bracketed by a begin and an end mark on the stream that
/// runs it (kReady: a begin only, the instant the compute stream had written a bucket's
/// gradients). kBackward spans the step's first mark_ready to the start of `finish` on the
/// compute stream. kPack and kUnpack (loose tensors), and kReady are per bucket; the others are
/// per piece of the reducer (BucketReducer::pieces()): what a reducer that encodes, reduces,
/// counts non-finite results, reduces again or decodes marks; kGather is the second half of a
/// piece reduced in two (GradientSyncOptions::defer_gather), whose kReduce is then the first.
enum class Phase : std::uint8_t { kBackward, kReady, kPack, kEncode, kReduce, kCount, kRerun, kDecode, kUnpack, kGather };
inline constexpr std::size_t kPhaseCount = 10;

/// Host times of one bucket in a step (steady_clock), for seeing the overlap: when its last
/// tensor was marked ready (or `finish` zeroed it) and when its reduction was issued. When the
/// reduction ends is the streams' business and is not recorded here.
struct BucketTiming {
  std::chrono::steady_clock::time_point ready;
  std::chrono::steady_clock::time_point launched;
};

/// One observer of a GradientSync. Every hook runs on the thread that drives the sync.
template <Backend B>
class SyncObserver {
 public:
  using Stream = typename B::Stream;
  virtual ~SyncObserver() = default;
  /// A mark_ready on `stream` (the compute stream).
  virtual void on_mark(Stream stream) { (void)stream; }
  /// Work of `phase` for bucket or piece `index` is issued next on `stream` (`end` false), or
  /// was just issued there (`end` true).
  virtual void on_phase(Phase phase, std::size_t index, bool end, Stream stream) = 0;
  /// `finish(stream)` begins (every call: one that throws for missing tensors is followed by
  /// another).
  virtual void on_finish_begin(Stream stream) { (void)stream; }
  /// `finish` completed the step; `timings` are its buckets' host times.
  virtual void on_finish_end(std::span<const BucketTiming> timings) { (void)timings; }
  /// Writes what is kept, waiting for the last step's work. Never throws.
  virtual void flush() noexcept {}
};

/// The observers of one sync, called in the order they were added.
template <Backend B>
class Observers {
 public:
  using Stream = typename B::Stream;
  void add(std::unique_ptr<SyncObserver<B>> observer) {
    if (observer) list_.push_back(std::move(observer));
  }
  bool empty() const { return list_.empty(); }
  void phase(Phase phase, std::size_t index, bool end, Stream stream) {
    for (auto& o : list_) o->on_phase(phase, index, end, stream);
  }
  void mark(Stream stream) {
    for (auto& o : list_) o->on_mark(stream);
  }
  void finish_begin(Stream stream) {
    for (auto& o : list_) o->on_finish_begin(stream);
  }
  void finish_end(std::span<const BucketTiming> timings) {
    for (auto& o : list_) o->on_finish_end(timings);
  }
  void flush() noexcept {
    for (auto& o : list_) o->flush();
  }
  /// The first observer of type `T`, or null.
  template <class T>
  T* find() const {
    for (auto& o : list_) {
      if (auto* t = dynamic_cast<T*>(o.get())) return t;
    }
    return nullptr;
  }

 private:
  std::vector<std::unique_ptr<SyncObserver<B>>> list_;
};

}  // namespace ncclkit::fusion
