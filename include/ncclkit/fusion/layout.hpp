#pragma once
/// `FusedLayout`: where each of many tensors lives inside one allocation per element type.
///
/// Pure host arithmetic, no backend: register tensors (name, shape, element type), then
/// `finalize()` gives each an offset, aligned, in reverse registration order. Backward
/// produces gradients in roughly that order, so a bucket of gradients that become ready
/// together is one contiguous range of the allocation and a collective over it runs in place
/// (the tensors *are* views into the buffer: no pack, no unpack). A `BucketPlan`
/// (fusion/bucket_plan.hpp) cuts that order into buckets; a `FusedBuffer` allocates
/// `total_bytes(type)` per element type and hands out views at `offset_bytes(slot)`.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <array>             // std::array
#include <bit>               // std::has_single_bit
#include <compare>           // std::strong_ordering
#include <cstddef>           // std::size_t
#include <cstdint>           // std::int64_t, std::uint32_t
#include <functional>        // std::less<> (heterogeneous lookup by name)
#include <initializer_list>  // std::initializer_list
#include <limits>            // std::numeric_limits
#include <map>               // std::map
#include <optional>          // std::optional
#include <span>              // std::span
#include <string>            // std::string, std::to_string
#include <string_view>       // std::string_view
#include <utility>           // std::move
#include <vector>            // std::vector

#include "ncclkit/core/detail/align.hpp"
#include "ncclkit/core/dtype.hpp"

namespace ncclkit::fusion {

/// Handle of a registered tensor: its index in registration order (0, 1, 2, ...). Cheap to
/// copy and compare; valid for the layout that returned it and for plans made from it.
struct Slot {
  std::uint32_t index = 0;
  // Written out, not defaulted: nvcc 13 never emits the operator== that a defaulted <=>
  // declares, so `a == b` in a .cu file would not link.
  friend constexpr bool operator==(Slot a, Slot b) { return a.index == b.index; }
  friend constexpr auto operator<=>(Slot a, Slot b) { return a.index <=> b.index; }
};

/// Options of `FusedLayout::finalize`.
struct LayoutOptions {
  /// Alignment, in bytes, of every tensor's offset (and of each allocation's size). 256 by
  /// default: what cudaMalloc returns, so that every view is as aligned as its own allocation
  /// would be (vectorised kernels load 16 bytes at a time; NCCL picks faster paths for aligned
  /// buffers). A power of two; raised to the element size where that is larger.
  std::size_t alignment = 256;
};

/// Number of element types (`DataType` values); layouts keep one allocation per type.
inline constexpr std::size_t kDataTypeCount = static_cast<std::size_t>(DataType::kFloat64) + 1;

/// Tensors registered by name, shape and element type, laid out in one aligned allocation per
/// element type. Register with `add`, then `finalize` once; offsets exist only after that.
/// Not thread-safe; every rank that shares a plan must register the same tensors in the same
/// order (the plan's fingerprint checks it).
class FusedLayout {
 public:
  FusedLayout() = default;

