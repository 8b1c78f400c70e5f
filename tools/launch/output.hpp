#pragma once
/// Worker output, line by line: `LinePrefixer` turns the bytes a worker writes into a pipe
/// into whole lines, each written with the worker's prefix ("[rank 3] ") to the launcher's
/// output and, without the prefix, to the rank's log file. A line is never split or mixed
/// with another worker's: every line reaches the launcher's output in one piece, and only the
/// launcher writes there. A last line without '\n' is written (with a '\n' added) by finish().
///
/// A line longer than `max_line` bytes is written in pieces of that size, each with the
/// prefix, so that a worker that never writes '\n' (a progress bar drawn with '\r') cannot
/// make the launcher's memory grow without bound.

#include <errno.h>   // errno, EINTR, EAGAIN
#include <poll.h>    // poll, POLLOUT
#include <unistd.h>  // write

#include <algorithm>    // std::min
#include <chrono>       // std::chrono::milliseconds, steady_clock
#include <cstddef>      // std::size_t
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <utility>      // std::move

namespace ncclkit::launch {

namespace detail {

/// How long write_fully waits for a full output to take more bytes before it drops the rest:
/// a terminal paused with Ctrl-S or a pipe whose reader stopped reading must not stop the
/// launcher from supervising its workers.
inline constexpr std::chrono::milliseconds kOutputStallLimit{10000};

/// Writes all of `data` to `fd`, retrying after EINTR and waiting out EAGAIN (a non-blocking
/// descriptor that is full) for at most `stall_limit` without progress. Gives up silently when
/// the reader is gone (EPIPE), on another error, or after the stall limit: losing output must
/// never stop the launcher from supervising its workers.
inline void write_fully(int fd, std::string_view data, std::chrono::milliseconds stall_limit = kOutputStallLimit) {
  using Clock = std::chrono::steady_clock;
  auto give_up = Clock::now() + stall_limit;
  while (!data.empty()) {
    const ssize_t written = ::write(fd, data.data(), data.size());
    if (written > 0) {
      data.remove_prefix(static_cast<std::size_t>(written));
      give_up = Clock::now() + stall_limit;
      continue;
    }
    if (written < 0 && errno == EINTR) continue;
    if (written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(give_up - Clock::now()).count();
      if (left <= 0) return;
      pollfd p{fd, POLLOUT, 0};
      ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 100)));
      continue;
    }
    return;
  }
}

}  // namespace detail

/// Splits one stream into whole lines and writes them with a prefix. Not thread-safe; one
/// object per worker stream (stdout and stderr each have their own).
class LinePrefixer {
 public:
  /// Lines go to `out_fd` as prefix + line + '\n', and (when `log_fd` >= 0) to `log_fd` as
  /// line + '\n'. The descriptors are borrowed, not closed.
  LinePrefixer(std::string prefix, int out_fd, int log_fd = -1, std::size_t max_line = 64 * 1024)
      : prefix_(std::move(prefix)), out_fd_(out_fd), log_fd_(log_fd), max_line_(max_line == 0 ? 1 : max_line) {}

  /// Takes the next bytes of the stream; writes every line they complete (all in one write
  /// per destination) and keeps the unfinished rest.
  void feed(std::string_view bytes) {
    std::string out, log;
    std::size_t start = 0;
    while (start < bytes.size()) {
      const std::size_t newline = bytes.find('\n', start);
      if (newline == std::string_view::npos) {
        pending_.append(bytes.substr(start));
        while (pending_.size() >= max_line_) {
          emit(std::string_view(pending_).substr(0, max_line_), out, log);
          pending_.erase(0, max_line_);
        }
        break;
      }
      std::string_view tail = bytes.substr(start, newline - start);
      if (!pending_.empty()) {
        pending_.append(tail);
        std::string_view whole = pending_;
        while (whole.size() > max_line_) {
          emit(whole.substr(0, max_line_), out, log);
          whole.remove_prefix(max_line_);
        }
        emit(whole, out, log);
        pending_.clear();
      } else {
        while (tail.size() > max_line_) {
          emit(tail.substr(0, max_line_), out, log);
          tail.remove_prefix(max_line_);
        }
        emit(tail, out, log);
      }
      start = newline + 1;
    }
    flush(out, log);
  }

  /// The stream has ended: writes the unfinished last line, if any, with a '\n' added.
  void finish() {
    if (pending_.empty()) return;
    std::string out, log;
    emit(pending_, out, log);
    pending_.clear();
    flush(out, log);
  }

  /// Bytes held back, waiting for their '\n'.
  std::size_t pending() const { return pending_.size(); }
  const std::string& prefix() const { return prefix_; }

 private:
  void emit(std::string_view line, std::string& out, std::string& log) const {
    out.append(prefix_).append(line).push_back('\n');
    if (log_fd_ >= 0) log.append(line).push_back('\n');
  }
  void flush(const std::string& out, const std::string& log) const {
    if (!out.empty() && out_fd_ >= 0) detail::write_fully(out_fd_, out);
    if (!log.empty() && log_fd_ >= 0) detail::write_fully(log_fd_, log);
  }

  std::string prefix_;
  int out_fd_;
  int log_fd_;
  std::size_t max_line_;
  std::string pending_;
};

}  // namespace ncclkit::launch
