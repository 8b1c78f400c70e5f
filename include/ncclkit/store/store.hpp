#pragma once
/// The key-value store processes rendezvous through: the interface, and the helpers every
/// implementation shares. Implementations: FileStore (a folder, also over NFS), TcpStore
/// (a server inside rank 0 or standalone), PrefixStore (scopes keys of another store).
///
/// Stores are chosen at run time from an init URL, so this is a small virtual interface (the
/// cost of a virtual call is nothing next to a file system or network round trip).
///
/// Values are bytes (`Bytes`); string overloads exist for convenience. Every blocking call
/// takes a timeout, or uses the store's default (300 s, or the options'; NCCLKIT_STORE_TIMEOUT
/// overrides it). On expiry
/// it throws TimeoutError naming the keys still missing, the store (`describe()`) and the time
/// waited. A timeout never fires early and is late by at most max(10%, 250 ms).
///
/// Thread safety: a Store object may be used from several threads at once.

#include <chrono>   // std::chrono
#include <cstdint>  // std::int64_t, std::uint8_t
#include <initializer_list>
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/knobs.hpp"
#include "ncclkit/core/log.hpp"  // detail::check_log_level

namespace ncclkit {

/// A store value: arbitrary bytes.
using Bytes = std::vector<std::uint8_t>;

/// Converts between string and Bytes.
inline Bytes to_bytes(std::string_view text) { return Bytes(text.begin(), text.end()); }
inline std::string to_string(const Bytes& bytes) { return std::string(bytes.begin(), bytes.end()); }

class Store {
 public:
  using Duration = std::chrono::milliseconds;

  /// The default timeout is 300 s, or NCCLKIT_STORE_TIMEOUT; implementations set their options'
  /// (overridden by the variable too). A bad NCCLKIT_LOG_LEVEL is a ConfigError here.
  Store()
      : default_timeout_(environment_overrides(knob("NCCLKIT_STORE_TIMEOUT"),
                                               knob_default<std::chrono::milliseconds>("NCCLKIT_STORE_TIMEOUT"))) {
    detail::check_log_level();
  }
  virtual ~Store() = default;
  Store(const Store&) = delete;
  Store& operator=(const Store&) = delete;

  /// Sets `key` to `value`, replacing any earlier value. Never blocks beyond I/O.
  virtual void set(std::string_view key, std::span<const std::uint8_t> value) = 0;

  /// The value of `key`, waiting until it exists; TimeoutError after `timeout`.
  virtual Bytes get(std::string_view key, Duration timeout) = 0;

  /// Waits until every key in `keys` exists; TimeoutError (naming the missing ones) after `timeout`.
  virtual void wait(std::span<const std::string> keys, Duration timeout) = 0;

  /// Whether every key in `keys` exists right now. Never blocks.
  virtual bool check(std::span<const std::string> keys) = 0;

  /// Atomically adds `delta` to the int64 counter at `key` (missing counts as 0) and returns
  /// the new value. A key set to something that is not a decimal integer is a StoreError.
  virtual std::int64_t add(std::string_view key, std::int64_t delta) = 0;

  /// Atomic compare-and-set. If `key` holds `expected` (or is missing and `expected` is empty),
  /// sets it to `desired`. Returns the value the key holds afterwards: `desired` on success,
  /// the current value on a mismatch, and `expected` when the key is missing and `expected` is
  /// not empty (nothing is set then).
  virtual Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                            std::span<const std::uint8_t> desired) = 0;

  /// Deletes `key`; returns whether it existed.
  virtual bool delete_key(std::string_view key) = 0;

  /// How many keys the store holds (for a PrefixStore: the whole underlying store's count).
  virtual std::int64_t num_keys() = 0;

  /// Where the store is, for error messages: "tcp://host:port", "file:///dir", ...
  virtual std::string describe() const = 0;

  /// Timeout used by the overloads that take none.
  Duration default_timeout() const { return default_timeout_; }
  void set_default_timeout(Duration timeout) { default_timeout_ = timeout; }

  // Convenience overloads.
  void set(std::string_view key, std::string_view value) {
    set(key, std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(value.data()), value.size()));
  }
  void set(std::string_view key, const Bytes& value) { set(key, std::span<const std::uint8_t>(value)); }
  void set(std::string_view key, const char* value) { set(key, std::string_view(value)); }
  Bytes get(std::string_view key) { return get(key, default_timeout_); }
  std::string get_string(std::string_view key) { return to_string(get(key, default_timeout_)); }
  std::string get_string(std::string_view key, Duration timeout) { return to_string(get(key, timeout)); }
  void wait(std::span<const std::string> keys) { wait(keys, default_timeout_); }
  void wait(std::initializer_list<std::string> keys, Duration timeout) {
    std::vector<std::string> list(keys);
    wait(std::span<const std::string>(list), timeout);
  }
  void wait(std::initializer_list<std::string> keys) { wait(keys, default_timeout_); }
  bool check(std::initializer_list<std::string> keys) {
    std::vector<std::string> list(keys);
    return check(std::span<const std::string>(list));
  }
  std::string compare_set(std::string_view key, std::string_view expected, std::string_view desired) {
    auto as_span = [](std::string_view s) {
      return std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(s.data()), s.size());
    };
    return to_string(compare_set(key, as_span(expected), as_span(desired)));
  }

 private:
  Duration default_timeout_;
};

}  // namespace ncclkit
