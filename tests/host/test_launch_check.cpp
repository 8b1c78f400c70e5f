// ncclkit-run --check (launch/check.hpp, interfaces.hpp, versions.hpp): the pieces over fake
// inputs, then the program on a healthy and on broken setups (two "nodes" on loopback here;
// test_launch_netns does it across two network namespaces).
#include <doctest/doctest.h>

#include <fstream>

#include "launch/check.hpp"
#include "launch/launch_test_support.hpp"

using namespace ncclkit::launch;
using namespace launch_test;

namespace {

InterfaceAddress make_interface(const std::string& name, const std::string& address, bool loopback = false,
                                int family = AF_INET) {
  return InterfaceAddress{name, address, family, true, loopback};
}

}  // namespace

TEST_CASE("NCCL_SOCKET_IFNAME matching: prefixes, exact names, exclusion") {
  CHECK(nccl_ifname_matches("eth", "eth0"));
  CHECK(nccl_ifname_matches("ib,eth", "eth1"));
  CHECK_FALSE(nccl_ifname_matches("eth", "ens5"));
  CHECK(nccl_ifname_matches("=eth0", "eth0"));
  CHECK_FALSE(nccl_ifname_matches("=eth0", "eth01"));
  CHECK(nccl_ifname_matches("^docker,lo", "eth0"));
  CHECK_FALSE(nccl_ifname_matches("^docker,lo", "docker0"));
  CHECK_FALSE(nccl_ifname_matches("^=eth0", "eth0"));
  CHECK(nccl_ifname_matches("^=eth0", "eth01"));
}

TEST_CASE("NCCL's interface choice: InfiniBand first, then anything but docker and lo, loopback last") {
  const std::vector<InterfaceAddress> all{make_interface("lo", "127.0.0.1", true),
                                          make_interface("docker0", "172.17.0.1"),
                                          make_interface("eth0", "fd00::5", false, AF_INET6),
                                          make_interface("eth0", "10.0.0.5"), make_interface("ib0", "192.168.1.5")};
  CHECK(nccl_interface_candidates(all, std::nullopt).front().name == "ib0");
  std::vector<InterfaceAddress> no_ib(all.begin(), all.end() - 1);
  auto choice = nccl_interface_candidates(no_ib, std::nullopt);
  REQUIRE(choice.size() == 2);
  CHECK(choice[0].address == "10.0.0.5");  // IPv4 before IPv6 of the same interface
  CHECK(choice[1].address == "fd00::5");
  CHECK(nccl_interface_candidates({all[0], all[1]}, std::nullopt).front().name == "docker0");
  CHECK(nccl_interface_candidates({all[0]}, std::nullopt).front().name == "lo");
  CHECK(nccl_interface_candidates(all, std::string("eth")).front().address == "10.0.0.5");
  CHECK(nccl_interface_candidates(all, std::string("nope")).empty());
  auto down = all;
  for (auto& i : down) i.up = false;
  CHECK(nccl_interface_candidates(down, std::nullopt).empty());
}

TEST_CASE("this host: interfaces, routes, resolution") {
  const auto interfaces = list_interfaces();
  bool has_loopback = false;
  for (const auto& i : interfaces) has_loopback = has_loopback || (i.loopback && i.address == "127.0.0.1");
  CHECK(has_loopback);
  auto source = route_source_address("127.0.0.1");
  REQUIRE(source.has_value());
  CHECK(*source == "127.0.0.1");
  CHECK(interface_of(interfaces, *source) == "lo");
  CHECK_FALSE(route_source_address("not an address").has_value());
  CHECK(resolve_host("127.0.0.1") == std::vector<std::string>{"127.0.0.1"});
  CHECK(resolve_host("no-such-host.invalid").empty());
  CHECK(is_loopback_address("127.0.1.1"));
  CHECK_FALSE(is_loopback_address("10.0.0.1"));
}

TEST_CASE("version numbers and the driver version line") {
  CHECK(detail::cuda_version_text(12040) == "12.4");
  CHECK(detail::cuda_version_text(13000) == "13.0");
  CHECK(detail::nccl_version_text(22105) == "2.21.5");
  CHECK(detail::nccl_version_text(2804) == "2.8.4");
  TempDir dir;
  std::ofstream(dir / "version")
      << "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n"
      << "GCC version:  gcc version 12.2.0\n";
  CHECK(detail::read_driver_version(dir / "version") == "550.54.15");
  std::ofstream(dir / "open") << "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  "
                                 "(dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 06:54:38 UTC 2025\n";
  CHECK(detail::read_driver_version(dir / "open") == "580.65.06");
  CHECK(detail::read_driver_version(dir / "missing").empty());
  const SoftwareVersions here = probe_versions();  // never throws; "not found" is an answer
  CHECK(!here.nccl.empty());
  CHECK(!here.cuda_runtime.empty());
}

