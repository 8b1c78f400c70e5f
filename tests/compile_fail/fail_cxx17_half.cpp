// A core header that uses std::bit_cast, included alone under C++17, gives the same message.
// expect-error: ncclkit needs C++20: compile with -std=c++20
#include <ncclkit/core/half.hpp>

float one() { return static_cast<float>(ncclkit::Half(1.0f)); }
