#pragma once
/// `RerunReducer<B>`: the separate casts of CastReducer, made safe against fp16 overflow
/// (CompressionOptions::rerun_nonfinite). The float32 gradients stay intact until decode, so a
/// piece whose 16-bit sum is not finite is reduced again in float32: an overflow costs time,
/// never a step. To know which pieces to rerun, the first `complete` of a step counts every
/// compressed piece's non-finite results (a pass that leaves them as they are) and reads the
/// counts on the host: every rank holds the same sums, so every rank reruns the same pieces.
/// That one host wait per step is the price. It cannot apply an optimizer update itself
/// (BucketReducer::can_update stays false): a rerun replaces a result after the fact, which an
/// update already applied from it could not take back.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/compression/cast_reducer.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/fusion/reducer.hpp"

namespace ncclkit::compression {

template <Backend B>
class RerunReducer final : public CastReducer<B> {
 public:
  using Stream = typename B::Stream;
  using Phase = fusion::Phase;
  using CastReducer<B>::CastReducer;

  std::string name() const override { return CastReducer<B>::name() + " + float32 rerun"; }
  std::uint32_t piece_phases() const override {
    return CastReducer<B>::piece_phases() | 1u << static_cast<unsigned>(Phase::kCount) |
           1u << static_cast<unsigned>(Phase::kRerun);
  }
  std::size_t retried_pieces() const override { return retried_; }

  void complete(std::size_t bucket, Stream stream) override {
    B& backend = *this->setup_->backend;
    if (bucket == 0) count_all(stream);
    for (std::size_t i = this->pieces_.first[bucket]; i < this->pieces_.first[bucket + 1]; ++i) {
      if (!this->piece(i).encoded) {
        backend.wait(this->reduced_[i], stream);
      } else if (counts_[i] != 0) {
        rerun(i, stream);
      } else {
        this->decode(i, nullptr, stream);  // counted already
      }
    }
  }

 private:
  /// Counts every compressed piece's non-finite 16-bit results into this step's counters and
  /// reads them on the host (synchronising `stream`).
  void count_all(Stream stream) {
    B& backend = *this->setup_->backend;
    retried_ = 0;
    counts_.assign(this->pieces_.pieces.size(), 0);
    if (this->pieces_.encoded == 0) return;
    backend.fill_zero(this->counters_view(), stream);
    for (std::size_t i = 0; i < this->pieces_.pieces.size(); ++i) {
      if (!this->piece(i).encoded) continue;
      backend.wait(this->reduced_[i], stream);
      this->setup_->observe(Phase::kCount, i, false, stream);
      backend.cast(this->wire_view(i), this->wire_view(i), 1.0, this->counter(i), stream);
      this->setup_->observe(Phase::kCount, i, true, stream);
    }
    counts_ = this->read_counters(stream, this->steps_ % 2);
  }

  /// Reduces piece `i`'s float32 gradients, untouched so far, as they are; its count becomes
  /// that of the float32 result.
  void rerun(std::size_t i, Stream stream) {
    B& backend = *this->setup_->backend;
    const Stream comm = this->setup_->comm;
    const TensorView data = this->piece_view(i);
    backend.record(this->encoded_[i], stream);
    backend.wait(this->encoded_[i], comm);
    this->setup_->observe(Phase::kRerun, i, false, comm);
    backend.all_reduce(data, data, this->setup_->op, comm);
    this->setup_->observe(Phase::kRerun, i, true, comm);
    backend.record(this->reduced_[i], comm);
    backend.wait(this->reduced_[i], stream);
    backend.fill_zero(TensorView{this->counter(i), 1, DataType::kUint64, B::memory_kind}, stream);
    backend.cast(data, data, 1.0, this->counter(i), stream);
    ++retried_;
  }

  std::vector<std::uint64_t> counts_;  // this step's, per piece, as read on the host
  std::size_t retried_ = 0;
};

}  // namespace ncclkit::compression
