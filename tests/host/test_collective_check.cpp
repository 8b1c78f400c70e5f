// The collective argument check's backend-independent part (ncclkit/core/collective_check.hpp):
// the fingerprint, its fixed-size encoding, and the comparison that every rank makes into the
// message it raises. No backend, no processes: the backends' tests (test_gloo_check.cpp,
// tests/fake/test_nccl_fake_check.cpp, tests/gpu/test_nccl_check.cu) prove the exchange.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <stdlib.h>  // setenv, unsetenv

#include <array>    // std::array
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint8_t
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/core/collective_check.hpp"
#include "ncclkit/core/knobs.hpp"
#include "support/text.hpp"

namespace {

using ncclkit::CollectiveFingerprint;
using ncclkit::DataType;
using ncclkit::ReduceOp;
using ncclkit::detail::find_mismatch;

using ncclkit_test::contains;

CollectiveFingerprint all_reduce(std::size_t count, DataType type = DataType::kFloat32, ReduceOp op = ReduceOp::kSum,
                                 std::uint64_t seq = 7) {
  return CollectiveFingerprint::of("all_reduce", count, type).with_op(op).with_sequence(seq);
}

}  // namespace

TEST_CASE("a fingerprint survives its encoding, field by field") {
  const std::size_t counts[] = {3, 0, 5};
  auto f = CollectiveFingerprint::of("all_gather_uneven", 8, DataType::kBFloat16)
               .with_op(ReduceOp::kMax)
               .with_root(3)
               .with_counts(counts)
               .with_sequence(0x0123456789abcdefull);
  f.count = 0xfedcba9876543210ull;
  const auto bytes = ncclkit::detail::encode(f);
  CHECK(bytes.size() == ncclkit::detail::kFingerprintBytes);
  const auto back = ncclkit::detail::decode(bytes);
  REQUIRE(back.has_value());
  CHECK(*back == f);
  CHECK(back->name() == "all_gather_uneven");

  const auto barrier = CollectiveFingerprint::of("barrier").with_sequence(1);
  const auto barrier_back = ncclkit::detail::decode(ncclkit::detail::encode(barrier));
  REQUIRE(barrier_back.has_value());
  CHECK(*barrier_back == barrier);
  CHECK(barrier_back->dtype == CollectiveFingerprint::kNone);
  CHECK(barrier_back->root == CollectiveFingerprint::kNone);
}

TEST_CASE("bytes that are not an encoded fingerprint are refused, not misread") {
  auto bytes = ncclkit::detail::encode(all_reduce(4));
  std::vector<std::uint8_t> short_bytes(bytes.begin(), bytes.end() - 1);
  CHECK_FALSE(ncclkit::detail::decode(short_bytes).has_value());
  auto bad_magic = bytes;
  bad_magic[0] ^= 0xff;
  CHECK_FALSE(ncclkit::detail::decode(bad_magic).has_value());
  auto unterminated = bytes;
  unterminated.back() = 'x';
  CHECK_FALSE(ncclkit::detail::decode(unterminated).has_value());
}

TEST_CASE("long names are cut to the capacity; per-rank counts that differ give different hashes") {
  const auto f = CollectiveFingerprint::of("a_collective_name_much_longer_than_the_capacity");
  CHECK(f.name().size() == CollectiveFingerprint::kNameCapacity);
  const std::size_t a[] = {1, 2, 3};
  const std::size_t b[] = {1, 3, 2};
  CHECK(ncclkit::hash_counts(a) != ncclkit::hash_counts(b));
  CHECK(ncclkit::hash_counts(a) == ncclkit::hash_counts(std::vector<std::size_t>{1, 2, 3}));
  CHECK(ncclkit::hash_counts({}) != 0);
}

TEST_CASE("fingerprints that agree give no mismatch") {
  const std::vector<CollectiveFingerprint> all(4, all_reduce(100));
  CHECK_FALSE(find_mismatch(all).has_value());
  CHECK_FALSE(find_mismatch(std::vector<CollectiveFingerprint>{}).has_value());
}

