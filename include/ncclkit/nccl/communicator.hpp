#pragma once
/// ncclkit::nccl::Communicator: a move-only owner of an NCCL communicator with typed,
/// stream-ordered collectives that never hang. Models ncclkit's `Backend` concept.
///
///   auto store = ncclkit::make_store(world.init_url, world);   // any ncclkit::Store
///   ncclkit::nccl::Communicator comm(store, world, {.timeout = std::chrono::seconds(120)});
///   scale_kernel<<<grid, block>>>(grads, n);                    // CUDA's default stream
///   comm.all_reduce(grads, grads, n, ncclkit::ReduceOp::kAvg);  // in place, after the kernel
///   comm.synchronize();
///
/// Creation. Rank 0 makes the ncclUniqueId and publishes it through the store, in a scope of
/// its own (`ncclkit/nccl/<name>/<k>`, k counting this rank's communicators of that name, so
/// several communicators and reruns never read each other's keys). Before that, ranks
/// exchange their NCCL, CUDA runtime and ncclkit versions; a mismatch is a ConfigError on
/// every rank naming the ranks. NCCL is initialised non-blocking (ncclConfig_t.blocking = 0)
/// and polled, so init is bounded by the timeout (detail/init.hpp). The GPU is
/// Options::device, else the local rank modulo the visible GPUs. The calling thread's current
/// device is left as it was.
///
/// Streams. Every call takes a stream last. Without one it runs on default_stream(): the
/// stream the caller's compute runs on when it names none, so that a collective without a
/// stream is ordered after the kernels launched before it and before those launched after it,
/// with no event or wait: Options::stream if given, else CUDA's legacy default stream of the
/// communicator's GPU (`cudaStreamLegacy`, "stream 0"; the call makes that GPU current for
/// its own launch). The legacy stream also waits for, and is waited for by, every blocking
/// stream of the GPU, the per-thread default streams included (a program built with
/// `--default-stream per-thread` is safe too). comm_stream() is the communicator's own
/// non-blocking stream, with Options::stream_priority, for overlapping communication with
/// compute: work there is ordered with other streams only by record() and wait(). A given
/// `nullptr` or `cudaStreamPerThread` is the current device's, as CUDA says. Nothing blocks
/// the host except synchronize() and barrier().
///
/// Failures. Each collective gets a sequence number and a completion event; a watchdog
/// thread (detail/watchdog.hpp) aborts the communicator when one stays in flight longer than the
/// timeout or NCCL reports an asynchronous error. From then on every call, synchronize()
/// included, throws CommError naming rank, operation, sequence number, bytes, time waited and
/// every rank's progress. Misuse (root out of range, null or host pointers, buffers of
/// another GPU, mismatched sizes) throws ConfigError before NCCL sees it
/// (detail/argument_checks.hpp); the communicator stays usable then. Arguments that differ
/// between ranks are not detected unless Options::check_collectives
/// (NCCLKIT_CHECK_COLLECTIVES) compares them, through the store, before each collective
/// (detail/check_exchange.hpp). Destruction never hangs: pending work gets the timeout to
/// finish, then the communicator is aborted (detail/shutdown.hpp).
///
/// Released collectives (NCCL's behaviour): an aborted rank's kernels stop waiting but still
/// signal their peers, so a collective waiting for a rank that aborts may complete on the
/// others with undefined data. A failing rank announces its failure through the store before
/// it aborts; synchronize() checks for it before returning work that waited long, and the
/// watchdog's store link fails the communicator of a rank that learns of it while idle
/// (detail/store_link.hpp, docs/collectives.md). Not covered: work issued within one peer-check
/// interval of the announcement and consumed on the GPU without synchronize().
///
/// Threads. One thread at a time may issue work on a communicator (as with NCCL itself).
/// Collectives captured into a CUDA graph are issued (and must be replayed) in the same order
/// on every rank; their replays are not watched (no sequence number, no event). The legacy
/// default stream cannot capture: capture on a stream you pass.
///
/// Host code: compiles with g++ given the CUDA and NCCL include folders; scale() needs the
/// kernels of kernels.cuh, which nvcc translation units get from here automatically (one
/// such file in the program is enough).

#include <cuda_runtime_api.h>  // cudaStream_t, cudaStreamLegacy, cudaMalloc, cudaMemcpyAsync
#include <nccl.h>              // ncclComm_t and the collectives

#include <algorithm>  // std::clamp, std::min, std::max
#include <chrono>     // std::chrono
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint64_t
#include <memory>     // std::unique_ptr, std::shared_ptr
#include <optional>   // std::optional
#include <span>       // std::span
#include <string>     // std::string
#include <utility>    // std::move, std::exchange
#include <vector>     // std::vector

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/detail/agreement.hpp"
#include "ncclkit/core/detail/argument_checks.hpp"
#include "ncclkit/core/detail/backend_memory.hpp"
#include "ncclkit/core/detail/cast.hpp"
#include "ncclkit/core/detail/typed_collectives.hpp"
#include "ncclkit/core/detail/update_on_host.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/core/update.hpp"
#include "ncclkit/nccl/compressed_reduce.hpp"
#include "ncclkit/nccl/copy_batch.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/argument_checks.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"
#include "ncclkit/nccl/detail/init.hpp"
#include "ncclkit/nccl/detail/issue.hpp"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"
#include "ncclkit/nccl/detail/shutdown.hpp"
#include "ncclkit/nccl/detail/split.hpp"
#include "ncclkit/nccl/detail/watchdog.hpp"
#include "ncclkit/nccl/group.hpp"
#include "ncclkit/nccl/options.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "ncclkit/nccl/types.hpp"
#include "ncclkit/store/store.hpp"

#if defined(__CUDACC__)
#include "ncclkit/nccl/kernels.cuh"
#endif