  /// Registers a tensor. `shape` lists its extents ({} is a scalar of one element; an extent of
  /// 0 makes a zero-element tensor, which is allowed: it gets an offset but no bytes).
  /// Throws ConfigError, naming the tensor, for an empty or duplicate name, a negative extent,
  /// an element count or byte size that overflows std::size_t, more than 2^32 - 1 tensors, or a
  /// call after `finalize`.
  Slot add(std::string name, std::span<const std::int64_t> shape, DataType dtype) {
    const std::string what = "ncclkit: FusedLayout::add(\"" + name + "\")";
    if (finalized_) {
      throw ConfigError(what + ": the layout is finalized; register every tensor before finalize()");
    }
    if (name.empty()) throw ConfigError(what + ": the tensor needs a name (an empty name cannot be looked up)");
    if (slots_.size() >= std::numeric_limits<std::uint32_t>::max()) {
      throw ConfigError(what + ": too many tensors (at most " +
                        std::to_string(std::numeric_limits<std::uint32_t>::max() - 1) + ")");
    }
    if (const auto found = by_name_.find(name); found != by_name_.end()) {
      throw ConfigError(what + ": a tensor of that name is already registered (slot " +
                        std::to_string(found->second.index) + "); names must be unique");
    }
    std::size_t count = 1;
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] < 0) {
        throw ConfigError(what + ": extent " + std::to_string(d) + " is " + std::to_string(shape[d]) +
                          "; extents must be 0 or more");
      }
      const auto extent = static_cast<std::size_t>(shape[d]);
      if (extent != 0 && count > std::numeric_limits<std::size_t>::max() / extent) {
        throw ConfigError(what + ": the element count overflows std::size_t at extent " + std::to_string(d));
      }
      count *= extent;
    }
    if (count > std::numeric_limits<std::size_t>::max() / size_of(dtype)) {
      throw ConfigError(what + ": " + std::to_string(count) + " elements of " + std::string(name_of(dtype)) +
                        " overflow std::size_t in bytes");
    }
    const Slot slot{static_cast<std::uint32_t>(slots_.size())};
    by_name_.emplace(name, slot);
    slots_.push_back(Entry{std::move(name), std::vector<std::int64_t>(shape.begin(), shape.end()), count, dtype});
    return slot;
  }
  Slot add(std::string name, std::initializer_list<std::int64_t> shape, DataType dtype) {
    return add(std::move(name), std::span<const std::int64_t>(shape.begin(), shape.size()), dtype);
  }

  /// Assigns every tensor its offset: per element type, tensors in reverse registration order,
  /// each at the next multiple of the alignment. Throws ConfigError for an alignment that is
  /// not a power of two, a total that overflows std::size_t (naming the tensor), or a second call.
  void finalize(const LayoutOptions& options = {}) {
    if (finalized_) throw ConfigError("ncclkit: FusedLayout::finalize: already finalized (call it once)");
    if (!std::has_single_bit(options.alignment)) {
      throw ConfigError("ncclkit: FusedLayout::finalize: alignment " + std::to_string(options.alignment) +
                        " is not a power of two (256 suits every backend)");
    }
    // Computed aside and committed at the end, so that a refused layout is left as it was.
    const auto align_for = [&](DataType dtype) {
      return options.alignment > size_of(dtype) ? options.alignment : size_of(dtype);
    };
    std::vector<std::size_t> offsets(slots_.size());
    std::array<std::vector<Slot>, kDataTypeCount> order{};
    std::array<std::size_t, kDataTypeCount> cursor{};
    for (std::size_t i = slots_.size(); i-- > 0;) {
      const Entry& entry = slots_[i];
      const std::size_t type = static_cast<std::size_t>(entry.dtype);
      const std::size_t align = align_for(entry.dtype);
      const std::size_t bytes = entry.count * size_of(entry.dtype);
      const std::size_t limit = std::numeric_limits<std::size_t>::max() - align;
      if (bytes > limit || cursor[type] > limit - bytes) {
        throw ConfigError("ncclkit: FusedLayout::finalize: the " + std::string(name_of(entry.dtype)) +
                          " allocation overflows std::size_t at tensor \"" + entry.name + "\"");
      }
      offsets[i] = cursor[type];
      cursor[type] = ncclkit::detail::align_up(cursor[type] + bytes, align);
      order[type].push_back(Slot{static_cast<std::uint32_t>(i)});
    }
    for (std::size_t i = 0; i < slots_.size(); ++i) slots_[i].offset_bytes = offsets[i];
    order_ = std::move(order);
    total_bytes_ = cursor;
    alignment_ = options.alignment;
    finalized_ = true;
  }

  /// Whether `finalize` has run.
  bool finalized() const { return finalized_; }
  /// Number of registered tensors.
  std::size_t size() const { return slots_.size(); }
  /// The alignment `finalize` used (0 before).
  std::size_t alignment() const { return alignment_; }
  /// The alignment of offsets in an allocation of `dtype`: the layout's, or the element size
  /// where that is larger.
  std::size_t alignment_of(DataType dtype) const { return alignment_ > size_of(dtype) ? alignment_ : size_of(dtype); }

  /// The slot of the tensor called `name`, if one is registered.
  std::optional<Slot> find(std::string_view name) const {
    const auto found = by_name_.find(name);
    if (found == by_name_.end()) return std::nullopt;
    return found->second;
  }
  /// The slot of the tensor called `name`; ConfigError naming it when there is none.
  Slot slot(std::string_view name) const {
    if (const auto found = find(name)) return *found;
    throw ConfigError("ncclkit: FusedLayout: no tensor is registered as \"" + std::string(name) + "\" (" +
                      std::to_string(slots_.size()) + " tensors registered)");
  }

  const std::string& name(Slot slot) const { return entry(slot).name; }
  /// The extents given to `add`.
  std::span<const std::int64_t> shape(Slot slot) const { return entry(slot).shape; }
  /// Number of elements (the product of the extents).
  std::size_t count(Slot slot) const { return entry(slot).count; }
  DataType dtype(Slot slot) const { return entry(slot).dtype; }
  /// Size in bytes (count × element size; 0 for a zero-element tensor).
  std::size_t bytes(Slot slot) const { return entry(slot).count * size_of(entry(slot).dtype); }
  /// Offset in bytes from the start of the allocation of `dtype(slot)`; a multiple of
  /// `alignment_of(dtype(slot))`. Needs `finalize`.
  std::size_t offset_bytes(Slot slot) const {
    require_finalized("offset_bytes");
    return entry(slot).offset_bytes;
  }
  /// Offset in elements of `dtype(slot)` from the start of its allocation. Needs `finalize`.
  std::size_t offset_elements(Slot slot) const { return offset_bytes(slot) / size_of(dtype(slot)); }

  /// Bytes to allocate for `dtype` (0 when no tensor has that type): a multiple of
  /// `alignment_of(dtype)`. Needs `finalize`.
  std::size_t total_bytes(DataType dtype) const {
    require_finalized("total_bytes");
    return total_bytes_[static_cast<std::size_t>(dtype)];
  }
  /// The tensors of `dtype` by increasing offset (reverse registration order), zero-element
  /// ones included. Needs `finalize`.
  std::span<const Slot> order(DataType dtype) const {
    require_finalized("order");
    return order_[static_cast<std::size_t>(dtype)];
  }
  /// The element types that have at least one tensor, in enum order.
  std::vector<DataType> element_types() const {
    std::vector<DataType> types;
    for (std::size_t t = 0; t < kDataTypeCount; ++t) {
      const auto type = static_cast<DataType>(t);
      for (const Entry& e : slots_) {
        if (e.dtype == type) {
          types.push_back(type);
          break;
        }
      }
    }
    return types;
  }

 private:
  struct Entry {
    std::string name;
    std::vector<std::int64_t> shape;
    std::size_t count = 0;
    DataType dtype = DataType::kFloat32;
    std::size_t offset_bytes = 0;
  };

  const Entry& entry(Slot slot) const {
    if (slot.index >= slots_.size()) {
      throw ConfigError("ncclkit: FusedLayout: slot " + std::to_string(slot.index) + " is out of range (" +
                        std::to_string(slots_.size()) + " tensors registered)");
    }
    return slots_[slot.index];
  }
  void require_finalized(const char* query) const {
    if (!finalized_) {
      throw ConfigError(std::string("ncclkit: FusedLayout::") + query +
                        ": offsets exist only after finalize(); register every tensor, then call finalize()");
    }
  }

  std::vector<Entry> slots_;
  std::map<std::string, Slot, std::less<>> by_name_;
  std::array<std::vector<Slot>, kDataTypeCount> order_{};
  std::array<std::size_t, kDataTypeCount> total_bytes_{};
  std::size_t alignment_ = 0;
  bool finalized_ = false;
};

}  // namespace ncclkit::fusion
