#pragma once
/// The TcpStore wire protocol: frame layout, an encoder, and `parse_frame`, a pure function
/// from bytes to "need more bytes" / a parsed frame / an error with its reason. Server and
/// client both parse with it, and the fuzz target (tests/fuzz/fuzz_tcp_frame.cpp) drives it
/// with arbitrary bytes.
///
/// Frame (all integers little-endian):
///
///     offset size  field
///          0    4  magic    0x53544B4E (the bytes "NKTS")
///          4    1  version  kProtocolVersion
///          5    1  type     MessageType
///          6    2  reserved must be 0
///          8    8  payload  number of payload bytes that follow
///         16    -  payload, laid out per type:
///
///     key    = u32 length (<= kMaxKeyBytes) + bytes
///     bytes  = u64 length (<= limits.max_value_bytes) + bytes
///     keys   = u32 count + count * key
///
///     kHello      bytes token (<= kMaxTokenBytes)  -> kHelloOk u64 server max_value_bytes | kError
///     kSet        key, bytes value                 -> kOk
///     kGet        u64 timeout_ms, key              -> kValue bytes | kTimeout keys
///     kWait       u64 timeout_ms, keys             -> kOk | kTimeout keys (those still missing)
///     kCheck      keys                             -> kInteger (1: all exist, 0: not)
///     kAdd        key, i64 delta                   -> kInteger new value | kError
///     kCompareSet key, bytes expected, bytes desired -> kValue bytes
///     kDelete     key                              -> kInteger (1: existed, 0: not)
///     kNumKeys    (empty)                          -> kInteger
///     kError      bytes message (UTF-8 text)
///
/// Why this shape: the fixed header carries the payload length, so a reader knows after 16
/// bytes how much to expect and can reject an oversized frame before it buffers (let alone
/// allocates) anything. Every inner length is checked against the bytes left in the payload,
/// so no field can claim more than the frame holds; a 2^62 length is an error, never an
/// allocation. A wrong magic says "not an ncclkit store peer" at the first four bytes.

#include <cstddef>      // std::size_t
#include <cstdint>      // std::uint8_t, std::uint32_t, std::uint64_t, std::int64_t
#include <cstring>      // std::memcpy
#include <iterator>     // std::size
#include <span>         // std::span
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::move
#include <vector>       // std::vector

#include "ncclkit/core/error.hpp"  // (stops a pre-C++20 build with one message)

namespace ncclkit::detail::tcp {

inline constexpr std::uint32_t kMagic = 0x53544B4Eu;  // "NKTS" as little-endian bytes
inline constexpr std::uint8_t kProtocolVersion = 1;
inline constexpr std::size_t kHeaderBytes = 16;
/// Longest key, in bytes.
inline constexpr std::size_t kMaxKeyBytes = 64 * 1024;
/// Default longest value, in bytes (TcpStoreServerOptions::max_value_bytes).
inline constexpr std::size_t kDefaultMaxValueBytes = std::size_t{64} << 20;
/// Longest store token, in bytes: what a server buffers from a peer before it has proven it
/// knows the token is bounded by the hello frame this allows (kMaxHelloFrameBytes).
inline constexpr std::size_t kMaxTokenBytes = 4096;
/// Largest hello frame: header, token length, token.
inline constexpr std::size_t kMaxHelloFrameBytes = kHeaderBytes + 8 + kMaxTokenBytes;

enum class MessageType : std::uint8_t {
  // Requests (client -> server).
  kHello = 1,
  kSet = 2,
  kGet = 3,
  kWait = 4,
  kCheck = 5,
  kAdd = 6,
  kCompareSet = 7,
  kDelete = 8,
  kNumKeys = 9,
  // Replies (server -> client).
  kHelloOk = 64,
  kOk = 65,
  kValue = 66,
  kInteger = 67,
  kTimeout = 68,
  kError = 69,
};

/// A readable name for logs and errors ("set", "wait", ...; "type 200" for unknown ones).
inline std::string message_type_name(std::uint8_t type) {
  switch (static_cast<MessageType>(type)) {
    case MessageType::kHello:
      return "hello";
    case MessageType::kSet:
      return "set";
    case MessageType::kGet:
      return "get";
    case MessageType::kWait:
      return "wait";
    case MessageType::kCheck:
      return "check";
    case MessageType::kAdd:
      return "add";
    case MessageType::kCompareSet:
      return "compare_set";
    case MessageType::kDelete:
      return "delete_key";
    case MessageType::kNumKeys:
      return "num_keys";
    case MessageType::kHelloOk:
      return "hello-ok";
    case MessageType::kOk:
      return "ok";
    case MessageType::kValue:
      return "value";
    case MessageType::kInteger:
      return "integer";
    case MessageType::kTimeout:
      return "timeout";
    case MessageType::kError:
      return "error";
  }
  return "type " + std::to_string(type);
}

/// What a reader accepts. Both sides validate against these before buffering a frame.
struct ParseLimits {
  std::size_t max_value_bytes = kDefaultMaxValueBytes;
  /// Only a hello may come (a server reading a peer that has not yet presented its token):
  /// any other type is an error from its type byte, and a payload longer than a hello can
  /// need (kMaxHelloFrameBytes) from the header, so nothing large is buffered from a peer
  /// before it is authenticated.
  bool hello_only = false;

