#pragma once
/// `FusedReducer<B>`: compressed buckets as one kernel per piece, on a backend that can run it
/// (CompressedReduceBackend: the NCCL communicator when every rank's GPU reaches every other's
/// memory). The kernel encodes, moves the 16-bit data between GPUs, sums and decodes it
/// (nccl/compressed_reduce.hpp): no separate casts, and each rank's own part is summed
/// unrounded. It counts non-finite 16-bit results as it goes, so completing a bucket is one wait.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>  // std::max
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uintptr_t
#include <memory>     // std::unique_ptr
#include <optional>   // std::optional
#include <string>     // std::string
#include <utility>    // std::move

#include "ncclkit/compression/codec.hpp"
#include "ncclkit/compression/detail/compressed_base.hpp"
#include "ncclkit/core/backend.hpp"
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
        backend.compressed_all_reduce(*workspace_, this->piece_view(i), this->factors_.encode, this->factors_.decode,
                                      this->counter(i), comm);
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
  std::optional<Workspace> workspace_;
};

}  // namespace ncclkit::compression
