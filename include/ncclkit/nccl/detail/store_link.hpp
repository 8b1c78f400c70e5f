#pragma once
/// The watchdog's traffic with the communicator's store scope: this rank's progress, the
/// announcement of a failure, the peers' progress for a report, and the store link, the thread
/// that carries that traffic while the communicator is healthy. Internal: part of the watchdog
/// (ncclkit/nccl/detail/watchdog.hpp).
///
/// The store side runs on a second thread, the store link, so that a store that stops
/// answering (its host rank stopped, say) never delays the watchdog's own timeout:
///   - progress: while healthy, it publishes "issued completed" sequence numbers under
///     `progress/<rank>` in the communicator's store scope whenever they change (at most
///     every 50 ms), so that a report can say which rank fell behind even when that rank is
///     stopped or dead;
///   - peer failures: a failing rank sets `failed` ("<rank> <reason>") in the scope before it
///     aborts (waiting at most 500 ms for the store). While this rank has a collective in
///     flight for longer than the peer check interval (the timeout / 10, between 100 ms and
///     1 s), the store link checks that key once per interval; when it is set, the collective
///     cannot complete (a member of it has aborted), and this communicator fails too, without
///     waiting out its own timeout. With nothing in flight it checks once per interval as well
///     (one store read per interval and communicator), so that a rank learns of a peer's
///     failure before it issues its next collective.
///
/// Host code only: compiles with g++ given the CUDA and NCCL include folders.

#include <chrono>     // std::chrono
#include <cstdint>    // std::uint64_t
#include <cstdio>     // std::sscanf
#include <exception>  // std::exception
#include <mutex>      // std::mutex, std::lock_guard, std::unique_lock
#include <optional>   // std::optional
#include <string>     // std::string, std::to_string

#include "ncclkit/core/log.hpp"
#include "ncclkit/nccl/detail/watchdog_state.hpp"
#include "ncclkit/nccl/detail/work_record.hpp"
#include "ncclkit/nccl/failure_report.hpp"

