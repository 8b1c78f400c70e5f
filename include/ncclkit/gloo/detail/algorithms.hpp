#pragma once
/// The bodies of the Gloo communicator's collectives: each runs on a communicator's state under
/// its context lock, with SIGPIPE blocked, in a world of two or more ranks, and ends by
/// `deadline` (detail/communicator_state.hpp's `execute` provides all three). Where Gloo has the
/// algorithm (the ring all-reduce of three or more ranks, broadcast, reduce, allgather(v),
/// alltoall, barrier) it is called in chunks of at most Options::chunk_elements elements;
/// where this Gloo snapshot lacks it, or its version would copy a buffer onto itself in place,
/// it is written here on Gloo's unbound transport buffers. Internal to gloo/communicator.hpp.

#include <gloo/allgather.h>                 // gloo::allgather
#include <gloo/allgatherv.h>                // gloo::allgatherv
#include <gloo/allreduce.h>                 // gloo::allreduce
#include <gloo/alltoall.h>                  // gloo::alltoall
#include <gloo/barrier.h>                   // gloo::barrier
#include <gloo/broadcast.h>                 // gloo::broadcast
#include <gloo/reduce.h>                    // gloo::reduce
#include <gloo/transport/unbound_buffer.h>  // gloo::transport::UnboundBuffer
#include <gloo/types.h>                     // gloo::Slot

#include <algorithm>  // std::min, std::max, std::all_of
#include <chrono>     // std::chrono::steady_clock
#include <cstddef>    // std::size_t, std::byte
#include <cstdint>    // std::uint8_t, std::uint16_t, std::uint32_t, std::uint64_t
#include <cstring>    // std::memcpy
#include <memory>     // std::unique_ptr
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/gloo/detail/communicator_state.hpp"
#include "ncclkit/gloo/reduce_kernels.hpp"

