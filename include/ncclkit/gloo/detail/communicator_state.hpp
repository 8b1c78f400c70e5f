#pragma once
/// CommunicatorState: everything a Gloo communicator owns (its Gloo context, peer monitor, work
/// queue, counters, failure), and the one path every collective runs through (`execute`: the
/// context lock, the argument check, the deadline, failures mapped to CommError). Internal to
/// gloo/communicator.hpp; the collective bodies are in detail/algorithms.hpp.

#include <gloo/common/error.h>        // gloo::Exception
#include <gloo/rendezvous/context.h>  // gloo::rendezvous::Context
#include <gloo/transport/device.h>    // gloo::transport::Device

#include <algorithm>  // std::max
#include <atomic>     // std::atomic
#include <chrono>     // std::chrono
#include <cstddef>    // std::size_t, std::byte
#include <cstdint>    // std::uint64_t, std::uint8_t
#include <exception>  // std::exception
#include <memory>     // std::shared_ptr, std::unique_ptr
#include <mutex>      // std::mutex, std::lock_guard
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/core/byte_format.hpp"
#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/detail/argument_checks.hpp"  // overlaps
#include "ncclkit/core/detail/communicator_label.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/gloo/comm_queue.hpp"
#include "ncclkit/gloo/detail/argument_check.hpp"
#include "ncclkit/gloo/detail/peer_monitor.hpp"
#include "ncclkit/gloo/detail/sigpipe_block.hpp"
#include "ncclkit/gloo/options.hpp"
#include "ncclkit/gloo/reduce_kernels.hpp"

namespace ncclkit::gloo::detail {

/// What an error message says about a collective.
struct OpInfo {
  const char* name = "";
  std::uint64_t sequence = 0;
  std::size_t count = 0;
  DataType dtype = DataType::kFloat32;
  std::size_t bytes = 0;
  std::string detail;                 ///< "sum", "root 3", ...
  CollectiveFingerprint fingerprint;  ///< what Options::check_collectives compares
  /// The call's number among the collectives every rank takes part in (those the argument
  /// check compares); 0 for send and recv, which only two ranks call and which are not compared.
  std::uint64_t check_sequence = 0;
};

inline std::byte* byte_ptr(void* p) { return static_cast<std::byte*>(p); }

using ncclkit::detail::overlaps;

/// Time left until `deadline`, at least 1 ms (Gloo treats 0 as "no timeout").
inline std::chrono::milliseconds remaining(std::chrono::steady_clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return std::max(left, std::chrono::milliseconds(1));
}

/// Owns the scratch memory some collectives need.
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
  Options options;
  KernelIsa isa = default_isa();
  std::string store_description;
  std::shared_ptr<::gloo::transport::Device> device;
  std::shared_ptr<::gloo::rendezvous::Context> context;
  /// Notices a failed peer connection at once and names the rank (world > 1).
  std::unique_ptr<PeerMonitor> monitor;
  std::mutex context_mutex;  ///< one collective at a time on the Gloo context
  std::atomic<bool> failed{false};
  std::atomic<bool> aborted{false};  ///< abort() was called on this rank
  std::mutex failure_mutex;
  std::string failure;                      ///< the first failure's message (guarded by failure_mutex)
  std::atomic<std::uint64_t> issued{0};     ///< collectives issued (the last one's number)
  std::atomic<std::uint64_t> completed{0};  ///< collectives whose run has ended
  std::atomic<std::uint64_t> checked{0};    ///< collectives the argument check numbers
  std::unique_ptr<CommQueue> queue;
  /// Scratch of the two-rank all-reduce, kept between calls so that large collectives do not
  /// page-fault a fresh allocation every time (guarded by context_mutex).
  std::unique_ptr<std::byte[]> pair_scratch;
  std::size_t pair_scratch_bytes = 0;
  /// Every rank's encoded fingerprint, for check_arguments (guarded by context_mutex).
  std::vector<std::uint8_t> check_scratch;

  /// "gloo communicator 'grads' (rank 1 of 4)": how every message names this communicator.
  std::string who() const { return ncclkit::detail::communicator_label("gloo", options.name, rank, size); }

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
    std::string message = who() + ": " + describe(op) + " failed after " + ncclkit::format_seconds(waited) +
                          " (timeout " + ncclkit::format_seconds(options.timeout) + "): " + why +
                          ". The communicator is unusable now. ";
    message += aborted.load(std::memory_order_acquire) ? "abort() was called on this rank; destroy the communicator."
               : why != cause && !is_timeout(cause)
                   ? "The rank named probably exited or crashed (a rank whose own collective failed closes its "
                     "connections too): look at its log."
                   : "A peer probably exited, crashed or stalled: look at the other ranks' logs; raise the timeout "
                     "(Options::timeout, NCCLKIT_TIMEOUT) if ranks are just slow.";
    {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (failure.empty()) failure = describe(op) + " failed: " + why;
    }
    failed.store(true, std::memory_order_release);
    log_error(message);
    throw CommError(message);
  }

  /// Makes the communicator unusable with `reason` (the first failure, if any, stays the one
  /// reported) and ends the waits of a collective in flight: see Communicator::abort. Takes no
  /// lock a collective holds, so it returns at once whatever runs.
  void abort(const std::string& reason) {
    const std::string message = "the communicator was aborted on this rank: " + reason;
    {
      std::lock_guard<std::mutex> lock(failure_mutex);
      if (failure.empty()) failure = message;
    }
    aborted.store(true, std::memory_order_release);
    if (failed.exchange(true, std::memory_order_acq_rel)) return;
    log_error(who() + ": " + message + ". The communicator is unusable now; every later call throws CommError.");
    if (monitor) monitor->abort(message);
  }

  /// Runs one collective's body under the context lock, with failures mapped to CommError.
  /// `body` receives the deadline shared by all of the collective's Gloo calls. However it
  /// ends, the collective counts as completed.
  template <class Body>
  void execute(const OpInfo& op, Body&& body) {
    struct CountCompleted {
      std::atomic<std::uint64_t>& completed;
      ~CountCompleted() { completed.fetch_add(1, std::memory_order_acq_rel); }
    } count_completed{completed};
    std::lock_guard<std::mutex> lock(context_mutex);
    SigpipeBlock no_sigpipe;
    check_usable(op.name);
    const auto start = std::chrono::steady_clock::now();
    const auto deadline = start + options.timeout;
    // A peer's connection failed since the last collective: fail this one now, naming the
    // peer, rather than run it into a broken group.
    if (monitor && monitor->peer_failed()) fail(op, std::chrono::steady_clock::duration::zero(), "");
    try {
      if (options.check_collectives && size > 1 && op.check_sequence != 0) {
        check_arguments(context, op.fingerprint, op.check_sequence, check_scratch, remaining(deadline), who());
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
};

}  // namespace ncclkit::gloo::detail
