#pragma once
/// ncclkit::nccl::Communicator: a move-only owner of an NCCL communicator with typed,
/// stream-ordered collectives that never hang. Models ncclkit's `Backend` concept.
///
///   auto store = ncclkit::make_store(world.init_url, world);   // any ncclkit::Store
///   ncclkit::nccl::Communicator comm(store, world, {.timeout = std::chrono::seconds(120)});
///   comm.all_reduce(grads, grads, n, ncclkit::ReduceOp::kAvg);  // in place, default stream
///   comm.synchronize();
///
/// Creation. Rank 0 makes the ncclUniqueId and publishes it through the store, in a scope of
/// its own (`ncclkit/nccl/<name>/<k>`, k counting this rank's communicators of that name, so
/// several communicators and reruns never read each other's keys). Before that, ranks
/// exchange their NCCL, CUDA runtime and ncclkit versions; a mismatch is a ConfigError on
/// every rank naming the ranks. NCCL is initialised non-blocking (ncclConfig_t.blocking = 0)
/// and polled, so init is bounded by the timeout. The GPU is Options::device, else the local
/// rank modulo the visible GPUs. The calling thread's current device is left as it was.
///
/// Streams. Every collective takes a stream last, defaulting to default_stream() (the
/// communicator's own stream, or Options::stream). comm_stream() is a second stream, with
/// Options::stream_priority, for overlapping communication with compute. Nothing blocks
/// the host except synchronize() and barrier().
///
/// Failures. Each collective gets a sequence number and a completion event; a watchdog
/// thread (watchdog.hpp) aborts the communicator when one stays in flight longer than the
/// timeout or NCCL reports an asynchronous error. From then on every call, synchronize()
/// included, throws CommError naming rank, operation, sequence number, bytes, time waited and
/// every rank's progress. Misuse (root out of range, null or host pointers, buffers of
/// another GPU, mismatched sizes) throws ConfigError before NCCL sees it; the communicator
/// stays usable then. Arguments that differ between ranks are not detected unless
/// Options::check_collectives (NCCLKIT_CHECK_COLLECTIVES) compares them, through the store,
/// before each collective (detail/check_exchange.hpp). Destruction never hangs: pending work gets the timeout to finish, then
/// the communicator is aborted.
///
/// Released collectives (NCCL's behaviour): an aborted rank's kernels stop waiting but still
/// signal their peers, so a collective waiting for a rank that aborts may complete on the
/// others with undefined data. A failing rank announces its failure through the store before
/// it aborts; synchronize() checks for it before returning work that waited long, and the
/// watchdog's store link fails the communicator of a rank that learns of it while idle
/// (watchdog.hpp, docs/collectives.md). Not covered: work issued within one peer-check
/// interval of the announcement and consumed on the GPU without synchronize().
///
/// Threads. One thread at a time may issue work on a communicator (as with NCCL itself).
/// Collectives captured into a CUDA graph are issued (and must be replayed) in the same order
/// on every rank; their replays are not watched (no sequence number, no event).
///
/// Host code: compiles with g++ given the CUDA and NCCL include folders; scale() needs the
/// kernels of kernels.cuh, which nvcc translation units get from here automatically (one
/// such file in the program is enough).

#include <cuda_runtime_api.h>  // cudaStream_t, cudaPointerGetAttributes, cudaMalloc, ...
#include <nccl.h>              // ncclComm_t, ncclConfig_t and the collectives

#include <algorithm>    // std::min, std::max, std::equal, std::find
#include <iterator>     // std::begin, std::end
#include <atomic>       // std::atomic_ref
#include <cctype>       // std::tolower
#include <chrono>       // std::chrono
#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint64_t
#include <cstdio>       // std::snprintf
#include <cstring>      // std::memcpy
#include <memory>       // std::unique_ptr, std::shared_ptr
#include <mutex>        // std::unique_lock
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <thread>       // std::this_thread::sleep_for
#include <type_traits>  // std::type_identity_t
#include <utility>      // std::move
#include <vector>       // std::vector, std::erase

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/bounded_call.hpp"
#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/check_exchange.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"
#include "ncclkit/nccl/detail/driver_calls.hpp"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"
#include "ncclkit/nccl/detail/nvtx.hpp"
#include "ncclkit/nccl/group.hpp"
#include "ncclkit/nccl/options.hpp"
#include "ncclkit/nccl/rendezvous.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "ncclkit/nccl/types.hpp"
#include "ncclkit/nccl/watchdog.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "ncclkit/store/store.hpp"
#include "ncclkit/version.hpp"

#if defined(__CUDACC__)
#include "ncclkit/nccl/kernels.cuh"
#endif

namespace ncclkit::nccl {

/// The stream argument of every collective: a CUDA stream, or (by default) the
/// communicator's default stream. `nullptr` means CUDA's legacy default stream, as usual.
class StreamArg {
 public:
  StreamArg() = default;
  StreamArg(cudaStream_t stream) : stream_(stream), given_(true) {}        // NOLINT: implicit on purpose
  StreamArg(const nccl::Stream& stream) : stream_(stream.get()), given_(true) {}  // NOLINT
  cudaStream_t resolve(cudaStream_t fallback) const { return given_ ? stream_ : fallback; }

 private:
  cudaStream_t stream_ = nullptr;
  bool given_ = false;
};

/// "NCCL 2.28.9, CUDA runtime 13.0, ncclkit 0.1.0": what ranks compare at init.
inline std::string version_text() {
  int nccl_version = 0;
  NCCLKIT_NCCL_CHECK(ncclGetVersion(&nccl_version));
  int runtime = 0;
  NCCLKIT_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  const int major = nccl_version / 10000, minor = (nccl_version / 100) % 100, patch = nccl_version % 100;
  return "NCCL " + std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch) +
         ", CUDA runtime " + std::to_string(runtime / 1000) + "." + std::to_string((runtime % 1000) / 10) +
         ", ncclkit " + kVersionString;
}

class LocalGroup;

namespace detail {
/// Puts this thread in relaxed stream-capture mode for a scope: the argument checks' queries
/// (cudaPointerGetAttributes, cudaStreamGetDevice) then stay legal while a CUDA graph is being
/// captured in global mode, where CUDA would otherwise refuse them and spoil the capture.
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  ~RelaxedCaptureMode() { (void)cudaThreadExchangeStreamCaptureMode(&mode_); }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
};
}  // namespace detail

class Communicator {
 public:
  using Stream = cudaStream_t;
  using Event = nccl::Event;
  static constexpr MemoryKind memory_kind = MemoryKind::kDevice;

