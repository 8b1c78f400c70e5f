#pragma once
/// PrefixStore: scopes every key of another store under "prefix/", so that several jobs,
/// communicators or reruns share one store without their keys mixing.

#include <memory>       // std::shared_ptr
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/store/store.hpp"

namespace ncclkit {

/// Forwards to `base` with keys prefixed by "prefix/". Holds a shared reference to `base`.
class PrefixStore final : public Store {
 public:
  PrefixStore(std::string prefix, std::shared_ptr<Store> base) : prefix_(std::move(prefix)), base_(std::move(base)) {
    if (!base_) throw ConfigError("PrefixStore: the underlying store is null");
    set_default_timeout(base_->default_timeout());
  }

  using Store::check;
  using Store::compare_set;
  using Store::get;
  using Store::set;
  using Store::wait;

  void set(std::string_view key, std::span<const std::uint8_t> value) override { base_->set(scoped(key), value); }
  Bytes get(std::string_view key, Duration timeout) override { return base_->get(scoped(key), timeout); }
  void wait(std::span<const std::string> keys, Duration timeout) override {
    auto list = scoped(keys);
    base_->wait(std::span<const std::string>(list), timeout);
  }
  bool check(std::span<const std::string> keys) override {
    auto list = scoped(keys);
    return base_->check(std::span<const std::string>(list));
  }
  std::int64_t add(std::string_view key, std::int64_t delta) override { return base_->add(scoped(key), delta); }
  Bytes compare_set(std::string_view key, std::span<const std::uint8_t> expected,
                    std::span<const std::uint8_t> desired) override {
    return base_->compare_set(scoped(key), expected, desired);
  }
  bool delete_key(std::string_view key) override { return base_->delete_key(scoped(key)); }
  std::int64_t num_keys() override { return base_->num_keys(); }
  std::string describe() const override { return base_->describe() + " (prefix '" + prefix_ + "')"; }

  const std::string& prefix() const { return prefix_; }
  const std::shared_ptr<Store>& base() const { return base_; }

 private:
  std::string scoped(std::string_view key) const {
    std::string out;
    out.reserve(prefix_.size() + 1 + key.size());
    out.append(prefix_).push_back('/');
    out.append(key);
    return out;
  }
  std::vector<std::string> scoped(std::span<const std::string> keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& key : keys) out.push_back(scoped(key));
    return out;
  }

  std::string prefix_;
  std::shared_ptr<Store> base_;
};

}  // namespace ncclkit
