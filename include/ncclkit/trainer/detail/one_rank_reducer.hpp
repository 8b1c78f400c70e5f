#pragma once
/// The trainer's reducer on one rank with float32 gradients: one rank's average is its own
/// gradients, so nothing is issued. The plain all_reduce would still run a collective per
/// bucket, and NCCL copies the data through a kernel even on one rank (0.43 ms for the 537 MB
/// of the cuBLAS MLP on an H200), taking memory bandwidth from backward.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>  // std::size_t
#include <memory>   // std::unique_ptr, std::make_unique
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/fusion/reducer.hpp"

namespace ncclkit::trainer::detail {

template <Backend B>
class OneRankReducer final : public fusion::BucketReducer<B> {
 public:
  using Stream = typename B::Stream;

  explicit OneRankReducer(const fusion::ReducerSetup<B>& setup) : setup_(&setup) {
    for (std::size_t b = 0; b < setup.buckets.size(); ++b) {
      pieces_.push_back({b, 0, 1, 0});
      written_.push_back(setup.backend->create_event());
    }
  }
  std::string name() const override { return "none (one rank)"; }
  std::span<const fusion::ReducerPiece> pieces() const override { return pieces_; }
  bool reduces_in_place(std::size_t bucket) const override { return setup_->buckets[bucket].loose != nullptr; }
  /// The result is the gradients as the compute stream wrote them.
  void launch(fusion::BucketRange range, Stream compute) override {
    for (std::size_t b : range) setup_->backend->record(written_[b], compute);
  }
  void complete(std::size_t bucket, Stream stream) override { setup_->backend->wait(written_[bucket], stream); }

 private:
  const fusion::ReducerSetup<B>* setup_;
  std::vector<fusion::ReducerPiece> pieces_;
  std::vector<typename B::Event> written_;
};

template <Backend B>
class OneRankFactory final : public fusion::ReducerFactory<B> {
 public:
  std::string name() const override { return "one rank"; }
  std::string describe(std::span<const std::uint64_t>) const override { return "reducer none (one rank)"; }
  std::string problem(const fusion::ReducerSetup<B>& setup) const override {
    return setup.backend->size() == 1 ? std::string() : "ncclkit: the one-rank reducer runs on one rank only";
  }
  std::unique_ptr<fusion::BucketReducer<B>> make(const fusion::ReducerSetup<B>& setup) const override {
    return std::make_unique<OneRankReducer<B>>(setup);
  }
};

}  // namespace ncclkit::trainer::detail
