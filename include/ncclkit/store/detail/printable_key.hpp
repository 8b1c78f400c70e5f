#pragma once
/// Keys as every store's messages show them: quoted, bytes outside printable ASCII as \xNN, long
/// keys and long lists of keys cut short (keys are bytes and may be long).

#include <algorithm>    // std::min
#include <cstddef>      // std::size_t
#include <string>       // std::string
#include <string_view>  // std::string_view

namespace ncclkit::detail {

/// A printable, bounded form of a key for messages (keys are bytes and may be long).
inline std::string printable_key(std::string_view key) {
  std::string text = "'";
  const std::size_t shown = std::min<std::size_t>(key.size(), 120);
  for (std::size_t i = 0; i < shown; ++i) {
    const unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '\'') {
      text.push_back(static_cast<char>(c));
    } else {
      static constexpr char kHex[] = "0123456789abcdef";
      text += "\\x";
      text.push_back(kHex[c >> 4]);
      text.push_back(kHex[c & 0xF]);
    }
  }
  if (shown < key.size()) text += "...(" + std::to_string(key.size()) + " bytes)";
  return text + "'";
}

/// "'a', 'b', 'c'" for at most 32 keys, then how many in all.
template <class Keys>
std::string printable_key_list(const Keys& keys) {
  std::string text;
  std::size_t count = 0;
  for (const auto& key : keys) {
    if (count < 32) text += (count == 0 ? "" : ", ") + printable_key(std::string_view(key));
    ++count;
  }
  if (count > 32) text += ", ... (" + std::to_string(count) + " in all)";
  return text;
}

}  // namespace ncclkit::detail
