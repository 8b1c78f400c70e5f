// Several "nodes" on this machine: one ncclkit-run per node, meeting through node 0's TCP store
// or a shared rendezvous folder (launch/store_coordinator.hpp). Also the rendezvous timeouts.
#include <doctest/doctest.h>

#include <regex>
#include <set>

#include "launch/launch_test_support.hpp"

using namespace launch_test;

namespace {

/// Global ranks found in "[rank R] rank R rendezvous ok W URL" lines, checking W and URL.
std::set<int> rendezvoused_ranks(const std::string& out, int world, const std::string& url_pattern) {
  std::set<int> ranks;
  const std::regex line_pattern("\\[rank ([0-9]+)\\] rank \\1 rendezvous ok ([0-9]+) (.*)");
  std::istringstream lines(out);
  std::string line;
  while (std::getline(lines, line)) {
    std::smatch match;
    if (!std::regex_match(line, match, line_pattern)) continue;
    CHECK(std::stoi(match[2]) == world);
    CHECK_MESSAGE(std::regex_match(std::string(match[3]), std::regex(url_pattern)), line);
    ranks.insert(std::stoi(match[1]));
  }
  return ranks;
}

std::string env_line(const std::string& out, int rank) {
  const auto lines = lines_starting_with(out, "[rank " + std::to_string(rank) + "] env ");
  return lines.size() == 1 ? lines[0]
                           : "<" + std::to_string(lines.size()) + " env lines for rank " + std::to_string(rank) + ">";
}

std::vector<std::string> tcp_args(int port, int node, int nproc) {
  return {"--nnodes",         "2",
          "--node-rank",      std::to_string(node),
          "--master-addr",    "127.0.0.1",
          "--master-port",    std::to_string(port),
          "--nproc-per-node", std::to_string(nproc),
          "--rdzv-timeout",   "30"};
}

}  // namespace

TEST_CASE("two nodes share node 0's TCP store: uneven workers per node, ranks laid out node by node") {
  TempDir dir;
  const int port = free_port();
  // Node 1 first: its launcher retries until node 0's store is up.
  Process node1 = start_launcher(tcp_args(port, 1, 3), {"env", "rendezvous"}, dir.path(), "node1");
  Process node0 = start_launcher(tcp_args(port, 0, 2), {"env", "rendezvous"}, dir.path(), "node0");
  REQUIRE(node0.wait(60s));
  REQUIRE(node1.wait(60s));
  REQUIRE_MESSAGE(node0.status == 0, node0.output());
  REQUIRE_MESSAGE(node1.status == 0, node1.output());
  const std::string url = "tcp://127\\.0\\.0\\.1:[0-9]+";
  CHECK(rendezvoused_ranks(node0.out(), 5, url) == std::set<int>{0, 1});
  CHECK(rendezvoused_ranks(node1.out(), 5, url) == std::set<int>{2, 3, 4});
  CHECK(contains(env_line(node0.out(), 1),
                 "RANK=1 LOCAL_RANK=1 WORLD_SIZE=5 LOCAL_WORLD_SIZE=2 GROUP_RANK=0 NODE_RANK=0 GROUP_WORLD_SIZE=2"));
  CHECK(contains(env_line(node1.out(), 4),
                 "RANK=4 LOCAL_RANK=2 WORLD_SIZE=5 LOCAL_WORLD_SIZE=3 GROUP_RANK=1 NODE_RANK=1 GROUP_WORLD_SIZE=2"));
  // The workers' store is not the launchers' (rank 0 serves it on a port of its own).
  CHECK(contains(env_line(node1.out(), 2), " MASTER_ADDR=127.0.0.1 "));
  CHECK_FALSE(contains(env_line(node1.out(), 2), " MASTER_PORT=" + std::to_string(port) + " "));
  CHECK(contains(node1.err(), "node 1 of 2: ranks 2-4 of 5"));
}

