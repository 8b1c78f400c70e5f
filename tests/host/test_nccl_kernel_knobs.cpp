// The NCCL backend's kernel-sizing knobs (ncclkit/nccl/options.hpp): each is an Options field
// with the table's default, its environment variable overrides it when set (what make_core
// applies at creation), and a value it cannot take is a ConfigError naming the variable (from
// the environment) or the field (from the options), the value and the range. Host code only.
#include <doctest/doctest.h>

#include <string>  // std::string

#include "ncclkit/core/error.hpp"
#include "ncclkit/nccl/options.hpp"
#include "support/env_variable.hpp"
#include "support/text.hpp"

using ncclkit::nccl::Options;
using ncclkit_test::config_error_of;
using ncclkit_test::contains;
using ncclkit_test::EnvVariable;

TEST_CASE("kernel knobs: the table's defaults, and the environment overrides the options' values") {
  const Options defaults;
  CHECK(defaults.codec_blocks_per_sm == 4);
  CHECK(defaults.copy_blocks_per_sm == 0);
  CHECK(defaults.copy_chunk_kb == 16);
  CHECK(defaults.compressed_reduce);
  CHECK(defaults.compressed_reduce_blocks == 0);

  Options given;
  given.codec_blocks_per_sm = 2;
  given.copy_blocks_per_sm = 3;
  given.copy_chunk_kb = 64;
  given.compressed_reduce_blocks = 5;
  const Options unchanged = ncclkit::nccl::detail::with_environment(given);
  CHECK(unchanged.codec_blocks_per_sm == 2);
  CHECK(unchanged.copy_chunk_kb == 64);
  {
    EnvVariable codec("NCCLKIT_CODEC_BLOCKS_PER_SM", "8");
    EnvVariable copy("NCCLKIT_COPY_BLOCKS_PER_SM", "0");
    EnvVariable chunk("NCCLKIT_COPY_CHUNK_KB", "1024");
    EnvVariable fused("NCCLKIT_COMPRESSED_REDUCE", "0");
    EnvVariable blocks("NCCLKIT_COMPRESSED_REDUCE_BLOCKS", "7");
    const Options overridden = ncclkit::nccl::detail::with_environment(given);
    CHECK(overridden.codec_blocks_per_sm == 8);
    CHECK(overridden.copy_blocks_per_sm == 0);
    CHECK(overridden.copy_chunk_kb == 1024);
    CHECK_FALSE(overridden.compressed_reduce);
    CHECK(overridden.compressed_reduce_blocks == 7);
  }
}

TEST_CASE("kernel knobs: a bad variable names it, its value and the range") {
  const struct {
    const char* name;
    const char* value;
    const char* range;
  } cases[] = {
      {"NCCLKIT_CODEC_BLOCKS_PER_SM", "9", "an integer from 1 to 8"},
      {"NCCLKIT_CODEC_BLOCKS_PER_SM", "0", "an integer from 1 to 8"},
      {"NCCLKIT_COPY_BLOCKS_PER_SM", "-1", "an integer from 0 to 8"},
      {"NCCLKIT_COPY_CHUNK_KB", "48", "a power of two from 4 to 1024"},
      {"NCCLKIT_COPY_CHUNK_KB", "2048", "a power of two from 4 to 1024"},
      {"NCCLKIT_COPY_CHUNK_KB", "16k", "a power of two from 4 to 1024"},
      {"NCCLKIT_COMPRESSED_REDUCE", "off", "an integer (0: off, another: on)"},
      {"NCCLKIT_COMPRESSED_REDUCE_BLOCKS", "lots", "an integer from 0 to 4096"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.name);
    CAPTURE(c.value);
    EnvVariable variable(c.name, c.value);
    const std::string message = config_error_of([] { (void)ncclkit::nccl::detail::with_environment(Options{}); });
    CHECK(contains(message, std::string(c.name) + "='" + c.value + "'"));
    CHECK(contains(message, c.range));
  }
}

TEST_CASE("kernel knobs: a bad options field names the field, its value and the range") {
  Options bad;
  bad.copy_chunk_kb = 3;
  std::string message = config_error_of([&] { ncclkit::nccl::detail::check_nccl_knobs(bad, "grads"); });
  CHECK(contains(message, "grads: Options::copy_chunk_kb = 3 is not a power of two from 4 to 1024"));
  bad = Options{};
  bad.codec_blocks_per_sm = 0;
  message = config_error_of([&] { ncclkit::nccl::detail::check_nccl_knobs(bad, "grads"); });
  CHECK(contains(message, "Options::codec_blocks_per_sm = 0 is not an integer from 1 to 8"));
  bad = Options{};
  bad.compressed_reduce_blocks = -2;
  CHECK(contains(config_error_of([&] { ncclkit::nccl::detail::check_nccl_knobs(bad, "grads"); }),
                 "Options::compressed_reduce_blocks = -2"));
  CHECK(config_error_of([] { ncclkit::nccl::detail::check_nccl_knobs(Options{}, "grads"); }).empty());
}
