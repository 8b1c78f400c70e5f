// The header version matches the CMake project version.
#include <doctest/doctest.h>

#include <string>

#include "ncclkit/version.hpp"

TEST_CASE("version.hpp agrees with CMakeLists.txt") {
  CHECK(std::string(ncclkit::kVersionString) == NCCLKIT_TEST_PROJECT_VERSION);
  CHECK(NCCLKIT_VERSION_CODE == NCCLKIT_VERSION_MAJOR * 10000 + NCCLKIT_VERSION_MINOR * 100 + NCCLKIT_VERSION_PATCH);
}