TEST_CASE("two nodes share a rendezvous folder, twice in the same folder, node ranks taken in arrival order") {
  TempDir dir;
  const std::string rdzv = dir / "rdzv";
  std::set<std::string> job_ids;  // NCCLKIT_LAUNCH_RUN_ID: one per job, the same on both nodes
  for (int run = 0; run < 2; ++run) {
    CAPTURE(run);
    const std::vector<std::string> args{"--nnodes",         "2", "--rdzv-dir",     rdzv,
                                        "--nproc-per-node", "2", "--rdzv-timeout", "30"};
    Process a = start_launcher(args, {"env", "rendezvous"}, dir.path(), "a" + std::to_string(run));
    Process b = start_launcher(args, {"env", "rendezvous"}, dir.path(), "b" + std::to_string(run));
    REQUIRE(a.wait(60s));
    REQUIRE(b.wait(60s));
    REQUIRE_MESSAGE(a.status == 0, a.output());
    REQUIRE_MESSAGE(b.status == 0, b.output());
    const std::string url = "file://" + rdzv + "/workers";
    std::set<int> ranks_a = rendezvoused_ranks(a.out(), 4, url), ranks_b = rendezvoused_ranks(b.out(), 4, url);
    CHECK(ranks_a.size() == 2);
    CHECK(ranks_b.size() == 2);
    std::set<int> all = ranks_a;
    all.insert(ranks_b.begin(), ranks_b.end());
    CHECK(all == std::set<int>{0, 1, 2, 3});
    CHECK_FALSE(contains(a.out(), "MASTER_ADDR=127"));  // a folder rendezvous sets no address
    std::set<std::string> ids;
    for (const std::string& out : {a.out(), b.out()}) {
      for (const auto& line : lines_starting_with(out, "[rank ")) {
        const auto at = line.find(" NCCLKIT_LAUNCH_RUN_ID=");
        if (at != std::string::npos) ids.insert(line.substr(at + 23));
      }
    }
    CHECK_MESSAGE(ids.size() == 1, a.output(), b.output());
    job_ids.insert(ids.begin(), ids.end());
  }
  CHECK(job_ids.size() == 2);
}

TEST_CASE("a failure on one node stops every node, and all exit with the failed worker's status") {
  TempDir dir;
  const int port = free_port();
  const std::vector<std::string> steps{"pidfile=" + dir.path(), "waitpids=" + dir.path(), "r3/exit=3", "hang"};
  Process node0 = start_launcher(tcp_args(port, 0, 2), steps, dir.path(), "node0");
  Process node1 = start_launcher(tcp_args(port, 1, 2), steps, dir.path(), "node1");
  REQUIRE(node0.wait(60s));
  REQUIRE(node1.wait(60s));
  CHECK_MESSAGE(node1.status == 3, node1.output());
  CHECK_MESSAGE(node0.status == 3, node0.output());
  CHECK(contains(node1.err(), "rank 3 (local rank 1, pid "));
  CHECK_MESSAGE(contains(node0.err(), "node 1 stopped the job: rank 3 (local rank 1, pid "), node0.output());
  CHECK(contains(node0.err(), "job failed: rank 3"));
  for (const auto& [name, pid] : read_pids(dir.path())) CHECK_MESSAGE(!alive(pid), name);
}

TEST_CASE("--max-restarts restarts every node together") {
  TempDir dir;
  const std::string rdzv = dir / "rdzv";
  const std::vector<std::string> args{"--nnodes",       "2", "--rdzv-dir",     rdzv, "--nproc-per-node", "2",
                                      "--max-restarts", "2", "--rdzv-timeout", "30"};
  // Global rank 3 fails in the first attempt: both nodes restart, and the second attempt's
  // workers rendezvous as one group of 4.
  const std::vector<std::string> steps{"env", "r3a0/exit=3", "rendezvous"};
  Process a = start_launcher(args, steps, dir.path(), "a");
  Process b = start_launcher(args, steps, dir.path(), "b");
  REQUIRE(a.wait(60s));
  REQUIRE(b.wait(60s));
  CHECK_MESSAGE(a.status == 0, a.output());
  CHECK_MESSAGE(b.status == 0, b.output());
  CHECK(contains(a.err(), "restarting the worker group (restart 1 of 2) after: rank 3"));
  CHECK(contains(b.err(), "restarting the worker group (restart 1 of 2) after: rank 3"));
  std::set<int> all = rendezvoused_ranks(a.out(), 4, ".*"), from_b = rendezvoused_ranks(b.out(), 4, ".*");
  all.insert(from_b.begin(), from_b.end());
  CHECK(all == std::set<int>{0, 1, 2, 3});
  CHECK(contains(a.out() + b.out(), "NCCLKIT_RESTART_COUNT=1"));
}

TEST_CASE("SIGTERM to one node's launcher stops every node, without restarts") {
  TempDir dir;
  const int port = free_port();
  std::vector<std::string> args0 = tcp_args(port, 0, 1), args1 = tcp_args(port, 1, 1);
  for (auto* args : {&args0, &args1}) args->insert(args->end(), {"--max-restarts", "3"});
  const std::vector<std::string> steps{"pidfile=" + dir.path(), "hang"};
  Process node0 = start_launcher(args0, steps, dir.path(), "node0");
  Process node1 = start_launcher(args1, steps, dir.path(), "node1");
  REQUIRE(wait_until([&] { return read_pids(dir.path()).size() == 2; }, 30s));
  ::kill(node0.pid, SIGTERM);
  REQUIRE(node0.wait(30s));
  REQUIRE(node1.wait(30s));
  CHECK_MESSAGE(node0.status == 128 + SIGTERM, node0.output());
  CHECK_MESSAGE(node1.status == 128 + SIGTERM, node1.output());
  CHECK_MESSAGE(contains(node1.err(), "node 0 stopped the job: the launcher got SIGTERM"), node1.output());
  CHECK_FALSE(contains(node0.err() + node1.err(), "restarting"));
  for (const auto& [name, pid] : read_pids(dir.path())) CHECK_MESSAGE(!alive(pid), name);
}