TEST_CASE("a count mismatch of two ranks names both ranks, both calls and the field with both values") {
  const std::vector<CollectiveFingerprint> all = {all_reduce(120), all_reduce(100)};
  const auto message = find_mismatch(all);
  REQUIRE(message.has_value());
  CHECK_MESSAGE(contains(*message,
                         "collective argument mismatch at seq 7: rank 1 called all_reduce(count=100, float, "
                         "sum) but rank 0 called all_reduce(count=120, float, sum): count (100 vs 120) differs"),
                *message);
  CHECK(contains(*message, "Nothing was run"));
}

TEST_CASE("each differing field is named: element type, op, root, collective, seq, per-rank counts") {
  SUBCASE("element type") {
    const auto m = find_mismatch(std::vector{all_reduce(8), all_reduce(8, DataType::kFloat64)});
    REQUIRE(m);
    CHECK_MESSAGE(contains(*m, "element type (double vs float) differs"), *m);
  }
  SUBCASE("op") {
    const auto m = find_mismatch(std::vector{all_reduce(8), all_reduce(8, DataType::kFloat32, ReduceOp::kMax)});
    REQUIRE(m);
    CHECK_MESSAGE(contains(*m, "op (max vs sum) differs"), *m);
  }
  SUBCASE("root, and several fields at once") {
    const auto root0 = CollectiveFingerprint::of("broadcast", 10, DataType::kInt32).with_root(0).with_sequence(3);
    auto root1 = root0;
    root1.root = 1;
    root1.count = 12;
    const auto m = find_mismatch(std::vector{root0, root1});
    REQUIRE(m);
    CHECK_MESSAGE(contains(*m,
                           "rank 1 called broadcast(count=12, int32, root=1) but rank 0 called broadcast(count=10, "
                           "int32, root=0): count (12 vs 10), root (1 vs 0) differ"),
                  *m);
  }
  SUBCASE("another collective") {
    const auto other = CollectiveFingerprint::of("broadcast", 8, DataType::kFloat32).with_root(0).with_sequence(7);
    const auto m = find_mismatch(std::vector{all_reduce(8), other});
    REQUIRE(m);
    CHECK_MESSAGE(contains(*m, "collective (broadcast vs all_reduce)"), *m);
    CHECK(contains(*m, "op (none vs sum)"));
    CHECK(contains(*m, "root (0 vs none)"));
  }
  SUBCASE("sequence number") {
    const auto m = find_mismatch(std::vector{all_reduce(8), all_reduce(8, DataType::kFloat32, ReduceOp::kSum, 8)});
    REQUIRE(m);
    CHECK_MESSAGE(contains(*m, "seq (8 vs 7) differs"), *m);
  }
  SUBCASE("per-rank counts of an uneven gather") {
    const std::size_t a[] = {1, 2};
    const std::size_t b[] = {2, 1};
    const auto fa = CollectiveFingerprint::of("all_gatherv", 3, DataType::kUint8).with_counts(a).with_sequence(2);
    const auto fb = CollectiveFingerprint::of("all_gatherv", 3, DataType::kUint8).with_counts(b).with_sequence(2);
    const auto m = find_mismatch(std::vector{fa, fb});
    REQUIRE(m);
    CHECK_MESSAGE(contains(*m, "per-rank counts (#"), *m);
  }
}

TEST_CASE("the majority is the reference: the odd ranks are the ones named as differing") {
  std::vector<CollectiveFingerprint> all(6, all_reduce(64));
  all[0] = all_reduce(32);  // rank 0 is the odd one out
  all[4] = all_reduce(16);
  all[5] = all_reduce(16);
  const auto m = find_mismatch(all);
  REQUIRE(m);
  CHECK_MESSAGE(contains(*m,
                         "ranks 4-5 called all_reduce(count=16, float, sum) but ranks 1-3 called "
                         "all_reduce(count=64, float, sum): count (16 vs 64) differs"),
                *m);
  CHECK_MESSAGE(contains(*m, "rank 0 called all_reduce(count=32, float, sum) but ranks 1-3 called"), *m);
  // The larger odd group first, then the smaller.
  CHECK(m->find("ranks 4-5 called") < m->find("rank 0 called"));
}

