#pragma once
/// call_bounded(call, limit): runs a blocking call that ncclkit cannot otherwise bound on a
/// helper thread and waits for it at most `limit`. When it returns in time, its result comes
/// back (and the thread is joined); past the limit the thread is detached and left to finish,
/// or to hang, on its own, and whatever the call holds leaks. The caller then goes on as if
/// the call had failed. For destruction paths only, where returning with a leak beats hanging
/// forever: ncclCommDestroy of a blocking NCCL communicator may wait for peers that died or
/// were stopped after their last collective (docs/collectives.md).
///
/// `call` is moved into the thread, must stay valid after call_bounded returns (capture by
/// value) and must not throw (an exception on its thread would end the process). Host code
/// only: C++20.

#include <chrono>              // std::chrono::milliseconds
#include <condition_variable>  // std::condition_variable
#include <memory>              // std::make_shared
#include <mutex>               // std::mutex, std::lock_guard, std::unique_lock
#include <optional>            // std::optional
#include <system_error>        // std::system_error (no thread to be had)
#include <thread>              // std::thread
#include <type_traits>         // std::invoke_result_t
#include <utility>             // std::move

namespace ncclkit::detail {

/// The call's result, or nullopt when it had not returned after `limit` (it goes on in the
/// background). Where no thread can be started, the call runs on this thread, unbounded.
template <class Call, class Result = std::invoke_result_t<Call&>>
std::optional<Result> call_bounded(Call call, std::chrono::milliseconds limit) {
  struct Shared {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::optional<Result> result;
  };
  auto shared = std::make_shared<Shared>();
  std::thread worker;
  try {
    worker = std::thread([shared, call = std::move(call)]() mutable {
      Result result = call();
      std::lock_guard lock(shared->mutex);
      shared->result = std::move(result);
      shared->done = true;
      shared->done_cv.notify_all();
    });
  } catch (const std::system_error&) {
    return call();
  }
  std::unique_lock lock(shared->mutex);
  const bool done = shared->done_cv.wait_for(lock, limit, [&] { return shared->done; });
  lock.unlock();
  if (!done) {
    worker.detach();  // it keeps `shared` alive for as long as it runs
    return std::nullopt;
  }
  worker.join();
  return std::move(shared->result);
}

}  // namespace ncclkit::detail
