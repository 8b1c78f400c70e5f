// doctest's runner, compiled once and linked into every host test executable.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "support/doctest_runner.hpp"

int main(int argc, char** argv) { return ncclkit_test::run_doctest(argc, argv); }
