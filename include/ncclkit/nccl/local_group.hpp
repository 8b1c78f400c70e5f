#pragma once
/// LocalGroup: one process drives several GPUs, one communicator per GPU, all in one NCCL
/// clique (DataParallel's model, and the perf tool's -g). Each member is a full
/// `Communicator` (and so a `Backend`) for its device; issue one call per member inside a
/// GroupGuard so that NCCL launches them together:
///
///   ncclkit::nccl::LocalGroup local;            // every visible GPU
///   {
///     ncclkit::nccl::GroupGuard group;
///     for (int i = 0; i < local.size(); ++i) local[i].all_reduce(buf[i], buf[i], n, ReduceOp::kSum);
///   }
///   for (auto& comm : local) comm.synchronize();
///
/// Why not ncclCommInitAll itself: it makes blocking communicators and takes no ncclConfig_t,
/// so its init cannot be bounded. The group does what ncclCommInitAll does (one unique id,
/// ncclCommInitRankConfig per device inside one ncclGroupStart/End) with non-blocking configs,
/// polled until the timeout; then, like every ncclkit communicator, each member splits its
/// non-blocking control communicator into the blocking one collectives run on (one grouped
/// ncclCommSplit, polled through the non-blocking parents). Each member has a watchdog.
/// Members have no store: their failure reports cannot show other processes' progress.

#include <nccl.h>  // ncclGetUniqueId, ncclCommInitRankConfig, ncclGroupStart/End

#include <cstddef>  // std::size_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/stream.hpp"

