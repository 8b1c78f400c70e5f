#pragma once
/// MemoryStore: a Store in the memory of one process, for ranks that are threads of that
/// process (tests, single-process tools, a LocalGroup's members). Nothing crosses a process
/// boundary: processes rendezvous through FileStore or TcpStore.
///
/// One mutex guards the keys; a condition variable wakes get() and wait() when a key appears,
/// so a waiter returns as soon as its keys exist and never polls. Every blocking call ends at
/// its timeout with TimeoutError naming the keys still missing, the store and the time waited,
/// like FileStore's and TcpStore's.
///
/// Usage:
///   auto store = std::make_shared<ncclkit::MemoryStore>("job");
///   std::thread peer([&] { store->set("ready", "1"); });
///   store->wait({"ready"}, std::chrono::seconds(5));
///   peer.join();

#include <algorithm>           // std::equal
#include <charconv>            // std::from_chars
#include <chrono>              // std::chrono
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // std::int64_t, std::uint8_t
#include <map>                 // std::map
#include <mutex>               // std::mutex, std::unique_lock
#include <optional>            // std::optional
#include <span>                // std::span
#include <string>              // std::string
#include <utility>             // std::move
#include <string_view>         // std::string_view
#include <vector>              // std::vector

#include "ncclkit/core/detail/deadline.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/time_format.hpp"
#include "ncclkit/store/detail/printable_key.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit {

namespace detail::memory_store {

/// A key or value as it appears in messages (one format for every store).
inline std::string quote(std::string_view text) { return ncclkit::detail::printable_key(text); }

/// The int64 written in decimal in `text`, without anything else; nothing when it is not one.
inline std::optional<std::int64_t> parse_int64(std::string_view text) {
  std::int64_t value = 0;
  const char* end = text.data() + text.size();
  auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || stop != end) return std::nullopt;
  return value;
}

}  // namespace detail::memory_store

/// A Store in this process's memory, shared by threads. Thread-safe; not copyable or movable
/// (threads hold references to it).
class MemoryStore final : public Store {
 public:
  /// `name` appears in describe() ("memory://name") and so in every error message.
  explicit MemoryStore(std::string name = "store") : name_(std::move(name)) {}

  // The convenience overloads (strings, initializer lists, the default timeout).
  using Store::check;
  using Store::compare_set;
  using Store::get;
  using Store::set;
  using Store::wait;

  void set(std::string_view key, std::span<const std::uint8_t> value) override {
    {
      std::lock_guard<std::mutex> guard(mutex_);
      put(key, Bytes(value.begin(), value.end()));
    }
    changed_.notify_all();
  }

  Bytes get(std::string_view key, Duration timeout) override {
    const auto start = Clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    const bool found = changed_.wait_until(lock, detail::deadline_after(timeout, start),
                                           [&] { return data_.find(key) != data_.end(); });
    if (found) return data_.find(key)->second;
    throw TimeoutError(where() + ": get of key " + detail::memory_store::quote(key) + " timed out after " +
                       format_seconds(Clock::now() - start) + " (timeout " + format_seconds(timeout) +
                       "): the key does not exist. Is the thread that sets it running, and using this store?");
  }

  void wait(std::span<const std::string> keys, Duration timeout) override {
    const auto start = Clock::now();
    std::unique_lock<std::mutex> lock(mutex_);
    if (changed_.wait_until(lock, detail::deadline_after(timeout, start), [&] { return all_present(keys); })) return;
    std::string names;
    std::size_t missing = 0;
    for (const auto& key : keys) {
      if (data_.find(key) != data_.end()) continue;
      if (missing++ < 32) names += (names.empty() ? "" : ", ") + detail::memory_store::quote(key);
    }
    if (missing > 32) names += ", ... (" + std::to_string(missing) + " in all)";
    throw TimeoutError(where() + ": wait for " + std::to_string(keys.size()) + " key(s) timed out after " +
                       format_seconds(Clock::now() - start) + " (timeout " + format_seconds(timeout) + "); " +
                       std::to_string(missing) + " still missing: " + names +
                       ". Are the threads that set them running, and using this store?");
  }

  bool check(std::span<const std::string> keys) override {
    std::lock_guard<std::mutex> guard(mutex_);
    return all_present(keys);
  }

  std::int64_t add(std::string_view key, std::int64_t delta) override {
    std::int64_t sum = 0;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      std::int64_t value = 0;
      if (auto found = data_.find(key); found != data_.end()) {
        const std::string text(found->second.begin(), found->second.end());
        auto parsed = detail::memory_store::parse_int64(text);
        if (!parsed) {
          throw StoreError(
              where() + ": add to key " + detail::memory_store::quote(key) + ": its value " +
              detail::memory_store::quote(text) +
              " is not a decimal integer (it was set by set(), not add()); use another key for the counter");
        }
        value = *parsed;
      }
      if (__builtin_add_overflow(value, delta, &sum)) {
        throw StoreError(where() + ": add of " + std::to_string(delta) + " to key " + detail::memory_store::quote(key) +
                         " (value " + std::to_string(value) + ") overflows int64");
      }
      put(key, to_bytes(std::to_string(sum)));
    }
    changed_.notify_all();
    return sum;
  }

  Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override {
    Bytes result;
    {
      std::lock_guard<std::mutex> guard(mutex_);
      auto found = data_.find(key);
      if (found == data_.end()) {
        if (!expected.empty()) return Bytes(expected.begin(), expected.end());
      } else if (!std::equal(found->second.begin(), found->second.end(), expected.begin(), expected.end())) {
        return found->second;
      }
      result.assign(desired.begin(), desired.end());
      put(key, result);
    }
    changed_.notify_all();
    return result;
  }

  bool delete_key(std::string_view key) override {
    std::lock_guard<std::mutex> guard(mutex_);
    auto found = data_.find(key);
    if (found == data_.end()) return false;
    data_.erase(found);
    return true;
  }

  std::int64_t num_keys() override {
    std::lock_guard<std::mutex> guard(mutex_);
    return static_cast<std::int64_t>(data_.size());
  }

  std::string describe() const override { return "memory://" + name_; }

 private:
  using Clock = std::chrono::steady_clock;

  std::string where() const { return "MemoryStore " + describe(); }

  // Callers hold mutex_.
  void put(std::string_view key, Bytes value) {
    if (auto found = data_.find(key); found != data_.end()) {
      found->second = std::move(value);
    } else {
      data_.emplace(std::string(key), std::move(value));
    }
  }
  bool all_present(std::span<const std::string> keys) const {
    for (const auto& key : keys) {
      if (data_.find(key) == data_.end()) return false;
    }
    return true;
  }

  const std::string name_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::string, Bytes, std::less<>> data_;
};

}  // namespace ncclkit
