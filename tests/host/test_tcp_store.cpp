// Tests of ncclkit/store/tcp_store.hpp within one process: the Store operations, timeouts and
// their bounds, connection errors (no server, port in use, wrong token, lost server), hostile
// peers sending garbage through raw sockets, IPv6, and 256 concurrent clients (threads).
// Multi-process tests are in test_tcp_store_spawn.cpp.
#include <doctest/doctest.h>

#include <netinet/in.h>  // sockaddr_in6, in6addr_loopback
#include <poll.h>        // poll: bounded waits on raw sockets
#include <stdlib.h>      // setenv, unsetenv
#include <sys/socket.h>  // socket, send, recv

#include <atomic>   // std::atomic
#include <chrono>   // std::chrono
#include <cstdint>  // std::uint8_t, std::uint64_t
#include <future>   // std::promise: the outcome of a get running on a thread
#include <memory>   // std::unique_ptr
#include <random>   // std::mt19937_64: random values
#include <regex>    // std::regex: times in messages
#include <string>   // std::string
#include <thread>   // std::thread
#include <vector>   // std::vector

#include "ncclkit/core/log.hpp"
#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/tcp_store.hpp"
#include "support/ports.hpp"
#include "support/raw_tcp_peer.hpp"
#include "support/text.hpp"

using namespace std::chrono_literals;
using ncclkit::Bytes;
using ncclkit::TcpStore;
using ncclkit::TcpStoreOptions;
using ncclkit::TcpStoreServer;
using ncclkit::TcpStoreServerOptions;
namespace tcp = ncclkit::detail::tcp;
using Clock = std::chrono::steady_clock;

using namespace ncclkit_test;

