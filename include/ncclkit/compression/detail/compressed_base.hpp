#pragma once
/// What the three compressed reducers (cast_reducer.hpp, fused_reducer.hpp, rerun_reducer.hpp)
/// share: the plan cut into pieces (float32 buckets into 16-bit chunks, other buckets whole),
/// the codec's factors, per-piece events, and non-finite counters in the backend's memory, two
/// sets used by alternate steps so that `nonfinite()` reads the finished step's while the next
/// step counts into the other. Buckets that are not float32 are all-reduced as they are (in
/// place where they are one loose tensor).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t, std::uint32_t, std::uintptr_t
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/compression/codec.hpp"
#include "ncclkit/compression/detail/pieces.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/detail/backend_memory.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/fusion/reducer.hpp"

namespace ncclkit::compression::detail {

template <Backend B>
class CompressedBase : public fusion::BucketReducer<B> {
 public:
  using Stream = typename B::Stream;
  using Event = typename B::Event;
  using Phase = fusion::Phase;

  std::span<const fusion::ReducerPiece> pieces() const override { return described_; }
  bool reduces_in_place(std::size_t bucket) const override {
    return setup_->buckets[bucket].loose != nullptr && !piece(pieces_.first[bucket]).encoded;
  }
  std::size_t compressed_pieces() const override { return pieces_.encoded; }

  void end_step(Stream stream) override {
    finish_stream_ = stream;
    ++steps_;
  }
  std::uint64_t nonfinite() override {
    if (pieces_.encoded == 0 || steps_ == 0) return 0;
    const std::vector<std::uint64_t> counts = read_counters(finish_stream_, (steps_ - 1) % 2);
    std::uint64_t total = 0;
    for (std::uint64_t n : counts) total += n;
    return total;
  }

 protected:
  /// `wire`: the codec's 16-bit type. Allocates the counters, zeroed on the comm stream.
  CompressedBase(const fusion::ReducerSetup<B>& setup, Codec codec, CodecFactors factors, std::size_t chunk_bytes)
      : setup_(&setup),
        codec_(codec),
        factors_(factors),
        pieces_(cut_pieces(*setup.plan, true, wire_type(codec), chunk_bytes)) {
    B& backend = *setup.backend;
    for (std::size_t i = 0; i < pieces_.pieces.size(); ++i) {
      const Piece& p = pieces_.pieces[i];
      const std::size_t first = pieces_.first[p.bucket];
      described_.push_back({p.bucket, i - first, pieces_.first[p.bucket + 1] - first,
                            p.count * size_of(p.encoded ? wire_type(codec) : (*setup.plan)[p.bucket].dtype)});
      encoded_.push_back(backend.create_event());
      reduced_.push_back(backend.create_event());
    }
    for (std::size_t b = 0; b < setup.buckets.size(); ++b) ready_.push_back(backend.create_event());
    if (pieces_.encoded != 0) {
      counters_ = ncclkit::detail::Allocation<B>(backend, 2 * pieces_.pieces.size() * sizeof(std::uint64_t));
      backend.fill_zero(TensorView{counters_.data(), 2 * pieces_.pieces.size(), DataType::kUint64, B::memory_kind},
                        setup.comm);
    }
  }

  const Piece& piece(std::size_t i) const { return pieces_.pieces[i]; }
  /// The float32 (or, unencoded, the bucket's) elements of piece `i`.
  TensorView piece_view(std::size_t i) const { return view_of(*setup_, pieces_.pieces[i]); }
  static TensorView view_of(const fusion::ReducerSetup<B>& setup, const Piece& p) {
    const fusion::BucketData& bucket = setup.buckets[p.bucket];
    if (!p.encoded) {
      TensorView view = bucket.data;
      if (bucket.loose != nullptr) view.data = bucket.loose;
      return view;
    }
    const std::size_t offset = p.begin_bytes - (*setup.plan)[p.bucket].begin_bytes;
    return TensorView{static_cast<std::byte*>(bucket.whole.data) + offset, p.count, DataType::kFloat32,
                      B::memory_kind};
  }
  /// The counter of piece `i` in the set of the step being built.
  std::uint64_t* counter(std::size_t i) const {
    return reinterpret_cast<std::uint64_t*>(counters_.data()) + (steps_ % 2) * pieces_.pieces.size() + i;
  }
  TensorView counters_view() const { return TensorView{counter(0), pieces_.pieces.size(), DataType::kUint64, B::memory_kind}; }
  /// Copies one set of counters to the host, synchronising `stream`.
  std::vector<std::uint64_t> read_counters(Stream stream, std::size_t set) {
    std::vector<std::uint64_t> counts(pieces_.pieces.size(), 0);
    const auto* from = reinterpret_cast<const std::uint64_t*>(counters_.data()) + set * pieces_.pieces.size();
    setup_->backend->copy_to_host(counts.data(), from, counts.size() * sizeof(std::uint64_t), stream);
    setup_->backend->synchronize(stream);
    return counts;
  }

  /// Makes the comm stream wait for `compute` once for the range's buckets that are not
  /// encoded (they became launchable together), if any.
  void hand_over_plain(fusion::BucketRange range, Stream compute) {
    for (std::size_t b : range) {
      if (!piece(pieces_.first[b]).encoded) {
        setup_->backend->record(ready_[range.first], compute);
        setup_->backend->wait(ready_[range.first], setup_->comm);
        return;
      }
    }
  }
  /// All-reduces unencoded piece `i` on the comm stream (after hand_over_plain).
  void reduce_plain(std::size_t i) {
    const TensorView view = piece_view(i);
    setup_->observe(Phase::kReduce, i, false, setup_->comm);
    setup_->backend->all_reduce(view, view, setup_->op, setup_->comm);
    setup_->observe(Phase::kReduce, i, true, setup_->comm);
    setup_->backend->record(reduced_[i], setup_->comm);
  }

  const fusion::ReducerSetup<B>* setup_;
  Codec codec_;
  CodecFactors factors_;
  Pieces pieces_;
  std::vector<fusion::ReducerPiece> described_;
  std::vector<Event> ready_;    // per bucket; a launch of several buckets uses its first's
  std::vector<Event> encoded_;  // per piece: encoded (or the bucket handed over) on the compute stream
  std::vector<Event> reduced_;  // per piece: reduced on the comm stream
  ncclkit::detail::Allocation<B> counters_;  // two sets of a std::uint64_t per piece
  std::size_t steps_ = 0;
  Stream finish_stream_{};
};

}  // namespace ncclkit::compression::detail
