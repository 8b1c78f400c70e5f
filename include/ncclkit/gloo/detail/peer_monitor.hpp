#pragma once
/// PeerMonitor: notices the moment a connection to a peer fails, says which rank it was, and
/// wakes every wait on the communicator's transport buffers so the collective in flight fails
/// at once instead of at its timeout.
///
/// Why Gloo alone is not enough. When a TCP pair fails (the peer exited: EOF or reset), Gloo's
/// `tcp::Pair::signalException` fails the unbound-buffer operations it still has queued
/// (sends the peer has not asked for yet, receives no byte of which has arrived), but not the
/// send it is writing (its transmit queue) nor the receive it is reading into. A wait on one of
/// those two runs to its full timeout ("Timed out waiting ... for send operation to complete").
/// Large messages make that likely: with two ranks every transfer goes to the one peer, and a
/// survivor waited the whole timeout in about a third of the trials.
///
/// How. (1) Sentinels: an unbound buffer with a receive posted from every peer on a slot nobody
/// sends to; a failing pair fails it along with its other queued operations. A watcher thread
/// sleeps in a wait on it (no polling) and wakes only on such a failure or at shutdown; one
/// sentinel per peer tells which pairs failed. (2) Every unbound buffer the communicator's
/// context creates (ncclkit's algorithms and Gloo's alike: they all call
/// `Context::createUnboundBuffer`) is a `WatchedBuffer`, which forwards to Gloo's buffer and is
/// registered here. On a peer failure the watcher aborts the waits of every registered buffer
/// (and of any created later): a wait that would block from then on throws `gloo::IoException`
/// naming the rank, even where the transfer's bytes had arrived (Gloo's waits look at an abort
/// before a completion they have not counted yet): ranks leave only through the destructor's
/// barrier, after which nothing is watched.
/// (3) A little later (kCloseDelay) it closes every connection of the context, as Gloo does on
/// a timeout: peers waiting on this rank then fail at once instead of at their timeout, and no
/// transfer of an abandoned buffer stays queued. The delay lets every peer see the dead rank's
/// own connection fail first (they all do, at the same moment: the mesh is full), so that
/// their messages name it rather than this rank.
///
/// Only Gloo's public transport interface is used (the tcp transport's own headers are not
/// installed by libgloo-dev): the abort of a wait makes it return false, which the wrapper
/// turns into the exception.

#include <gloo/common/error.h>              // gloo::IoException, gloo::Exception
#include <gloo/rendezvous/context.h>        // gloo::rendezvous::Context
#include <gloo/transport/context.h>         // gloo::transport::Context
#include <gloo/transport/unbound_buffer.h>  // gloo::transport::UnboundBuffer
#include <gloo/types.h>                     // gloo::Slot

#include <atomic>              // std::atomic
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::size_t
#include <cstdint>             // std::uint64_t
#include <exception>           // std::exception
#include <memory>              // std::shared_ptr, std::unique_ptr
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <string_view>         // std::string_view
#include <thread>              // std::thread
#include <unordered_set>       // std::unordered_set
#include <utility>             // std::move
#include <vector>              // std::vector

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/detail/poll.hpp"

namespace ncclkit::gloo::detail {

/// What the watcher found, shared by the monitor and every WatchedBuffer.
struct PeerFailureState {
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::string message;  ///< "the connection to rank 1 failed (...)" (guarded by mutex)
  std::unordered_set<::gloo::transport::UnboundBuffer*> buffers;  ///< Gloo buffers of live WatchedBuffers

