#pragma once
/// `FusedBuffer<B>`: the memory of a finalized `FusedLayout`, one allocation per element type
/// from a backend, and views of each tensor into it.
///
/// The model's parameters or gradients *are* these views (bind them once, at setup), so a
/// collective over a bucket of the layout runs in place: no pack, no unpack. The memory is of
/// the backend's kind (`B::memory_kind`): device memory through the NCCL backend, host memory
/// through Gloo. Contents start undefined, as `cudaMalloc`'s do.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <array>        // std::array
#include <exception>    // std::exception
#include <cstddef>      // std::byte, std::size_t
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::move, std::exchange

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/fusion/layout.hpp"

namespace ncclkit::fusion {

/// One allocation per element type of a finalized layout, from `backend.allocate`, freed with
/// `backend.deallocate`. Move-only; the backend must outlive the buffer. Views stay valid for
/// the buffer's lifetime (moving the buffer keeps them: the allocations move with it).
/// Const member functions are safe to call from several threads.
template <Backend B>
class FusedBuffer {
 public:
  /// Allocates `layout.total_bytes(type)` for every element type that has a non-empty tensor.
  /// ConfigError when the layout is not finalized; what `allocate` throws when memory runs
  /// out (nothing leaks: allocations already made are freed).
  FusedBuffer(B& backend, FusedLayout layout) : backend_(&backend), layout_(std::move(layout)) {
    if (!layout_.finalized()) {
      throw ConfigError("ncclkit: FusedBuffer: the layout is not finalized; call layout.finalize() first");
    }
    try {
      for (DataType type : layout_.element_types()) {
        const std::size_t bytes = layout_.total_bytes(type);
        if (bytes > 0) data_[index(type)] = static_cast<std::byte*>(backend_->allocate(bytes));
      }
    } catch (...) {
      release();
      throw;
    }
  }

  FusedBuffer(FusedBuffer&& other) noexcept
      : backend_(other.backend_), layout_(std::move(other.layout_)), data_(std::exchange(other.data_, {})) {}
  FusedBuffer& operator=(FusedBuffer&& other) noexcept {
    if (this != &other) {
      release();
      backend_ = other.backend_;
      layout_ = std::move(other.layout_);
      data_ = std::exchange(other.data_, {});
    }
    return *this;
  }
  FusedBuffer(const FusedBuffer&) = delete;
  FusedBuffer& operator=(const FusedBuffer&) = delete;
  /// Frees the allocations. Work still running on them (a collective on a stream) must be
  /// waited for first.
  ~FusedBuffer() { release(); }

  /// The view of a tensor: `layout().count(slot)` elements of its type at its offset, of kind
  /// `B::memory_kind`. A zero-element tensor gets an empty view (null data, count 0).
  /// ConfigError for a slot out of range.
  TensorView view(Slot slot) const {
    const DataType type = layout_.dtype(slot);
    const std::size_t count = layout_.count(slot);
    if (count == 0) return TensorView{nullptr, 0, type, B::memory_kind};
    return TensorView{data_[index(type)] + layout_.offset_bytes(slot), count, type, B::memory_kind};
  }
  /// The view of the tensor called `name`; ConfigError naming it when none is registered.
  TensorView view(std::string_view name) const { return view(layout_.slot(name)); }

  /// The tensor as `std::span<T>` (memory of the backend's kind: device pointers through the
  /// NCCL backend, for kernels, not for host code). ConfigError, naming the tensor and both
  /// types, when `T` is not its element type. Empty span for a zero-element tensor.
  template <class T>
  std::span<T> span(Slot slot) const {
    const TensorView v = view(slot);
    if (v.dtype != data_type_v<T>) {
      throw ConfigError("ncclkit: FusedBuffer::span<" + std::string(name_of(data_type_v<T>)) + ">(\"" +
                        layout_.name(slot) + "\"): the tensor holds " + std::string(name_of(v.dtype)) +
                        "; ask for span<> of its element type");
    }
    return std::span<T>(static_cast<T*>(v.data), v.count);
  }
  template <class T>
  std::span<T> span(std::string_view name) const {
    return span<T>(layout_.slot(name));
  }

  /// The whole allocation of `type` (padding included), e.g. to zero it, scale it or reduce it
  /// in one collective. Empty view when no tensor has that type.
  TensorView all(DataType type) const {
    const std::size_t bytes = layout_.total_bytes(type);
    return TensorView{data_[index(type)], bytes / size_of(type), type, B::memory_kind};
  }

  /// Sets the bytes of every allocation that no tensor covers (the alignment padding) to zero,
  /// on `stream`: a bucket reduced whole then sums zeros there, and nothing that counts
  /// non-finite values finds a NaN that no tensor holds.
  void zero_padding(typename B::Stream stream) const {
    for (DataType type : layout_.element_types()) {
      std::size_t end = 0;
      const auto gap = [&](std::size_t from, std::size_t to) {
        if (to > from) {
          backend_->fill_zero(TensorView{data_[index(type)] + from, to - from, DataType::kUint8, B::memory_kind},
                              stream);
        }
      };
      for (Slot slot : layout_.order(type)) {
        gap(end, layout_.offset_bytes(slot));
        end = layout_.offset_bytes(slot) + layout_.bytes(slot);
      }
      gap(end, layout_.total_bytes(type));
    }
  }

  /// Start of the allocation of `type`; null when it has no bytes.
  void* data(DataType type) const { return data_[index(type)]; }
  const FusedLayout& layout() const { return layout_; }
  B& backend() const { return *backend_; }

 private:
  static std::size_t index(DataType type) { return static_cast<std::size_t>(type); }

  void release() noexcept {
    for (std::byte*& pointer : data_) {
      if (pointer == nullptr) continue;
      try {
        backend_->deallocate(std::exchange(pointer, nullptr));
      } catch (const std::exception& e) {
        log_warn(std::string("ncclkit: FusedBuffer: freeing an allocation failed: ") + e.what());
      }
    }
  }

  B* backend_;
  FusedLayout layout_;
  std::array<std::byte*, kDataTypeCount> data_{};
};

}  // namespace ncclkit::fusion
