#pragma once
/// ncclCommSplit for Communicator::split: the child's options resolved from the parent's, the
/// split of the parent's non-blocking control communicator (polled, hence bounded), and the
/// child's blocking communicator. Internal: used by ncclkit/nccl/communicator.hpp.

#include <nccl.h>  // ncclCommSplit, NCCL_SPLIT_NOCOLOR, ncclCommUserRank, ncclCommCount

#include <cstdint>   // std::uint64_t
#include <memory>    // std::unique_ptr, std::make_shared
#include <mutex>     // std::unique_lock
#include <optional>  // std::optional, std::nullopt
#include <string>    // std::string
#include <utility>   // std::move

#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"
#include "ncclkit/nccl/detail/init.hpp"
#include "ncclkit/nccl/detail/issue.hpp"
#include "ncclkit/nccl/options.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "ncclkit/store/prefix_store.hpp"

namespace ncclkit::nccl::detail {

/// Splits `parent` (see Communicator::split): nullopt for a negative color, else the child's
/// core and NCCL handles, ready for adopt_handles(). A failure of the split itself fails the
/// parent (CommError); a refused option is a ConfigError.
inline std::optional<ReadyHandles> split_communicator(CommCore& parent, int color, int key,
                                                      std::optional<Options> options) {
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
  const auto deadline = Clock::now() + child->options.timeout;
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
      on_nccl_error(parent, status, "split");
    }
  }
  ncclResult_t parent_state = ncclSuccess;
  try {
    parent_state = wait_while_in_progress(parent, deadline, what, /*control=*/true);
  } catch (const TimeoutError& e) {
    if (control != nullptr) (void)ncclCommAbort(control);
    fail_issue(parent, "split", 0, e.what());
  }
  if (parent_state != ncclSuccess) {
    if (control != nullptr) (void)ncclCommAbort(control);
    on_nccl_error(parent, parent_state, "split");
  }
  if (color < 0) return std::nullopt;
  try {
    control = await_child(control, parent.handle().control, deadline, *child, what);
  } catch (const std::exception& e) {
    fail_issue(parent, "split", 0, e.what());
  }
  wait_for_init(control, deadline, *child, what);
  int child_rank = 0, child_size = 1;
  NCCLKIT_NCCL_CHECK(ncclCommUserRank(control, &child_rank));
  NCCLKIT_NCCL_CHECK(ncclCommCount(control, &child_size));
  child->rank = child_rank;
  child->size = child_size;
  if (parent.scope) {
    child->scope = std::make_shared<PrefixStore>("split/" + std::to_string(index) + "/color/" + std::to_string(color),
                                                 parent.scope);
  }
  ncclComm_t comm = split_working(control, child_rank, deadline, *child);
  return ReadyHandles{std::move(child), control, comm};
}

}  // namespace ncclkit::nccl::detail
