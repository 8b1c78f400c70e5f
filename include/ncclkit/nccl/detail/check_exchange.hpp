#pragma once
/// How NCCL communicators compare collective arguments across ranks when
/// Options::check_collectives (NCCLKIT_CHECK_COLLECTIVES) is on: through the store, before the
/// collective is issued. Every rank r publishes its fingerprint under `check/<n>/<r>` (n counts
/// the checked collectives of this communicator); rank 0 reads them all, compares them
/// (core/collective_check.hpp) and publishes one verdict, `check/<n>/verdict`, which every
/// other rank reads: so every rank raises the same error, or none does.
///
/// Why the store and not an NCCL allgather on the GPU: the store exchange needs no stream
/// synchronisation, so it also works inside an open GroupGuard (where nothing is launched
/// until the group's end) and while a stream captures a CUDA graph; it is bounded by the
/// communicator's timeout and names the ranks that never arrived; and it costs no device
/// memory or kernel. It is slower (store round trips: three per rank per collective, and rank
/// 0 reads one key per rank), which a debugging mode can afford.
///
/// Keys do not pile up while the communicator runs: a rank deletes its key of check n-1 when it
/// publishes check n (rank 0 read it before publishing verdict n-1, which this rank has read),
/// and rank 0 deletes verdict n-1 once every rank has published check n (each read it before
/// publishing). The last check's keys stay in the store after the communicator is destroyed
/// (one per rank other than 0, and the verdict: a few hundred bytes under the communicator's
/// own prefix): no rank can tell when every other rank has read the last verdict without
/// another round of waiting, which destruction does not do.
///
/// Pure store logic, no CUDA: compiles with g++ alone, and is tested on machines without a
/// GPU (tests/host/test_nccl_check_exchange.cpp).

#include <algorithm>    // std::max
#include <chrono>       // std::chrono
#include <cstdint>      // std::uint64_t, std::uint8_t
#include <exception>    // std::exception
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/detail/rank_list.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::nccl::detail {

/// How much longer than rank 0 the other ranks wait for the verdict: rank 0 publishes one at
/// its own timeout too (naming the ranks missing), and that account is better than theirs.
inline constexpr std::chrono::milliseconds kVerdictSlack{5000};

inline std::string check_key(std::uint64_t number, std::string_view what) {
  return "check/" + std::to_string(number) + "/" + std::string(what);
}

/// Compares `mine` (this rank's fingerprint of checked collective `number`, counting from 1)
/// with every rank's, through `scope` (the communicator's keys). Returns when all agree.
/// Throws CollectiveMismatchError (the same description on every rank) when they differ;
/// TimeoutError, naming the ranks that did not arrive, after `timeout`; StoreError when a key
/// holds something else. `who` names the communicator.
inline void exchange_fingerprints(Store& scope, int rank, int size, std::uint64_t number,
                                  const CollectiveFingerprint& mine, std::chrono::milliseconds timeout,
                                  const std::string& who) {
  const auto encoded = ncclkit::detail::encode(mine);
  const std::string verdict_key = check_key(number, "verdict");
  const std::string what =
      "the argument check (NCCLKIT_CHECK_COLLECTIVES) of " + std::string(mine.name()) + " #" + std::to_string(number);
  if (rank != 0) {
    scope.set(check_key(number, std::to_string(rank)), std::span<const std::uint8_t>(encoded));
    if (number > 1) (void)scope.delete_key(check_key(number - 1, std::to_string(rank)));
    Bytes verdict;
    try {
      verdict = scope.get(verdict_key, timeout + kVerdictSlack);
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (int r = 1; r < size; ++r)
        if (!scope.check({check_key(number, std::to_string(r))})) missing.push_back(r);
      throw TimeoutError(who + ": " + what + ": rank 0 gave no verdict within " + ncclkit::format_seconds(timeout) +
                         " + " + ncclkit::format_seconds(kVerdictSlack) + "; " +
                         (missing.empty() ? std::string("every other rank had arrived, so rank 0 has not reached this "
                                                        "collective (or failed: see its log)")
                                          : "not arrived: " + ncclkit::detail::rank_or_ranks(missing) +
                                                ", and rank 0 has not answered either"));
    }
    const std::string_view text(reinterpret_cast<const char*>(verdict.data()), verdict.size());
    if (text == "ok") return;
    if (text.starts_with("mismatch\n")) throw CollectiveMismatchError(who + ": " + std::string(text.substr(9)));
    if (text.starts_with("timeout\n")) throw TimeoutError(who + ": " + std::string(text.substr(8)));
    throw StoreError(who + ": " + what + ": the verdict key holds unexpected bytes (another program using the store?)");
  }

  std::vector<CollectiveFingerprint> all(static_cast<std::size_t>(size));
  all[0] = mine;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 1; r < size; ++r) {
    const std::string key = check_key(number, std::to_string(r));
    Bytes bytes;
    try {
      const auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      bytes = scope.get(key, std::max(left, std::chrono::milliseconds(1)));
    } catch (const TimeoutError&) {
      std::vector<int> missing;
      for (int q = r; q < size; ++q)
        if (!scope.check({check_key(number, std::to_string(q))})) missing.push_back(q);
      const std::string text = what + ": " + ncclkit::detail::rank_or_ranks(missing) + " did not reach it within " +
                               ncclkit::format_seconds(timeout) +
                               " (rank 0 waited; a rank that skipped this "
                               "collective, stalled or died). The communicator is unusable now";
      try {
        scope.set(verdict_key, "timeout\n" + text);
      } catch (const std::exception&) {
        // The other ranks then time out on their own.
      }
      throw TimeoutError(who + ": " + text);
    }
    const auto decoded = ncclkit::detail::decode(bytes);
    if (!decoded) {
      throw StoreError(who + ": " + what + ": key '" + key +
                       "' holds no fingerprint (another program using the store?)");
    }
    all[static_cast<std::size_t>(r)] = *decoded;
  }
  const auto mismatch = ncclkit::detail::find_mismatch(all);
  const std::string description = mismatch ? *mismatch + ". The communicator is still usable" : std::string();
  scope.set(verdict_key, mismatch ? "mismatch\n" + description : std::string("ok"));
  if (number > 1) (void)scope.delete_key(check_key(number - 1, "verdict"));
  if (mismatch) throw CollectiveMismatchError(who + ": " + description);
}

}  // namespace ncclkit::nccl::detail
