#pragma once
/// ncclkit::gloo::Communicator: collectives on host memory over Gloo's TCP transport, created
/// from an ncclkit `Store` and `WorldInfo`. Models the `Backend` concept (core/backend.hpp), so
/// fusion, compression, the trainer and the perf engine run on CPUs exactly as on GPUs.
///
/// Collectives: broadcast, all_reduce (sum, prod, min, max, avg), reduce, all_gather and
/// all_gatherv (uneven sizes), reduce_scatter, barrier; element types int8, uint8, int32,
/// uint32, int64, uint64, Half, BFloat16, float, double. Each takes `TensorView`s (the type
/// travels in the view) or, through typed overloads, `std::span<T>`s; the stream comes last.
///
/// Streams (`Stream`): the default stream runs a collective in the calling thread, which
/// returns when it is done; the comm stream hands it to the communicator's worker thread
/// (CommQueue) and returns at once; `record`, `wait` and `synchronize` order and join the two.
/// Buffers of work on the comm stream must stay alive and untouched until it has finished.
/// Both streams use the same Gloo connections: a collective on one waits for one running on the
/// other, and every rank must issue its collectives in the same order (for work on both
/// streams, order it with events, as on a GPU).
///
/// Failures. Gloo reports every failure (a peer exited, a timeout) as a `gloo::Exception`, and
/// its context is unusable afterwards. The communicator turns it into `CommError` naming rank,
/// operation, sequence number, size and time waited, and refuses every later call with
/// `CommError`. Every collective is bounded by `CommunicatorOptions::timeout` (Gloo's own 30 s
/// default is never used); a collective split into chunks shares one deadline. A peer whose
/// connection fails (it exited, crashed, was killed) is caught at once, whatever the timeout,
/// and named by rank: see detail/peer_monitor.hpp (one watcher thread per communicator).
///
/// What this Gloo snapshot (Debian 0.0~git20220518) lacks, and how it is provided:
///   - bfloat16, and a fast float16: reductions are ncclkit's (reduce_kernels.hpp), for every
///     type, passed to Gloo as its reduction callback.
///   - a fast all-reduce of two ranks: ncclkit's piecewise exchange on Gloo's transport
///     (all_reduce_pair below); three or more ranks use Gloo's ring.
///   - an options-style reduce_scatter: a ring reduce-scatter on Gloo's transport buffers
///     (each rank sends and receives (n-1)/n of the data, as NCCL's ring does).
///   - loops that count past 2^31 elements: buffers are cut into chunks of at most
///     `chunk_elements` elements per Gloo call.
///   - a barrier in `connectFullMesh`: the constructor runs one after connecting, and the
///     destructor one before closing connections, so no rank closes a socket a peer still
///     reads from.

#include <gloo/allgather.h>                 // gloo::allgather
#include <gloo/allgatherv.h>                // gloo::allgatherv
#include <gloo/allreduce.h>                 // gloo::allreduce
#include <gloo/barrier.h>                   // gloo::barrier
#include <gloo/broadcast.h>                 // gloo::broadcast
#include <gloo/common/error.h>              // gloo::Exception, gloo::IoException
#include <gloo/reduce.h>                    // gloo::reduce
#include <gloo/rendezvous/context.h>        // gloo::rendezvous::Context
#include <gloo/transport/tcp/device.h>      // gloo::transport::tcp::CreateDevice
#include <gloo/transport/unbound_buffer.h>  // gloo::transport::UnboundBuffer
#include <gloo/types.h>                     // gloo::Slot

#include <pthread.h>  // pthread_sigmask
#include <signal.h>   // sigset_t, SIGPIPE, sigtimedwait

#include <algorithm>    // std::min, std::max
#include <atomic>       // std::atomic
#include <chrono>       // std::chrono
#include <cstddef>      // std::size_t, std::byte
#include <cstdint>      // std::uint64_t
#include <cerrno>       // errno, EINTR
#include <cstdio>       // std::snprintf
#include <cstring>      // std::memcpy
#include <exception>    // std::exception
#include <functional>   // std::function
#include <memory>       // std::shared_ptr, std::unique_ptr
#include <mutex>        // std::mutex
#include <new>          // std::align_val_t
#include <numeric>      // std::accumulate
#include <span>         // std::span
#include <string>       // std::string
#include <type_traits>  // std::type_identity_t
#include <utility>      // std::move, std::pair
#include <vector>       // std::vector

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/deadline.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/rank_list.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/gloo/comm_queue.hpp"
#include "ncclkit/gloo/detail/argument_check.hpp"
#include "ncclkit/gloo/detail/peer_monitor.hpp"
#include "ncclkit/gloo/reduce_kernels.hpp"
#include "ncclkit/gloo/store_adapter.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::gloo {

/// Default and largest chunk: Gloo's math loops count in `int`; 2^30 elements keeps every
/// chunk far below 2^31 and chunk boundaries aligned.
inline constexpr std::size_t kDefaultChunkElements = std::size_t{1} << 30;
inline constexpr std::size_t kMaxChunkElements = (std::size_t{1} << 31) - 1;

/// Knobs of a communicator; designated initialisers recommended:
/// `Communicator comm(store, world, {.timeout = 30s, .interface = "eth0"});`
struct CommunicatorOptions {
  /// Limit of each collective (and of connecting at creation). Default NCCLKIT_TIMEOUT or
  /// 600 s. Gloo's own default (30 s) is never used.
  std::chrono::milliseconds timeout = default_comm_timeout();
  /// Network interface whose address this rank binds and advertises ("eth0", "lo"). Empty:
  /// NCCLKIT_GLOO_SOCKET_IFNAME if set, else `hostname` is used.
  std::string interface{};
  /// Host name or IP address to bind and advertise when no interface is given. Empty:
  /// NCCLKIT_GLOO_HOSTNAME if set, else this machine's host name (which must resolve to an
  /// address the peers can reach).
  std::string hostname{};
  /// Most elements one Gloo call handles; larger buffers are cut into chunks. Must be in
  /// [1, 2^31 - 1]; tests set it small to exercise the chunked paths.
  std::size_t chunk_elements = kDefaultChunkElements;
  /// Name in logs and errors, and the scope of its store keys: every rank must create its
  /// communicators of one name in the same order.
  std::string name = "gloo";
  /// Compare every collective's arguments across ranks before it runs (sequence number,
  /// collective, element type, count, op, root), through one small allgather on this
  /// communicator; a difference is a CollectiveMismatchError on every rank. Default:
  /// NCCLKIT_CHECK_COLLECTIVES. Every rank must set it alike (checked at creation).
  bool check_collectives = default_check_collectives();
};

