#pragma once
/// `nccl::CompressedReduce`: the workspace of Communicator::compressed_all_reduce, a float32
/// all-reduce whose data crosses NVLink in 16 bits, with compression fused into the transfer
/// (detail/compressed_reduce_kernels.cuh says how). Made by
/// Communicator::prepare_compressed_reduce, which returns none where it cannot run (see
/// compressed_reduce_unavailable): the caller then casts around an ordinary all-reduce.
///
/// It holds a symmetric window (ncclMemAlloc'd, registered with NCCL_WIN_COLL_SYMMETRIC: a
/// collective), twice the 16-bit size of the largest call plus barrier flags, per-block
/// barrier counts, a stop flag in device memory (raised before an abort of the communicator,
/// which unmaps the window), and a flag in mapped host memory that a kernel raises when it
/// gave up waiting for a peer. Calls on one workspace must be ordered (one stream, or streams joined
/// by events). Destroy it before its communicator, on every rank: deregistering is a
/// collective too (bounded like every NCCL call of the communicator); after a failure of the
/// communicator, or after a kernel gave up, it only frees its memory.
///
/// Needs NCCL 2.28 (its device API) at build time; with older headers the workspace exists
/// but prepare_compressed_reduce always returns none.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cuda_runtime_api.h>
#include <dlfcn.h>  // dlsym: ncclTeamLsa is not in every NCCL 2.28 library
#include <nccl.h>

#include <chrono>   // std::chrono
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint32_t, std::uintptr_t
#include <mutex>    // std::unique_lock
#include <string>   // std::string
#include <utility>  // std::exchange

#include "ncclkit/core/detail/align.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/core/update.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/argument_checks.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"
#include "ncclkit/nccl/detail/issue.hpp"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"
#include "ncclkit/nccl/detail/nccl_version.hpp"

#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define NCCLKIT_NCCL_DEVICE_API 1
#else
#define NCCLKIT_NCCL_DEVICE_API 0
#endif

namespace ncclkit::nccl {

class Communicator;

class CompressedReduce {
 public:
  CompressedReduce() = default;
  CompressedReduce(CompressedReduce&& other) noexcept { *this = std::move(other); }
  CompressedReduce& operator=(CompressedReduce&& other) noexcept {
    if (this != &other) {
      release();
      core_ = std::exchange(other.core_, nullptr);
      window_ = std::exchange(other.window_, nullptr);
      memory_ = std::exchange(other.memory_, nullptr);
      epochs_ = std::exchange(other.epochs_, nullptr);
      gave_up_ = std::exchange(other.gave_up_, nullptr);
      gave_up_device_ = std::exchange(other.gave_up_device_, nullptr);
      done_ = std::exchange(other.done_, nullptr);
      stop_stream_ = std::exchange(other.stop_stream_, nullptr);
      stop_landed_ = std::exchange(other.stop_landed_, nullptr);
      used_ = std::exchange(other.used_, false);
      window_bytes_ = other.window_bytes_;
      capacity_ = other.capacity_;
      slot_ = other.slot_;
      blocks_ = other.blocks_;
      lsa_rank_ = other.lsa_rank_;
      wire_ = other.wire_;
      layout_problem_ = std::move(other.layout_problem_);
    }
    return *this;
  }
  CompressedReduce(const CompressedReduce&) = delete;
  CompressedReduce& operator=(const CompressedReduce&) = delete;
  ~CompressedReduce() { release(); }

  /// The most float32 values one call may reduce.
  std::size_t capacity() const { return capacity_; }
  /// The 16-bit type the data crosses in: kFloat16 or kBFloat16.
  DataType wire() const { return wire_; }
  /// Bytes of the symmetric window.
  std::size_t window_bytes() const { return window_bytes_; }
  /// Blocks of the kernel: the fewest any rank asked for (one per SM by default;
  /// NCCLKIT_COMPRESSED_REDUCE_BLOCKS).
  int blocks() const { return blocks_; }

 private:
  friend class Communicator;

