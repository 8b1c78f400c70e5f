#pragma once
/// The local argument checks of the NCCL communicator's calls, made before NCCL sees
/// anything: stream (capture state, device), reduce op, root, peer, buffers (type, count,
/// device memory of this GPU). A bad argument is a ConfigError that leaves the communicator
/// usable, in the shape both backends share ("ncclkit: <op> on <communicator>: <what>"), from
/// the checks both make (core/detail/argument_checks.hpp) and those only NCCL's needs (device
/// pointers, streams, capture). Internal: used by ncclkit/nccl/communicator.hpp.

#include <cuda_runtime_api.h>  // cudaPointerGetAttributes, cudaStreamGetDevice, cudaStreamLegacy

#include <algorithm>    // std::find
#include <cstddef>      // std::size_t
#include <cstdio>       // std::snprintf
#include <iterator>     // std::begin, std::end
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/detail/argument_checks.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/tensor.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/check_exchange.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"
#include "ncclkit/nccl/detail/driver_calls.hpp"
#include "ncclkit/nccl/detail/issue.hpp"
#include "ncclkit/nccl/group.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "ncclkit/nccl/types.hpp"

namespace ncclkit::nccl::detail {

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

/// cudaPointerGetAttributes of `pointer`; a pointer the driver does not know (an error that does
/// not stick, cleared here) reads as cudaMemoryTypeUnregistered.
inline cudaPointerAttributes pointer_attributes(const void* pointer) {
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, pointer) != cudaSuccess) {
    (void)cudaGetLastError();
    attributes = cudaPointerAttributes{};
    attributes.type = cudaMemoryTypeUnregistered;
  }
  return attributes;
}

/// Whether `s` is capturing a CUDA graph (or its capture was invalidated): the one CUDA query
/// that is legal during a capture.
inline bool is_capturing(cudaStream_t s) {
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  NCCLKIT_CUDA_CHECK(stream_is_capturing(s, &capture));
  return capture != cudaStreamCaptureStatusNone;
}

/// Why a call that waits on the host refuses a stream that is capturing.
inline constexpr const char* kCaptureRefusal =
    "the stream is capturing a CUDA graph, and a capture cannot be waited for; call it on the stream once the graph "
    "has been launched (cudaGraphLaunch), or end the capture first";

/// One call of `operation` being checked: resolves its stream first (what it learns, the
/// capture state above all, is held here and handed to issue(), so no check depends on the
/// order of the calls around it), then checks the other arguments on request. Every failed
/// check ends in misuse().
class CheckedCall {
 public:
  /// Resolves `stream` (none: the communicator's default_stream()), learns whether it is
  /// capturing a CUDA graph, and checks its device, unless it is one of the communicator's
  /// own streams or the legacy default stream, which the call uses on the communicator's GPU.
  /// While capturing, no CUDA query is made beyond the capture query (driver_calls.hpp):
  /// capture is fragile, and one illegal call spoils it for good.
  CheckedCall(CommCore& core, const char* operation, const StreamArg& stream) : core_(core), operation_(operation) {
    const cudaStream_t s = stream.resolve(core.default_stream);
    stream_.stream = s;
    stream_.on_own_device = s == cudaStreamLegacy;
    stream_.capturing = stream_.on_own_device ? capturing_on_own_device(s) : is_capturing(s);
    // Any other stream (Options::stream included, which may be a handle such as
    // cudaStreamPerThread) is checked on every call.
    if (!stream_.on_own_device && s != core.own_comm_stream.get()) stream_device(s);
  }

  CommCore& core() const { return core_; }
  const char* operation() const { return operation_; }
  const CallStream& stream() const { return stream_; }

  /// Every local argument check of the collectives ends here, before check_collective, so
  /// this is where a rank whose own arguments are bad still takes its turn in the argument
  /// comparison (reject_in_check), before raising its ConfigError.
  [[noreturn]] void misuse(const std::string& what) const {
    reject_in_check(what);
    throw ConfigError(ncclkit::detail::misuse_message(operation_, core_.who(), what));
  }
  /// misuse(problem) unless `problem` is empty (a check of core/detail/argument_checks.hpp passed).
  void misuse_if(const std::string& problem) const {
    if (!problem.empty()) misuse(problem);
  }
  /// The misuse of a call that waits on the host, on a stream that is capturing.
  [[noreturn]] void refuse_capture() const { misuse(kCaptureRefusal); }

