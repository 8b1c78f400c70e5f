// The fake CUDA runtime and NCCL described in fake_cuda_nccl.hpp: the model's state, the
// control functions tests call, and the C entry points the ncclkit headers call.
#include "support/fake_cuda_nccl.hpp"

#include <cuda_runtime_api.h>  // the runtime's declarations, which the definitions below match
#include <nccl.h>              // NCCL's declarations, likewise

#include <algorithm>           // std::find, std::max, std::clamp
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // std::uintptr_t, std::uint64_t
#include <cstdlib>             // std::malloc, std::free, std::getenv
#include <cstring>             // std::memcpy, std::memset
#include <map>                 // std::map (allocations by address)
#include <memory>              // std::unique_ptr
#include <mutex>               // std::mutex, std::unique_lock
#include <string>              // std::string
#include <strings.h>           // strcasecmp (NCCL compares network names so)
#include <unordered_map>       // std::unordered_map (handles)
#include <utility>             // std::exchange, std::swap, std::move
#include <vector>              // std::vector

#if defined(__SANITIZE_THREAD__)
#include <pthread.h>  // pthread_mutex_timedlock (the TSan shim at the end)
#include <time.h>     // clock_gettime
#endif

namespace ncclkit_test::fake {
namespace {

struct FakeComm;

struct FakeStream {
  int device = 0;
  bool destroyed = false;
  bool capturing = false;
  bool stalled = false;
  Stall stall = Stall::kUntilReleased;
  std::vector<const FakeComm*> launched_by;  ///< communicators that launched ops on it
  long queries = 0;                          ///< cudaEventQuery of events last recorded here
  int priority = 0;                          ///< as cudaStreamCreateWithPriority clamped it
};

struct FakeEvent {
  bool destroyed = false;
  bool recorded = false;
  FakeStream* stream = nullptr;  ///< where it was last recorded; null: a default-stream handle
};

struct FakeComm {
  int id = 0;
  int rank = 0;
  int size = 1;
  int device = 0;
  bool blocking = true;
  ConfigSeen config;
  const FakeComm* parent = nullptr;
  bool aborted = false;
  bool destroyed = false;
  ncclResult_t async_error = ncclSuccess;
  bool block_until_abort = false;
  int launched = 0;
  long async_error_queries = 0;  ///< ncclCommGetAsyncError calls (a watchdog polls it)
  int inside = 0;                ///< threads inside an NCCL call on it (a launch, possibly blocked)
  CallSeen last_call;            ///< the stream handle and current device of its last collective call
};

struct Allocation {
  std::size_t bytes = 0;
  int device = 0;
};

/// One op queued in an open group of this thread.
struct QueuedOp {
  FakeComm* comm = nullptr;
  FakeStream* stream = nullptr;
  const char* operation = "";
};

struct State {
  std::mutex mutex;
  std::condition_variable aborted_cv;  ///< an abort happened (blocked launches look again)
  int device_count = 2;
  int failing_device = -1;
  int nccl_version = NCCL_VERSION_CODE;  ///< what ncclGetVersion reports (set_nccl_version)
  bool stall_all = false;
  std::chrono::milliseconds block_limit{20000};
  // Handles point at these objects, which live until reset(): a destroyed handle stays
  // recognisable (no address reuse), so that a late use is reported rather than undefined.
  std::unordered_map<const void*, std::unique_ptr<FakeStream>> streams;
  std::unordered_map<const void*, std::unique_ptr<FakeEvent>> events;
  std::unordered_map<const void*, std::unique_ptr<FakeComm>> comms;
  std::map<std::uintptr_t, Allocation> allocations;
  int next_comm_id = 0;
  std::uint64_t next_unique_id = 1;
  ncclResult_t next_init_error = ncclSuccess;  ///< fail_next_init
  int records_during_capture = 0;
  long events_created = 0;
  int capturing_streams = 0;
  std::vector<ncclComm_t> abort_order;
  int released_by_abort = 0;
  int aborts_while_inside = 0;
  std::vector<std::string> violations;
  int use_after_abort = 0;
};

// Never destroyed: a watchdog thread left running at exit must not find it gone.
State& state() {
  static State* const instance = new State;
  return *instance;
}

struct ThreadState {
  int device = 0;
  cudaError_t last_error = cudaSuccess;
  cudaStreamCaptureMode capture_mode = cudaStreamCaptureModeGlobal;
  int group_depth = 0;
  std::vector<QueuedOp> queued;
};
ThreadState& this_thread() {
  static thread_local ThreadState instance;
  return instance;
}

// ---- helpers; every one expects the state's mutex held ------------------------------------

void violation(State& s, std::string what) { s.violations.push_back(std::move(what)); }

std::string comm_name(const FakeComm& c) {
  return "communicator #" + std::to_string(c.id) + " (rank " + std::to_string(c.rank) + " of " +
         std::to_string(c.size) + (c.blocking ? ", blocking)" : ", non-blocking)");
}

/// The communicator behind `handle` when it may be used: null (and a violation) when it is
/// unknown, aborted or destroyed.
FakeComm* usable_comm(State& s, ncclComm_t handle, const char* call) {
  const auto found = s.comms.find(handle);
  if (found == s.comms.end()) {
    violation(s, std::string(call) + ": unknown communicator handle");
    return nullptr;
  }
  FakeComm& c = *found->second;
  if (c.aborted || c.destroyed) {
    ++s.use_after_abort;
    violation(s, std::string("use after abort: ") + call + " on " + comm_name(c) + ", which was " +
                     (c.aborted ? "aborted" : "destroyed"));
    return nullptr;
  }
  return &c;
}

bool is_default_stream(cudaStream_t stream) {
  return stream == nullptr || stream == cudaStreamLegacy || stream == cudaStreamPerThread;
}

/// Resolves a stream handle: `*out` is null for the default-stream handles. False (and a
/// violation) for an unknown or destroyed one.
bool find_stream(State& s, cudaStream_t handle, const char* call, FakeStream** out) {
  *out = nullptr;
  if (is_default_stream(handle)) return true;
  const auto found = s.streams.find(handle);
  if (found == s.streams.end() || found->second->destroyed) {
    violation(s, std::string(call) + ": " + (found == s.streams.end() ? "unknown" : "destroyed") + " stream handle");
    return false;
  }
  *out = found->second.get();
  return true;
}

FakeEvent* find_event(State& s, cudaEvent_t handle, const char* call) {
  const auto found = s.events.find(handle);
  if (found == s.events.end() || found->second->destroyed) {
    violation(s, std::string(call) + ": " + (found == s.events.end() ? "unknown" : "destroyed") + " event handle");
    return nullptr;
  }
  return found->second.get();
}

/// A call that a capture in global mode forbids: a violation when a stream is capturing and
/// this thread is not in relaxed mode.
bool capture_forbids(State& s, const char* call) {
  if (s.capturing_streams == 0 || this_thread().capture_mode == cudaStreamCaptureModeRelaxed) return false;
  violation(s, std::string(call) +
                   " while a stream captures a CUDA graph in global mode, from a thread not in "
                   "relaxed capture mode (it would spoil the capture)");
  return true;
}

cudaError_t fail(cudaError_t error) {
  this_thread().last_error = error;
  return error;
}

/// The allocation holding `pointer`, if any.
const Allocation* allocation_of(State& s, const void* pointer) {
  const auto address = reinterpret_cast<std::uintptr_t>(pointer);
  auto it = s.allocations.upper_bound(address);
  if (it == s.allocations.begin()) return nullptr;
  --it;
  return address < it->first + std::max<std::size_t>(it->second.bytes, 1) ? &it->second : nullptr;
}

FakeComm* new_comm(State& s, int rank, int size, const ncclConfig_t* config, const FakeComm* parent) {
  auto comm = std::make_unique<FakeComm>();
  comm->id = s.next_comm_id++;
  comm->rank = rank;
  comm->size = size;
  comm->device = this_thread().device;
  // NCCL_CONFIG_INITIALIZER leaves `blocking` undefined (INT_MIN), which means blocking.
  comm->blocking = config == nullptr || config->blocking != 0;
  if (config != nullptr) {
    comm->config.blocking = config->blocking;
    comm->config.cga_cluster_size = config->cgaClusterSize;
    comm->config.min_ctas = config->minCTAs;
    comm->config.max_ctas = config->maxCTAs;
    comm->config.has_net_name = config->netName != nullptr;
    if (config->netName != nullptr) comm->config.net_name = config->netName;
    if (config->commName != nullptr) comm->config.comm_name = config->commName;
  }
  comm->parent = parent;
  FakeComm* raw = comm.get();
  s.comms.emplace(raw, std::move(comm));
  return raw;
}

/// NCCL 2.28's checks of a config (parseCommConfig), in its order.
ncclResult_t check_config(const ncclConfig_t* config) {
  if (config == nullptr) return ncclSuccess;
  if (config->magic != 0xcafebeef) return ncclInvalidArgument;
  constexpr int kUndef = NCCL_CONFIG_UNDEF_INT;
  if (config->blocking != kUndef && config->blocking != 0 && config->blocking != 1) return ncclInvalidArgument;
  if (config->cgaClusterSize != kUndef && config->cgaClusterSize < 0) return ncclInvalidArgument;
  if ((config->minCTAs != kUndef && config->minCTAs <= 0) || (config->maxCTAs != kUndef && config->maxCTAs <= 0) ||
      config->minCTAs > config->maxCTAs) {
    return ncclInvalidArgument;
  }
  return ncclSuccess;
}

/// Launches ops (one collective, or a group's queue): each must be of a usable communicator.
/// An op of an aborted one is a violation, skipped; the call still succeeds, as it may in real
/// NCCL (a use after free there), so that the code under test goes on and the violation is what
/// the test reports. Blocks while one of them is marked block_until_abort, until that one is
/// aborted (the state's lock is released meanwhile).
ncclResult_t launch(State& s, std::unique_lock<std::mutex>& lock, const std::vector<QueuedOp>& ops, const char* call) {
  FakeComm* blocking_on = nullptr;
  for (const auto& op : ops) {
    if (op.comm->aborted || op.comm->destroyed) {
      ++s.use_after_abort;
      violation(s, std::string("use after abort: ") + call + " launched a queued " + op.operation + " of " +
                       comm_name(*op.comm) + ", which was " + (op.comm->aborted ? "aborted" : "destroyed"));
      continue;
    }
    ++op.comm->launched;
    if (op.stream != nullptr && std::find(op.stream->launched_by.begin(), op.stream->launched_by.end(), op.comm) ==
                                    op.stream->launched_by.end()) {
      op.stream->launched_by.push_back(op.comm);
    }
    if (op.comm->block_until_abort && blocking_on == nullptr) blocking_on = op.comm;
  }
  if (blocking_on == nullptr) return ncclSuccess;
  std::vector<FakeComm*> inside;
  for (const auto& op : ops) {
    if (std::find(inside.begin(), inside.end(), op.comm) == inside.end()) inside.push_back(op.comm);
  }
  for (auto* comm : inside) ++comm->inside;
  const bool released = s.aborted_cv.wait_for(lock, s.block_limit, [&] { return blocking_on->aborted; });
  for (auto* comm : inside) --comm->inside;
  if (!released) {
    violation(s, std::string(call) + " on " + comm_name(*blocking_on) +
                     " was blocked until an abort, and none came "
                     "within the fake's limit");
    return ncclSystemError;
  }
  ++s.released_by_abort;
  return ncclRemoteError;
}

/// A collective or point-to-point op: queued in this thread's open group, or launched.
ncclResult_t collective(const char* operation, ncclComm_t handle, cudaStream_t stream) {
  State& s = state();
  std::unique_lock lock(s.mutex);
  if (handle == nullptr) return ncclInvalidArgument;
  FakeComm* comm = usable_comm(s, handle, operation);
  if (comm == nullptr) return ncclInvalidUsage;
  FakeStream* target = nullptr;
  if (!find_stream(s, stream, operation, &target)) return ncclInvalidArgument;
  ThreadState& thread = this_thread();
  comm->last_call = {stream, thread.device};
  if (thread.group_depth > 0) {
    thread.queued.push_back({comm, target, operation});
    return ncclSuccess;
  }
  return launch(s, lock, {{comm, target, operation}}, operation);
}

}  // namespace

// ---- control functions --------------------------------------------------------------------

void reset(int device_count) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  for (auto& [address, allocation] : s.allocations) std::free(reinterpret_cast<void*>(address));
  s.allocations.clear();
  s.streams.clear();
  s.events.clear();
  s.comms.clear();
  s.device_count = device_count;
  s.failing_device = -1;
  s.nccl_version = NCCL_VERSION_CODE;
  s.stall_all = false;
  s.block_limit = std::chrono::milliseconds(20000);
  s.records_during_capture = 0;
  s.capturing_streams = 0;
  s.abort_order.clear();
  s.released_by_abort = 0;
  s.aborts_while_inside = 0;
  s.violations.clear();
  s.use_after_abort = 0;
  s.next_init_error = ncclSuccess;
  ThreadState& thread = this_thread();
  thread.device = 0;
  thread.last_error = cudaSuccess;
  thread.capture_mode = cudaStreamCaptureModeGlobal;
  thread.group_depth = 0;
  thread.queued.clear();
}