namespace ncclkit::gloo::detail {

/// Slot prefixes of the collectives written here; Gloo's own use 0x01..0x08, the peer
/// monitor's sentinels 0x43.
inline constexpr std::uint8_t kReduceScatterSlotPrefix = 0x40;
inline constexpr std::uint8_t kPairReduceSlotPrefix = 0x41;
inline constexpr std::uint8_t kPairGatherSlotPrefix = 0x42;
inline constexpr std::uint8_t kGatherSlotPrefix = 0x44;
inline constexpr std::uint8_t kScatterSlotPrefix = 0x45;
inline constexpr std::uint8_t kPointToPointSlotPrefix = 0x46;
static_assert(PeerMonitor::kSentinelSlotPrefix == 0x43, "slot prefixes must not collide with the sentinels'");

/// Calls `fn` with a pointer of an unsigned type as wide as `type`'s elements (Gloo's typed
/// setters only use the width: the reduction is ncclkit's).
template <class Fn>
decltype(auto) with_element_width(DataType type, Fn&& fn) {
  switch (size_of(type)) {
    case 1:
      return fn(static_cast<std::uint8_t*>(nullptr));
    case 2:
      return fn(static_cast<std::uint16_t*>(nullptr));
    case 4:
      return fn(static_cast<std::uint32_t*>(nullptr));
    default:
      return fn(static_cast<std::uint64_t*>(nullptr));
  }
}

/// Throws when a transfer on an unbound buffer was aborted (a wait returned false).
inline void check_transfer(bool completed, const char* what) {
  if (!completed) throw CommError(std::string("a transfer of the ") + what + " was aborted");
}

/// Largest half-buffer the two-rank all-reduce handles at once (its scratch).
inline constexpr std::size_t kPairWindowBytes = std::size_t{64} << 20;

/// All-reduce of two ranks on Gloo's transport. Rank 0 owns elements [0, h), rank 1 [h, n),
/// h = n / 2. Each rank sends the part it does not own, receives the peer's copy of its own
/// part into scratch and reduces it (out = in + received: an out-of-place call costs no extra
/// copy), then the ranks swap their reduced parts. Each part travels as up to 8 pieces of at
/// least 1 MiB, all posted at once: Gloo's ring keeps 2 segments of at most 1 MiB in flight,
/// each with its own send/receive handshake, and on loopback TCP those round trips, not the
/// bytes, set its speed (measured 20-30% faster than the ring at 16-64 MiB: docs/perf-gloo.md).
inline void all_reduce_pair(CommunicatorState& s, const std::byte* in, std::byte* out, std::size_t count,
                            std::size_t element, ReduceFunction reduce,
                            std::chrono::steady_clock::time_point deadline) {
  const int rank = s.rank;
  constexpr std::size_t kPieceBytes = std::size_t{1} << 20;
  constexpr std::size_t kMaxPieces = 8;
  const int peer = 1 - rank;
  const std::size_t half = count / 2;
  auto part_offset = [&](int r) { return r == 0 ? std::size_t{0} : half; };
  auto part_length = [&](int r) { return r == 0 ? half : count - half; };
  // Both ranks cut each part the same way: the piece count follows from `count` alone.
  const std::size_t pieces =
      std::max<std::size_t>(1, std::min(kMaxPieces, (part_length(1) * element + kPieceBytes - 1) / kPieceBytes));
  auto piece = [&](int r, std::size_t j) {  // [begin, end) of piece j of rank r's part
    const std::size_t length = part_length(r);
    return std::pair<std::size_t, std::size_t>(part_offset(r) + j * length / pieces,
                                               part_offset(r) + (j + 1) * length / pieces);
  };
  const std::size_t mine = part_length(rank);
  if (s.pair_scratch_bytes < mine * element) {
    s.pair_scratch.reset(new std::byte[mine * element]);
    s.pair_scratch_bytes = mine * element;
  }
  std::byte* scratch = s.pair_scratch.get();
  auto out_buffer = s.context->createUnboundBuffer(out, count * element);
  std::unique_ptr<::gloo::transport::UnboundBuffer> in_buffer;
  if (in != out) in_buffer = s.context->createUnboundBuffer(const_cast<std::byte*>(in), count * element);
  auto* source = in != out ? in_buffer.get() : out_buffer.get();
  std::unique_ptr<::gloo::transport::UnboundBuffer> scratch_buffer;
  if (mine > 0) scratch_buffer = s.context->createUnboundBuffer(scratch, mine * element);
  const auto reduce_slot = ::gloo::Slot::build(kPairReduceSlotPrefix, 0);
  const auto gather_slot = ::gloo::Slot::build(kPairGatherSlotPrefix, 0);
  auto check = [](bool completed) {
    if (!completed) throw CommError("a transfer of the two-rank all_reduce was aborted");
  };
  // 1. Receive the peer's copy of my part; send my copy of the peer's part.
  std::size_t my_pieces = 0, sent = 0;
  for (std::size_t j = 0; j < pieces; ++j) {
    const auto [begin, end] = piece(rank, j);
    if (end > begin) {
      scratch_buffer->recv(peer, reduce_slot, (begin - part_offset(rank)) * element, (end - begin) * element);
      ++my_pieces;
    }
  }
  for (std::size_t j = 0; j < pieces; ++j) {
    const auto [begin, end] = piece(peer, j);
    if (end > begin) {
      source->send(peer, reduce_slot, begin * element, (end - begin) * element);
      ++sent;
    }
  }
  // 2. Those sends read the peer's part of `source`, which (in place) receives below.
  for (std::size_t i = 0; i < sent; ++i) check(source->waitSend(remaining(deadline)));
  std::size_t gathered = 0;
  for (std::size_t j = 0; j < pieces; ++j) {
    const auto [begin, end] = piece(peer, j);
    if (end > begin) {
      out_buffer->recv(peer, gather_slot, begin * element, (end - begin) * element);
      ++gathered;
    }
  }
  // 3. Reduce each piece of my part as it arrives (in order: one peer, one slot) and send it
  //    straight back.
  for (std::size_t j = 0; j < pieces; ++j) {
    const auto [begin, end] = piece(rank, j);
    if (end == begin) continue;
    check(scratch_buffer->waitRecv(remaining(deadline)));
    reduce(out + begin * element, in + begin * element, scratch + (begin - part_offset(rank)) * element, end - begin);
    out_buffer->send(peer, gather_slot, begin * element, (end - begin) * element);
  }
  // 4. The peer's reduced part lands in `out`; my pieces must have left before returning.
  for (std::size_t i = 0; i < gathered; ++i) check(out_buffer->waitRecv(remaining(deadline)));
  for (std::size_t i = 0; i < my_pieces; ++i) check(out_buffer->waitSend(remaining(deadline)));
}

inline void all_reduce_now(CommunicatorState& s, const void* in, void* out, std::size_t count, DataType type,
                           ReduceOp op, std::chrono::steady_clock::time_point deadline) {
  const int size = s.size;
  const ReduceFunction reduce = reduce_function(type, op, s.isa);
  const bool pre_scale = op == ReduceOp::kAvg && is_floating(type);
  if (pre_scale) {
    // Scale the inputs by 1/n before summing: the average of 16-bit values cannot overflow
    // where the average itself fits. Scaling into `out` makes the Gloo call in place.
    scale(type, out, in, count, 1.0 / size, s.isa);
    in = out;
  }
  const std::size_t element = size_of(type);
  // Two ranks: ncclkit's exchange (below), in windows that bound its scratch.
  const std::size_t step =
      size == 2 ? std::min(s.options.chunk_elements, 2 * (kPairWindowBytes / element)) : s.options.chunk_elements;
  for (std::size_t offset = 0; offset < count; offset += step) {
    const std::size_t n = std::min(step, count - offset);
    if (size == 2) {
      all_reduce_pair(s, static_cast<const std::byte*>(in) + offset * element, byte_ptr(out) + offset * element, n,
                      element, reduce, deadline);
      continue;
    }
    ::gloo::AllreduceOptions opts(s.context);
    with_element_width(type, [&]<class W>(W*) {
      W* out_chunk = static_cast<W*>(out) + offset;
      if (in != out) opts.setInput(const_cast<W*>(static_cast<const W*>(in)) + offset, n);
      opts.setOutput(out_chunk, n);
    });
    opts.setReduceFunction(reduce);
    opts.setTimeout(remaining(deadline));
    ::gloo::allreduce(opts);
  }
  if (op == ReduceOp::kAvg && !is_floating(type)) divide(type, out, count, size);
}

inline void broadcast_now(CommunicatorState& s, const void* in, void* out, std::size_t count, DataType type, int root,
                          std::chrono::steady_clock::time_point deadline) {
  const int rank = s.rank;
  for (std::size_t offset = 0; offset < count; offset += s.options.chunk_elements) {
    const std::size_t n = std::min(s.options.chunk_elements, count - offset);
    ::gloo::BroadcastOptions opts(s.context);
    with_element_width(type, [&]<class W>(W*) {
      if (rank == root && in != out) opts.setInput(const_cast<W*>(static_cast<const W*>(in)) + offset, n);
      opts.setOutput(static_cast<W*>(out) + offset, n);
    });
    opts.setRoot(root);
    opts.setTimeout(remaining(deadline));
    ::gloo::broadcast(opts);
  }
}

inline void reduce_now(CommunicatorState& s, const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                       int root, std::chrono::steady_clock::time_point deadline) {
  const int rank = s.rank;
  const int size = s.size;
  const ReduceFunction reduce = reduce_function(type, op, s.isa);
  // Gloo's ring reduce uses the output as scratch on every rank: non-roots without an
  // output buffer get one.
  Scratch scratch(out == nullptr ? count * size_of(type) : 0);
  if (out == nullptr) out = scratch.get();
  if (op == ReduceOp::kAvg && is_floating(type)) {
    scale(type, out, in, count, 1.0 / size, s.isa);
    in = out;
  }
  for (std::size_t offset = 0; offset < count; offset += s.options.chunk_elements) {
    const std::size_t n = std::min(s.options.chunk_elements, count - offset);
    ::gloo::ReduceOptions opts(s.context);
    with_element_width(type, [&]<class W>(W*) {
      if (in != out) opts.setInput(const_cast<W*>(static_cast<const W*>(in)) + offset, n);
      opts.setOutput(static_cast<W*>(out) + offset, n);
    });
    opts.setRoot(root);
    opts.setReduceFunction(reduce);
    opts.setTimeout(remaining(deadline));
    ::gloo::reduce(opts);
  }
  if (op == ReduceOp::kAvg && !is_floating(type) && rank == root) divide(type, out, count, size);
}

/// Gathers rank r's `counts[r]` elements into `out` (rank order). `in` null: in place (this
/// rank's part is already in `out`).
inline void all_gather_uneven_now(CommunicatorState& s, const void* in, void* out,
                                  const std::vector<std::size_t>& counts, DataType type,
                                  std::chrono::steady_clock::time_point deadline) {
  const int rank = s.rank;
  const std::size_t element = size_of(type);
  std::vector<std::size_t> offsets(counts.size());
  std::size_t total = 0;
  std::size_t largest = 0;
  for (std::size_t r = 0; r < counts.size(); ++r) {
    offsets[r] = total;
    total += counts[r];
    largest = std::max(largest, counts[r]);
  }
  if (total == 0) return;
  const bool equal = std::all_of(counts.begin(), counts.end(), [&](std::size_t c) { return c == counts[0]; });
  if (total <= s.options.chunk_elements) {
    if (equal) {
      ::gloo::AllgatherOptions opts(s.context);
      with_element_width(type, [&]<class W>(W*) {
        if (in != nullptr) opts.setInput(const_cast<W*>(static_cast<const W*>(in)), counts[0]);
        opts.setOutput(static_cast<W*>(out), total);
      });
      opts.setTimeout(remaining(deadline));
      ::gloo::allgather(opts);
    } else {
      ::gloo::AllgathervOptions opts(s.context);
      with_element_width(type, [&]<class W>(W*) {
        // Without an input Gloo's allgatherv works in place (this rank's part is in `out`).
        if (in != nullptr) opts.setInput(const_cast<W*>(static_cast<const W*>(in)), counts[rank]);
        opts.setOutput(static_cast<W*>(out), counts);
      });
      opts.setTimeout(remaining(deadline));
      ::gloo::allgatherv(opts);
    }
    return;
  }
  // Chunked: round k gathers elements [k*c, (k+1)*c) of every rank's part into scratch,
  // then copies each part to its place. The extra copy only happens past the chunk limit.
  if (in == nullptr) in = byte_ptr(out) + offsets[rank] * element;
  const std::size_t c = std::max<std::size_t>(1, s.options.chunk_elements / counts.size());
  Scratch scratch(std::min(c * counts.size(), total) * element);
  for (std::size_t begin = 0; begin < largest; begin += c) {
    std::vector<std::size_t> round(counts.size());
    std::size_t round_total = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      round[r] = counts[r] > begin ? std::min(c, counts[r] - begin) : 0;
      round_total += round[r];
    }
    ::gloo::AllgathervOptions opts(s.context);
    with_element_width(type, [&]<class W>(W*) {
      opts.setInput(const_cast<W*>(static_cast<const W*>(in)) + std::min(begin, counts[rank]), round[rank]);
      opts.setOutput(static_cast<W*>(scratch.get()), round);
    });
    opts.setTimeout(remaining(deadline));
    ::gloo::allgatherv(opts);
    std::size_t from = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      if (round[r] == 0) continue;
      std::memcpy(byte_ptr(out) + (offsets[r] + begin) * element, byte_ptr(scratch.get()) + from * element,
                  round[r] * element);
      from += round[r];
    }
  }
}