  std::string failure() {
    std::lock_guard<std::mutex> lock(mutex);
    return message;
  }
};

/// A Gloo unbound buffer whose waits end, with an exception naming the failed peer, as soon as
/// the monitor sees a peer's connection fail. Transfers go through the wrapped buffer, so Gloo's
/// pairs only ever see Gloo's own buffer type.
class WatchedBuffer final : public ::gloo::transport::UnboundBuffer {
 public:
  WatchedBuffer(std::unique_ptr<::gloo::transport::UnboundBuffer> inner, std::shared_ptr<PeerFailureState> state)
      : ::gloo::transport::UnboundBuffer(inner->ptr, inner->size), inner_(std::move(inner)), state_(std::move(state)) {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->buffers.insert(inner_.get());
    if (state_->failed.load(std::memory_order_relaxed)) {
      inner_->abortWaitRecv();
      inner_->abortWaitSend();
    }
  }
  ~WatchedBuffer() override {
    std::lock_guard<std::mutex> lock(state_->mutex);
    state_->buffers.erase(inner_.get());
  }
  WatchedBuffer(const WatchedBuffer&) = delete;
  WatchedBuffer& operator=(const WatchedBuffer&) = delete;

  // After an abort, Gloo's wait returns false (even with a completion not yet counted): the
  // collective is over, and this throws naming the failed peer.
  bool waitRecv(int* rank, std::chrono::milliseconds timeout) override {
    const bool done = inner_->waitRecv(rank, timeout);
    if (!done) throw_if_failed();
    return done;
  }
  bool waitSend(int* rank, std::chrono::milliseconds timeout) override {
    const bool done = inner_->waitSend(rank, timeout);
    if (!done) throw_if_failed();
    return done;
  }
  void abortWaitRecv() override { inner_->abortWaitRecv(); }
  void abortWaitSend() override { inner_->abortWaitSend(); }
  void send(int rank, std::uint64_t slot, std::size_t offset, std::size_t bytes) override {
    inner_->send(rank, slot, offset, bytes);
  }
  void recv(int rank, std::uint64_t slot, std::size_t offset, std::size_t bytes) override {
    inner_->recv(rank, slot, offset, bytes);
  }
  void recv(std::vector<int> ranks, std::uint64_t slot, std::size_t offset, std::size_t bytes) override {
    inner_->recv(std::move(ranks), slot, offset, bytes);
  }

 private:
  void throw_if_failed() {
    if (state_->failed.load(std::memory_order_acquire)) throw ::gloo::IoException("ncclkit: " + state_->failure());
  }

  std::unique_ptr<::gloo::transport::UnboundBuffer> inner_;
  std::shared_ptr<PeerFailureState> state_;
};

/// Gloo's transport context with every unbound buffer it creates wrapped in a WatchedBuffer;
/// pairs are the wrapped context's.
class WatchingTransportContext final : public ::gloo::transport::Context {
 public:
  WatchingTransportContext(std::shared_ptr<::gloo::transport::Context> inner, std::shared_ptr<PeerFailureState> state)
      : ::gloo::transport::Context(inner->rank, inner->size), inner_(std::move(inner)), state_(std::move(state)) {
    setTimeout(inner_->getTimeout());
  }

  std::unique_ptr<::gloo::transport::Pair>& getPair(int rank) override { return inner_->getPair(rank); }
  std::unique_ptr<::gloo::transport::Pair>& createPair(int rank) override { return inner_->createPair(rank); }
  std::unique_ptr<::gloo::transport::UnboundBuffer> createUnboundBuffer(void* ptr, std::size_t size) override {
    return std::make_unique<WatchedBuffer>(inner_->createUnboundBuffer(ptr, size), state_);
  }

  /// A buffer that is not watched (the monitor's sentinels).
  std::unique_ptr<::gloo::transport::UnboundBuffer> create_unwatched_buffer(void* ptr, std::size_t size) {
    return inner_->createUnboundBuffer(ptr, size);
  }

 private:
  std::shared_ptr<::gloo::transport::Context> inner_;
  std::shared_ptr<PeerFailureState> state_;
};

/// Gloo's rendezvous context, able to put a WatchingTransportContext in front of its transport
/// after connecting (the transport context is a protected member of gloo::Context).
class MonitoredContext final : public ::gloo::rendezvous::Context {
 public:
  using ::gloo::rendezvous::Context::Context;

