// LinePrefixer (launch/output.hpp): whole lines, prefixed, in order, whatever the chunking.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <string>

#include "launch/output.hpp"

using ncclkit::launch::LinePrefixer;

namespace {

/// A pipe whose read end is drained into a string on demand (writes here are small enough
/// for the pipe buffer).
struct CapturePipe {
  int fds[2];
  CapturePipe() { REQUIRE(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0); }
  ~CapturePipe() {
    ::close(fds[0]);
    ::close(fds[1]);
  }
  int write_end() const { return fds[1]; }
  std::string drain() {
    std::string text;
    char buffer[4096];
    ssize_t n;
    while ((n = ::read(fds[0], buffer, sizeof buffer)) > 0) text.append(buffer, static_cast<std::size_t>(n));
    return text;
  }
};

}  // namespace

TEST_CASE("lines are written whole, with the prefix, only once complete; the last partial one at finish()") {
  CapturePipe out, log;
  LinePrefixer lines("[rank 3] ", out.write_end(), log.write_end());
  lines.feed("hel");
  CHECK(out.drain().empty());
  CHECK(lines.pending() == 3);
  lines.feed("lo\nwor");
  CHECK(out.drain() == "[rank 3] hello\n");
  lines.feed("ld\n\nlast");
  CHECK(out.drain() == "[rank 3] world\n[rank 3] \n");
  lines.finish();
  CHECK(out.drain() == "[rank 3] last\n");
  CHECK(log.drain() == "hello\nworld\n\nlast\n");  // the log file has no prefix
  lines.finish();                                  // nothing left: nothing written
  CHECK(out.drain().empty());
}

TEST_CASE("random chunking gives the same output as one piece") {
  std::mt19937 random(12345);
  std::string text;
  for (int line = 0; line < 300; ++line) {
    const int length = static_cast<int>(random() % 40);
    for (int c = 0; c < length; ++c) text.push_back(static_cast<char>('a' + random() % 26));
    text.push_back('\n');
  }
  text += "tail without newline";
  std::string expected;
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t end = text.find('\n', start);
    if (end == std::string::npos) end = text.size();
    expected += "P " + text.substr(start, end - start) + "\n";
    start = end + 1;
  }
  for (int trial = 0; trial < 20; ++trial) {
    CapturePipe out;
    LinePrefixer lines("P ", out.write_end());
    std::string written;
    std::size_t at = 0;
    while (at < text.size()) {
      const std::size_t chunk = std::min<std::size_t>(1 + random() % 50, text.size() - at);
      lines.feed(std::string_view(text).substr(at, chunk));
      at += chunk;
      written += out.drain();
    }
    lines.finish();
    written += out.drain();
    CHECK(written == expected);
  }
}

TEST_CASE("a line longer than the limit is written in prefixed pieces, so memory stays bounded") {
  CapturePipe out;
  LinePrefixer lines("> ", out.write_end(), -1, 8);
  lines.feed("0123456789abcdefXY");  // 18 bytes, no newline
  CHECK(out.drain() == "> 01234567\n> 89abcdef\n");
  CHECK(lines.pending() == 2);
  lines.feed("Z\n");
  CHECK(out.drain() == "> XYZ\n");
  lines.feed("abcdefghijklmnopqrst\n");  // a complete long line
  CHECK(out.drain() == "> abcdefgh\n> ijklmnop\n> qrst\n");
}

TEST_CASE("a closed reader does not stop the prefixer (EPIPE is ignored)") {
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC) == 0);
  ::close(fds[0]);
  struct sigaction ignore {
  }, previous{};
  ignore.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ignore, &previous);
  LinePrefixer lines("x ", fds[1]);
  lines.feed("lost\n");
  lines.finish();
  ::sigaction(SIGPIPE, &previous, nullptr);
  ::close(fds[1]);
  CHECK(lines.pending() == 0);
}

TEST_CASE("a reader that stops reading does not block the writer past the stall limit") {
  int fds[2];
  REQUIRE(::pipe2(fds, O_CLOEXEC | O_NONBLOCK) == 0);
  const std::string block(4096, 'x');
  while (::write(fds[1], block.data(), block.size()) > 0) {
  }  // the pipe is full and nobody reads it
  const auto start = std::chrono::steady_clock::now();
  ncclkit::launch::detail::write_fully(fds[1], block, std::chrono::milliseconds(200));
  const auto waited = std::chrono::steady_clock::now() - start;
  CHECK(waited >= std::chrono::milliseconds(150));
  CHECK(waited < std::chrono::seconds(5));
  ::close(fds[0]);
  ::close(fds[1]);
}
