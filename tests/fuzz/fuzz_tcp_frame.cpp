// Fuzz target for the TcpStore frame parser (ncclkit/store/detail/tcp_protocol.hpp).
//
// Two builds of this one file:
//   libFuzzer:  clang++ -std=c++20 -g -O1 -fsanitize=fuzzer,address -DNCCLKIT_LIBFUZZER \
//                 -Iinclude tests/fuzz/fuzz_tcp_frame.cpp -o fuzz_tcp_frame
//   plain:      g++ -std=c++20 -g -O1 -fsanitize=address,undefined -Iinclude \
//                 tests/fuzz/fuzz_tcp_frame.cpp -o fuzz_tcp_frame_replay
// The plain build replays files and folders given as arguments, writes a seed corpus
// (--write-corpus DIR), or runs random mutations of valid frames (--seconds N [--seed S]),
// so CI can run a smoke test without clang. tests/fuzz/run-smoke.sh does both.
//
// Properties checked on every input, for a tiny and the default value limit, and for the
// limits a server applies before the hello (hello_only):
//   - parse_frame never reads out of bounds or crashes (the sanitizers watch);
//   - with hello_only, only a hello of at most kMaxHelloFrameBytes parses;
//   - an error has a reason; "need more" never claims a size beyond the limits;
//   - a parsed frame re-encodes to exactly the bytes it came from (the encoding is canonical),
//     and its last-byte-short prefix is "need more", never "parsed" or an error.

#include <cstddef>     // std::size_t
#include <cstdint>     // std::uint8_t, std::uint64_t
#include <cstdio>      // std::fprintf, std::fopen
#include <cstdlib>     // std::abort (a failed invariant in a test program)
#include <cstring>     // std::strcmp, std::memcmp
#include <chrono>      // std::chrono: the random mode's time budget
#include <filesystem>  // std::filesystem: replaying corpus folders
#include <fstream>     // std::ifstream, std::ofstream
#include <iterator>    // std::istreambuf_iterator
#include <random>      // std::mt19937_64: random mode
#include <string>      // std::string
#include <vector>      // std::vector

#include "ncclkit/store/detail/tcp_protocol.hpp"

namespace {

namespace tcp = ncclkit::detail::tcp;
using Bytes = std::vector<std::uint8_t>;

void require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "fuzz_tcp_frame: invariant failed: %s\n", what);
    std::abort();
  }
}

/// The encoding of a parsed frame, by the layout in tcp_protocol.hpp.
Bytes encode(const tcp::Frame& f) {
  using tcp::MessageType;
  Bytes out;
  tcp::FrameWriter w(out);
  w.begin(f.type);
  switch (f.type) {
    case MessageType::kHello:
    case MessageType::kValue:
    case MessageType::kError:
      w.bytes(f.value);
      break;
    case MessageType::kSet:
      w.key(f.keys.at(0)).bytes(f.value);
      break;
    case MessageType::kGet:
      w.u64(f.timeout_ms).key(f.keys.at(0));
      break;
    case MessageType::kWait:
      w.u64(f.timeout_ms).keys(f.keys);
      break;
    case MessageType::kCheck:
    case MessageType::kTimeout:
      w.keys(f.keys);
      break;
    case MessageType::kAdd:
      w.key(f.keys.at(0)).i64(f.integer);
      break;
    case MessageType::kCompareSet:
      w.key(f.keys.at(0)).bytes(f.value).bytes(f.second_value);
      break;
    case MessageType::kDelete:
      w.key(f.keys.at(0));
      break;
    case MessageType::kNumKeys:
    case MessageType::kOk:
      break;
    case MessageType::kHelloOk:
    case MessageType::kInteger:
      w.i64(f.integer);
      break;
  }
  w.finish();
  return out;
}

