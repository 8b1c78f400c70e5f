// The TcpStore server (ncclkit/store/tcp_store.hpp) under abuse from hostile or broken peers:
// descriptor exhaustion, a client that never reads its replies, large frames before the
// token is proven, connections that never finish their handshake, and a peer that makes the
// server log in a loop. Where the failure is the server process's (it stops answering,
// crashes, grows, floods its log or ignores SIGTERM), the server runs in a forked child with
// its stderr in a file, and the test talks to it over real sockets on 127.0.0.1.
#include <doctest/doctest.h>

#include <signal.h>        // kill, sigwait, sigprocmask
#include <sys/resource.h>  // setrlimit(RLIMIT_NOFILE)
#include <sys/socket.h>    // send
#include <sys/wait.h>      // waitpid
#include <fcntl.h>         // open
#include <stdlib.h>        // setenv, unsetenv
#include <unistd.h>        // fork, pipe, _exit

#include <chrono>    // std::chrono
#include <cstdint>   // std::uint8_t
#include <cstdlib>   // std::getenv
#include <fstream>   // std::ifstream: the child's log and /proc/PID/status
#include <optional>  // std::optional
#include <random>    // std::mt19937_64
#include <sstream>   // std::stringstream
#include <string>    // std::string
#include <thread>    // std::thread, std::this_thread::sleep_for
#include <vector>    // std::vector

#include "ncclkit/core/log.hpp"
#include "ncclkit/store/tcp_store.hpp"
#include "support/raw_tcp_peer.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"

using namespace std::chrono_literals;
using ncclkit::Bytes;
using ncclkit::TcpStore;
using ncclkit::TcpStoreOptions;
using ncclkit::TcpStoreServerOptions;
using ncclkit::detail::Socket;
namespace tcp = ncclkit::detail::tcp;
using Clock = std::chrono::steady_clock;

using namespace ncclkit_test;