  /// Call once, after connectFullMesh and before any buffer is created.
  WatchingTransportContext& watch(std::shared_ptr<PeerFailureState> state) {
    auto watching = std::make_shared<WatchingTransportContext>(transportContext_, std::move(state));
    transportContext_ = watching;
    return *watching;
  }
};

/// The sentinels, the watcher thread and the failure state of one communicator (world > 1).
class PeerMonitor {
 public:
  /// Slot prefix of the sentinels' receives (ncclkit's algorithms use 0x40..0x42 and
  /// 0x44..0x46; Gloo's own collectives 0x01..0x08).
  static constexpr std::uint8_t kSentinelSlotPrefix = 0x43;
  /// How long after a peer's failure this rank closes its other connections.
  static constexpr std::chrono::milliseconds kCloseDelay{100};
  /// How long after seeing one failed connection the monitor looks for others.
  static constexpr std::chrono::milliseconds kSettle{20};

  /// `context` must outlive the monitor.
  PeerMonitor(MonitoredContext& context, std::string who)
      : context_(context),
        rank_(context.rank),
        size_(context.size),
        who_(std::move(who)),
        state_(std::make_shared<PeerFailureState>()) {
    auto& transport = context.watch(state_);
    any_peer_ = transport.create_unwatched_buffer(&any_byte_, 1);
    per_peer_bytes_.resize(static_cast<std::size_t>(size_));
    per_peer_.resize(static_cast<std::size_t>(size_));
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      any_peer_->recv(peer, ::gloo::Slot::build(kSentinelSlotPrefix, 0), 0, 1);
      auto& sentinel = per_peer_[static_cast<std::size_t>(peer)];
      sentinel = transport.create_unwatched_buffer(&per_peer_bytes_[static_cast<std::size_t>(peer)], 1);
      sentinel->recv(peer, ::gloo::Slot::build(kSentinelSlotPrefix, 1), 0, 1);
    }
    watcher_ = std::thread([this] { watch(); });
  }

  ~PeerMonitor() { stop(); }
  PeerMonitor(const PeerMonitor&) = delete;
  PeerMonitor& operator=(const PeerMonitor&) = delete;

  /// Ends the watcher. Called before the destructor's barrier: peers that leave it close their
  /// connections, which is no failure.
  void stop() noexcept {
    if (!watcher_.joinable()) return;
    {
      std::lock_guard<std::mutex> lock(stop_mutex_);
      stopping_ = true;
    }
    stop_cv_.notify_all();
    any_peer_->abortWaitRecv();
    watcher_.join();
  }

  /// Whether the watcher has seen a peer's connection fail, or abort() was called.
  bool peer_failed() const { return state_->failed.load(std::memory_order_acquire); }

  /// The communicator's abort: what the watcher does for a failed peer, at once and with
  /// `message` as the failure: every wait on the transport's buffers (and on any made later)
  /// ends, throwing `message`, and every connection of the context closes, so that peers
  /// waiting on this rank fail now too (naming it). Returns without waiting for anything. A
  /// failure already seen keeps its message.
  void abort(const std::string& message) {
    {
      std::lock_guard<std::mutex> lock(state_->mutex);
      if (!state_->failed.load(std::memory_order_relaxed)) state_->message = message;
      state_->failed.store(true, std::memory_order_release);
      for (auto* buffer : state_->buffers) {
        buffer->abortWaitRecv();
        buffer->abortWaitSend();
      }
    }
    context_.closeConnections();
  }

