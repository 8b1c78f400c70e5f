#pragma once
/// `AllReduceReducer<B>`: the default reducer of a GradientSync (fusion/reducer.hpp). Each
/// bucket is all-reduced in place on the comm stream, behind one event of the compute stream
/// per launch (buckets that become ready together wait on one event); a bucket that is one
/// loose tensor is reduced where that tensor lives, so it needs no staging.
///
/// With ReducerSetup::defer_gather, a bucket whose whole range (padding included: zeros, which
/// reduce to zeros) splits evenly over the ranks is reduced in two halves, in place: a
/// reduce-scatter at launch leaves each rank its slice's result, and `complete` all-gathers the
/// slices. The two halves move the bytes of the one all_reduce, the same sums land on every
/// rank, and only their timing changes. A loose bucket, or one that does not split evenly, is
/// all-reduced at launch.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>  // std::size_t, std::byte
#include <cstdint>  // std::uint32_t
#include <memory>   // std::unique_ptr
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/fusion/reducer.hpp"

namespace ncclkit::fusion {

template <Backend B>
class AllReduceReducer final : public BucketReducer<B> {
 public:
  using Stream = typename B::Stream;
  using Event = typename B::Event;

  explicit AllReduceReducer(const ReducerSetup<B>& setup) : setup_(&setup) {
    for (std::size_t b = 0; b < setup.buckets.size(); ++b) {
      const TensorView data = setup.buckets[b].data;
      pieces_.push_back({b, 0, 1, data.bytes()});
      const std::size_t ranks = static_cast<std::size_t>(setup.backend->size());
      const BucketData& bucket = setup.buckets[b];
      split_.push_back(setup.defer_gather && ranks > 1 && bucket.loose == nullptr && bucket.whole.count > 0 &&
                       bucket.whole.count % ranks == 0);
      ready_.push_back(setup.backend->create_event());
      done_.push_back(setup.backend->create_event());
    }
  }

  std::string name() const override { return "all_reduce"; }
  std::span<const ReducerPiece> pieces() const override { return pieces_; }
  std::uint32_t piece_phases() const override {
    std::uint32_t phases = 1u << static_cast<unsigned>(Phase::kReduce);
    for (char s : split_) {
      if (s != 0) phases |= 1u << static_cast<unsigned>(Phase::kGather);
    }
    return phases;
  }
  bool reduces_in_place(std::size_t bucket) const override { return setup_->buckets[bucket].loose != nullptr; }

  void launch(BucketRange range, Stream compute) override {
    if (range.empty()) return;
    B& backend = *setup_->backend;
    Event& ready = ready_[range.first];
    backend.record(ready, compute);
    backend.wait(ready, setup_->comm);
    for (std::size_t b : range) {
      setup_->observe(Phase::kReduce, b, false, setup_->comm);
      if (split_[b]) {
        backend.reduce_scatter(setup_->buckets[b].whole, slice(b), setup_->op, setup_->comm);
      } else {
        const TensorView view = data(b);
        backend.all_reduce(view, view, setup_->op, setup_->comm);
      }
      setup_->observe(Phase::kReduce, b, true, setup_->comm);
      backend.record(done_[b], setup_->comm);
    }
  }

  void complete(std::size_t bucket, Stream stream) override {
    B& backend = *setup_->backend;
    if (split_[bucket]) {
      // The second half, on the comm stream: behind the bucket's reduce-scatter there.
      setup_->observe(Phase::kGather, bucket, false, setup_->comm);
      backend.all_gather(slice(bucket), setup_->buckets[bucket].whole, setup_->comm);
      setup_->observe(Phase::kGather, bucket, true, setup_->comm);
      backend.record(done_[bucket], setup_->comm);
    }
    backend.wait(done_[bucket], stream);
  }

 private:
  TensorView data(std::size_t b) const {
    const BucketData& bucket = setup_->buckets[b];
    TensorView view = bucket.data;
    if (bucket.loose != nullptr) view.data = bucket.loose;
    return view;
  }
  /// This rank's slice of bucket `b`'s whole range (a split bucket).
  TensorView slice(std::size_t b) const {
    const TensorView whole = setup_->buckets[b].whole;
    const std::size_t ranks = static_cast<std::size_t>(setup_->backend->size());
    const std::size_t count = whole.count / ranks;
    const std::size_t first = count * static_cast<std::size_t>(setup_->backend->rank());
    return TensorView{static_cast<std::byte*>(whole.data) + first * size_of(whole.dtype), count, whole.dtype,
                      whole.where};
  }

  const ReducerSetup<B>* setup_;
  std::vector<ReducerPiece> pieces_;
  std::vector<Event> ready_;  // per bucket; a launch of several buckets uses its first's
  std::vector<Event> done_;   // per bucket: its all_reduce (split: its latest half) ended
  std::vector<char> split_;   // per bucket: reduced in two halves (defer_gather)
};

/// The factory of the default reducer (GradientSyncOptions::reducer left null).
template <Backend B>
class AllReduceFactory final : public ReducerFactory<B> {
 public:
  std::string name() const override { return "all_reduce"; }
  std::string describe(std::span<const std::uint64_t>) const override { return "reducer all_reduce"; }
  std::unique_ptr<BucketReducer<B>> make(const ReducerSetup<B>& setup) const override {
    return std::make_unique<AllReduceReducer<B>>(setup);
  }
};

}  // namespace ncclkit::fusion