namespace {

using ncclkit_test::contains;

Bytes random_bytes(std::mt19937_64& random, std::size_t n) {
  Bytes b(n);
  for (auto& x : b) x = static_cast<std::uint8_t>(random());
  return b;
}

TcpStoreOptions client_of(const TcpStoreServer& server, std::chrono::milliseconds timeout = 10s) {
  return TcpStoreOptions{.host = "127.0.0.1", .port = server.port(), .timeout = timeout, .token = ""};
}

/// The bounds every store timeout must meet: never early, late by at most max(10%, 250 ms).
void check_timeout_bounds(Clock::duration waited, std::chrono::milliseconds timeout) {
  const auto late = std::max<std::chrono::milliseconds>(timeout / 10, 250ms);
  CHECK_MESSAGE(waited >= timeout,
                "fired early: " << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() << " ms");
  CHECK_MESSAGE(waited <= timeout + late,
                "fired late: " << std::chrono::duration_cast<std::chrono::milliseconds>(waited).count() << " ms");
}

void raw_send(const ncclkit::detail::Socket& socket, const Bytes& bytes) {
  int error = 0;
  REQUIRE(ncclkit::detail::send_all(socket.get(), bytes.data(), bytes.size(), Clock::now() + 5s, error) ==
          ncclkit::detail::IoStatus::kDone);
}

bool ipv6_loopback_available() {
  ncclkit::detail::Socket socket(::socket(AF_INET6, SOCK_STREAM, 0));
  if (!socket) return false;
  sockaddr_in6 address{};
  address.sin6_family = AF_INET6;
  address.sin6_addr = in6addr_loopback;
  return ::bind(socket.get(), reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
}

}  // namespace

TEST_CASE("every Store operation works against a server hosted by the client (is_server)") {
  std::mt19937_64 random(7);
  TcpStore store({.port = 0, .is_server = true, .timeout = 10s, .token = ""});
  CHECK(store.port() > 0);
  CHECK(store.describe() == "tcp://127.0.0.1:" + std::to_string(store.port()));

  const Bytes value = random_bytes(random, 1000);
  store.set("a", value);
  CHECK(store.get("a") == value);
  CHECK(store.check({"a"}));
  CHECK_FALSE(store.check({"a", "missing"}));
  store.wait({"a"}, 1s);

  const Bytes replaced = random_bytes(random, 17);
  store.set("a", replaced);
  CHECK(store.get("a", 1s) == replaced);

  CHECK(store.add("counter", 5) == 5);
  CHECK(store.add("counter", -12) == -7);
  CHECK(store.get_string("counter") == "-7");
  store.set("text", "not a number");
  CHECK_THROWS_AS(store.add("text", 1), ncclkit::StoreError);
  store.set("big", std::to_string(INT64_MAX));
  CHECK_THROWS_WITH_AS(store.add("big", 1), doctest::Contains("overflows"), ncclkit::StoreError);
  CHECK(store.add("counter", 0) == -7);  // the connection is fine after a server-side error

  // compare_set: missing + empty expected sets; missing + non-empty expected returns expected.
  CHECK(store.compare_set("cas", "", "first") == "first");
  CHECK(store.compare_set("cas", "wrong", "second") == "first");
  CHECK(store.compare_set("cas", "first", "second") == "second");
  CHECK(store.compare_set("absent", "x", "y") == "x");
  CHECK_FALSE(store.check({"absent"}));

  const auto keys_before = store.num_keys();
  CHECK(keys_before == 5);  // a, counter, text, big, cas
  CHECK(store.delete_key("a"));
  CHECK_FALSE(store.delete_key("a"));
  CHECK(store.num_keys() == keys_before - 1);
  CHECK_FALSE(store.check({"a"}));

  // Keys are bytes: any byte may appear.
  const std::string binary_key("k\0\xff\n", 4);
  store.set(binary_key, "v");
  CHECK(store.get_string(binary_key) == "v");
}

TEST_CASE("values of 0 bytes and 16 MiB round trip exactly") {
  std::mt19937_64 random(16);
  TcpStoreServer server;
  TcpStore store(client_of(server));
  store.set("empty", Bytes{});
  CHECK(store.get("empty").empty());
  CHECK(store.check({"empty"}));
  const Bytes large = random_bytes(random, 16u << 20);
  store.set("large", large);
  TcpStore other(client_of(server));
  CHECK(other.get("large") == large);
  CHECK(other.compare_set("large", large, Bytes{1, 2, 3}) == Bytes{1, 2, 3});
}

TEST_CASE("a get parked on the server is answered when another client sets the key") {
  TcpStoreServer server;
  TcpStore waiter(client_of(server));
  TcpStore setter(client_of(server));
  std::atomic<bool> started{false};
  Bytes got;
  std::thread thread([&] {
    started = true;
    got = waiter.get("late", 20s);
  });
  while (!started) std::this_thread::yield();
  // Whether the get is already parked or not, it must return the value.
  setter.set("late", "value");
  thread.join();
  CHECK(ncclkit::to_string(got) == "value");

  // wait() on several keys returns once the last appears.
  std::thread second([&] { waiter.wait({"x", "y", "z"}, 20s); });
  setter.set("z", "1");
  setter.set("x", "1");
  setter.set("y", "1");
  second.join();
}

TEST_CASE("get and wait time out within bounds, name the missing keys, and leave the store usable") {
  TcpStoreServer server;
  TcpStore store(client_of(server));
  store.set("present", "1");
  for (auto timeout : {300ms, 1200ms}) {
    const auto start = Clock::now();
    std::string message;
    try {
      store.wait({"present", "missing-one", "missing-two"}, timeout);
    } catch (const ncclkit::TimeoutError& e) {
      message = e.what();
    }
    check_timeout_bounds(Clock::now() - start, timeout);
    CHECK(contains(message, "'missing-one', 'missing-two'"));
    CHECK_FALSE(contains(message, "'present'"));
    // Times in seconds, as every store writes them (core/time_format.hpp).
    CHECK_MESSAGE(contains(message, timeout == 300ms ? "(timeout 0.300 s)" : "(timeout 1.200 s)"), message);
    CHECK_MESSAGE(std::regex_search(message, std::regex("timed out after [0-9]+\\.[0-9]{3} s \\(timeout")), message);
    CHECK(contains(message, server.host()));
    CHECK(contains(message, std::to_string(server.port())));
  }
  const auto start = Clock::now();
  CHECK_THROWS_WITH_AS(store.get("nothing", 400ms), doctest::Contains("'nothing'"), ncclkit::TimeoutError);
  check_timeout_bounds(Clock::now() - start, 400ms);
  // A timeout of zero checks once.
  CHECK_THROWS_AS(store.get("nothing", 0ms), ncclkit::TimeoutError);
  store.set("after", "ok");
  CHECK(store.get_string("after") == "ok");
  CHECK(store.get_string("present", 0ms) == "1");
}

TEST_CASE("when the server never answers a wait, the client times out within bounds and reconnects") {
  // A fake server: answers the hello, then swallows every request without replying.
  auto listener = ncclkit::detail::listen_tcp("127.0.0.1", 0);
  const int port = ncclkit::detail::local_port(listener.get());
  std::atomic<int> accepted{0};
  std::atomic<bool> stop{false};
  std::thread fake([&] {
    std::vector<ncclkit::detail::Socket> peers;
    while (!stop) {
      std::vector<pollfd> fds{{listener.get(), POLLIN, 0}};
      for (auto& p : peers) fds.push_back({p.get(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 50) <= 0) continue;
      if (fds[0].revents & POLLIN) {
        peers.emplace_back(::accept(listener.get(), nullptr, nullptr));
        ++accepted;
      }
      for (std::size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        std::uint8_t buffer[4096];
        const ssize_t got = ::recv(fds[i].fd, buffer, sizeof buffer, 0);
        if (got <= 0) {
          peers[i - 1].reset();  // the client dropped it; poll ignores negative descriptors
          continue;
        }
        if (got >= 16 && buffer[0] == 'N' && buffer[5] == 1) {  // a hello: accept it
          Bytes reply;
          tcp::FrameWriter(reply).begin(tcp::MessageType::kHelloOk).u64(1024).finish();
          ::send(fds[i].fd, reply.data(), reply.size(), MSG_NOSIGNAL);
        }
      }
    }
  });
  {
    TcpStore store({.port = port, .timeout = 2s, .token = ""});
    CHECK(accepted == 1);
    const auto start = Clock::now();
    CHECK_THROWS_WITH_AS(store.wait({"never"}, 300ms), doctest::Contains("did not answer"), ncclkit::TimeoutError);
    check_timeout_bounds(Clock::now() - start, 300ms);
    // The next call opens a fresh connection rather than reading a stale reply.
    CHECK_THROWS_AS(store.get("never", 200ms), ncclkit::TimeoutError);
    CHECK(accepted == 2);
  }
  stop = true;
  fake.join();
}

TEST_CASE("connecting to a port with no server fails with TimeoutError naming host:port, on time") {
  const ClosedPort closed;  // nobody listens there until the case ends
  const int port = closed.port();
  const auto start = Clock::now();
  std::string message;
  try {
    TcpStore store({.port = port, .timeout = 600ms, .token = ""});
  } catch (const ncclkit::TimeoutError& e) {
    message = e.what();
  }
  check_timeout_bounds(Clock::now() - start, 600ms);
  CHECK(contains(message, "127.0.0.1:" + std::to_string(port)));
  CHECK(contains(message, "Connection refused"));
  CHECK_MESSAGE(std::regex_search(message, std::regex("within 0\\.600 s \\(waited [0-9]+\\.[0-9]{3} s, ")), message);
}

TEST_CASE("a client started before its server connects once the server is up") {
  const int port = free_port();  // outside the ephemeral range: no stranger's, nor the client's own
  std::atomic<bool> connected{false};
  std::string error;
  std::thread client([&] {
    try {
      TcpStore store({.port = port, .timeout = 20s, .token = ""});
      connected = store.get_string("hello", 10s) == "world";
    } catch (const std::exception& e) {
      error = e.what();
    }
  });
  TcpStoreServer server({.port = port, .token = ""});
  TcpStore(client_of(server)).set("hello", "world");
  client.join();
  CHECK_MESSAGE(connected, error);
}

TEST_CASE("a port in use is a ConfigError naming it") {
  TcpStoreServer first;
  std::string message;
  try {
    TcpStoreServer second({.port = first.port()});
  } catch (const ncclkit::ConfigError& e) {
    message = e.what();
  }
  CHECK(contains(message, "port " + std::to_string(first.port()) + " is already in use"));
  CHECK_THROWS_AS(TcpStore({.port = first.port(), .is_server = true}), ncclkit::ConfigError);
}

TEST_CASE("a wrong or missing token is rejected with a clear StoreError; the right one works") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  TcpStoreServer server({.token = "s3cret-token"});
  const std::string expected = "token rejected by tcp://127.0.0.1:" + std::to_string(server.port()) +
                               ": set NCCLKIT_STORE_TOKEN to the job's token";
  for (const std::string token : {"", "wrong", "s3cret-toke", "s3cret-token!"}) {
    const auto start = Clock::now();
    std::string message;
    try {
      TcpStore store({.port = server.port(), .timeout = 30s, .token = token});
    } catch (const ncclkit::StoreError& e) {
      message = e.what();
    }
    CHECK_MESSAGE(contains(message, expected), "token '" << token << "': " << message);
    CHECK(Clock::now() - start < 5s);  // rejected at once, not retried until the timeout
  }
  TcpStore good({.port = server.port(), .timeout = 10s, .token = "s3cret-token"});
  good.set("k", "v");
  CHECK(good.get_string("k") == "v");

  // NCCLKIT_STORE_TOKEN, where set, is the token of servers and clients alike, over the options'.
  ::setenv("NCCLKIT_STORE_TOKEN", "from-env", 1);
  TcpStoreServer env_server({.token = "overridden"});
  TcpStore env_client({.port = env_server.port(), .timeout = 10s});
  TcpStore overridden_client({.port = env_server.port(), .timeout = 10s, .token = "other"});
  ::unsetenv("NCCLKIT_STORE_TOKEN");
  CHECK_THROWS_AS(TcpStore({.port = env_server.port(), .timeout = 10s}), ncclkit::StoreError);
  CHECK_THROWS_AS(TcpStore({.port = env_server.port(), .timeout = 10s, .token = "overridden"}), ncclkit::StoreError);
  env_client.set("k", "v");
  // A raw connection that skips the handshake cannot read or write.
  auto raw = raw_connect(env_server.port());
  Bytes frame;
  tcp::FrameWriter(frame).begin(tcp::MessageType::kSet).key("intruder").bytes(std::string_view("x")).finish();
  raw_send(raw, frame);
  CHECK(closed_within(raw, 5s));
  CHECK_FALSE(env_client.check({"intruder"}));
  ncclkit::set_log_level(ncclkit::LogLevel::kWarn);
}

TEST_CASE("hostile peers are disconnected; the server stays up and other clients carry on") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);  // the rejections are logged as warnings
  std::mt19937_64 random(99);
  TcpStoreServer server({.max_value_bytes = 1 << 20});
  TcpStore good(client_of(server));
  // A peer holding a half-sent frame open must not stall anyone.
  auto idle = raw_connect(server.port());
  raw_send(idle, hello_frame());
  Bytes partial = frame_header(2, 100);
  raw_send(idle, partial);

  auto exercise = [&](int round) {
    const Bytes value = random_bytes(random, 64);
    good.set("key/" + std::to_string(round), value);
    CHECK(good.get("key/" + std::to_string(round), 5s) == value);
    CHECK(good.add("rounds", 1) == round + 1);
  };
  int round = 0;
  exercise(round++);

  std::vector<std::pair<std::string, Bytes>> attacks;
  attacks.emplace_back("random garbage", random_bytes(random, 4096));
  attacks.emplace_back("an HTTP request", Bytes{'G', 'E', 'T', ' ', '/', ' ', 'H', 'T', 'T', 'P', '/', '1', '.', '1',
                                                '\r', '\n', '\r', '\n'});
  {
    Bytes wrong_magic = hello_frame();
    wrong_magic[0] = 'X';
    attacks.emplace_back("a wrong magic", wrong_magic);
  }
  {
    Bytes wrong_version = hello_frame();
    wrong_version[4] = 77;
    attacks.emplace_back("a wrong version", wrong_version);
  }
  {
    Bytes huge = hello_frame();
    Bytes h = frame_header(2, std::uint64_t{1} << 62);
    huge.insert(huge.end(), h.begin(), h.end());
    attacks.emplace_back("a 2^62 payload length", huge);
  }
  {
    // A set whose inner value length says 2^62 while the frame is small.
    Bytes inner = hello_frame();
    Bytes h = frame_header(2, 4 + 1 + 8 + 4);
    inner.insert(inner.end(), h.begin(), h.end());
    Bytes fields = {1, 0, 0, 0, 'k'};
    for (int i = 0; i < 8; ++i) fields.push_back(static_cast<std::uint8_t>((std::uint64_t{1} << 62) >> (8 * i)));
    fields.insert(fields.end(), {'d', 'a', 't', 'a'});
    inner.insert(inner.end(), fields.begin(), fields.end());
    attacks.emplace_back("a 2^62 value length inside a frame", inner);
  }
  {
    Bytes over = hello_frame();
    Bytes h = frame_header(2, (2u << 20) * 2 + 200000);  // above this server's limit
    over.insert(over.end(), h.begin(), h.end());
    attacks.emplace_back("a payload over max_value_bytes", over);
  }
  {
    Bytes no_hello;
    tcp::FrameWriter(no_hello).begin(tcp::MessageType::kNumKeys).finish();
    attacks.emplace_back("a request before the hello", no_hello);
  }
  {
    Bytes reply = hello_frame();
    tcp::FrameWriter(reply).begin(tcp::MessageType::kOk).finish();
    attacks.emplace_back("a reply frame from a client", reply);
  }
  {
    Bytes count = hello_frame();
    Bytes h = frame_header(5, 8);
    count.insert(count.end(), h.begin(), h.end());
    count.insert(count.end(), {0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0});
    attacks.emplace_back("a 2^32 key count", count);
  }
  for (const auto& [name, bytes] : attacks) {
    CAPTURE(name);
    auto raw = raw_connect(server.port());
    raw_send(raw, bytes);
    CHECK(closed_within(raw, 5s));
    exercise(round++);
  }
  {
    // A truncated frame, then the peer hangs up: nothing of it may be applied.
    auto raw = raw_connect(server.port());
    Bytes frame = hello_frame();
    tcp::FrameWriter(frame).begin(tcp::MessageType::kSet).key("truncated").bytes(random_bytes(random, 1000)).finish();
    frame.resize(frame.size() - 500);
    raw_send(raw, frame);
    raw.reset();
    exercise(round++);
    CHECK_FALSE(good.check({"truncated"}));
  }
  // Only the good client's keys exist: key/0..key/(round-1) and "rounds".
  CHECK(good.num_keys() == round + 1);
  ncclkit::set_log_level(ncclkit::LogLevel::kWarn);
}

