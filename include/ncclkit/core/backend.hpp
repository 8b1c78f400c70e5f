#pragma once
/// The `Backend` concept: what generic code (fusion, compression, the trainer, the perf engine)
/// may use of a communicator. Modelled by `ncclkit::nccl::Communicator` (GPU memory, CUDA
/// streams) and `ncclkit::gloo::Communicator` (host memory, work queues run by threads).
///
/// Generic code is templated on the backend, not written against a virtual class, so the hot
/// path has no runtime dispatch and each backend keeps its native handle types.
///
/// Streams. Every operation takes a `Stream` last. Work on one stream runs in issue order; work
/// on different streams may overlap. `default_stream()` is where the caller's work runs when
/// it names no stream, so work issued there without a stream is ordered with it, no event
/// needed; `comm_stream()` is a stream reserved for communication, so collectives can overlap
/// compute, ordered with other streams only by events:
///   - NCCL: `Stream` is `cudaStream_t`, `Event` a CUDA event; nothing blocks the host. The
///     default stream is Options::stream, else CUDA's legacy default stream ("stream 0") of
///     the communicator's GPU, where `kernel<<<grid, block>>>` runs; the comm stream is the
///     communicator's own non-blocking stream.
///   - Gloo: `Stream` names a work queue. The default stream runs work inline in the calling
///     thread (the call returns when it is done); the comm stream hands work to one worker
///     thread per communicator that runs it in submission order (the call returns at once).
/// Events are made once and recorded many times: `create_event()` makes one, `record(event,
/// stream)` marks the work issued so far on `stream` (forgetting what it marked before), and
/// `record(stream)` does both at once for one-off use. `wait(event, stream)` makes later work on
/// `stream` wait for the marked work; `synchronize(stream)` blocks the host until `stream` is
/// idle and rethrows a failure of work that ran there.
///
/// Collectives take `TensorView`s whose `where` must equal `Backend::memory_kind`. In-place
/// means `out.data == in.data` (for all_gather: `in` is the rank's slice of `out`; for
/// reduce_scatter: `out` is the rank's slice of `in`). Every rank must issue the same
/// collectives in the same order. A failure (peer lost, timeout) throws `CommError` (at issue
/// or at synchronize) and leaves the communicator unusable. `abort(reason)`, callable from any
/// thread, is the one failure path generic code takes on purpose: the communicator becomes
/// unusable as after a failure (every later call throws `CommError` naming `reason`), work in
/// flight ends as soon as the backend can end it (bounded by the timeout), and its peers learn
/// of it; the destructor stays bounded and never throws.

#include <concepts>  // std::same_as, std::convertible_to
#include <optional>  // std::optional
#include <string>    // std::string
#include <cstddef>   // std::size_t
#include <cstdint>   // std::uint64_t
#include <span>      // std::span

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/core/update.hpp"

