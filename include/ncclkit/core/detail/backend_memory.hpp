#pragma once
/// What generic code (the fusion layer, a communicator's own setup) needs of a backend's memory
/// beyond the `Backend` concept: moving a few bytes between the host and the backend's memory,
/// a small allocation owned by RAII, an all_gather of a few host words through it (checks and
/// agreements at setup), and filling a range with zeros by stream-ordered copies.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>  // std::min
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

/// A backend that can copy between host memory and its own, stream-ordered:
/// `copy_from_host(to, host_from, bytes, stream)` and `copy_to_host(host_to, from, bytes, stream)`
/// (the host side must stay valid until the stream reaches the copy). A backend of host memory
/// needs neither: its `copy` takes host pointers.
template <class B>
concept HostTransferBackend = Backend<B> &&
    requires(B& backend, void* to, const void* from, std::size_t bytes, typename B::Stream stream) {
  backend.copy_from_host(to, from, bytes, stream);
  backend.copy_to_host(to, from, bytes, stream);
};

template <class B>
inline constexpr bool kCanReachHost = B::memory_kind == MemoryKind::kHost || HostTransferBackend<B>;

/// Copies `bytes` from host memory to the backend's memory, on `stream`.
template <Backend B>
void copy_from_host(B& backend, void* to, const void* host_from, std::size_t bytes, typename B::Stream stream) {
  static_assert(kCanReachHost<B>,
                "ncclkit fusion: this backend's memory is not host memory and it has no copy_from_host/"
                "copy_to_host(pointer, pointer, bytes, stream): add them (cudaMemcpyAsync with "
                "cudaMemcpyDefault) so the fusion layer can check the plan across ranks and zero tensors");
  if constexpr (HostTransferBackend<B>) {
    backend.copy_from_host(to, host_from, bytes, stream);
  } else {
    backend.copy(to, host_from, bytes, stream);
  }
}

/// Copies `bytes` from the backend's memory to host memory, on `stream`.
template <Backend B>
void copy_to_host(B& backend, void* host_to, const void* from, std::size_t bytes, typename B::Stream stream) {
  static_assert(kCanReachHost<B>, "ncclkit fusion: see copy_from_host");
  if constexpr (HostTransferBackend<B>) {
    backend.copy_to_host(host_to, from, bytes, stream);
  } else {
    backend.copy(host_to, from, bytes, stream);
  }
}

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
    copy_from_host(backend, in.data(), mine.data(), bytes, stream);
    backend.all_gather(TensorView{in.data(), mine.size(), DataType::kUint64, B::memory_kind},
                       TensorView{out.data(), gathered.size(), DataType::kUint64, B::memory_kind}, stream);
    copy_to_host(backend, gathered.data(), out.data(), bytes * static_cast<std::size_t>(backend.size()), stream);
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

/// Fills `view` with zero bytes on `stream`: one copy from `zeros` (`zero_bytes` of zeros in the
/// backend's memory), then copies of the part already zeroed onto the rest, doubling each time
/// (log2(bytes / zero_bytes) copies). Not `scale(view, 0)`: 0 × NaN is NaN, and a gradient never
/// written may hold anything.
template <Backend B>
void zero_fill(B& backend, TensorView view, const std::byte* zeros, std::size_t zero_bytes, typename B::Stream stream) {
  const std::size_t bytes = view.bytes();
  if (bytes == 0) return;
  auto* data = static_cast<std::byte*>(view.data);
  std::size_t done = std::min(zero_bytes, bytes);
  backend.copy(data, zeros, done, stream);
  while (done < bytes) {
    const std::size_t next = std::min(done, bytes - done);
    backend.copy(data + done, data, next, stream);
    done += next;
  }
}

}  // namespace ncclkit::detail
