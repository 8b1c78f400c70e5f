// NCCLKIT_CHECK_COLLECTIVES with real NCCL on two GPUs (two processes): ranks that call a
// collective with different count, element type, op or root each raise
// CollectiveMismatchError naming the ranks and the field, before anything reaches NCCL (so
// no kernel runs with mismatched arguments and the data stays as it was); the communicator
// stays usable; matching calls give the right results, inside a group too.
// tests/fake/test_nccl_fake_check.cpp covers the same logic without a GPU.
// ncclkit-test: labels=nccl timeout=300
#include <doctest/doctest.h>

#include <stdlib.h>  // setenv

#include <chrono>     // std::chrono
#include <cstdint>    // std::int32_t
#include <exception>  // std::exception
#include <string>     // std::string
#include <vector>     // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"
#include "ncclkit/nccl/group.hpp"
#include "support/text.hpp"

namespace {

using namespace ncclkit_test;
using ncclkit::CollectiveMismatchError;
using ncclkit::ReduceOp;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;
using ncclkit::nccl::GroupGuard;
using ncclkit::nccl::Options;

using ncclkit_test::contains;

/// Expects `call` to throw CollectiveMismatchError whose message has `part`, and the
/// communicator to stay usable.
template <class Call>
void expect_mismatch(Checker& check, Communicator& comm, const std::string& what, Call&& call,
                     const std::string& part) {
  try {
    call();
    check.expect(false, what + ": no CollectiveMismatchError");
  } catch (const CollectiveMismatchError& e) {
    check.expect(contains(e.what(), "mismatch") && contains(e.what(), part), what + ": message: " + e.what());
  } catch (const std::exception& e) {
    check.expect(false, what + ": another exception: " + e.what());
  }
  check.expect(!comm.failed(), what + ": the communicator failed");
}

}  // namespace

TEST_CASE("mismatched arguments are an error on every rank before NCCL runs anything; matching ones work") {
  if (!have_gpus(2, "the collective argument check")) return;
  run_workers(2, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    ::setenv("NCCLKIT_CHECK_COLLECTIVES", "1", 1);
    Checker check(world.rank);
    Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "checked"});
    check.expect(comm.options().check_collectives, "the variable did not turn the check on");
    const int r = comm.rank();
    const std::vector<float> ones(120, 1.0f);
    DeviceBuffer<float> floats(120, comm.device());
    floats.upload(ones);

    // Count: 120 against 100 (NCCL would run a collective of two sizes).
    expect_mismatch(
        check, comm, "count", [&] { comm.all_reduce(floats.data(), floats.data(), r == 0 ? 120 : 100); },
        "count (100 vs 120) differs");
    // Element type: 64 floats against 64 int32.
    DeviceBuffer<std::int32_t> ints(64, comm.device());
    expect_mismatch(
        check, comm, "element type",
        [&] {
          if (r == 0) {
            comm.all_reduce(floats.data(), floats.data(), 64);
          } else {
            comm.all_reduce(ints.data(), ints.data(), 64);
          }
        },
        "element type (int32 vs float) differs");
    // Op: sum against max.
    expect_mismatch(
        check, comm, "op",
        [&] { comm.all_reduce(floats.data(), floats.data(), 64, r == 0 ? ReduceOp::kSum : ReduceOp::kMax); },
        "op (max vs sum) differs");
    // Broadcast root and count.
    expect_mismatch(
        check, comm, "root", [&] { comm.broadcast(floats.data(), 32, r); }, "root (1 vs 0) differs");
    expect_mismatch(
        check, comm, "broadcast count", [&] { comm.broadcast(floats.data(), r == 0 ? 32 : 16, 0); },
        "count (16 vs 32) differs");
    comm.synchronize();
    check.expect(floats.download() == ones, "a mismatched collective changed the data");

    // Matching calls run, with the right results, alone and in a group.
    comm.all_reduce(floats.data(), floats.data(), 120);
    {
      GroupGuard group;
      comm.all_reduce(floats.data(), floats.data(), 60, ReduceOp::kSum);
      comm.broadcast(floats.data() + 60, 60, 1);
    }
    comm.barrier();
    const auto result = floats.download();
    check.expect(result[0] == 4.0f && result[59] == 4.0f,
                 "all_reduce after the mismatches: " + std::to_string(result[0]));
    check.expect(result[60] == 2.0f && result[119] == 2.0f, "broadcast in the group: " + std::to_string(result[60]));
    check.expect(!comm.failed(), "failed at the end");
    return check.finish("collective argument check");
  });
}