  /// Creates this rank's communicator of the job `world` describes; blocks until every rank
  /// has joined (bounded by the timeout). `store` is shared by all ranks (its keys are scoped
  /// here) and is kept for the progress exchange of failure reports.
  Communicator(std::shared_ptr<Store> store, const WorldInfo& world, Options options = {}) {
    world.validate();
    if (!store) throw ConfigError("nccl::Communicator '" + options.name + "': the store is null");
    auto core = make_core(std::move(options), world.rank, world.world_size, world.local_rank);
    const std::string who = core->who();
    const std::string base = "ncclkit/nccl/" + core->options.name;
    const std::int64_t index = store->add(base + "/instances/" + std::to_string(world.rank), 1);
    core->scope = std::make_shared<PrefixStore>(base + "/" + std::to_string(index), store);

    // The argument check works only if every rank makes it: the setting is compared here too.
    const std::string compared = version_text() + (core->options.check_collectives ? ", collective argument check on" : "");
    Bytes id_bytes = detail::init_rendezvous(
        *core->scope, core->rank, core->size, compared, core->options.timeout,
        [] {
          ncclUniqueId id;
          NCCLKIT_NCCL_CHECK(ncclGetUniqueId(&id));
          return Bytes(reinterpret_cast<const std::uint8_t*>(id.internal),
                       reinterpret_cast<const std::uint8_t*>(id.internal) + sizeof(id.internal));
        },
        who);
    ncclUniqueId id;
    if (id_bytes.size() != sizeof(id.internal)) {
      throw StoreError(who + " init: the unique id from rank 0 has " + std::to_string(id_bytes.size()) +
                       " bytes, expected " + std::to_string(sizeof(id.internal)));
    }
    std::memcpy(id.internal, id_bytes.data(), sizeof(id.internal));

    core->scope->set("joined/" + std::to_string(core->rank), "1");
    const auto deadline = detail::Clock::now() + core->options.timeout;
    ncclConfig_t config = make_config(core->options, /*blocking=*/false);
    ncclComm_t control = nullptr;
    {
      DeviceGuard guard(core->device);
      const ncclResult_t status = ncclCommInitRankConfig(&control, core->size, id, core->rank, &config);
      if (status != ncclSuccess && status != ncclInProgress) {
        if (control != nullptr) (void)ncclCommAbort(control);
        check_nccl(status, who + " init (ncclCommInitRankConfig)");
      }
    }
    wait_for_init(control, deadline, *core, "init (ncclCommInitRankConfig)", /*abort_on_failure=*/true,
                  /*picks_network=*/true);
    ncclComm_t comm = split_working(control, core->rank, deadline, *core);
    adopt(std::move(core), control, comm);
  }