TEST_CASE("a node that never comes: the rendezvous timeout names it") {
  TempDir dir;
  const int port = free_port();
  std::vector<std::string> args = tcp_args(port, 0, 1);
  args.back() = "1.5";  // --rdzv-timeout
  Process node0 = run_launcher(args, {"exit=0"}, dir.path());
  CHECK(node0.status == 1);
  CHECK_MESSAGE(contains(node0.err(), "the rendezvous of the 2 nodes' launchers at tcp://127.0.0.1:"), node0.output());
  CHECK(contains(node0.err(), "timed out after 1.500 s: node(s) 1 never arrived (arrived: 0)"));

  // A folder rendezvous without node ranks counts launchers instead.
  Process alone =
      run_launcher({"--nnodes", "3", "--rdzv-dir", dir / "rdzv", "--rdzv-timeout", "1"}, {"exit=0"}, dir.path());
  CHECK(alone.status == 1);
  CHECK_MESSAGE(contains(alone.err(), "1 of 3 launchers arrived"), alone.output());
}

TEST_CASE("a node that cannot reach node 0's store says where it looked") {
  TempDir dir;
  const ncclkit_test::ClosedPort closed;  // nobody listens there until the case ends
  const int port = closed.port();
  std::vector<std::string> args = tcp_args(port, 1, 1);
  args.back() = "1";
  Process node1 = run_launcher(args, {"exit=0"}, dir.path());
  CHECK(node1.status == 1);
  CHECK_MESSAGE(contains(node1.err(), "cannot reach the launchers' store at 127.0.0.1:" + std::to_string(port)),
                node1.output());
  CHECK(contains(node1.err(), "--check"));
}

TEST_CASE("two launchers with the same --node-rank: the second is refused") {
  TempDir dir;
  const std::vector<std::string> args{"--nnodes",   "2",          "--node-rank",    "0",
                                      "--rdzv-dir", dir / "rdzv", "--rdzv-timeout", "3"};
  Process first = start_launcher(args, {"exit=0"}, dir.path(), "first");
  REQUIRE(wait_until([&] { return std::filesystem::exists(dir / "rdzv/launchers"); }, 10s));
  Process second = start_launcher(args, {"exit=0"}, dir.path(), "second");
  REQUIRE(first.wait(30s));
  REQUIRE(second.wait(30s));
  const std::string both = first.err() + second.err();
  CHECK_MESSAGE(contains(both, "node rank 0 is taken twice"), first.output(), second.output());
}

TEST_CASE("a worker that hangs at start-up: the workers' rendezvous timeout names the missing rank") {
  TempDir dir;
  Process launcher = run_launcher({"--nproc-per-node", "3", "--grace-period", "1"}, {"r2/hang", "rendezvous"},
                                  dir.path(), {"NCCLKIT_STORE_TIMEOUT=1.5"});
  CHECK_MESSAGE(launcher.status == 1, launcher.output());
  CHECK_MESSAGE(std::regex_search(launcher.err(), std::regex("\\[rank [01]\\] rendezvous failed: .*never arrived: 2")),
                launcher.output());
}

TEST_CASE("a node whose workers succeeded notices when another node's launcher dies") {
  TempDir dir;
  const int port = free_port();
  std::vector<std::string> args0 = tcp_args(port, 0, 1), args1 = tcp_args(port, 1, 1);
  args0.back() = "2";  // --rdzv-timeout: also how long a silent peer is waited for
  args1.back() = "2";
  Process node0 = start_launcher(args0, {"exit=0"}, dir.path(), "node0");
  Process node1 = start_launcher(args1, {"pidfile=" + dir.path(), "hang"}, dir.path(), "node1");
  REQUIRE(wait_until([&] { return read_pids(dir.path()).size() == 1; }, 30s));
  ::kill(node1.pid, SIGKILL);
  REQUIRE(node1.wait(10s));
  REQUIRE(node0.wait(30s));
  CHECK_MESSAGE(node0.status == 1, node0.output());
  CHECK(contains(node0.err(), "node 1 stopped responding (no heartbeat for 2.000 s) before its workers finished"));
  for (const auto& [name, pid] : read_pids(dir.path()))
    CHECK_MESSAGE(wait_until([&] { return !alive(pid); }, 5s), name);
}
