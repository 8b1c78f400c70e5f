#pragma once
// The body of the test executables' main(): runs doctest and fails a run whose filters select
// no test case. Include it in exactly one source of an executable, after defining
// DOCTEST_CONFIG_IMPLEMENT and including doctest.
//
// Each test executable holds the tests of one layer; CTest runs it once per test file with a
// filter (--source-file=*/test_x.cpp, tests/CMakeLists.txt). doctest passes a filter that
// selects nothing; this fails it, so that a renamed or moved file cannot turn its CTest test
// into one that passes without running anything.

#include <cstdio>  // std::fprintf

namespace ncclkit_test {

inline unsigned selected_test_cases = 0;

/// Notes how many test cases passed the command line's filters.
struct SelectionCounter : doctest::IReporter {
  explicit SelectionCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override { selected_test_cases = stats.numTestCasesPassingFilters; }
  void test_case_start(const doctest::TestCaseData&) override {}
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};

DOCTEST_REGISTER_LISTENER("ncclkit_selection_counter", 1, SelectionCounter);

/// Runs the test cases that the command line selects; 1 when its filters select none.
inline int run_doctest(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;  // --help, --list-test-cases, ...
  if (result == 0 && selected_test_cases == 0) {
    std::fprintf(stderr, "no test case matches the filters given (a test file renamed or moved? "
                         "see tests/CMakeLists.txt)\n");
    return 1;
  }
  return result;
}

}  // namespace ncclkit_test