int device_count() {
  std::lock_guard lock(state().mutex);
  return state().device_count;
}
int current_device() { return this_thread().device; }
void fail_set_device(int device) {
  std::lock_guard lock(state().mutex);
  state().failing_device = device;
}
void set_nccl_version(int code) {
  std::lock_guard lock(state().mutex);
  state().nccl_version = code;
}

namespace {
/// The stream `handle` names, which the test control `call` needs to be one the code under
/// test made (not a default stream); null, with a violation, when it is not. s.mutex held.
FakeStream* made_stream(State& s, cudaStream_t handle, const char* call, const char* why = "") {
  FakeStream* target = nullptr;
  if (!find_stream(s, handle, call, &target)) return nullptr;
  if (target == nullptr) {
    violation(s, std::string(call) + ": needs a stream made by cudaStreamCreateWithPriority" + why);
  }
  return target;
}
}  // namespace

void stall_stream(cudaStream_t stream, Stall how) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  FakeStream* target = made_stream(s, stream, "fake::stall_stream");
  if (target == nullptr) return;
  target->stalled = true;
  target->stall = how;
}
void release_stream(cudaStream_t stream) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  FakeStream* target = nullptr;
  if (find_stream(s, stream, "fake::release_stream", &target) && target != nullptr) target->stalled = false;
}
void stall_all_events(bool on) {
  std::lock_guard lock(state().mutex);
  state().stall_all = on;
}
void set_capturing(cudaStream_t stream, bool on) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  FakeStream* target = made_stream(s, stream, "fake::set_capturing", " (the default streams cannot capture)");
  if (target == nullptr) return;
  if (target->capturing != on) s.capturing_streams += on ? 1 : -1;
  target->capturing = on;
}
long event_queries(cudaStream_t stream) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const auto found = s.streams.find(stream);
  return found == s.streams.end() ? 0 : found->second->queries;
}
long events_created() {
  std::lock_guard lock(state().mutex);
  return state().events_created;
}

