// The store entry header under C++17 gives the language check's message first.
// expect-error: ncclkit needs C++20: compile with -std=c++20
#include <ncclkit/store.hpp>

int main() { return 0; }