namespace ncclkit::nccl {

class LocalGroup;

class Communicator : public ncclkit::detail::TypedCollectives<Communicator, StreamArg> {
  using Typed = ncclkit::detail::TypedCollectives<Communicator, StreamArg>;

 public:
  using Stream = cudaStream_t;
  using Event = nccl::Event;
  static constexpr MemoryKind memory_kind = MemoryKind::kDevice;

  /// Creates this rank's communicator of the job `world` describes; blocks until every rank
  /// has joined (bounded by the timeout). `store` is shared by all ranks (its keys are scoped
  /// here) and is kept for the progress exchange of failure reports.
  Communicator(std::shared_ptr<Store> store, const WorldInfo& world, Options options = {})
      : core_(detail::adopt_handles(detail::init_communicator(std::move(store), world, std::move(options)))) {}
  /// As above, with a store the caller owns; it must outlive the communicator.
  Communicator(Store& store, const WorldInfo& world, Options options = {})
      : Communicator(std::shared_ptr<Store>(std::shared_ptr<Store>{}, &store), world, std::move(options)) {}

  Communicator(Communicator&& other) noexcept = default;
  Communicator& operator=(Communicator&& other) noexcept {
    if (this != &other) {
      if (core_) detail::shutdown_all({core_.get()});
      core_ = std::move(other.core_);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  /// Finalises (pending work gets the timeout to finish) or aborts; never hangs, never throws.
  ~Communicator() {
    if (core_) detail::shutdown_all({core_.get()});
  }

  // ---- identity -------------------------------------------------------------------------

  int rank() const { return core().rank; }
  int size() const { return core().size; }
  int device() const { return core().device; }
  const std::string& name() const { return core().options.name; }
  const Options& options() const { return core().options; }
  std::chrono::milliseconds timeout() const { return core().options.timeout; }
  /// The (blocking) NCCL communicator collectives run on, for calls ncclkit does not wrap
  /// (null once aborted). Calls made through it are not watched.
  ncclComm_t native() const { return core().watchdog.handle().comm; }
  /// Collectives issued so far / known complete so far (each collective's sequence number).
  std::uint64_t issued_sequence() const { return core().watchdog.issued(); }
  std::uint64_t completed_sequence() const { return core().watchdog.completed(); }
  /// Whether the communicator has failed (every call throws CommError then).
  bool failed() const { return core().watchdog.failed(); }
  /// The watchdog's report, once a failure has been handled.
  std::optional<FailureReport> failure_report() const { return core().watchdog.report(); }
  /// This communicator's scope of the store: its init keys, and `progress/<rank>` ("issued
  /// completed") published by the watchdog. Null for members of a LocalGroup.
  const std::shared_ptr<Store>& store_scope() const { return core().scope; }

  // ---- streams and ordering ---------------------------------------------------------------

  /// Where calls without a stream run: Options::stream, else `cudaStreamLegacy` (CUDA's legacy
  /// default stream, used on this communicator's GPU whatever device is current).
  Stream default_stream() { return core().default_stream; }
  /// The communicator's own non-blocking stream (Options::stream_priority), for overlapping
  /// communication with compute; order it with other streams by record() and wait().
  Stream comm_stream() { return core().comm_stream; }
  /// A second non-blocking stream of this GPU at the comm stream's priority, made on first use:
  /// for work that should run beside the comm stream's collectives, not queue behind them
  /// (GradientSync's deferred updates, GradientSyncOptions::update_stream).
  Stream side_stream() {
    detail::CommCore& c = core();
    if (c.own_side_stream.get() == nullptr) c.own_side_stream = nccl::Stream(c.device, c.options.stream_priority);
    return c.own_side_stream.get();
  }

  /// A reusable event of this communicator's GPU, to record() many times.
  Event create_event() { return Event(core().device); }
  /// Marks the work issued so far on `stream` with `event`, forgetting what it marked before
  /// (no new CUDA event).
  void record(Event& event, StreamArg stream = {}) {
    throw_if_failed();
    event.record(stream.resolve(core().default_stream));  // Event::record finds its GPU's legacy stream
  }
  /// A reusable event that keeps a GPU timestamp (the Backend concept): a CUDA event without
  /// cudaEventDisableTiming, for `elapsed_ms`. Costlier to record than create_event()'s.
  Event create_timing_event() { return Event(core().device, true); }
  /// Milliseconds from timing event `start` to `end`, both recorded (cudaEventElapsedTime's
  /// resolution, about 0.5 us). Waits on the host until both are done, as `synchronize` does:
  /// CommError when the communicator failed, TimeoutError after the timeout + 5 s.
  double elapsed_ms(const Event& start, const Event& end) {
    auto& c = core();
    detail::RelaxedCaptureMode relaxed;
    const auto deadline = detail::Clock::now() + c.options.timeout + std::chrono::seconds(5);
    c.watchdog.wait_event(start.get(), deadline, "elapsed_ms");
    c.watchdog.wait_event(end.get(), deadline, "elapsed_ms");
    return static_cast<double>(end.elapsed_ms_since(start));
  }
  /// A new event marking the work issued so far on `stream` (one-off use; loops re-record one
  /// event from create_event() instead).
  Event record(StreamArg stream = {}) {
    Event event = create_event();
    record(event, stream);
    return event;
  }
  /// Makes later work on `stream` wait for `event`. Does not block the host.
  void wait(const Event& event, StreamArg stream = {}) {
    throw_if_failed();
    const cudaStream_t s = stream.resolve(core().default_stream);
    std::optional<DeviceGuard> on_device;  // the legacy stream is the current device's: make it this GPU
    if (s == cudaStreamLegacy) on_device.emplace(core().device);
    NCCLKIT_CUDA_CHECK(cudaStreamWaitEvent(s, event.get(), 0));
  }
  /// Blocks until `stream` is idle. Throws CommError when the communicator failed (also when
  /// the failure is what released the stream), TimeoutError after the timeout + 5 s.
  /// Not on a stream that is capturing a CUDA graph (ConfigError: a capture cannot be waited
  /// for).
  void synchronize(StreamArg stream = {}) {
    auto& c = core();
    c.watchdog.throw_if_failed();
    const cudaStream_t s = stream.resolve(c.default_stream);
    {
      std::optional<DeviceGuard> on_device;
      if (s == cudaStreamLegacy) on_device.emplace(c.device);
      if (detail::is_capturing(s)) {
        throw ConfigError(ncclkit::detail::misuse_message("synchronize", c.who(), detail::kCaptureRefusal));
      }
      NCCLKIT_CUDA_CHECK(cudaEventRecord(c.sync_event.get(), s));
    }
    // Relaxed capture mode: the polling stays legal while another thread captures a graph in
    // global mode.
    detail::RelaxedCaptureMode relaxed;
    c.watchdog.wait_event(c.sync_event.get(), detail::Clock::now() + c.options.timeout + std::chrono::seconds(5),
                          "synchronize");
  }

  // ---- collectives on type-erased views (the Backend concept) ------------------------------
  // The typed overloads (pointer + count, std::span) come from TypedCollectives.

  using Typed::all_gather;
  using Typed::all_gather_uneven;
  using Typed::all_reduce;
  using Typed::all_to_all;
  using Typed::broadcast;
  using Typed::gather;
  using Typed::recv;
  using Typed::reduce;
  using Typed::reduce_scatter;
  using Typed::scatter;
  using Typed::send;

  /// out[i] = op over ranks of in[i]. In place when in.data == out.data.
  void all_reduce(TensorView in, TensorView out, ReduceOp op = ReduceOp::kSum, StreamArg stream = {}) {
    static constexpr const char* kOp = "all_reduce";
    const detail::CheckedCall call(core(), kOp, stream);
    call.op(op);
    call.pair(in, out, in.count, "in.count == out.count");
    check_collective(call, CollectiveFingerprint::of(kOp, in.count, in.dtype).with_op(op));
    issue(call, in.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(in.data, out.data, in.count, to_nccl(in.dtype), to_nccl(op), comm, s);
    });
  }

  /// Copies `in` of rank `root` into `out` of every rank. `in` is read on the root only (may
  /// be empty elsewhere). In place when in.data == out.data on the root.
  void broadcast(TensorView in, TensorView out, int root, StreamArg stream = {}) {
    static constexpr const char* kOp = "broadcast";
    const detail::CheckedCall call(core(), kOp, stream);
    call.root(root);
    call.buffer("output", out);
    if (rank() == root) call.pair(in, out, out.count, "in.count == out.count on the root");
    const void* send = rank() == root ? in.data : out.data;
    check_collective(call, CollectiveFingerprint::of(kOp, out.count, out.dtype).with_root(root));
    issue(call, out.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclBroadcast(send, out.data, out.count, to_nccl(out.dtype), root, comm, s);
    });
  }