/// Names one of a communicator's two work queues. Cheap to copy; compare with ==.
struct Stream {
  enum class Queue : std::uint8_t {
    kInline,  ///< run in the calling thread; the call returns when the work is done
    kComm,    ///< run on the communicator's worker thread, in submission order
  };
  Queue queue = Queue::kInline;
  friend constexpr bool operator==(Stream, Stream) = default;
};

namespace detail {

inline std::string format_bytes(std::size_t bytes) {
  char text[48];
  if (bytes >= (std::size_t{1} << 30)) {
    std::snprintf(text, sizeof text, "%.2f GiB", static_cast<double>(bytes) / (1 << 30));
  } else if (bytes >= (std::size_t{1} << 20)) {
    std::snprintf(text, sizeof text, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  } else if (bytes >= 1024) {
    std::snprintf(text, sizeof text, "%.2f KiB", static_cast<double>(bytes) / 1024);
  } else {
    std::snprintf(text, sizeof text, "%zu B", bytes);
  }
  return text;
}

/// Blocks SIGPIPE in the calling thread while Gloo uses sockets. Gloo writes with writev(),
/// which raises SIGPIPE when the peer has gone; its default action kills the process, so a
/// dead peer would kill the survivors instead of making them throw CommError. (Python, and so
/// PyTorch, ignores SIGPIPE process-wide; a C++ library must not change the process's signal
/// dispositions.) With SIGPIPE blocked the write fails with EPIPE, which Gloo reports as an
/// IoException. A SIGPIPE left pending by such a write is consumed before the mask is
/// restored. Threads created while it is active (Gloo's device loop thread) inherit the mask.
class SigpipeBlock {
 public:
  SigpipeBlock() {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGPIPE);
    active_ = ::pthread_sigmask(SIG_BLOCK, &set, &previous_) == 0 && !sigismember(&previous_, SIGPIPE);
  }
  ~SigpipeBlock() {
    if (!active_) return;  // it was blocked already: leave it so
    sigset_t pending;
    sigemptyset(&pending);
    if (::sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE)) {
      sigset_t set;
      sigemptyset(&set);
      sigaddset(&set, SIGPIPE);
      const timespec zero{0, 0};
      while (::sigtimedwait(&set, nullptr, &zero) == -1 && errno == EINTR) {
      }
    }
    ::pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
  }
  SigpipeBlock(const SigpipeBlock&) = delete;
  SigpipeBlock& operator=(const SigpipeBlock&) = delete;

 private:
  sigset_t previous_{};
  bool active_ = false;
};

/// What an error message says about a collective.
struct OpInfo {
  const char* name = "";
  std::uint64_t sequence = 0;
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  std::size_t bytes = 0;
  std::string detail;  ///< "sum", "root 3", ...
  CollectiveFingerprint fingerprint;  ///< what CommunicatorOptions::check_collectives compares
};

/// Calls `fn` with a pointer of an unsigned type as wide as `type`'s elements (Gloo's typed
/// setters only use the width: the reduction is ncclkit's).
template <class Fn>
decltype(auto) with_element_width(DataType type, Fn&& fn) {
  switch (size_of(type)) {
    case 1: return fn(static_cast<std::uint8_t*>(nullptr));
    case 2: return fn(static_cast<std::uint16_t*>(nullptr));
    case 4: return fn(static_cast<std::uint32_t*>(nullptr));
    default: return fn(static_cast<std::uint64_t*>(nullptr));
  }
}

inline std::byte* byte_ptr(void* p) { return static_cast<std::byte*>(p); }

/// Owns the aligned scratch memory some collectives need.
struct Scratch {
  std::unique_ptr<std::byte[]> memory;
  explicit Scratch(std::size_t bytes) : memory(bytes ? new std::byte[bytes] : nullptr) {}
  void* get() const { return memory.get(); }
};

/// Everything a communicator owns, on the heap so that a moved communicator's queued tasks
/// keep pointing at the right place.
struct CommunicatorState {
  int rank = 0;
  int size = 1;
  CommunicatorOptions options;
  KernelIsa isa = default_isa();
  std::string store_description;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  /// Notices a failed peer connection at once and names the rank (world > 1).
  std::unique_ptr<PeerMonitor> monitor;
  std::mutex context_mutex;  ///< one collective at a time on the Gloo context
  std::atomic<bool> failed{false};
  std::mutex failure_mutex;
  std::string failure;  ///< the first failure's message (guarded by failure_mutex)
  std::atomic<std::uint64_t> sequence{0};
  std::unique_ptr<CommQueue> queue;
  /// Scratch of the two-rank all-reduce, kept between calls so that large collectives do not
  /// page-fault a fresh allocation every time (guarded by context_mutex).
  std::unique_ptr<std::byte[]> pair_scratch;
  std::size_t pair_scratch_bytes = 0;
  /// Every rank's encoded fingerprint, for check_arguments (guarded by context_mutex).
  std::vector<std::uint8_t> check_scratch;

  std::string who() const {
    return "ncclkit::gloo::Communicator '" + options.name + "' rank " + std::to_string(rank) + " of " +
           std::to_string(size);
  }

  std::string describe(const OpInfo& op) const {
    std::string text = std::string(op.name) + " #" + std::to_string(op.sequence) + " (" +
                       std::string(name_of(op.dtype)) + ", " + std::to_string(op.count) + " elements, " +
                       format_bytes(op.bytes);
    if (!op.detail.empty()) text += ", " + op.detail;
    return text + ")";
  }

