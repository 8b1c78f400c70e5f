// The umbrella header under C++17 stops at core/error.hpp's language check: one message that
// says what to do, not hundreds of errors about std::span and std::bit_cast.
// expect-error: ncclkit needs C++20: compile with -std=c++20
#include <ncclkit/ncclkit.hpp>

int main() { return 0; }
