#pragma once
/// The store protocol NCCL communicators are created with: every rank publishes its versions
/// (NCCL, CUDA runtime, ncclkit); rank 0 compares them and publishes either the ncclUniqueId
/// or, on a mismatch, an error naming the ranks; every rank reads that verdict.
///
/// Pure store logic, no CUDA: compiles with g++ alone, so it is tested on machines without a
/// GPU. Keys live in the communicator's scope (a PrefixStore with a per-communicator counter,
/// see communicator.hpp), so that several communicators and reruns never read each other's.

#include <algorithm>    // std::sort
#include <chrono>       // std::chrono::milliseconds
#include <cstdint>      // std::uint8_t
#include <functional>   // std::function
#include <map>          // std::map
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/detail/rank_list.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::nccl::detail {

using ncclkit::detail::format_ranks;

/// Ranks r in [0, world) for which `prefix + r` is not in the store right now.
inline std::vector<int> missing_ranks(Store& store, const std::string& prefix, int world) {
  std::vector<int> missing;
  for (int r = 0; r < world; ++r)
    if (!store.check({prefix + std::to_string(r)})) missing.push_back(r);
  return missing;
}

/// Runs the init rendezvous and returns rank 0's unique id (`make_id` is called on rank 0
/// only, after the versions agree). Throws ConfigError when versions differ (on every rank,
/// naming the ranks and their versions), TimeoutError when ranks do not arrive in `timeout`
/// (naming them). `who` names the communicator in messages.
inline Bytes init_rendezvous(Store& scope, int rank, int world, const std::string& versions,
                             std::chrono::milliseconds timeout, const std::function<Bytes()>& make_id,
                             const std::string& who) {
  scope.set("version/" + std::to_string(rank), versions);
  if (rank == 0) {
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back("version/" + std::to_string(r));
    try {
      scope.wait(std::span<const std::string>(keys), timeout);
    } catch (const TimeoutError& e) {
      auto missing = missing_ranks(scope, "version/", world);
      throw TimeoutError(who + " init: rank 0 waited " + std::to_string(timeout.count()) + " ms for rank(s) " +
                         format_ranks(missing) +
                         " to arrive; start every rank, with the same init URL and world size (" + e.what() + ")");
    }
    std::map<std::string, std::vector<int>> by_version;
    for (int r = 0; r < world; ++r)
      by_version[scope.get_string(keys[static_cast<std::size_t>(r)], timeout)].push_back(r);
    if (by_version.size() != 1) {
      std::string message = who + " init: ranks disagree on versions or settings:";
      for (auto& [text, ranks] : by_version) {
        std::sort(ranks.begin(), ranks.end());
        message += (ranks.size() > 1 ? " ranks " : " rank ") + format_ranks(ranks) +
                   (ranks.size() > 1 ? " run " : " runs ") + text + ";";
      }
      message +=
          " every rank must run the same NCCL, CUDA runtime and ncclkit (check each node's "
          "installation, LD_LIBRARY_PATH and container image), with the same NCCLKIT_CHECK_COLLECTIVES";
      scope.set("verdict", "error\n" + message);
      throw ConfigError(message);
    }
    Bytes id = make_id();
    Bytes verdict = to_bytes("ok\n");
    verdict.insert(verdict.end(), id.begin(), id.end());
    scope.set("verdict", verdict);
    return id;
  }
  Bytes verdict;
  try {
    verdict = scope.get("verdict", timeout);
  } catch (const TimeoutError& e) {
    // Rank 0 waits for every rank before it publishes: say whom it was waiting for.
    std::string why;
    try {
      const auto missing = missing_ranks(scope, "version/", world);
      if (missing.empty()) {
        why = "every rank arrived, but rank 0 published no verdict (did it fail? see its log)";
      } else if (missing.front() == 0) {
        why = (missing.size() == 1 ? std::string("rank 0 never arrived")
                                   : "rank(s) " + format_ranks(missing) + " never arrived, rank 0 among them") +
              "; is it running, with the same init URL and world size?";
      } else {
        why = "rank 0 was still waiting for rank(s) " + format_ranks(missing) +
              " to arrive; start every rank, with "
              "the same init URL and world size";
      }
    } catch (const std::exception& store_error) {
      why = std::string("the store could not say which ranks arrived (") + store_error.what() + ")";
    }
    throw TimeoutError(who + " init: rank " + std::to_string(rank) + " waited " + std::to_string(timeout.count()) +
                       " ms for rank 0 to publish the NCCL unique id: " + why + " (" + e.what() + ")");
  }
  const std::string_view text(reinterpret_cast<const char*>(verdict.data()), verdict.size());
  if (text.starts_with("error\n")) throw ConfigError(std::string(text.substr(6)));
  if (!text.starts_with("ok\n")) {
    throw StoreError(who + " init: the verdict key holds unexpected bytes (another program using the same store?)");
  }
  return Bytes(verdict.begin() + 3, verdict.end());
}

}  // namespace ncclkit::nccl::detail
