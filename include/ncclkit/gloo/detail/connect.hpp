#pragma once
/// Creating and closing a Gloo communicator's connections: the options check, the rendezvous
/// through the store (a fresh key scope per communicator), Gloo's full mesh, the peer monitor
/// and the first barrier, the comparison of the ranks' argument-check settings, and the
/// orderly close. Internal to gloo/communicator.hpp.

#include <gloo/transport/tcp/device.h>  // gloo::transport::tcp::CreateDevice

#include <chrono>     // std::chrono
#include <cstddef>    // std::size_t
#include <cstdint>    // std::int64_t
#include <exception>  // std::exception
#include <memory>     // std::shared_ptr, std::make_shared, std::make_unique
#include <mutex>      // std::lock_guard
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/detail/rank_list.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/gloo/detail/algorithms.hpp"
#include "ncclkit/gloo/detail/argument_check.hpp"
#include "ncclkit/gloo/detail/communicator_state.hpp"
#include "ncclkit/gloo/detail/peer_monitor.hpp"
#include "ncclkit/gloo/detail/sigpipe_block.hpp"
#include "ncclkit/gloo/options.hpp"
#include "ncclkit/gloo/store_adapter.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::gloo::detail {

/// Applies the environment's overrides to the state's options, checks them and bounds the
/// timeout; ConfigError naming the field or variable otherwise.
inline void validate_options(CommunicatorState& s) {
  s.options = with_environment(std::move(s.options));
  Options& options = s.options;
  if (options.timeout <= std::chrono::milliseconds::zero()) {
    throw ConfigError(s.who() + ": timeout must be positive");
  }
  // "Wait forever" (milliseconds::max()) would overflow every now() + timeout, Gloo's own
  // deadlines included: bounded once here.
  options.timeout = ncclkit::detail::bounded_timeout(options.timeout);
  if (options.chunk_elements < 1 || options.chunk_elements > kMaxChunkElements) {
    throw ConfigError(s.who() + ": chunk_elements=" + std::to_string(options.chunk_elements) +
                      " must be in [1, 2^31-1]");
  }
}

/// "; waiting for rank 1 (of 2), which never reached it": the ranks whose keys Gloo's
/// rendezvous did not find under `scoped` (it writes "rank_<r>" first, then "<r>", the
/// addresses of rank r's connections). Empty when every rank got that far or the store
/// cannot say.
inline std::string missing_ranks(ncclkit::Store& scoped, int rank, int size) {
  std::vector<int> absent, silent;
  try {
    for (int r = 0; r < size; ++r) {
      if (r == rank) continue;
      const std::string arrived[] = {"rank_" + std::to_string(r)};
      const std::string published[] = {std::to_string(r)};
      if (!scoped.check(arrived)) {
        absent.push_back(r);
      } else if (!scoped.check(published)) {
        silent.push_back(r);
      }
    }
  } catch (const std::exception&) {
    return "";
  }
  std::string text;
  if (!absent.empty()) {
    text += "; waiting for " + ncclkit::detail::rank_or_ranks(absent) + " (of " + std::to_string(size) +
            "), which never reached it";
  }
  if (!silent.empty()) {
    text += "; " + ncclkit::detail::rank_or_ranks(silent) + " arrived but never published " +
            (silent.size() == 1 ? "its" : "their") + " connection addresses";
  }
  return text;
}

