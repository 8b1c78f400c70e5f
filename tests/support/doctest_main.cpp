// doctest's implementation and ncclkit_test::run_doctest (support/doctest_runner.hpp), compiled
// once into the library every test executable links (ncclkit_doctest, tests/CMakeLists.txt).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>  // std::fprintf

#include "support/doctest_runner.hpp"

namespace ncclkit_test {
namespace {

unsigned selected_test_cases = 0;

/// Notes how many test cases passed the command line's filters.
struct SelectionCounter : doctest::IReporter {
  explicit SelectionCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats& stats) override {
    selected_test_cases = stats.numTestCasesPassingFilters;
  }
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

}  // namespace

DOCTEST_REGISTER_LISTENER("ncclkit_selection_counter", 1, SelectionCounter);

int run_doctest(int argc, char** argv) {
  doctest::Context context(argc, argv);
  const int result = context.run();
  if (context.shouldExit()) return result;  // --help, --list-test-cases, ...
  if (result == 0 && selected_test_cases == 0) {
    std::fprintf(stderr,
                 "no test case matches the filters given (a test file renamed or moved? "
                 "see tests/CMakeLists.txt)\n");
    return 1;
  }
  return result;
}

}  // namespace ncclkit_test
