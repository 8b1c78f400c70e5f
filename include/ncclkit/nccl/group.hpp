#pragma once
/// GroupGuard: RAII over ncclGroupStart / ncclGroupEnd.
///
/// Collectives issued while a guard is alive are queued and launched together at its end:
/// send/recv pairs that must progress concurrently, several collectives fused into one
/// launch, or one call per GPU when one thread drives several communicators (LocalGroup).
///
///   {
///     ncclkit::nccl::GroupGuard group;
///     for (auto& comm : local) comm.all_reduce(buffer[i], buffer[i], count, ReduceOp::kSum);
///   }  // launched here; end() does the same and lets you catch its errors
///
/// Guards nest (only the outermost end launches). A guard belongs to the thread that made
/// it. Errors at the end: the destructor logs them; call end() to have them thrown.
/// Do not destroy a communicator that has ops queued in an open group.

#include <nccl.h>  // ncclGroupStart, ncclGroupEnd

#include <algorithm>  // std::sort, std::unique
#include <cstddef>    // std::size_t
#include <exception>  // std::exception, std::exception_ptr, std::rethrow_exception
#include <mutex>      // std::unique_lock
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/nccl/detail/comm_core.hpp"

namespace ncclkit::nccl {

namespace detail {

/// This thread's open groups: nesting depth and the communicators with queued ops.
struct GroupState {
  int depth = 0;
  std::vector<CommCore*> members;
  /// The members of the group being ended (GroupGuard::end swaps them in, so that neither
  /// vector gives its storage back: a group per step allocates nothing).
  std::vector<CommCore*> ending;
};
inline GroupState& group_state() {
  static thread_local GroupState state;
  return state;
}

/// Called by a communicator, under its handle's lock, when it queues its first op (watched
/// or captured) in the open group.
inline void join_group(CommCore& core) {
  group_state().members.push_back(&core);
  core.joined = true;
  core.handle().open_groups.fetch_add(1);
}

/// Undoes join_group once the group's end has run (its ops launched, or refused).
inline void leave_group(CommCore& core) {
  core.joined = false;
  core.handle().open_groups.fetch_sub(1);
}

}  // namespace detail

class GroupGuard {
 public:
  GroupGuard() {
    NCCLKIT_NCCL_CHECK(ncclGroupStart());
    ++detail::group_state().depth;
    active_ = true;
  }
  ~GroupGuard() {
    if (!active_) return;
    try {
      end();
    } catch (const std::exception& e) {
      log_error(std::string("GroupGuard: the group failed at its end (call end() to catch this): ") + e.what());
    }
  }
  GroupGuard(const GroupGuard&) = delete;
  GroupGuard& operator=(const GroupGuard&) = delete;

  /// Ends the group: the outermost guard launches every queued op, waits (bounded by each
  /// communicator's timeout) while NCCL says ncclInProgress, and hands the ops to the
  /// watchdogs. Throws CommError when a communicator failed, NcclError for a usage error.
  void end() {
    if (!active_) return;
    active_ = false;
    auto& group = detail::group_state();
    if (group.depth > 1) {
      --group.depth;
      NCCLKIT_NCCL_CHECK(ncclGroupEnd());
      return;
    }
    std::vector<detail::CommCore*>& members = group.ending;
    members.clear();
    members.swap(group.members);
    std::sort(members.begin(), members.end());
    members.erase(std::unique(members.begin(), members.end()), members.end());

    ncclResult_t status = ncclSuccess;
    {
      // Hold every member's handle, in address order, so that no watchdog aborts one mid-launch.
      struct Held {
        const std::vector<detail::CommCore*>& members;
        std::size_t count = 0;
        ~Held() {
          for (std::size_t i = count; i > 0; --i) members[i - 1]->handle().mutex.unlock();
        }
      } held{members};
      for (auto* member : members) {
        member->handle().mutex.lock();
        ++held.count;
      }
      // The launch may block (connection setup waits for peers): let the watchdogs see it.
      for (auto* member : members) {
        std::size_t bytes = 0;
        for (const auto& op : member->pending) bytes += op.bytes;
        member->handle().enter(member->pending.empty() ? 0 : member->pending.front().seq, "group", bytes);
      }
      status = ncclGroupEnd();
      for (auto* member : members) member->handle().leave();
      --group.depth;
    }

    std::string failure;
    detail::CommCore* failed_member = nullptr;
    if (status == ncclInProgress) {
      // Collectives run on blocking communicators, whose group end returns when everything is
      // enqueued; only a non-blocking one says ncclInProgress and is polled until it is done.
      for (auto* member : members) {
        ncclResult_t state = ncclSuccess;
        try {
          state =
              detail::wait_while_in_progress(*member, detail::Clock::now() + member->options.timeout, "ncclGroupEnd");
        } catch (const TimeoutError& e) {
          state = ncclRemoteError;
          if (failure.empty()) failure = e.what();
        }
        if (state != ncclSuccess && failed_member == nullptr) {
          failed_member = member;
          if (failure.empty())
            failure = "ncclGroupEnd left " + member->who() + " in error " + describe_nccl_error(state);
        }
      }
    } else if (status == ncclInvalidArgument || status == ncclInvalidUsage) {
      for (auto* member : members) {
        detail::leave_group(*member);
        member->pending.clear();
      }
      check_nccl(status, "ncclGroupEnd");
    } else if (status != ncclSuccess) {
      failure = "ncclGroupEnd failed: " + describe_nccl_error(status);
      failed_member = members.empty() ? nullptr : members.front();
    }

    for (auto* member : members) detail::leave_group(*member);
    // Every member is committed (or cleared) even when one of them throws (a failed
    // cudaEventRecord): a member left with ops pending would never join a group again.
    // When the launch itself failed, every member fails with it. When it succeeded, only a
    // member whose watchdog had failed it while the group was open fails (its abort waited
    // for this end); the others' work was launched and is tracked as usual, so that a failed
    // communicator grouped with healthy ones does not take them down.
    std::exception_ptr commit_error;
    for (auto* member : members) {
      if (!failure.empty()) {
        member->pending.clear();
        member->watchdog.request_failure(failure);
      } else if (member->watchdog.failed()) {
        member->pending.clear();
        if (failed_member == nullptr) failed_member = member;
      } else {
        try {
          member->commit_pending();
        } catch (...) {
          if (!commit_error) commit_error = std::current_exception();
        }
      }
    }
    if (commit_error) std::rethrow_exception(commit_error);
    if (failed_member != nullptr) failed_member->watchdog.throw_failure();
    if (!failure.empty()) throw CommError("ncclkit: " + failure);
  }

 private:
  bool active_ = false;
};

}  // namespace ncclkit::nccl