  /// Largest payload a frame may declare: two values (compare_set) and room for keys. A wait
  /// on many keys must fit in this too (with the default: about 128 MiB of key names).
  std::size_t max_payload_bytes() const {
    if (hello_only) return kMaxHelloFrameBytes - kHeaderBytes;
    return 2 * max_value_bytes + 2 * (kMaxKeyBytes + 4) + 64;
  }
};

/// One parsed frame. The views point into the bytes given to parse_frame, so they are valid
/// as long as those bytes are.
struct Frame {
  MessageType type = MessageType::kOk;
  std::uint64_t timeout_ms = 0;                ///< kGet, kWait
  std::int64_t integer = 0;                    ///< kAdd (delta), kInteger, kHelloOk (max value)
  std::vector<std::string_view> keys;          ///< kSet..kDelete (one), kWait/kCheck/kTimeout (many)
  std::span<const std::uint8_t> value;         ///< kHello token, kSet, kValue, kError, kCompareSet expected
  std::span<const std::uint8_t> second_value;  ///< kCompareSet desired
};

enum class ParseStatus { kNeedMore, kParsed, kError };

/// The outcome of parse_frame.
struct ParseResult {
  ParseStatus status = ParseStatus::kNeedMore;
  /// kParsed: bytes the frame took (parse the rest next). kNeedMore: the frame's total size
  /// once the header is complete (so a reader can reserve exactly that), else 0.
  std::size_t frame_bytes = 0;
  Frame frame;
  std::string error;  ///< kError: why, for a log line
};

namespace wire {

inline std::uint32_t load_u32(const std::uint8_t* p) {
  return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
         static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}
inline std::uint64_t load_u64(const std::uint8_t* p) {
  return static_cast<std::uint64_t>(load_u32(p)) | static_cast<std::uint64_t>(load_u32(p + 4)) << 32;
}
inline void store_u32(std::uint8_t* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}
inline void store_u64(std::uint8_t* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<std::uint8_t>(v >> (8 * i));
}

/// Reads payload fields in order, never past the payload's end. After the first failure every
/// further read fails too, so a layout reads as a plain sequence of calls.
class PayloadReader {
 public:
  explicit PayloadReader(std::span<const std::uint8_t> payload) : payload_(payload) {}

  std::size_t left() const { return payload_.size() - offset_; }
  const std::string& error() const { return error_; }
  bool failed() const { return !error_.empty(); }

  bool u64(std::uint64_t& out, const char* what) {
    if (failed() || !need(8, what)) return false;
    out = load_u64(payload_.data() + offset_);
    offset_ += 8;
    return true;
  }
  bool u32(std::uint32_t& out, const char* what) {
    if (failed() || !need(4, what)) return false;
    out = load_u32(payload_.data() + offset_);
    offset_ += 4;
    return true;
  }
  bool key(std::string_view& out) {
    std::uint32_t length = 0;
    if (!u32(length, "key length")) return false;
    if (length > kMaxKeyBytes) {
      return fail("key length " + std::to_string(length) + " exceeds the limit of " + std::to_string(kMaxKeyBytes) +
                  " bytes");
    }
    if (!need(length, "key")) return false;
    out = std::string_view(reinterpret_cast<const char*>(payload_.data() + offset_), length);
    offset_ += length;
    return true;
  }
  bool bytes(std::span<const std::uint8_t>& out, std::size_t max_bytes, const char* what) {
    std::uint64_t length = 0;
    if (!u64(length, what)) return false;
    if (length > max_bytes) {
      return fail(std::string(what) + " length " + std::to_string(length) + " exceeds the limit of " +
                  std::to_string(max_bytes) + " bytes");
    }
    if (!need(length, what)) return false;
    out = payload_.subspan(offset_, static_cast<std::size_t>(length));
    offset_ += static_cast<std::size_t>(length);
    return true;
  }
  bool keys(std::vector<std::string_view>& out) {
    std::uint32_t count = 0;
    if (!u32(count, "key count")) return false;
    // Each key takes at least its 4-byte length: bound the count by the bytes present before
    // reserving, so a huge count cannot make us allocate.
    if (count > left() / 4) {
      return fail("key count " + std::to_string(count) + " cannot fit in the " + std::to_string(left()) +
                  " payload bytes left");
    }
    out.reserve(count);
    for (std::uint32_t i = 0; i < count; ++i) {
      std::string_view k;
      if (!key(k)) return false;
      out.push_back(k);
    }
    return true;
  }
  bool fail(std::string reason) {
    if (error_.empty()) error_ = std::move(reason);
    return false;
  }

