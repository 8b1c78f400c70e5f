#pragma once
/// Non-owning views of typed buffers, as collectives and fused buffers see them.

#include <cstddef>      // std::size_t
#include <span>         // std::span
#include <type_traits>  // std::remove_const_t

#include "ncclkit/core/dtype.hpp"

namespace ncclkit {

/// Where a buffer lives. Collectives of the NCCL backend need kDevice, Gloo's need kHost.
enum class MemoryKind : int { kHost, kDevice };

/// A buffer of `count` elements of `dtype` at `data`. Does not own the memory.
struct TensorView {
  void* data = nullptr;
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  MemoryKind where = MemoryKind::kHost;

  constexpr std::size_t bytes() const { return count * size_of(dtype); }
  constexpr bool empty() const { return count == 0; }

  /// A view of `values` with the element type taken from `T`.
  template <class T>
  static constexpr TensorView of(std::span<T> values, MemoryKind where = MemoryKind::kHost) {
    return TensorView{const_cast<void*>(static_cast<const void*>(values.data())), values.size(),
                      data_type_v<std::remove_const_t<T>>, where};
  }
  template <class T>
  static constexpr TensorView of(T* data, std::size_t count, MemoryKind where = MemoryKind::kHost) {
    return of(std::span<T>(data, count), where);
  }
};

}  // namespace ncclkit
