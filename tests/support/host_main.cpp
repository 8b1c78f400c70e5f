// main() of the host test executables: doctest (support/doctest_main.cpp) runs what the
// command line selects.
#include "support/doctest_runner.hpp"

int main(int argc, char** argv) { return ncclkit_test::run_doctest(argc, argv); }