namespace ncclkit::nccl {

class LocalGroup {
 public:
  /// One communicator per entry of `devices` (rank i on devices[i]); empty: every visible
  /// GPU. Options::device is ignored; the rest applies to every member.
  explicit LocalGroup(std::vector<int> devices = {}, Options options = {}) {
    const int visible = visible_device_count();
    if (devices.empty())
      for (int d = 0; d < visible; ++d) devices.push_back(d);
    if (devices.empty()) throw ConfigError("LocalGroup: no GPU is visible to this process");
    if (detail::with_environment(options).check_collectives) {
      // One thread issues every member's call in turn: a blocking comparison per call cannot
      // work, and the members have no store to compare through.
      log_warn(
          "LocalGroup: the collective argument check (NCCLKIT_CHECK_COLLECTIVES) does not cover a LocalGroup's "
          "members; their collectives run unchecked");
    }
    for (std::size_t i = 0; i < devices.size(); ++i) {
      if (devices[i] < 0 || devices[i] >= visible) {
        throw ConfigError("LocalGroup: device " + std::to_string(devices[i]) + " is not one of the " +
                          std::to_string(visible) + " visible GPUs");
      }
      for (std::size_t j = 0; j < i; ++j)
        if (devices[j] == devices[i])
          throw ConfigError("LocalGroup: device " + std::to_string(devices[i]) +
                            " is listed twice (NCCL needs one rank per GPU)");
    }
    const int n = static_cast<int>(devices.size());
    std::vector<std::unique_ptr<detail::CommCore>> cores;
    for (int i = 0; i < n; ++i) {
      Options member = options;
      member.device = devices[static_cast<std::size_t>(i)];
      cores.push_back(detail::make_core(std::move(member), i, n, 0));
    }
    ncclUniqueId id;
    NCCLKIT_NCCL_CHECK(ncclGetUniqueId(&id));
    const auto at = [](auto& vector, int i) -> auto& { return vector[static_cast<std::size_t>(i)]; };
    std::vector<ncclConfig_t> configs, blocking_configs;
    for (auto& core : cores) {
      configs.push_back(detail::make_config(core->options, /*blocking=*/false));
      blocking_configs.push_back(detail::make_config(core->options, /*blocking=*/true));
    }
    std::vector<ncclComm_t> controls(static_cast<std::size_t>(n), nullptr), comms(static_cast<std::size_t>(n), nullptr);
    const auto deadline = detail::Clock::now() + cores.front()->options.timeout;
    auto abort_all = [&] {
      for (auto* list : {&comms, &controls})
        for (auto& comm : *list)
          if (comm != nullptr) {
            (void)ncclCommAbort(comm);
            comm = nullptr;
          }
    };
    // One grouped call per device (the ranks of one clique, driven by this thread), polled.
    auto grouped = [&](const std::string& what, auto&& call_for) {
      DeviceGuard restore(devices.front());
      NCCLKIT_NCCL_CHECK(ncclGroupStart());
      ncclResult_t status = ncclSuccess;
      // The group is ended however the loop ends: a thread left inside ncclGroupStart would
      // queue every later NCCL call it makes, on any communicator, and never launch it.
      cudaError_t device_status = cudaSuccess;
      int failed_device = -1;
      for (int i = 0; i < n && (status == ncclSuccess || status == ncclInProgress); ++i) {
        device_status = cudaSetDevice(at(devices, i));
        if (device_status != cudaSuccess) {
          failed_device = at(devices, i);
          break;
        }
        status = call_for(i);
      }
      const ncclResult_t end = ncclGroupEnd();
      if (device_status != cudaSuccess) {
        abort_all();
        check_cuda(device_status, "LocalGroup " + what + ": cudaSetDevice(" + std::to_string(failed_device) + ")");
      }
      if (status == ncclSuccess) status = end;
      if (status != ncclSuccess && status != ncclInProgress) {
        abort_all();
        check_nccl(status, "LocalGroup " + what + " of " + std::to_string(n) + " GPUs");
      }
    };
    try {
      grouped("init", [&](int i) { return ncclCommInitRankConfig(&at(controls, i), n, id, i, &at(configs, i)); });
      for (int i = 0; i < n; ++i) {
        detail::wait_for_init(at(controls, i), deadline, *at(cores, i), "single-process group init",
                              /*abort_on_failure=*/false, /*picks_network=*/true);
      }
      grouped("split",
              [&](int i) { return ncclCommSplit(at(controls, i), 0, i, &at(comms, i), &at(blocking_configs, i)); });
      // The children appear once their non-blocking parents are done.
      for (int i = 0; i < n; ++i) {
        detail::wait_for_init(at(controls, i), deadline, *at(cores, i), "single-process group split",
                              /*abort_on_failure=*/false);
      }
      for (int i = 0; i < n; ++i) {
        at(comms, i) =
            detail::await_child(at(comms, i), at(controls, i), deadline, *at(cores, i), "single-process group split");
        detail::wait_for_init(at(comms, i), deadline, *at(cores, i), "single-process group split",
                              /*abort_on_failure=*/false);
      }
    } catch (...) {
      abort_all();
      throw;
    }
    for (int i = 0; i < n; ++i) {
      Communicator comm;
      try {
        comm.adopt(std::move(at(cores, i)), at(controls, i), at(comms, i));
      } catch (...) {
        at(controls, i) = at(comms, i) = nullptr;  // adopt aborted them
        for (int j = i + 1; j < n; ++j) {
          (void)ncclCommAbort(at(comms, j));
          (void)ncclCommAbort(at(controls, j));
        }
        throw;  // members adopted so far are shut down by their destructors
      }
      members_.push_back(std::move(comm));
    }
  }

  /// Finalises every member together (NCCL may need all of them to finish), then destroys.
  ~LocalGroup() {
    std::vector<detail::CommCore*> cores;
    for (auto& member : members_)
      if (member.core_) cores.push_back(member.core_.get());
    detail::shutdown_all(cores);
  }
  LocalGroup(LocalGroup&&) noexcept = default;
  LocalGroup& operator=(LocalGroup&&) = delete;
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const { return static_cast<int>(members_.size()); }
  Communicator& operator[](int i) { return members_.at(static_cast<std::size_t>(i)); }
  const Communicator& operator[](int i) const { return members_.at(static_cast<std::size_t>(i)); }
  auto begin() { return members_.begin(); }
  auto end() { return members_.end(); }

 private:
  std::vector<Communicator> members_;
};

}  // namespace ncclkit::nccl
