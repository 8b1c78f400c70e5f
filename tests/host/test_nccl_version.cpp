// NCCL's version codes in words, and which runtime NCCL the fused compressed all-reduce's kernel
// accepts (ncclkit/nccl/detail/nccl_version.hpp): the same major and minor version as the
// headers it was compiled against, a patch release apart allowed (its window structure is then
// checked on the GPU, tests/gpu/test_nccl_fusion.cpp). Host code only.
#include <doctest/doctest.h>

#include <string>  // std::string

#include "ncclkit/nccl/detail/nccl_version.hpp"
#include "support/text.hpp"

using ncclkit::nccl::detail::device_api_version_verdict;
using ncclkit::nccl::detail::nccl_version_text;
using ncclkit::nccl::detail::window_layout_problem;
using ncclkit_test::contains;

TEST_CASE("nccl version: codes in words") {
  CHECK(nccl_version_text(22809) == "2.28.9");
  CHECK(nccl_version_text(22803) == "2.28.3");
  CHECK(nccl_version_text(23000) == "2.30.0");
  CHECK(nccl_version_text(21912) == "2.19.12");
}

TEST_CASE("nccl version: the fused kernel runs with a patch release of the NCCL it was built against") {
  CHECK(device_api_version_verdict(22809, 22809).empty());
  CHECK(device_api_version_verdict(22809, 22803).empty());
  CHECK(device_api_version_verdict(22803, 22809).empty());
}

TEST_CASE("nccl version: another minor or major version is refused, saying both and what to do") {
  for (const int running : {22900, 22705, 32800}) {
    CAPTURE(running);
    const std::string why = device_api_version_verdict(22809, running);
    CHECK(contains(why, "built against NCCL 2.28.9"));
    CHECK(contains(why, "runs with NCCL " + nccl_version_text(running)));
    CHECK(contains(why, "same major and minor version"));
    CHECK(contains(why, "build ncclkit against the headers of the NCCL it runs with"));
  }
}

TEST_CASE("nccl version: a window whose structure did not check out is explained") {
  const std::string why = window_layout_problem(22809, 22803, "its local pointer reads other memory than the window's");
  CHECK(contains(why, "NCCL 2.28.3 lays out its window structure otherwise than the NCCL 2.28.9 headers"));
  CHECK(contains(why, "its local pointer reads other memory"));
  CHECK(contains(why, "build ncclkit against the headers of the NCCL it runs with"));
}
