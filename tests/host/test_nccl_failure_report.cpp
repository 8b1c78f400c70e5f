// FailureReport (ncclkit/nccl/failure_report.hpp): which ranks a failure report shows as
// behind, and its text. Plain data, so it runs on machines without a GPU. The first cases
// are progress tables of a skip drill on GPUs, where one survivor got a collective ahead of
// the others: their reports must not blame themselves.
#include <doctest/doctest.h>

#include <cstdint>  // std::uint64_t
#include <random>   // std::mt19937_64, std::uniform_int_distribution
#include <string>   // std::string, std::to_string
#include <utility>  // std::move
#include <vector>   // std::vector

#include "ncclkit/nccl/failure_report.hpp"
#include "support/text.hpp"

namespace {

using ncclkit::nccl::FailureReport;
using ncclkit::nccl::PeerProgress;

PeerProgress known(int rank, std::uint64_t issued, std::uint64_t completed, bool failed = false) {
  return PeerProgress{rank, true, issued, completed, failed};
}

FailureReport report_of(int rank, std::uint64_t seq, std::vector<PeerProgress> peers) {
  FailureReport report;
  report.name = "drill";
  report.rank = rank;
  report.world = static_cast<int>(peers.size());
  report.device = rank;
  report.reason = "did not complete within the timeout of 5.00 s";
  report.has_operation = seq != 0;
  report.operation = "all_reduce";
  report.seq = seq;
  report.bytes = 4194304;
  report.waited_s = 5.01;
  report.issued = seq;
  report.completed = seq == 0 ? 0 : seq - 1;
  report.aborted = true;
  report.abort_s = 1.09;
  report.peers = std::move(peers);
  return report;
}

using ncclkit_test::contains;

TEST_CASE("the rank that never issued the failed collective is behind; a rank that got ahead is not") {
  // Rank 0's report in a skip drill: rank 3 skipped seq 2, rank 1 had issued seq 3.
  const auto report = report_of(0, 2, {known(0, 2, 1, true), known(1, 3, 2), known(2, 2, 1, true), known(3, 1, 1)});
  CHECK(report.needed_seq() == 2);
  CHECK(report.ranks_behind() == std::vector<int>{3});
  const std::string text = report.describe();
  CHECK(contains(text, "\n    rank 0: 2/1  (failed too)\n"));
  CHECK(contains(text, "\n    rank 1: 3/2\n"));
  CHECK(contains(text, "\n    rank 2: 2/1  (failed too)\n"));
  CHECK(contains(text, "\n    rank 3: 1/1  <- behind: has not issued seq 2\n"));
  CHECK(contains(text, "in flight: all_reduce seq 2, 4194304 bytes (4.0 MiB), waited 5.010 s"));
  // One label for communicators in every message, one format for durations (core/).
  CHECK(text.rfind("nccl communicator 'drill' (rank 0 of 4, GPU 0) failed: ", 0) == 0);
  CHECK(contains(text, "ncclCommAbort took 1.090 s"));
}

TEST_CASE("a rank failing at a later collective shows every rank that never issued it") {
  // Rank 1's view when its seq 3 fails: ranks 0 and 2 failed at seq 2, rank 3 never issued it.
  const auto report =
      report_of(1, 3, {known(0, 2, 1, true), known(1, 3, 2, true), known(2, 2, 1, true), known(3, 1, 1)});
  CHECK(report.ranks_behind() == std::vector<int>{0, 2, 3});
  const std::string text = report.describe();
  CHECK(contains(text, "\n    rank 0: 2/1  <- behind: has not issued seq 3  (failed too)\n"));
  CHECK(contains(text, "\n    rank 1: 3/2  (failed too)\n"));
  CHECK(contains(text, "\n    rank 3: 1/1  <- behind: has not issued seq 2\n"));
}

TEST_CASE("a record covering several collectives: every rank short of its last one is behind") {
  // Rank 0 issued seq 10..14 back to back on one stream (one record, one event); rank 1
  // stopped after issuing 12, so seq 13 cannot complete. Judged by seq 10 alone, no rank
  // would be behind.
  auto report =
      report_of(0, 10, {known(0, 14, 9, true), known(1, 12, 9), known(2, 14, 9, true), known(3, 14, 9, true)});
  report.last_seq = 14;
  report.issued = 14;
  CHECK(report.needed_seq() == 14);
  CHECK(report.ranks_behind() == std::vector<int>{1});
  CHECK(contains(report.describe(), "\n    rank 1: 12/9  <- behind: has not issued seq 13\n"));
  report.last_seq = 0;  // a record of seq 10 alone
  CHECK(report.needed_seq() == 10);
  CHECK(report.ranks_behind().empty());
}

TEST_CASE("with no collective in flight, behind means behind the most advanced known rank") {
  auto report =
      report_of(2, 0, {known(0, 5, 5), known(1, 5, 4), known(2, 4, 4, true), PeerProgress{3, false, 0, 0, false}});
  CHECK_FALSE(report.has_operation);
  CHECK(report.needed_seq() == 5);
  CHECK(report.ranks_behind() == std::vector<int>{2});
  const std::string text = report.describe();
  CHECK(contains(text, "no collective was in flight"));
  CHECK(contains(text, "\n    rank 2: 4/4  <- behind: has not issued seq 5  (failed too)\n"));
  CHECK(contains(text, "\n    rank 3: unknown (published nothing, or the store did not answer)\n"));

  // An operation without a sequence number (a captured collective) falls back the same way.
  report.has_operation = true;
  report.seq = 0;
  CHECK(report.needed_seq() == 5);
  CHECK(report.ranks_behind() == std::vector<int>{2});
}

TEST_CASE("random progress tables: behind is exactly 'known and issued < the failed seq', in the text too") {
  std::mt19937_64 random(20261126);
  for (int round = 0; round < 500; ++round) {
    const int world = std::uniform_int_distribution<int>(1, 70)(random);  // past the 64 ranks shown
    const std::uint64_t seq = std::uniform_int_distribution<std::uint64_t>(1, 9)(random);
    std::vector<PeerProgress> peers;
    std::vector<int> expected;
    for (int r = 0; r < world; ++r) {
      const bool is_known = std::uniform_int_distribution<int>(0, 5)(random) != 0;
      const std::uint64_t issued = std::uniform_int_distribution<std::uint64_t>(1, 10)(random);
      const std::uint64_t completed = std::uniform_int_distribution<std::uint64_t>(0, issued)(random);
      peers.push_back(PeerProgress{r, is_known, is_known ? issued : 0, is_known ? completed : 0, r % 3 == 0});
      if (is_known && issued < seq) expected.push_back(r);
    }
    const auto report = report_of(0, seq, peers);
    REQUIRE(report.ranks_behind() == expected);
    const std::string text = report.describe();
    for (int r = 0; r < world && r < 64; ++r) {
      const auto at = text.find("\n    rank " + std::to_string(r) + ": ");
      REQUIRE(at != std::string::npos);
      const auto line = text.substr(at + 1, text.find('\n', at + 1) - at - 1);
      const bool marked = contains(line, "<- behind");
      const bool behind = peers[static_cast<std::size_t>(r)].known && peers[static_cast<std::size_t>(r)].issued < seq;
      CHECK_MESSAGE(marked == behind, line);
    }
    if (world > 64) CHECK(contains(text, "\n    ... " + std::to_string(world - 64) + " more ranks"));
  }
}

}  // namespace