int records_during_capture() {
  std::lock_guard lock(state().mutex);
  return state().records_during_capture;
}

int group_depth() { return this_thread().group_depth; }

namespace {
FakeComm* known_comm(State& s, ncclComm_t handle, const char* call) {
  const auto found = s.comms.find(handle);
  if (found != s.comms.end()) return found->second.get();
  violation(s, std::string(call) + ": unknown communicator handle");
  return nullptr;
}
}  // namespace

void block_launches_until_abort(ncclComm_t comm) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (FakeComm* c = known_comm(s, comm, "fake::block_launches_until_abort")) c->block_until_abort = true;
}
void set_block_limit(std::chrono::milliseconds limit) {
  std::lock_guard lock(state().mutex);
  state().block_limit = limit;
}
std::chrono::milliseconds block_limit() {
  std::lock_guard lock(state().mutex);
  return state().block_limit;
}
void set_async_error(ncclComm_t comm, ncclResult_t error) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  if (FakeComm* c = known_comm(s, comm, "fake::set_async_error")) c->async_error = error;
}
ncclComm_t parent_of(ncclComm_t comm) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const FakeComm* c = known_comm(s, comm, "fake::parent_of");
  return c == nullptr ? nullptr : reinterpret_cast<ncclComm_t>(const_cast<FakeComm*>(c->parent));
}
void fail_next_init(ncclResult_t error) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  s.next_init_error = error;
}
ConfigSeen config_of(ncclComm_t comm) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const FakeComm* c = known_comm(s, comm, "fake::config_of");
  return c == nullptr ? ConfigSeen{} : c->config;
}
bool aborted(ncclComm_t comm) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const FakeComm* c = known_comm(s, comm, "fake::aborted");
  return c != nullptr && c->aborted;
}
bool destroyed(ncclComm_t comm) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const FakeComm* c = known_comm(s, comm, "fake::destroyed");
  return c != nullptr && c->destroyed;
}
CallSeen last_call(ncclComm_t comm) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const FakeComm* c = known_comm(s, comm, "fake::last_call");
  return c == nullptr ? CallSeen{} : c->last_call;
}

