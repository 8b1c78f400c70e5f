#pragma once
/// A fake CUDA runtime and NCCL, for host-only tests of the NCCL backend's concurrency logic
/// (watchdog, groups, abort, shutdown) on machines without a GPU.
///
/// tests/support/fake_cuda_nccl.cpp defines, with C linkage, every CUDA runtime and NCCL
/// function that include/ncclkit/nccl/ calls; a test links it instead of libcudart and
/// libnccl (linking either as well would give duplicate symbols). Nothing runs on a GPU and
/// no data moves between ranks: the fake models what the backend's logic depends on, and
/// records what a real CUDA or NCCL would punish.
///
/// The model:
///   - Devices: device_count() GPUs (2 by default) of kSmCount SMs, each thread has a current
///     one (0 at first). cudaSetDevice can be made to fail for one device (fail_set_device).
///   - NCCL's version: the headers' (NCCL_VERSION_CODE), or what set_nccl_version says. No
///     device API (ncclTeamLsa, windows): the fused compressed all-reduce never runs.
///   - Memory: cudaMalloc hands out host memory tagged with the current device, which
///     cudaPointerGetAttributes reports as device memory of that GPU (anything else is
///     unregistered memory); cudaMemcpy/cudaMemset really copy and set it.
///   - Streams: a device, a priority (clamped to H100's and H200's range, 0 to -5), a capture
///     flag (set_capturing: as if a capture had begun in global mode) and a stall
///     (stall_stream). cudaStreamWaitEvent is accepted and not modelled.
///   - Events: an event never recorded is complete. A recorded one is pending while its stream
///     is stalled, or while every event is held (stall_all_events); the state is read when
///     the event is queried, so a release completes everything recorded on the stream.
///   - Communicators: init and split complete at once (blocking or not, as the config says);
///     a child keeps its parent's rank and size. Both check their config as NCCL 2.28 does
///     (parseCommConfig): a config not made by NCCL_CONFIG_INITIALIZER, a negative
///     cgaClusterSize, minCTAs or maxCTAs <= 0, or minCTAs above maxCTAs (compared before
///     defaults are filled in, so a minimum alone is above the undefined maximum) fail with
///     ncclInvalidArgument; a split whose netName differs from its parent's fails with
///     ncclInvalidUsage (at once; real NCCL fails it later, in the split's init job). A collective issued inside ncclGroupStart is
///     queued on this thread and launched by the outermost ncclGroupEnd; otherwise it
///     launches at once. A launch can block until the communicator is aborted
///     (block_launches_until_abort), as connection setup waits for a dead peer.
///
/// What counts as a violation (violations(), each with a message; tests expect none):
///   - use after abort: any NCCL call on a communicator that was aborted or destroyed,
///     including an ncclGroupEnd launching an op queued on it (a freed communicator in real
///     NCCL); use_after_abort() counts these alone;
///   - a second ncclCommAbort/ncclCommDestroy of one communicator;
///   - unknown or destroyed stream, event or communicator handles; cudaFree of memory that
///     cudaMalloc did not return;
///   - ncclGroupEnd without ncclGroupStart;
///   - a call only the fused compressed all-reduce's workspace makes (ncclMemAlloc, window
///     registration, mapped host memory, stream and event waits): not modelled, and it fails;
///   - a CUDA call that a capture in global mode forbids (cudaEventQuery,
///     cudaPointerGetAttributes, cudaStreamGetDevice, cudaMalloc) made while a stream is
///     capturing, from a thread not in relaxed capture mode (it would spoil the capture);
///   - a launch blocked by block_launches_until_abort that no abort released within
///     block_limit() (the fake then gives up with ncclSystemError, so that nothing hangs).
/// Allowed and only counted: an abort while another thread is inside an NCCL call on that
/// communicator (aborts_while_inside(): the watchdog's way of releasing a stuck call), and
/// cudaEventRecord on a capturing stream (records_during_capture(): legal CUDA, but the
/// watchdog must not track captured work).
///
/// ThreadSanitizer builds of the fake also route pthread_mutex_clocklock through
/// pthread_mutex_timedlock, which GCC 12's libtsan intercepts (see the end of the .cpp): without
/// it, every std::timed_mutex::try_lock_for of the watchdog shows up as a false report.
///
/// Thread safety: every function may be called from any thread. reset() must not run while
/// anything made by an earlier test (communicators, streams) is still alive.

#include <cuda_runtime_api.h>  // cudaStream_t
#include <nccl.h>              // ncclComm_t, ncclResult_t

#include <chrono>  // std::chrono::milliseconds
#include <string>  // std::string
#include <vector>  // std::vector

