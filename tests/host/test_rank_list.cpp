// Tests of ncclkit/core/detail/rank_list.hpp: how messages name sets of ranks.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include "ncclkit/core/detail/rank_list.hpp"

TEST_CASE("rank lists are compressed into ranges") {
  using ncclkit::detail::format_ranks;
  CHECK(format_ranks({}) == "");
  CHECK(format_ranks({3}) == "3");
  CHECK(format_ranks({0, 1, 2, 5, 7, 8}) == "0-2, 5, 7-8");
  CHECK(format_ranks({4, 5}) == "4-5");
}

TEST_CASE("one rank is 'rank', several are 'ranks'") {
  using ncclkit::detail::rank_or_ranks;
  CHECK(rank_or_ranks({3}) == "rank 3");
  CHECK(rank_or_ranks({0, 1, 2, 5}) == "ranks 0-2, 5");
}