namespace {

using ncclkit_test::contains;

std::size_t count_of(const std::string& text, const std::string& part) {
  std::size_t count = 0;
  for (auto at = text.find(part); at != std::string::npos; at = text.find(part, at + part.size())) ++count;
  return count;
}

TcpStoreOptions client_of(int port, std::chrono::milliseconds timeout = 5s, std::string token = "") {
  return TcpStoreOptions{.host = "127.0.0.1", .port = port, .timeout = timeout, .token = std::move(token)};
}

/// Sends what the socket takes within 2 s; false when the server closed it first.
bool try_send(const Socket& socket, const Bytes& bytes) {
  int error = 0;
  return ncclkit::detail::send_all(socket.get(), bytes.data(), bytes.size(), Clock::now() + 2s, error) ==
         ncclkit::detail::IoStatus::kDone;
}

/// Whether `store` answers a get of `key` with `value` within `limit`.
bool answers_within(TcpStore& store, const std::string& key, const std::string& value,
                    std::chrono::milliseconds limit) {
  const auto start = Clock::now();
  try {
    if (store.get_string(key, limit) != value) return false;
  } catch (const std::exception& e) {
    MESSAGE("the good client failed: " << std::string(e.what()));
    return false;
  }
  const auto took = Clock::now() - start;
  if (took > limit)
    MESSAGE("answered after " << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms");
  return took <= limit;
}

/// A TcpStoreServer in a forked child process, with its stderr in a file. The child blocks
/// SIGTERM and waits for it on its main thread, then destroys the server and exits 0, as a
/// launcher does; a server that cannot stop leaves the child running (killed at the end).
class ServerProcess {
 public:
  /// `descriptor_limit`: the child's RLIMIT_NOFILE (0: unchanged).
  explicit ServerProcess(TcpStoreServerOptions options, rlim_t descriptor_limit = 0)
      : dir_("tcp-abuse"), log_path_(dir_.path + "/server.log") {
    int report[2];
    REQUIRE(::pipe(report) == 0);
    const int log = ::open(log_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    REQUIRE(log >= 0);
    pid_ = ::fork();
    REQUIRE(pid_ >= 0);
    if (pid_ == 0) {
      ::dup2(log, 2);
      for (int fd = 3; fd < 4096; ++fd) {
        if (fd != report[1]) ::close(fd);
      }
      sigset_t term;
      sigemptyset(&term);
      sigaddset(&term, SIGTERM);
      ::sigprocmask(SIG_BLOCK, &term, nullptr);  // the server's thread inherits the mask
      if (descriptor_limit > 0) {
        rlimit limit{};
        ::getrlimit(RLIMIT_NOFILE, &limit);
        limit.rlim_cur = descriptor_limit;
        ::setrlimit(RLIMIT_NOFILE, &limit);
      }
      ncclkit::set_log_level(ncclkit::LogLevel::kWarn);
      int port = -1;
      try {
        ncclkit::TcpStoreServer server(options);
        port = server.port();
        [[maybe_unused]] auto ignored = ::write(report[1], &port, sizeof port);
        ::close(report[1]);
        timespec limit{60, 0};
        ::sigtimedwait(&term, nullptr, &limit);
      } catch (const std::exception& e) {
        ncclkit::log_error(std::string("server process: ") + e.what());
        if (port < 0) [[maybe_unused]]
          auto ignored = ::write(report[1], &port, sizeof port);
        ::_exit(3);
      }
      ::_exit(0);  // after the server's destructor returned
    }
    ::close(log);
    ::close(report[1]);
    int port = -1;
    const bool got = ::read(report[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port);
    ::close(report[0]);
    REQUIRE_MESSAGE((got && port > 0), "the server process did not start: " << this->log());
    port_ = port;
  }

  ~ServerProcess() {
    if (pid_ > 0) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }

  std::string log() const {
    std::ifstream in(log_path_);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  std::size_t log_lines() const { return count_of(log(), "\n"); }

  /// A field of /proc/PID/status in KiB ("VmRSS", "VmHWM": the peak resident size).
  long status_kib(const std::string& field) const {
    std::ifstream in("/proc/" + std::to_string(pid_) + "/status");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind(field + ":", 0) == 0) return std::stol(line.substr(field.size() + 1));
    }
    return -1;
  }

  /// SIGTERM, then waits up to `limit`; true when the child exited 0 (its server stopped).
  bool terminate(std::chrono::milliseconds limit) {
    ::kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + limit;
    for (;;) {
      int status = 0;
      const pid_t done = ::waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        pid_ = -1;
        return WIFEXITED(status) && WEXITSTATUS(status) == 0;
      }
      if (Clock::now() >= deadline) return false;
      std::this_thread::sleep_for(10ms);
    }
  }

 private:
  ncclkit_test::TempDir dir_;
  std::string log_path_;
  pid_t pid_ = -1;
  int port_ = -1;
};

/// Sets an environment variable for one scope.
/// Sets an environment variable for a scope, then restores what it was.
struct ScopedEnv {
  const char* name;
  std::optional<std::string> before;
  ScopedEnv(const char* n, const char* value) : name(n) {
    if (const char* old = std::getenv(name)) before = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() { before ? ::setenv(name, before->c_str(), 1) : ::unsetenv(name); }
};

/// A server without a token whatever NCCLKIT_STORE_TOKEN says (the tests' clients send none).
/// Made when called: its defaults (the handshake timeout) read the environment a test sets.
TcpStoreServerOptions no_token() { return TcpStoreServerOptions{.token = ""}; }

}  // namespace

TEST_CASE("out of descriptors: the server serves its clients, refuses new ones quietly, recovers, and stops") {
  // Idle connections must be closed by the test here, not by the handshake timeout.
  ScopedEnv patient("NCCLKIT_STORE_HANDSHAKE_TIMEOUT", "60");
  ServerProcess server(no_token(), 64);
  TcpStore good(client_of(server.port(), 3s));
  good.set("k", "v");

  // More idle connections (no bytes, no hello) than the server has descriptors for.
  std::vector<Socket> idle;
  for (int i = 0; i < 100; ++i) idle.push_back(raw_connect(server.port()));
  std::this_thread::sleep_for(300ms);

  const auto start = Clock::now();
  for (int i = 0; i < 5; ++i) CHECK(answers_within(good, "k", "v", 1000ms));
  MESSAGE("5 gets while out of descriptors took "
          << std::chrono::duration<double, std::milli>(Clock::now() - start).count() << " ms in all");
  // More connections keep arriving and are refused; the log says so a few times, not thousands.
  for (int i = 0; i < 50; ++i) raw_connect(server.port());
  std::this_thread::sleep_for(500ms);
  CHECK(answers_within(good, "k", "v", 1000ms));
  const std::string log = server.log();
  CHECK_MESSAGE(count_of(log, "out of file descriptors") >= 1, log.substr(0, 2000));
  CHECK(contains(log, "limit of 64"));
  CHECK_MESSAGE(server.log_lines() <= 5, server.log_lines() << " log lines: " << log.substr(0, 2000));
  MESSAGE("log lines while out of descriptors: " << server.log_lines()
                                                 << "; the first: " << log.substr(0, log.find('\n')));

  // Once the idle connections close, new clients are served again.
  idle.clear();
  std::optional<TcpStore> fresh;
  CHECK_NOTHROW(fresh.emplace(client_of(server.port(), 5s)));
  if (fresh) {
    fresh->set("k2", "v2");
    CHECK(answers_within(good, "k2", "v2", 1000ms));
  }
  fresh.reset();
  CHECK_MESSAGE(server.terminate(5s),
                "the server process did not stop on SIGTERM; log: " << server.log().substr(0, 2000));
}

TEST_CASE("a client that never reads its replies is disconnected before the server queues them") {
  ServerProcess server(no_token());
  TcpStore good(client_of(server.port(), 5s));
  std::mt19937_64 random(5);
  Bytes big(4 << 20);
  for (auto& b : big) b = static_cast<std::uint8_t>(random());
  good.set("big", big);
  good.set("small", "s");
  CHECK(good.get("big") == big);
  const long before = server.status_kib("VmHWM");

  // 100 pipelined gets of the 4 MiB value (3.1 KB of requests) from a peer that reads nothing.
  Socket greedy = raw_connect(server.port());
  Bytes requests = hello_frame();
  for (int i = 0; i < 100; ++i) {
    tcp::FrameWriter(requests).begin(tcp::MessageType::kGet).u64(0).key("big").finish();
  }
  try_send(greedy, requests);
  std::this_thread::sleep_for(300ms);
  for (int i = 0; i < 5; ++i) CHECK(answers_within(good, "small", "s", 1000ms));
  CHECK(closed_within(greedy, 5s));
  const long after = server.status_kib("VmHWM");
  MESSAGE("server peak RSS: " << before / 1024 << " MiB before, " << after / 1024 << " MiB after the attack");
  // One queued reply (4 MiB) is allowed; 100 of them (400 MiB) are not.
  CHECK(after - before < 40 * 1024);
  CHECK_MESSAGE(contains(server.log(), "does not read its replies"), server.log());
  CHECK(good.get("big") == big);
  CHECK(server.terminate(5s));
}

TEST_CASE("before its token is proven, a peer can make the server buffer only a hello's worth") {
  ServerProcess server({.token = "right-token"});
  TcpStore good(client_of(server.port(), 5s, "right-token"));
  good.set("k", "v");
  const long before = server.status_kib("VmHWM");

  // Four peers announce a 120 MiB hello and send 24 MiB of it; four more skip the hello.
  std::vector<Socket> peers;
  Bytes filler(24 << 20, 'x');
  for (int i = 0; i < 8; ++i) {
    peers.push_back(raw_connect(server.port()));
    const auto type = i < 4 ? tcp::MessageType::kHello : tcp::MessageType::kSet;
    try_send(peers.back(), frame_header(type, std::uint64_t{120} << 20));
    try_send(peers.back(), filler);  // fails early once the server has closed the connection
  }
  for (auto& peer : peers) CHECK(closed_within(peer, 2s));
  const long after = server.status_kib("VmHWM");
  MESSAGE("server peak RSS: " << before / 1024 << " MiB before, " << after / 1024 << " MiB after the peers");
  CHECK(after - before < 16 * 1024);
  CHECK(answers_within(good, "k", "v", 1000ms));

  // A token longer than any hello may carry is refused at the header too.
  Socket long_token = raw_connect(server.port());
  try_send(long_token, hello_frame(std::string(tcp::kMaxTokenBytes + 1, 't')));
  CHECK(closed_within(long_token, 2s));
  CHECK(server.terminate(5s));
}

TEST_CASE(
    "a connection that does not finish its handshake, or stalls mid-frame, is closed after the handshake timeout") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  ScopedEnv quick("NCCLKIT_STORE_HANDSHAKE_TIMEOUT", "0.3");
  ncclkit::TcpStoreServer server(no_token());
  TcpStore waiter(client_of(server.port()));
  TcpStore setter(client_of(server.port()));

  // The server's deadline starts at its accept, after this: a close before 300 ms of it is early.
  const auto start = Clock::now();
  Socket silent = raw_connect(server.port());
  Socket half_hello = raw_connect(server.port());
  const Bytes hello = hello_frame();
  try_send(half_hello, Bytes(hello.begin(), hello.begin() + 10));
  Socket stalled = raw_connect(server.port());
  Bytes partial = hello;
  const Bytes set_header = frame_header(tcp::MessageType::kSet, 100);
  partial.insert(partial.end(), set_header.begin(), set_header.end());
  try_send(stalled, partial);
  Socket authenticated_idle = raw_connect(server.port());
  try_send(authenticated_idle, hello);

  // An authenticated client parked on a get for longer than the timeout is not touched.
  std::string got;
  std::thread parked([&] {
    try {
      got = waiter.get_string("late", 5s);
    } catch (const std::exception& e) {
      got = std::string("threw: ") + e.what();
    }
  });
  CHECK(closed_within(silent, 3s));
  CHECK(Clock::now() - start >= 250ms);
  CHECK(closed_within(half_hello, 3s));
  CHECK(closed_within(stalled, 3s));
  std::this_thread::sleep_for(500ms);
  setter.set("late", "value");
  parked.join();
  CHECK(got == "value");
  // Idle after its hello: still open (its hello-ok reply is all it gets).
  CHECK_FALSE(closed_within(authenticated_idle, 300ms));
  CHECK(waiter.get_string("late") == "value");
  ncclkit::set_log_level(ncclkit::LogLevel::kWarn);
}

TEST_CASE("a peer that reconnects with a wrong token in a loop makes a few log lines, not one per attempt") {
  ServerProcess server({.token = "right-token"});
  TcpStore good(client_of(server.port(), 5s, "right-token"));
  good.set("k", "v");
  int rejected = 0;
  for (int i = 0; i < 200; ++i) {
    try {
      TcpStore wrong(client_of(server.port(), 5s, "wrong-token"));
    } catch (const ncclkit::StoreError&) {
      ++rejected;
    }
  }
  CHECK(rejected == 200);
  CHECK(answers_within(good, "k", "v", 1000ms));
  const std::string log = server.log();
  CHECK(count_of(log, "wrong token") >= 1);
  CHECK_MESSAGE(server.log_lines() <= 12, server.log_lines() << " log lines: " << log.substr(0, 2000));
  CHECK(server.terminate(5s));
}