  /// Why this rank cannot run the fused kernel (empty where it can; then `lsa_rank` is its rank
  /// in the team of GPUs that reach each other's memory), and whether the reason is a fault of
  /// the build or the installation that the user can mend, worth a warning: the kernels not
  /// compiled in, an NCCL of another version than the headers, or one that shows no device API.
  /// A choice (Options) or the machine (GPUs out of each other's reach) is not. Ranks may differ
  /// (the environment is per process): prepare_compressed_reduce compares their verdicts.
  struct Verdict {
    std::string why;
    bool mendable = false;
  };
  static Verdict local_verdict(detail::CommCore& core, int& lsa_rank) {
    if (detail::compressed_reduce_launcher() == nullptr) {
      return {"the kernel is missing: include ncclkit/nccl/kernels.cuh in a file compiled by nvcc", true};
    }
    if (!core.options.compressed_reduce)
      return {"Options::compressed_reduce is false (or NCCLKIT_COMPRESSED_REDUCE=0)"};
#if !NCCLKIT_NCCL_DEVICE_API
    (void)core;
    (void)lsa_rank;
    return {"ncclkit was built against NCCL " + detail::nccl_version_text(NCCL_VERSION_CODE) +
                "; it needs NCCL 2.28's device API",
            true};
#else
    int version = 0;
    if (ncclGetVersion(&version) != ncclSuccess) return {"NCCL did not say its version (ncclGetVersion)", true};
    if (std::string why = detail::device_api_version_verdict(NCCL_VERSION_CODE, version); !why.empty()) {
      return {why, true};
    }
    struct Team {
      int ranks, rank, stride;
    };
    using TeamLsa = Team (*)(ncclComm_t);
    // Found where libnccl was loaded globally (the usual link); a libnccl opened privately
    // (RTLD_LOCAL, inside a Python extension) is not found, and the separate casts run.
    const auto team_lsa = reinterpret_cast<TeamLsa>(dlsym(RTLD_DEFAULT, "ncclTeamLsa"));
    if (team_lsa == nullptr) {
      return {
          "the NCCL library loaded shows no device API (ncclTeamLsa): link libnccl 2.28 or newer, or, where "
          "it is opened at run time (a Python extension), open it with RTLD_GLOBAL (or preload it)",
          true};
    }
    std::unique_lock lock(core.handle().mutex);  // the watchdog aborts under this lock
    if (core.handle().aborted || core.handle().comm == nullptr) return {"the communicator was aborted"};
    const Team team = team_lsa(core.handle().comm);
    lock.unlock();
    if (team.ranks != core.size) {
      return {"only " + std::to_string(team.ranks) + " of " + std::to_string(core.size) +
              " ranks reach each other's memory (NVLink or PCIe peer access); it needs all"};
    }
    lsa_rank = team.rank;
    return {};
#endif
  }