namespace ncclkit {

/// One copy of a batch: `bytes` from `from` to `to`, both in the backend's memory, not overlapping.
struct CopyItem {
  void* to = nullptr;
  const void* from = nullptr;
  std::size_t bytes = 0;
};

/// What generic code (fusion, compression, the trainer, the perf engine) may use of a backend.
/// Beyond identity, streams and the four collectives, the element-wise work that gradient
/// buckets need:
///   - `copy_from_host(to, host_from, bytes, stream)`, `copy_to_host(host_to, from, bytes,
///     stream)`: between host memory and the backend's (the host side must stay valid until
///     the stream reaches the copy); a backend of host memory copies as `copy` does.
///   - `fill_zero(view, stream)`: every byte of `view` zero (not `scale(view, 0)`: 0 × NaN is
///     NaN, and memory never written may hold anything).
///   - `cast(in, out, factor, nonfinite, stream)`: out[i] = in[i] * factor, converted to out's
///     element type, in one pass (floating types only: float16, bfloat16, float32, float64;
///     computed in float, in double where either side is float64; rounding to nearest).
///     `in.count == out.count`; `in` and `out` are one buffer or do not overlap. Where
///     `nonfinite` is not null it points to a `std::uint64_t` in the backend's memory, and the
///     number of outputs that are not finite (Inf, NaN) is added to it.
///   - `prepare_copies(items)`: a batch of copies, made once (on GPUs its table moves to device
///     memory once), then run as often as wanted by `copy_batch(batch, stream)`: one kernel
///     on GPUs, not one copy per item. The batch must not outlive the backend.
///   - `update(rule, param, grad, state0, state1, copy, stream)`: one optimizer step of float32
///     parameters, element by element (core/update.hpp: SGD, AdamW), writing each new value
///     rounded to bfloat16 into `copy` in the same pass where `copy` has data (a view with null
///     data: none; else bfloat16 of the parameters' count); `sum_squares(in, out,
///     stream)`: out[0] += Σ in[i]², where `out` is kSquareSumWords doubles of the backend's
///     memory (the rest its scratch), the same bits for the same input (the trainer's clipping).
///   - Timing events: `create_timing_event()` makes an `Event` recorded and waited for like
///     `create_event()`'s that also keeps when the work it marks was done (costlier to record:
///     made only where a timeline asks for it); `elapsed_ms(start, end)` is the time between two
///     recorded timing events (negative when `end` came first), blocking the host until both
///     are done, bounded as `synchronize` is, and throwing as it does when the work failed.
template <class B>
concept Backend = requires(B& backend, const B& const_backend, TensorView in, TensorView out, ReduceOp op, int root,
                           typename B::Stream stream, typename B::Event& event, const typename B::Event& done,
                           std::size_t bytes, void* pointer, const void* const_pointer, double factor,
                           std::uint64_t* nonfinite, std::span<const CopyItem> items, const typename B::CopyBatch& batch,
                           const UpdateRule& rule, double* squares) {
  typename B::Stream;
  typename B::Event;
  typename B::CopyBatch;
  { B::memory_kind } -> std::convertible_to<MemoryKind>;

  // Identity.
  { const_backend.rank() } -> std::same_as<int>;
  { const_backend.size() } -> std::same_as<int>;

  // Streams and ordering.
  { backend.default_stream() } -> std::same_as<typename B::Stream>;
  { backend.comm_stream() } -> std::same_as<typename B::Stream>;
  { backend.create_event() } -> std::same_as<typename B::Event>;
  { backend.create_timing_event() } -> std::same_as<typename B::Event>;
  backend.record(event, stream);  // re-records a reusable event
  { backend.record(stream) } -> std::same_as<typename B::Event>;
  backend.wait(event, stream);
  backend.synchronize(stream);
  { backend.elapsed_ms(done, done) } -> std::same_as<double>;

  // Collectives on type-erased views (the element type travels in the view).
  backend.all_reduce(in, out, op, stream);      // in.count == out.count
  backend.broadcast(in, out, root, stream);     // in read on root only
  backend.all_gather(in, out, stream);          // out.count == in.count * size()
  backend.reduce_scatter(in, out, op, stream);  // in.count == out.count * size()

  // Failure on purpose (see above).
  backend.abort(std::string());

  // Memory of the backend's kind, and the element-wise work of fusion and compression.
  { backend.allocate(bytes) } -> std::same_as<void*>;
  backend.deallocate(pointer);
  backend.copy(pointer, const_pointer, bytes, stream);            // non-overlapping, same memory kind
  backend.copy_from_host(pointer, const_pointer, bytes, stream);  // host to the backend's memory
  backend.copy_to_host(pointer, const_pointer, bytes, stream);    // the backend's memory to the host
  backend.fill_zero(out, stream);                                 // every byte of out zero
  backend.scale(out, factor, stream);                             // out[i] *= factor, in out's type
  backend.cast(in, out, factor, nonfinite, stream);
  { backend.prepare_copies(items) } -> std::same_as<typename B::CopyBatch>;
  backend.copy_batch(batch, stream);
  backend.update(rule, out, in, out, out, out, stream);
  backend.sum_squares(in, squares, stream);
};

/// A Backend that can also run a compressed all-reduce as one fused operation, the 16-bit
/// data moving between devices inside the kernel that encodes and decodes it (the NCCL
/// communicator, on one node; nccl/compressed_reduce.hpp). The one refinement of `Backend`,
/// since only a backend with a kernel of its own for it can model it:
///   - `compressed_reduce_unavailable()`: why it cannot run here, or empty where it can;
///   - `prepare_compressed_reduce(max_count, wire)`: a workspace for float32 data of up to
///     `max_count` values crossing as `wire` (float16 or bfloat16), or none where the backend
///     cannot run it here (the same answer on every rank); a collective.
///   - `compressed_all_reduce(workspace, data, encode, decode, nonfinite, stream)`: in place,
///     data = decode * wire(sum over ranks of wire(data * encode)) (each rank's own part may be
///     summed unrounded), the same bits on every rank; adds the count of non-finite 16-bit
///     results to `*nonfinite` where it is not null (the same count on every rank).
///   - `compressed_all_reduce(workspace, data, encode, decode, update, nonfinite, stream)`: the
///     same reduction with a `FusedUpdate` (core/update.hpp) applied to each result where it is
///     made, as `update(update.rule, values, result, state0, state1)` would (the same
///     update_element): the result goes into the parameters and state, `data` keeps this rank's
///     own values.
template <class B>
concept CompressedReduceBackend = Backend<B> &&
    requires(B& backend, TensorView data, double factor, std::uint64_t* nonfinite,
             typename B::CompressedReduce& workspace, typename B::Stream stream, std::size_t count, DataType wire,
             const FusedUpdate& update) {
  typename B::CompressedReduce;
  { backend.compressed_reduce_unavailable() } -> std::convertible_to<std::string>;
  { backend.prepare_compressed_reduce(count, wire) } -> std::same_as<std::optional<typename B::CompressedReduce>>;
  backend.compressed_all_reduce(workspace, data, factor, factor, nonfinite, stream);
  backend.compressed_all_reduce(workspace, data, factor, factor, update, nonfinite, stream);
};

}  // namespace ncclkit
