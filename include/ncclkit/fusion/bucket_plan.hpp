#pragma once
/// `BucketPlan`: a finalized `FusedLayout` cut into buckets, each one collective over one
/// contiguous byte range of one element type's allocation, listed in the order every rank
/// launches them.
///
/// Pure host arithmetic, no backend. The plan is what ranks must agree on (NCCL deadlocks when
/// ranks issue collectives in different orders or sizes), so it has a `fingerprint()` that is
/// the same in every process on every platform, and a byte encoding (`serialize`, `parse`) for
/// rank 0 to send its plan to the others through a store or a broadcast.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <algorithm>  // std::sort, std::lower_bound
#include <array>      // std::array
#include <cstddef>    // std::byte, std::size_t
#include <cstdint>    // std::uint32_t, std::uint64_t
#include <cstdio>     // std::snprintf
#include <limits>     // std::numeric_limits
#include <optional>   // std::optional
#include <span>       // std::span
#include <string>     // std::string, std::to_string
#include <utility>    // std::move
#include <vector>     // std::vector

#include "ncclkit/core/detail/align.hpp"
#include "ncclkit/core/detail/hex.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/fusion/detail/byte_codec.hpp"
#include "ncclkit/fusion/layout.hpp"

namespace ncclkit::fusion {

/// Options of `BucketPlan::compute`. The defaults are PyTorch DDP's.
struct BucketOptions {
  /// Cap on a bucket's size in bytes (25 MiB): large enough that each collective runs near
  /// full bandwidth, small enough that several buckets overlap the rest of backward. A tensor
  /// larger than the cap gets a bucket of its own.
  std::size_t bucket_bytes = std::size_t{25} << 20;
  /// Cap on the first bucket of each element type (1 MiB): smaller, so that the first
  /// collective starts as soon as the last layers' gradients exist instead of waiting for
  /// 25 MiB of them.
  std::size_t first_bucket_bytes = std::size_t{1} << 20;
  /// A bucket holding less than this is not closed by a tensor that does not fit: the tensor
  /// joins it, past the cap (0, the default: every bucket closes at its cap). A bias next to a
  /// weight larger than the cap then shares the weight's collective instead of paying a
  /// collective's fixed cost alone. Buckets then hold at least this much, but a type's last.
  std::size_t min_bucket_bytes = 0;
};

/// One collective: the bytes [begin_bytes, end_bytes) of the allocation of `dtype`.
struct Bucket {
  DataType dtype = DataType::kFloat32;
  /// Start, a multiple of the layout's alignment for `dtype`.
  std::size_t begin_bytes = 0;
  /// End, aligned like the start: consecutive buckets of a type tile its allocation, so the
  /// alignment padding inside a bucket is reduced with it (harmless, and it keeps each bucket
  /// one range).
  std::size_t end_bytes = 0;
  /// The non-empty tensors inside, by increasing offset (reverse registration order).
  std::vector<Slot> slots;