TEST_CASE("a token longer than a hello may carry is a ConfigError naming the limit, for clients and servers") {
  const std::string long_token(tcp::kMaxTokenBytes + 1, 't');
  CHECK_THROWS_WITH_AS(TcpStoreServer({.token = long_token}), doctest::Contains("more than the limit of 4096"),
                       ncclkit::ConfigError);
  TcpStoreServer server({.token = std::string(tcp::kMaxTokenBytes, 't')});
  CHECK_THROWS_AS(TcpStore({.port = server.port(), .timeout = 5s, .token = long_token}), ncclkit::ConfigError);
  TcpStore longest({.port = server.port(), .timeout = 5s, .token = std::string(tcp::kMaxTokenBytes, 't')});
  longest.set("k", "v");
  ::setenv("NCCLKIT_STORE_TOKEN", long_token.c_str(), 1);
  CHECK_THROWS_WITH_AS(TcpStoreServer(), doctest::Contains("NCCLKIT_STORE_TOKEN"), ncclkit::ConfigError);
  ::unsetenv("NCCLKIT_STORE_TOKEN");
}

TEST_CASE("a value over the server's limit is refused by the client with a clear error") {
  TcpStoreServer server({.max_value_bytes = 1000});
  TcpStore store(client_of(server));
  store.set("fits", Bytes(1000, 7));
  CHECK_THROWS_WITH_AS(store.set("too-big", Bytes(1001, 7)), doctest::Contains("exceeds the server's limit of 1000"),
                       ncclkit::StoreError);
  CHECK(store.get("fits") == Bytes(1000, 7));
  CHECK_THROWS_AS(store.set(std::string(70000, 'k'), "v"), ncclkit::StoreError);
}

