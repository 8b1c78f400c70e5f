// ncclkit::format_bytes: the one way byte counts appear in messages.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <cstddef>

#include "ncclkit/core/byte_format.hpp"

using ncclkit::format_bytes;

TEST_CASE("byte counts take the largest binary unit that keeps the number at least one") {
  CHECK(format_bytes(0) == "0 B");
  CHECK(format_bytes(1023) == "1023 B");
  CHECK(format_bytes(1024) == "1.00 KiB");
  CHECK(format_bytes(1536) == "1.50 KiB");
  CHECK(format_bytes(std::size_t{64} << 20) == "64.00 MiB");
  CHECK(format_bytes(std::size_t{3} << 30) == "3.00 GiB");
  CHECK(format_bytes(std::size_t{1} << 40) == "1024.00 GiB");
}
