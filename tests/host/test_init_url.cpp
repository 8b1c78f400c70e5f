// Tests of ncclkit/bootstrap/init_url.hpp: parsing init URLs (make_store, with processes and
// stores: test_init_url_stores.cpp).
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <chrono>  // std::chrono::milliseconds
#include <string>  // std::string

#include "ncclkit/bootstrap/init_url.hpp"

using ncclkit::ConfigError;
using ncclkit::InitUrlScheme;
using ncclkit::parse_init_url;
using namespace std::chrono_literals;

TEST_CASE("env:// reads nothing itself") {
  auto url = parse_init_url("env://");
  CHECK(url.scheme == InitUrlScheme::kEnv);
  CHECK(url.host.empty());
  CHECK_FALSE(url.timeout);
  CHECK(url.text == "env://");
  CHECK(parse_init_url("ENV://").scheme == InitUrlScheme::kEnv);
  CHECK(parse_init_url("env://?timeout=30").timeout == 30000ms);
}

TEST_CASE("tcp:// with host names, IPv4 and IPv6 addresses") {
  auto url = parse_init_url("tcp://node-07.cluster:29500");
  CHECK(url.scheme == InitUrlScheme::kTcp);
  CHECK(url.host == "node-07.cluster");
  CHECK(url.port == 29500);
  CHECK(parse_init_url("tcp://10.1.2.3:1").host == "10.1.2.3");
  CHECK(parse_init_url("tcp://10.1.2.3:1").port == 1);
  CHECK(parse_init_url("tcp://127.0.0.1:0").port == 0);
  CHECK(parse_init_url("tcp://h:65535").port == 65535);
  CHECK(parse_init_url("tcp://h:29500/").port == 29500);
  auto v6 = parse_init_url("tcp://[::1]:29500");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 29500);
  CHECK(parse_init_url("tcp://[fe80::1:aB%eth0]:7").host == "fe80::1:aB%eth0");
  CHECK(parse_init_url("tcp://[::ffff:10.0.0.1]:7").host == "::ffff:10.0.0.1");
  auto timed = parse_init_url("TCP://h:5?timeout=2.5");
  CHECK(timed.scheme == InitUrlScheme::kTcp);
  CHECK(timed.timeout == 2500ms);
  CHECK(timed.port == 5);
  CHECK_FALSE(timed.external_server);
  auto external = parse_init_url("tcp://h:5?server=external&timeout=3");
  CHECK(external.external_server);
  CHECK(external.timeout == 3000ms);
  CHECK_FALSE(parse_init_url("tcp://h:5?server=rank0").external_server);
  CHECK(parse_init_url("env://?server=external").external_server);
}

TEST_CASE("file:/// takes an absolute folder") {
  auto url = parse_init_url("file:///shared/rdv/job-42");
  CHECK(url.scheme == InitUrlScheme::kFile);
  CHECK(url.path == "/shared/rdv/job-42");
  CHECK(parse_init_url("file:///tmp/x?timeout=10").path == "/tmp/x");
  CHECK(parse_init_url("file:///tmp/x?timeout=10").timeout == 10000ms);
  CHECK(parse_init_url("file:///").path == "/");
}

TEST_CASE("bad URLs quote the URL, say what is wrong and show the accepted forms") {
  struct Case {
    const char* url;
    const char* problem;
  };
  const Case cases[] = {
      {"", "empty"},
      {"\"tcp://h:1\"", "remove the quotes"},
      {"'file:///x'", "remove the quotes"},
      {" tcp://h:1", "white space"},
      {"tcp://h:1\n", "white space"},
      {"localhost:29500", "no scheme"},
      {"/shared/dir", "no scheme"},
      {"http://h:1", "unknown scheme 'http'"},
      {"env://h:1", "env:// takes no address"},
      {"tcp://", "host and port are missing"},
      {"tcp://h", "port is missing"},
      {"tcp://h:", "port is missing"},
      {"tcp://:29500", "host is missing"},
      {"tcp://h:port", "is not a number"},
      {"tcp://h:-1", "is not a number"},
      {"tcp://h:65536", "not in [0, 65535]"},
      {"tcp://h:99999999999999999999", "not in [0, 65535]"},
      {"tcp://::1:29500", "must be written in brackets"},
      {"tcp://[::1]", "port is missing after the IPv6"},
      {"tcp://[::1", "without ']'"},
      {"tcp://[]:1", "empty"},
      {"tcp://[zz::1]:1", "not an IPv6 address"},
      {"tcp://h:1/path", "no path"},
      {"tcp://user@h:1", "NCCLKIT_STORE_TOKEN"},
      {"tcp://h$:1", "not a host name"},
      {"tcp://h:1?timeout=0", "not a positive number of seconds"},
      {"tcp://h:1?timeout=abc", "not a positive number of seconds"},
      {"tcp://h:1?timeout=", "not a positive number of seconds"},
      {"tcp://h:1?timeout=1&timeout=2", "given twice"},
      {"tcp://h:1?token=abc", "unknown option 'token=abc'"},
      {"tcp://h:1?server=rank1", "must be rank0 or external"},
      {"tcp://h:1?server=external&server=rank0", "server is given twice"},
      {"file:///x?server=external", "env:// and tcp:// only"},
      {"tcp://h:1?", "unknown option ''"},
      {"tcp://h:1#x", "'#'"},
      {"file://", "folder is missing"},
      {"file://shared/dir", "file:///shared/dir if you meant /shared/dir"},
      {"file://localhost/dir", "three slashes"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.url);
    const std::string quoted = std::string("invalid init URL '") + c.url + "'";
    CHECK_THROWS_WITH_AS(parse_init_url(c.url), doctest::Contains(quoted.c_str()), ConfigError);
    CHECK_THROWS_WITH_AS(parse_init_url(c.url), doctest::Contains(c.problem), ConfigError);
    CHECK_THROWS_WITH_AS(parse_init_url(c.url),
                         doctest::Contains("accepted forms: env:// (the TCP store at MASTER_ADDR:MASTER_PORT), "
                                           "tcp://HOST:PORT"),
                         ConfigError);
  }
}