TEST_CASE("a node report survives the store round trip") {
  NodeReport report;
  report.node_rank = 3;
  report.host = "gpu-node-17";
  report.id = "gpu-node-17:123:456";
  report.port = 40123;
  report.gpus = "8 x NVIDIA H100 80GB HBM3";
  report.gpu_count = 8;
  report.versions = SoftwareVersions{"550.54.15", "12.4", "12.4", "2.21.5", "/usr/lib/libnccl.so.2"};
  report.nccl_socket_ifname = "^docker";
  report.nccl_interface = "ib0";
  report.nccl_address = "192.168.1.17";
  report.addresses = {{"ib0", "192.168.1.17"}, {"eth0", "10.0.0.17"}};
  report.problems = {"first = with equals", "second"};
  const NodeReport back = NodeReport::decode(report.encode());
  CHECK(back.encode() == report.encode());
  CHECK(back.addresses.size() == 2);
  CHECK(back.problems.size() == 2);
  CHECK(back.problems[0] == "first = with equals");
}

TEST_CASE("problems across nodes: unreachable NCCL interface, no path at all, route mismatch, NCCL versions") {
  LaunchOptions options;
  options.nnodes = 3;
  options.rdzv_dir = "/shared";
  std::vector<NodeReport> nodes(3);
  for (int n = 0; n < 3; ++n) {
    nodes[n].node_rank = n;
    nodes[n].host = "host" + std::to_string(n);
    nodes[n].nccl_interface = "eth0";
    nodes[n].nccl_address = "10.0.0." + std::to_string(n);
    nodes[n].versions.nccl = "2.21.5";
  }
  nodes[2].versions.nccl = "2.19.3";
  nodes[1].problems = {"a local problem"};
  const std::vector<ReachResult> reach{
      {0, 1, "eth0", "10.0.0.1", true, ""},
      {0, 2, "eth0", "10.0.0.2", false, "Connection refused"},
      {0, 2, "ib0", "192.168.0.2", true, ""},
      {1, 0, "eth0", "10.0.0.0", false, "connection timed out"},
      {1, 0, "ib0", "192.168.0.0", false, "connection timed out"},
  };
  const std::vector<RouteResult> routes{{0, 1, "eth0"}, {2, 0, "ib0"}, {1, 2, ""}};
  const auto problems = cross_node_problems(options, nodes, reach, routes);
  auto has = [&](const std::string& part) {
    for (const auto& p : problems)
      if (p.find(part) != std::string::npos) return true;
    return false;
  };
  CHECK(has("[node 1] a local problem"));
  CHECK(
      has("[node 0 -> node 2] cannot connect to node 2's NCCL interface eth0 (10.0.0.2): Connection refused. Node 2 "
          "is reachable at 192.168.0.2 (ib0): set NCCL_SOCKET_IFNAME=ib0 on node 2"));
  CHECK(has("[node 1 -> node 0] cannot connect to node 0 at any of its addresses"));
  CHECK(has("A firewall or a routing problem"));
  CHECK(has("[node 2] reaches node 0 through ib0, but NCCL would use eth0 here. Set NCCL_SOCKET_IFNAME=ib0 on node 2"));
  CHECK(has("[node 1] has no route to node 2's NCCL address 10.0.0.2"));
  CHECK(has("[all] NCCL differs between nodes: 2.19.3 on node(s) 2 and 2.21.5 on node(s) 0 and 1"));
  CHECK(problems.size() == 6);

  const std::string text = format_check_report("file:///shared/launchers", nodes, reach, problems);
  CHECK(text.find("ncclkit-run --check: 3 node(s); store: file:///shared/launchers\n") == 0);
  CHECK(text.find("node 1 ok; node 2 only on another interface") != std::string::npos);
  CHECK(text.find("node 0 FAILED") != std::string::npos);
  CHECK(text.find("problems (6):") != std::string::npos);
}

