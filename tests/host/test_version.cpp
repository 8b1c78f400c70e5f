// The header version matches the CMake project version (tests/CMakeLists.txt passes it in).
#include <doctest/doctest.h>

#include <string>

#include "ncclkit/version.hpp"

TEST_CASE("version.hpp agrees with CMakeLists.txt") {
  CHECK(std::string(ncclkit::kVersionString) == NCCLKIT_TEST_PROJECT_VERSION);
  CHECK(NCCLKIT_VERSION_MAJOR == NCCLKIT_TEST_PROJECT_VERSION_MAJOR);
  CHECK(NCCLKIT_VERSION_MINOR == NCCLKIT_TEST_PROJECT_VERSION_MINOR);
  CHECK(NCCLKIT_VERSION_PATCH == NCCLKIT_TEST_PROJECT_VERSION_PATCH);
  CHECK(NCCLKIT_VERSION_CODE == NCCLKIT_TEST_PROJECT_VERSION_MAJOR * 10000 + NCCLKIT_TEST_PROJECT_VERSION_MINOR * 100 +
                                    NCCLKIT_TEST_PROJECT_VERSION_PATCH);
}