  std::size_t bytes() const { return end_bytes - begin_bytes; }
  /// The range in elements of `dtype`, for a collective on a typed view.
  std::size_t begin_elements() const { return begin_bytes / size_of(dtype); }
  std::size_t count() const { return bytes() / size_of(dtype); }
  friend bool operator==(const Bucket&, const Bucket&) = default;
};

/// Buckets of a finalized layout, in launch order. Immutable once made; copyable.
///
/// How buckets are cut: walk the tensors in reverse registration order (the order backward
/// produces gradients) and add each non-empty tensor to the open bucket of its element type
/// while the bucket stays within the cap (`first_bucket_bytes` for a type's first bucket,
/// `bucket_bytes` after); a tensor that does not fit closes the bucket and opens the next,
/// unless the bucket holds less than `min_bucket_bytes`: then the tensor joins it.
/// Buckets are then ordered by when they would be complete on that walk (the position of
/// their last tensor), so with gradients arriving in backward order no bucket waits for a
/// later one. Zero-element tensors belong to no bucket: they have nothing to reduce.
///
/// A tensor is never split across buckets. Its gradient is written by one kernel and becomes
/// ready at once, so pieces of it could not start earlier than the whole; NCCL already cuts
/// one large collective into pipelined chunks across its channels, so splitting would add a
/// launch and a latency for nothing. Keeping tensors whole also keeps "which bucket does this
/// tensor complete" a single answer. (Chunking to overlap a cast with a collective is the
/// compression pipeline's business, inside a bucket.)
class BucketPlan {
 public:
  /// The plan for `layout` (which must be finalized) under `options`. ConfigError for an
  /// unfinalized layout or a cap of 0.
  static BucketPlan compute(const FusedLayout& layout, const BucketOptions& options = {}) {
    if (!layout.finalized()) {
      throw ConfigError("ncclkit: BucketPlan::compute: the layout is not finalized; call layout.finalize() first");
    }
    if (options.bucket_bytes == 0 || options.first_bucket_bytes == 0) {
      throw ConfigError("ncclkit: BucketPlan::compute: bucket_bytes (" + std::to_string(options.bucket_bytes) +
                        ") and first_bucket_bytes (" + std::to_string(options.first_bucket_bytes) +
                        ") must be at least 1 byte");
    }
    BucketPlan plan(layout);
    struct Open {
      Bucket bucket;
      std::size_t last_position = 0;  // walk position of the bucket's last tensor
      std::size_t closed = 0;         // buckets of this type closed so far
    };
    std::array<Open, kDataTypeCount> open{};
    std::vector<std::pair<std::size_t, Bucket>> closed;  // (completion position, bucket)
    const auto close = [&](Open& o) {
      if (o.bucket.slots.empty()) return;
      closed.emplace_back(o.last_position, std::move(o.bucket));
      o.bucket = Bucket{};
      ++o.closed;
    };
    const std::size_t n = layout.size();
    for (std::size_t position = 0; position < n; ++position) {
      const Slot slot{static_cast<std::uint32_t>(n - 1 - position)};
      if (layout.count(slot) == 0) continue;
      const DataType type = layout.dtype(slot);
      Open& o = open[static_cast<std::size_t>(type)];
      const std::size_t begin = layout.offset_bytes(slot);
      const std::size_t end = ncclkit::detail::align_up(begin + layout.bytes(slot), layout.alignment_of(type));
      const std::size_t cap = o.closed == 0 ? options.first_bucket_bytes : options.bucket_bytes;
      const bool fits = end - o.bucket.begin_bytes <= cap || o.bucket.bytes() < options.min_bucket_bytes;
      if (!o.bucket.slots.empty() && !fits) close(o);
      if (o.bucket.slots.empty()) o.bucket = Bucket{type, begin, end, {}};
      o.bucket.end_bytes = end;
      o.bucket.slots.push_back(slot);
      o.last_position = position;
    }
    for (Open& o : open) close(o);
    std::sort(closed.begin(), closed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (auto& [position, bucket] : closed) plan.buckets_.push_back(std::move(bucket));
    plan.index_buckets();
    return plan;
  }

  /// The plan that `serialize` encoded (typically rank 0's), checked against this process's
  /// `layout`: the same tensors (names, element types, element counts, in registration order)
  /// and alignment, and buckets that tile each allocation in order at tensor boundaries.
  /// ConfigError, saying what differs or where the bytes are malformed, otherwise.
  static BucketPlan parse(std::span<const std::byte> bytes, const FusedLayout& layout);

  /// The buckets in launch order.
  std::span<const Bucket> buckets() const { return buckets_; }
  std::size_t size() const { return buckets_.size(); }
  const Bucket& operator[](std::size_t index) const { return buckets_[index]; }

  /// Index of the bucket holding `slot`; nullopt for a zero-element tensor (in no bucket).
  std::optional<std::size_t> bucket_of(Slot slot) const {
    const std::uint32_t b = tensor(slot).bucket;
    if (b == kNoBucket) return std::nullopt;
    return b;
  }
  /// Number of tensors of the layout the plan was made for.
  std::size_t tensor_count() const { return tensors_.size(); }
  /// Name and element count of a tensor, copied from the layout (the plan outlives it).
  const std::string& name(Slot slot) const { return tensor(slot).name; }
  std::size_t count(Slot slot) const { return tensor(slot).count; }

  /// FNV-1a 64 of `serialize()`: covers every tensor's name, element type and count, the
  /// alignment, and every bucket's type and boundaries. Equal plans give equal fingerprints in
  /// any process on any platform; ranks can all-gather it to check they agree.
  std::uint64_t fingerprint() const { return ncclkit::detail::fnv1a64(serialize()); }

  /// The plan as bytes (little-endian): "NKBP", version 1, alignment u64, tensor count u32,
  /// then per tensor in registration order its name (u32 length + bytes), type u8 and count
  /// u64, then bucket count u32 and per bucket in launch order its type u8, begin u64, end u64.
  std::vector<std::byte> serialize() const {
    ncclkit::detail::ByteWriter out;
    out.u32(kMagic);
    out.u8(kVersion);
    out.u64(alignment_);
    out.u32(static_cast<std::uint32_t>(tensors_.size()));
    for (const Tensor& t : tensors_) {
      out.text(t.name);
      out.u8(static_cast<std::uint8_t>(t.dtype));
      out.u64(t.count);
    }
    out.u32(static_cast<std::uint32_t>(buckets_.size()));
    for (const Bucket& b : buckets_) {
      out.u8(static_cast<std::uint8_t>(b.dtype));
      out.u64(b.begin_bytes);
      out.u64(b.end_bytes);
    }
    return std::move(out).take();
  }

  /// A one-line summary: "12 buckets, float: 97.5 MiB in 5 (1.0 to 25.0 MiB), fingerprint 0123abcd...".
  std::string describe() const;

  friend bool operator==(const BucketPlan& a, const BucketPlan& b) {
    return a.alignment_ == b.alignment_ && a.buckets_ == b.buckets_ && a.tensors_ == b.tensors_;
  }

 private:
  static constexpr std::uint32_t kMagic = 0x50424b4e;  // "NKBP" as little-endian bytes
  static constexpr std::uint8_t kVersion = 1;
  static constexpr std::uint32_t kNoBucket = std::numeric_limits<std::uint32_t>::max();

  struct Tensor {
    std::string name;
    DataType dtype = DataType::kFloat32;
    std::size_t count = 0;
    std::uint32_t bucket = kNoBucket;
    friend bool operator==(const Tensor&, const Tensor&) = default;
  };

  explicit BucketPlan(const FusedLayout& layout) : alignment_(layout.alignment()) {
    tensors_.reserve(layout.size());
    for (std::uint32_t i = 0; i < layout.size(); ++i) {
      tensors_.push_back(Tensor{layout.name(Slot{i}), layout.dtype(Slot{i}), layout.count(Slot{i})});
    }
  }

  const Tensor& tensor(Slot slot) const {
    if (slot.index >= tensors_.size()) {
      throw ConfigError("ncclkit: BucketPlan: slot " + std::to_string(slot.index) + " is out of range (" +
                        std::to_string(tensors_.size()) + " tensors)");
    }
    return tensors_[slot.index];
  }

  void index_buckets() {
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      for (Slot s : buckets_[b].slots) tensors_[s.index].bucket = static_cast<std::uint32_t>(b);
    }
  }