TEST_CASE("a lost server is a StoreError naming the address, for this and later calls") {
  std::optional<TcpStoreServer> server(std::in_place);
  TcpStore store(client_of(*server));
  const std::string address = store.describe();
  store.set("k", "v");
  // A get parked on the server when it goes away ends at once with a StoreError too.
  std::string parked_error;
  std::atomic<bool> parked_started{false};
  TcpStore parked(client_of(*server));
  std::thread thread([&] {
    parked_started = true;
    try {
      parked.get("never", 60s);
    } catch (const ncclkit::StoreError& e) {
      parked_error = e.what();
    }
  });
  while (!parked_started) std::this_thread::yield();
  const auto start = Clock::now();
  server.reset();
  thread.join();
  // Either the get reached the server before it stopped (connection lost), or it was sent to
  // a closed socket: both are StoreErrors naming the address, never a 60 s hang.
  CHECK(Clock::now() - start < 10s);
  CHECK(contains(parked_error, address));
  CHECK_THROWS_WITH_AS(store.get("k", 1s), doctest::Contains(address.c_str()), ncclkit::StoreError);
  CHECK_THROWS_WITH_AS(store.set("k", "v"), doctest::Contains("lost"), ncclkit::StoreError);
}

TEST_CASE("one client object shared by threads: every add counts exactly once") {
  TcpStoreServer server;
  TcpStore store(client_of(server));
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&store, t] {
      for (int i = 0; i < 200; ++i) store.add("sum", t + 1);
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(store.add("sum", 0) == 200 * (8 * 9 / 2));
}

