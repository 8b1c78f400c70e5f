// ncclkit-run across two real network stacks: two network namespaces joined by a veth pair,
// one launcher in each, as two hosts would be. Needs root and `ip` (iproute2). Under CI=true
// it must run: a missing prerequisite fails the test there; elsewhere it is skipped (exit 77,
// which CTest reports as "Skipped") with the reason on stderr.
// ncclkit-test: skip_code=77
#include <doctest/doctest.h>

#include <set>

#include "launch/launch_test_support.hpp"

using namespace launch_test;

namespace {

/// Runs a command to the end; its shell-style status and output.
std::pair<int, std::string> run_command(const std::vector<std::string>& argv, const std::string& dir) {
  static int counter = 0;
  Process process = start(argv, dir, "cmd" + std::to_string(counter++));
  process.wait(30s);
  return {process.status, process.out() + process.err()};
}

std::string ip_path() {
  for (const char* candidate : {"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"})
    if (::access(candidate, X_OK) == 0) return candidate;
  return "";
}

/// Two namespaces "nkl<pid>a" and "nkl<pid>b", with veth ends at 10.233.0.1 and 10.233.0.2,
/// removed (with the veth pair) by the destructor. Namespaces left by a killed earlier run
/// (whose pid is gone) are removed first.
class TwoHosts {
 public:
  explicit TwoHosts(const TempDir& dir) : dir_(dir.path()), ip_(ip_path()) {
    const std::string id = std::to_string(::getpid());
    a_ = "nkl" + id + "a";
    b_ = "nkl" + id + "b";
    veth_a_ = "nkva" + id;
    veth_b_ = "nkvb" + id;
    remove_stale();
    for (const auto& args :
         std::vector<std::vector<std::string>>{{"netns", "add", a_},
                                               {"netns", "add", b_},
                                               {"link", "add", veth_a_, "type", "veth", "peer", "name", veth_b_},
                                               {"link", "set", veth_a_, "netns", a_},
                                               {"link", "set", veth_b_, "netns", b_},
                                               {"-n", a_, "addr", "add", "10.233.0.1/24", "dev", veth_a_},
                                               {"-n", b_, "addr", "add", "10.233.0.2/24", "dev", veth_b_},
                                               {"-n", a_, "link", "set", "lo", "up"},
                                               {"-n", b_, "link", "set", "lo", "up"},
                                               {"-n", a_, "link", "set", veth_a_, "up"},
                                               {"-n", b_, "link", "set", veth_b_, "up"}}) {
      std::vector<std::string> argv{ip_};
      argv.insert(argv.end(), args.begin(), args.end());
      auto [status, output] = run_command(argv, dir_);
      REQUIRE_MESSAGE(status == 0, "ip ", args[0], " ", args[1], " failed: ", output);
    }
  }
  ~TwoHosts() {
    for (const auto& ns : {a_, b_}) run_command({ip_, "netns", "del", ns}, dir_);
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  /// The launcher, started inside namespace `host` (0: a, 1: b).
  Process launcher(int host, const std::vector<std::string>& launcher_args, const std::vector<std::string>& steps,
                   const std::string& tag, const std::vector<std::string>& env = {}) {
    std::vector<std::string> argv{ip_, "netns", "exec", host == 0 ? a_ : b_, kLauncher};
    argv.insert(argv.end(), launcher_args.begin(), launcher_args.end());
    if (!steps.empty()) {
      argv.push_back("--");
      argv.push_back(kWorker);
      argv.insert(argv.end(), steps.begin(), steps.end());
    }
    return start(argv, dir_, tag, env);
  }
  const std::string& veth(int host) const { return host == 0 ? veth_a_ : veth_b_; }

 private:
  void remove_stale() {
    auto [status, output] = run_command({ip_, "netns", "list"}, dir_);
    std::istringstream lines(output);
    std::string line;
    while (std::getline(lines, line)) {
      const std::string name = line.substr(0, line.find(' '));
      if (name.rfind("nkl", 0) != 0 || name.size() < 5) continue;
      const pid_t owner = std::atoi(name.substr(3, name.size() - 4).c_str());
      if (owner > 0 && ::kill(owner, 0) != 0) run_command({ip_, "netns", "del", name}, dir_);
    }
  }

  std::string dir_;
  std::string ip_;
  std::string a_, b_, veth_a_, veth_b_;
};

/// Exits 77 (skipped) where the test cannot run and CI is not set; fails under CI=true.
void require_prerequisites() {
  std::string missing;
  if (::geteuid() != 0) missing = "root (network namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN)";
  if (ip_path().empty()) missing += std::string(missing.empty() ? "" : " and ") + "`ip` (apt-get install iproute2)";
  if (missing.empty()) return;
  const char* ci = std::getenv("CI");
  if (ci != nullptr && std::string(ci) == "true") {
    FAIL("the two-namespace launcher test must run under CI=true, but it needs " << missing);
  }
  std::fprintf(stderr, "SKIPPED test_launch_netns: needs %s\n", missing.c_str());
  std::fflush(stderr);
  std::_Exit(77);
}

std::vector<std::string> node_args(int node, const std::vector<std::string>& extra = {}) {
  std::vector<std::string> args{"--nnodes",         "2",          "--node-rank",    std::to_string(node),
                                "--master-addr",    "10.233.0.1", "--master-port",  "29517",
                                "--nproc-per-node", "2",          "--rdzv-timeout", "20"};
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

}  // namespace

TEST_CASE("two hosts joined by a veth pair: --check, a job, and broken setups") {
  require_prerequisites();
  TempDir dir;
  TwoHosts hosts(dir);

  SUBCASE("--check on a healthy pair of hosts") {
    Process a = hosts.launcher(0, node_args(0, {"--check"}), {}, "check-a");
    Process b = hosts.launcher(1, node_args(1, {"--check"}), {}, "check-b");
    REQUIRE(a.wait(60s));
    REQUIRE(b.wait(60s));
    CHECK_MESSAGE(a.status == 0, a.output());
    CHECK_MESSAGE(b.status == 0, b.output());
    for (const Process* p : {&a, &b}) {
      const std::string out = p->out();
      CHECK_MESSAGE(contains(out, "2 node(s); store: tcp://"), out);
      CHECK(contains(out, hosts.veth(0) + " 10.233.0.1"));
      CHECK(contains(out, hosts.veth(1) + " 10.233.0.2"));
      CHECK(lines_starting_with(out, "0 ").size() == 1);
      CHECK(contains(lines_starting_with(out, "0 ").front(), "node 1 ok"));
      CHECK(contains(lines_starting_with(out, "1 ").front(), "node 0 ok"));
      CHECK(contains(out, "problems: none found"));
    }
  }

  SUBCASE("a job of 2 x 2 workers across the hosts") {
    const std::vector<std::string> steps{"env", "rendezvous"};
    Process b = hosts.launcher(1, node_args(1), steps, "job-b");
    Process a = hosts.launcher(0, node_args(0), steps, "job-a");
    REQUIRE(a.wait(60s));
    REQUIRE(b.wait(60s));
    REQUIRE_MESSAGE(a.status == 0, a.output());
    REQUIRE_MESSAGE(b.status == 0, b.output());
    for (int rank = 0; rank < 4; ++rank) {
      const std::string out = rank < 2 ? a.out() : b.out();
      CHECK_MESSAGE(lines_starting_with(out, "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                                                 " rendezvous ok 4 tcp://10.233.0.1:")
                            .size() == 1,
                    out);
    }
    CHECK(contains(b.out(), "[rank 3] env RANK=3 LOCAL_RANK=1 WORLD_SIZE=4 LOCAL_WORLD_SIZE=2 GROUP_RANK=1"));
  }

  SUBCASE("--check names the interface to set when NCCL would use one the other host cannot reach") {
    Process a = hosts.launcher(0, node_args(0, {"--check"}), {}, "bad-a", {"NCCL_SOCKET_IFNAME=lo"});
    Process b = hosts.launcher(1, node_args(1, {"--check"}), {}, "bad-b");
    REQUIRE(a.wait(60s));
    REQUIRE(b.wait(60s));
    CHECK_MESSAGE(a.status == 1, a.output());
    CHECK_MESSAGE(b.status == 1, b.output());
    const std::string out = b.out();
    CHECK_MESSAGE(contains(out, "[node 0] NCCL would use the loopback interface lo"), out);
    CHECK(contains(out, "[node 1 -> node 0] cannot connect to node 0's NCCL interface lo (127.0.0.1)"));
    CHECK(contains(out, "set NCCL_SOCKET_IFNAME=" + hosts.veth(0) + " on node 0"));
    CHECK(contains(lines_starting_with(out, "1 ").front(), "node 0 only on another interface"));
  }

  SUBCASE("--check with a wrong --master-addr on the second host") {
    Process a = hosts.launcher(0, node_args(0, {"--check", "--rdzv-timeout", "3"}), {}, "addr-a");
    Process b = hosts.launcher(1,
                               {"--nnodes", "2", "--node-rank", "1", "--master-addr", "10.233.0.9", "--master-port",
                                "29517", "--check", "--rdzv-timeout", "2"},
                               {}, "addr-b");
    REQUIRE(a.wait(60s));
    REQUIRE(b.wait(60s));
    CHECK(a.status == 1);
    CHECK(b.status == 1);
    CHECK_MESSAGE(contains(b.out(), "cannot reach the launchers' store at 10.233.0.9:29517"), b.output());
    CHECK_MESSAGE(contains(a.out(), "node(s) 1 did not join the check"), a.output());
  }
}