  /// Allocates and registers the window (a collective), zeroed; the caller then holds a
  /// barrier, so that no rank's first call raises a flag that a peer's zeroing would erase.
  /// layout_problem() says afterwards whether the kernel can use the window on this rank.
  static CompressedReduce create(detail::CommCore& core, std::size_t max_count, DataType wire, int blocks,
                                 int lsa_rank) {
    CompressedReduce w;
#if NCCLKIT_NCCL_DEVICE_API
    DeviceGuard guard(core.device);
    w.blocks_ = blocks;
    w.lsa_rank_ = lsa_rank;
    w.wire_ = wire;
    w.capacity_ = max_count;
    w.slot_ = shard_of(w.capacity_, core.size);
    const std::size_t flags = static_cast<std::size_t>(w.blocks_) * static_cast<std::size_t>(core.size) * 4;
    w.window_bytes_ =
        ncclkit::detail::align_up(2 * static_cast<std::size_t>(core.size) * w.slot_ * size_of(wire) + flags, 4096);
    w.core_ = &core;
    // Each block's barrier count, then the stop flag (CompressedReduceArgs::stop).
    const std::size_t epoch_bytes = (static_cast<std::size_t>(w.blocks_) + 1) * sizeof(std::uint32_t);
    NCCLKIT_CUDA_CHECK(cudaMalloc(&w.epochs_, epoch_bytes));
    // Two words: the flag a kernel raises when it gave up, then a 1, the source of the copy that
    // raises the stop flag (pinned: the copy needs no staging).
    NCCLKIT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&w.gave_up_), 2 * sizeof(int), cudaHostAllocMapped));
    w.gave_up_[0] = 0;
    w.gave_up_[1] = 1;
    NCCLKIT_CUDA_CHECK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&w.gave_up_device_), w.gave_up_, 0));
    NCCLKIT_CUDA_CHECK(cudaEventCreateWithFlags(&w.done_, cudaEventDisableTiming));
    NCCLKIT_CUDA_CHECK(cudaEventCreateWithFlags(&w.stop_landed_, cudaEventDisableTiming));
    NCCLKIT_NCCL_CHECK(ncclMemAlloc(&w.memory_, w.window_bytes_));
    // Zeroed on a stream of the workspace's own: waiting for the device, or for the comm
    // stream, could wait for collectives of this or another communicator. The same stream later
    // raises the stop flag (CommHandle::stop_window_kernels), for the same reason.
    NCCLKIT_CUDA_CHECK(cudaStreamCreateWithFlags(&w.stop_stream_, cudaStreamNonBlocking));
    NCCLKIT_CUDA_CHECK(cudaMemsetAsync(w.epochs_, 0, epoch_bytes, w.stop_stream_));
    NCCLKIT_CUDA_CHECK(cudaMemsetAsync(w.memory_, 0, w.window_bytes_, w.stop_stream_));
    NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(w.stop_stream_));
    detail::CallStream stream;
    stream.stream = core.comm_stream;
    ncclWindow_t window = nullptr;
    detail::issue(core, "compressed_reduce_register", w.window_bytes_, stream, [&](ncclComm_t comm, cudaStream_t) {
      return ncclCommWindowRegister(comm, w.memory_, w.window_bytes_, &window, NCCL_WIN_COLL_SYMMETRIC);
    });
    w.window_ = window;
    // Stopped before any abort of the communicator, which would unmap the window under it.
    core.handle().add_window_kernel(
        {w.stop_flag(), w.gave_up_ + 1, w.stop_stream_, w.stop_landed_, w.done_, core.device});
    w.layout_problem_ = w.probe_layout(core.device);
#else
    (void)core, (void)max_count, (void)wire, (void)blocks, (void)lsa_rank;