 private:
  bool need(std::uint64_t bytes, const char* what) {
    if (bytes > left()) {
      return fail(std::string(what) + " needs " + std::to_string(bytes) + " bytes but only " + std::to_string(left()) +
                  " remain in the payload");
    }
    return true;
  }

  std::span<const std::uint8_t> payload_;
  std::size_t offset_ = 0;
  std::string error_;
};

inline std::string hex32(std::uint32_t v) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text = "0x";
  for (int shift = 28; shift >= 0; shift -= 4) text.push_back(kDigits[(v >> shift) & 0xF]);
  return text;
}

}  // namespace wire

/// Parses the first frame in `bytes`. Pure: no I/O, no state, no allocation beyond the
/// returned key list (bounded by the bytes given). kNeedMore means `bytes` is a strict prefix
/// of a frame that may still be valid; kError means no continuation can make it valid.
inline ParseResult parse_frame(std::span<const std::uint8_t> bytes, const ParseLimits& limits = {}) {
  ParseResult result;
  auto error = [&](std::string reason) {
    result.status = ParseStatus::kError;
    result.error = std::move(reason);
    result.frame_bytes = 0;
    return std::move(result);
  };
  // Reject a wrong magic as soon as the bytes present contradict it, not only at 4 bytes.
  const std::size_t magic_bytes_present = bytes.size() < 4 ? bytes.size() : 4;
  for (std::size_t i = 0; i < magic_bytes_present; ++i) {
    if (bytes[i] != static_cast<std::uint8_t>(kMagic >> (8 * i))) {
      std::uint8_t seen[4] = {0, 0, 0, 0};
      std::memcpy(seen, bytes.data(), magic_bytes_present);
      return error("bad magic " + wire::hex32(wire::load_u32(seen)) + " (expected " + wire::hex32(kMagic) +
                   "): the peer is not an ncclkit TcpStore client or server");
    }
  }
  if (bytes.size() >= 5 && bytes[4] != kProtocolVersion) {
    return error("protocol version " + std::to_string(bytes[4]) + " is not supported (this side speaks version " +
                 std::to_string(kProtocolVersion) + "); use the same ncclkit version on every rank");
  }
  if (bytes.size() >= 6) {
    const std::uint8_t type = bytes[5];
    const bool known = (type >= 1 && type <= 9) || (type >= 64 && type <= 69);
    if (!known) return error("unknown message type " + std::to_string(type));
    if (limits.hello_only && type != static_cast<std::uint8_t>(MessageType::kHello)) {
      return error("its first frame is '" + message_type_name(type) + "', not the hello handshake");
    }
  }
  if (bytes.size() >= 8 && (bytes[6] != 0 || bytes[7] != 0)) {
    return error("reserved header bytes are not zero");
  }
  if (bytes.size() < kHeaderBytes) return result;  // kNeedMore, size not known yet

  const std::uint64_t payload_bytes = wire::load_u64(bytes.data() + 8);
  const std::size_t max_payload = limits.max_payload_bytes();
  if (payload_bytes > max_payload) {
    if (limits.hello_only) {
      return error("hello frame declares a payload of " + std::to_string(payload_bytes) + " bytes, more than the " +
                   std::to_string(max_payload) + " a token of at most " + std::to_string(kMaxTokenBytes) +
                   " bytes needs");
    }
    return error("frame declares a payload of " + std::to_string(payload_bytes) + " bytes, more than the limit of " +
                 std::to_string(max_payload) + " bytes (max_value_bytes=" + std::to_string(limits.max_value_bytes) +
                 ")");
  }
  const std::size_t total = kHeaderBytes + static_cast<std::size_t>(payload_bytes);
  if (bytes.size() < total) {
    result.frame_bytes = total;
    return result;  // kNeedMore, size known
  }

  Frame& frame = result.frame;
  frame.type = static_cast<MessageType>(bytes[5]);
  wire::PayloadReader reader(bytes.subspan(kHeaderBytes, static_cast<std::size_t>(payload_bytes)));
  std::string_view key;
  std::uint64_t raw = 0;
  switch (frame.type) {
    case MessageType::kHello:
      reader.bytes(frame.value, kMaxTokenBytes, "token");
      break;
    case MessageType::kSet:
      if (reader.key(key)) frame.keys.push_back(key);
      reader.bytes(frame.value, limits.max_value_bytes, "value");
      break;
    case MessageType::kGet:
      reader.u64(frame.timeout_ms, "timeout");
      if (reader.key(key)) frame.keys.push_back(key);
      break;
    case MessageType::kWait:
      reader.u64(frame.timeout_ms, "timeout");
      reader.keys(frame.keys);
      break;
    case MessageType::kCheck:
    case MessageType::kTimeout:
      reader.keys(frame.keys);
      break;
    case MessageType::kAdd:
      if (reader.key(key)) frame.keys.push_back(key);
      if (reader.u64(raw, "delta")) frame.integer = static_cast<std::int64_t>(raw);
      break;
    case MessageType::kCompareSet:
      if (reader.key(key)) frame.keys.push_back(key);
      reader.bytes(frame.value, limits.max_value_bytes, "expected value");
      reader.bytes(frame.second_value, limits.max_value_bytes, "desired value");
      break;
    case MessageType::kDelete:
      if (reader.key(key)) frame.keys.push_back(key);
      break;
    case MessageType::kNumKeys:
    case MessageType::kOk:
      break;
    case MessageType::kHelloOk:
    case MessageType::kInteger:
      if (reader.u64(raw, "integer")) frame.integer = static_cast<std::int64_t>(raw);
      break;
    case MessageType::kValue:
      reader.bytes(frame.value, limits.max_value_bytes, "value");
      break;
    case MessageType::kError:
      reader.bytes(frame.value, limits.max_value_bytes, "error message");
      break;
  }
  if (reader.failed()) {
    return error("malformed " + message_type_name(bytes[5]) + " frame: " + reader.error());
  }
  if (reader.left() != 0) {
    return error("malformed " + message_type_name(bytes[5]) + " frame: " + std::to_string(reader.left()) +
                 " unexpected bytes after the last field");
  }
  result.status = ParseStatus::kParsed;
  result.frame_bytes = total;
  return result;
}