TEST_CASE("256 clients, each with its own connection, rendezvous and pass a barrier") {
  TcpStoreServer server;
  constexpr int kClients = 256;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  std::vector<std::string> keys;
  for (int i = 0; i < kClients; ++i) keys.push_back("rank/" + std::to_string(i));
  const int port = server.port();
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      try {
        TcpStore store({.port = port, .timeout = 30s, .token = ""});
        store.set(keys[i], std::to_string(i * 7919));
        store.wait(keys, 30s);
        if (store.get_string(keys[(i + 1) % kClients]) != std::to_string(((i + 1) % kClients) * 7919)) ++failures;
        ncclkit::barrier(store, i, kClients, "all", 30s);
      } catch (const std::exception& e) {
        MESSAGE(e.what());
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  CHECK(failures == 0);
}

TEST_CASE("IPv6: a server on ::1 and its clients") {
  if (!ipv6_loopback_available()) {
    MESSAGE("SKIPPED: this machine has no IPv6 loopback (::1)");
    return;
  }
  TcpStoreServer server({.host = "::1"});
  CHECK(server.host() == "::1");
  TcpStore store({.host = "::1", .port = server.port(), .timeout = 10s, .token = ""});
  CHECK(store.describe() == "tcp://[::1]:" + std::to_string(server.port()));
  store.set("v6", "yes");
  CHECK(store.get_string("v6") == "yes");

  // Bound to every address (dual-stack): reachable over IPv4 and IPv6.
  TcpStoreServer any({.host = ""});
  TcpStore over_v4({.host = "127.0.0.1", .port = any.port(), .timeout = 10s, .token = ""});
  TcpStore over_v6({.host = "::1", .port = any.port(), .timeout = 10s, .token = ""});
  over_v4.set("both", "1");
  CHECK(over_v6.get_string("both") == "1");
}

TEST_CASE("the server binds loopback by default and can bind an interface by name") {
  TcpStoreServer server;
  CHECK(server.host() == "127.0.0.1");
  TcpStoreServer by_name({.host = "lo"});
  CHECK(by_name.host() == "127.0.0.1");
  TcpStore store({.port = by_name.port(), .timeout = 10s, .token = ""});
  store.set("k", "v");
  CHECK_THROWS_AS(TcpStoreServer({.host = "no-such-host.invalid"}), ncclkit::ConfigError);
}

TEST_CASE("adopting a socket that is not listening is a ConfigError") {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  CHECK_THROWS_AS(TcpStoreServer::from_listening_socket(fd), ncclkit::ConfigError);
  CHECK_THROWS_AS(TcpStoreServer::from_listening_socket(-1), ncclkit::ConfigError);
}

TEST_CASE("input buffers grow with the bytes received, not with the size a peer announces") {
  ncclkit::detail::ByteBuffer buffer;
  constexpr std::size_t kChunk = 64 * 1024;
  const std::size_t announced = std::size_t{16} << 20;
  // Only a header has arrived: the next read asks for one chunk, not 16 MiB.
  buffer.prepare(buffer.next_read_size(0, kChunk));
  buffer.commit(16);
  CHECK(buffer.next_read_size(announced, kChunk) == kChunk);
  // As data arrives the reads double, then stop exactly at the frame's end.
  std::size_t received = 16;
  std::size_t largest_capacity_step = 0;
  while (received < announced) {
    const std::size_t ask = buffer.next_read_size(announced, kChunk);
    CHECK(ask <= std::max(kChunk, received));
    CHECK(ask <= announced - received);
    buffer.prepare(ask);
    largest_capacity_step = std::max(largest_capacity_step, buffer.writable());
    buffer.commit(ask);
    received += ask;
  }
  CHECK(buffer.size() == announced);
  CHECK(largest_capacity_step <= announced / 2 + kChunk);
  CHECK(buffer.next_read_size(announced, kChunk) == kChunk);  // frame complete: back to chunks
}

TEST_CASE("the rank that hosts the server keeps serving until the other clients have left") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto host = std::make_unique<TcpStore>(TcpStoreOptions{.port = 0, .is_server = true, .timeout = 5s, .linger = 20s});
  auto client = std::make_unique<TcpStore>(TcpStoreOptions{.port = host->port(), .timeout = 5s});
  std::atomic<bool> host_gone{false};
  Clock::time_point host_destroyed_at;
  std::thread finisher([&] {
    host.reset();  // rank 0 is done first
    host_destroyed_at = Clock::now();
    host_gone.store(true);
  });
  // While the host lingers, the other client's requests keep working.
  const auto start = Clock::now();
  int operations = 0;
  while (Clock::now() - start < 400ms) {
    client->set("late/" + std::to_string(operations), "v");
    CHECK(client->get_string("late/" + std::to_string(operations)) == "v");
    ++operations;
  }
  CHECK_FALSE(host_gone.load());
  const auto client_left_at = Clock::now();
  client.reset();
  finisher.join();
  CHECK(operations > 0);
  CHECK(host_destroyed_at >= client_left_at);
  CHECK(host_destroyed_at - client_left_at < 5s);
}

