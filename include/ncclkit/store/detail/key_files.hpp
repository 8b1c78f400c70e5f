#pragma once
/// How FileStore names a key's file: keys of any bytes escaped into portable file names
/// ("k-<escaped>"), long ones hashed ("h-<128-bit hash>", the key repeated in the file so that
/// a collision is seen), and keys quoted for messages.

#include <cstddef>      // std::size_t
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "ncclkit/store/detail/hash_ids.hpp"  // hash64, hex64
#include "ncclkit/store/detail/printable_key.hpp"

namespace ncclkit::detail::file_store {

/// A plain key file name ("k-" + escaped key) longer than this becomes "h-" + a 128-bit hash;
/// file systems allow 255 bytes, and temp names add a suffix.
inline constexpr std::size_t kMaxPlainName = 200;

/// A key as it appears in messages (one format for every store: detail/printable_key.hpp).
inline std::string quote_key(std::string_view key) { return ncclkit::detail::printable_key(key); }

/// Escapes a key into file-name characters: [a-z0-9._-] stay, every other byte becomes %xx.
/// Upper-case letters are escaped too, so that keys stay distinct on case-insensitive file
/// systems. Injective, and '/' or NUL never reach the file system.
inline std::string escape_key(std::string_view key) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(key.size());
  for (char raw : key) {
    const auto c = static_cast<unsigned char>(raw);
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

/// The inverse of escape_key, for showing an escaped name (a run's tag) in messages.
inline std::string unescape_key(std::string_view escaped) {
  auto digit = [](char c) { return c >= 'a' ? c - 'a' + 10 : c - '0'; };
  std::string out;
  for (std::size_t i = 0; i < escaped.size(); ++i) {
    if (escaped[i] == '%' && i + 2 < escaped.size()) {
      out.push_back(static_cast<char>(digit(escaped[i + 1]) * 16 + digit(escaped[i + 2])));
      i += 2;
    } else {
      out.push_back(escaped[i]);
    }
  }
  return out;
}

/// The file that holds `key`: "k-<escaped>" or, when that would be too long, "h-<128-bit hash>".
inline std::string key_file_name(std::string_view key) {
  std::string name = "k-" + escape_key(key);
  if (name.size() <= kMaxPlainName) return name;
  return "h-" + hex64(hash64(key, 0x6e63636c6b697431ULL)) + hex64(hash64(key, 0x66696c6573746f72ULL));
}

inline bool is_key_file_name(const char* name) { return (name[0] == 'k' || name[0] == 'h') && name[1] == '-'; }

/// Long keys' files start with "ncclkit-key <length>\n<key>" so that a read can verify it.
inline std::string hashed_key_header(std::string_view key) {
  return "ncclkit-key " + std::to_string(key.size()) + "\n" + std::string(key);
}

}  // namespace ncclkit::detail::file_store
