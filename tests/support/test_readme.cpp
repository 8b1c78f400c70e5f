// Runs the README's C++ tour (extracted into readme_snippets.hpp at configure time).
#include <doctest/doctest.h>

// The tour has a main() of its own (a user copies it as a program): renamed here, where
// doctest's main runs the tour through the test case below.
#define main readme_tour_main
#include "readme_snippets.hpp"
#undef main

TEST_CASE("the README's Gloo example runs with four workers") { CHECK(run_four_workers()); }
TEST_CASE("the README's trainer fits its line with two workers") { CHECK(fit_with_two_workers()); }
