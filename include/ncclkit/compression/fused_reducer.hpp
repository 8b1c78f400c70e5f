#pragma once
/// `FusedReducer<B>`: compressed buckets as one kernel per piece, on a backend that can run it
/// (CompressedReduceBackend: the NCCL communicator when every rank's GPU reaches every other's
/// memory). The kernel encodes, moves the 16-bit data between GPUs, sums and decodes it
/// (nccl/compressed_reduce.hpp): no separate casts, and each rank's own part is summed
/// unrounded. It counts non-finite 16-bit results as it goes, so completing a bucket is one wait.
///
/// It can apply an optimizer update where a float32 bucket lands (can_update, set_update): the
/// kernel then writes the parameters and state instead of the reduced gradients. The update is
/// applied whatever the results: where the step's nonfinite() is not 0, the parameters already
/// hold its non-finite values, so a caller that skips such steps must not hand it the update.
/// A bucket of one tensor is reduced over the tensor's elements alone (BucketData::data), not
/// the layout's padding after it, with or without an update: the two then give the same bits,
/// and the update never reaches past the tensor's own parameters.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>  // std::max, std::min
#include <cstddef>    // std::size_t, std::byte
#include <cstdint>    // std::uintptr_t
#include <memory>     // std::unique_ptr
#include <optional>   // std::optional
#include <string>     // std::string, std::to_string
#include <utility>    // std::move
#include <vector>     // std::vector

#include "ncclkit/compression/codec.hpp"
#include "ncclkit/compression/detail/compressed_base.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/core/update.hpp"
#include "ncclkit/fusion/reducer.hpp"

namespace ncclkit::compression {

template <CompressedReduceBackend B>
class FusedReducer final : public detail::CompressedBase<B> {
  using Base = detail::CompressedBase<B>;

 public:
  using Stream = typename B::Stream;
  using Phase = fusion::Phase;
  using Workspace = typename B::CompressedReduce;

  /// Where the fused kernel can run for `setup` (every compressed piece 16-byte aligned, the
  /// backend able on every rank: a collective), the reducer; else null, and the caller falls
  /// back to the separate casts (`why` says why, empty where no bucket is float32).
  static std::unique_ptr<FusedReducer> make(const fusion::ReducerSetup<B>& setup, Codec codec, CodecFactors factors,
                                            std::size_t chunk_bytes, std::string& why) {
    const detail::Pieces pieces = detail::cut_pieces(*setup.plan, true, wire_type(codec), chunk_bytes);
    if (pieces.encoded == 0) return nullptr;  // no float32 bucket: nothing to fuse
    std::size_t largest = 0;
    for (const detail::Piece& piece : pieces.pieces) {
      if (!piece.encoded) continue;
      // The kernel moves 16-byte words: a layout aligned more loosely (LayoutOptions) runs the
      // separate casts. The layout is the same on every rank, so is this decision.
      if (reinterpret_cast<std::uintptr_t>(Base::view_of(setup, piece).data) % 16 != 0) {
        why = "the layout's alignment is less than 16 bytes";
        return nullptr;
      }
      largest = std::max(largest, piece.count);
    }
    auto workspace = setup.backend->prepare_compressed_reduce(largest, wire_type(codec));
    if (!workspace) {
      why = setup.backend->compressed_reduce_unavailable();
      if (why.empty()) why = "another rank cannot run the fused kernel";
      return nullptr;
    }
    std::unique_ptr<FusedReducer> reducer(new FusedReducer(setup, codec, factors, chunk_bytes));
    reducer->workspace_.emplace(std::move(*workspace));
    return reducer;
  }

  std::string name() const override { return std::string(name_of(this->codec_)) + " fused kernel"; }

