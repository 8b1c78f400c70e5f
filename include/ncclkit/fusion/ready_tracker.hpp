#pragma once
/// `ReadyTracker`: one training step's bookkeeping of which tensors' gradients are ready and
/// which buckets of a `BucketPlan` may be launched now.
///
/// A bucket may launch when all its tensors are ready **and every earlier bucket of the plan
/// has launched**: every rank then issues its collectives in plan order, whatever order its
/// own tensors became ready in (NCCL needs the same order on every rank, or it deadlocks).
/// Pure host logic, no backend, O(1) amortised per call and no allocation on the `mark_ready`
/// path; a gradient synchroniser calls it from its hooks and launches what it returns.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>  // std::min
#include <cstddef>   // std::size_t, std::ptrdiff_t
#include <cstdint>   // std::uint32_t
#include <iterator>  // std::forward_iterator_tag, std::input_iterator_tag
#include <string>    // std::string, std::to_string
#include <utility>   // std::move
#include <vector>    // std::vector

#include "ncclkit/fusion/bucket_plan.hpp"
#include "ncclkit/fusion/layout.hpp"

namespace ncclkit::fusion {

/// Indices [first, last) of buckets to launch, in plan order:
/// `for (std::size_t b : range) launch(plan[b]);`. Always a contiguous run of the plan, since
/// buckets launch in plan order, so it needs no allocation. (Not std::ranges::iota_view: over
/// std::size_t its difference type is a 128-bit integer-like class that standard containers'
/// iterator-pair constructors reject in strict C++20 mode.)
struct BucketRange {
  /// Iterates the indices; a forward iterator whose reference is the index itself.
  class Iterator {
   public:
    using iterator_concept = std::forward_iterator_tag;
    using iterator_category = std::input_iterator_tag;  // dereferences to a value, not a reference
    using value_type = std::size_t;
    using difference_type = std::ptrdiff_t;
    using reference = std::size_t;
    using pointer = void;
    constexpr Iterator() = default;
    constexpr explicit Iterator(std::size_t at) : at_(at) {}
    constexpr std::size_t operator*() const { return at_; }
    constexpr Iterator& operator++() {
      ++at_;
      return *this;
    }
    constexpr Iterator operator++(int) {
      Iterator before = *this;
      ++at_;
      return before;
    }
    friend constexpr bool operator==(Iterator, Iterator) = default;

   private:
    std::size_t at_ = 0;
  };

  std::size_t first = 0;
  std::size_t last = 0;

  constexpr Iterator begin() const { return Iterator(first); }
  constexpr Iterator end() const { return Iterator(last); }
  constexpr bool empty() const { return first == last; }
  constexpr std::size_t size() const { return last - first; }
  friend constexpr bool operator==(BucketRange, BucketRange) = default;
};

/// What `finish` does about tensors never marked ready in a step.
enum class MissingTensors {
  /// Throw a ConfigError naming every one of them (the default: a tensor without a gradient is
  /// usually a bug, such as a parameter the forward pass no longer uses).
  kError,
  /// Return them; the caller fills their part of the buffer with zeros, then launches the
  /// buckets `finish` returns (PyTorch's find_unused_parameters has this effect).
  kReduceAsZeros,
};

/// Options of a `ReadyTracker`.
struct ReadyTrackerOptions {
  MissingTensors missing = MissingTensors::kError;
};

/// What `finish` returns.
struct FinishResult {
  /// Buckets still to launch, in plan order: empty when every tensor was marked (they have all
  /// launched from `mark_ready`); with kReduceAsZeros, the buckets the missing tensors held back.
  BucketRange launch;
  /// The tensors never marked this step, in registration order (kReduceAsZeros only): zero them
  /// before launching `launch`.
  std::vector<Slot> zeroed;
};

/// Per-step readiness of a plan's tensors. Copies what it needs of the plan (it owns a copy, so
/// the plan may go away). Not thread-safe: a caller whose hooks run on several threads
/// serialises the calls.
///
/// Zero-element tensors count as ready from the start of every step: they are in no bucket and
/// never hold one back, and `finish` never reports them. Marking one is still accepted (once
/// per step, like any tensor), so a loop that marks every parameter needs no special case and
/// a hook that fires twice is caught for them too.
class ReadyTracker {
 public:
  explicit ReadyTracker(BucketPlan plan, ReadyTrackerOptions options = {})
      : plan_(std::move(plan)), options_(options), marked_(plan_.tensor_count(), false) {
    initial_pending_.resize(plan_.size());
    for (std::size_t b = 0; b < plan_.size(); ++b) {
      initial_pending_[b] = static_cast<std::uint32_t>(plan_[b].slots.size());
    }
    pending_ = initial_pending_;
  }

