#pragma once
/// `DistributedSampler`: which samples each rank trains on, step by step.
///
/// PyTorch's DistributedSampler semantics (disjoint shards that cover the data, a permutation
/// per epoch seeded by (seed, epoch) and the same on every rank without communication,
/// `drop_last` or padding by repeating from the start), and one step past them: the samples
/// form **one global stream** per epoch, the permutation, independent of the world size. Step s
/// of an epoch consumes the next `global_batch` samples of the stream, positions
/// [s·G, (s+1)·G), and rank r of W takes its slice [s·G + r·G/W, s·G + (r+1)·G/W). The position
/// is a count of samples consumed in the epoch (as Megatron keeps it), so a run resumed from a
/// checkpoint mid-epoch, at the same or another world size, goes on with exactly the samples
/// not seen yet.
///
/// The last samples of an epoch that do not fill a global batch are dropped (LastBatch::kDrop,
/// the default, as DDP trainers set `drop_last`), or the batch is filled by repeating the
/// epoch's stream from its start (kPad: every sample is seen at least once). Evaluation uses
/// `evaluation_shard`: contiguous, disjoint, covering, and never padded, so that no sample is
/// counted twice.
///
/// Pure host arithmetic, deterministic on every platform (its own generator, not the standard
/// library's distributions, whose results vary between implementations).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <numeric>  // std::iota
#include <string>   // std::string, std::to_string
#include <utility>  // std::swap
#include <vector>   // std::vector

namespace ncclkit::trainer {

/// What an epoch does with samples that do not fill a last global batch.
enum class LastBatch {
  kDrop,  ///< leave them out of this epoch (default)
  kPad,   ///< fill the batch by repeating the epoch's stream from its start
};

struct SamplerOptions {
  /// Samples in the dataset (at least one).
  std::size_t dataset_size = 0;
  /// Samples per optimizer step over all ranks; a multiple of the world size.
  std::size_t global_batch = 0;
  /// With the epoch, seeds the epoch's permutation.
  std::uint64_t seed = 0;
  /// Permute each epoch (true, default), or take the samples in order.
  bool shuffle = true;
  LastBatch last_batch = LastBatch::kDrop;
};

/// Where a sampler stands: the epoch, and the samples of its stream consumed so far. What a
/// checkpoint keeps.
struct SamplerPosition {
  std::uint64_t epoch = 0;
  std::uint64_t consumed = 0;
  friend bool operator==(const SamplerPosition& a, const SamplerPosition& b) {
    return a.epoch == b.epoch && a.consumed == b.consumed;
  }
};

namespace detail {

/// splitmix64: a good 64-bit mixer, the same everywhere.
inline std::uint64_t mix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

/// A uniform integer in [0, bound), bound > 0, from the stream `state` (unbiased: Lemire's
/// multiply-and-reject).
inline std::uint64_t below(std::uint64_t& state, std::uint64_t bound) {
  for (;;) {
    state += 0x9E3779B97F4A7C15ull;
    const unsigned __int128 product = static_cast<unsigned __int128>(mix64(state)) * bound;
    const auto low = static_cast<std::uint64_t>(product);
    if (low >= bound || low >= (0 - bound) % bound) return static_cast<std::uint64_t>(product >> 64);
  }
}

}  // namespace detail

/// The permutation of [0, size) for (seed, epoch): Fisher–Yates over the generator above. The
/// same on every rank and platform.
inline std::vector<std::size_t> epoch_permutation(std::size_t size, std::uint64_t seed, std::uint64_t epoch) {
  std::vector<std::size_t> order(size);
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::uint64_t state = detail::mix64(seed ^ detail::mix64(epoch + 0x5EED));
  for (std::size_t i = size; i > 1; --i) {
    std::swap(order[i - 1], order[detail::below(state, i)]);
  }
  return order;
}

/// Rank `rank` of `world`'s part of a dataset of `size` samples for evaluation: a contiguous
/// range (the first size % world ranks one sample more), disjoint from the others' and together
/// covering it, never padded.
struct EvaluationShard {
  std::size_t begin = 0;
  std::size_t end = 0;
  std::size_t size() const { return end - begin; }
};
inline EvaluationShard evaluation_shard(std::size_t size, int rank, int world) {
  const auto w = static_cast<std::size_t>(world);
  const auto r = static_cast<std::size_t>(rank);
  const std::size_t base = size / w, extra = size % w;
  const std::size_t begin = r * base + (r < extra ? r : extra);
  return {begin, begin + base + (r < extra ? 1 : 0)};
}

class DistributedSampler {
 public:
  /// Rank `rank` of `world`. ConfigError naming the numbers for an empty dataset, a global
  /// batch of 0 or larger than the dataset, and a global batch that `world` does not divide.
  DistributedSampler(SamplerOptions options, int rank, int world) : options_(options), rank_(rank), world_(world) {
    const std::string who = "ncclkit: DistributedSampler: ";
    if (world < 1 || rank < 0 || rank >= world) {
      throw ConfigError(who + "rank " + std::to_string(rank) + " is outside a world of " + std::to_string(world));
    }
    if (options.dataset_size == 0) throw ConfigError(who + "the dataset has no samples");
    if (options.global_batch == 0) throw ConfigError(who + "global_batch is 0; give the samples per step over all ranks");
    if (options.global_batch % static_cast<std::size_t>(world) != 0) {
      throw ConfigError(who + "a global batch of " + std::to_string(options.global_batch) + " does not split over " +
                        std::to_string(world) + " ranks (remainder " +
                        std::to_string(options.global_batch % static_cast<std::size_t>(world)) +
                        "); use a multiple of the world size, e.g. " +
                        std::to_string(options.global_batch / static_cast<std::size_t>(world) * world + world));
    }
    if (options.global_batch > options.dataset_size && options.last_batch == LastBatch::kDrop) {
      throw ConfigError(who + "a global batch of " + std::to_string(options.global_batch) + " is larger than the " +
                        std::to_string(options.dataset_size) +
                        " samples of the dataset, so every epoch would drop them all; use a smaller batch or "
                        "LastBatch::kPad");
    }
    order_ = make_order(0);
  }