/// Builds frames by appending to a byte buffer: begin(), fields in the order the layout above
/// gives, finish(). Several frames may be appended to one buffer.
class FrameWriter {
 public:
  explicit FrameWriter(std::vector<std::uint8_t>& out) : out_(out) {}

  FrameWriter& begin(MessageType type) {
    start_ = out_.size();
    out_.resize(start_ + kHeaderBytes);
    std::uint8_t* header = out_.data() + start_;
    wire::store_u32(header, kMagic);
    header[4] = kProtocolVersion;
    header[5] = static_cast<std::uint8_t>(type);
    header[6] = 0;
    header[7] = 0;
    wire::store_u64(header + 8, 0);
    return *this;
  }
  FrameWriter& u64(std::uint64_t v) {
    const std::size_t at = out_.size();
    out_.resize(at + 8);
    wire::store_u64(out_.data() + at, v);
    return *this;
  }
  FrameWriter& i64(std::int64_t v) { return u64(static_cast<std::uint64_t>(v)); }
  FrameWriter& key(std::string_view k) {
    const std::size_t at = out_.size();
    out_.resize(at + 4 + k.size());
    wire::store_u32(out_.data() + at, static_cast<std::uint32_t>(k.size()));
    if (!k.empty()) std::memcpy(out_.data() + at + 4, k.data(), k.size());
    return *this;
  }
  FrameWriter& bytes(std::span<const std::uint8_t> b) {
    const std::size_t at = out_.size();
    out_.resize(at + 8 + b.size());
    wire::store_u64(out_.data() + at, b.size());
    if (!b.empty()) std::memcpy(out_.data() + at + 8, b.data(), b.size());
    return *this;
  }
  FrameWriter& bytes(std::string_view text) {
    return bytes(std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(text.data()), text.size()));
  }
  template <class Keys>
  FrameWriter& keys(const Keys& list) {
    u32(static_cast<std::uint32_t>(std::size(list)));
    for (const auto& k : list) key(std::string_view(k));
    return *this;
  }
  /// Writes the payload length into the header of the frame begun last.
  void finish() { wire::store_u64(out_.data() + start_ + 8, out_.size() - start_ - kHeaderBytes); }

 private:
  FrameWriter& u32(std::uint32_t v) {
    const std::size_t at = out_.size();
    out_.resize(at + 4);
    wire::store_u32(out_.data() + at, v);
    return *this;
  }

  std::vector<std::uint8_t>& out_;
  std::size_t start_ = 0;
};

}  // namespace ncclkit::detail::tcp
