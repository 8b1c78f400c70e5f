#pragma once
/// Little-endian byte encoding for what ranks exchange about a fusion layout (the bucket plan),
/// and FNV-1a 64 over such bytes: the same bytes and the same hash on every platform and in
/// every process, which std::hash does not promise.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <cstddef>      // std::byte, std::size_t
#include <cstdint>      // std::uint8_t, std::uint32_t, std::uint64_t
#include <span>         // std::span
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view
#include <utility>      // std::move
#include <vector>       // std::vector

namespace ncclkit::detail {

/// FNV-1a, 64 bits, over `bytes`, continuing from `hash` (start with kFnvOffsetBasis).
inline constexpr std::uint64_t kFnvOffsetBasis = 0xcbf29ce484222325ull;
inline std::uint64_t fnv1a64(std::span<const std::byte> bytes, std::uint64_t hash = kFnvOffsetBasis) {
  for (std::byte b : bytes) {
    hash ^= static_cast<std::uint64_t>(b);
    hash *= 0x100000001b3ull;
  }
  return hash;
}

/// Appends fixed-width little-endian integers and length-prefixed strings to a byte vector.
class ByteWriter {
 public:
  void u8(std::uint8_t value) { bytes_.push_back(static_cast<std::byte>(value)); }
  void u32(std::uint32_t value) { put(value, 4); }
  void u64(std::uint64_t value) { put(value, 8); }
  /// A u32 length, then the bytes of `text` (no terminator).
  void text(std::string_view text) {
    u32(static_cast<std::uint32_t>(text.size()));
    for (char c : text) bytes_.push_back(static_cast<std::byte>(c));
  }
  std::vector<std::byte> take() && { return std::move(bytes_); }

 private:
  void put(std::uint64_t value, std::size_t width) {
    for (std::size_t i = 0; i < width; ++i) bytes_.push_back(static_cast<std::byte>((value >> (8 * i)) & 0xff));
  }
  std::vector<std::byte> bytes_;
};

/// Reads what ByteWriter wrote; every read checks the bounds and throws ConfigError
/// "<what>: <field> at byte N: <reason>" on truncated input, so a parser can stay linear.
class ByteReader {
 public:
  ByteReader(std::span<const std::byte> bytes, std::string what) : bytes_(bytes), what_(std::move(what)) {}

  std::uint8_t u8(std::string_view field) { return static_cast<std::uint8_t>(get(field, 1)); }
  std::uint32_t u32(std::string_view field) { return static_cast<std::uint32_t>(get(field, 4)); }
  std::uint64_t u64(std::string_view field) { return get(field, 8); }
  std::string text(std::string_view field) {
    const std::uint32_t size = u32(field);
    need(field, size);
    std::string out(size, '\0');
    for (std::uint32_t i = 0; i < size; ++i) out[i] = static_cast<char>(bytes_[at_ + i]);
    at_ += size;
    return out;
  }

  std::size_t position() const { return at_; }
  std::size_t remaining() const { return bytes_.size() - at_; }

  /// A ConfigError for a field that was read but is not acceptable.
  [[nodiscard]] ConfigError error(std::string_view field, std::string_view reason) const {
    return ConfigError(what_ + ": " + std::string(field) + " before byte " + std::to_string(at_) + ": " +
                       std::string(reason));
  }

 private:
  void need(std::string_view field, std::size_t size) const {
    if (remaining() < size) {
      throw ConfigError(what_ + ": truncated: " + std::string(field) + " needs " + std::to_string(size) +
                        " bytes at byte " + std::to_string(at_) + ", " + std::to_string(remaining()) + " left of " +
                        std::to_string(bytes_.size()));
    }
  }
  std::uint64_t get(std::string_view field, std::size_t width) {
    need(field, width);
    std::uint64_t value = 0;
    for (std::size_t i = 0; i < width; ++i) value |= static_cast<std::uint64_t>(bytes_[at_ + i]) << (8 * i);
    at_ += width;
    return value;
  }

  std::span<const std::byte> bytes_;
  std::string what_;
  std::size_t at_ = 0;
};

}  // namespace ncclkit::detail