  /// Where every piece of bucket `b` goes through the kernel (float32); a bucket of another type
  /// is all-reduced as it is, with no pass of this reducer's own to apply an update in.
  bool can_update(std::size_t bucket) const override {
    for (std::size_t i = this->pieces_.first[bucket]; i < this->pieces_.first[bucket + 1]; ++i) {
      if (!this->piece(i).encoded) return false;
    }
    return true;
  }
  void set_update(std::size_t bucket, const FusedUpdate& update) override {
    if (!can_update(bucket)) {
      throw ConfigError(
          "ncclkit: the " + name() + " reducer cannot apply bucket " + std::to_string(bucket) +
          "'s update itself: the bucket holds " + std::string(ncclkit::name_of((*this->setup_->plan)[bucket].dtype)) +
          " values, all-reduced as they are; only float32 buckets go through the kernel (ask can_update first)");
    }
    if (const char* missing = update.missing()) {
      throw ConfigError("ncclkit: " + name() + ": bucket " + std::to_string(bucket) + "'s update has no " + missing +
                        "; give the parameters it writes and the " + std::to_string(update.rule.state_count()) +
                        " state buffers its rule keeps (UpdateRule::state_count)");
    }
    updates_.resize(this->setup_->buckets.size());
    updates_[bucket] = update;
  }
  void end_step(Stream stream) override {
    updates_.clear();
    Base::end_step(stream);
  }

  void launch(fusion::BucketRange range, Stream compute) override {
    if (range.empty()) return;
    B& backend = *this->setup_->backend;
    const Stream comm = this->setup_->comm;
    this->hand_over_plain(range, compute);
    for (std::size_t b : range) {
      for (std::size_t i = this->pieces_.first[b]; i < this->pieces_.first[b + 1]; ++i) {
        if (!this->piece(i).encoded) {
          this->reduce_plain(i);
          continue;
        }
        // Counted on the comm stream, where the kernel adds to it.
        backend.fill_zero(TensorView{this->counter(i), 1, DataType::kUint64, B::memory_kind}, comm);
        if (i == this->pieces_.first[b]) {
          backend.record(this->encoded_[i], compute);
          backend.wait(this->encoded_[i], comm);
        }
        // On the timeline as the piece's reduction: encode and decode happen inside it.
        this->setup_->observe(Phase::kReduce, i, false, comm);
        const TensorView view = reduced_view(b, i);
        if (const std::optional<FusedUpdate> update = update_of(b, view); update) {
          backend.compressed_all_reduce(*workspace_, view, this->factors_.encode, this->factors_.decode, *update,
                                        this->counter(i), comm);
        } else {
          backend.compressed_all_reduce(*workspace_, view, this->factors_.encode, this->factors_.decode,
                                        this->counter(i), comm);
        }
        this->setup_->observe(Phase::kReduce, i, true, comm);
        backend.record(this->reduced_[i], comm);
      }
    }
  }

  /// One wait: the comm stream runs the bucket's pieces in order.
  void complete(std::size_t bucket, Stream stream) override {
    this->setup_->backend->wait(this->reduced_[this->pieces_.first[bucket + 1] - 1], stream);
  }

 private:
  using Base::Base;

  /// Piece `i` of bucket `b` as the kernel reduces it: its elements inside BucketData::data
  /// (none past a lone tensor's end; a piece wholly in its padding reduces nothing).
  TensorView reduced_view(std::size_t b, std::size_t i) const {
    TensorView view = this->piece_view(i);
    const std::size_t first = first_element(b, view);
    const std::size_t count = this->setup_->buckets[b].data.count;
    view.count = first >= count ? 0 : std::min(view.count, count - first);
    return view;
  }
  /// The index in BucketData::data of `view`'s first element.
  std::size_t first_element(std::size_t b, const TensorView& view) const {
    return static_cast<std::size_t>(static_cast<const std::byte*>(view.data) -
                                    static_cast<const std::byte*>(this->setup_->buckets[b].data.data)) /
           sizeof(float);
  }
  /// The update of bucket `b` for its piece `view`, its pointers moved to the piece's first
  /// element; none where the step has none for the bucket, or the piece is empty.
  std::optional<FusedUpdate> update_of(std::size_t b, const TensorView& view) const {
    if (b >= updates_.size() || updates_[b].values == nullptr || view.count == 0) return std::nullopt;
    return updates_[b].from(first_element(b, view));
  }

  std::optional<Workspace> workspace_;
  std::vector<FusedUpdate> updates_;  // per bucket, for this step (values null: none); empty: none at all
};

}  // namespace ncclkit::compression