#endif
    return w;
  }

  /// Empty where the kernel's view of the window checked out on this rank (create); else why
  /// not, and the workspace must not run (prepare_compressed_reduce gives none on every rank).
  const std::string& layout_problem() const { return layout_problem_; }

  /// Whether the kernel's two pointers to this rank's byte 0 of the window (NCCL's local pointer
  /// and its pointer for this rank's LSA rank, computed on the GPU as the kernel computes them)
  /// lead to the memory registered: each must be memory of this GPU (asked of the driver before
  /// anything reads through it), and each must read back a token written through `memory_`. NCCL
  /// maps the window anew, so the pointers are not `memory_` itself. A rank of LSA rank 0 does not
  /// test the stride between ranks' windows; the others do, and prepare_compressed_reduce asks
  /// every rank. Runs on the workspace's own stream: it waits for nothing but its own short work.
  std::string probe_layout(int device) {
#if NCCLKIT_NCCL_DEVICE_API
    // Alone, the kernel reaches no window (it has no peer to meet or send to).
    if (core_->size == 1) return {};
    int running = 0;
    (void)ncclGetVersion(&running);
    const auto problem = [&](const std::string& what) {
      return detail::window_layout_problem(NCCL_VERSION_CODE, running, what);
    };
    const auto probe = detail::window_probe_launcher();
    if (probe == nullptr)
      return "the window check is missing: include ncclkit/nccl/kernels.cuh in a file compiled by nvcc";
    // The structure itself must be where the GPU reads it before a kernel does: a read elsewhere
    // would end the process's use of the GPU.
    if (!device_readable(window_, device)) return problem("its window handle is no memory this GPU reads");
    void** found = nullptr;
    NCCLKIT_CUDA_CHECK(cudaHostAlloc(reinterpret_cast<void**>(&found), 2 * sizeof(void*), cudaHostAllocMapped));
    found[0] = found[1] = nullptr;
    void** found_device = nullptr;
    cudaError_t status = cudaHostGetDevicePointer(reinterpret_cast<void**>(&found_device), found, 0);
    if (status == cudaSuccess) status = probe(window_, lsa_rank_, found_device, stop_stream_);
    if (status == cudaSuccess) status = cudaStreamSynchronize(stop_stream_);
    void* const pointers[2] = {found[0], found[1]};
    (void)cudaFreeHost(found);
    NCCLKIT_CUDA_CHECK(status);
    const char* const names[2] = {"its local pointer", "its pointer for this rank"};
    for (int k = 0; k < 2; ++k) {
      if (!device_readable(pointers[k], device, false))
        return problem(std::string(names[k]) + " is not memory of this GPU");
    }
    const std::uint64_t token[2] = {0x6e63636c6b697421ull, reinterpret_cast<std::uintptr_t>(memory_)};
    std::uint64_t seen[2][2] = {};
    NCCLKIT_CUDA_CHECK(cudaMemcpyAsync(memory_, token, sizeof token, cudaMemcpyHostToDevice, stop_stream_));
    for (int k = 0; k < 2; ++k) {
      NCCLKIT_CUDA_CHECK(cudaMemcpyAsync(seen[k], pointers[k], sizeof token, cudaMemcpyDeviceToHost, stop_stream_));
    }
    NCCLKIT_CUDA_CHECK(cudaMemsetAsync(memory_, 0, sizeof token, stop_stream_));
    NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(stop_stream_));
    for (int k = 0; k < 2; ++k) {
      if (seen[k][0] != token[0] || seen[k][1] != token[1]) {
        return problem(std::string(names[k]) + " reads other memory than the window's");
      }
    }
    return {};
#else
    (void)device;
    return {};