int launched(ncclComm_t comm) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const FakeComm* c = known_comm(s, comm, "fake::launched");
  return c == nullptr ? 0 : c->launched;
}
long async_error_queries(ncclComm_t comm) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  const FakeComm* c = known_comm(s, comm, "fake::async_error_queries");
  return c == nullptr ? 0 : c->async_error_queries;
}
int live_comms() {
  State& s = state();
  std::lock_guard lock(s.mutex);
  int live = 0;
  for (const auto& [handle, comm] : s.comms) live += comm->aborted || comm->destroyed ? 0 : 1;
  return live;
}
std::vector<ncclComm_t> abort_order() {
  std::lock_guard lock(state().mutex);
  return state().abort_order;
}
int launches_released_by_abort() {
  std::lock_guard lock(state().mutex);
  return state().released_by_abort;
}
int aborts_while_inside() {
  std::lock_guard lock(state().mutex);
  return state().aborts_while_inside;
}
std::vector<std::string> violations() {
  std::lock_guard lock(state().mutex);
  return state().violations;
}
int use_after_abort() {
  std::lock_guard lock(state().mutex);
  return state().use_after_abort;
}
std::string violations_text() {
  std::string text;
  for (const auto& v : violations()) text += "\n  " + v;
  return text.empty() ? std::string("none") : text;
}

/// The communicator `comm` names, if it is one that neither ncclCommDestroy nor ncclCommAbort
/// has ended yet (a second end is a violation). `call` names the ending call. s.mutex held.
inline FakeComm* endable_comm(State& s, ncclComm_t comm, const char* call, ncclResult_t& status) {
  FakeComm* c = known_comm(s, comm, call);
  status = ncclInvalidArgument;
  if (c == nullptr) return nullptr;
  if (c->aborted || c->destroyed) {
    violation(s, std::string(call) + " of " + comm_name(*c) + ", which was already " +
                     (c->aborted ? "aborted" : "destroyed"));
    status = ncclInvalidUsage;
    return nullptr;
  }
  status = ncclSuccess;
  return c;
}

