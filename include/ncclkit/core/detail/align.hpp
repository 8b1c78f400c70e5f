#pragma once
/// align_up: the next multiple of a power of two, for offsets and sizes (layouts, windows).

#include <cstddef>  // std::size_t

namespace ncclkit::detail {

/// The smallest multiple of `align` (a power of two) that is at least `value`.
constexpr std::size_t align_up(std::size_t value, std::size_t align) { return (value + align - 1) & ~(align - 1); }

}  // namespace ncclkit::detail