  /// "the connection to rank 1 failed (<Gloo's words>)", one clause per failed peer, or empty
  /// when no connection failed by a peer's doing. Waits up to `grace` for a failing pair to
  /// reach the sentinels (a collective can see the failure a moment before they do), then
  /// kSettle more for other failures of the same moment: when a rank dies every survivor's
  /// connection to it fails at once, but one survivor's event loop may get to another
  /// survivor's closing first, and naming only that one would blame a victim.
  std::string peer_failure(std::chrono::milliseconds grace) {
    if (peer_failed()) return state_->failure();
    const auto deadline = std::chrono::steady_clock::now() + grace;
    const bool seen = ncclkit::detail::poll_until(
        deadline, {.first = std::chrono::milliseconds(1), .cap = std::chrono::milliseconds(1)},
        [&] { return !failed_peers().empty(); });
    if (!seen) return "";
    std::this_thread::sleep_for(kSettle);
    return failed_peers();
  }

 private:
  /// Gloo's own words when this rank's timeout closed every pair (unbound_buffer.cc): no peer
  /// is to blame for those.
  static constexpr std::string_view kOwnTimeout = "Application timeout caused pair closure";

  void watch() noexcept {
    try {
      try {
        // Returns false when stop() aborts it; throws when a pair fails.
        any_peer_->waitRecv(nullptr, ncclkit::detail::kLongestTimeout);
        return;
      } catch (const std::exception&) {
      }
      // Stopped, or abort() closed the connections itself: nothing for the watcher to add.
      if (stopping() || peer_failed()) return;
      const std::string found = peer_failure(std::chrono::milliseconds(100));
      if (found.empty()) return;  // this rank's own timeout: its collective is failing already
      {
        std::lock_guard<std::mutex> lock(state_->mutex);
        state_->message = found;
        state_->failed.store(true, std::memory_order_release);
        for (auto* buffer : state_->buffers) {
          buffer->abortWaitRecv();
          buffer->abortWaitSend();
        }
      }
      log_error(who_ + ": " + found);
      std::unique_lock<std::mutex> lock(stop_mutex_);
      if (stop_cv_.wait_for(lock, kCloseDelay, [&] { return stopping_; })) return;
      context_.closeConnections();
    } catch (const std::exception& e) {
      log_error(who_ + ": the peer monitor stopped: " + e.what());
    }
  }

  /// The clauses of peer_failure, from the per-peer sentinels as they are now; past
  /// kMostNamed failed peers, only their number.
  std::string failed_peers() {
    constexpr int kMostNamed = 8;
    std::lock_guard<std::mutex> lock(probe_mutex_);
    std::string text;
    int named = 0, unnamed = 0;
    for (int peer = 0; peer < size_; ++peer) {
      if (peer == rank_) continue;
      auto& sentinel = *per_peer_[static_cast<std::size_t>(peer)];
      // An aborted wait returns false at once, unless the pair failed the sentinel: then it
      // throws the pair's error. probe_mutex_ keeps two probes from sharing one abort.
      sentinel.abortWaitRecv();
      try {
        sentinel.waitRecv(nullptr, ncclkit::detail::kLongestTimeout);
      } catch (const std::exception& e) {
        const std::string what = e.what();
        if (what.find(kOwnTimeout) != std::string::npos) continue;
        if (named == kMostNamed) {
          ++unnamed;
          continue;
        }
        if (named++ > 0) text += "; ";
        text += "the connection to rank " + std::to_string(peer) + " failed (" + what + ")";
      }
    }
    if (unnamed > 0) text += "; and the connections to " + std::to_string(unnamed) + " more ranks";
    return text;
  }

  bool stopping() {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    return stopping_;
  }

  MonitoredContext& context_;
  const int rank_;
  const int size_;
  const std::string who_;
  std::shared_ptr<PeerFailureState> state_;
  char any_byte_ = 0;
  std::vector<char> per_peer_bytes_;
  std::unique_ptr<::gloo::transport::UnboundBuffer> any_peer_;
  std::vector<std::unique_ptr<::gloo::transport::UnboundBuffer>> per_peer_;
  std::mutex probe_mutex_;
  std::mutex stop_mutex_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;  ///< guarded by stop_mutex_
  std::thread watcher_;
};

}  // namespace ncclkit::gloo::detail
