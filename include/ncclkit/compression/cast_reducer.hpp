#pragma once
/// `CastReducer<B>`: compressed buckets as three passes. Each float32 piece is encoded to 16
/// bits on the compute stream when its bucket launches (scale and cast in one pass), summed in
/// 16 bits on the comm stream after an event, and decoded back into the float32 gradients on
/// the stream that completes it, counting non-finite results: encoding piece k+1 overlaps
/// reducing piece k, and decoding piece k overlaps reducing piece k+1. Runs on every backend;
/// compression::compressed picks it where the fused kernel cannot run.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>  // std::size_t
#include <string>   // std::string

#include "ncclkit/compression/codec.hpp"
#include "ncclkit/compression/detail/compressed_base.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/backend_memory.hpp"
#include "ncclkit/fusion/reducer.hpp"

namespace ncclkit::compression {

template <Backend B>
class CastReducer : public detail::CompressedBase<B> {
  using Base = detail::CompressedBase<B>;

 public:
  using Stream = typename B::Stream;
  using Phase = fusion::Phase;

  CastReducer(const fusion::ReducerSetup<B>& setup, Codec codec, CodecFactors factors, std::size_t chunk_bytes)
      : Base(setup, codec, factors, chunk_bytes) {
    if (this->pieces_.encoded != 0) wire_ = ncclkit::detail::Allocation<B>(*setup.backend, this->pieces_.wire_bytes);
  }

  std::string name() const override { return std::string(name_of(this->codec_)) + " casts"; }
  std::uint32_t piece_phases() const override {
    return 1u << static_cast<unsigned>(Phase::kEncode) | 1u << static_cast<unsigned>(Phase::kReduce) |
           1u << static_cast<unsigned>(Phase::kDecode);
  }

  void launch(fusion::BucketRange range, Stream compute) override {
    if (range.empty()) return;
    this->hand_over_plain(range, compute);
    for (std::size_t b : range) {
      for (std::size_t i = this->pieces_.first[b]; i < this->pieces_.first[b + 1]; ++i) {
        if (this->piece(i).encoded) {
          encode_and_reduce(i, compute);
        } else {
          this->reduce_plain(i);
        }
      }
    }
  }

  void complete(std::size_t bucket, Stream stream) override {
    B& backend = *this->setup_->backend;
    if (bucket == 0 && this->pieces_.encoded != 0) backend.fill_zero(this->counters_view(), stream);
    for (std::size_t i = this->pieces_.first[bucket]; i < this->pieces_.first[bucket + 1]; ++i) {
      backend.wait(this->reduced_[i], stream);
      if (this->piece(i).encoded) decode(i, this->counter(i), stream);
    }
  }

 protected:
  /// Piece `i`'s 16-bit range of the wire buffer.
  TensorView wire_view(std::size_t i) const {
    return TensorView{wire_.data() + this->piece(i).wire_begin_bytes, this->piece(i).count, wire_type(this->codec_),
                      B::memory_kind};
  }
  void encode_and_reduce(std::size_t i, Stream compute) {
    B& backend = *this->setup_->backend;
    const Stream comm = this->setup_->comm;
    this->setup_->observe(Phase::kEncode, i, false, compute);
    backend.cast(this->piece_view(i), wire_view(i), this->factors_.encode, nullptr, compute);
    this->setup_->observe(Phase::kEncode, i, true, compute);
    backend.record(this->encoded_[i], compute);
    backend.wait(this->encoded_[i], comm);
    this->setup_->observe(Phase::kReduce, i, false, comm);
    backend.all_reduce(wire_view(i), wire_view(i), ReduceOp::kSum, comm);
    this->setup_->observe(Phase::kReduce, i, true, comm);
    backend.record(this->reduced_[i], comm);
  }
  /// Decodes piece `i`'s 16-bit sum into its float32 gradients on `stream`, counting non-finite
  /// results into `count` unless it is null.
  void decode(std::size_t i, std::uint64_t* count, Stream stream) {
    this->setup_->observe(Phase::kDecode, i, false, stream);
    this->setup_->backend->cast(wire_view(i), this->piece_view(i), this->factors_.decode, count, stream);
    this->setup_->observe(Phase::kDecode, i, true, stream);
  }

  ncclkit::detail::Allocation<B> wire_;  // the 16-bit data of every encoded piece
};

}  // namespace ncclkit::compression
