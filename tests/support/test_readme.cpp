// Runs the README's C++ tour (extracted into readme_snippets.hpp at configure time).
#include <doctest/doctest.h>

#include "readme_snippets.hpp"

TEST_CASE("the README's Gloo example runs with four workers") {
  CHECK(run_four_workers());
}
