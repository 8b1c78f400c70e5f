// Control of compile_fail_language_version: the same flags (-std=c++17) and include folder
// compile a header that needs nothing of C++20, so the failures below are the language check.
#include "ncclkit/version.hpp"

int version_major() { return NCCLKIT_VERSION_MAJOR; }
