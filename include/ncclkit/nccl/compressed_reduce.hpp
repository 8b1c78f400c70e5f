#pragma once
/// `nccl::CompressedReduce`: the workspace of Communicator::compressed_all_reduce, a float32
/// all-reduce whose data crosses NVLink in 16 bits, with compression fused into the transfer
/// (detail/compressed_reduce_kernels.cuh says how). Made by
/// Communicator::prepare_compressed_reduce, which returns none where it cannot run (see
/// compressed_reduce_unavailable): the caller then casts around an ordinary all-reduce.
///
/// It holds a symmetric window (ncclMemAlloc'd, registered with NCCL_WIN_COLL_SYMMETRIC: a
/// collective), twice the 16-bit size of the largest call plus barrier flags, and per-block
/// barrier counts. Destroy it before its communicator, on every rank (deregistering is a
/// collective too); after a failure of the communicator it only frees its memory.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cuda_runtime_api.h>
#include <dlfcn.h>  // dlsym: ncclTeamLsa is not in every NCCL 2.28 library
#include <nccl.h>

#include <algorithm>  // std::clamp
#include <chrono>     // std::chrono
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint32_t, std::uintptr_t
#include <string>     // std::string
#include <utility>    // std::exchange

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/argument_checks.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"
#include "ncclkit/nccl/detail/issue.hpp"
#include "ncclkit/nccl/detail/kernel_hooks.hpp"

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
      window_bytes_ = other.window_bytes_;
      capacity_ = other.capacity_;
      slot_ = other.slot_;
      blocks_ = other.blocks_;
      lsa_rank_ = other.lsa_rank_;
      wire_ = other.wire_;
      last_stream_ = other.last_stream_;
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
  /// Blocks of the kernel (one per SM by default; NCCLKIT_COMPRESSED_REDUCE_BLOCKS).
  int blocks() const { return blocks_; }

 private:
  friend class Communicator;

  /// Why the fused path cannot run on `core`'s communicator, or empty where it can. The same
  /// on every rank: ranks agree on NCCL's version at init, and the LSA team is symmetric.
  static std::string unavailable(detail::CommCore& core) {
    if (detail::compressed_reduce_launcher() == nullptr) {
      return "the kernel is missing: include ncclkit/nccl/kernels.cuh in a file compiled by nvcc";
    }
    if (env_int("NCCLKIT_COMPRESSED_REDUCE").value_or(1) == 0) return "NCCLKIT_COMPRESSED_REDUCE=0";
    int version = 0;
    if (ncclGetVersion(&version) != ncclSuccess || version != NCCL_VERSION_CODE) {
      // The kernel reads NCCL's window structure as this build's nccl_device.h lays it out.
      return "ncclkit was built against NCCL " + std::to_string(NCCL_VERSION_CODE) + " and runs with NCCL " +
             std::to_string(version) + "; the device API needs the same version";
    }
    struct Team {
      int ranks, rank, stride;
    };
    using TeamLsa = Team (*)(ncclComm_t);
    const auto team_lsa = reinterpret_cast<TeamLsa>(dlsym(RTLD_DEFAULT, "ncclTeamLsa"));
    if (team_lsa == nullptr) return "this NCCL library has no device API (ncclTeamLsa)";
    ncclComm_t comm = core.handle().comm;
    if (comm == nullptr) return "the communicator was aborted";
    const Team team = team_lsa(comm);
    if (team.ranks != core.size) {
      return "only " + std::to_string(team.ranks) + " of " + std::to_string(core.size) +
             " ranks reach each other's memory (NVLink or PCIe peer access); it needs all";
    }
    return {};
  }

  /// Allocates and registers the window (a collective), zeroed; the caller then holds a
  /// barrier, so that no rank's first call raises a flag that a peer's zeroing would erase.
  static CompressedReduce create(detail::CommCore& core, std::size_t max_count, DataType wire) {
    if (wire != DataType::kFloat16 && wire != DataType::kBFloat16) {
      throw ConfigError("ncclkit prepare_compressed_reduce on " + core.who() + ": wire type " +
                        std::string(name_of(wire)) + " is not float16 or bfloat16");
    }
    CompressedReduce w;
    DeviceGuard guard(core.device);
    int sms = 0;
    NCCLKIT_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, core.device));
    // One block per SM reaches NVLink's bandwidth at 512 threads (docs/performance.md); more
    // than two per SM could leave partners of a barrier waiting for a place on the GPU.
    w.blocks_ = static_cast<int>(
        std::clamp<std::int64_t>(env_int("NCCLKIT_COMPRESSED_REDUCE_BLOCKS").value_or(sms), 1, 2 * sms));
    w.lsa_rank_ = core.rank;
    w.wire_ = wire;
    w.capacity_ = std::max<std::size_t>(max_count, 1);
    w.slot_ = shard_of(w.capacity_, core.size);
    const std::size_t flags = static_cast<std::size_t>(w.blocks_) * static_cast<std::size_t>(core.size) * 4;
    w.window_bytes_ = round_up(2 * static_cast<std::size_t>(core.size) * w.slot_ * size_of(wire) + flags, 4096);
    w.core_ = &core;
    NCCLKIT_CUDA_CHECK(cudaMalloc(&w.epochs_, (static_cast<std::size_t>(w.blocks_) + 1) * sizeof(std::uint32_t)));
    NCCLKIT_CUDA_CHECK(cudaMemset(w.epochs_, 0, (static_cast<std::size_t>(w.blocks_) + 1) * sizeof(std::uint32_t)));
    NCCLKIT_NCCL_CHECK(ncclMemAlloc(&w.memory_, w.window_bytes_));
    NCCLKIT_CUDA_CHECK(cudaMemset(w.memory_, 0, w.window_bytes_));
    NCCLKIT_CUDA_CHECK(cudaDeviceSynchronize());
    detail::CallStream stream;
    stream.stream = core.comm_stream;
    ncclWindow_t window = nullptr;
    detail::issue(core, "compressed_reduce_register", w.window_bytes_, stream, [&](ncclComm_t comm, cudaStream_t) {
      return ncclCommWindowRegister(comm, w.memory_, w.window_bytes_, &window, NCCL_WIN_COLL_SYMMETRIC);
    });
    w.window_ = window;
    return w;
  }

  void run(const detail::CheckedCall& call, TensorView data, double encode, double decode, std::uint64_t* nonfinite) {
    if (core_ != &call.core()) call.misuse("the CompressedReduce was prepared by another communicator");
    if (data.dtype != DataType::kFloat32) {
      call.misuse("data is " + std::string(name_of(data.dtype)) + "; compressed_all_reduce reduces float32");
    }
    if (data.count > capacity_) {
      call.misuse(std::to_string(data.count) + " values, more than the " + std::to_string(capacity_) +
                  " the CompressedReduce was prepared for");
    }
    if (reinterpret_cast<std::uintptr_t>(data.data) % 16 != 0) call.misuse("data is not 16-byte aligned");
    if (data.count == 0) return;
    call.buffer("data", data);
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
    args.timed_out = reinterpret_cast<int*>(epochs_ + blocks_);
    args.rank = lsa_rank_;
    args.world = call.core().size;
    args.blocks = blocks_;
    // Past the watchdog's deadline (which counts from the issue, before the kernel starts): the
    // watchdog reports a dead peer; the kernel only makes sure it does not spin forever.
    args.timeout_ns = static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(call.core().options.timeout + std::chrono::seconds(1))
            .count());
    const auto launcher = detail::compressed_reduce_launcher();
    last_stream_ = call.stream().stream;
    detail::issue(call.core(), call.operation(), data.bytes(), call.stream(), [&](ncclComm_t, cudaStream_t s) {
      return launcher(args, s) == cudaSuccess ? ncclSuccess : ncclUnhandledCudaError;
    });
  }

  /// Elements per rank: an even split, rounded up to whole 16-byte words of 16-bit values.
  static std::size_t shard_of(std::size_t count, int world) {
    return round_up((count + static_cast<std::size_t>(world) - 1) / static_cast<std::size_t>(world), 8);
  }
  static std::size_t round_up(std::size_t n, std::size_t step) { return (n + step - 1) / step * step; }

  /// Waits for the last call's kernel, deregisters the window (skipped once the communicator
  /// failed: its abort released the registration) and frees the memory.
  void release() noexcept {
    if (core_ == nullptr) return;
    detail::CommCore& core = *std::exchange(core_, nullptr);
    try {
      DeviceGuard guard(core.device);
      // The kernel gives up by itself at the communicator's timeout, so this wait is bounded.
      if (last_stream_ != nullptr) (void)cudaStreamSynchronize(last_stream_);
      if (window_ != nullptr && !core.watchdog.failed()) {
        detail::CallStream stream;
        stream.stream = core.comm_stream;
        detail::issue(core, "compressed_reduce_deregister", 0, stream,
                      [&](ncclComm_t comm, cudaStream_t) { return ncclCommWindowDeregister(comm, window_); });
      }
    } catch (const std::exception& e) {
      log_warn(std::string("ncclkit: CompressedReduce: deregistering its window failed: ") + e.what());
    }
    DeviceGuard guard(core.device);
    if (memory_ != nullptr) (void)ncclMemFree(memory_);
    if (epochs_ != nullptr) (void)cudaFree(epochs_);
    window_ = nullptr;
    memory_ = nullptr;
    epochs_ = nullptr;
  }

  detail::CommCore* core_ = nullptr;
  ncclWindow_t window_ = nullptr;
  void* memory_ = nullptr;
  /// Device memory: `blocks_` barrier counts, then one int set by a block that timed out.
  std::uint32_t* epochs_ = nullptr;
  std::size_t window_bytes_ = 0;
  std::size_t capacity_ = 0;
  std::size_t slot_ = 0;  // 16-bit values per rank's shard at capacity; a multiple of 8
  int blocks_ = 0;
  int lsa_rank_ = 0;
  DataType wire_ = DataType::kFloat16;
  cudaStream_t last_stream_ = nullptr;
};

}  // namespace ncclkit::nccl
