#pragma once
/// The Gloo communicator's half of Options::check_collectives
/// (NCCLKIT_CHECK_COLLECTIVES): every rank's fingerprint of a collective, gathered by one small
/// allgather on the communicator's own context and compared (core/collective_check.hpp); and
/// the comparison of the setting itself at creation. Internal: used by gloo/communicator.hpp,
/// which calls them under its context lock with SIGPIPE blocked.
///
/// Why an allgather on the same context: called under the lock in the order collectives run,
/// every rank's allgather pairs up with the others' whatever collective each is about to run
/// (all run the check first), it costs one small-message round trip, and a rank that never
/// arrives makes it time out like any collective.

#include <gloo/allgather.h>     // gloo::allgather
#include <gloo/common/error.h>  // gloo::Exception
#include <gloo/context.h>       // gloo::Context

#include <chrono>     // std::chrono::milliseconds
#include <cstdint>    // std::uint8_t, std::uint64_t
#include <memory>     // std::shared_ptr
#include <span>       // std::span
#include <stdexcept>  // std::runtime_error
#include <string>     // std::string
#include <vector>     // std::vector

#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/detail/rank_list.hpp"

namespace ncclkit::gloo::detail {

/// Compares this rank's fingerprint (`mine`, numbered `sequence`) with every rank's. Every rank
/// compares the same fingerprints, so either all return or all throw
/// CollectiveMismatchError (`who`: the communicator), before anything ran. A transport
/// failure or timeout is a std::runtime_error saying so (the caller fails the communicator).
/// `scratch` holds every rank's encoded fingerprint (kept between calls).
inline void check_arguments(const std::shared_ptr<::gloo::Context>& context, CollectiveFingerprint mine,
                            std::uint64_t sequence, std::vector<std::uint8_t>& scratch,
                            std::chrono::milliseconds timeout, const std::string& who) {
  mine.sequence = sequence;
  auto encoded = ncclkit::detail::encode(mine);
  const auto size = static_cast<std::size_t>(context->size);
  scratch.resize(encoded.size() * size);
  ::gloo::AllgatherOptions opts(context);
  opts.setInput(encoded.data(), encoded.size());
  opts.setOutput(scratch.data(), scratch.size());
  opts.setTimeout(timeout);
  try {
    ::gloo::allgather(opts);
  } catch (const ::gloo::Exception& e) {
    throw std::runtime_error(std::string("comparing its arguments with the other ranks' (NCCLKIT_CHECK_COLLECTIVES), "
                                         "before anything ran: Gloo: ") +
                             e.what());
  }
  std::vector<CollectiveFingerprint> all;
  all.reserve(size);
  for (std::size_t r = 0; r < size; ++r) {
    const auto decoded =
        ncclkit::detail::decode(std::span<const std::uint8_t>(scratch).subspan(r * encoded.size(), encoded.size()));
    if (!decoded) {
      throw std::runtime_error("rank " + std::to_string(r) +
                               " sent no valid argument fingerprint "
                               "(NCCLKIT_CHECK_COLLECTIVES); the ranks' streams of collectives are out of step");
    }
    all.push_back(*decoded);
  }
  if (auto mismatch = ncclkit::detail::find_mismatch(all)) {
    const std::string message = who + ": " + *mismatch + ". The communicator is still usable.";
    log_error(message);
    throw CollectiveMismatchError(message);
  }
}

/// Compares the ranks' check_collectives settings: run once at creation by every rank,
/// whatever its own setting, since the check only works when every rank makes it (a rank
/// without it would run its collective against the others' allgather). ConfigError on every
/// rank when they differ; a Gloo failure propagates as gloo::Exception.
inline void agree_on_argument_check(const std::shared_ptr<::gloo::Context>& context, bool mine,
                                    std::chrono::milliseconds timeout, const std::string& who) {
  std::uint8_t byte = mine ? 1 : 0;
  std::vector<std::uint8_t> all(static_cast<std::size_t>(context->size));
  ::gloo::AllgatherOptions opts(context);
  opts.setInput(&byte, 1);
  opts.setOutput(all.data(), all.size());
  opts.setTimeout(timeout);
  ::gloo::allgather(opts);
  std::vector<int> on, off;
  for (std::size_t r = 0; r < all.size(); ++r) (all[r] ? on : off).push_back(static_cast<int>(r));
  if (!on.empty() && !off.empty()) {
    throw ConfigError(who +
                      ": the collective argument check (NCCLKIT_CHECK_COLLECTIVES, "
                      "Options::check_collectives) is on for " +
                      ncclkit::detail::rank_or_ranks(on) + " but off for " + ncclkit::detail::rank_or_ranks(off) +
                      "; set it alike on every rank");
  }
}

}  // namespace ncclkit::gloo::detail