TEST_CASE("a tie goes to the group of the lowest rank, so two ranks compare with rank 0") {
  const auto m = find_mismatch(std::vector{all_reduce(1), all_reduce(2)});
  REQUIRE(m);
  CHECK_MESSAGE(contains(*m, "rank 1 called all_reduce(count=2"), *m);
}

TEST_CASE("a world where every rank differs stays a message of bounded length") {
  std::vector<CollectiveFingerprint> all;
  for (int r = 0; r < 1000; ++r) all.push_back(all_reduce(static_cast<std::size_t>(r) + 1));
  const auto m = find_mismatch(all);
  REQUIRE(m);
  CHECK(m->size() < 4000);
  CHECK_MESSAGE(contains(*m, "and 991 more group(s) of ranks (991 rank(s))"), *m);
}

TEST_CASE("a rank that rejected its own arguments carries its reason, and is named with it on every rank") {
  auto bad = CollectiveFingerprint::of("all_reduce")
                 .with_sequence(7)
                 .with_rejection("needs in.count == out.count (got 4 and 5)");
  CHECK(bad.is_rejected());
  CHECK_FALSE(all_reduce(4).is_rejected());
  const auto back = ncclkit::detail::decode(ncclkit::detail::encode(bad));
  REQUIRE(back.has_value());
  CHECK(*back == bad);
  CHECK(back->rejection() == "needs in.count == out.count (got 4 and 5)");
  CHECK(CollectiveFingerprint::of("x").with_rejection(std::string(500, 'r')).rejection().size() ==
        CollectiveFingerprint::kReasonCapacity);
  CHECK(CollectiveFingerprint::of("x").with_rejection("").is_rejected());

  const std::vector<CollectiveFingerprint> all = {all_reduce(4), bad, all_reduce(4)};
  const auto message = find_mismatch(all);
  REQUIRE(message.has_value());
  CHECK_MESSAGE(contains(*message,
                         "collective argument mismatch at seq 7: rank 1 rejected its own arguments to "
                         "all_reduce: needs in.count == out.count (got 4 and 5); ranks 0, 2 called "
                         "all_reduce(count=4, float, sum)"),
                *message);
  CHECK(contains(*message, "Nothing was run, on any rank"));
  // Every rank rejecting the same way is still an error, not agreement.
  const std::vector<CollectiveFingerprint> every = {bad, bad};
  REQUIRE(find_mismatch(every).has_value());
  CHECK(contains(*find_mismatch(every), "ranks 0-1 rejected their own arguments"));
}

TEST_CASE("NCCLKIT_CHECK_COLLECTIVES: unset keeps the option, 0 is off, another integer on, anything else an error") {
  const ncclkit::Knob& variable = ncclkit::knob("NCCLKIT_CHECK_COLLECTIVES");
  ::unsetenv("NCCLKIT_CHECK_COLLECTIVES");
  CHECK_FALSE(ncclkit::environment_overrides(variable, false));
  CHECK(ncclkit::environment_overrides(variable, true));
  ::setenv("NCCLKIT_CHECK_COLLECTIVES", "0", 1);
  CHECK_FALSE(ncclkit::environment_overrides(variable, true));
  ::setenv("NCCLKIT_CHECK_COLLECTIVES", "1", 1);
  CHECK(ncclkit::environment_overrides(variable, false));
  ::setenv("NCCLKIT_CHECK_COLLECTIVES", "yes", 1);
  CHECK_THROWS_AS(ncclkit::environment_overrides(variable, false), ncclkit::ConfigError);
  ::unsetenv("NCCLKIT_CHECK_COLLECTIVES");
}

TEST_CASE("CollectiveMismatchError is a ConfigError: the communicator stays usable") {
  const ncclkit::CollectiveMismatchError error("x");
  const ncclkit::ConfigError& as_config = error;
  CHECK(std::string(as_config.what()) == "x");
}