void fuzz_one(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::uint8_t> all(data, size);
  for (const tcp::ParseLimits limits :
       {tcp::ParseLimits{.max_value_bytes = 64}, tcp::ParseLimits{}, tcp::ParseLimits{.hello_only = true}}) {
    std::size_t offset = 0;
    for (int frames = 0; offset < size && frames < 4096; ++frames) {
      const auto rest = all.subspan(offset);
      const auto result = tcp::parse_frame(rest, limits);
      if (result.status == tcp::ParseStatus::kError) {
        require(!result.error.empty(), "an error has a reason");
        require(result.frame_bytes == 0, "an error claims no size");
        break;
      }
      if (result.status == tcp::ParseStatus::kNeedMore) {
        require(result.frame_bytes == 0 || result.frame_bytes > rest.size(), "need-more asks for more than is there");
        require(result.frame_bytes <= tcp::kHeaderBytes + limits.max_payload_bytes(), "need-more stays within limits");
        break;
      }
      require(result.frame_bytes >= tcp::kHeaderBytes && result.frame_bytes <= rest.size(), "parsed size is in range");
      require(!limits.hello_only ||
                  (result.frame.type == tcp::MessageType::kHello && result.frame_bytes <= tcp::kMaxHelloFrameBytes),
              "before authentication only a hello of bounded size parses");
      const Bytes again = encode(result.frame);
      require(again.size() == result.frame_bytes && std::memcmp(again.data(), rest.data(), result.frame_bytes) == 0,
              "a parsed frame re-encodes to the same bytes");
      const auto shorter = tcp::parse_frame(rest.first(result.frame_bytes - 1), limits);
      require(shorter.status == tcp::ParseStatus::kNeedMore, "a frame minus its last byte needs more");
      offset += result.frame_bytes;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz_one(data, size);
  return 0;
}

#ifndef NCCLKIT_LIBFUZZER

namespace {

/// A valid frame of a random type with random contents.
Bytes random_frame(std::mt19937_64& random) {
  using tcp::MessageType;
  auto text = [&](std::size_t max) {
    std::string s(random() % (max + 1), '\0');
    for (auto& c : s) c = static_cast<char>(random());
    return s;
  };
  std::vector<std::string> keys;
  for (std::size_t i = 0, n = random() % 5; i < n; ++i) keys.push_back(text(12));
  static constexpr MessageType kTypes[] = {MessageType::kHello,      MessageType::kSet,     MessageType::kGet,
                                           MessageType::kWait,       MessageType::kCheck,   MessageType::kAdd,
                                           MessageType::kCompareSet, MessageType::kDelete,  MessageType::kNumKeys,
                                           MessageType::kHelloOk,    MessageType::kOk,      MessageType::kValue,
                                           MessageType::kInteger,    MessageType::kTimeout, MessageType::kError};
  tcp::Frame frame;
  frame.type = kTypes[random() % std::size(kTypes)];
  const std::string key = text(16), value = text(80), second = text(80);
  frame.keys = {key};
  if (frame.type == MessageType::kWait || frame.type == MessageType::kCheck || frame.type == MessageType::kTimeout) {
    frame.keys.assign(keys.begin(), keys.end());
  }
  frame.value = std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(value.data()), value.size());
  frame.second_value =
      std::span<const std::uint8_t>(reinterpret_cast<const std::uint8_t*>(second.data()), second.size());
  frame.integer = static_cast<std::int64_t>(random());
  frame.timeout_ms = random() % 100000;
  return encode(frame);
}

/// Damages `bytes` the ways a hostile or broken peer would.
void mutate(std::mt19937_64& random, Bytes& bytes) {
  const int edits = 1 + static_cast<int>(random() % 4);
  for (int e = 0; e < edits && !bytes.empty(); ++e) {
    const std::size_t at = random() % bytes.size();
    switch (random() % 6) {
      case 0:
        bytes[at] ^= static_cast<std::uint8_t>(1u << (random() % 8));
        break;
      case 1:
        bytes[at] = static_cast<std::uint8_t>(random());
        break;
      case 2:
        bytes.resize(at);
        break;   // truncate
      case 3: {  // a huge length somewhere (2^62, 2^32-1, or random)
        const std::uint64_t huge[] = {std::uint64_t{1} << 62, 0xFFFFFFFFull, random()};
        const std::uint64_t v = huge[random() % 3];
        for (int i = 0; i < 8 && at + i < bytes.size(); ++i) bytes[at + i] = static_cast<std::uint8_t>(v >> (8 * i));
        break;
      }
      case 4:
        bytes.insert(bytes.begin() + static_cast<std::ptrdiff_t>(at), static_cast<std::uint8_t>(random()));
        break;
      case 5:
        bytes.erase(bytes.begin() + static_cast<std::ptrdiff_t>(at));
        break;
    }
  }
}

void replay(const std::filesystem::path& path, std::size_t& count) {
  if (std::filesystem::is_directory(path)) {
    for (const auto& entry : std::filesystem::directory_iterator(path)) replay(entry.path(), count);
    return;
  }
  std::ifstream file(path, std::ios::binary);
  const Bytes bytes((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  fuzz_one(bytes.data(), bytes.size());
  ++count;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0;
  std::uint64_t seed = std::random_device{}();
  std::string corpus_out;
  std::vector<std::string> inputs;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--seconds") && i + 1 < argc) {
      seconds = std::stod(argv[++i]);
    } else if (!std::strcmp(argv[i], "--seed") && i + 1 < argc) {
      seed = std::stoull(argv[++i]);
    } else if (!std::strcmp(argv[i], "--write-corpus") && i + 1 < argc) {
      corpus_out = argv[++i];
    } else if (argv[i][0] == '-') {
      std::fprintf(stderr, "usage: %s [--seconds N] [--seed S] [--write-corpus DIR] [FILE|DIR...]\n", argv[0]);
      return 2;
    } else {
      inputs.push_back(argv[i]);
    }
  }
  std::mt19937_64 random(seed);
  if (!corpus_out.empty()) {
    std::filesystem::create_directories(corpus_out);
    for (int i = 0; i < 64; ++i) {
      Bytes bytes = random_frame(random);
      if (i % 4 == 3) {  // some inputs with two frames back to back
        Bytes more = random_frame(random);
        bytes.insert(bytes.end(), more.begin(), more.end());
      }
      std::ofstream(std::filesystem::path(corpus_out) / ("seed-" + std::to_string(i)), std::ios::binary)
          .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    }
    std::printf("fuzz_tcp_frame: wrote 64 seed inputs to %s\n", corpus_out.c_str());
  }
  std::size_t replayed = 0;
  for (const auto& input : inputs) replay(input, replayed);
  if (!inputs.empty()) std::printf("fuzz_tcp_frame: replayed %zu inputs, all invariants held\n", replayed);

  if (seconds > 0) {
    const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    std::size_t runs = 0;
    while (std::chrono::steady_clock::now() < end) {
      for (int batch = 0; batch < 1000; ++batch, ++runs) {
        Bytes bytes = random_frame(random);
        if (random() % 3 == 0) {
          Bytes more = random_frame(random);
          bytes.insert(bytes.end(), more.begin(), more.end());
        }
        if (random() % 8 != 0) mutate(random, bytes);  // 1 in 8 stays valid
        fuzz_one(bytes.data(), bytes.size());
      }
    }
    std::printf("fuzz_tcp_frame: %zu random inputs in %.0f s (seed %llu), all invariants held\n", runs, seconds,
                static_cast<unsigned long long>(seed));
  }
  return 0;
}

#endif  // NCCLKIT_LIBFUZZER