#endif
  }

  /// Whether the driver knows `pointer` as memory of GPU `device` (or, with `mapped_host`, as
  /// host memory mapped for the GPUs). Asking about an unknown pointer is no error that sticks.
  static bool device_readable(const void* pointer, int device, bool mapped_host = true) {
    const cudaPointerAttributes attributes = detail::pointer_attributes(pointer);
    if (attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged) {
      return attributes.device == device;
    }
    return mapped_host && attributes.type == cudaMemoryTypeHost && attributes.devicePointer != nullptr;
  }

  /// `update`: null, or the update the kernel applies instead of writing `data`.
  void run(const detail::CheckedCall& call, TensorView data, double encode, double decode, std::uint64_t* nonfinite,
           const FusedUpdate* update = nullptr) {
    if (core_ != &call.core()) call.misuse("the CompressedReduce was prepared by another communicator");
    if (data.dtype != DataType::kFloat32) {
      call.misuse("data is " + std::string(name_of(data.dtype)) + "; compressed_all_reduce reduces float32");
    }
    if (data.count > capacity_) {
      call.misuse(std::to_string(data.count) + " values, more than the " + std::to_string(capacity_) +
                  " the CompressedReduce was prepared for");
    }
    if (reinterpret_cast<std::uintptr_t>(data.data) % 16 != 0) call.misuse("data is not 16-byte aligned");
    if (update != nullptr) check_update(call, data, *update);
    if (*static_cast<volatile int*>(gave_up_) != 0) {
      // A kernel stopped waiting for a peer: its data, and the barrier counts, are not whole.
      // (A stop raised by the host before an abort needs no check here: the abort has failed
      // the communicator, and issuing on it throws.)
      call.core().watchdog.request_failure(
          "a compressed_all_reduce gave up waiting for a peer (dead or stopped) after the timeout");
      call.core().watchdog.throw_failure();
    }
    if (data.count == 0) return;
    call.buffer("data", data);
    const int states = update != nullptr ? update->rule.state_count() : 0;
    if (update != nullptr) {
      const auto view = [&](float* p) { return TensorView{p, data.count, DataType::kFloat32, MemoryKind::kDevice}; };
      call.buffer("update.values", view(update->values));
      if (states > 0) call.buffer("update.state0", view(update->state0));
      if (states > 1) call.buffer("update.state1", view(update->state1));
      if (update->copy != nullptr) {
        call.buffer("update.copy", TensorView{update->copy, data.count, DataType::kBFloat16, MemoryKind::kDevice});
      }
    }
    detail::CompressedReduceArgs args{};
    args.window = window_;
    args.data = static_cast<float*>(data.data);
    args.count = data.count;
    args.slot = slot_;
    args.shard = shard_of(data.count, call.core().size);
    args.wire = wire_;
    args.encode = static_cast<float>(encode);
    args.decode = static_cast<float>(decode);
    args.nonfinite = nonfinite;
    args.epochs = epochs_;
    args.stop = stop_flag();
    args.gave_up = gave_up_device_;
    args.rank = lsa_rank_;
    args.world = call.core().size;
    args.blocks = blocks_;
    // Past the watchdog's deadline (which counts from the issue, before the kernel starts): the
    // watchdog reports a dead peer; the kernel only makes sure it does not spin forever.
    args.timeout_ns = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(call.core().options.timeout + std::chrono::seconds(1))
            .count());
    if (update != nullptr) {
      // The kernel tests the state pointers, not the rule: those the rule does not keep are null.
      args.update = {update->rule, update->values, states > 0 ? update->state0 : nullptr,
                     states > 1 ? update->state1 : nullptr, update->copy};
    }
    const auto launcher = detail::compressed_reduce_launcher();
    detail::issue(call.core(), call.operation(), data.bytes(), call.stream(), [&](ncclComm_t, cudaStream_t s) {
      return launcher(args, s) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
    });
    if (!call.stream().capturing) {
      DeviceGuard guard(call.core().device);
      NCCLKIT_CUDA_CHECK(cudaEventRecord(done_, call.stream().stream));
      used_ = true;
    }
  }

  /// Misuse where the kernel could not apply `update` to `data`'s results: the values and the
  /// state the rule keeps (UpdateRule::state_count) given, each aligned to what the kernel reads
  /// and writes at a time (16 bytes; the bfloat16 copy, where given, 8) and apart from `data`,
  /// which keeps this rank's own values while other blocks of the kernel may still be reading
  /// them.
  static void check_update(const detail::CheckedCall& call, const TensorView& data, const FusedUpdate& update) {
    if (update.values == nullptr) {
      call.misuse(
          "update.values is null; pass the parameters the update writes, or call compressed_all_reduce "
          "without an update");
    }
    const int states = update.rule.state_count();
    if (const char* missing = update.missing()) {
      call.misuse("update." + std::string(missing) + " is null, but this update keeps " + std::to_string(states) +
                  " state values per parameter (UpdateRule::state_count): give as many state buffers of " +
                  std::to_string(data.count) + " float32 values");
    }
    const struct {
      const char* name;
      const void* pointer;
      bool kept;
      std::uintptr_t alignment;  // how many bytes the kernel reads or writes at a time
      std::uintptr_t bytes;
    } buffers[] = {{"update.values", update.values, true, 16, data.count * sizeof(float)},
                   {"update.state0", update.state0, states > 0, 16, data.count * sizeof(float)},
                   {"update.state1", update.state1, states > 1, 16, data.count * sizeof(float)},
                   {"update.copy", update.copy, update.copy != nullptr, 8, data.count * sizeof(BFloat16)}};
    const auto data_begin = reinterpret_cast<std::uintptr_t>(data.data);
    const std::uintptr_t data_bytes = data.count * sizeof(float);
    for (const auto& b : buffers) {
      if (!b.kept) continue;
      const auto begin = reinterpret_cast<std::uintptr_t>(b.pointer);
      if (begin % b.alignment != 0) {
        call.misuse(std::string(b.name) + " is not " + std::to_string(b.alignment) +
                    "-byte aligned (the kernel reads and writes it " + std::to_string(b.alignment) +
                    " bytes at a time)");
      }
      if (begin < data_begin + data_bytes && data_begin < begin + b.bytes) {
        call.misuse(std::string(b.name) +
                    " overlaps data; the update's buffers must be apart from the gradients, "
                    "which keep this rank's own values");
      }
    }
  }

  /// The stop flag the kernel and CommHandle::stop_window_kernels share (kernel_hooks.hpp).
  int* stop_flag() const { return reinterpret_cast<int*>(epochs_ + blocks_); }

  /// Elements per rank: an even split, rounded up to whole 16-byte words of 16-bit values.
  static std::size_t shard_of(std::size_t count, int world) {
    return ncclkit::detail::align_up((count + static_cast<std::size_t>(world) - 1) / static_cast<std::size_t>(world),
                                     8);
  }

  /// Waits for the last call's kernel, deregisters the window (skipped once the communicator
  /// failed, its abort having released the registration, or a kernel gave up) and frees the
  /// memory.
  void release() noexcept {
    if (core_ == nullptr) return;
    detail::CommCore& core = *std::exchange(core_, nullptr);
    if (epochs_ != nullptr) core.handle().remove_window_kernel(stop_flag());
#if NCCLKIT_NCCL_DEVICE_API
    try {
      DeviceGuard guard(core.device);
      // The kernel gives up by itself a second after the communicator's timeout, so this
      // wait is bounded.
      if (used_) (void)cudaEventSynchronize(done_);
      const bool gave_up = gave_up_ != nullptr && *static_cast<volatile int*>(gave_up_) != 0;
      if (window_ != nullptr && !core.watchdog.failed() && !gave_up) {
        detail::CallStream stream;
        stream.stream = core.comm_stream;
        detail::issue(core, "compressed_reduce_deregister", 0, stream, [&](ncclComm_t comm, cudaStream_t) {
          return ncclCommWindowDeregister(comm, static_cast<ncclWindow_t>(window_));
        });
      }
    } catch (const std::exception& e) {
      log_warn(std::string("ncclkit: CompressedReduce: deregistering its window failed: ") + e.what());
    }
    DeviceGuard guard(core.device);
    if (memory_ != nullptr) (void)ncclMemFree(memory_);
#endif
    if (epochs_ != nullptr) (void)cudaFree(epochs_);
    if (gave_up_ != nullptr) (void)cudaFreeHost(gave_up_);
    if (done_ != nullptr) (void)cudaEventDestroy(done_);
    if (stop_landed_ != nullptr) (void)cudaEventDestroy(stop_landed_);
    if (stop_stream_ != nullptr) (void)cudaStreamDestroy(stop_stream_);
    window_ = nullptr;
    memory_ = nullptr;
    epochs_ = nullptr;
    gave_up_ = nullptr;
    gave_up_device_ = nullptr;
    done_ = nullptr;
    stop_stream_ = nullptr;
    stop_landed_ = nullptr;
    used_ = false;
  }

  detail::CommCore* core_ = nullptr;
  void* window_ = nullptr;  // an ncclWindow_t (NCCL 2.27 and later)
  void* memory_ = nullptr;
  std::uint32_t* epochs_ = nullptr;     // device memory: each block's barrier count, then the stop flag
  int* gave_up_ = nullptr;              // mapped host memory: set by a kernel that stopped waiting; then a 1
  int* gave_up_device_ = nullptr;       // the same flag as the kernel addresses it
  cudaEvent_t done_ = nullptr;          // recorded after each call: what release() waits for
  cudaStream_t stop_stream_ = nullptr;  // non-blocking: zeroes the workspace, raises the stop flag
  cudaEvent_t stop_landed_ = nullptr;   // recorded after the stop flag's copy (CommHandle)
  bool used_ = false;
  std::size_t window_bytes_ = 0;
  std::size_t capacity_ = 0;
  std::size_t slot_ = 0;  // 16-bit values per rank's shard at capacity; a multiple of 8
  int blocks_ = 0;
  int lsa_rank_ = 0;
  DataType wire_ = DataType::kFloat16;
  std::string layout_problem_;  // create(): why the kernel cannot use the window here, or empty
};

}  // namespace ncclkit::nccl