  void op(ReduceOp op) const {
    if (!nccl::is_valid(op)) misuse("invalid ReduceOp value " + std::to_string(static_cast<int>(op)));
  }
  void root(int root) const { misuse_if(ncclkit::detail::root_problem(root, core_.size)); }
  void peer(int peer) const { misuse_if(ncclkit::detail::peer_problem(peer, core_.size)); }
  /// `first` and `second` have one element type, `second` holds `expected` elements, and both
  /// pass buffer().
  void pair(const TensorView& first, const TensorView& second, std::size_t expected, const char* rule) const {
    misuse_if(ncclkit::detail::element_types_problem(first, second));
    if (second.count != expected) misuse(ncclkit::detail::sizes_problem(rule, first.count, second.count));
    // In place (one address, element type and memory kind): one buffer to check.
    const bool same = first.data == second.data && first.where == second.where && first.count <= second.count;
    if (!same) buffer("input/output", first);
    buffer("input/output", second);
  }
  void buffer(const char* which, const TensorView& buffer) const {
    if (!nccl::is_valid(buffer.dtype)) misuse(std::string(which) + " has an invalid DataType value");
    misuse_if(ncclkit::detail::memory_problem(
        which, buffer, MemoryKind::kDevice,
        "pass device memory of this GPU (cudaMalloc, Communicator::allocate, DeviceBuffer), or use the Gloo backend "
        "for host memory"));
    if (buffer.count == 0) return;
    misuse_if(ncclkit::detail::null_problem(which, buffer));
    if (!core_.options.check_pointers || stream_.capturing) return;
    if (core_.checked_pointers.contains(buffer.data)) return;  // checked before (checked_pointers.hpp)
    RelaxedCaptureMode relaxed;                                // legal while another stream captures a graph
    const cudaPointerAttributes attributes = pointer_attributes(buffer.data);
    if (attributes.type == cudaMemoryTypeManaged) {
      core_.checked_pointers.insert(buffer.data);
      return;
    }
    if (attributes.type != cudaMemoryTypeDevice) {
      misuse(std::string(which) + " at " + address(buffer.data) + " (" + std::to_string(buffer.bytes()) +
             " bytes) is " +
             (attributes.type == cudaMemoryTypeHost ? "host memory (pinned)"
                                                    : "host memory, or device memory already freed") +
             "; NCCL needs device memory of GPU " + std::to_string(core_.device) +
             " (cudaMalloc, Communicator::allocate, DeviceBuffer); Options::check_pointers = false turns this "
             "check off");
    }
    if (attributes.device != core_.device) {
      misuse(std::string(which) + " at " + address(buffer.data) + " is memory of GPU " +
             std::to_string(attributes.device) + ", but this communicator runs on GPU " + std::to_string(core_.device));
    }
    core_.checked_pointers.insert(buffer.data);
  }

 private:
  static std::string address(const void* pointer) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", pointer);
    return text;
  }

  /// The capture query of a stream that names a stream per device, asked on this GPU.
  bool capturing_on_own_device(cudaStream_t s) const {
    DeviceGuard guard(core_.device);
    return is_capturing(s);
  }

  /// Options::check_collectives, for a rank whose own validation rejected its call of a
  /// checked collective: publishes a fingerprint carrying `reason` in this call's turn of the
  /// comparison, so that the other ranks raise a CollectiveMismatchError naming this rank and
  /// the reason at once, instead of waiting for it until the timeout. The comparison's own
  /// mismatch is not raised here: the caller raises its ConfigError. Nothing to do for calls
  /// that are not compared (send, recv, synchronize, copy, ...).
  void reject_in_check(const std::string& reason) const {
    static constexpr std::string_view kChecked[] = {"all_reduce",        "broadcast",      "reduce",     "all_gather",
                                                    "all_gather_uneven", "reduce_scatter", "all_to_all", "gather",
                                                    "scatter",           "barrier"};
    auto& c = core_;
    if (!c.options.check_collectives || c.size == 1 || !c.scope || c.watchdog.failed()) return;
    if (std::find(std::begin(kChecked), std::end(kChecked), std::string_view(operation_)) == std::end(kChecked)) {
      return;
    }
    const auto fingerprint = CollectiveFingerprint::of(operation_).with_rejection(reason).with_sequence(++c.checks);
    try {
      exchange_fingerprints(*c.scope, c.rank, c.size, c.checks, fingerprint, c.options.timeout, c.who());
    } catch (const CollectiveMismatchError&) {
      // Expected: a rejected call never matches.
    } catch (const std::exception& e) {
      fail_issue(c, operation_, 0, e.what());
    }
  }

  /// Misuse when `s` belongs to another GPU (queried when Options::check_pointers is on and
  /// nothing is capturing; CUDA 12.8 or later). A stream found good is remembered, as buffers
  /// are (checked_pointers.hpp), except the handles that name the current device's stream
  /// (null, cudaStreamPerThread), which are checked every call.
  void stream_device(cudaStream_t s) const {
#if CUDART_VERSION >= 12080
    if (!core_.options.check_pointers || stream_.capturing) return;
    const bool current_devices = is_default_stream_handle(s);
    if (!current_devices && core_.checked_streams.contains(s)) return;
    RelaxedCaptureMode relaxed;
    int stream_device = -1;
    if (cudaStreamGetDevice(s, &stream_device) != cudaSuccess) {
      (void)cudaGetLastError();
    } else if (stream_device == core_.device) {
      if (!current_devices) core_.checked_streams.insert(s);
    } else {
      misuse("the stream belongs to GPU " + std::to_string(stream_device) + ", but this communicator runs on GPU " +
             std::to_string(core_.device) +
             (!current_devices ? ""
              : s == cudaStreamPerThread
                  ? " (the per-thread default stream is the current device's: switch devices or pass a stream of "
                    "this GPU)"
                  : " (the null stream is the current device's: switch devices, pass a stream of this GPU, or "
                    "pass none for the legacy default stream of the communicator's GPU)"));
    }
#else
    (void)s;
#endif
  }

  CommCore& core_;
  const char* operation_;
  CallStream stream_;
};

}  // namespace ncclkit::nccl::detail