// The fused compressed all-reduce's workspace (nccl/compressed_reduce.hpp) is compiled in but
// never made here: the fake has no device API (no ncclTeamLsa), so prepare_compressed_reduce
// stops before it. Should a change make one anyway, each of its calls is a violation and fails.
cudaError_t unmodelled(const char* call) {
  State& s = state();
  std::lock_guard lock(s.mutex);
  violation(s, std::string(call) + ": not modelled by the fake (the fused compressed all-reduce's workspace)");
  return fail(cudaErrorNotSupported);
}

}  // namespace ncclkit_test::fake

// ---- the C entry points -------------------------------------------------------------------

using ncclkit_test::fake::Stall;
namespace fake = ncclkit_test::fake;

extern "C" {

// -- devices and errors

cudaError_t cudaGetDeviceCount(int* count) {
  *count = fake::device_count();
  return *count == 0 ? fake::fail(cudaErrorNoDevice) : cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = fake::this_thread().device;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  if (device < 0 || device >= s.device_count) return fake::fail(cudaErrorInvalidDevice);
  if (device == s.failing_device) return fake::fail(cudaErrorDevicesUnavailable);
  fake::this_thread().device = device;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) { return std::exchange(fake::this_thread().last_error, cudaSuccess); }

const char* cudaGetErrorName(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    case cudaErrorDevicesUnavailable:
      return "cudaErrorDevicesUnavailable";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    case cudaErrorNotReady:
      return "cudaErrorNotReady";
    case cudaErrorNotSupported:
      return "cudaErrorNotSupported";
    case cudaErrorInvalidResourceHandle:
      return "cudaErrorInvalidResourceHandle";
    case cudaErrorStreamCaptureUnsupported:
      return "cudaErrorStreamCaptureUnsupported";
    default:
      return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorDevicesUnavailable:
      return "CUDA-capable device(s) is/are busy or unavailable (fake)";
    case cudaErrorNotReady:
      return "device not ready (fake)";
    default:
      return "an error of the fake CUDA runtime";
  }
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (device < 0 || device >= fake::device_count()) return fake::fail(cudaErrorInvalidDevice);
  if (attribute != cudaDevAttrMultiProcessorCount) return fake::fail(cudaErrorNotSupported);
  *value = fake::kSmCount;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* version) {
  *version = CUDART_VERSION;
  return cudaSuccess;
}

// No driver here: the lookup fails, so that detail/driver_calls.hpp takes the runtime's calls.
cudaError_t cudaGetDriverEntryPointByVersion(const char*, void** function, unsigned int, unsigned long long,
                                             cudaDriverEntryPointQueryResult* status) {
  *function = nullptr;
  if (status != nullptr) *status = cudaDriverEntryPointSymbolNotFound;
  return fake::fail(cudaErrorNotSupported);
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  std::swap(*mode, fake::this_thread().capture_mode);
  return cudaSuccess;
}

// -- memory

cudaError_t cudaMalloc(void** pointer, size_t bytes) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  *pointer = nullptr;
  if (fake::capture_forbids(s, "cudaMalloc")) return fake::fail(cudaErrorStreamCaptureUnsupported);
  void* memory = std::malloc(bytes == 0 ? 1 : bytes);
  if (memory == nullptr) return fake::fail(cudaErrorMemoryAllocation);
  s.allocations[reinterpret_cast<std::uintptr_t>(memory)] = {bytes, fake::this_thread().device};
  *pointer = memory;
  return cudaSuccess;
}

cudaError_t cudaFree(void* pointer) {
  if (pointer == nullptr) return cudaSuccess;
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  const auto found = s.allocations.find(reinterpret_cast<std::uintptr_t>(pointer));
  if (found == s.allocations.end()) {
    fake::violation(s, "cudaFree of memory cudaMalloc did not return (or freed twice)");
    return fake::fail(cudaErrorInvalidValue);
  }
  s.allocations.erase(found);
  std::free(pointer);
  return cudaSuccess;
}

cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* pointer) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  if (fake::capture_forbids(s, "cudaPointerGetAttributes")) return fake::fail(cudaErrorStreamCaptureUnsupported);
  *attributes = cudaPointerAttributes{};
  if (const fake::Allocation* allocation = fake::allocation_of(s, pointer)) {
    attributes->type = cudaMemoryTypeDevice;
    attributes->device = allocation->device;
    attributes->devicePointer = const_cast<void*>(pointer);
  } else {
    attributes->type = cudaMemoryTypeUnregistered;
    attributes->device = -2;
  }
  return cudaSuccess;
}