/// Connects every pair of ranks through `store` (world > 1), starts the peer monitor and runs
/// a first barrier. Throws ConfigError (interface), TimeoutError (peers missing at the
/// rendezvous, naming them) or CommError.
inline void connect(CommunicatorState& s, const std::shared_ptr<ncclkit::Store>& store) {
  const auto start = std::chrono::steady_clock::now();
  // Also makes Gloo's device loop thread, created below, start with SIGPIPE blocked.
  SigpipeBlock no_sigpipe;
  // Agree on a fresh key scope: the n-th communicator of this name on every rank gets
  // generation n, and reruns on a persistent store count on from where they left off.
  const std::string base = "ncclkit/gloo/" + s.options.name;
  const std::int64_t arrival = store->add(base + "/created", 1);
  const std::int64_t generation = (arrival - 1) / s.size;
  const std::string prefix = base + "/" + std::to_string(generation);
  log_debug(s.who() + ": rendezvous under '" + prefix + "/' (arrival " + std::to_string(arrival) + ")");
  auto scoped = std::make_shared<PrefixStore>(prefix, store);
  StoreAdapter adapter(scoped, s.options.timeout);

  ::gloo::transport::tcp::attr attr;
  const std::string& interface = s.options.interface;
  const std::string& hostname = s.options.hostname;
  attr.iface = interface;
  attr.hostname = hostname;
  try {
    s.device = ::gloo::transport::tcp::CreateDevice(attr);
  } catch (const std::exception& e) {
    throw ConfigError(s.who() + ": cannot use " +
                      (interface.empty()
                           ? "host name '" + (hostname.empty() ? std::string("<this machine's>") : hostname) + "'"
                           : "network interface '" + interface + "'") +
                      " for Gloo's TCP transport: " + e.what() +
                      ". Pick an interface that exists and reaches the other ranks (`ip addr`), with "
                      "Options::interface or NCCLKIT_GLOO_SOCKET_IFNAME.");
  }
  auto context = std::make_shared<MonitoredContext>(s.rank, s.size);
  s.context = context;
  s.context->setTimeout(s.options.timeout);
  try {
    s.context->connectFullMesh(adapter, s.device);
  } catch (const TimeoutError& e) {
    throw TimeoutError(s.who() + ": rendezvous through " + s.store_description + " under '" + prefix +
                       "/' timed out after " + ncclkit::format_seconds(std::chrono::steady_clock::now() - start) +
                       missing_ranks(*scoped, s.rank, s.size) + ": " + e.what() +
                       ". Did every rank create this communicator?");
  } catch (const ncclkit::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(s.who() + ": connecting to the other ranks failed after " +
                    ncclkit::format_seconds(std::chrono::steady_clock::now() - start) + " (device " + s.device->str() +
                    "): " + e.what());
  }
  try {
    s.monitor = std::make_unique<PeerMonitor>(*context, s.who());
    // connectFullMesh is not a barrier: a rank may return before its peers have connected.
    barrier_now(s, start + s.options.timeout);
  } catch (const std::exception& e) {
    throw CommError(s.who() + ": starting the peer monitor or the barrier after connecting failed after " +
                    ncclkit::format_seconds(std::chrono::steady_clock::now() - start) + ": " +
                    s.failure_cause(e.what()));
  }
  log_info(s.who() + ": connected through " + s.store_description + " ('" + prefix + "/') on " + s.device->str() +
           " in " + ncclkit::format_seconds(std::chrono::steady_clock::now() - start) +
           "; reductions: " + std::string(name_of(s.isa)));
}

/// Compares the ranks' Options::check_collectives right after connecting.
inline void agree_on_argument_check(CommunicatorState& s) {
  SigpipeBlock no_sigpipe;
  const auto start = std::chrono::steady_clock::now();
  try {
    agree_on_argument_check(s.context, s.options.check_collectives, s.options.timeout, s.who());
  } catch (const ncclkit::Error&) {
    throw;
  } catch (const std::exception& e) {
    throw CommError(s.who() + ": comparing the ranks' settings after connecting failed after " +
                    ncclkit::format_seconds(std::chrono::steady_clock::now() - start) + ": " + e.what());
  }
}

/// Cancels queued work, then (when healthy) a barrier so that no rank closes connections a
/// peer still reads, then closes them. Never throws.
inline void close(CommunicatorState& s) noexcept {
  try {
    SigpipeBlock no_sigpipe;
    const std::size_t cancelled = s.queue ? s.queue->shutdown() : 0;
    if (cancelled > 0) {
      log_warn(s.who() + ": destroyed with " + std::to_string(cancelled) +
               " collective(s) still queued on its comm stream; they were cancelled. Call "
               "synchronize(comm_stream()) before destroying it.");
    }
    // Peers that leave the barrier below close their connections, which is no failure.
    if (s.monitor) s.monitor->stop();
    if (s.context && !s.failed.load() && cancelled == 0) {
      try {
        std::lock_guard<std::mutex> lock(s.context_mutex);
        barrier_now(s, std::chrono::steady_clock::now() + s.options.timeout);
      } catch (const std::exception& e) {
        log_warn(s.who() + ": the barrier before closing connections failed (" + e.what() + "); closing them anyway");
      }
    }
    s.monitor.reset();  // its sentinels are buffers of the context
    s.context.reset();
    s.device.reset();
  } catch (const std::exception& e) {
    log_error(s.who() + ": error while destroying: " + e.what());
  } catch (...) {
    log_error(s.who() + ": unknown error while destroying");
  }
}

}  // namespace ncclkit::gloo::detail