/// Ring reduce-scatter on Gloo's transport. Rank r ends with chunk r of the reduction. In
/// step k (0 <= k < n-1) rank r sends its partial sum of chunk (r-k-1) mod n to rank r+1 and
/// receives rank r-1's partial of chunk (r-k-2) mod n, adds its own input and passes it on
/// in the next step; after n-1 steps the partial it holds is chunk r, complete. Columns of
/// at most `segment` elements go round one after another, so scratch stays small.
inline void reduce_scatter_now(CommunicatorState& s, const void* in, void* out, std::size_t count, DataType type,
                               ReduceOp op, std::chrono::steady_clock::time_point deadline) {
  const int rank = s.rank;
  const int size = s.size;
  const std::size_t element = size_of(type);
  const ReduceFunction reduce = reduce_function(type, op, s.isa);
  constexpr std::size_t kSegmentBytes = std::size_t{4} << 20;
  const std::size_t segment =
      std::max<std::size_t>(1, std::min({count, s.options.chunk_elements, kSegmentBytes / element}));
  Scratch scratch(2 * segment * element);
  auto buffer = s.context->createUnboundBuffer(scratch.get(), 2 * segment * element);
  const int next = (rank + 1) % size;
  const int previous = (rank + size - 1) % size;
  const auto slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, 0);
  const auto* input = static_cast<const std::byte*>(in);
  for (std::size_t column = 0; column < count; column += segment) {
    const std::size_t width = std::min(segment, count - column);
    const std::size_t bytes = width * element;
    auto chunk = [&](int r) { return input + (static_cast<std::size_t>(r) * count + column) * element; };
    // Step 0 sends straight from the input: wrap it in its own transport buffer.
    const int first_send = (rank + size - 1) % size;
    auto source = s.context->createUnboundBuffer(const_cast<std::byte*>(chunk(first_send)), bytes);
    for (int step = 0; step < size - 1; ++step) {
      const std::size_t slot_offset = static_cast<std::size_t>(step % 2) * segment * element;
      const int recv_chunk = (rank + 2 * size - step - 2) % size;
      buffer->recv(previous, slot, slot_offset, bytes);
      if (step == 0) {
        source->send(next, slot, 0, bytes);
      } else {
        const std::size_t send_offset = static_cast<std::size_t>((step - 1) % 2) * segment * element;
        buffer->send(next, slot, send_offset, bytes);
      }
      if (!buffer->waitRecv(remaining(deadline))) throw CommError("receive aborted");
      void* received = byte_ptr(scratch.get()) + slot_offset;
      void* target = step == size - 2 ? byte_ptr(out) + column * element : received;
      reduce(target, chunk(recv_chunk), received, width);
      // The send must be done before its buffer is received into again (two steps on).
      bool sent = step == 0 ? source->waitSend(remaining(deadline)) : buffer->waitSend(remaining(deadline));
      if (!sent) throw CommError("send aborted");
    }
  }
  if (op == ReduceOp::kAvg) divide(type, out, count, size);
}