  /// Reduces `in` of every rank into `out` of rank `root` (`out` is ignored elsewhere).
  void reduce(TensorView in, TensorView out, ReduceOp op, int root, StreamArg stream = {}) {
    static constexpr const char* kOp = "reduce";
    const detail::CheckedCall call(core(), kOp, stream);
    call.op(op);
    call.root(root);
    call.buffer("input", in);
    if (rank() == root) call.pair(in, out, in.count, "in.count == out.count on the root");
    check_collective(call, CollectiveFingerprint::of(kOp, in.count, in.dtype).with_op(op).with_root(root));
    issue(call, in.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclReduce(in.data, rank() == root ? out.data : nullptr, in.count, to_nccl(in.dtype), to_nccl(op), root,
                        comm, s);
    });
  }

  /// out = the concatenation of every rank's `in`, in rank order (out.count == in.count *
  /// size()). In place when in.data is this rank's slice of out.
  void all_gather(TensorView in, TensorView out, StreamArg stream = {}) {
    static constexpr const char* kOp = "all_gather";
    const detail::CheckedCall call(core(), kOp, stream);
    call.pair(in, out, in.count * static_cast<std::size_t>(size()), "out.count == in.count * size()");
    check_collective(call, CollectiveFingerprint::of(kOp, in.count, in.dtype));
    issue(call, out.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllGather(in.data, out.data, in.count, to_nccl(in.dtype), comm, s);
    });
  }

  /// all_gather with a different count per rank: rank r contributes counts[r] elements, which
  /// land at offset counts[0] + ... + counts[r-1] of `out`. `counts` must be the same on every
  /// rank. One grouped broadcast per rank with a non-empty slice.
  void all_gather_uneven(TensorView in, TensorView out, std::span<const std::size_t> counts, StreamArg stream = {}) {
    static constexpr const char* kOp = "all_gather_uneven";
    const detail::CheckedCall call(core(), kOp, stream);
    if (counts.size() != static_cast<std::size_t>(size())) {
      call.misuse("counts has " + std::to_string(counts.size()) + " entries, one per rank (" + std::to_string(size()) +
                  ") needed");
    }
    std::size_t total = 0;
    for (std::size_t c : counts) total += c;
    if (in.count != counts[static_cast<std::size_t>(rank())]) {
      call.misuse("in.count is " + std::to_string(in.count) + " but counts[" + std::to_string(rank()) + "] is " +
                  std::to_string(counts[static_cast<std::size_t>(rank())]));
    }
    call.pair(in, out, total, "out.count == sum of counts");
    const ncclDataType_t type = to_nccl(out.dtype);
    const std::size_t element = size_of(out.dtype);
    check_collective(call, CollectiveFingerprint::of(kOp, out.count, out.dtype).with_counts(counts));
    issue(call, out.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
      ncclResult_t status = ncclGroupStart();
      if (status != ncclSuccess) return status;
      std::size_t offset = 0;
      for (int root = 0; root < size(); ++root) {
        const std::size_t n = counts[static_cast<std::size_t>(root)];
        void* slice = static_cast<char*>(out.data) + offset * element;
        if (n != 0) {
          status = ncclBroadcast(root == rank() ? in.data : slice, slice, n, type, root, comm, s);
          if (status != ncclSuccess) break;
        }
        offset += n;
      }
      const ncclResult_t end = ncclGroupEnd();
      return status != ncclSuccess ? status : end;
    });
  }

  /// out (out.count elements) = op over ranks of this rank's slice of in (in.count == out.count
  /// * size()). In place when out.data is this rank's slice of in.
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op = ReduceOp::kSum, StreamArg stream = {}) {
    static constexpr const char* kOp = "reduce_scatter";
    const detail::CheckedCall call(core(), kOp, stream);
    call.op(op);
    call.pair(out, in, out.count * static_cast<std::size_t>(size()), "in.count == out.count * size()");
    check_collective(call, CollectiveFingerprint::of(kOp, out.count, out.dtype).with_op(op));
    issue(call, in.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclReduceScatter(in.data, out.data, out.count, to_nccl(in.dtype), to_nccl(op), comm, s);
    });
  }

  /// Slice j of `in` (in.count / size() elements) goes to rank j, landing there as slice
  /// `rank()` of `out`. in.count == out.count, a multiple of size(). Out of place only.
  void all_to_all(TensorView in, TensorView out, StreamArg stream = {}) {
    static constexpr const char* kOp = "all_to_all";
    const detail::CheckedCall call(core(), kOp, stream);
    call.pair(in, out, in.count, "in.count == out.count");
    if (in.count % static_cast<std::size_t>(size()) != 0) {
      call.misuse("in.count " + std::to_string(in.count) + " is not a multiple of size() " + std::to_string(size()));
    }
    if (in.count != 0 && in.data == out.data)
      call.misuse("in and out are the same buffer; all_to_all is out of place only");
    const std::size_t per_peer = in.count / static_cast<std::size_t>(size());
    const ncclDataType_t type = to_nccl(in.dtype);
    check_collective(call, CollectiveFingerprint::of(kOp, in.count, in.dtype));
    issue(call, in.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
#if NCCLKIT_NCCL_NATIVE_ALLTOALL_GATHER_SCATTER
      return ncclAlltoAll(in.data, out.data, per_peer, type, comm, s);
#else
      return grouped_exchange(comm, s, type, per_peer,
                              [&](int peer) { return offset(in.data, peer, per_peer, in.dtype); },
                              [&](int peer) { return offset(out.data, peer, per_peer, in.dtype); });
#endif
    });
  }

  /// Every rank's `in` lands on rank `root` at offset rank * in.count of `out` (out.count ==
  /// in.count * size() on the root; `out` is ignored elsewhere).
  void gather(TensorView in, TensorView out, int root, StreamArg stream = {}) {
    static constexpr const char* kOp = "gather";
    const detail::CheckedCall call(core(), kOp, stream);
    call.root(root);
    call.buffer("input", in);
    if (rank() == root)
      call.pair(in, out, in.count * static_cast<std::size_t>(size()), "out.count == in.count * size() on the root");
    const ncclDataType_t type = to_nccl(in.dtype);
    void* receive = rank() == root ? out.data : nullptr;
    check_collective(call, CollectiveFingerprint::of(kOp, in.count, in.dtype).with_root(root));
    issue(call, rank() == root ? out.bytes() : in.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
#if NCCLKIT_NCCL_NATIVE_ALLTOALL_GATHER_SCATTER
      return ncclGather(in.data, receive, in.count, type, root, comm, s);
#else
      ncclResult_t status = ncclGroupStart();
      if (status != ncclSuccess) return status;
      if (in.count != 0) {
        if (rank() == root) {
          for (int peer = 0; peer < size() && status == ncclSuccess; ++peer)
            status = ncclRecv(offset(receive, peer, in.count, in.dtype), in.count, type, peer, comm, s);
        }
        if (status == ncclSuccess) status = ncclSend(in.data, in.count, type, root, comm, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return status != ncclSuccess ? status : end;
#endif
    });
  }

  /// Slice j of rank `root`'s `in` (in.count == out.count * size() there) lands in `out` of
  /// rank j. `in` is ignored off the root.
  void scatter(TensorView in, TensorView out, int root, StreamArg stream = {}) {
    static constexpr const char* kOp = "scatter";
    const detail::CheckedCall call(core(), kOp, stream);
    call.root(root);
    call.buffer("output", out);
    if (rank() == root)
      call.pair(out, in, out.count * static_cast<std::size_t>(size()), "in.count == out.count * size() on the root");
    const ncclDataType_t type = to_nccl(out.dtype);
    const void* send = rank() == root ? in.data : nullptr;
    check_collective(call, CollectiveFingerprint::of(kOp, out.count, out.dtype).with_root(root));
    issue(call, out.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
#if NCCLKIT_NCCL_NATIVE_ALLTOALL_GATHER_SCATTER
      return ncclScatter(send, out.data, out.count, type, root, comm, s);
#else
      ncclResult_t status = ncclGroupStart();
      if (status != ncclSuccess) return status;
      if (out.count != 0) {
        if (rank() == root) {
          for (int peer = 0; peer < size() && status == ncclSuccess; ++peer)
            status = ncclSend(offset(const_cast<void*>(send), peer, out.count, out.dtype), out.count, type, peer, comm, s);
        }
        if (status == ncclSuccess) status = ncclRecv(out.data, out.count, type, root, comm, s);
      }
      const ncclResult_t end = ncclGroupEnd();
      return status != ncclSuccess ? status : end;
#endif
    });
  }

  /// Sends `in` to rank `peer`, which must post a matching recv (same count and type). Pairs
  /// that must progress together go in one GroupGuard.
  void send(TensorView in, int peer, StreamArg stream = {}) {
    static constexpr const char* kOp = "send";
    const detail::CheckedCall call(core(), kOp, stream);
    call.peer(peer);
    call.buffer("input", in);
    issue(call, in.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclSend(in.data, in.count, to_nccl(in.dtype), peer, comm, s);
    });
  }

  /// Receives into `out` from rank `peer` (see send).
  void recv(TensorView out, int peer, StreamArg stream = {}) {
    static constexpr const char* kOp = "recv";
    const detail::CheckedCall call(core(), kOp, stream);
    call.peer(peer);
    call.buffer("output", out);
    issue(call, out.bytes(), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclRecv(out.data, out.count, to_nccl(out.dtype), peer, comm, s);
    });
  }

  /// Returns once every rank has called barrier(): a one-element all_reduce on `stream`,
  /// then synchronize(stream). Bounded by the timeout like every collective. It waits on the
  /// host, so neither inside an open GroupGuard nor while `stream` captures a CUDA graph
  /// (ConfigError).
  void barrier(StreamArg stream = {}) {
    static constexpr const char* kOp = "barrier";
    const detail::CheckedCall call(core(), kOp, stream);
    if (detail::group_state().depth > 0) {
      call.misuse(
          "called inside an open GroupGuard, where nothing is launched until the group ends, so it "
          "cannot wait for the other ranks; call it after the group's end");
    }
    if (call.stream().capturing) call.refuse_capture();
    check_collective(call, CollectiveFingerprint::of(kOp));
    auto& c = core();
    issue(call, sizeof(std::int32_t), [&](ncclComm_t comm, cudaStream_t s) {
      return ncclAllReduce(c.scratch, c.scratch, 1, ncclInt32, ncclSum, comm, s);
    });
    synchronize(call.stream().stream);
  }

  // ---- memory and element-wise work (the Backend concept) ---------------------------------

  /// `bytes` of device memory on this communicator's GPU (nullptr for 0 bytes).
  void* allocate(std::size_t bytes) {
    if (bytes == 0) return nullptr;
    DeviceGuard guard(core().device);
    void* pointer = nullptr;
    const cudaError_t status = cudaMalloc(&pointer, bytes);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      throw CudaError("allocate: cudaMalloc of " + std::to_string(bytes) + " bytes on " + core().who() +
                      " failed: " + describe_cuda_error(status));
    }
    return pointer;
  }
  void deallocate(void* pointer) {
    if (pointer == nullptr) return;
    detail::note_device_memory_freed();  // communicators forget the addresses they checked
    NCCLKIT_CUDA_CHECK(cudaFree(pointer));
  }
  /// Copies `bytes` between non-overlapping device buffers on `stream`.
  void copy(void* destination, const void* source, std::size_t bytes, StreamArg stream = {}) {
    copy_between(destination, source, bytes, cudaMemcpyDeviceToDevice, "copy", stream);
  }
  /// Copies `bytes` from host memory to this GPU's memory on `stream`. Pageable host memory is
  /// read before the call returns; pinned memory must stay valid until the stream reaches the copy.
  void copy_from_host(void* destination, const void* host_source, std::size_t bytes, StreamArg stream = {}) {
    copy_between(destination, host_source, bytes, cudaMemcpyHostToDevice, "copy_from_host", stream);
  }
  /// Copies `bytes` from this GPU's memory to host memory on `stream`; the host memory holds
  /// the data once the stream has reached the copy (synchronize(stream), or an event).
  void copy_to_host(void* host_destination, const void* source, std::size_t bytes, StreamArg stream = {}) {
    copy_between(host_destination, source, bytes, cudaMemcpyDeviceToHost, "copy_to_host", stream);
  }
  /// Sets every byte of `out` (this GPU's memory) to zero on `stream` (cudaMemsetAsync).
  void fill_zero(TensorView out, StreamArg stream = {}) {
    const detail::CheckedCall call(core(), "fill_zero", stream);
    if (out.count == 0) return;
    call.buffer("buffer", out);
    DeviceGuard guard(core().device);
    NCCLKIT_CUDA_CHECK(cudaMemsetAsync(out.data, 0, out.bytes(), call.stream().stream));
  }
  /// out[i] *= factor, computed in out's type (floats in float, doubles in double, integers
  /// rounded to nearest and saturated).
  void scale(TensorView out, double factor, StreamArg stream = {}) {
    const detail::CheckedCall call(core(), "scale", stream);
    call.buffer("buffer", out);
    const auto launcher = kernel_launcher(detail::scale_launcher(), "scale");
    DeviceGuard guard(core().device);  // kernels launch on the current device's streams only
    launcher(out.data, out.count, out.dtype, factor, call.stream().stream);
  }

  // ---- compression and packing ------------------------------------------------------------

  using CopyBatch = nccl::CopyBatch;

  /// out[i] = in[i] * factor converted to out's element type, in one kernel on `stream`
  /// (floating types; see the Backend concept). Where `nonfinite` (a std::uint64_t in this GPU's
  /// memory) is not null, the number of non-finite outputs is added to it on the device.
  void cast(TensorView in, TensorView out, double factor, std::uint64_t* nonfinite = nullptr, StreamArg stream = {}) {
    const detail::CheckedCall call(core(), "cast", stream);
    if (const std::string problem = ncclkit::detail::cast_problem(in, out); !problem.empty()) call.misuse(problem);
    if (in.count == 0) return;
    call.buffer("input", in);
    call.buffer("output", out);
    const auto launcher = kernel_launcher(detail::cast_launcher(), "cast");
    DeviceGuard guard(core().device);
    launcher(in.data, in.dtype, out.data, out.dtype, in.count, factor, nonfinite,
             static_cast<unsigned>(core().options.codec_blocks_per_sm), call.stream().stream);
  }

  /// A batch of device-to-device copies (pointers into this GPU's memory, not overlapping),
  /// its table copied to the GPU once, now (this call waits for that copy), in chunks of
  /// Options::copy_chunk_kb. Run it with copy_batch as often as wanted; empty copies are dropped.
  CopyBatch prepare_copies(std::span<const CopyItem> items) {
    if (const std::string problem = ncclkit::detail::copy_batch_problem(items); !problem.empty()) {
      throw ConfigError(ncclkit::detail::misuse_message("prepare_copies", core().who(), problem));
    }
    std::vector<detail::DeviceCopy> table;
    const std::uint64_t chunk_bytes = static_cast<std::uint64_t>(core().options.copy_chunk_kb) << 10;
    std::uint64_t chunks = 0;
    std::uint64_t bytes = 0;
    for (const CopyItem& item : items) {
      if (item.bytes == 0) continue;
      table.push_back({item.to, item.from, item.bytes, chunks});
      chunks += (item.bytes + chunk_bytes - 1) / chunk_bytes;
      bytes += item.bytes;
    }
    CopyBatch batch;
    batch.device_ = core().device;
    batch.chunk_bytes_ = chunk_bytes;
    if (table.empty()) return batch;
    batch.table_ = static_cast<detail::DeviceCopy*>(allocate(table.size() * sizeof(detail::DeviceCopy)));
    batch.count_ = table.size();
    batch.chunks_ = chunks;
    batch.bytes_ = bytes;
    DeviceGuard guard(core().device);
    NCCLKIT_CUDA_CHECK(
        cudaMemcpy(batch.table_, table.data(), table.size() * sizeof(detail::DeviceCopy), cudaMemcpyHostToDevice));
    return batch;
  }
  /// Runs every copy of `batch` on `stream`, as one kernel.
  void copy_batch(const CopyBatch& batch, StreamArg stream = {}) {
    const detail::CheckedCall call(core(), "copy_batch", stream);
    if (batch.size() == 0) return;
    if (batch.device() != core().device) {
      call.misuse("the batch was prepared on GPU " + std::to_string(batch.device()) +
                  "; prepare it with this communicator");
    }
    const auto launcher = kernel_launcher(detail::copy_batch_launcher(), "copy_batch");
    DeviceGuard guard(core().device);
    launcher(batch.table_, batch.count_, batch.chunks_, batch.chunk_bytes_,
             static_cast<unsigned>(core().options.copy_blocks_per_sm), call.stream().stream);
  }

  // ---- optimizer work (the Backend concept; core/update.hpp) ---------------------------------

  /// One optimizer update of float32 `param` by `grad` (and the rule's state), and its bfloat16
  /// `copy` where that has data, one kernel on `stream`.
  void update(const UpdateRule& rule, TensorView param, TensorView grad, TensorView state0, TensorView state1,
              TensorView copy, StreamArg stream = {}) {
    const detail::CheckedCall call(core(), "update", stream);
    if (const std::string problem = ncclkit::detail::update_problem(rule, param, grad, state0, state1, copy);
        !problem.empty()) {
      call.misuse(problem);
    }
    if (param.count == 0) return;
    call.buffer("parameters", param);
    call.buffer("gradients", grad);
    const int states = rule.state_count();
    if (states > 0) call.buffer("state", state0);
    if (states > 1) call.buffer("state", state1);
    if (copy.data != nullptr) call.buffer("copy", copy);
    const auto launcher = kernel_launcher(detail::update_launcher(), "update");
    DeviceGuard guard(core().device);
    launcher(FusedUpdate{rule, static_cast<float*>(param.data), states > 0 ? static_cast<float*>(state0.data) : nullptr,
                         states > 1 ? static_cast<float*>(state1.data) : nullptr, static_cast<BFloat16*>(copy.data)},
             static_cast<const float*>(grad.data), param.count, call.stream().stream);
  }
  /// Adds the sum of squares of `in` (floating types) to out[0], where `out` is kSquareSumWords
  /// doubles of this GPU's memory (the rest its scratch), on `stream`; the same bits for the same
  /// input on every GPU.
  void sum_squares(TensorView in, double* out, StreamArg stream = {}) {
    const detail::CheckedCall call(core(), "sum_squares", stream);
    if (in.count == 0) return;
    call.buffer("input", in);
    call.buffer("output", TensorView{out, kSquareSumWords, DataType::kFloat64, MemoryKind::kDevice});
    const auto launcher = kernel_launcher(detail::sum_squares_launcher(), "sum_squares");
    DeviceGuard guard(core().device);
    launcher(in.data, in.dtype, in.count, out, call.stream().stream);
  }

  // ---- compression fused into the transfer (the CompressedReduceBackend concept) -----------

  using CompressedReduce = nccl::CompressedReduce;

  /// Why prepare_compressed_reduce gives none on this rank, or empty where it can run: it
  /// needs every rank's GPU in reach of every other's memory (one node, NVLink or PCIe peer
  /// access), NCCL 2.28 at build time and the same major and minor version at run time (the
  /// kernel reads NCCL's window structure as its headers lay it out; prepare_compressed_reduce
  /// checks on every rank that the fields it reads lead to the window), and ncclkit's kernels.
  /// Options::compressed_reduce = false (or NCCLKIT_COMPRESSED_REDUCE=0) turns it off.
  /// prepare_compressed_reduce runs it only where every rank can.
  std::string compressed_reduce_unavailable() {
    int lsa_rank = 0;
    std::string why = CompressedReduce::local_verdict(core(), lsa_rank).why;
    return why.empty() ? core().compressed_reduce_problem : why;
  }
  /// A workspace for compressed_all_reduce of up to `max_count` float32 values that cross in
  /// `wire` (float16 or bfloat16), or none, on every rank alike, where any rank cannot run it.
  /// A collective: every rank calls it with the same arguments (compared: a ConfigError on every
  /// rank when they differ); it all-gathers each rank's verdict, registers a symmetric window and
  /// ends in a barrier. The kernel gets the fewest blocks any rank asked for
  /// (Options::compressed_reduce_blocks; more than 2 x the GPU's SMs is a ConfigError).
  std::optional<CompressedReduce> prepare_compressed_reduce(std::size_t max_count, DataType wire) {
    throw_if_failed();
    auto& c = core();
    const std::string who = "ncclkit prepare_compressed_reduce on " + c.who();
    // A rank whose own arguments are wrong still takes part, so that every rank fails at once.
    int sms = 1;
    {
      DeviceGuard guard(c.device);
      NCCLKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, c.device));
    }
    // One block per SM reaches NVLink's bandwidth at 512 threads (docs/performance.md); more
    // than two per SM could leave partners of a barrier waiting for a place on the GPU.
    const std::int64_t asked = c.options.compressed_reduce_blocks;
    std::string problem;
    if (wire != DataType::kFloat16 && wire != DataType::kBFloat16) {
      problem = ncclkit::detail::misuse_message("prepare_compressed_reduce", c.who(),
                                                "wire type " + std::string(name_of(wire)) + " is not float16 or bfloat16");
    } else if (asked > 2 * static_cast<std::int64_t>(sms)) {
      problem = ncclkit::detail::misuse_message(
          "prepare_compressed_reduce", c.who(),
          "Options::compressed_reduce_blocks (or NCCLKIT_COMPRESSED_REDUCE_BLOCKS) = " + std::to_string(asked) +
              " is more than 2 x the " + std::to_string(sms) + " SMs of this GPU; give 1 to " +
              std::to_string(2 * sms) + ", or 0 for one per SM");
    }
    int lsa_rank = 0;
    // A rank whose own arguments are wrong throws at the gather below: no verdict is needed.
    const CompressedReduce::Verdict verdict =
        problem.empty() ? CompressedReduce::local_verdict(c, lsa_rank) : CompressedReduce::Verdict{};
    const bool able = problem.empty() && verdict.why.empty();
    if (verdict.mendable) warn_unfused(verdict.why);
    const std::int64_t blocks = asked == 0 ? sms : asked;
    const std::uint64_t mine[4] = {able ? 1u : 0u, static_cast<std::uint64_t>(blocks), max_count,
                                   static_cast<std::uint64_t>(wire)};
    const ncclkit::detail::GatheredWords all =
        ncclkit::detail::gather_agreed(*this, comm_stream(), std::span<const std::uint64_t>(mine), problem, who);
    if (const int r = all.first_differing(2, 2); r >= 0) {
      throw ConfigError(who + ": rank " + std::to_string(r) + " asked for " + std::to_string(all.at(r, 2)) +
                        " values of " + std::string(name_of(static_cast<DataType>(all.at(r, 3)))) + ", rank 0 for " +
                        std::to_string(all.at(0, 2)) + " of " + std::string(name_of(static_cast<DataType>(all.at(0, 3)))) +
                        "; every rank must give the same arguments");
    }
    bool everyone = true;
    std::int64_t fewest = blocks;
    for (int r = 0; r < size(); ++r) {
      everyone = everyone && all.at(r, 0) == 1;
      fewest = std::min<std::int64_t>(fewest, static_cast<std::int64_t>(all.at(r, 1)));
    }
    if (!everyone) return std::nullopt;
    CompressedReduce workspace =
        CompressedReduce::create(c, std::max<std::size_t>(max_count, 1), wire, static_cast<int>(fewest), lsa_rank);
    // Every rank's view of the window checked out, or none runs the kernel (the workspace's
    // release, a collective, then runs on every rank alike).
    const std::uint64_t checked[1] = {workspace.layout_problem().empty() ? 1u : 0u};
    const ncclkit::detail::GatheredWords layouts =
        ncclkit::detail::gather_agreed(*this, comm_stream(), std::span<const std::uint64_t>(checked), {}, who);
    c.compressed_reduce_problem = workspace.layout_problem();
    if (!c.compressed_reduce_problem.empty()) warn_unfused(c.compressed_reduce_problem);
    for (int r = 0; r < size() && c.compressed_reduce_problem.empty(); ++r) {
      if (layouts.at(r, 0) != 1) {
        c.compressed_reduce_problem = "on rank " + std::to_string(r) +
                                      ", the fused kernel's view of NCCL's window did not check out (that rank's "
                                      "compressed_reduce_unavailable() says why)";
      }
    }
    if (!c.compressed_reduce_problem.empty()) return std::nullopt;
    barrier(comm_stream());
    return workspace;
  }
  /// data = decode * wire(sum over ranks of wire(data * encode)), in place, float32 in and
  /// out, in one kernel on `stream`: the 16-bit values cross between GPUs, each rank's own
  /// part is summed unrounded, every rank ends with the same bits. Where `nonfinite` (a
  /// std::uint64_t in this GPU's memory) is not null, the number of non-finite 16-bit results
  /// is added to it (the same count on every rank). Watched like a collective; every rank
  /// calls it with the same count, in the same order as its other collectives.
  void compressed_all_reduce(CompressedReduce& workspace, TensorView data, double encode, double decode,
                             std::uint64_t* nonfinite = nullptr, StreamArg stream = {}) {
    const detail::CheckedCall call(core(), "compressed_all_reduce", stream);
    workspace.run(call, data, encode, decode, nonfinite);
  }
  /// The same reduction, with an optimizer update (core/update.hpp) applied in the kernel's pass
  /// that makes each result: `update.values` and the rule's state (element i of each belonging to
  /// data's element i) get what `update(update.rule, values, <the result>, state0, state1)` would
  /// give them, bit for bit (the same update_element), without the result ever being written to
  /// memory and read back. `data` is not written: it keeps this rank's own values. The values and
  /// the state the rule keeps (UpdateRule::state_count; the others are ignored): `data.count`
  /// float32 values each, in this GPU's memory (checked like `data`), 16-byte aligned, none
  /// overlapping `data`; anything else is a ConfigError. Every rank passes the same rule.
  void compressed_all_reduce(CompressedReduce& workspace, TensorView data, double encode, double decode,
                             const FusedUpdate& update, std::uint64_t* nonfinite = nullptr, StreamArg stream = {}) {
    const detail::CheckedCall call(core(), "compressed_all_reduce", stream);
    workspace.run(call, data, encode, decode, nonfinite, &update);
  }

  // ---- sub-groups and failure -------------------------------------------------------------

  /// ncclCommSplit: ranks with the same `color` form a new communicator, ordered by `key`
  /// (then by rank). A negative color takes no part and gets nullopt. Collective over this
  /// communicator. The child gets `options` (default: this one's, named "<name>.split", with a
  /// comm stream of its own and no Options::stream) and keeps its keys under this
  /// communicator's store scope. NCCL splits
  /// over the parent's network: an empty Options::net_name takes the parent's, another one
  /// is a ConfigError.
  std::optional<Communicator> split(int color, int key, std::optional<Options> options = std::nullopt) {
    auto ready = detail::split_communicator(core(), color, key, std::move(options));
    if (!ready) return std::nullopt;
    Communicator result;
    result.core_ = detail::adopt_handles(std::move(*ready));
    return result;
  }

  /// Aborts the communicator now (as the watchdog does on a failure) and returns once the
  /// report is written; every later call throws CommError with `reason`. With ops of it
  /// queued in an open GroupGuard, the abort waits for the group's end (which then throws)
  /// and this returns at once.
  void abort(std::string reason = "abort() was called") {
    auto& c = core();
    c.watchdog.request_failure(std::move(reason));
    try {
      c.watchdog.throw_failure();
    } catch (const CommError&) {
      // expected: the report is written
    }
  }

 private:
  /// A warning, once per communicator, where the fused kernel cannot run on this rank for a reason
  /// the user can mend (CompressedReduce::Verdict): the fallback costs speed and would otherwise
  /// pass unseen.
  void warn_unfused(const std::string& why) {
    if (std::exchange(core().warned_unfused, true)) return;
    log_warn("ncclkit: " + core().who() +
             ": the fused compressed all-reduce cannot run, so 16-bit compression runs as separate casts around "
             "an all-reduce (slower): " +
             why);
  }

  friend class LocalGroup;

  void copy_between(void* destination, const void* source, std::size_t bytes, cudaMemcpyKind kind, const char* what,
                    StreamArg stream) {
    if (bytes == 0) return;
    if (destination == nullptr || source == nullptr) {
      throw ConfigError(ncclkit::detail::misuse_message(
          what, core().who(),
          "a null pointer with " + std::to_string(bytes) + " bytes; pass both buffers' addresses, or 0 bytes"));
    }
    DeviceGuard guard(core().device);  // the stream is this GPU's, which may not be current
    NCCLKIT_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, kind, stream.resolve(core().default_stream)));
  }

  Communicator() = default;

  /// A kernel launcher from kernel_hooks.hpp, or ConfigError saying how to get the kernels.
  template <class Launcher>
  static Launcher kernel_launcher(Launcher launcher, const char* operation) {
    if (launcher == nullptr) {
      throw ConfigError(std::string(operation) +
                        " needs ncclkit's CUDA kernels: include ncclkit/nccl/communicator.hpp (or "
                        "ncclkit/nccl/kernels.cuh) in at least one file compiled by nvcc");
    }
    return launcher;
  }

  detail::CommCore& core() const {
    if (!core_) throw ConfigError("nccl::Communicator used after it was moved from");
    return *core_;
  }

  void throw_if_failed() const { core().watchdog.throw_if_failed(); }

  void check_collective(const detail::CheckedCall& call, CollectiveFingerprint fingerprint) {
    detail::check_collective(call.core(), call.operation(), fingerprint);
  }
  template <class Call>
  void issue(const detail::CheckedCall& call, std::size_t bytes, Call&& nccl_call) {
    detail::issue(call.core(), call.operation(), bytes, call.stream(), std::forward<Call>(nccl_call));
  }

  static void* offset(void* base, int index, std::size_t count, DataType type) {
    return static_cast<char*>(base) + static_cast<std::size_t>(index) * count * size_of(type);
  }
  static const void* offset(const void* base, int index, std::size_t count, DataType type) {
    return static_cast<const char*>(base) + static_cast<std::size_t>(index) * count * size_of(type);
  }

  /// Completes a core whose NCCL handles are ready (detail::adopt_handles).
  void adopt(std::unique_ptr<detail::CommCore> core, ncclComm_t control, ncclComm_t comm) {
    core_ = detail::adopt_handles({std::move(core), control, comm});
  }

#if !NCCLKIT_NCCL_NATIVE_ALLTOALL_GATHER_SCATTER
  template <class SendAt, class ReceiveAt>
  ncclResult_t grouped_exchange(ncclComm_t comm, cudaStream_t s, ncclDataType_t type, std::size_t count, SendAt send_at,
                                ReceiveAt receive_at) {
    ncclResult_t status = ncclGroupStart();
    if (status != ncclSuccess) return status;
    if (count != 0) {
      for (int peer = 0; peer < size() && status == ncclSuccess; ++peer) {
        status = ncclSend(send_at(peer), count, type, peer, comm, s);
        if (status == ncclSuccess) status = ncclRecv(receive_at(peer), count, type, peer, comm, s);
      }
    }
    const ncclResult_t end = ncclGroupEnd();
    return status != ncclSuccess ? status : end;
  }
#endif

  std::unique_ptr<detail::CommCore> core_;
};

static_assert(Backend<Communicator>, "nccl::Communicator must model ncclkit::Backend");
static_assert(CompressedReduceBackend<Communicator>, "nccl::Communicator must model ncclkit::CompressedReduceBackend");

}  // namespace ncclkit::nccl
