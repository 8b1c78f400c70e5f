#pragma once
/// ncclkit::nccl::FailureReport: what a communicator's watchdog records when the communicator
/// fails (reason, the collective in flight, every rank's progress), and the text of the
/// CommError every later call throws. Plain data and text: no CUDA or NCCL needed, so it is
/// tested on machines without a GPU (tests/host/test_nccl_failure_report.cpp).

#include <algorithm>  // std::max
#include <chrono>     // std::chrono::duration
#include <cstddef>    // std::size_t
#include <cstdint>    // std::uint64_t
#include <cstdio>     // std::snprintf
#include <string>     // std::string, std::to_string
#include <vector>     // std::vector

#include "ncclkit/core/detail/communicator_label.hpp"
#include "ncclkit/core/time_format.hpp"

namespace ncclkit::nccl {

/// One rank's progress, as published to the store by its watchdog.
struct PeerProgress {
  int rank = 0;
  bool known = false;           ///< false: nothing published, or the store did not answer
  std::uint64_t issued = 0;     ///< sequence number of the last collective issued
  std::uint64_t completed = 0;  ///< every collective up to this one has completed
  bool failed = false;          ///< that rank's communicator had failed when it published
};

/// What the watchdog recorded when the communicator failed.
struct FailureReport {
  std::string name;  ///< the communicator's name (Options::name)
  int rank = 0;
  int world = 1;
  int device = 0;
  std::string reason;          ///< what was detected, in words
  bool has_operation = false;  ///< whether a collective was in flight (the fields below)
  std::string operation;       ///< e.g. "all_reduce", "broadcast (+3 more in one group)"
  std::uint64_t seq = 0;       ///< its sequence number (the first, for a group or a burst)
  /// The last collective of the record in flight when it covers several (a group, or single
  /// collectives issued back to back on one stream, which share a completion event): one of
  /// seq..last_seq did not complete, which one is not known. 0: seq alone.
  std::uint64_t last_seq = 0;
  std::size_t bytes = 0;            ///< bytes it moves (this rank's output, or its input when larger)
  double waited_s = 0;              ///< how long it had been in flight when the failure was detected
  std::uint64_t issued = 0;         ///< this rank's last issued sequence number
  std::uint64_t completed = 0;      ///< this rank's last completed sequence number
  bool aborted = false;             ///< ncclCommAbort was called
  double abort_s = 0;               ///< how long ncclCommAbort took
  std::vector<PeerProgress> peers;  ///< every rank's progress (empty without a store)
  std::string peers_note;           ///< why peers are missing or incomplete, if they are

  /// The sequence number a rank must have issued not to be shown behind: the failed
  /// collective's own when one was in flight (a rank that never issued it is what the others
  /// waited for; a rank that issued more is no cause: ranks do get ahead of each other, and
  /// measuring "behind" against the most advanced rank would make the waiting ranks' reports
  /// blame themselves), the last of them when the record covers several (any of
  /// them may be the one that did not complete), else the most any known rank issued.
  std::uint64_t needed_seq() const {
    if (has_operation && seq > 0) return std::max(seq, last_seq);
    std::uint64_t most = 0;
    for (const auto& p : peers)
      if (p.known) most = std::max(most, p.issued);
    return most;
  }

  /// Known ranks that had not issued needed_seq().
  std::vector<int> ranks_behind() const {
    const std::uint64_t needed = needed_seq();
    std::vector<int> behind;
    for (const auto& p : peers)
      if (p.known && p.issued < needed) behind.push_back(p.rank);
    return behind;
  }

  /// A multi-line account, the text of the CommError every later call throws.
  std::string describe() const {
    std::string text = ncclkit::detail::communicator_label("nccl", name, rank, world, "GPU " + std::to_string(device)) +
                       " failed: " + reason;
    if (has_operation) {
      text += "\n  in flight: " + operation + " seq " + std::to_string(seq) + ", " + format_bytes(bytes) + ", waited " +
              format_seconds(waited_s);
    } else {
      text += "\n  no collective was in flight";
    }
    text += "\n  this rank: issued seq " + std::to_string(issued) + ", completed seq " + std::to_string(completed);
    text += aborted ? "\n  the communicator was aborted (ncclCommAbort took " + format_seconds(abort_s) + ")"
                    : "\n  the communicator was not aborted";
    if (!peers.empty()) {
      const std::uint64_t needed = needed_seq();
      text += "\n  progress by rank (issued/completed):";
      std::size_t shown = 0;
      for (const auto& p : peers) {
        if (shown == 64) {
          text += "\n    ... " + std::to_string(peers.size() - shown) + " more ranks";
          break;
        }
        ++shown;
        text += "\n    rank " + std::to_string(p.rank) + ": ";
        if (!p.known) {
          text += "unknown (published nothing, or the store did not answer)";
          continue;
        }
        text += std::to_string(p.issued) + "/" + std::to_string(p.completed);
        if (p.issued < needed) text += "  <- behind: has not issued seq " + std::to_string(p.issued + 1);
        if (p.failed) text += "  (failed too)";
      }
    }
    if (!peers_note.empty()) text += "\n  " + peers_note;
    text +=
        "\n  what to do: look at the log of any rank shown behind or unknown (did it crash, "
        "stop, or skip a collective?); if the work is legitimately slow, raise the timeout "
        "(Options::timeout or NCCLKIT_TIMEOUT); this communicator is unusable, create a new one";
    return text;
  }

  static std::string format_bytes(std::size_t bytes) {
    char buffer[64];
    if (bytes >= (std::size_t{1} << 20)) {
      std::snprintf(buffer, sizeof buffer, "%zu bytes (%.1f MiB)", bytes, static_cast<double>(bytes) / (1 << 20));
    } else {
      std::snprintf(buffer, sizeof buffer, "%zu bytes", bytes);
    }
    return buffer;
  }
  static std::string format_seconds(double seconds) {
    return ncclkit::format_seconds(std::chrono::duration<double>(seconds));
  }
};

}  // namespace ncclkit::nccl
