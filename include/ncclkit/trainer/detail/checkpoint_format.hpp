#pragma once
/// The pieces of the checkpoint file format (trainer/checkpoint.hpp documents the layout) that do
/// not depend on the checkpoint's types: the fixed sizes, the element type codes, tensor sizes,
/// positioned reads, and the names `CheckpointFolder` gives its files and temp files.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include <unistd.h>  // pread, getpid

#include <atomic>       // std::atomic (unique temp names)
#include <cerrno>       // errno, EINTR
#include <charconv>     // std::from_chars
#include <cstddef>      // std::byte, std::size_t
#include <cstdint>      // fixed-width integers
#include <cstdio>       // std::snprintf
#include <limits>       // std::numeric_limits
#include <optional>     // std::optional
#include <span>         // std::span
#include <string>       // std::string, std::to_string
#include <string_view>  // std::string_view

#include "ncclkit/core/dtype.hpp"

namespace ncclkit::trainer::detail {

inline constexpr char kCheckpointMagic[8] = {'N', 'C', 'C', 'L', 'K', 'C', 'P', 'T'};
inline constexpr std::uint32_t kCheckpointVersion = 1;
/// magic, version, table_bytes, file_bytes.
inline constexpr std::size_t kCheckpointPrefixBytes = 8 + 4 + 8 + 8;
inline constexpr std::size_t kCheckpointChecksumBytes = 8;
/// The least a table entry takes: name length, dtype, role, rank, data_bytes.
inline constexpr std::size_t kCheckpointMinEntryBytes = 4 + 1 + 1 + 4 + 8;

/// The element types by file code minus one: fixed by the format, whatever order DataType has.
inline constexpr DataType kCheckpointTypes[] = {
    DataType::kInt8,   DataType::kUint8,   DataType::kInt32,    DataType::kUint32,  DataType::kInt64,
    DataType::kUint64, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64};
inline constexpr std::uint8_t kCheckpointTypeCount = sizeof kCheckpointTypes / sizeof kCheckpointTypes[0];

/// The file code of `type` (1 to 10); 0 for a value outside DataType.
inline std::uint8_t dtype_code(DataType type) {
  for (std::uint8_t i = 0; i < kCheckpointTypeCount; ++i) {
    if (kCheckpointTypes[i] == type) return static_cast<std::uint8_t>(i + 1);
  }
  return 0;
}
inline std::optional<DataType> dtype_of_code(std::uint8_t code) {
  if (code < 1 || code > kCheckpointTypeCount) return std::nullopt;
  return kCheckpointTypes[code - 1];
}

/// "[128, 64]"; "[]" for a scalar.
inline std::string shape_text(std::span<const std::int64_t> shape) {
  std::string text = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

/// The bytes a tensor of `shape` and `type` takes; nullopt for a negative dimension, an unknown
/// type, or a size past 64 bits.
inline std::optional<std::uint64_t> tensor_bytes(std::span<const std::int64_t> shape, DataType type) {
  std::uint64_t bytes = size_of(type);
  if (bytes == 0) return std::nullopt;
  for (std::int64_t dim : shape) {
    if (dim < 0) return std::nullopt;
    const auto d = static_cast<std::uint64_t>(dim);
    if (d != 0 && bytes > std::numeric_limits<std::uint64_t>::max() / d) return std::nullopt;
    bytes *= d;
  }
  return bytes;
}

/// "0x00000000deadbeef".
inline std::string hex64(std::uint64_t value) {
  char text[24];
  std::snprintf(text, sizeof text, "0x%016llx", static_cast<unsigned long long>(value));
  return text;
}

inline std::uint64_t load_u64(const std::byte* bytes) {
  std::uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value |= static_cast<std::uint64_t>(bytes[i]) << (8 * i);
  return value;
}

/// Reads `size` bytes at `offset`, retrying on EINTR; 0, an errno value, or -1 where the file
/// ends first.
inline int read_exact_at(int fd, std::byte* out, std::size_t size, std::uint64_t offset) {
  while (size > 0) {
    const ssize_t n = ::pread(fd, out, size, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    if (n == 0) return -1;
    out += n;
    offset += static_cast<std::uint64_t>(n);
    size -= static_cast<std::size_t>(n);
  }
  return 0;
}

/// Whether `name` is a checkpoint of CheckpointFolder ("step-<digits>.ckpt"), and its step.
inline std::optional<std::uint64_t> step_of_checkpoint_name(std::string_view name) {
  constexpr std::string_view head = "step-", tail = ".ckpt";
  if (name.size() <= head.size() + tail.size() || !name.starts_with(head) || !name.ends_with(tail)) {
    return std::nullopt;
  }
  const std::string_view digits = name.substr(head.size(), name.size() - head.size() - tail.size());
  std::uint64_t step = 0;
  const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), step);
  if (error != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return step;
}

/// "<pid>-<counter>": a suffix no other writer uses at the same time, in this process or another.
inline std::string unique_suffix() {
  static std::atomic<unsigned> counter{0};
  return std::to_string(::getpid()) + "-" + std::to_string(counter.fetch_add(1));
}

}  // namespace ncclkit::trainer::detail
