#pragma once
// The body of the test executables' main() (tests/support/doctest_main.cpp defines it, with
// doctest itself, compiled once for all test executables).

namespace ncclkit_test {

/// Runs the test cases that the command line selects and returns the exit code; 1 when the
/// run passed but its filters selected no test case.
///
/// Each test executable holds the tests of one layer; CTest runs it once per test file with a
/// filter (--source-file=*/test_x.cpp, tests/CMakeLists.txt). doctest passes a filter that
/// selects nothing; this fails it, so that a renamed or moved file cannot turn its CTest test
/// into one that passes without running anything.
int run_doctest(int argc, char** argv);

}  // namespace ncclkit_test