cudaError_t cudaMemset(void* pointer, int value, size_t bytes) {
  if (bytes != 0) std::memset(pointer, value, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemsetAsync(void* pointer, int value, size_t bytes, cudaStream_t) {
  return cudaMemset(pointer, value, bytes);
}
cudaError_t cudaMemcpy(void* destination, const void* source, size_t bytes, cudaMemcpyKind) {
  if (bytes != 0) std::memcpy(destination, source, bytes);
  return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void* destination, const void* source, size_t bytes, cudaMemcpyKind kind, cudaStream_t) {
  return cudaMemcpy(destination, source, bytes, kind);
}

// -- streams

// Priorities as on H100 and H200: 0 (least) to -5 (greatest).
cudaError_t cudaDeviceGetStreamPriorityRange(int* least, int* greatest) {
  if (least != nullptr) *least = 0;
  if (greatest != nullptr) *greatest = -5;
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithPriority(cudaStream_t* stream, unsigned int, int priority) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  auto object = std::make_unique<fake::FakeStream>();
  object->device = fake::this_thread().device;
  object->priority = std::clamp(priority, -5, 0);  // CUDA clamps a value outside the range
  *stream = reinterpret_cast<cudaStream_t>(object.get());
  s.streams.emplace(object.get(), std::move(object));
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  fake::FakeStream* target = nullptr;
  if (!fake::find_stream(s, stream, "cudaStreamDestroy", &target) || target == nullptr) {
    return fake::fail(cudaErrorInvalidResourceHandle);
  }
  if (target->capturing) --s.capturing_streams;
  target->capturing = false;
  target->destroyed = true;
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t stream, cudaStreamCaptureStatus* status) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  fake::FakeStream* target = nullptr;
  if (!fake::find_stream(s, stream, "cudaStreamIsCapturing", &target))
    return fake::fail(cudaErrorInvalidResourceHandle);
  *status = target != nullptr && target->capturing ? cudaStreamCaptureStatusActive : cudaStreamCaptureStatusNone;
  return cudaSuccess;
}

cudaError_t cudaStreamGetDevice(cudaStream_t stream, int* device) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  if (fake::capture_forbids(s, "cudaStreamGetDevice")) return fake::fail(cudaErrorStreamCaptureUnsupported);
  fake::FakeStream* target = nullptr;
  if (!fake::find_stream(s, stream, "cudaStreamGetDevice", &target)) return fake::fail(cudaErrorInvalidResourceHandle);
  *device = target != nullptr ? target->device : fake::this_thread().device;
  return cudaSuccess;
}

cudaError_t cudaStreamGetPriority(cudaStream_t stream, int* priority) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  fake::FakeStream* target = nullptr;
  if (!fake::find_stream(s, stream, "cudaStreamGetPriority", &target)) return fake::fail(cudaErrorInvalidResourceHandle);
  *priority = target != nullptr ? target->priority : 0;  // the legacy default stream: 0
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  fake::FakeStream* target = nullptr;
  if (!fake::find_stream(s, stream, "cudaStreamWaitEvent", &target) ||
      fake::find_event(s, event, "cudaStreamWaitEvent") == nullptr) {
    return fake::fail(cudaErrorInvalidResourceHandle);
  }
  return cudaSuccess;
}

// -- events

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  auto object = std::make_unique<fake::FakeEvent>();
  ++s.events_created;
  *event = reinterpret_cast<cudaEvent_t>(object.get());
  s.events.emplace(object.get(), std::move(object));
  return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  fake::FakeEvent* target = fake::find_event(s, event, "cudaEventDestroy");
  if (target == nullptr) return fake::fail(cudaErrorInvalidResourceHandle);
  target->destroyed = true;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  fake::FakeEvent* target = fake::find_event(s, event, "cudaEventRecord");
  fake::FakeStream* where = nullptr;
  if (target == nullptr || !fake::find_stream(s, stream, "cudaEventRecord", &where)) {
    return fake::fail(cudaErrorInvalidResourceHandle);
  }
  if (where != nullptr && where->capturing) ++s.records_during_capture;
  target->recorded = true;
  target->stream = where;
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  if (fake::capture_forbids(s, "cudaEventQuery")) return fake::fail(cudaErrorStreamCaptureUnsupported);
  fake::FakeEvent* target = fake::find_event(s, event, "cudaEventQuery");
  if (target == nullptr) return fake::fail(cudaErrorInvalidResourceHandle);
  if (!target->recorded) return cudaSuccess;
  if (target->stream != nullptr) ++target->stream->queries;
  const bool pending = s.stall_all || (target->stream != nullptr && target->stream->stalled);
  return pending ? cudaErrorNotReady : cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* milliseconds, cudaEvent_t start, cudaEvent_t end) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  if (fake::find_event(s, start, "cudaEventElapsedTime") == nullptr ||
      fake::find_event(s, end, "cudaEventElapsedTime") == nullptr) {
    return fake::fail(cudaErrorInvalidResourceHandle);
  }
  *milliseconds = 0.0f;
  return cudaSuccess;
}