TEST_CASE("the lingering host gives up after its linger time when a client never leaves") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  auto host = std::make_unique<TcpStore>(TcpStoreOptions{.port = 0, .is_server = true, .timeout = 5s, .linger = 300ms});
  TcpStore client(TcpStoreOptions{.port = host->port(), .timeout = 5s});
  client.set("k", "v");
  const auto start = Clock::now();
  host.reset();
  const auto waited = Clock::now() - start;
  CHECK(waited >= 300ms);
  CHECK(waited < 300ms + 2s);
  CHECK_THROWS_AS(client.get("k", 1s), ncclkit::StoreError);
}

TEST_CASE("NCCLKIT_STORE_LINGER=0 means the hosting rank does not linger for connected clients") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  TcpStoreOptions options{.port = 0, .is_server = true, .timeout = 5s};
  CHECK(options.linger == 30s);
  ::setenv("NCCLKIT_STORE_LINGER", "0", 1);
  auto host = std::make_unique<TcpStore>(options);  // the variable overrides the linger
  ::unsetenv("NCCLKIT_STORE_LINGER");
  TcpStore client(TcpStoreOptions{.port = host->port(), .timeout = 5s});
  client.set("k", "v");
  const auto start = Clock::now();
  host.reset();  // a client is still connected: with no linger, the server stops at once
  CHECK(Clock::now() - start < 2s);
  CHECK_THROWS_AS(client.get("k", 1s), ncclkit::StoreError);
}

TEST_CASE("a huge timeout (milliseconds::max()) means wait long, not time out at once") {
  // timeout + the reply grace can overflow into a deadline in the past: the get would throw
  // TimeoutError "after 0 ms" and drop the connection instead of waiting for the key.
  TcpStoreServer server;
  TcpStore waiter(client_of(server));
  TcpStore setter(client_of(server));
  std::promise<std::string> outcome;
  auto result = outcome.get_future();
  std::thread thread([&] {
    try {
      outcome.set_value(ncclkit::to_string(waiter.get("huge", std::chrono::milliseconds::max())));
    } catch (const std::exception& e) {
      outcome.set_value(std::string("threw: ") + e.what());
    }
  });
  // Nothing may end the get before the key exists; with the bug it ends at once.
  const bool ended_early = result.wait_for(300ms) == std::future_status::ready;
  setter.set("huge", "value");
  thread.join();
  const std::string got = result.get();
  CHECK_MESSAGE(!ended_early, got);
  CHECK(got == "value");
}
