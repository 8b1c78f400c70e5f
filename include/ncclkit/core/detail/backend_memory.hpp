#pragma once
/// What generic code (the fusion layer, a communicator's own setup) builds on the `Backend`
/// concept's memory: a small allocation owned by RAII, and an all_gather of a few host words
/// through it (checks and agreements at setup).

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>    // std::byte, std::size_t
#include <cstdint>    // std::uint64_t
#include <exception>  // std::exception
#include <span>       // std::span
#include <string>     // std::string
#include <utility>    // std::exchange
#include <vector>     // std::vector

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"

namespace ncclkit::detail {

/// `bytes` of the backend's memory, freed with `deallocate`. Move-only.
template <Backend B>
class Allocation {
 public:
  Allocation() = default;
  Allocation(B& backend, std::size_t bytes)
      : backend_(&backend), data_(static_cast<std::byte*>(backend.allocate(bytes))), bytes_(bytes) {}
  Allocation(Allocation&& other) noexcept
      : backend_(other.backend_), data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}
  Allocation& operator=(Allocation&& other) noexcept {
    if (this != &other) {
      release();
      backend_ = other.backend_;
      data_ = std::exchange(other.data_, nullptr);
      bytes_ = std::exchange(other.bytes_, 0);
    }
    return *this;
  }
  Allocation(const Allocation&) = delete;
  Allocation& operator=(const Allocation&) = delete;
  ~Allocation() { release(); }

  std::byte* data() const { return data_; }
  std::size_t bytes() const { return bytes_; }

 private:
  void release() noexcept {
    if (data_ == nullptr) return;
    try {
      backend_->deallocate(std::exchange(data_, nullptr));
    } catch (const std::exception& e) {
      log_warn(std::string("ncclkit: fusion: freeing a buffer failed: ") + e.what());
    }
  }

  B* backend_ = nullptr;
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

/// All-gathers `mine` (the same number of words on every rank) through the backend's memory on
/// `stream`, synchronising it: rank r's words are at [r * mine.size(), (r + 1) * mine.size()) of
/// the result. A collective every rank must enter; for a few words at setup or while tuning, not
/// for a hot path (it allocates and waits on the host).
template <Backend B>
std::vector<std::uint64_t> all_gather_words(B& backend, typename B::Stream stream,
                                            std::span<const std::uint64_t> mine) {
  const std::size_t bytes = mine.size_bytes();
  std::vector<std::uint64_t> gathered(mine.size() * static_cast<std::size_t>(backend.size()));
  Allocation<B> in(backend, bytes);
  Allocation<B> out(backend, bytes * static_cast<std::size_t>(backend.size()));
  try {
    backend.copy_from_host(in.data(), mine.data(), bytes, stream);
    backend.all_gather(TensorView{in.data(), mine.size(), DataType::kUint64, B::memory_kind},
                       TensorView{out.data(), gathered.size(), DataType::kUint64, B::memory_kind}, stream);
    backend.copy_to_host(gathered.data(), out.data(), bytes * static_cast<std::size_t>(backend.size()), stream);
    backend.synchronize(stream);
  } catch (...) {
    // The copy queued before a failed call may still run: let the stream pass it before the
    // buffers go (bounded as synchronize is; its own failure says nothing new).
    try {
      backend.synchronize(stream);
    } catch (...) {
    }
    throw;
  }
  return gathered;
}

}  // namespace ncclkit::detail