  Communicator(Communicator&& other) noexcept = default;
  Communicator& operator=(Communicator&& other) noexcept {
    if (this != &other) {
      if (core_) shutdown_all({core_.get()});
      core_ = std::move(other.core_);
    }
    return *this;
  }
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;
  /// Finalises (pending work gets the timeout to finish) or aborts; never hangs, never throws.
  ~Communicator() {
    if (core_) shutdown_all({core_.get()});
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
  /// Sequence number of the last collective issued / of the last one known complete.
  std::uint64_t issued_seq() const { return core().watchdog.issued(); }
  std::uint64_t completed_seq() const { return core().watchdog.completed(); }
  /// Whether the communicator has failed (every call throws CommError then).
  bool failed() const { return core().watchdog.failed(); }
  /// The watchdog's report, once a failure has been handled.
  std::optional<FailureReport> failure_report() const { return core().watchdog.report(); }
  /// This communicator's scope of the store: its init keys, and `progress/<rank>` ("issued
  /// completed") published by the watchdog. Null for members of a LocalGroup.
  const std::shared_ptr<Store>& store_scope() const { return core().scope; }

  // ---- streams and ordering ---------------------------------------------------------------

  Stream default_stream() { return core().default_stream; }
  Stream comm_stream() { return core().comm_stream; }

  /// An event marking the work issued so far on `stream`.
  Event record(StreamArg stream = {}) {
    throw_if_failed();
    Event event(core().device);
    event.record(stream.resolve(core().default_stream));
    return event;
  }
  /// Makes later work on `stream` wait for `event`. Does not block the host.
  void wait(const Event& event, StreamArg stream = {}) {
    throw_if_failed();
    NCCLKIT_CUDA_CHECK(cudaStreamWaitEvent(stream.resolve(core().default_stream), event.get(), 0));
  }
  /// Blocks until `stream` is idle. Throws CommError when the communicator failed (also when
  /// the failure is what released the stream), TimeoutError after the timeout + 5 s.
  /// Not on a stream that is capturing a CUDA graph (ConfigError: a capture cannot be waited
  /// for).
  void synchronize(StreamArg stream = {}) {
    auto& c = core();
    c.watchdog.throw_if_failed();
    const cudaStream_t s = stream.resolve(c.default_stream);
    if (is_capturing(s)) refuse_capture("synchronize");
    NCCLKIT_CUDA_CHECK(cudaEventRecord(c.sync_event.get(), s));
    // Relaxed capture mode: the polling stays legal while another thread captures a graph in
    // global mode.
    detail::RelaxedCaptureMode relaxed;
    c.watchdog.wait_event(c.sync_event.get(), detail::Clock::now() + c.options.timeout + std::chrono::seconds(5),
                          "synchronize");
  }

  // ---- collectives on type-erased views (the Backend concept) ------------------------------

  /// out[i] = op over ranks of in[i]. In place when in.data == out.data.
  void all_reduce(TensorView in, TensorView out, ReduceOp op, StreamArg stream = {}) {
    static constexpr const char* kOp = "all_reduce";
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_op(kOp, op);
    check_pair(kOp, in, out, in.count, "in.count == out.count");
    check_collective(kOp, CollectiveFingerprint::of(kOp, in.count, in.dtype).with_op(op));
    issue(kOp, in.bytes(), s, [&](ncclComm_t comm) {
      return ncclAllReduce(in.data, out.data, in.count, to_nccl(in.dtype), to_nccl(op), comm, s);
    });
  }

  /// Copies `in` of rank `root` into `out` of every rank. `in` is read on the root only (may
  /// be empty elsewhere). In place when in.data == out.data on the root.
  void broadcast(TensorView in, TensorView out, int root, StreamArg stream = {}) {
    static constexpr const char* kOp = "broadcast";
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_root(kOp, root);
    check_buffer(kOp, "output", out, true);
    if (rank() == root) check_pair(kOp, in, out, out.count, "in.count == out.count on the root");
    const void* send = rank() == root ? in.data : out.data;
    check_collective(kOp, CollectiveFingerprint::of(kOp, out.count, out.dtype).with_root(root));
    issue(kOp, out.bytes(), s, [&](ncclComm_t comm) {
      return ncclBroadcast(send, out.data, out.count, to_nccl(out.dtype), root, comm, s);
    });
  }

  /// Reduces `in` of every rank into `out` of rank `root` (`out` is ignored elsewhere).
  void reduce(TensorView in, TensorView out, ReduceOp op, int root, StreamArg stream = {}) {
    static constexpr const char* kOp = "reduce";
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_op(kOp, op);
    check_root(kOp, root);
    check_buffer(kOp, "input", in, true);
    if (rank() == root) check_pair(kOp, in, out, in.count, "in.count == out.count on the root");
    check_collective(kOp, CollectiveFingerprint::of(kOp, in.count, in.dtype).with_op(op).with_root(root));
    issue(kOp, in.bytes(), s, [&](ncclComm_t comm) {
      return ncclReduce(in.data, rank() == root ? out.data : nullptr, in.count, to_nccl(in.dtype), to_nccl(op),
                        root, comm, s);
    });
  }

  /// out = the concatenation of every rank's `in`, in rank order (out.count == in.count *
  /// size()). In place when in.data is this rank's slice of out.
  void all_gather(TensorView in, TensorView out, StreamArg stream = {}) {
    static constexpr const char* kOp = "all_gather";
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_pair(kOp, in, out, in.count * static_cast<std::size_t>(size()), "out.count == in.count * size()");
    check_collective(kOp, CollectiveFingerprint::of(kOp, in.count, in.dtype));
    issue(kOp, out.bytes(), s, [&](ncclComm_t comm) {
      return ncclAllGather(in.data, out.data, in.count, to_nccl(in.dtype), comm, s);
    });
  }

  /// all_gather with a different count per rank: rank r contributes counts[r] elements, which
  /// land at offset counts[0] + ... + counts[r-1] of `out`. `counts` must be the same on every
  /// rank. One grouped broadcast per rank with a non-empty slice.
  void all_gather_uneven(TensorView in, TensorView out, std::span<const std::size_t> counts,
                         StreamArg stream = {}) {
    static constexpr const char* kOp = "all_gather_uneven";
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    if (counts.size() != static_cast<std::size_t>(size())) {
      misuse(kOp, "counts has " + std::to_string(counts.size()) + " entries, one per rank (" +
                      std::to_string(size()) + ") needed");
    }
    std::size_t total = 0;
    for (std::size_t c : counts) total += c;
    if (in.count != counts[static_cast<std::size_t>(rank())]) {
      misuse(kOp, "in.count is " + std::to_string(in.count) + " but counts[" + std::to_string(rank()) + "] is " +
                      std::to_string(counts[static_cast<std::size_t>(rank())]));
    }
    check_pair(kOp, in, out, total, "out.count == sum of counts");
    const ncclDataType_t type = to_nccl(out.dtype);
    const std::size_t element = size_of(out.dtype);
    check_collective(kOp, CollectiveFingerprint::of(kOp, out.count, out.dtype).with_counts(counts));
    issue(kOp, out.bytes(), s, [&](ncclComm_t comm) {
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
  void reduce_scatter(TensorView in, TensorView out, ReduceOp op, StreamArg stream = {}) {
    static constexpr const char* kOp = "reduce_scatter";
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_op(kOp, op);
    check_pair(kOp, out, in, out.count * static_cast<std::size_t>(size()), "in.count == out.count * size()");
    check_collective(kOp, CollectiveFingerprint::of(kOp, out.count, out.dtype).with_op(op));
    issue(kOp, in.bytes(), s, [&](ncclComm_t comm) {
      return ncclReduceScatter(in.data, out.data, out.count, to_nccl(in.dtype), to_nccl(op), comm, s);
    });
  }

  /// Slice j of `in` (in.count / size() elements) goes to rank j, landing there as slice
  /// `rank()` of `out`. in.count == out.count, a multiple of size(). Out of place only.
  void all_to_all(TensorView in, TensorView out, StreamArg stream = {}) {
    static constexpr const char* kOp = "all_to_all";
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_pair(kOp, in, out, in.count, "in.count == out.count");
    if (in.count % static_cast<std::size_t>(size()) != 0) {
      misuse(kOp, "in.count " + std::to_string(in.count) + " is not a multiple of size() " + std::to_string(size()));
    }
    if (in.count != 0 && in.data == out.data) misuse(kOp, "in and out are the same buffer; all_to_all is out of place only");
    const std::size_t per_peer = in.count / static_cast<std::size_t>(size());
    const ncclDataType_t type = to_nccl(in.dtype);
    check_collective(kOp, CollectiveFingerprint::of(kOp, in.count, in.dtype));
    issue(kOp, in.bytes(), s, [&](ncclComm_t comm) {
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
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_root(kOp, root);
    check_buffer(kOp, "input", in, true);
    if (rank() == root) check_pair(kOp, in, out, in.count * static_cast<std::size_t>(size()), "out.count == in.count * size() on the root");
    const ncclDataType_t type = to_nccl(in.dtype);
    void* receive = rank() == root ? out.data : nullptr;
    check_collective(kOp, CollectiveFingerprint::of(kOp, in.count, in.dtype).with_root(root));
    issue(kOp, rank() == root ? out.bytes() : in.bytes(), s, [&](ncclComm_t comm) {
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
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_root(kOp, root);
    check_buffer(kOp, "output", out, true);
    if (rank() == root) check_pair(kOp, out, in, out.count * static_cast<std::size_t>(size()), "in.count == out.count * size() on the root");
    const ncclDataType_t type = to_nccl(out.dtype);
    const void* send = rank() == root ? in.data : nullptr;
    check_collective(kOp, CollectiveFingerprint::of(kOp, out.count, out.dtype).with_root(root));
    issue(kOp, out.bytes(), s, [&](ncclComm_t comm) {
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
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_peer(kOp, peer);
    check_buffer(kOp, "input", in, true);
    issue(kOp, in.bytes(), s, [&](ncclComm_t comm) {
      return ncclSend(in.data, in.count, to_nccl(in.dtype), peer, comm, s);
    });
  }

  /// Receives into `out` from rank `peer` (see send).
  void recv(TensorView out, int peer, StreamArg stream = {}) {
    static constexpr const char* kOp = "recv";
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    check_peer(kOp, peer);
    check_buffer(kOp, "output", out, true);
    issue(kOp, out.bytes(), s, [&](ncclComm_t comm) {
      return ncclRecv(out.data, out.count, to_nccl(out.dtype), peer, comm, s);
    });
  }

  /// Returns once every rank has called barrier(): a one-element all_reduce on `stream`,
  /// then synchronize(stream). Bounded by the timeout like every collective. It waits on the
  /// host, so neither inside an open GroupGuard nor while `stream` captures a CUDA graph
  /// (ConfigError).
  void barrier(StreamArg stream = {}) {
    static constexpr const char* kOp = "barrier";
    const cudaStream_t s = checked_stream(kOp, stream);  // first: it learns whether s is capturing
    if (detail::group_state().depth > 0) {
      misuse(kOp, "called inside an open GroupGuard, where nothing is launched until the group ends, so it "
                  "cannot wait for the other ranks; call it after the group's end");
    }
    if (core().capturing) refuse_capture(kOp);
    check_collective(kOp, CollectiveFingerprint::of(kOp));
    auto& c = core();
    issue(kOp, sizeof(std::int32_t), s, [&](ncclComm_t comm) {
      return ncclAllReduce(c.scratch, c.scratch, 1, ncclInt32, ncclSum, comm, s);
    });
    synchronize(s);
  }

  // ---- typed collectives: pointer + count -------------------------------------------------

  template <class T>
  void all_reduce(const T* in, T* out, std::size_t count, ReduceOp op = ReduceOp::kSum, StreamArg stream = {}) {
    all_reduce(view(in, count), view(out, count), op, stream);
  }
  template <class T>
  void broadcast(const T* in, T* out, std::size_t count, int root, StreamArg stream = {}) {
    broadcast(view(in, rank() == root ? count : 0), view(out, count), root, stream);
  }
  /// In place: `buffer` is sent on the root and received everywhere else.
  template <class T>
  void broadcast(T* buffer, std::size_t count, int root, StreamArg stream = {}) {
    broadcast(view(buffer, count), view(buffer, count), root, stream);
  }
  template <class T>
  void reduce(const T* in, T* out, std::size_t count, ReduceOp op, int root, StreamArg stream = {}) {
    reduce(view(in, count), view(out, rank() == root ? count : 0), op, root, stream);
  }
  /// `count` elements per rank; `out` holds count * size().
  template <class T>
  void all_gather(const T* in, T* out, std::size_t count, StreamArg stream = {}) {
    all_gather(view(in, count), view(out, count * static_cast<std::size_t>(size())), stream);
  }
  /// `count` elements out per rank; `in` holds count * size().
  template <class T>
  void reduce_scatter(const T* in, T* out, std::size_t count, ReduceOp op = ReduceOp::kSum, StreamArg stream = {}) {
    reduce_scatter(view(in, count * static_cast<std::size_t>(size())), view(out, count), op, stream);
  }
  /// `count` elements per peer; both buffers hold count * size().
  template <class T>
  void all_to_all(const T* in, T* out, std::size_t count, StreamArg stream = {}) {
    const std::size_t total = count * static_cast<std::size_t>(size());
    all_to_all(view(in, total), view(out, total), stream);
  }
  /// `count` elements per rank; `out` (root only) holds count * size().
  template <class T>
  void gather(const T* in, T* out, std::size_t count, int root, StreamArg stream = {}) {
    gather(view(in, count), view(out, rank() == root ? count * static_cast<std::size_t>(size()) : 0), root, stream);
  }
  /// `count` elements per rank; `in` (root only) holds count * size().
  template <class T>
  void scatter(const T* in, T* out, std::size_t count, int root, StreamArg stream = {}) {
    scatter(view(in, rank() == root ? count * static_cast<std::size_t>(size()) : 0), view(out, count), root, stream);
  }
  template <class T>
  void send(const T* in, std::size_t count, int peer, StreamArg stream = {}) {
    send(view(in, count), peer, stream);
  }
  template <class T>
  void recv(T* out, std::size_t count, int peer, StreamArg stream = {}) {
    recv(view(out, count), peer, stream);
  }

  // ---- typed collectives: std::span -------------------------------------------------------

  template <class T>
  void all_reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op = ReduceOp::kSum,
                  StreamArg stream = {}) {
    all_reduce(view(in.data(), in.size()), view(out.data(), out.size()), op, stream);
  }
  /// In place.
  template <class T>
  void all_reduce(std::span<T> buffer, ReduceOp op = ReduceOp::kSum, StreamArg stream = {}) {
    all_reduce(view(buffer.data(), buffer.size()), view(buffer.data(), buffer.size()), op, stream);
  }
  template <class T>
  void broadcast(std::span<T> buffer, int root, StreamArg stream = {}) {
    broadcast(view(buffer.data(), buffer.size()), view(buffer.data(), buffer.size()), root, stream);
  }
  template <class T>
  void all_gather(std::span<const std::type_identity_t<T>> in, std::span<T> out, StreamArg stream = {}) {
    all_gather(view(in.data(), in.size()), view(out.data(), out.size()), stream);
  }
  template <class T>
  void reduce_scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op = ReduceOp::kSum,
                      StreamArg stream = {}) {
    reduce_scatter(view(in.data(), in.size()), view(out.data(), out.size()), op, stream);
  }
  template <class T>
  void all_to_all(std::span<const std::type_identity_t<T>> in, std::span<T> out, StreamArg stream = {}) {
    all_to_all(view(in.data(), in.size()), view(out.data(), out.size()), stream);
  }
  /// `out` is read on the root only (may be empty elsewhere).
  template <class T>
  void reduce(std::span<const std::type_identity_t<T>> in, std::span<T> out, ReduceOp op, int root,
              StreamArg stream = {}) {
    reduce(view(in.data(), in.size()), view(out.data(), out.size()), op, root, stream);
  }
  /// `out` (root only; may be empty elsewhere) holds in.size() * size().
  template <class T>
  void gather(std::span<const std::type_identity_t<T>> in, std::span<T> out, int root, StreamArg stream = {}) {
    gather(view(in.data(), in.size()), view(out.data(), out.size()), root, stream);
  }
  /// `in` (root only; may be empty elsewhere) holds out.size() * size().
  template <class T>
  void scatter(std::span<const std::type_identity_t<T>> in, std::span<T> out, int root, StreamArg stream = {}) {
    scatter(view(in.data(), in.size()), view(out.data(), out.size()), root, stream);
  }
  /// `T` may be const.
  template <class T>
  void send(std::span<T> in, int peer, StreamArg stream = {}) {
    send(view(in.data(), in.size()), peer, stream);
  }
  template <class T>
  void recv(std::span<T> out, int peer, StreamArg stream = {}) {
    recv(view(out.data(), out.size()), peer, stream);
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
    if (bytes == 0) return;
    if (destination == nullptr || source == nullptr) misuse("copy", "null pointer with " + std::to_string(bytes) + " bytes");
    DeviceGuard guard(core().device);  // the stream is this GPU's, which may not be current
    NCCLKIT_CUDA_CHECK(cudaMemcpyAsync(destination, source, bytes, cudaMemcpyDeviceToDevice,
                                       stream.resolve(core().default_stream)));
  }
  /// out[i] *= factor, computed in out's type (floats in float, doubles in double, integers
  /// rounded to nearest and saturated).
  void scale(TensorView out, double factor, StreamArg stream = {}) {
    const cudaStream_t s = checked_stream("scale", stream);
    check_buffer("scale", "buffer", out, true);
    auto launcher = detail::scale_launcher();
    if (launcher == nullptr) {
      throw ConfigError("scale needs ncclkit's CUDA kernels: include ncclkit/nccl/communicator.hpp (or "
                        "ncclkit/nccl/kernels.cuh) in at least one file compiled by nvcc");
    }
    DeviceGuard guard(core().device);  // kernels launch on the current device's streams only
    launcher(out.data, out.count, out.dtype, factor, s);
  }

  // ---- sub-groups and failure -------------------------------------------------------------

  /// ncclCommSplit: ranks with the same `color` form a new communicator, ordered by `key`
  /// (then by rank). A negative color takes no part and gets nullopt. Collective over this
  /// communicator. The child gets `options` (default: this one's, named "<name>.split", with
  /// streams of its own) and keeps its keys under this communicator's store scope. NCCL splits
  /// over the parent's network: an empty Options::net_name takes the parent's, another one
  /// is a ConfigError.
  std::optional<Communicator> split(int color, int key, std::optional<Options> options = std::nullopt) {
    auto& parent = core();
    parent.watchdog.throw_if_failed();
    Options child_options = options ? std::move(*options) : parent.options;
    if (!options) {
      child_options.name = parent.options.name + ".split";
      child_options.stream = nullptr;
    }
    child_options.device = parent.device;
    if (child_options.timeout.count() == 0) child_options.timeout = parent.options.timeout;
    // NCCL splits over the parent's network: in its source (2.28) another name fails the
    // split with "does not match the parent", and is compared with the parent's name even
    // when the parent has none (a null pointer). Neither was tried on a GPU. NCCL_NET, where
    // set, replaces both names inside NCCL, so they cannot differ there.
    if (child_options.net_name.empty()) {
      child_options.net_name = parent.options.net_name;
    } else if (!same_net_name(child_options.net_name, parent.options.net_name) && !env_string("NCCL_NET")) {
      const std::string parents = parent.options.net_name.empty()
                                      ? "this communicator was made without one"
                                      : "this communicator's is '" + parent.options.net_name + "'";
      throw ConfigError(parent.who() + " split: Options::net_name is '" + child_options.net_name + "', but " + parents +
                        "; a split communicator uses its parent's network, so leave net_name empty or the same");
    }
    // The child's rank is known only after the split: refusals name the parent and this rank.
    auto child = make_core(std::move(child_options), 0, 1, 0, parent.who() + " split");
    const std::uint64_t index = parent.splits++;
    const std::string what = "split(color " + std::to_string(color) + ", key " + std::to_string(key) + ")";
    const auto deadline = detail::Clock::now() + child->options.timeout;
    ncclConfig_t config = make_config(child->options, /*blocking=*/false);
    ncclComm_t control = nullptr;
    {
      // Split the parent's non-blocking control communicator: polled, hence bounded.
      std::unique_lock lock(parent.handle().mutex);
      if (parent.handle().aborted) {
        lock.unlock();
        parent.watchdog.throw_failure();
      }
      DeviceGuard guard(parent.device);
      const ncclResult_t status =
          ncclCommSplit(parent.handle().control, color < 0 ? NCCL_SPLIT_NOCOLOR : color, key, &control, &config);
      if (status != ncclSuccess && status != ncclInProgress) {
        lock.unlock();
        on_nccl_error(status, "split");
      }
    }
    ncclResult_t parent_state = ncclSuccess;
    try {
      parent_state = detail::wait_while_in_progress(parent, deadline, what, /*control=*/true);
    } catch (const TimeoutError& e) {
      if (control != nullptr) (void)ncclCommAbort(control);
      fail_issue("split", 0, e.what());
    }
    if (parent_state != ncclSuccess) {
      if (control != nullptr) (void)ncclCommAbort(control);
      on_nccl_error(parent_state, "split");
    }
    if (color < 0) return std::nullopt;
    try {
      control = await_child(control, parent.handle().control, deadline, *child, what);
    } catch (const std::exception& e) {
      fail_issue("split", 0, e.what());
    }
    wait_for_init(control, deadline, *child, what);
    int child_rank = 0, child_size = 1;
    NCCLKIT_NCCL_CHECK(ncclCommUserRank(control, &child_rank));
    NCCLKIT_NCCL_CHECK(ncclCommCount(control, &child_size));
    child->rank = child_rank;
    child->size = child_size;
    if (parent.scope) {
      child->scope = std::make_shared<PrefixStore>(
          "split/" + std::to_string(index) + "/color/" + std::to_string(color), parent.scope);
    }
    ncclComm_t comm = split_working(control, child_rank, deadline, *child);
    Communicator result;
    result.adopt(std::move(child), control, comm);
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
  friend class LocalGroup;

  Communicator() = default;

  detail::CommCore& core() const {
    if (!core_) throw ConfigError("nccl::Communicator used after it was moved from");
    return *core_;
  }

  void throw_if_failed() const { core().watchdog.throw_if_failed(); }

  /// A fresh core with options resolved: device chosen, timeout filled in. `who` opens the
  /// messages of the options it refuses (default: the communicator's name and rank).
  static std::unique_ptr<detail::CommCore> make_core(Options options, int rank, int size, int local_rank,
                                                     std::string who = {}) {
    if (who.empty()) who = "nccl::Communicator '" + options.name + "' (rank " + std::to_string(rank) + ")";
    auto core = std::make_unique<detail::CommCore>();
    if (options.timeout.count() <= 0) options.timeout = default_comm_timeout();
    // Deadlines are now + timeout (+ slack): a "forever" such as milliseconds::max() would
    // overflow them.
    if (options.timeout > std::chrono::duration<double>(kMaxTimeoutSeconds)) {
      throw ConfigError(who + ": Options::timeout of " + std::to_string(options.timeout.count()) +
                        " ms is too long (at most 1e9 s); to wait practically forever, give a long but finite "
                        "timeout such as std::chrono::hours(24 * 365)");
    }
    detail::check_nccl_knobs(options, who);
    const int visible = visible_device_count();
    if (visible == 0) {
      throw ConfigError(who + ": no GPU is visible to this process (check CUDA_VISIBLE_DEVICES and the driver); "
                              "use the Gloo backend on machines without GPUs");
    }
    if (options.device < 0) options.device = local_rank % visible;
    if (options.device >= visible) {
      throw ConfigError(who + ": device " + std::to_string(options.device) + " asked for, but only " +
                        std::to_string(visible) + " GPU(s) are visible");
    }
    core->rank = rank;
    core->size = size;
    core->device = options.device;
    core->options = std::move(options);
    return core;
  }

  /// For an init that failed with ncclInvalidUsage, which is what an unknown network name
  /// gives ("Failed to initialize any NET plugin"): the name NCCL was asked for, if any.
  static std::string network_hint(const Options& options) {
    if (auto forced = env_string("NCCL_NET")) {
      return "; NCCL_NET='" + *forced + "' chooses the network (over Options::net_name): is it one NCCL has here "
             "(built in: IB, Socket; others come from net plugins)?";
    }
    if (options.net_name.empty()) return {};
    return "; Options::net_name is '" + options.net_name +
           "': is it a network NCCL has here (built in: IB, Socket; others come from net plugins)?";
  }

  /// Network names as NCCL compares them (strcasecmp).
  static bool same_net_name(const std::string& a, const std::string& b) {
    return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
      return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
    });
  }

  /// maxCTAs that means "NCCL's own limit": above MAXCHANNELS (64 in NCCL 2.28), which NCCL
  /// caps it to, saying so in an INFO line (a WARN line before NCCL 2.27).
  static constexpr int kUncappedCtas = 1024;

  /// NCCL's config from the options. Non-blocking for the control communicator (init and
  /// split are polled, hence bounded), blocking for the one collectives run on (see CommHandle).
  static ncclConfig_t make_config(const Options& options, bool blocking) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = blocking ? 1 : 0;
    if (options.cga_cluster_size >= 0) config.cgaClusterSize = options.cga_cluster_size;
    if (options.min_ctas >= 0) config.minCTAs = options.min_ctas;
    if (options.max_ctas >= 0) config.maxCTAs = options.max_ctas;
    // NCCL compares minCTAs with maxCTAs before it fills in defaults, so a minimum given alone
    // fails init ("invalid argument") against the undefined maximum (INT_MIN). A maximum
    // above NCCL's channel limit stands for "no limit": NCCL caps it to that limit.
    if (options.min_ctas >= 0 && options.max_ctas < 0) config.maxCTAs = std::max(options.min_ctas, kUncappedCtas);
    if (!options.net_name.empty()) config.netName = options.net_name.c_str();
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 19, 0)
    config.commName = options.name.c_str();
#endif
    return config;
  }

  /// Polls a communicator being created until NCCL is done with it; aborts it and throws on
  /// an error or at `deadline` (naming, when the store knows, the ranks that never joined).
  static void wait_for_init(ncclComm_t comm, detail::Clock::time_point deadline, const detail::CommCore& core,
                            const std::string& what, bool abort_on_failure = true, bool picks_network = false) {
    auto pause = std::chrono::microseconds(10);
    while (true) {
      ncclResult_t state = ncclSuccess;
      const ncclResult_t status = ncclCommGetAsyncError(comm, &state);
      if (status != ncclSuccess) state = status;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) {
        const std::string error = describe_nccl_error(state, comm);
        if (abort_on_failure) (void)ncclCommAbort(comm);
        throw NcclError(core.who() + " " + what + " failed: " + error +
                        (picks_network && state == ncclInvalidUsage ? network_hint(core.options) : std::string()) +
                        "; set NCCL_DEBUG=WARN to see NCCL's account (duplicate GPUs across ranks? a firewall?)");
      }
      if (detail::Clock::now() >= deadline) {
        std::string missing;
        if (core.scope) {
          try {
            auto ranks = detail::missing_ranks(*core.scope, "joined/", core.size);
            missing = ranks.empty() ? "; every rank reached NCCL init (a network problem between them?)"
                                    : "; rank(s) that never reached NCCL init: " + detail::format_ranks(ranks);
          } catch (const std::exception&) {
            missing = "; the store did not answer which ranks joined";
          }
        }
        if (abort_on_failure) (void)ncclCommAbort(comm);
        throw TimeoutError(core.who() + " " + what + " did not finish within the timeout of " +
                           std::to_string(core.options.timeout.count()) + " ms" + missing +
                           "; raise Options::timeout / NCCLKIT_TIMEOUT if the job is large");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(2));
    }
  }

  /// Splits the (non-blocking, ready) control communicator into the blocking one collectives
  /// run on, every rank keeping its rank. The split is polled through its non-blocking
  /// parent, so it is bounded by `deadline`; on failure both are aborted and it throws.
  static ncclComm_t split_working(ncclComm_t control, int rank, detail::Clock::time_point deadline,
                                  const detail::CommCore& core) {
    ncclConfig_t config = make_config(core.options, /*blocking=*/true);
    ncclComm_t comm = nullptr;
    ncclResult_t status = ncclSuccess;
    {
      DeviceGuard guard(core.device);
      status = ncclCommSplit(control, 0, rank, &comm, &config);
    }
    try {
      if (status != ncclSuccess && status != ncclInProgress) {
        check_nccl(status, core.who() + " init (ncclCommSplit into the blocking communicator)", control);
      }
      comm = await_child(comm, control, deadline, core, "init (split of the control communicator)");
      wait_for_init(comm, deadline, core, "init (the blocking communicator)");
    } catch (...) {
      (void)ncclCommAbort(control);
      throw;
    }
    return comm;
  }

  /// Waits until NCCL has written the new handle of a split into `slot` (its helper thread does
  /// so when the split of a non-blocking parent completes), the parent reports an error
  /// (NcclError) or `deadline` passes (TimeoutError). Aborts nothing.
  static ncclComm_t await_child(ncclComm_t& slot, ncclComm_t parent, detail::Clock::time_point deadline,
                                const detail::CommCore& core, const std::string& what) {
    auto pause = std::chrono::microseconds(10);
    while (true) {
      if (ncclComm_t child = std::atomic_ref<ncclComm_t>(slot).load(std::memory_order_acquire)) return child;
      ncclResult_t state = ncclSuccess;
      if (ncclCommGetAsyncError(parent, &state) != ncclSuccess) state = ncclInternalError;
      if (state != ncclSuccess && state != ncclInProgress) {
        throw NcclError(core.who() + " " + what + " failed: " + describe_nccl_error(state, parent) +
                        "; set NCCL_DEBUG=WARN to see NCCL's account");
      }
      if (detail::Clock::now() >= deadline) {
        throw TimeoutError(core.who() + " " + what + " did not finish within the timeout of " +
                           std::to_string(core.options.timeout.count()) + " ms");
      }
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
    }
  }

  /// Completes a core whose NCCL handles are ready: streams, scratch, the watchdog. Aborts the
  /// handles if any of that fails.
  void adopt(std::unique_ptr<detail::CommCore> core, ncclComm_t control, ncclComm_t comm) {
    try {
      DeviceGuard guard(core->device);
      core->own_comm_stream = nccl::Stream(core->device, core->options.stream_priority);
      core->comm_stream = core->own_comm_stream.get();
      if (core->options.stream != nullptr) {
        core->default_stream = core->options.stream;
      } else {
        core->own_default_stream = nccl::Stream(core->device, 0);
        core->default_stream = core->own_default_stream.get();
      }
      core->sync_event = Event(core->device);
      NCCLKIT_CUDA_CHECK(cudaMalloc(&core->scratch, 8));
      NCCLKIT_CUDA_CHECK(cudaMemset(core->scratch, 0, 8));
      core->watchdog = Watchdog(Watchdog::Config{core->options.name, core->rank, core->size, core->device,
                                                 core->options.timeout, core->scope});
    } catch (...) {
      (void)ncclCommAbort(comm);
      (void)ncclCommAbort(control);
      if (core->scratch != nullptr) (void)cudaFree(core->scratch);
      throw;
    }
    core->watchdog.handle().control = control;
    core->watchdog.handle().comm = comm;
    core->watchdog.start();
    core_ = std::move(core);
  }

  /// Shuts communicators down together (a single-process group must finalise all of its
  /// members before waiting for any). Never throws, never waits much past each one's timeout:
  ///   1. the watchdog stops;
  ///   2. collectives still in flight get the timeout to complete; then the blocking
  ///      communicator is destroyed or, if they did not complete, or completed only after a
  ///      peer check interval (a peer's abort may have released them; a blocking destroy
  ///      could then wait for peers that are gone), aborted. ncclCommDestroy may synchronise
  ///      with the peers to free resources, so it runs on a helper thread and is waited for at
  ///      most min(timeout, 10 s); past that it is left running (its resources leak) and the
  ///      peers are taken as gone;
  ///   3. the idle control communicators are finalised together (non-blocking, polled for at
  ///      most min(timeout, 10 s)), then destroyed, or aborted when that fails or when the
  ///      peers are gone.
  static void shutdown_all(std::vector<detail::CommCore*> cores) noexcept {
    auto& group = detail::group_state();
    std::vector<detail::CommCore*> closing;
    for (auto* core : cores) {
      const bool stopped = core->watchdog.stop();
      auto& handle = core->handle();
      if (!stopped) {
        // Its thread is still running (an abort or a store call that takes long) and may yet
        // touch the handles: mark them aborted, so that it leaves them alone, and leak them.
        std::unique_lock lock(handle.mutex, std::defer_lock);
        const bool locked = lock.try_lock_for(std::chrono::seconds(2));
        if (locked && !handle.aborted) handle.aborted = true;
        log_error(core->who() + " destroyed while its watchdog thread was still busy after 10 s (a store that does "
                                "not answer?); its NCCL communicators are leaked rather than freed under that thread");
        continue;
      }
      if (handle.open_groups.load() > 0) {
        // Its ops sit in an open group that will still reference the handle: leak it rather
        // than free it under NCCL's feet.
        log_error(core->who() + " destroyed with ops queued in an open group; its NCCL communicators are leaked");
        std::erase(group.members, core);
        continue;
      }
      if (handle.aborted) continue;
      closing.push_back(core);
    }
    const auto limit_of = [](const detail::CommCore* core) {
      return std::min<std::chrono::milliseconds>(core->options.timeout, std::chrono::seconds(10));
    };
    std::vector<bool> peers_gone(closing.size(), false);
    for (std::size_t i = 0; i < closing.size(); ++i) {
      auto* core = closing[i];
      auto& handle = core->handle();
      if (handle.comm == nullptr) continue;
      const auto drained = core->watchdog.drain(detail::Clock::now() + core->options.timeout);
      if (!drained.completed) {
        log_warn(core->who() + ": collectives still in flight at destruction after the timeout; aborting");
      } else if (drained.waited_long) {
        log_warn(core->who() + ": collectives in flight at destruction completed only after a long wait (possibly "
                               "released by a peer's abort); aborting rather than waiting for the peers");
      }
      const bool clean = drained.completed && !drained.waited_long;
      ncclResult_t status = ncclSuccess;
      if (clean) {
        const auto returned = ncclkit::detail::call_bounded(
            [comm = handle.comm, device = core->device] {
              (void)cudaSetDevice(device);  // a fresh thread: NCCL frees on the current device
              return ncclCommDestroy(comm);
            },
            limit_of(core));
        if (returned) {
          status = *returned;
        } else {
          peers_gone[i] = true;
          log_warn(core->who() + ": ncclCommDestroy did not return within " + std::to_string(limit_of(core).count()) +
                   " ms (NCCL waits for the peers to free resources; one may have died or been stopped after its "
                   "last collective); left to finish in the background, its resources leak");
        }
      } else {
        status = ncclCommAbort(handle.comm);
      }
      if (status != ncclSuccess) log_warn(core->who() + ": destroying the NCCL communicator returned " + describe_nccl_error(status));
      handle.comm = nullptr;
    }
    std::vector<bool> finalizing(closing.size(), false);
    for (std::size_t i = 0; i < closing.size(); ++i) {
      if (closing[i]->handle().control == nullptr || peers_gone[i]) continue;
      const ncclResult_t status = ncclCommFinalize(closing[i]->handle().control);
      finalizing[i] = status == ncclSuccess || status == ncclInProgress;
    }
    for (std::size_t i = 0; i < closing.size(); ++i) {
      auto& handle = closing[i]->handle();
      if (handle.control == nullptr) continue;
      bool clean = finalizing[i];
      const auto deadline = detail::Clock::now() + limit_of(closing[i]);
      auto pause = std::chrono::microseconds(10);
      while (clean) {
        ncclResult_t state = ncclSuccess;
        if (ncclCommGetAsyncError(handle.control, &state) != ncclSuccess) state = ncclInternalError;
        if (state == ncclSuccess) break;
        if (state != ncclInProgress || detail::Clock::now() >= deadline) {
          clean = false;
          log_warn(closing[i]->who() + ": finalize did not complete (" +
                   (state == ncclInProgress ? std::string("timeout") : describe_nccl_error(state)) + "); aborting");
          break;
        }
        std::this_thread::sleep_for(pause);
        pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(2));
      }
      const ncclResult_t status = clean ? ncclCommDestroy(handle.control) : ncclCommAbort(handle.control);
      if (status != ncclSuccess && status != ncclInProgress) {
        log_warn(closing[i]->who() + ": " + (clean ? "ncclCommDestroy" : "ncclCommAbort") + " returned " +
                 describe_nccl_error(status));
      }
      handle.control = nullptr;
    }
    for (auto* core : cores) {
      if (core->scratch != nullptr && cudaFree(core->scratch) != cudaSuccess) (void)cudaGetLastError();
      core->scratch = nullptr;
    }
  }

  // ---- the issue path ---------------------------------------------------------------------

  /// Calls `call(comm)` (one NCCL call, or a group of them) under the handle's lock, waits out
  /// ncclInProgress, and hands the op to the watchdog (or to the open group).
  template <class Call>
  void issue(const char* operation, std::size_t bytes, cudaStream_t stream, Call&& call) {
    auto& c = core();
    auto& group = detail::group_state();
    const bool grouped = group.depth > 0;
    // In a group, without waiting for the report: a member with ops queued holds its abort
    // (and so its report) back until the group's end (Watchdog::handle_failure).
    c.watchdog.throw_if_failed(!grouped);
    detail::NvtxRange range(operation);
    // The sequence number is taken before the call, so that a call that never returns is
    // reported under its own number; captured collectives (replayed by the user's graph) get
    // none. checked_stream() has just learnt whether `stream` is capturing.
    const bool watched = !c.capturing;
    const std::uint64_t seq = watched ? c.watchdog.next_seq() : 0;
    ncclResult_t status;
    detail::Clock::time_point issued;
    {
      std::unique_lock lock(c.handle().mutex);
      if (c.handle().aborted) {
        lock.unlock();
        c.watchdog.throw_failure(!grouped);
      }
      issued = c.handle().enter(seq, operation, bytes);
      status = call(c.handle().comm);
      c.handle().leave();
      // Queued in the open group (captured ops too): join it before the lock is released, so
      // that the watchdog, which aborts under this lock, holds the abort until the group's end
      // has launched the op (an abort before would leave ncclGroupEnd a freed communicator).
      if (grouped && !c.joined && (status == ncclSuccess || status == ncclInProgress)) detail::join_group(c);
    }
    if (status == ncclInProgress && !grouped) {
      try {
        status = detail::wait_while_in_progress(c, detail::Clock::now() + c.options.timeout, operation);
      } catch (const TimeoutError& e) {
        fail_issue(operation, bytes, e.what(), seq);
      }
    }
    if (status != ncclSuccess && status != ncclInProgress) {
      if (watched && (status == ncclInvalidArgument || status == ncclInvalidUsage)) c.watchdog.undo_seq();
      on_nccl_error(status, operation, bytes, seq);
    }
    if (!watched) return;
    if (grouped) {
      c.pending.push_back({seq, operation, bytes, stream});
    } else {
      c.watchdog.track(seq, seq, operation, 1, bytes, stream, issued, /*merge=*/true);
    }
  }

  /// Usage errors leave the communicator usable (NcclError); anything else fails it (CommError).
  [[noreturn]] void on_nccl_error(ncclResult_t status, const char* operation, std::size_t bytes = 0,
                                  std::uint64_t seq = 0) {
    auto& c = core();
    if (status == ncclInvalidArgument || status == ncclInvalidUsage) {
      throw NcclError("ncclkit " + std::string(operation) + " on " + c.who() + ": NCCL rejected the call: " +
                      describe_nccl_error(status, c.handle().aborted ? nullptr : c.handle().comm));
    }
    fail_issue(operation, bytes, "NCCL returned " + describe_nccl_error(status) + " when it was issued", seq);
  }
  /// Fails the communicator over the collective being issued (`seq`; 0: it takes the next
  /// number, so that the report names it) and throws the CommError.
  [[noreturn]] void fail_issue(const char* operation, std::size_t bytes, const std::string& reason,
                               std::uint64_t seq = 0) const {
    auto& c = core();
    c.watchdog.request_failure(reason, seq != 0 ? seq : c.watchdog.next_seq(), operation, bytes);
    c.watchdog.throw_failure(detail::group_state().depth == 0);
  }

  /// Options::check_collectives: compares this call's arguments with every rank's through the
  /// store before it is issued (detail/check_exchange.hpp), inside an open group too (each call
  /// before it is queued). A mismatch throws CollectiveMismatchError on every rank, with
  /// nothing issued: the communicator stays usable. A rank that does not arrive within the
  /// timeout fails the communicator (CommError), as a collective that never completes would.
  void check_collective(const char* operation, CollectiveFingerprint fingerprint) {
    auto& c = core();
    if (!c.options.check_collectives || c.size == 1 || !c.scope) return;
    c.watchdog.throw_if_failed(detail::group_state().depth == 0);
    fingerprint.sequence = ++c.checks;
    try {
      detail::exchange_fingerprints(*c.scope, c.rank, c.size, c.checks, fingerprint, c.options.timeout, c.who());
    } catch (const CollectiveMismatchError& e) {
      log_error(e.what());
      throw;
    } catch (const std::exception& e) {
      fail_issue(operation, 0, e.what());
    }
  }

  // ---- argument checks (before NCCL sees anything) -----------------------------------------

  template <class T>
  static TensorView view(const T* data, std::size_t count) {
    return TensorView{const_cast<void*>(static_cast<const void*>(data)), count, data_type_v<T>, MemoryKind::kDevice};
  }
  static void* offset(void* base, int index, std::size_t count, DataType type) {
    return static_cast<char*>(base) + static_cast<std::size_t>(index) * count * size_of(type);
  }
  static const void* offset(const void* base, int index, std::size_t count, DataType type) {
    return static_cast<const char*>(base) + static_cast<std::size_t>(index) * count * size_of(type);
  }

  /// Every local argument check of the collectives ends here, before check_collective, so
  /// this is where a rank whose own arguments are bad still takes its turn in the argument
  /// comparison (reject_in_check), before raising its ConfigError.
  [[noreturn]] void misuse(const char* operation, const std::string& what) const {
    reject_in_check(operation, what);
    throw ConfigError("ncclkit " + std::string(operation) + " on " + core().who() + ": " + what);
  }
  /// Options::check_collectives, for a rank whose own validation rejected its call of the
  /// checked collective `operation`: publishes a fingerprint carrying `reason` in this
  /// call's turn of the comparison, so that the other ranks raise a CollectiveMismatchError
  /// naming this rank and the reason at once, instead of waiting for it until the timeout.
  /// The comparison's own mismatch is not raised here: the caller raises its ConfigError.
  /// Nothing to do for calls that are not compared (send, recv, synchronize, copy, ...).
  void reject_in_check(const char* operation, const std::string& reason) const {
    static constexpr std::string_view kChecked[] = {"all_reduce", "broadcast",  "reduce", "all_gather",
                                                    "all_gather_uneven", "reduce_scatter", "all_to_all",
                                                    "gather",     "scatter",    "barrier"};
    auto& c = core();
    if (!c.options.check_collectives || c.size == 1 || !c.scope || c.watchdog.failed()) return;
    if (std::find(std::begin(kChecked), std::end(kChecked), std::string_view(operation)) == std::end(kChecked)) return;
    const auto fingerprint = CollectiveFingerprint::of(operation).with_rejection(reason).with_sequence(++c.checks);
    try {
      detail::exchange_fingerprints(*c.scope, c.rank, c.size, c.checks, fingerprint, c.options.timeout, c.who());
    } catch (const CollectiveMismatchError&) {
      // Expected: a rejected call never matches.
    } catch (const std::exception& e) {
      fail_issue(operation, 0, e.what());
    }
  }
  void check_op(const char* operation, ReduceOp op) const {
    if (!is_valid(op)) misuse(operation, "invalid ReduceOp value " + std::to_string(static_cast<int>(op)));
  }
  void check_root(const char* operation, int root) const {
    if (root < 0 || root >= size()) {
      misuse(operation, "root " + std::to_string(root) + " is outside [0, " + std::to_string(size()) + ")");
    }
  }
  void check_peer(const char* operation, int peer) const {
    if (peer < 0 || peer >= size()) {
      misuse(operation, "peer " + std::to_string(peer) + " is outside [0, " + std::to_string(size()) + ")");
    }
  }
  static std::string address(const void* pointer) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", pointer);
    return text;
  }
  /// `first` and `second` have one element type, `second` holds `expected` elements, and both
  /// pass check_buffer.
  void check_pair(const char* operation, const TensorView& first, const TensorView& second, std::size_t expected,
                  const char* rule) const {
    if (first.dtype != second.dtype) {
      misuse(operation, std::string("element types differ: ") + std::string(name_of(first.dtype)) + " and " +
                            std::string(name_of(second.dtype)));
    }
    if (second.count != expected) {
      misuse(operation, std::string("sizes do not match (") + rule + "): " + std::to_string(first.count) + " and " +
                            std::to_string(second.count) + " elements");
    }
    // In place (one address, element type and memory kind): one buffer to check.
    const bool same = first.data == second.data && first.where == second.where && first.count <= second.count;
    if (!same) check_buffer(operation, "input/output", first, true);
    check_buffer(operation, "input/output", second, true);
  }
  void check_buffer(const char* operation, const char* which, const TensorView& buffer, bool needed) const {
    if (!needed) return;
    if (!is_valid(buffer.dtype)) misuse(operation, std::string(which) + " has an invalid DataType value");
    if (buffer.where != MemoryKind::kDevice) {
      misuse(operation, std::string(which) + " buffer is marked as host memory (TensorView::where); the NCCL "
                        "backend moves device memory");
    }
    if (buffer.count == 0) return;
    if (buffer.data == nullptr) {
      misuse(operation, std::string(which) + " is a null pointer with count " + std::to_string(buffer.count));
    }
    if (!core().options.check_pointers || core().capturing) return;
    if (core().checked_pointers.contains(buffer.data)) return;  // checked before (detail/checked_pointers.hpp)
    detail::RelaxedCaptureMode relaxed;  // legal while another stream captures a graph
    cudaPointerAttributes attributes{};
    const cudaError_t status = cudaPointerGetAttributes(&attributes, buffer.data);
    if (status != cudaSuccess) {
      (void)cudaGetLastError();
      attributes.type = cudaMemoryTypeUnregistered;
    }
    if (attributes.type == cudaMemoryTypeManaged) {
      core().checked_pointers.insert(buffer.data);
      return;
    }
    if (attributes.type != cudaMemoryTypeDevice) {
      misuse(operation, std::string(which) + " at " + address(buffer.data) + " (" + std::to_string(buffer.bytes()) +
                            " bytes) is " +
                            (attributes.type == cudaMemoryTypeHost ? "host memory (pinned)"
                                                                   : "host memory, or device memory already freed") +
                            "; NCCL needs device memory of GPU " + std::to_string(device()) +
                            " (cudaMalloc, Communicator::allocate, DeviceBuffer); Options::check_pointers = false "
                            "turns this check off");
    }
    if (attributes.device != device()) {
      misuse(operation, std::string(which) + " at " + address(buffer.data) + " is memory of GPU " +
                            std::to_string(attributes.device) + ", but this communicator runs on GPU " +
                            std::to_string(device()));
    }
    core().checked_pointers.insert(buffer.data);
  }
  /// Resolves the stream, learns whether it is capturing a CUDA graph (kept in the core for the
  /// checks and the issue path of this call), and checks its device (unless it is one of the
  /// streams the communicator made). While capturing, no CUDA
  /// query is made beyond the capture query (detail/driver_calls.hpp): capture is fragile,
  /// and one illegal call spoils it for good.
  cudaStream_t checked_stream(const char* operation, const StreamArg& stream) const {
    const cudaStream_t s = stream.resolve(core().default_stream);
    core().capturing = is_capturing(s);
    // Streams the communicator made are of its GPU; any other (Options::stream included, which
    // may be a special handle such as cudaStreamPerThread) is checked on every call.
    const bool own = s == core().own_default_stream.get() || s == core().own_comm_stream.get();
    if (!own || s == nullptr) check_stream_device(operation, s);
    return s;
  }
  /// Whether `s` is capturing a CUDA graph (or its capture was invalidated): the one CUDA query
  /// that is legal during a capture.
  static bool is_capturing(cudaStream_t s) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    NCCLKIT_CUDA_CHECK(detail::stream_is_capturing(s, &capture));
    return capture != cudaStreamCaptureStatusNone;
  }
  /// The misuse of a call that waits on the host, on a stream that is capturing.
  [[noreturn]] void refuse_capture(const char* operation) const {
    misuse(operation, "the stream is capturing a CUDA graph, and a capture cannot be waited for; call it on the "
                      "stream once the graph has been launched (cudaGraphLaunch), or end the capture first");
  }
  /// Misuse when `s` belongs to another GPU (queried when Options::check_pointers is on and
  /// nothing is capturing; CUDA 12.8 or later). A stream found good is remembered, as buffers
  /// are (detail/checked_pointers.hpp), except the handles that name the current device's
  /// stream (null, cudaStreamLegacy, cudaStreamPerThread), which are checked every call.
  void check_stream_device(const char* operation, cudaStream_t s) const {
#if CUDART_VERSION >= 12080
    if (core().options.check_pointers && !core().capturing) {
      const bool current_devices = is_default_stream_handle(s);
      if (!current_devices && core().checked_streams.contains(s)) return;
      detail::RelaxedCaptureMode relaxed;
      int stream_device = -1;
      if (cudaStreamGetDevice(s, &stream_device) != cudaSuccess) {
        (void)cudaGetLastError();
      } else if (stream_device == device()) {
        if (!current_devices) core().checked_streams.insert(s);
      } else {
        misuse(operation, "the stream belongs to GPU " + std::to_string(stream_device) +
                              ", but this communicator runs on GPU " + std::to_string(device()) +
                              (!current_devices ? ""
                               : s == cudaStreamPerThread
                                   ? " (the per-thread default stream is the current device's: switch devices or "
                                     "pass a stream of this GPU)"
                                   : " (the legacy default stream is the current device's: switch devices or pass "
                                     "a stream of this GPU)"));
      }
    }
#else
    (void)operation;
    (void)s;
#endif
  }

#if !NCCLKIT_NCCL_NATIVE_ALLTOALL_GATHER_SCATTER
  template <class SendAt, class ReceiveAt>
  ncclResult_t grouped_exchange(ncclComm_t comm, cudaStream_t s, ncclDataType_t type, std::size_t count,
                                SendAt send_at, ReceiveAt receive_at) {
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

}  // namespace ncclkit::nccl
