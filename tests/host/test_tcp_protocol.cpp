// Tests of ncclkit/store/detail/tcp_protocol.hpp: parse_frame on hand-made frames (every
// field written out byte by byte, independent of FrameWriter), FrameWriter round trips, and
// the rejection of every kind of malformed input.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <cstdint>  // std::uint8_t, std::uint64_t
#include <random>   // std::mt19937_64: random payloads
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/store/detail/tcp_protocol.hpp"

namespace tcp = ncclkit::detail::tcp;
using Bytes = std::vector<std::uint8_t>;

namespace {

void put_u32(Bytes& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_u64(Bytes& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::uint8_t>(v >> (8 * i)));
}
void put_text(Bytes& out, const std::string& text) { out.insert(out.end(), text.begin(), text.end()); }

/// A frame assembled by hand: header with `type`, then `payload` as given.
Bytes hand_frame(std::uint8_t type, const Bytes& payload, std::uint64_t declared = UINT64_MAX) {
  Bytes out = {'N', 'K', 'T', 'S', 1, type, 0, 0};
  put_u64(out, declared == UINT64_MAX ? payload.size() : declared);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

tcp::ParseResult parse(const Bytes& bytes, tcp::ParseLimits limits = {}) {
  return tcp::parse_frame(std::span<const std::uint8_t>(bytes), limits);
}

std::string view_text(std::span<const std::uint8_t> bytes) { return std::string(bytes.begin(), bytes.end()); }

}  // namespace

TEST_CASE("a hand-made set frame parses into its key and value") {
  Bytes payload;
  put_u32(payload, 5);
  put_text(payload, "alpha");
  put_u64(payload, 3);
  put_text(payload, "xyz");
  const Bytes frame = hand_frame(2, payload);
  auto result = parse(frame);
  REQUIRE_MESSAGE(result.status == tcp::ParseStatus::kParsed, result.error);
  CHECK(result.frame_bytes == frame.size());
  CHECK(result.frame.type == tcp::MessageType::kSet);
  REQUIRE(result.frame.keys.size() == 1);
  CHECK(result.frame.keys[0] == "alpha");
  CHECK(view_text(result.frame.value) == "xyz");
}

TEST_CASE("the magic is the bytes NKTS and the header is 16 bytes") {
  Bytes out;
  tcp::FrameWriter(out).begin(tcp::MessageType::kNumKeys).finish();
  REQUIRE(out.size() == tcp::kHeaderBytes);
  CHECK(out[0] == 'N');
  CHECK(out[1] == 'K');
  CHECK(out[2] == 'T');
  CHECK(out[3] == 'S');
  CHECK(out[4] == tcp::kProtocolVersion);
  CHECK(out[5] == 9);
}

TEST_CASE("every strict prefix of a valid frame needs more bytes; the size is known after the header") {
  Bytes payload;
  put_u64(payload, 1500);  // timeout
  put_u32(payload, 2);
  put_u32(payload, 1);
  put_text(payload, "a");
  put_u32(payload, 3);
  put_text(payload, "bcd");
  const Bytes frame = hand_frame(4, payload);
  for (std::size_t n = 0; n < frame.size(); ++n) {
    auto result = tcp::parse_frame(std::span<const std::uint8_t>(frame.data(), n));
    REQUIRE_MESSAGE(result.status == tcp::ParseStatus::kNeedMore, "prefix of " << n << " bytes: " << result.error);
    CHECK(result.frame_bytes == (n >= tcp::kHeaderBytes ? frame.size() : 0));
  }
  auto result = parse(frame);
  REQUIRE(result.status == tcp::ParseStatus::kParsed);
  CHECK(result.frame.type == tcp::MessageType::kWait);
  CHECK(result.frame.timeout_ms == 1500);
  REQUIRE(result.frame.keys.size() == 2);
  CHECK(result.frame.keys[0] == "a");
  CHECK(result.frame.keys[1] == "bcd");
}

TEST_CASE("two frames back to back parse one at a time") {
  Bytes out;
  tcp::FrameWriter writer(out);
  writer.begin(tcp::MessageType::kAdd).key("counter").i64(-7);
  writer.finish();
  writer.begin(tcp::MessageType::kDelete).key("gone");
  writer.finish();
  auto first = parse(out);
  REQUIRE(first.status == tcp::ParseStatus::kParsed);
  CHECK(first.frame.type == tcp::MessageType::kAdd);
  CHECK(first.frame.integer == -7);
  auto second = tcp::parse_frame(std::span<const std::uint8_t>(out).subspan(first.frame_bytes));
  REQUIRE(second.status == tcp::ParseStatus::kParsed);
  CHECK(second.frame.type == tcp::MessageType::kDelete);
  CHECK(second.frame.keys[0] == "gone");
  CHECK(first.frame_bytes + second.frame_bytes == out.size());
}

TEST_CASE("FrameWriter round trips every message type with random contents") {
  std::mt19937_64 random(20240607);
  auto random_bytes = [&](std::size_t n) {
    Bytes b(n);
    for (auto& x : b) x = static_cast<std::uint8_t>(random());
    return b;
  };
  for (int trial = 0; trial < 200; ++trial) {
    const Bytes key_bytes = random_bytes(1 + random() % 40);
    const std::string key(key_bytes.begin(), key_bytes.end());
    const Bytes value = random_bytes(random() % 300);
    const Bytes second = random_bytes(random() % 300);
    const std::int64_t number = static_cast<std::int64_t>(random());
    const std::uint64_t timeout = random() % 1000000;
    std::vector<std::string> keys;
    for (std::size_t i = 0, n = random() % 6; i < n; ++i) {
      const Bytes k = random_bytes(random() % 20);
      keys.emplace_back(k.begin(), k.end());
    }
    Bytes out;
    tcp::FrameWriter w(out);
    const int which = trial % 9;
    switch (which) {
      case 0:
        w.begin(tcp::MessageType::kHello).bytes(value);
        break;
      case 1:
        w.begin(tcp::MessageType::kSet).key(key).bytes(value);
        break;
      case 2:
        w.begin(tcp::MessageType::kGet).u64(timeout).key(key);
        break;
      case 3:
        w.begin(tcp::MessageType::kWait).u64(timeout).keys(keys);
        break;
      case 4:
        w.begin(tcp::MessageType::kCheck).keys(keys);
        break;
      case 5:
        w.begin(tcp::MessageType::kAdd).key(key).i64(number);
        break;
      case 6:
        w.begin(tcp::MessageType::kCompareSet).key(key).bytes(value).bytes(second);
        break;
      case 7:
        w.begin(tcp::MessageType::kTimeout).keys(keys);
        break;
      case 8:
        w.begin(tcp::MessageType::kInteger).i64(number);
        break;
    }
    w.finish();
    auto result = parse(out);
    REQUIRE_MESSAGE(result.status == tcp::ParseStatus::kParsed, result.error);
    CHECK(result.frame_bytes == out.size());
    const auto& f = result.frame;
    switch (which) {
      case 0:
        CHECK(Bytes(f.value.begin(), f.value.end()) == value);
        break;
      case 1:
        CHECK(f.keys[0] == key);
        CHECK(Bytes(f.value.begin(), f.value.end()) == value);
        break;
      case 2:
        CHECK(f.keys[0] == key);
        CHECK(f.timeout_ms == timeout);
        break;
      case 3:
      case 7:
      case 4:
        REQUIRE(f.keys.size() == keys.size());
        for (std::size_t i = 0; i < keys.size(); ++i) CHECK(f.keys[i] == keys[i]);
        if (which == 3) CHECK(f.timeout_ms == timeout);
        break;
      case 5:
        CHECK(f.keys[0] == key);
        CHECK(f.integer == number);
        break;
      case 6:
        CHECK(Bytes(f.value.begin(), f.value.end()) == value);
        CHECK(Bytes(f.second_value.begin(), f.second_value.end()) == second);
        break;
      case 8:
        CHECK(f.integer == number);
        break;
    }
  }
}

TEST_CASE("a wrong magic is an error as soon as the first byte differs") {
  const Bytes http = {'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P'};
  for (std::size_t n = 1; n <= http.size(); ++n) {
    auto result = tcp::parse_frame(std::span<const std::uint8_t>(http.data(), n));
    REQUIRE(result.status == tcp::ParseStatus::kError);
    CHECK(result.error.find("bad magic") != std::string::npos);
  }
  Bytes almost = {'N', 'K', 'T', 'X'};
  CHECK(parse(almost).status == tcp::ParseStatus::kError);
  CHECK(parse(Bytes{'N', 'K'}).status == tcp::ParseStatus::kNeedMore);
  CHECK(parse(Bytes{}).status == tcp::ParseStatus::kNeedMore);
}

TEST_CASE("a wrong version, an unknown type and non-zero reserved bytes are errors") {
  Bytes frame = hand_frame(9, {});
  frame[4] = 2;
  auto version = parse(frame);
  REQUIRE(version.status == tcp::ParseStatus::kError);
  CHECK(version.error.find("version 2") != std::string::npos);

  frame = hand_frame(9, {});
  for (int type : {0, 10, 63, 70, 255}) {
    frame[5] = static_cast<std::uint8_t>(type);
    auto result = parse(frame);
    REQUIRE(result.status == tcp::ParseStatus::kError);
    CHECK(result.error.find("unknown message type " + std::to_string(type)) != std::string::npos);
  }
  frame = hand_frame(9, {});
  frame[7] = 1;
  CHECK(parse(frame).status == tcp::ParseStatus::kError);
}

TEST_CASE("a 2^62 payload length in the header is rejected from the header alone") {
  Bytes header = {'N', 'K', 'T', 'S', 1, 2, 0, 0};
  put_u64(header, std::uint64_t{1} << 62);
  auto result = parse(header);  // nothing follows the header: no need to see the payload
  REQUIRE(result.status == tcp::ParseStatus::kError);
  CHECK(result.error.find("4611686018427387904") != std::string::npos);
  CHECK(result.frame_bytes == 0);
}

TEST_CASE("the payload limit follows max_value_bytes") {
  tcp::ParseLimits small{.max_value_bytes = 1000};
  Bytes payload;
  put_u32(payload, 1);
  put_text(payload, "k");
  put_u64(payload, 1001);
  payload.resize(payload.size() + 1001, 0x5A);
  auto result = parse(hand_frame(2, payload), small);
  REQUIRE(result.status == tcp::ParseStatus::kError);
  CHECK(result.error.find("value length 1001 exceeds the limit of 1000") != std::string::npos);

  // A header announcing more than the payload limit is refused before any payload arrives.
  Bytes header = {'N', 'K', 'T', 'S', 1, 2, 0, 0};
  put_u64(header, small.max_payload_bytes() + 1);
  CHECK(parse(header, small).status == tcp::ParseStatus::kError);
  Bytes at_limit = {'N', 'K', 'T', 'S', 1, 2, 0, 0};
  put_u64(at_limit, small.max_payload_bytes());
  CHECK(parse(at_limit, small).status == tcp::ParseStatus::kNeedMore);
}

TEST_CASE("inner lengths may not claim more than the payload holds") {
  SUBCASE("a 2^62 value length inside a small frame") {
    Bytes payload;
    put_u32(payload, 1);
    put_text(payload, "k");
    put_u64(payload, std::uint64_t{1} << 62);
    put_text(payload, "tiny");
    auto result = parse(hand_frame(2, payload));
    REQUIRE(result.status == tcp::ParseStatus::kError);
    CHECK(result.error.find("exceeds the limit") != std::string::npos);
  }
  SUBCASE("a value length larger than the bytes left") {
    Bytes payload;
    put_u32(payload, 1);
    put_text(payload, "k");
    put_u64(payload, 10);
    put_text(payload, "short");
    auto result = parse(hand_frame(2, payload));
    REQUIRE(result.status == tcp::ParseStatus::kError);
    CHECK(result.error.find("only 5 remain") != std::string::npos);
  }
  SUBCASE("a key longer than 64 KiB") {
    Bytes payload;
    put_u32(payload, 65537);
    auto result = parse(hand_frame(8, payload));
    REQUIRE(result.status == tcp::ParseStatus::kError);
    CHECK(result.error.find("key length 65537") != std::string::npos);
  }
  SUBCASE("a key count that cannot fit") {
    Bytes payload;
    put_u32(payload, 0xFFFFFFFFu);
    put_u32(payload, 0);
    auto result = parse(hand_frame(5, payload));
    REQUIRE(result.status == tcp::ParseStatus::kError);
    CHECK(result.error.find("key count 4294967295") != std::string::npos);
  }
  SUBCASE("a truncated field") {
    Bytes payload;
    put_u32(payload, 3);
    put_text(payload, "key");
    put_u32(payload, 7);  // half of the i64 delta
    auto result = parse(hand_frame(6, payload));
    REQUIRE(result.status == tcp::ParseStatus::kError);
    CHECK(result.error.find("delta needs 8 bytes") != std::string::npos);
  }
  SUBCASE("bytes after the last field") {
    Bytes payload;
    put_u32(payload, 1);
    put_text(payload, "k");
    payload.push_back(0);
    auto result = parse(hand_frame(8, payload));
    REQUIRE(result.status == tcp::ParseStatus::kError);
    CHECK(result.error.find("1 unexpected bytes") != std::string::npos);
  }
}

TEST_CASE("zero-length keys and values are valid") {
  Bytes out;
  tcp::FrameWriter(out).begin(tcp::MessageType::kSet).key("").bytes(std::string_view()).finish();
  auto result = parse(out);
  REQUIRE(result.status == tcp::ParseStatus::kParsed);
  CHECK(result.frame.keys[0].empty());
  CHECK(result.frame.value.empty());
}

TEST_CASE("before authentication (hello_only) only a hello of at most kMaxHelloFrameBytes parses") {
  const tcp::ParseLimits hello_only{.hello_only = true};
  // Any other type is refused from its type byte, before its length is known.
  const Bytes set_prefix = {'N', 'K', 'T', 'S', 1, 2};
  auto refused = parse(set_prefix, hello_only);
  REQUIRE(refused.status == tcp::ParseStatus::kError);
  CHECK(refused.error.find("'set', not the hello handshake") != std::string::npos);
  CHECK(parse(set_prefix).status == tcp::ParseStatus::kNeedMore);  // fine once authenticated

  // A hello announcing more than a token of kMaxTokenBytes needs is refused from its header.
  Bytes big_hello = {'N', 'K', 'T', 'S', 1, 1, 0, 0};
  put_u64(big_hello, std::uint64_t{100} << 20);
  auto too_big = parse(big_hello, hello_only);
  REQUIRE(too_big.status == tcp::ParseStatus::kError);
  CHECK(too_big.error.find("a token of at most 4096 bytes needs") != std::string::npos);

  // The largest token fits exactly; one byte more does not, whatever the limits.
  Bytes largest;
  put_u64(largest, tcp::kMaxTokenBytes);
  largest.resize(largest.size() + tcp::kMaxTokenBytes, 't');
  const Bytes frame = hand_frame(1, largest);
  CHECK(frame.size() == tcp::kMaxHelloFrameBytes);
  auto parsed = parse(frame, hello_only);
  REQUIRE(parsed.status == tcp::ParseStatus::kParsed);
  CHECK(parsed.frame.value.size() == tcp::kMaxTokenBytes);
  Bytes longer;
  put_u64(longer, tcp::kMaxTokenBytes + 1);
  longer.resize(longer.size() + tcp::kMaxTokenBytes + 1, 't');
  CHECK(parse(hand_frame(1, longer), hello_only).status == tcp::ParseStatus::kError);
  CHECK(parse(hand_frame(1, longer)).status == tcp::ParseStatus::kError);
}