inline void barrier_now(CommunicatorState& s, std::chrono::steady_clock::time_point deadline) {
  ::gloo::BarrierOptions opts(s.context);
  opts.setTimeout(remaining(deadline));
  ::gloo::barrier(opts);
}

/// Slice j of `in` (count / size elements) goes to rank j, landing there as slice `rank` of
/// `out`; `count` is the total, a multiple of the world size. Gloo's alltoall, which moves
/// byte ranges (no element loop, so no chunking). Out of place only: Gloo copies this rank's
/// own slice before exchanging the others.
inline void all_to_all_now(CommunicatorState& s, const void* in, void* out, std::size_t count, DataType type,
                           std::chrono::steady_clock::time_point deadline) {
  ::gloo::AlltoallOptions opts(s.context);
  with_element_width(type, [&]<class W>(W*) {
    opts.setInput(const_cast<W*>(static_cast<const W*>(in)), count);
    opts.setOutput(static_cast<W*>(out), count);
  });
  opts.setTimeout(remaining(deadline));
  ::gloo::alltoall(opts);
}

/// Every rank's `count` elements of `in` land on `root` at offset rank * count of `out`. Root
/// receives from every peer at once; its own part is copied unless it is in place (in points
/// at root's slice of out), which Gloo's gather would copy onto itself.
inline void gather_now(CommunicatorState& s, const void* in, void* out, std::size_t count, DataType type, int root,
                       std::chrono::steady_clock::time_point deadline) {
  const std::size_t bytes = count * size_of(type);
  const auto slot = ::gloo::Slot::build(kGatherSlotPrefix, 0);
  if (s.rank != root) {
    auto source = s.context->createUnboundBuffer(const_cast<void*>(in), bytes);
    source->send(root, slot, 0, bytes);
    check_transfer(source->waitSend(remaining(deadline)), "gather");
    return;
  }
  auto target = s.context->createUnboundBuffer(out, bytes * static_cast<std::size_t>(s.size));
  for (int peer = 0; peer < s.size; ++peer) {
    if (peer != root) target->recv(peer, slot, static_cast<std::size_t>(peer) * bytes, bytes);
  }
  void* mine = byte_ptr(out) + static_cast<std::size_t>(root) * bytes;
  if (mine != in) std::memcpy(mine, in, bytes);
  for (int peer = 1; peer < s.size; ++peer) check_transfer(target->waitRecv(remaining(deadline)), "gather");
}

