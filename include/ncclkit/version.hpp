#pragma once
/// ncclkit's version. Kept equal to the CMake project version (tests/host/test_version.cpp).
#define NCCLKIT_VERSION_MAJOR 0
#define NCCLKIT_VERSION_MINOR 1
#define NCCLKIT_VERSION_PATCH 0
#define NCCLKIT_VERSION_CODE (NCCLKIT_VERSION_MAJOR * 10000 + NCCLKIT_VERSION_MINOR * 100 + NCCLKIT_VERSION_PATCH)

namespace ncclkit {
/// "major.minor.patch", for logs and version checks between ranks.
inline constexpr const char* kVersionString = "0.1.0";
}  // namespace ncclkit