TEST_CASE("--check on one node: healthy, and with an NCCL_SOCKET_IFNAME that matches nothing") {
  TempDir dir;
  Process healthy = start({kLauncher, "--check"}, dir.path(), "healthy", {"NCCL_SOCKET_IFNAME"});
  REQUIRE(healthy.wait(60s));
  CHECK_MESSAGE(healthy.status == 0, healthy.output());
  CHECK(contains(healthy.out(), "ncclkit-run --check: 1 node(s)"));
  CHECK(contains(healthy.out(), "problems: none found"));

  Process broken = start({kLauncher, "--check"}, dir.path(), "broken", {"NCCL_SOCKET_IFNAME=nosuchif"});
  REQUIRE(broken.wait(60s));
  CHECK(broken.status == 1);
  CHECK_MESSAGE(contains(broken.out(), "[node 0] NCCL_SOCKET_IFNAME=nosuchif matches no interface that is up"),
                broken.output());
  CHECK(contains(broken.out(), "Set NCCL_SOCKET_IFNAME="));
}

TEST_CASE("--check with two local launchers, over a TCP store (with and without a token) and over a folder") {
  TempDir dir;
  const int port = free_port();
  for (const std::string mode : {"tcp", "tcp+token", "folder"}) {
    CAPTURE(mode);
    const bool folder = mode == "folder";
    std::vector<Process> nodes;
    for (int node = 0; node < 2; ++node) {
      std::vector<std::string> argv{kLauncher, "--check", "--nnodes", "2", "--rdzv-timeout", "20"};
      if (folder) {
        argv.insert(argv.end(), {"--rdzv-dir", dir / "rdzv"});
      } else {
        argv.insert(argv.end(), {"--node-rank", std::to_string(node), "--master-addr", "127.0.0.1", "--master-port",
                                 std::to_string(port)});
      }
      const std::string token = mode == "tcp+token" ? "NCCLKIT_STORE_TOKEN=check-token" : "NCCLKIT_STORE_TOKEN";
      nodes.push_back(start(argv, dir.path(), "node" + std::to_string(node) + mode, {"NCCL_SOCKET_IFNAME", token}));
    }
    for (auto& node : nodes) {
      REQUIRE(node.wait(60s));
      CHECK_MESSAGE(node.status == 0, node.output());
      const std::string out = node.out();
      CHECK(contains(out, "2 node(s); store: " + std::string(folder ? "file://" : "tcp://127.0.0.1:")));
      CHECK(contains(out, "(round trip "));
      REQUIRE(lines_starting_with(out, "0 ").size() == 1);
      CHECK(contains(lines_starting_with(out, "0 ").front(), "node 1 ok"));
      CHECK(contains(lines_starting_with(out, "1 ").front(), "node 0 ok"));
      CHECK(contains(out, "problems: none found"));
      // A TCP store without a token is a warning on every node (the exit status stays 0).
      CHECK(contains(out, "warnings (1):") == (mode == "tcp"));
      CHECK(contains(out, "Set NCCLKIT_STORE_TOKEN") == (mode == "tcp"));
    }
    if (mode == "tcp") {
      CHECK(contains(nodes[0].out(), "[node 0] the launchers' store listens on "));
      CHECK(contains(nodes[0].out(), std::to_string(port) + " (every address of this host) without a token"));
      CHECK(contains(nodes[1].out(), "[node 1] joined the launchers' store without a token"));
    }
  }
}

TEST_CASE("--check when the store cannot be reached, and with a --master-addr that is not node 0's") {
  TempDir dir;
  {
    const ncclkit_test::ClosedPort closed;  // nobody listens there until the block ends
    const int port = closed.port();
    Process lost = start({kLauncher, "--check", "--nnodes", "2", "--node-rank", "1", "--master-addr", "127.0.0.1",
                          "--master-port", std::to_string(port), "--rdzv-timeout", "1"},
                         dir.path(), "lost");
    REQUIRE(lost.wait(60s));
    CHECK(lost.status == 1);
    CHECK_MESSAGE(contains(lost.out(), "store: unreachable"), lost.output());
    CHECK(contains(lost.out(), "[node 1] cannot reach the launchers' store"));
    CHECK(contains(lost.out(), "127.0.0.1:" + std::to_string(port)));
    CHECK(contains(lost.out(), "Connection refused"));
  }

  // 198.51.100.123 (TEST-NET-2) is nobody's address here. Node 0 still opens its store on the port.
  Process wrong = start({kLauncher, "--check", "--nnodes", "2", "--node-rank", "0", "--master-addr", "198.51.100.123",
                         "--master-port", std::to_string(free_port()), "--rdzv-timeout", "1"},
                        dir.path(), "wrong");
  REQUIRE(wrong.wait(60s));
  CHECK(wrong.status == 1);
  CHECK_MESSAGE(contains(wrong.out(), "[node 0] --master-addr 198.51.100.123 is not an address of this host"),
                wrong.output());
  CHECK(contains(wrong.out(), "[all] node(s) 1 did not join the check"));
}