// -- NCCL: errors and versions

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclInvalidArgument:
      return "invalid argument (fake NCCL)";
    case ncclInvalidUsage:
      return "invalid usage (fake NCCL)";
    case ncclRemoteError:
      return "remote process exited or there was a network error (fake NCCL)";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "an error of the fake NCCL";
  }
}

const char* ncclGetLastError(ncclComm_t) { return ""; }

ncclResult_t ncclGetVersion(int* version) {
  std::lock_guard lock(fake::state().mutex);
  *version = fake::state().nccl_version;
  return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  *id = ncclUniqueId{};
  const std::uint64_t value = s.next_unique_id++;
  std::memcpy(id->internal, &value, sizeof value);
  return ncclSuccess;
}

// -- NCCL: communicators

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int size, ncclUniqueId, int rank, ncclConfig_t* config) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  if (size < 1 || rank < 0 || rank >= size) return ncclInvalidArgument;
  if (const ncclResult_t bad = fake::check_config(config); bad != ncclSuccess) return bad;
  if (s.next_init_error != ncclSuccess) {
    const ncclResult_t error = std::exchange(s.next_init_error, ncclSuccess);
    if (config == nullptr || config->blocking != 0) return error;
    fake::FakeComm* failing = fake::new_comm(s, rank, size, config, nullptr);
    failing->async_error = error;
    *comm = reinterpret_cast<ncclComm_t>(failing);
    return ncclInProgress;
  }
  *comm = reinterpret_cast<ncclComm_t>(fake::new_comm(s, rank, size, config, nullptr));
  return ncclSuccess;
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int, ncclComm_t* child, ncclConfig_t* config) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  fake::FakeComm* parent = fake::usable_comm(s, comm, "ncclCommSplit");
  if (parent == nullptr) return ncclInvalidUsage;
  if (const ncclResult_t bad = fake::check_config(config); bad != ncclSuccess) return bad;
  // NCCL_NET replaces both names inside NCCL (envConfigOverride), so they cannot differ then.
  if (config != nullptr && config->netName != nullptr && std::getenv("NCCL_NET") == nullptr &&
      (!parent->config.has_net_name || strcasecmp(config->netName, parent->config.net_name.c_str()) != 0)) {
    return ncclInvalidUsage;  // NCCL: "Comm config netName (%s) does not match the parent"
  }
  *child = color == NCCL_SPLIT_NOCOLOR
               ? nullptr
               : reinterpret_cast<ncclComm_t>(fake::new_comm(s, parent->rank, parent->size, config, parent));
  return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  fake::FakeComm* c = fake::usable_comm(s, comm, "ncclCommUserRank");
  if (c == nullptr) return ncclInvalidUsage;
  *rank = c->rank;
  return ncclSuccess;
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  fake::FakeComm* c = fake::usable_comm(s, comm, "ncclCommCount");
  if (c == nullptr) return ncclInvalidUsage;
  *count = c->size;
  return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  if (comm == nullptr) return ncclInvalidArgument;
  fake::FakeComm* c = fake::usable_comm(s, comm, "ncclCommGetAsyncError");
  if (c == nullptr) return ncclInvalidUsage;
  ++c->async_error_queries;
  *async_error = c->async_error;
  return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  return fake::usable_comm(s, comm, "ncclCommFinalize") == nullptr ? ncclInvalidUsage : ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  ncclResult_t status = ncclSuccess;
  fake::FakeComm* c = fake::endable_comm(s, comm, "ncclCommDestroy", status);
  if (c == nullptr) return status;
  c->destroyed = true;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;
  fake::State& s = fake::state();
  std::lock_guard lock(s.mutex);
  ncclResult_t status = ncclSuccess;
  fake::FakeComm* c = fake::endable_comm(s, comm, "ncclCommAbort", status);
  if (c == nullptr) return status;
  c->aborted = true;
  s.abort_order.push_back(comm);
  if (c->inside > 0) ++s.aborts_while_inside;
  // The abort ends the kernels this communicator left on its streams.
  for (auto& [handle, stream] : s.streams) {
    if (stream->stalled && stream->stall == Stall::kUntilAbort &&
        std::find(stream->launched_by.begin(), stream->launched_by.end(), c) != stream->launched_by.end()) {
      stream->stalled = false;
    }
  }
  s.aborted_cv.notify_all();
  return ncclSuccess;
}

// -- NCCL: groups

ncclResult_t ncclGroupStart() {
  ++fake::this_thread().group_depth;
  return ncclSuccess;
}

ncclResult_t ncclGroupEnd() {
  fake::State& s = fake::state();
  std::unique_lock lock(s.mutex);
  fake::ThreadState& thread = fake::this_thread();
  if (thread.group_depth == 0) {
    fake::violation(s, "ncclGroupEnd without ncclGroupStart");
    return ncclInvalidUsage;
  }
  if (--thread.group_depth > 0) return ncclSuccess;
  std::vector<fake::QueuedOp> ops;
  ops.swap(thread.queued);
  if (ops.empty()) return ncclSuccess;
  return fake::launch(s, lock, ops, "ncclGroupEnd");
}

