#pragma once
/// StoreAdapter: lets Gloo rendezvous through an ncclkit `Store` (FileStore, TcpStore,
/// PrefixStore, ...), so a Gloo communicator needs no store of Gloo's own.
///
/// Gloo's `rendezvous::Store` has two `wait` overloads; its base class ignores the timeout of
/// the second, and the first has none. This adapter honours both: `wait(keys, timeout)` uses
/// the given timeout, and `wait(keys)` and `get(key)` (which in Gloo's interface block until
/// the key exists) use the adapter's own timeout, the communicator's. A timeout throws
/// ncclkit's `TimeoutError` naming the missing keys and the store; Gloo passes it through to
/// the caller of `connectFullMesh` unchanged.

#include <gloo/rendezvous/store.h>  // gloo::rendezvous::Store

#include <chrono>   // std::chrono::milliseconds
#include <cstdint>  // std::uint8_t
#include <memory>   // std::shared_ptr
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/core/error.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::gloo {

/// A `gloo::rendezvous::Store` that forwards to an ncclkit `Store`. Values are copied between
/// Gloo's `std::vector<char>` and ncclkit's bytes. Thread safety: that of the wrapped store.
class StoreAdapter final : public ::gloo::rendezvous::Store {
 public:
  /// `timeout` bounds `get` and the `wait` overload without a timeout.
  StoreAdapter(std::shared_ptr<ncclkit::Store> store, std::chrono::milliseconds timeout)
      : store_(std::move(store)), timeout_(timeout) {
    if (!store_) throw ConfigError("ncclkit::gloo::StoreAdapter: the store is null");
  }

  void set(const std::string& key, const std::vector<char>& data) override {
    store_->set(key, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(data.data()), data.size()));
  }

  std::vector<char> get(const std::string& key) override {
    const Bytes value = store_->get(key, timeout_);
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }

  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds& timeout) override {
    // Gloo passes kNoTimeout (zero) to mean "no limit"; ncclkit never waits without one.
    const auto limit = timeout > std::chrono::milliseconds::zero() ? timeout : timeout_;
    store_->wait(std::span<const std::string>(keys), limit);
  }

  /// The wrapped store.
  ncclkit::Store& store() const { return *store_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

 private:
  std::shared_ptr<ncclkit::Store> store_;
  std::chrono::milliseconds timeout_;
};

}  // namespace ncclkit::gloo