  /// Records that `slot`'s gradient is complete and returns the buckets that may launch now
  /// (often none; several when this tensor completed the next bucket in plan order and later
  /// buckets were already complete). ConfigError, naming the tensor, for a slot out of range, a
  /// tensor already marked this step, or a call after `finish` without `reset`.
  BucketRange mark_ready(Slot slot) {
    check_slot(slot, "mark_ready");
    if (finished_) {
      throw ConfigError("ncclkit: ReadyTracker::mark_ready(\"" + plan_.name(slot) +
                        "\"): the step is finished; call reset() to start the next step");
    }
    if (marked_[slot.index]) {
      throw ConfigError("ncclkit: ReadyTracker::mark_ready(\"" + plan_.name(slot) + "\"): tensor \"" +
                        plan_.name(slot) + "\" (slot " + std::to_string(slot.index) +
                        ") was already marked ready this step; mark each tensor once per step (a hook "
                        "registered twice, or a parameter used twice, does this), and reset() between steps");
    }
    marked_[slot.index] = true;
    ++marked_count_;
    const auto bucket = plan_.bucket_of(slot);
    if (!bucket) return BucketRange{launched_, launched_};
    --pending_[*bucket];
    return advance();
  }

  /// Ends the step. With every tensor marked, returns nothing to launch. Otherwise, by the
  /// option: kError throws a ConfigError naming the tensors never marked (the first
  /// kNamesShown, in slot order, and how many more; it changes nothing:
  /// mark them and call finish again, or reset()); kReduceAsZeros returns them and the buckets
  /// still to launch. ConfigError when called twice in a step.
  FinishResult finish() {
    if (finished_)
      throw ConfigError("ncclkit: ReadyTracker::finish: called twice; call reset() to start the next step");
    FinishResult result{BucketRange{launched_, launched_}, {}};
    for (std::uint32_t i = 0; i < marked_.size(); ++i) {
      if (!marked_[i] && plan_.count(Slot{i}) != 0) result.zeroed.push_back(Slot{i});
    }
    if (!result.zeroed.empty() && options_.missing == MissingTensors::kError) {
      // A few names and the count: a model of hundreds of tensors must not give a page of them.
      std::string names;
      const std::size_t shown = std::min<std::size_t>(result.zeroed.size(), kNamesShown);
      for (std::size_t i = 0; i < shown; ++i) {
        names += (i == 0 ? "\"" : ", \"") + plan_.name(result.zeroed[i]) + "\"";
      }
      if (shown < result.zeroed.size()) names += " and " + std::to_string(result.zeroed.size() - shown) + " more";
      throw ConfigError("ncclkit: ReadyTracker::finish: " + std::to_string(result.zeroed.size()) + " of " +
                        std::to_string(plan_.tensor_count()) + " tensors were never marked ready this step: " + names +
                        ". Mark every tensor whose gradient the step produced, or set missing = "
                        "MissingTensors::kReduceAsZeros (in GradientSyncOptions, or ReadyTrackerOptions) to reduce "
                        "them as zeros");
    }
    const std::size_t first = launched_;
    launched_ = plan_.size();
    result.launch = BucketRange{first, launched_};
    finished_ = true;
    return result;
  }

  /// How many of the tensors never marked `finish`'s error names.
  static constexpr std::size_t kNamesShown = 8;

  /// Starts a new step: no tensor marked, no bucket launched. Also abandons a step half done.
  void reset() {
    marked_.assign(marked_.size(), false);
    pending_ = initial_pending_;
    marked_count_ = 0;
    launched_ = 0;
    finished_ = false;
  }

  /// Whether `slot` was marked this step.
  bool is_marked(Slot slot) const {
    check_slot(slot, "is_marked");
    return marked_[slot.index];
  }
  /// Tensors marked this step.
  std::size_t marked_count() const { return marked_count_; }
  /// Buckets launched this step: the plan's first `launched()` buckets.
  std::size_t launched() const { return launched_; }
  /// Whether `finish` has ended the step.
  bool finished() const { return finished_; }
  const BucketPlan& plan() const { return plan_; }
  const ReadyTrackerOptions& options() const { return options_; }

 private:
  void check_slot(Slot slot, const char* call) const {
    if (slot.index >= marked_.size()) {
      throw ConfigError(std::string("ncclkit: ReadyTracker::") + call + ": slot " + std::to_string(slot.index) +
                        " is out of range (the plan has " + std::to_string(marked_.size()) + " tensors)");
    }
  }

  /// Launches every complete bucket from the first not yet launched, stopping at the first
  /// incomplete one.
  BucketRange advance() {
    const std::size_t first = launched_;
    while (launched_ < pending_.size() && pending_[launched_] == 0) ++launched_;
    return BucketRange{first, launched_};
  }

  BucketPlan plan_;
  ReadyTrackerOptions options_;
  std::vector<bool> marked_;
  std::vector<std::uint32_t> initial_pending_;  // non-empty tensors per bucket
  std::vector<std::uint32_t> pending_;          // of those, not yet marked this step
  std::size_t marked_count_ = 0;
  std::size_t launched_ = 0;
  bool finished_ = false;
};

}  // namespace ncclkit::fusion