namespace ncclkit::nccl::detail {

inline std::string progress_key(int of_rank) { return "progress/" + std::to_string(of_rank); }

inline constexpr const char* kFailedKey = "failed";

/// After a store call failed: no more store traffic from this communicator, said once.
inline void store_failed(WatchdogState& s, const char* what, const std::exception& error) {
  s.store_broken = true;
  log_warn("watchdog of '" + s.name + "': " + what + ": " + error.what());
}

inline void publish_progress(WatchdogState& s, bool force, bool failed_now) {
  std::lock_guard lock(s.publish_mutex);
  if (!s.store || s.store_broken) return;
  // A healthy rank's write must not overwrite the failure's (see publish_mutex).
  if (!failed_now && s.failed.load(std::memory_order_acquire)) return;
  const std::uint64_t i = s.issued.load(), c = s.completed.load();
  const auto now = Clock::now();
  if (!force && i == s.published_issued && c == s.published_completed) return;
  if (!force && now - s.published_at < std::chrono::milliseconds(50)) return;
  try {
    s.store->set(progress_key(s.rank), std::to_string(i) + " " + std::to_string(c) + (failed_now ? " failed" : ""));
    s.published_issued = i;
    s.published_completed = c;
    s.published_at = now;
  } catch (const std::exception& e) {
    store_failed(s, "cannot publish progress to the store any more", e);
  }
}

/// Tells the other ranks (their store links) that this communicator failed.
inline void announce_failure(WatchdogState& s, const std::string& reason) {
  std::lock_guard lock(s.publish_mutex);
  if (!s.store || s.store_broken) return;
  try {
    s.store->set(kFailedKey, std::to_string(s.rank) + " " + reason);
  } catch (const std::exception& e) {
    store_failed(s, "cannot announce the failure through the store", e);
  }
}

/// The failure a peer announced ("<rank> <reason>"), if any. Throws on store errors.
inline std::optional<std::string> read_announcement(const WatchdogState& s) {
  if (!s.store->check({std::string(kFailedKey)})) return std::nullopt;
  return s.store->get_string(kFailedKey, std::chrono::milliseconds(500));
}

/// The reason of this rank's failure, from a peer's announcement and what it did here.
inline std::string peer_reason(const std::string& announcement, const std::string& consequence) {
  const auto space = announcement.find(' ');
  const std::string who = space == std::string::npos ? announcement : announcement.substr(0, space);
  const std::string why = space == std::string::npos ? std::string("no reason given") : announcement.substr(space + 1);
  return "rank " + who + " announced through the store that its communicator failed (" + why + "), so " + consequence;
}

/// For the store link: a peer's announced failure, checked at most once per peer_check
/// interval, while idle (`waiting_since` empty) or while the oldest work has waited that
/// long: no store traffic for work that completes within the interval.
inline std::optional<std::string> peer_failure(WatchdogState& s, Clock::time_point now,
                                               std::optional<Clock::time_point> waiting_since) {
  if (!s.store || now - s.last_peer_check < s.peer_check) return std::nullopt;
  if (waiting_since && now - *waiting_since < s.peer_check) return std::nullopt;
  s.last_peer_check = now;
  std::lock_guard lock(s.publish_mutex);
  if (s.store_broken) return std::nullopt;
  try {
    return read_announcement(s);
  } catch (const std::exception& e) {
    store_failed(s, "cannot read peers' failures from the store any more", e);
    return std::nullopt;
  }
}

inline std::optional<PeerProgress> parse_progress(int of_rank, const std::string& text) {
  PeerProgress p;
  p.rank = of_rank;
  unsigned long long i = 0, c = 0;
  char flag[16] = {0};
  int n = std::sscanf(text.c_str(), "%llu %llu %15s", &i, &c, flag);
  if (n < 2) return std::nullopt;
  p.known = true;
  p.issued = i;
  p.completed = c;
  p.failed = n == 3 && std::string(flag) == "failed";
  return p;
}

/// Reads every rank's progress, spending at most about 2 s on the store.
inline void gather_peers(WatchdogState& s, FailureReport& out) {
  if (!s.store) {
    out.peers_note = "no store: other ranks' progress is not known";
    return;
  }
  const auto budget_end = Clock::now() + std::chrono::seconds(2);
  bool budget_spent = false;
  bool store_failed = false;
  for (int r = 0; r < s.world; ++r) {
    PeerProgress p;
    p.rank = r;
    if (r == s.rank) {
      p.known = true;
      p.issued = s.issued.load();
      p.completed = s.completed.load();
      p.failed = true;
      out.peers.push_back(p);
      continue;
    }
    if (store_failed || Clock::now() >= budget_end) {
      budget_spent = budget_spent || !store_failed;
      out.peers.push_back(p);
      continue;
    }
    try {
      const std::string key = progress_key(r);
      if (s.store->check({key})) {
        if (auto parsed = parse_progress(r, s.store->get_string(key, std::chrono::milliseconds(500)))) p = *parsed;
      }
    } catch (const std::exception& e) {
      store_failed = true;
      out.peers_note = std::string("the store stopped answering while reading other ranks' progress: ") + e.what();
    }
    out.peers.push_back(p);
  }
  if (budget_spent && out.peers_note.empty()) out.peers_note = "stopped reading the store after 2 s";
}

/// The store link: publishes progress while healthy and turns a peer's announced failure
/// into this communicator's while its work waits (see the top of this file). Ends at stop
/// or once this communicator has failed (the watchdog thread then does the store work).
inline void run_store_link(WatchdogState& s) {
  while (true) {
    {
      std::unique_lock lock(s.control_mutex);
      s.control_cv.wait_for(lock, std::chrono::milliseconds(50), [&] { return s.stop || s.failure_requested; });
      if (s.stop) break;
      if (s.failure_requested) {
        // Announce this rank's own failure while the watchdog thread waits to abort (see
        // handle_failure), so that peers released by the abort find it in the store.
        const bool own = !s.failure_from_peer;
        const std::string reason = s.requested_reason;
        lock.unlock();
        if (own) announce_failure(s, reason);
        lock.lock();
        s.announced = true;
        s.control_cv.notify_all();
        break;
      }
    }
    publish_progress(s, false, false);
    // What has waited longest: the oldest collective in flight, or a blocking NCCL call.
    const auto now = Clock::now();
    std::optional<WorkRecord> oldest;
    {
      std::lock_guard lock(s.queue_mutex);
      if (!s.in_flight.empty()) oldest = s.in_flight.front();
    }
    if (auto call = blocked_call(s.handle); call && (!oldest || call->issued < oldest->issued)) oldest = call;
    // Idle, it looks once per interval too: a collective issued after the peers aborted would
    // be released at once, with undefined data, so this rank must know before it issues one.
    std::optional<Clock::time_point> waiting_since;
    if (oldest) waiting_since = oldest->issued;
    if (auto announced = peer_failure(s, now, waiting_since)) {
      const std::string consequence =
          oldest ? "this collective cannot complete; stopped waiting after " +
                       FailureReport::format_seconds(std::chrono::duration<double>(now - oldest->issued).count())
                 : std::string(
                       "this communicator cannot be used any more (seen while nothing of this rank was in "
                       "flight)");
      request_failure(s, peer_reason(*announced, consequence), oldest, /*from_peer=*/true);
      // Loop once more: the failure is requested, so it ends there.
    }
  }
  std::lock_guard lock(s.control_mutex);
  s.link_done = true;
  s.control_cv.notify_all();
}

}  // namespace ncclkit::nccl::detail