  const SamplerOptions& options() const { return options_; }
  int rank() const { return rank_; }
  int world() const { return world_; }
  /// Samples each rank takes per step.
  std::size_t per_rank() const { return options_.global_batch / static_cast<std::size_t>(world_); }
  /// Steps in every epoch: the dataset over the global batch, rounded down (kDrop) or up (kPad).
  std::size_t steps_per_epoch() const {
    const std::size_t n = options_.dataset_size, g = options_.global_batch;
    return options_.last_batch == LastBatch::kDrop ? n / g : (n + g - 1) / g;
  }
  SamplerPosition position() const { return position_; }
  /// Steps of the current epoch done so far.
  std::size_t step_in_epoch() const { return static_cast<std::size_t>(position_.consumed / options_.global_batch); }
  bool epoch_done() const { return step_in_epoch() >= steps_per_epoch(); }

  /// This rank's samples for the next step (per_rank() of them), in the order of the stream;
  /// starts the next epoch first when this one is done.
  std::vector<std::size_t> next() {
    if (epoch_done()) seek({position_.epoch + 1, 0});
    std::vector<std::size_t> mine(per_rank());
    const std::size_t from = static_cast<std::size_t>(position_.consumed) + static_cast<std::size_t>(rank_) * per_rank();
    for (std::size_t i = 0; i < mine.size(); ++i) mine[i] = order_[(from + i) % order_.size()];
    position_.consumed += options_.global_batch;
    return mine;
  }

  /// Goes to `position` (from a checkpoint, possibly written at another world size).
  /// ConfigError when it is not on a step boundary of this sampler's global batch, or past the
  /// end of its epoch.
  void seek(SamplerPosition position) {
    if (position.consumed % options_.global_batch != 0 ||
        position.consumed / options_.global_batch > steps_per_epoch()) {
      throw ConfigError("ncclkit: DistributedSampler: position " + std::to_string(position.consumed) +
                        " of epoch " + std::to_string(position.epoch) + " is not a step boundary of a global batch of " +
                        std::to_string(options_.global_batch) + " within an epoch of " +
                        std::to_string(steps_per_epoch()) + " steps; resume with the global batch it was saved with");
    }
    if (position.epoch != position_.epoch) order_ = make_order(position.epoch);
    position_ = position;
  }

 private:
  std::vector<std::size_t> make_order(std::uint64_t epoch) const {
    if (options_.shuffle) return epoch_permutation(options_.dataset_size, options_.seed, epoch);
    std::vector<std::size_t> order(options_.dataset_size);
    std::iota(order.begin(), order.end(), std::size_t{0});
    return order;
  }

  SamplerOptions options_;
  int rank_;
  int world_;
  SamplerPosition position_;
  std::vector<std::size_t> order_;  // the current epoch's stream
};

}  // namespace ncclkit::trainer