namespace ncclkit_test::fake {

/// Forgets every stream, event, communicator, allocation, setting and record, sets the
/// number of GPUs, and resets the calling thread's device (0), capture mode and NCCL group.
/// Call at the start of each test; see the note on thread safety above.
void reset(int device_count = 2);

// ---- CUDA -------------------------------------------------------------------------------

/// The number of GPUs cudaGetDeviceCount reports.
int device_count();
/// This thread's current device (cudaGetDevice).
int current_device();
/// cudaSetDevice(device) fails with cudaErrorDevicesUnavailable from now on; -1: none fails.
void fail_set_device(int device);

/// The SMs a GPU has, as cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount) says (an
/// H100's or H200's); no other attribute is modelled.
inline constexpr int kSmCount = 132;

/// How long a stalled stream holds its events.
enum class Stall {
  kUntilReleased,  ///< until release_stream()
  kUntilAbort,     ///< until release_stream(), or the abort of a communicator that launched on it (NCCL's
                   ///< abort ends the kernels a hung collective left on the stream)
};
/// Events recorded on `stream` stay pending (cudaErrorNotReady) until the stall ends.
void stall_stream(cudaStream_t stream, Stall how = Stall::kUntilReleased);
void release_stream(cudaStream_t stream);
/// Every recorded event stays pending while `on` (whatever its stream).
void stall_all_events(bool on);
/// `stream` reports cudaStreamCaptureStatusActive while `on`, as if a capture had begun on it
/// in global mode.
void set_capturing(cudaStream_t stream, bool on);

/// cudaEventQuery calls on events last recorded on `stream` so far (a watchdog polls them).
long event_queries(cudaStream_t stream);
/// cudaEventRecord calls on a stream that was capturing.
int records_during_capture();
/// cudaEventCreateWithFlags calls since reset().
long events_created();

// ---- NCCL -------------------------------------------------------------------------------

/// ncclGetVersion reports `code` (NCCL_VERSION_CODE's form) from now on; reset() restores the
/// headers' version.
void set_nccl_version(int code);

/// This thread's ncclGroupStart nesting depth.
int group_depth();
/// Launches of ops of `comm` (a group's end, or an ungrouped collective) block until `comm`
/// is aborted, then return ncclRemoteError.
void block_launches_until_abort(ncclComm_t comm);
/// How long a blocked launch waits for an abort before the fake gives up (a violation).
void set_block_limit(std::chrono::milliseconds limit);
std::chrono::milliseconds block_limit();
/// ncclCommGetAsyncError(comm) reports `error` from now on.
void set_async_error(ncclComm_t comm, ncclResult_t error);

/// The communicator `comm` was split from (null for one made by ncclCommInitRankConfig).
ncclComm_t parent_of(ncclComm_t comm);
/// The ncclConfig_t fields `comm` was made with, as given (INT_MIN: left undefined, as
/// NCCL_CONFIG_INITIALIZER leaves them).
struct ConfigSeen {
  int blocking = 0;
  int cga_cluster_size = 0;
  int min_ctas = 0;
  int max_ctas = 0;
  bool has_net_name = false;  ///< netName was a string (not null)
  std::string net_name;
  std::string comm_name;
};
ConfigSeen config_of(ncclComm_t comm);
/// The next ncclCommInitRankConfig fails with `error`: a blocking one at once, a non-blocking
/// one through ncclCommGetAsyncError of the communicator it returns (as NCCL's init job does).
void fail_next_init(ncclResult_t error);
/// Whether ncclCommAbort was called on `comm`.
bool aborted(ncclComm_t comm);
/// Whether ncclCommDestroy was called on `comm`.
bool destroyed(ncclComm_t comm);
/// What the last collective or point-to-point call on `comm` was given: its stream handle (a
/// default-stream handle as passed, such as null) and the calling thread's current device.
struct CallSeen {
  cudaStream_t stream = nullptr;
  int device = -1;
};
CallSeen last_call(ncclComm_t comm);
/// Ops of `comm` launched so far (queued ones count once their group ends).
int launched(ncclComm_t comm);
/// ncclCommGetAsyncError calls on `comm` so far (a watchdog polls it while the comm is usable).
long async_error_queries(ncclComm_t comm);
/// Communicators made and neither aborted nor destroyed.
int live_comms();
/// Every ncclCommAbort of a communicator, in call order.
std::vector<ncclComm_t> abort_order();
/// Launches blocked by block_launches_until_abort that an abort released.
int launches_released_by_abort();
/// ncclCommAbort calls made while another thread was inside an NCCL call on that communicator.
int aborts_while_inside();

// ---- what went wrong --------------------------------------------------------------------

/// Every violation so far (see the top of this file), one message each.
std::vector<std::string> violations();
/// The use-after-abort violations among them.
int use_after_abort();
/// violations() as one text, for a test's failure message.
std::string violations_text();

}  // namespace ncclkit_test::fake