  /// Throws CommError when an earlier failure made the communicator unusable.
  void check_usable(const char* op_name) {
    if (!failed.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(failure_mutex);
    throw CommError(who() + ": " + op_name + " refused: the communicator is unusable after an earlier failure (" +
                    failure + "). Destroy it; create a new one with every rank if the job continues.");
  }

  static bool is_timeout(const std::string& cause) { return cause.find("Timed out") != std::string::npos; }

  /// Why a collective failed: the failed peer connections when there are any (a collective
  /// may see the failure a moment before the monitor, hence the grace), else `cause`. This
  /// rank's own timeout stays the cause, with the connections that failed meanwhile after it:
  /// a peer that timed out first closes its connections too, so a closed connection does not
  /// show which rank stalled.
  std::string failure_cause(const std::string& cause) const {
    const bool timed_out = is_timeout(cause);
    const std::string peers =
        monitor ? monitor->peer_failure(std::chrono::milliseconds(timed_out ? 0 : 200)) : std::string();
    if (peers.empty()) return cause;
    return timed_out ? cause + "; meanwhile " + peers : peers;
  }

  [[noreturn]] void fail(const OpInfo& op, std::chrono::steady_clock::duration waited, const std::string& cause) {
    const std::string why = failure_cause(cause);
    std::string message = who() + ": " + describe(op) + " failed after " + ncclkit::format_seconds(waited) + " (timeout " +
                          ncclkit::format_seconds(options.timeout) + "): " + why + ". The communicator is unusable now. ";
    message += why != cause && !is_timeout(cause)
                   ? "The rank named probably exited or crashed (a rank whose own collective failed closes its "
                     "connections too): look at its log."
                   : "A peer probably exited, crashed or stalled: look at the other ranks' logs; raise the timeout "
                     "(CommunicatorOptions::timeout, NCCLKIT_TIMEOUT) if ranks are just slow.";
    {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (failure.empty()) failure = describe(op) + " failed: " + why;
    }
    failed.store(true, std::memory_order_release);
    log_error(message);
    throw CommError(message);
  }

  /// Runs one collective's body under the context lock, with failures mapped to CommError.
  /// `body` receives the deadline shared by all of the collective's Gloo calls.
  template <class Body>
  void execute(const OpInfo& op, Body&& body) {
    std::lock_guard<std::mutex> lock(context_mutex);
    SigpipeBlock no_sigpipe;
    check_usable(op.name);
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + options.timeout;
    // A peer's connection failed since the last collective: fail this one now, naming the
    // peer, rather than run it into a broken group.
    if (monitor && monitor->peer_failed()) fail(op, std::chrono::steady_clock::duration::zero(), "");
    try {
      if (options.check_collectives && size > 1) {
        check_arguments(context, op.fingerprint, op.sequence, check_scratch, remaining(deadline), who());
      }
      body(deadline);
    } catch (const CollectiveMismatchError&) {
      throw;  // nothing ran on any rank: the communicator stays usable
    } catch (const ::gloo::Exception& e) {
      fail(op, std::chrono::steady_clock::now() - start, std::string("Gloo: ") + e.what());
    } catch (const CommError&) {
      throw;
    } catch (const std::exception& e) {
      fail(op, std::chrono::steady_clock::now() - start, e.what());
    }
  }

  /// Time left until `deadline`, at least 1 ms (Gloo treats 0 as "no timeout").
  static std::chrono::milliseconds remaining(std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  }

  // ---- collective bodies (called under the lock, world size > 1) ----------------------------

  void all_reduce_now(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                      std::chrono::steady_clock::time_point deadline) {
    const ReduceFunction reduce = reduce_function(type, op, isa);
    const bool pre_scale = op == ReduceOp::kAvg && is_floating(type);
    if (pre_scale) {
      // Scale the inputs by 1/n before summing: the average of 16-bit values cannot overflow
      // where the average itself fits. Scaling into `out` makes the Gloo call in place.
      scale(type, out, in, count, 1.0 / size, isa);
      in = out;
    }
    const std::size_t element = size_of(type);
    // Two ranks: ncclkit's exchange (below), in windows that bound its scratch.
    const std::size_t step = size == 2 ? std::min(options.chunk_elements, 2 * (kPairWindowBytes / element))
                                       : options.chunk_elements;
    for (std::size_t offset = 0; offset < count; offset += step) {
      const std::size_t n = std::min(step, count - offset);
      if (size == 2) {
        all_reduce_pair(static_cast<const std::byte*>(in) + offset * element, byte_ptr(out) + offset * element, n,
                        element, reduce, deadline);
        continue;
      }
      ::gloo::AllreduceOptions opts(context);
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

  /// Largest half-buffer the two-rank all-reduce handles at once (its scratch).
  static constexpr std::size_t kPairWindowBytes = std::size_t{64} << 20;

  /// All-reduce of two ranks on Gloo's transport. Rank 0 owns elements [0, h), rank 1 [h, n),
  /// h = n / 2. Each rank sends the part it does not own, receives the peer's copy of its own
  /// part into scratch and reduces it (out = in + received: an out-of-place call costs no extra
  /// copy), then the ranks swap their reduced parts. Each part travels as up to 8 pieces of at
  /// least 1 MiB, all posted at once: Gloo's ring keeps 2 segments of at most 1 MiB in flight,
  /// each with its own send/receive handshake, and on loopback TCP those round trips, not the
  /// bytes, set its speed (this exchange measured ~10% faster at 16-64 MiB; docs/perf-gloo.md).
  void all_reduce_pair(const std::byte* in, std::byte* out, std::size_t count, std::size_t element,
                       ReduceFunction reduce, std::chrono::steady_clock::time_point deadline) {
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
    if (pair_scratch_bytes < mine * element) {
      pair_scratch.reset(new std::byte[mine * element]);
      pair_scratch_bytes = mine * element;
    }
    std::byte* scratch = pair_scratch.get();
    auto out_buffer = context->createUnboundBuffer(out, count * element);
    std::unique_ptr<::gloo::transport::UnboundBuffer> in_buffer;
    if (in != out) in_buffer = context->createUnboundBuffer(const_cast<std::byte*>(in), count * element);
    auto* source = in != out ? in_buffer.get() : out_buffer.get();
    std::unique_ptr<::gloo::transport::UnboundBuffer> scratch_buffer;
    if (mine > 0) scratch_buffer = context->createUnboundBuffer(scratch, mine * element);
    constexpr std::uint8_t kPairReduceSlotPrefix = 0x41;  // Gloo's own use 0x01..0x08
    constexpr std::uint8_t kPairGatherSlotPrefix = 0x42;
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

  void broadcast_now(const void* in, void* out, std::size_t count, DataType type, int root,
                     std::chrono::steady_clock::time_point deadline) {
    for (std::size_t offset = 0; offset < count; offset += options.chunk_elements) {
      const std::size_t n = std::min(options.chunk_elements, count - offset);
      ::gloo::BroadcastOptions opts(context);
      with_element_width(type, [&]<class W>(W*) {
        if (rank == root && in != out) opts.setInput(const_cast<W*>(static_cast<const W*>(in)) + offset, n);
        opts.setOutput(static_cast<W*>(out) + offset, n);
      });
      opts.setRoot(root);
      opts.setTimeout(remaining(deadline));
      ::gloo::broadcast(opts);
    }
  }

  void reduce_now(const void* in, void* out, std::size_t count, DataType type, ReduceOp op, int root,
                  std::chrono::steady_clock::time_point deadline) {
    const ReduceFunction reduce = reduce_function(type, op, isa);
    // Gloo's ring reduce uses the output as scratch on every rank: non-roots without an
    // output buffer get one.
    Scratch scratch(out == nullptr ? count * size_of(type) : 0);
    if (out == nullptr) out = scratch.get();
    if (op == ReduceOp::kAvg && is_floating(type)) {
      scale(type, out, in, count, 1.0 / size, isa);
      in = out;
    }
    for (std::size_t offset = 0; offset < count; offset += options.chunk_elements) {
      const std::size_t n = std::min(options.chunk_elements, count - offset);
      ::gloo::ReduceOptions opts(context);
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
  void all_gatherv_now(const void* in, void* out, const std::vector<std::size_t>& counts, DataType type,
                       std::chrono::steady_clock::time_point deadline) {
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
    if (total <= options.chunk_elements) {
      if (equal) {
        ::gloo::AllgatherOptions opts(context);
        with_element_width(type, [&]<class W>(W*) {
          if (in != nullptr) opts.setInput(const_cast<W*>(static_cast<const W*>(in)), counts[0]);
          opts.setOutput(static_cast<W*>(out), total);
        });
        opts.setTimeout(remaining(deadline));
        ::gloo::allgather(opts);
      } else {
        ::gloo::AllgathervOptions opts(context);
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
    const std::size_t c = std::max<std::size_t>(1, options.chunk_elements / counts.size());
    Scratch scratch(std::min(c * counts.size(), total) * element);
    for (std::size_t begin = 0; begin < largest; begin += c) {
      std::vector<std::size_t> round(counts.size());
      std::size_t round_total = 0;
      for (std::size_t r = 0; r < counts.size(); ++r) {
        round[r] = counts[r] > begin ? std::min(c, counts[r] - begin) : 0;
        round_total += round[r];
      }
      ::gloo::AllgathervOptions opts(context);
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
  void reduce_scatter_now(const void* in, void* out, std::size_t count, DataType type, ReduceOp op,
                          std::chrono::steady_clock::time_point deadline) {
    const std::size_t element = size_of(type);
    const ReduceFunction reduce = reduce_function(type, op, isa);
    constexpr std::size_t kSegmentBytes = std::size_t{4} << 20;
    const std::size_t segment =
        std::max<std::size_t>(1, std::min({count, options.chunk_elements, kSegmentBytes / element}));
    Scratch scratch(2 * segment * element);
    auto buffer = context->createUnboundBuffer(scratch.get(), 2 * segment * element);
    const int next = (rank + 1) % size;
    const int previous = (rank + size - 1) % size;
    // A slot prefix Gloo's own collectives do not use (they take 0x01..0x08).
    constexpr std::uint8_t kReduceScatterSlotPrefix = 0x40;
    const auto slot = ::gloo::Slot::build(kReduceScatterSlotPrefix, 0);
    const auto* input = static_cast<const std::byte*>(in);
    for (std::size_t column = 0; column < count; column += segment) {
      const std::size_t width = std::min(segment, count - column);
      const std::size_t bytes = width * element;
      auto chunk = [&](int r) { return input + (static_cast<std::size_t>(r) * count + column) * element; };
      // Step 0 sends straight from the input: wrap it in its own transport buffer.
      const int first_send = (rank + size - 1) % size;
      auto source = context->createUnboundBuffer(const_cast<std::byte*>(chunk(first_send)), bytes);
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

  void barrier_now(std::chrono::steady_clock::time_point deadline) {
    ::gloo::BarrierOptions opts(context);
    opts.setTimeout(remaining(deadline));
    ::gloo::barrier(opts);
  }
};

inline bool overlaps(const void* a, std::size_t a_bytes, const void* b, std::size_t b_bytes) {
  const auto* x = static_cast<const std::byte*>(a);
  const auto* y = static_cast<const std::byte*>(b);
  return a_bytes > 0 && b_bytes > 0 && x < y + b_bytes && y < x + a_bytes;
}

}  // namespace detail

/// A Gloo communicator over TCP. Move-only RAII: the constructor connects every pair of ranks
/// (collective: every rank of `world` must construct one, with the same name, in the same
/// order), the destructor closes the connections. Models `ncclkit::Backend`.
///
/// Thread safety: collectives may be issued from any thread, but the order in which a rank
/// issues them must be the same on every rank. The worker thread of the comm stream is the
/// only thread that runs work issued there.
class Communicator {
 public:
  using Stream = gloo::Stream;
  using Event = gloo::Event;
  /// Collectives read and write host memory.
  static constexpr MemoryKind memory_kind = MemoryKind::kHost;

  /// Connects to the other ranks of `world` through `store` (rendezvous only: the store is not
  /// used after the constructor returns, and may be destroyed then). Store keys live under
  /// "ncclkit/gloo/<name>/<generation>/", where the generation is agreed through a counter in
  /// the store, so reruns and several communicators on one store never mix.
  /// Throws ConfigError (bad options or interface), TimeoutError (peers missing at the
  /// rendezvous, naming the store keys) or CommError (connecting or the first barrier failed).
  Communicator(ncclkit::Store& store, const WorldInfo& world, CommunicatorOptions options = {})
      : Communicator(std::shared_ptr<ncclkit::Store>(std::shared_ptr<ncclkit::Store>(), &store), world,
                     std::move(options)) {}

  Communicator(std::shared_ptr<ncclkit::Store> store, const WorldInfo& world, CommunicatorOptions options = {})
      : state_(std::make_unique<detail::CommunicatorState>()) {
    if (!store) throw ConfigError("ncclkit::gloo::Communicator: the store is null");
    world.validate();
    auto& s = *state_;
    s.rank = world.rank;
    s.size = world.world_size;
    s.options = std::move(options);
    validate_options(s.options);
    s.store_description = store->describe();
    s.queue = std::make_unique<CommQueue>(s.options.name);
    if (s.size > 1) connect(*state_, store);
    if (s.size > 1) agree_on_argument_check(s);
  }

  /// Drains nothing: work still queued on the comm stream is cancelled (with a warning; call
  /// synchronize(comm_stream()) first). Then, if the communicator is healthy, a barrier (bounded
  /// by the timeout) so that no rank closes connections a peer is still reading, and the
  /// connections are closed. Never throws.
  ~Communicator() { destroy(); }

  Communicator(Communicator&&) noexcept = default;
  Communicator& operator=(Communicator&& other) noexcept {
    if (this != &other) {
      destroy();
      state_ = std::move(other.state_);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  // ---- identity -------------------------------------------------------------------------------

  int rank() const { return state().rank; }
  int size() const { return state().size; }
  const CommunicatorOptions& options() const { return state().options; }
  /// Whether an earlier failure made the communicator unusable.
  bool failed() const { return state().failed.load(); }
  /// Collectives issued so far (the last one's sequence number).
  std::uint64_t sequence() const { return state().sequence.load(); }
  /// Which copy of the reduction loops this communicator uses.
  KernelIsa isa() const { return state().isa; }
  /// The Gloo context, for calling Gloo directly (the perf tool's --raw mode). Null when the
  /// world has one rank. Do not use it while work is queued on the comm stream.
  std::shared_ptr<::gloo::Context> native_context() const { return state().context; }

  // ---- streams ----------------------------------------------------------------------------------

  /// The inline queue: work runs in the calling thread.
  Stream default_stream() const { return Stream{Stream::Queue::kInline}; }
  /// The communication queue: work runs on this communicator's worker thread, in order.
  Stream comm_stream() const { return Stream{Stream::Queue::kComm}; }

  /// An event for the work issued so far on `stream` (inline work is done already: the event
  /// is complete).
  Event record(Stream stream) {
    if (stream.queue == Stream::Queue::kInline) return Event{};
    return state().queue->record();
  }

  /// Makes later work on `stream` wait for `event`. Inline stream: blocks the calling thread
  /// until the event completes and rethrows its failure. Comm stream: returns at once; the
  /// worker waits before running what comes next (nothing to do for this queue's own events).
  void wait(const Event& event, Stream stream) {
    if (event.query() && stream.queue == Stream::Queue::kComm) return;
    if (stream.queue == Stream::Queue::kInline) return event.wait();
    if (event.belongs_to(state().queue->state())) return;
    state().queue->submit([event] { event.wait(); });
  }

  /// Blocks until the work issued on `stream` has finished; rethrows the first failure there
  /// (a CommError). Inline stream: nothing to wait for.
  void synchronize(Stream stream) {
    if (stream.queue == Stream::Queue::kComm) state().queue->synchronize();
  }

  // ---- collectives on views ---------------------------------------------------------------------

  /// out[i] = op over ranks of in[i]. in.count == out.count; in place when in.data == out.data,
  /// else the buffers must not overlap. kAvg: floating types are scaled by 1/size() before the
  /// sum; integers are summed, then divided (truncating).
  void all_reduce(TensorView in, TensorView out, ReduceOp op = ReduceOp::kSum, Stream stream = {}) {
    validated("all_reduce", stream, [&] {
      check_views("all_reduce", in, out);
      if (in.count != out.count) mismatch("all_reduce", "in.count == out.count", in.count, out.count);
      check_alias("all_reduce", in, out);
    });
    auto op_info = info("all_reduce", in.count, in.dtype, std::string(name_of(op)));
    op_info.fingerprint = CollectiveFingerprint::of("all_reduce", in.count, in.dtype).with_op(op);
    submit(stream, std::move(op_info), [in, out, op](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return local_reduce(s, in, out, op);
      s.all_reduce_now(in.data, out.data, in.count, in.dtype, op, deadline);
    });
  }

  /// Copies root's `in` to every rank's `out` (out.count elements). `in` is read on the root
  /// only (it may equal `out` there); other ranks may pass an empty view.
  void broadcast(TensorView in, TensorView out, int root, Stream stream = {}) {
    validated("broadcast", stream, [&] {
      check_root("broadcast", root);
      check_views("broadcast", rank() == root ? in : out, out);
      if (rank() == root && in.count != out.count) mismatch("broadcast", "in.count == out.count on the root", in.count, out.count);
      if (rank() == root) check_alias("broadcast", in, out);
    });
    auto op_info = info("broadcast", out.count, out.dtype, "root " + std::to_string(root));
    op_info.fingerprint = CollectiveFingerprint::of("broadcast", out.count, out.dtype).with_root(root);
    submit(stream, std::move(op_info), [in, out, root](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return copy_view(in, out);
      s.broadcast_now(in.data, out.data, out.count, out.dtype, root, deadline);
    });
  }

  /// Reduces every rank's `in` into root's `out`. On the root, out.count == in.count (in place
  /// when equal pointers). Elsewhere `out` may be empty (scratch is allocated) or a buffer of
  /// in.count elements, which is then overwritten with partial results.
  void reduce(TensorView in, TensorView out, ReduceOp op, int root, Stream stream = {}) {
    const bool has_out = rank() == root || out.data != nullptr;
    validated("reduce", stream, [&] {
      check_root("reduce", root);
      check_views("reduce", in, has_out ? out : in);
      if (has_out && in.count != out.count) mismatch("reduce", "in.count == out.count", in.count, out.count);
      if (has_out) check_alias("reduce", in, out);
    });
    auto op_info = info("reduce", in.count, in.dtype, std::string(name_of(op)) + ", root " + std::to_string(root));
    op_info.fingerprint = CollectiveFingerprint::of("reduce", in.count, in.dtype).with_op(op).with_root(root);
    submit(stream, std::move(op_info), [in, out, op, root, has_out](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return local_reduce(s, in, out, op);
      s.reduce_now(in.data, has_out ? out.data : nullptr, in.count, in.dtype, op, root, deadline);
    });
  }

  /// out = concatenation of every rank's `in` in rank order; out.count == in.count * size().
  /// In place when in.data points at this rank's slice of `out`.
  void all_gather(TensorView in, TensorView out, Stream stream = {}) {
    const bool in_place = in.data == detail::byte_ptr(out.data) + in.bytes() * static_cast<std::size_t>(rank());
    validated("all_gather", stream, [&] {
      check_views("all_gather", in, out);
      if (out.count != in.count * static_cast<std::size_t>(size())) {
        mismatch("all_gather", "out.count == in.count * size()", in.count, out.count);
      }
      if (!in_place && detail::overlaps(in.data, in.bytes(), out.data, out.bytes())) overlap_error("all_gather");
    });
    auto op_info = info("all_gather", out.count, out.dtype, "");
    op_info.fingerprint = CollectiveFingerprint::of("all_gather", in.count, in.dtype);
    std::vector<std::size_t> counts(static_cast<std::size_t>(size()), in.count);
    submit(stream, std::move(op_info), [in, out, in_place, counts = std::move(counts)](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return copy_view(in, out);
      s.all_gatherv_now(in_place ? nullptr : in.data, out.data, counts, out.dtype, deadline);
    });
  }

  /// All-gather with uneven parts: rank r contributes counts[r] elements (in.count ==
  /// counts[rank()]); out holds them in rank order (out.count == sum of counts). Every rank
  /// passes the same counts. In place when in.data points at this rank's part of `out`.
  void all_gatherv(TensorView in, TensorView out, std::span<const std::size_t> counts, Stream stream = {}) {
    bool in_place = false;
    validated("all_gatherv", stream, [&] {
      if (counts.size() != static_cast<std::size_t>(size())) {
        throw ConfigError(state().who() + ": all_gatherv needs one count per rank: got " +
                          std::to_string(counts.size()) + " counts for " + std::to_string(size()) + " ranks");
      }
      check_views("all_gatherv", in, out);
      if (in.count != counts[static_cast<std::size_t>(rank())]) {
        mismatch("all_gatherv", "in.count == counts[rank()]", in.count, counts[static_cast<std::size_t>(rank())]);
      }
      const std::size_t total = std::accumulate(counts.begin(), counts.end(), std::size_t{0});
      if (out.count != total) mismatch("all_gatherv", "out.count == sum of counts", total, out.count);
      const std::size_t before = std::accumulate(counts.begin(), counts.begin() + rank(), std::size_t{0});
      in_place = in.data == detail::byte_ptr(out.data) + before * size_of(out.dtype);
      if (!in_place && detail::overlaps(in.data, in.bytes(), out.data, out.bytes())) overlap_error("all_gatherv");
    });
    auto op_info = info("all_gatherv", out.count, out.dtype, "");
    op_info.fingerprint = CollectiveFingerprint::of("all_gatherv", out.count, out.dtype).with_counts(counts);
    std::vector<std::size_t> copy(counts.begin(), counts.end());
    submit(stream, std::move(op_info), [in, out, in_place, counts = std::move(copy)](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return copy_view(in, out);
      s.all_gatherv_now(in_place ? nullptr : in.data, out.data, counts, out.dtype, deadline);
    });
  }

  /// out = chunk rank() of the reduction of every rank's `in`; in.count == out.count * size().
  /// `in` is read only. In place when out.data points at this rank's chunk of `in`. kAvg:
  /// the sum divided by size() (integers truncate).
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op = ReduceOp::kSum, Stream stream = {}) {
    const bool in_place = out.data == detail::byte_ptr(in.data) + out.bytes() * static_cast<std::size_t>(rank());
    validated("reduce_scatter", stream, [&] {
      check_views("reduce_scatter", in, out);
      if (in.count != out.count * static_cast<std::size_t>(size())) {
        mismatch("reduce_scatter", "in.count == out.count * size()", in.count, out.count);
      }
      if (!in_place && detail::overlaps(in.data, in.bytes(), out.data, out.bytes())) overlap_error("reduce_scatter");
    });
    auto op_info = info("reduce_scatter", in.count, in.dtype, std::string(name_of(op)));
    op_info.fingerprint = CollectiveFingerprint::of("reduce_scatter", out.count, out.dtype).with_op(op);
    submit(stream, std::move(op_info), [in, out, op](detail::CommunicatorState& s, auto deadline) {
      if (s.size == 1) return local_reduce(s, in, out, op);
      s.reduce_scatter_now(in.data, out.data, out.count, in.dtype, op, deadline);
    });
  }

  /// Returns (or, on the comm stream, completes) once every rank has reached it.
  void barrier(Stream stream = {}) {
    auto op_info = info("barrier", 0, DataType::kUint8, "");
    op_info.fingerprint = CollectiveFingerprint::of("barrier");
    submit(stream, std::move(op_info), [](detail::CommunicatorState& s, auto deadline) {
      if (s.size > 1) s.barrier_now(deadline);
    });
  }

  // ---- typed convenience overloads ---------------------------------------------------------------
  // The element type is deduced from the output span; the input converts (from a std::vector,
  // a std::span<T>, ...).


  template <class T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op = ReduceOp::kSum, Stream stream = {}) {
    all_reduce(TensorView::of(in), TensorView::of(out), op, stream);
  }
  /// In place.
  template <class T>
  void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::kSum, Stream stream = {}) {
    all_reduce(TensorView::of(data), TensorView::of(data), op, stream);
  }
  template <class T>
  void broadcast(std::span<const std::type_identity_t<T>> in, std::span<T> out, int root, Stream stream = {}) {
    broadcast(TensorView::of(in), TensorView::of(out), root, stream);
  }
  /// In place: root's `data` is sent, every other rank's is overwritten.
  template <class T>
  void broadcast(std::span<T> data, int root, Stream stream = {}) {
    broadcast(TensorView::of(data), TensorView::of(data), root, stream);
  }
  template <class T>
  void reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op, int root, Stream stream = {}) {
    reduce(TensorView::of(in), TensorView::of(out), op, root, stream);
  }
  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out, Stream stream = {}) {
    all_gather(TensorView::of(in), TensorView::of(out), stream);
  }
  template <class T>
  void all_gatherv(std::span<const std::type_identity_t<T>> in, std::span<T> out, std::span<const std::size_t> counts, Stream stream = {}) {
    all_gatherv(TensorView::of(in), TensorView::of(out), counts, stream);
  }
  template <class T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op = ReduceOp::kSum, Stream stream = {}) {
    reduce_scatter(TensorView::of(in), TensorView::of(out), op, stream);
  }

  // ---- memory and element-wise work (what fusion and compression use) -------------------------

  /// Host memory aligned to 64 bytes (a cache line, and any vector width). Never null; free
  /// with deallocate().
  void* allocate(std::size_t bytes) { return ::operator new(std::max<std::size_t>(bytes, 1), std::align_val_t{kAlignment}); }
  void deallocate(void* pointer) { ::operator delete(pointer, std::align_val_t{kAlignment}); }

  /// memcpy(to, from, bytes) on `stream`. The ranges must not overlap.
  void copy(void* to, const void* from, std::size_t bytes, Stream stream = {}) {
    run_local(stream, [to, from, bytes] {
      if (bytes > 0) std::memcpy(to, from, bytes);
    });
  }

  /// out[i] *= factor, in out's element type (see ncclkit::gloo::scale), on `stream`.
  void scale(TensorView out, double factor, Stream stream = {}) {
    if (out.where != MemoryKind::kHost) throw ConfigError(state().who() + ": scale needs host memory");
    const KernelIsa isa = state().isa;
    run_local(stream, [out, factor, isa] { gloo::scale(out.dtype, out.data, out.data, out.count, factor, isa); });
  }

 private:
  static constexpr std::size_t kAlignment = 64;

  detail::CommunicatorState& state() const {
    if (!state_) throw ConfigError("ncclkit::gloo::Communicator used after it was moved from");
    return *state_;
  }

  static void validate_options(CommunicatorOptions& options) {
    if (options.timeout <= std::chrono::milliseconds::zero()) {
      throw ConfigError("ncclkit::gloo::Communicator '" + options.name + "': timeout must be positive");
    }
    // "Wait forever" (milliseconds::max()) would overflow every now() + timeout, Gloo's own
    // deadlines included: bounded once here.
    options.timeout = ncclkit::detail::bounded_timeout(options.timeout);
    if (options.chunk_elements < 1 || options.chunk_elements > kMaxChunkElements) {
      throw ConfigError("ncclkit::gloo::Communicator '" + options.name + "': chunk_elements=" +
                        std::to_string(options.chunk_elements) + " must be in [1, 2^31-1]");
    }
  }

  static void connect(detail::CommunicatorState& s, const std::shared_ptr<ncclkit::Store>& store) {
    const auto start = std::chrono::steady_clock::now();
    // Also makes Gloo's device loop thread, created below, start with SIGPIPE blocked.
    detail::SigpipeBlock no_sigpipe;
    // Agree on a fresh key scope: the n-th communicator of this name on every rank gets
    // generation n, and reruns on a persistent store count on from where they left off.
    const std::string base = "ncclkit/gloo/" + s.options.name;
    const std::int64_t arrival = store->add(base + "/created", 1);
    const std::int64_t generation = (arrival - 1) / s.size;
    const std::string prefix = base + "/" + std::to_string(generation);
    log_debug(s.who() + ": rendezvous under '" + prefix + "/' (arrival " + std::to_string(arrival) + ")");
    auto scoped = std::make_shared<PrefixStore>(prefix, store);
    StoreAdapter adapter(scoped, s.options.timeout);

    ::gloo::transport::tcp::attr attr;
    std::string interface = s.options.interface;
    std::string hostname = s.options.hostname;
    if (interface.empty() && hostname.empty()) {
      interface = env_string("NCCLKIT_GLOO_SOCKET_IFNAME").value_or("");
      if (interface.empty()) hostname = env_string("NCCLKIT_GLOO_HOSTNAME").value_or("");
    }
    attr.iface = interface;
    attr.hostname = hostname;
    try {
      s.device = ::gloo::transport::tcp::CreateDevice(attr);
    } catch (const std::exception& e) {
      throw ConfigError(s.who() + ": cannot use " +
                        (interface.empty() ? "host name '" + (hostname.empty() ? std::string("<this machine's>") : hostname) + "'"
                                           : "network interface '" + interface + "'") +
                        " for Gloo's TCP transport: " + e.what() +
                        ". Pick an interface that exists and reaches the other ranks (`ip addr`), with "
                        "CommunicatorOptions::interface or NCCLKIT_GLOO_SOCKET_IFNAME.");
    }
    auto context = std::make_shared<detail::MonitoredContext>(s.rank, s.size);
    s.context = context;
    s.context->setTimeout(s.options.timeout);
    try {
      s.context->connectFullMesh(adapter, s.device);
    } catch (const TimeoutError& e) {
      throw TimeoutError(s.who() + ": rendezvous through " + s.store_description + " under '" + prefix +
                         "/' timed out after " + ncclkit::format_seconds(std::chrono::steady_clock::now() - start) +
                         missing_ranks(*scoped, s.rank, s.size) + ": " + e.what() +
                         ". Did every rank create this communicator?");
    } catch (const ncclkit::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(s.who() + ": connecting to the other ranks failed after " +
                      ncclkit::format_seconds(std::chrono::steady_clock::now() - start) + " (device " +
                      s.device->str() + "): " + e.what());
    }
    try {
      s.monitor = std::make_unique<detail::PeerMonitor>(*context, s.who());
      // connectFullMesh is not a barrier: a rank may return before its peers have connected.
      s.barrier_now(start + s.options.timeout);
    } catch (const std::exception& e) {
      throw CommError(s.who() + ": starting the peer monitor or the barrier after connecting failed after " +
                      ncclkit::format_seconds(std::chrono::steady_clock::now() - start) + ": " +
                      s.failure_cause(e.what()));
    }
    log_info(s.who() + ": connected through " + s.store_description + " ('" + prefix + "/') on " +
             s.device->str() + " in " + ncclkit::format_seconds(std::chrono::steady_clock::now() - start) +
             "; reductions: " + std::string(name_of(s.isa)));
  }

  /// Compares the ranks' CommunicatorOptions::check_collectives right after connecting.
  static void agree_on_argument_check(detail::CommunicatorState& s) {
    detail::SigpipeBlock no_sigpipe;
    const auto start = std::chrono::steady_clock::now();
    try {
      detail::agree_on_argument_check(s.context, s.options.check_collectives, s.options.timeout, s.who());
    } catch (const ncclkit::Error&) {
      throw;
    } catch (const std::exception& e) {
      throw CommError(s.who() + ": comparing the ranks' settings after connecting failed after " +
                      ncclkit::format_seconds(std::chrono::steady_clock::now() - start) + ": " + e.what());
    }
  }

  /// "; waiting for rank 1 (of 2), which never reached it": the ranks whose keys Gloo's
  /// rendezvous did not find under `scoped` (it writes "rank_<r>" first, then "<r>", the
  /// addresses of rank r's connections). Empty when every rank got that far or the store
  /// cannot say.
  static std::string missing_ranks(ncclkit::Store& scoped, int rank, int size) {
    std::vector<int> absent, silent;
    try {
      for (int r = 0; r < size; ++r) {
        if (r == rank) continue;
        const std::string arrived[] = {"rank_" + std::to_string(r)};
        const std::string published[] = {std::to_string(r)};
        if (!scoped.check(arrived)) {
          absent.push_back(r);
        } else if (!scoped.check(published)) {
          silent.push_back(r);
        }
      }
    } catch (const std::exception&) {
      return "";
    }
    std::string text;
    if (!absent.empty()) {
      text += "; waiting for " + ncclkit::detail::rank_or_ranks(absent) + " (of " + std::to_string(size) + "), which never reached it";
    }
    if (!silent.empty()) {
      text += "; " + ncclkit::detail::rank_or_ranks(silent) + " arrived but never published " + (silent.size() == 1 ? "its" : "their") +
              " connection addresses";
    }
    return text;
  }

  void destroy() noexcept {
    if (!state_) return;
    auto& s = *state_;
    try {
      detail::SigpipeBlock no_sigpipe;
      const std::size_t cancelled = s.queue ? s.queue->shutdown() : 0;
      if (cancelled > 0) {
        log_warn(s.who() + ": destroyed with " + std::to_string(cancelled) +
                 " collective(s) still queued on its comm stream; they were cancelled. Call "
                 "synchronize(comm_stream()) before destroying it.");
      }
      // Peers that leave the barrier below close their connections, which is no failure.
      if (s.monitor) s.monitor->stop();
      if (s.context && !s.failed.load() && cancelled == 0) {
        try {
          std::lock_guard<std::mutex> lock(s.context_mutex);
          s.barrier_now(std::chrono::steady_clock::now() + s.options.timeout);
        } catch (const std::exception& e) {
          log_warn(s.who() + ": the barrier before closing connections failed (" + e.what() +
                   "); closing them anyway");
        }
      }
      s.monitor.reset();  // its sentinels are buffers of the context
      s.context.reset();
      s.device.reset();
    } catch (const std::exception& e) {
      log_error(s.who() + ": error while destroying: " + e.what());
    } catch (...) {
      log_error(s.who() + ": unknown error while destroying");
    }
    state_.reset();
  }

  detail::OpInfo info(const char* name, std::size_t count, DataType type, std::string detail_text) {
    auto& s = state();
    s.check_usable(name);
    detail::OpInfo op;
    op.name = name;
    op.sequence = s.sequence.fetch_add(1) + 1;
    op.count = count;
    op.dtype = type;
    op.bytes = count * size_of(type);
    op.detail = std::move(detail_text);
    return op;
  }

  /// Runs `body(state, deadline)` as collective `op` on `stream`.
  template <class Body>
  void submit(Stream stream, detail::OpInfo op, Body body) {
    auto* s = &state();
    // Nothing to move (the same on every rank, unless the argument check finds otherwise).
    const bool empty = op.count == 0 && std::string_view(op.name) != "barrier";
    if (empty && !s->options.check_collectives) return;
    auto task = [s, op = std::move(op), body = std::move(body), empty] {
      s->execute(op, [&](std::chrono::steady_clock::time_point deadline) {
        if (!empty) body(*s, deadline);
      });
    };
    if (stream.queue == Stream::Queue::kInline) {
      task();
    } else {
      s->queue->submit(std::move(task));
    }
  }

  /// Runs a collective's local argument checks (`checks`, which throw ConfigError). With
  /// CommunicatorOptions::check_collectives on, a rank whose checks fail still takes its turn
  /// in the argument comparison, with a fingerprint that carries the reason, on `stream`
  /// (inline: now; comm stream: queued in order): so the other ranks raise a
  /// CollectiveMismatchError naming this rank and the reason at once, instead of waiting in
  /// the comparison until the timeout. This rank then raises its own ConfigError (the
  /// comparison's mismatch is not reported again here, nor at a later synchronize).
  template <class Checks>
  void validated(const char* name, Stream stream, Checks&& checks) {
    auto* s = &state();
    if (!s->options.check_collectives || s->size == 1) return checks();
    try {
      checks();
    } catch (const ConfigError& e) {
      std::string_view reason = e.what();
      const std::string prefix = s->who() + ": ";
      if (reason.starts_with(prefix)) reason.remove_prefix(prefix.size());
      auto op = info(name, 0, DataType::kUint8, "arguments rejected on this rank");
      op.fingerprint = CollectiveFingerprint::of(name).with_rejection(reason);
      auto task = [s, op = std::move(op)] {
        try {
          s->execute(op, [](std::chrono::steady_clock::time_point) {});
        } catch (const CollectiveMismatchError&) {
          // Expected: this rank's own ConfigError says why.
        }
      };
      if (stream.queue == Stream::Queue::kInline) {
        task();
      } else {
        s->queue->submit(std::move(task));
      }
      throw;
    }
  }

  template <class Fn>
  void run_local(Stream stream, Fn fn) {
    if (stream.queue == Stream::Queue::kInline) {
      fn();
    } else {
      state().queue->submit(std::move(fn));
    }
  }

  static void copy_view(TensorView in, TensorView out) {
    if (in.data != out.data && out.bytes() > 0) std::memcpy(out.data, in.data, out.bytes());
  }

  /// A world of one: the reduction of one rank's input is the input (avg divides by 1).
  static void local_reduce(detail::CommunicatorState&, TensorView in, TensorView out, ReduceOp) {
    if (out.data != nullptr) copy_view(TensorView{in.data, out.count, in.dtype, in.where}, out);
  }

  void check_root(const char* op, int root) const {
    if (root < 0 || root >= size()) {
      throw ConfigError(state().who() + ": " + op + " root " + std::to_string(root) + " is outside [0, " +
                        std::to_string(size()) + ")");
    }
  }

  void check_views(const char* op, const TensorView& in, const TensorView& out) const {
    auto& s = state();
    if (in.where != MemoryKind::kHost || out.where != MemoryKind::kHost) {
      throw ConfigError(s.who() + ": " + op + " needs host memory (TensorView::where == kHost); the Gloo "
                        "backend cannot read device memory: copy to the host or use the NCCL backend");
    }
    if (in.dtype != out.dtype) {
      throw ConfigError(s.who() + ": " + op + " input is " + std::string(name_of(in.dtype)) + " but output is " +
                        std::string(name_of(out.dtype)) + "; both must have the same element type");
    }
    if ((in.count > 0 && in.data == nullptr) || (out.count > 0 && out.data == nullptr)) {
      throw ConfigError(s.who() + ": " + op + " got a null pointer with a non-zero count");
    }
  }

  void check_alias(const char* op, const TensorView& in, const TensorView& out) const {
    if (in.data != out.data && detail::overlaps(in.data, in.bytes(), out.data, out.bytes())) overlap_error(op);
  }

  [[noreturn]] void overlap_error(const char* op) const {
    throw ConfigError(state().who() + ": " + op + " input and output overlap without being in place; pass the same "
                      "buffer for in-place use or non-overlapping buffers");
  }

  [[noreturn]] void mismatch(const char* op, const char* rule, std::size_t a, std::size_t b) const {
    throw ConfigError(state().who() + ": " + op + " needs " + rule + " (got " + std::to_string(a) + " and " +
                      std::to_string(b) + ")");
  }

  std::unique_ptr<detail::CommunicatorState> state_;
};

static_assert(Backend<Communicator>, "ncclkit::gloo::Communicator must model ncclkit::Backend");

}  // namespace ncclkit::gloo
