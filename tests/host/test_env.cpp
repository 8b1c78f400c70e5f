// Tests of ncclkit/core/env.hpp (the readers of variables outside the knob table, and the
// parsers the knobs share) and WorldInfo validation.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <string>

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/log.hpp"

TEST_CASE("parse_int accepts whole decimal numbers only") {
  using ncclkit::parse_int;
  CHECK(parse_int("42") == 42);
  CHECK(parse_int("-7") == -7);
  CHECK(parse_int("9223372036854775807") == INT64_MAX);
  CHECK_FALSE(parse_int("9223372036854775808"));
  CHECK_FALSE(parse_int(""));
  CHECK_FALSE(parse_int("-"));
  CHECK_FALSE(parse_int("12x"));
  CHECK_FALSE(parse_int(" 1"));
}

TEST_CASE("parse_timeout_seconds: positive seconds up to 1e9, in whole milliseconds") {
  using ncclkit::parse_timeout_seconds;
  using std::chrono::milliseconds;
  CHECK(parse_timeout_seconds("300") == milliseconds(300000));
  CHECK(parse_timeout_seconds("2.5") == milliseconds(2500));
  CHECK(parse_timeout_seconds("2.007") == milliseconds(2007));  // 2.007 * 1000 is 2007.0000000000002
  CHECK(parse_timeout_seconds("4.001") == milliseconds(4001));
  CHECK(parse_timeout_seconds(" 30") == milliseconds(30000));  // leading blanks, as strtod skips them
  CHECK(parse_timeout_seconds("0.0001") == milliseconds(1));   // never 0, which means "the default"
  CHECK(parse_timeout_seconds("1e9") == milliseconds(1000000000000));
  for (const char* bad : {"", " ", "0", "-1", "1e10", "inf", "nan", "abc", "1x", "1 "}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_timeout_seconds(bad));
  }
}

TEST_CASE("env_int and env_seconds, for variables outside the knob table, name the variable on bad values") {
  ::setenv("NCCLKIT_TEST_INT", "abc", 1);
  CHECK_THROWS_WITH_AS(ncclkit::env_int("NCCLKIT_TEST_INT"), doctest::Contains("NCCLKIT_TEST_INT='abc'"),
                       ncclkit::ConfigError);
  ::setenv("NCCLKIT_TEST_INT", "17", 1);
  CHECK(ncclkit::env_int("NCCLKIT_TEST_INT") == 17);
  ::unsetenv("NCCLKIT_TEST_INT");
  CHECK_FALSE(ncclkit::env_int("NCCLKIT_TEST_INT"));

  ::setenv("NCCLKIT_TEST_SECONDS", "2.5", 1);
  CHECK(ncclkit::env_seconds("NCCLKIT_TEST_SECONDS", std::chrono::seconds(1)).count() == 2500);
  ::setenv("NCCLKIT_TEST_SECONDS", "-1", 1);
  CHECK_THROWS_WITH_AS(ncclkit::env_seconds("NCCLKIT_TEST_SECONDS", std::chrono::seconds(1)),
                       doctest::Contains("NCCLKIT_TEST_SECONDS='-1'"), ncclkit::ConfigError);
  ::unsetenv("NCCLKIT_TEST_SECONDS");
  CHECK(ncclkit::env_seconds("NCCLKIT_TEST_SECONDS", std::chrono::seconds(1)).count() == 1000);
}

TEST_CASE("WorldInfo::validate lists every problem") {
  ncclkit::WorldInfo world;
  world.rank = 4;
  world.world_size = 4;
  world.local_rank = 2;
  world.local_world_size = 2;
  world.source = "test";
  CHECK_THROWS_WITH_AS(world.validate(), doctest::Contains("rank=4 must be in [0, world_size=4)"),
                       ncclkit::ConfigError);
  try {
    world.validate();
  } catch (const ncclkit::ConfigError& e) {
    CHECK(std::string(e.what()).find("local_rank=2") != std::string::npos);
    CHECK(std::string(e.what()).find("from test") != std::string::npos);
  }
  world.rank = 3;
  world.local_rank = 1;
  CHECK_NOTHROW(world.validate());
}

TEST_CASE("log level parsing and enabling") {
  ncclkit::set_log_level(ncclkit::LogLevel::kError);
  CHECK(ncclkit::log_enabled(ncclkit::LogLevel::kError));
  CHECK_FALSE(ncclkit::log_enabled(ncclkit::LogLevel::kWarn));
  ncclkit::set_log_level(ncclkit::LogLevel::kDebug);
  CHECK(ncclkit::log_enabled(ncclkit::LogLevel::kInfo));
  ncclkit::set_log_level(ncclkit::LogLevel::kWarn);
}
