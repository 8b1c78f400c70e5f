// Tests of ncclkit/core/detail/argument_checks.hpp: the one shape of a misuse message on both
// backends, and the checks they share, each saying what was wrong and what to do.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <string>  // std::string
#include <vector>  // std::vector

#include "ncclkit/core/detail/argument_checks.hpp"
#include "support/text.hpp"

namespace shared_checks = ncclkit::detail;
using ncclkit::DataType;
using ncclkit::MemoryKind;
using ncclkit::TensorView;
using ncclkit_test::contains;

TEST_CASE("a misuse message is 'ncclkit: <op> on <communicator>: <what>', and its what can be read back") {
  const std::string who = "gloo communicator 'grads' (rank 1 of 4)";
  const std::string message = shared_checks::misuse_message("all_reduce", who, "root 9 is outside [0, 4); give a rank");
  CHECK(message ==
        "ncclkit: all_reduce on gloo communicator 'grads' (rank 1 of 4): root 9 is outside [0, 4); give a rank");
  CHECK(shared_checks::misuse_what(message, "all_reduce", who) == "root 9 is outside [0, 4); give a rank");
  CHECK(shared_checks::misuse_what("another shape", "all_reduce", who) == "another shape");
}

TEST_CASE("the shared checks pass good arguments and say what is wrong, then what to do") {
  CHECK(shared_checks::root_problem(0, 1).empty());
  CHECK(shared_checks::root_problem(3, 4).empty());
  CHECK(shared_checks::root_problem(4, 4) ==
        "root 4 is outside [0, 4); give a rank of this communicator, the same on every rank");
  CHECK(contains(shared_checks::root_problem(-1, 4), "root -1 is outside [0, 4)"));
  CHECK(shared_checks::peer_problem(1, 2).empty());
  CHECK(shared_checks::peer_problem(2, 2) == "peer 2 is outside [0, 2); give a rank of this communicator");

  std::vector<float> f(8);
  std::vector<double> d(8);
  const TensorView floats = TensorView::of(f.data(), f.size());
  CHECK(shared_checks::element_types_problem(floats, floats).empty());
  CHECK(shared_checks::element_types_problem(floats, TensorView::of(d.data(), d.size())) ==
        "element types differ: float and double; give both buffers the same element type");

  CHECK(shared_checks::sizes_problem("in.count == out.count", 16, 15) ==
        "sizes do not match (in.count == out.count): 16 and 15 elements; size the buffers so that in.count == "
        "out.count");

  CHECK(shared_checks::memory_problem("input", floats, MemoryKind::kHost, "copy it").empty());
  CHECK(shared_checks::memory_problem("input", floats, MemoryKind::kDevice, "pass device memory") ==
        "input is marked as host memory (TensorView::where), but this backend moves device memory; pass device "
        "memory");

  CHECK(shared_checks::null_problem("output", TensorView{nullptr, 0, DataType::kFloat32}).empty());
  CHECK(shared_checks::null_problem("output", TensorView{nullptr, 3, DataType::kFloat32}) ==
        "output is a null pointer with count 3; pass the buffer's address, or a count of 0");

  CHECK(shared_checks::overlap_problem(floats, floats).empty());  // in place
  CHECK(shared_checks::overlap_problem(TensorView::of(f.data(), 4), TensorView::of(f.data() + 4, 4)).empty());
  CHECK(contains(shared_checks::overlap_problem(TensorView::of(f.data(), 4), TensorView::of(f.data() + 2, 4)),
                 "input and output overlap without being in place"));
}