// -- NCCL: collectives and point-to-point (no data moves)

ncclResult_t ncclAllReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t comm,
                           cudaStream_t stream) {
  return fake::collective("ncclAllReduce", comm, stream);
}
ncclResult_t ncclBroadcast(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t stream) {
  return fake::collective("ncclBroadcast", comm, stream);
}
ncclResult_t ncclReduce(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, int, ncclComm_t comm,
                        cudaStream_t stream) {
  return fake::collective("ncclReduce", comm, stream);
}
ncclResult_t ncclAllGather(const void*, void*, size_t, ncclDataType_t, ncclComm_t comm, cudaStream_t stream) {
  return fake::collective("ncclAllGather", comm, stream);
}
ncclResult_t ncclReduceScatter(const void*, void*, size_t, ncclDataType_t, ncclRedOp_t, ncclComm_t comm,
                               cudaStream_t stream) {
  return fake::collective("ncclReduceScatter", comm, stream);
}
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
ncclResult_t ncclAlltoAll(const void*, void*, size_t, ncclDataType_t, ncclComm_t comm, cudaStream_t stream) {
  return fake::collective("ncclAlltoAll", comm, stream);
}
ncclResult_t ncclGather(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t stream) {
  return fake::collective("ncclGather", comm, stream);
}
ncclResult_t ncclScatter(const void*, void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t stream) {
  return fake::collective("ncclScatter", comm, stream);
}
#endif
ncclResult_t ncclSend(const void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t stream) {
  return fake::collective("ncclSend", comm, stream);
}
ncclResult_t ncclRecv(void*, size_t, ncclDataType_t, int, ncclComm_t comm, cudaStream_t stream) {
  return fake::collective("ncclRecv", comm, stream);
}

// The fused compressed all-reduce's workspace: see fake::unmodelled.
cudaError_t cudaStreamCreateWithFlags(cudaStream_t*, unsigned int) {
  return fake::unmodelled("cudaStreamCreateWithFlags");
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return fake::unmodelled("cudaStreamSynchronize"); }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return fake::unmodelled("cudaEventSynchronize"); }
cudaError_t cudaHostAlloc(void**, size_t, unsigned int) { return fake::unmodelled("cudaHostAlloc"); }
cudaError_t cudaFreeHost(void*) { return fake::unmodelled("cudaFreeHost"); }
cudaError_t cudaHostGetDevicePointer(void**, void*, unsigned int) {
  return fake::unmodelled("cudaHostGetDevicePointer");
}
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
ncclResult_t ncclMemAlloc(void**, size_t) {
  (void)fake::unmodelled("ncclMemAlloc");
  return ncclInvalidUsage;
}
ncclResult_t ncclMemFree(void*) {
  (void)fake::unmodelled("ncclMemFree");
  return ncclInvalidUsage;
}
ncclResult_t ncclCommWindowRegister(ncclComm_t, void*, size_t, ncclWindow_t*, int) {
  (void)fake::unmodelled("ncclCommWindowRegister");
  return ncclInvalidUsage;
}
ncclResult_t ncclCommWindowDeregister(ncclComm_t, ncclWindow_t) {
  (void)fake::unmodelled("ncclCommWindowDeregister");
  return ncclInvalidUsage;
}
#endif
}  // extern "C"

#if defined(__SANITIZE_THREAD__)
// ThreadSanitizer shim. libstdc++ 12 implements std::timed_mutex::try_lock_for (the watchdog's
// way of taking a communicator's lock) with pthread_mutex_clocklock, which GCC 12's libtsan does
// not intercept: TSan never sees the lock taken, reports every unlock as "unlock of an unlocked
// mutex", and misses the ordering the lock gives. Routing it through pthread_mutex_timedlock,
// which TSan intercepts, with the deadline moved to CLOCK_REALTIME, lets TSan see it. Only in
// TSan builds of the tests that link the fake.
extern "C" int pthread_mutex_clocklock(pthread_mutex_t* mutex, clockid_t clock, const struct timespec* deadline) {
  timespec now{}, realtime{};
  clock_gettime(clock, &now);
  clock_gettime(CLOCK_REALTIME, &realtime);
  long long remaining =
      (static_cast<long long>(deadline->tv_sec) - now.tv_sec) * 1000000000LL + (deadline->tv_nsec - now.tv_nsec);
  if (remaining < 0) remaining = 0;
  const long long total = realtime.tv_nsec + remaining;
  const timespec until{realtime.tv_sec + static_cast<time_t>(total / 1000000000LL),
                       static_cast<long>(total % 1000000000LL)};
  return pthread_mutex_timedlock(mutex, &until);
}
#endif
