#pragma once
/// Creating NCCL communicators: the versions ranks compare, options resolved into a core,
/// NCCL's config, and the polled (hence bounded) waits for init and for a split's new handle.
/// Internal: use ncclkit/nccl/communicator.hpp or ncclkit/nccl/local_group.hpp.

#include <cuda_runtime_api.h>  // cudaRuntimeGetVersion, cudaMalloc, cudaStreamLegacy, cudaDeviceGetStreamPriorityRange
#include <nccl.h>              // ncclConfig_t, ncclCommGetAsyncError, ncclCommSplit, ...

#include <algorithm>  // std::max, std::equal, std::clamp
#include <atomic>     // std::atomic_ref
#include <cctype>     // std::tolower
#include <chrono>     // std::chrono
#include <cstdint>    // std::uint8_t, std::int64_t
#include <cstring>    // std::memcpy
#include <memory>     // std::unique_ptr
#include <string>     // std::string
#include <utility>    // std::move

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/detail/communicator_label.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/detail/poll.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"
#include "ncclkit/nccl/options.hpp"
#include "ncclkit/nccl/detail/rendezvous.hpp"
#include "ncclkit/nccl/detail/watchdog.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "ncclkit/store/store.hpp"
#include "ncclkit/version.hpp"

namespace ncclkit::nccl {

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

namespace detail {

/// A core and the NCCL handles made for it (the control and the working communicator).
struct ReadyHandles {
  std::unique_ptr<CommCore> core;
  ncclComm_t control = nullptr;
  ncclComm_t comm = nullptr;
};

/// A fresh core with options resolved: the environment's overrides applied, device chosen,
/// timeout filled in. `who` opens the
/// messages of the options it refuses (default: the communicator's name and rank).
inline std::unique_ptr<CommCore> make_core(Options options, int rank, int size, int local_rank, std::string who = {}) {
  if (who.empty()) who = "nccl::Communicator '" + options.name + "' (rank " + std::to_string(rank) + ")";
  auto core = std::make_unique<CommCore>();
  options = with_environment(std::move(options));
  if (options.timeout.count() <= 0) options.timeout = knob_default<std::chrono::milliseconds>("NCCLKIT_TIMEOUT");
  // Deadlines are now + timeout (+ slack): a "forever" such as milliseconds::max() would
  // overflow them.
  if (options.timeout > std::chrono::duration<double>(kMaxTimeoutSeconds)) {
    throw ConfigError(who + ": Options::timeout of " + std::to_string(options.timeout.count()) +
                      " ms is too long (at most 1e9 s); to wait practically forever, give a long but finite "
                      "timeout such as std::chrono::hours(24 * 365)");
  }
  check_nccl_knobs(options, who);
  const int visible = visible_device_count();
  if (visible == 0) {
    throw ConfigError(who +
                      ": no GPU is visible to this process (check CUDA_VISIBLE_DEVICES and the driver); "
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
inline std::string network_hint(const Options& options) {
  if (auto forced = env_string("NCCL_NET")) {
    return "; NCCL_NET='" + *forced +
           "' chooses the network (over Options::net_name): is it one NCCL has here "
           "(built in: IB, Socket; others come from net plugins)?";
  }
  if (options.net_name.empty()) return {};
  return "; Options::net_name is '" + options.net_name +
         "': is it a network NCCL has here (built in: IB, Socket; others come from net plugins)?";
}

/// Network names as NCCL compares them (strcasecmp).
inline bool same_net_name(const std::string& a, const std::string& b) {
  return std::equal(a.begin(), a.end(), b.begin(), b.end(), [](char x, char y) {
    return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
  });
}

/// maxCTAs that means "NCCL's own limit": above MAXCHANNELS (64 in NCCL 2.28), which NCCL
/// caps it to, saying so in an INFO line (a WARN line before NCCL 2.27).
inline constexpr int kUncappedCtas = 1024;

/// NCCL's config from the options. Non-blocking for the control communicator (init and
/// split are polled, hence bounded), blocking for the one collectives run on (see CommHandle).
inline ncclConfig_t make_config(const Options& options, bool blocking) {
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
inline void wait_for_init(ncclComm_t comm, Clock::time_point deadline, const CommCore& core, const std::string& what,
                          bool abort_on_failure = true, bool picks_network = false) {
  ncclkit::detail::Backoff backoff({.first = std::chrono::microseconds(10), .cap = std::chrono::milliseconds(2)});
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
    if (Clock::now() >= deadline) {
      std::string missing;
      if (core.scope) {
        try {
          auto ranks = missing_ranks(*core.scope, "joined/", core.size);
          missing = ranks.empty() ? "; every rank reached NCCL init (a network problem between them?)"
                                  : "; rank(s) that never reached NCCL init: " + format_ranks(ranks);
        } catch (const std::exception&) {
          missing = "; the store did not answer which ranks joined";
        }
      }
      if (abort_on_failure) (void)ncclCommAbort(comm);
      throw TimeoutError(core.who() + " " + what + " did not finish within the timeout of " +
                         std::to_string(core.options.timeout.count()) + " ms" + missing +
                         "; raise Options::timeout / NCCLKIT_TIMEOUT if the job is large");
    }
    backoff.sleep(deadline);
  }
}

/// Waits until NCCL has written the new handle of a split into `slot` (its helper thread does
/// so when the split of a non-blocking parent completes), the parent reports an error
/// (NcclError) or `deadline` passes (TimeoutError). Aborts nothing.
inline ncclComm_t await_child(ncclComm_t& slot, ncclComm_t parent, Clock::time_point deadline, const CommCore& core,
                              const std::string& what) {
  ncclkit::detail::Backoff backoff({.first = std::chrono::microseconds(10), .cap = std::chrono::milliseconds(1)});
  while (true) {
    if (ncclComm_t child = std::atomic_ref<ncclComm_t>(slot).load(std::memory_order_acquire)) return child;
    ncclResult_t state = ncclSuccess;
    if (ncclCommGetAsyncError(parent, &state) != ncclSuccess) state = ncclInternalError;
    if (state != ncclSuccess && state != ncclInProgress) {
      throw NcclError(core.who() + " " + what + " failed: " + describe_nccl_error(state, parent) +
                      "; set NCCL_DEBUG=WARN to see NCCL's account");
    }
    if (Clock::now() >= deadline) {
      throw TimeoutError(core.who() + " " + what + " did not finish within the timeout of " +
                         std::to_string(core.options.timeout.count()) + " ms");
    }
    backoff.sleep(deadline);
  }
}

/// Splits the (non-blocking, ready) control communicator into the blocking one collectives
/// run on, every rank keeping its rank. The split is polled through its non-blocking
/// parent, so it is bounded by `deadline`; on failure both are aborted and it throws.
inline ncclComm_t split_working(ncclComm_t control, int rank, Clock::time_point deadline, const CommCore& core) {
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

/// Completes a core whose NCCL handles are ready: streams, scratch, the watchdog. Aborts the
/// handles if any of that fails.
inline std::unique_ptr<CommCore> adopt_handles(ReadyHandles ready) {
  auto& core = ready.core;
  const ncclComm_t control = ready.control, comm = ready.comm;
  try {
    DeviceGuard guard(core->device);
    int least = 0, greatest = 0;
    NCCLKIT_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    core->options.stream_priority = std::clamp(core->options.stream_priority, greatest, least);
    core->own_comm_stream = nccl::Stream(core->device, core->options.stream_priority);
    core->comm_stream = core->own_comm_stream.get();
    core->default_stream = core->options.stream != nullptr ? core->options.stream : cudaStreamLegacy;
    core->sync_event = Event(core->device);
    NCCLKIT_CUDA_CHECK(cudaMalloc(&core->scratch, 8));
    NCCLKIT_CUDA_CHECK(cudaMemset(core->scratch, 0, 8));
    core->watchdog = Watchdog(
        Watchdog::Config{core->options.name, core->rank, core->size, core->device, core->options.timeout, core->scope});
  } catch (...) {
    (void)ncclCommAbort(comm);
    (void)ncclCommAbort(control);
    if (core->scratch != nullptr) (void)cudaFree(core->scratch);
    throw;
  }
  core->watchdog.handle().control = control;
  core->watchdog.handle().comm = comm;
  core->watchdog.start();
  return std::move(core);
}

/// Creates this rank's NCCL communicators of the job `world` describes (Communicator's
/// constructor): scope in the store, version exchange and unique id (rendezvous.hpp), the
/// non-blocking control communicator, then the blocking one split from it. Bounded by the
/// timeout.
inline ReadyHandles init_communicator(std::shared_ptr<Store> store, const WorldInfo& world, Options options) {
  world.validate();
  if (!store) {
    throw ConfigError(ncclkit::detail::communicator_label("nccl", options.name, world.rank, world.world_size) +
                      ": the store is null");
  }
  auto core = make_core(std::move(options), world.rank, world.world_size, world.local_rank);
  const std::string who = core->who();
  const std::string base = "ncclkit/nccl/" + core->options.name;
  const std::int64_t index = store->add(base + "/instances/" + std::to_string(world.rank), 1);
  core->scope = std::make_shared<PrefixStore>(base + "/" + std::to_string(index), store);

  // The argument check works only if every rank makes it: the setting is compared here too.
  const std::string compared =
      version_text() + (core->options.check_collectives ? ", collective argument check on" : "");
  Bytes id_bytes = init_rendezvous(
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
  const auto deadline = Clock::now() + core->options.timeout;
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
  return ReadyHandles{std::move(core), control, comm};
}

}  // namespace detail
}  // namespace ncclkit::nccl