  std::size_t alignment_ = 0;
  std::vector<Tensor> tensors_;
  std::vector<Bucket> buckets_;
};

inline BucketPlan BucketPlan::parse(std::span<const std::byte> bytes, const FusedLayout& layout) {
  if (!layout.finalized()) {
    throw ConfigError("ncclkit: BucketPlan::parse: the layout is not finalized; call layout.finalize() first");
  }
  ncclkit::detail::ByteReader in(bytes, "ncclkit: BucketPlan::parse");
  if (in.u32("magic") != kMagic) throw in.error("magic", "these bytes are not a serialized BucketPlan");
  if (const auto version = in.u8("version"); version != kVersion) {
    throw in.error("version", "version " + std::to_string(version) + " is not the " + std::to_string(kVersion) +
                                  " this build reads; every rank must run the same ncclkit");
  }
  if (const auto alignment = in.u64("alignment"); alignment != layout.alignment()) {
    throw in.error("alignment", "the plan aligns tensors at " + std::to_string(alignment) + " bytes, this layout at " +
                                    std::to_string(layout.alignment()) +
                                    "; finalize every rank's layout with the same LayoutOptions");
  }
  const std::uint32_t tensor_count = in.u32("tensor count");
  if (tensor_count != layout.size()) {
    throw in.error("tensor count", "the plan has " + std::to_string(tensor_count) + " tensors, this layout " +
                                       std::to_string(layout.size()) + "; every rank must register the same tensors");
  }
  for (std::uint32_t i = 0; i < tensor_count; ++i) {
    const std::string field = "tensor " + std::to_string(i);
    std::string name = in.text(field + " name");
    const std::uint8_t type = in.u8(field + " type");
    const std::uint64_t count = in.u64(field + " count");
    const Slot slot{i};
    if (name != layout.name(slot) || type != static_cast<std::uint8_t>(layout.dtype(slot)) ||
        count != layout.count(slot)) {
      const std::string theirs =
          "\"" + name + "\" (" +
          (type < kDataTypeCount ? std::string(name_of(static_cast<DataType>(type))) : "type " + std::to_string(type)) +
          ", " + std::to_string(count) + " elements)";
      const std::string ours = "\"" + layout.name(slot) + "\" (" + std::string(name_of(layout.dtype(slot))) + ", " +
                               std::to_string(layout.count(slot)) + " elements)";
      throw in.error(field, "the plan has " + theirs + " where this layout has " + ours +
                                "; every rank must register the same tensors in the same order");
    }
  }
  BucketPlan plan(layout);
  const std::uint32_t bucket_count = in.u32("bucket count");
  // Each bucket takes 17 bytes: a count larger than the bytes left is malformed, not a reason
  // to reserve gigabytes.
  if (bucket_count > in.remaining() / 17) throw in.error("bucket count", "more buckets than the bytes hold");
  std::array<std::size_t, kDataTypeCount> next_begin{};     // where the next bucket of a type starts
  std::array<std::size_t, kDataTypeCount> next_position{};  // index into layout.order(type)
  for (std::uint32_t b = 0; b < bucket_count; ++b) {
    const std::string field = "bucket " + std::to_string(b);
    const std::uint8_t type_code = in.u8(field + " type");
    const std::uint64_t begin = in.u64(field + " begin");
    const std::uint64_t end = in.u64(field + " end");
    if (type_code >= kDataTypeCount) throw in.error(field, "element type " + std::to_string(type_code) + " is unknown");
    const auto type = static_cast<DataType>(type_code);
    const std::size_t t = type_code;
    const std::string range =
        std::string(name_of(type)) + " bytes [" + std::to_string(begin) + ", " + std::to_string(end) + ")";
    if (begin != next_begin[t]) {
      throw in.error(field, range + " does not start where the previous " + std::string(name_of(type)) +
                                " bucket ended (" + std::to_string(next_begin[t]) + ")");
    }
    if (end <= begin || end > layout.total_bytes(type)) {
      throw in.error(field, range + " is empty or runs past the allocation (" +
                                std::to_string(layout.total_bytes(type)) + " bytes)");
    }
    Bucket bucket{type, begin, end, {}};
    const std::span<const Slot> order = layout.order(type);
    std::size_t& p = next_position[t];
    for (; p < order.size() && layout.offset_bytes(order[p]) < end; ++p) {
      if (layout.count(order[p]) != 0) bucket.slots.push_back(order[p]);
    }
    const Slot last = bucket.slots.empty() ? Slot{} : bucket.slots.back();
    if (bucket.slots.empty() ||
        ncclkit::detail::align_up(layout.offset_bytes(last) + layout.bytes(last), layout.alignment_of(type)) != end) {
      throw in.error(field, range + " does not end where a tensor ends; buckets never split a tensor");
    }
    next_begin[t] = end;
    plan.buckets_.push_back(std::move(bucket));
  }
  if (in.remaining() != 0) throw in.error("end", std::to_string(in.remaining()) + " bytes follow the last bucket");
  for (std::size_t t = 0; t < kDataTypeCount; ++t) {
    const auto type = static_cast<DataType>(t);
    if (next_begin[t] != layout.total_bytes(type)) {
      throw in.error("buckets", "the " + std::string(name_of(type)) + " buckets cover " +
                                    std::to_string(next_begin[t]) + " of the allocation's " +
                                    std::to_string(layout.total_bytes(type)) + " bytes");
    }
  }
  plan.index_buckets();
  return plan;
}

inline std::string BucketPlan::describe() const {
  std::string text = std::to_string(buckets_.size()) + (buckets_.size() == 1 ? " bucket" : " buckets");
  const auto mib = [](std::size_t bytes) {
    char out[32];
    std::snprintf(out, sizeof out, "%.1f", static_cast<double>(bytes) / (1 << 20));
    return std::string(out);
  };
  for (std::size_t t = 0; t < kDataTypeCount; ++t) {
    std::size_t n = 0, total = 0, smallest = std::numeric_limits<std::size_t>::max(), largest = 0;
    for (const Bucket& b : buckets_) {
      if (static_cast<std::size_t>(b.dtype) != t) continue;
      ++n;
      total += b.bytes();
      smallest = std::min(smallest, b.bytes());
      largest = std::max(largest, b.bytes());
    }
    if (n == 0) continue;
    text += ", " + std::string(name_of(static_cast<DataType>(t))) + ": " + mib(total) + " MiB in " + std::to_string(n) +
            " (" + mib(smallest) + " to " + mib(largest) + " MiB)";
  }
  return text + ", fingerprint " + ncclkit::detail::hex64(fingerprint());
}

}  // namespace ncclkit::fusion
