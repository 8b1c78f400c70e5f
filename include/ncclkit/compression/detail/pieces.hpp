#pragma once
/// How the compressed reducers cut a plan's buckets into the pieces they reduce: one piece per
/// bucket (for a bucket of one tensor, just that tensor's elements), except that a compressed
/// bucket (float32) is cut into chunks of at most `chunk_bytes` so that encoding one chunk
/// overlaps reducing the one before. Compressed pieces also get a range of the 16-bit wire
/// buffer. Pure arithmetic.

#include <cstddef>  // std::size_t
#include <vector>   // std::vector

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/fusion/bucket_plan.hpp"

namespace ncclkit::compression::detail {

struct Piece {
  std::size_t bucket = 0;
  std::size_t begin_bytes = 0;  // in the allocation of the bucket's element type
  std::size_t count = 0;        // elements
  bool encoded = false;
  std::size_t wire_begin_bytes = 0;  // in the wire buffer (encoded pieces)
};

struct Pieces {
  std::vector<Piece> pieces;       // in plan order
  std::vector<std::size_t> first;  // per bucket, and one past the last: pieces of bucket b are [first[b], first[b + 1])
  std::size_t wire_bytes = 0;      // the wire buffer's size
  std::size_t encoded = 0;         // encoded pieces
};

/// Alignment of pieces inside a bucket and in the wire buffer, in elements and bytes: keeps
/// every piece's float32 and 16-bit ranges aligned for vector loads.
inline constexpr std::size_t kPieceElements = 256;
inline constexpr std::size_t kWireAlignment = 512;

inline std::size_t round_down_to_piece(std::size_t n) { return n / kPieceElements * kPieceElements; }

/// Where a compressed bucket of `count` elements is cut, for chunks of at most `per` elements
/// (0: no limit; otherwise rounded down to a multiple of kPieceElements, at least one): 0, the
/// cuts, `count`; every cut a multiple of kPieceElements, no chunk longer than `per`. With more
/// than one chunk the first and the last are a quarter of the others: the pipeline's fill
/// (encoding the first chunk before anything is reduced) and drain (decoding the last after
/// everything is) cost what these small chunks take, while the large middle ones keep the
/// collectives efficient.
inline std::vector<std::size_t> chunk_bounds(std::size_t count, std::size_t per) {
  if (per == 0 || count <= per) return {0, count};
  per = round_down_to_piece(per) == 0 ? kPieceElements : round_down_to_piece(per);
  if (count <= per) return {0, count};
  const std::size_t edge = round_down_to_piece(per / 4) == 0 ? kPieceElements : round_down_to_piece(per / 4);
  std::vector<std::size_t> bounds{0};
  std::size_t from = 0, to = count;
  if (count > 2 * edge + kPieceElements) {
    from = edge;
    // Rounded up, so that the last chunk (count - to) is at most `edge` long.
    to = round_down_to_piece(count - edge + kPieceElements - 1);
    bounds.push_back(from);
  }
  // The middle in units of kPieceElements, cut into `chunks` near-equal runs of at most `per`.
  const std::size_t units = (to - from) / kPieceElements;
  const std::size_t per_units = per / kPieceElements;
  const std::size_t chunks = (units + per_units - 1) / per_units;
  for (std::size_t k = 1; k < chunks; ++k) {
    const std::size_t cut = from + kPieceElements * (units * k / chunks);
    if (cut > bounds.back()) bounds.push_back(cut);
  }
  if (to > bounds.back() && to < count) bounds.push_back(to);
  bounds.push_back(count);
  return bounds;
}

/// Cuts `plan` into pieces. `compress` says whether float32 buckets are encoded into
/// `wire` (a 16-bit type); `chunk_bytes` (float32 bytes, 0: no limit) caps encoded pieces.
inline Pieces cut_pieces(const fusion::BucketPlan& plan, bool compress, DataType wire, std::size_t chunk_bytes) {
  Pieces result;
  for (std::size_t b = 0; b < plan.size(); ++b) {
    const fusion::Bucket& bucket = plan[b];
    result.first.push_back(result.pieces.size());
    const bool encoded = compress && bucket.dtype == DataType::kFloat32 && bucket.count() > 0;
    if (!encoded) {
      // A bucket of one tensor reduces just that tensor, not the alignment padding after it:
      // then a loose tensor alone in its bucket is reduced where it lives (no staging), with
      // the same count as a rank whose tensor is in the buffer.
      const std::size_t count = bucket.slots.size() == 1 ? plan.count(bucket.slots[0]) : bucket.count();
      result.pieces.push_back({b, bucket.begin_bytes, count, false, 0});
      continue;
    }
    const std::size_t count = bucket.count();
    const std::vector<std::size_t> bounds = chunk_bounds(count, chunk_bytes / size_of(DataType::kFloat32));
    for (std::size_t i = 0; i + 1 < bounds.size(); ++i) {
      const std::size_t n = bounds[i + 1] - bounds[i];
      result.pieces.push_back(
          {b, bucket.begin_bytes + bounds[i] * size_of(DataType::kFloat32), n, true, result.wire_bytes});
      result.wire_bytes += (n * size_of(wire) + kWireAlignment - 1) / kWireAlignment * kWireAlignment;
      ++result.encoded;
    }
  }
  result.first.push_back(result.pieces.size());
  return result;
}

}  // namespace ncclkit::compression::detail