/// Slice j (`count` elements) of root's `in` lands in `out` of rank j. Root sends to every peer
/// at once; its own slice is copied unless it is in place (out points at root's slice of in).
inline void scatter_now(CommunicatorState& s, const void* in, void* out, std::size_t count, DataType type, int root,
                        std::chrono::steady_clock::time_point deadline) {
  const std::size_t bytes = count * size_of(type);
  const auto slot = ::gloo::Slot::build(kScatterSlotPrefix, 0);
  if (s.rank != root) {
    auto target = s.context->createUnboundBuffer(out, bytes);
    target->recv(root, slot, 0, bytes);
    check_transfer(target->waitRecv(remaining(deadline)), "scatter");
    return;
  }
  auto source = s.context->createUnboundBuffer(const_cast<void*>(in), bytes * static_cast<std::size_t>(s.size));
  for (int peer = 0; peer < s.size; ++peer) {
    if (peer != root) source->send(peer, slot, static_cast<std::size_t>(peer) * bytes, bytes);
  }
  const void* mine = static_cast<const std::byte*>(in) + static_cast<std::size_t>(root) * bytes;
  if (mine != out) std::memcpy(out, mine, bytes);
  for (int peer = 1; peer < s.size; ++peer) check_transfer(source->waitSend(remaining(deadline)), "scatter");
}

/// Sends `bytes` of `in` to `peer` (matched by the peer's recv, in order per pair). Returns once
/// the data has left; a send the peer never matches ends with the deadline.
inline void send_now(CommunicatorState& s, const void* in, std::size_t bytes, int peer,
                     std::chrono::steady_clock::time_point deadline) {
  auto source = s.context->createUnboundBuffer(const_cast<void*>(in), bytes);
  source->send(peer, ::gloo::Slot::build(kPointToPointSlotPrefix, 0), 0, bytes);
  check_transfer(source->waitSend(remaining(deadline)), "send");
}

/// Receives `bytes` from `peer` into `out` (the matching send's data, in order per peer).
inline void recv_now(CommunicatorState& s, void* out, std::size_t bytes, int peer,
                     std::chrono::steady_clock::time_point deadline) {
  auto target = s.context->createUnboundBuffer(out, bytes);
  target->recv(peer, ::gloo::Slot::build(kPointToPointSlotPrefix, 0), 0, bytes);
  check_transfer(target->waitRecv(remaining(deadline)), "recv");
}

}  // namespace ncclkit::gloo::detail
