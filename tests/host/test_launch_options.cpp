// The launcher's command line (launch/options.hpp).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "launch/options.hpp"

using ncclkit::ConfigError;
using ncclkit::launch::parse_launch_args;
using ncclkit::launch::RendezvousKind;

namespace {

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_launch_args(args);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no error>";
}

}  // namespace

TEST_CASE("defaults: auto workers, one node, no rendezvous, the program and its arguments kept as given") {
  auto options = parse_launch_args({"./train", "--lr", "0.1", "--", "x"});
  CHECK_FALSE(options.nproc_per_node.has_value());
  CHECK(options.nnodes == 1);
  CHECK(options.master_port == 29500);
  CHECK(options.max_restarts == 0);
  CHECK(options.rendezvous() == RendezvousKind::kStandalone);
  CHECK(options.program == std::vector<std::string>{"./train", "--lr", "0.1", "--", "x"});
}

TEST_CASE("every flag, with a separate value, after '=', and in torchrun's spelling") {
  auto options = parse_launch_args({"--nproc_per_node=4", "--nnodes", "3", "--node-rank=2", "--master-addr", "10.0.0.1",
                                    "--master_port", "1234", "--max-restarts", "5", "--log-dir", "/tmp/logs",
                                    "--grace-period", "0.25", "--rdzv-timeout=12.5", "--", "prog", "-v"});
  CHECK(options.nproc_per_node == 4);
  CHECK(options.nnodes == 3);
  CHECK(options.node_rank == 2);
  CHECK(options.master_addr == "10.0.0.1");
  CHECK(options.master_port == 1234);
  CHECK(options.max_restarts == 5);
  CHECK(options.log_dir == "/tmp/logs");
  CHECK(options.grace_period.count() == 250);
  CHECK(options.rdzv_timeout.count() == 12500);
  CHECK(options.rendezvous() == RendezvousKind::kTcp);
  CHECK(options.program == std::vector<std::string>{"prog", "-v"});

  auto folder = parse_launch_args({"--nnodes", "2", "--rdzv-dir", "/shared/x", "--check"});
  CHECK(folder.rendezvous() == RendezvousKind::kFolder);
  CHECK_FALSE(folder.node_rank.has_value());  // taken in arrival order
  CHECK(folder.check);
  CHECK(parse_launch_args({"--nproc-per-node", "auto", "p"}).nproc_per_node == std::nullopt);
}

TEST_CASE("mistakes are errors that name the flag and say what to do") {
  CHECK(error_of({"--nproc-per-node", "0", "p"}) ==
        "ncclkit-run: --nproc-per-node '0' must be a whole number in [1, 4096]");
  CHECK(error_of({"--nproc-per-node", "two", "p"}).find("'two'") != std::string::npos);
  CHECK(error_of({"--nnodes", "1:4", "p"}).find("elastic ranges (MIN:MAX) are not supported") != std::string::npos);
  CHECK(error_of({"--master-port", "70000", "p"}).find("[1, 65535]") != std::string::npos);
  CHECK(error_of({"--grace-period", "-1", "p"}).find("must be a number of seconds") != std::string::npos);
  CHECK(error_of({"--rdzv-timeout", "0", "p"}).find("must be above 0") != std::string::npos);
  CHECK(error_of({"--bogus", "p"}) == "ncclkit-run: unknown option '--bogus' (see --help)");
  CHECK(error_of({"-x", "p"}).find("unknown option '-x'") != std::string::npos);
  CHECK(error_of({"--nnodes"}).find("--nnodes needs a value") != std::string::npos);
  CHECK(error_of({"--check=yes"}).find("--check takes no value") != std::string::npos);
  CHECK(error_of({}).find("no program to run") != std::string::npos);
  CHECK(error_of({"--check", "p"}).find("--check runs no program") != std::string::npos);
  CHECK(error_of({"--master-addr", "a", "--rdzv-dir", "/d", "p"}).find("not both") != std::string::npos);
  CHECK(error_of({"--nnodes", "2", "p"}).find("needs a place where the nodes meet") != std::string::npos);
  CHECK(error_of({"--nnodes", "2", "--master-addr", "a", "p"}).find("give --node-rank K") != std::string::npos);
  CHECK(error_of({"--nnodes", "2", "--node-rank", "2", "--master-addr", "a", "p"}).find("must be below --nnodes 2") !=
        std::string::npos);
}

TEST_CASE("--help and --version need nothing else") {
  CHECK(parse_launch_args({"--help"}).help);
  CHECK(parse_launch_args({"--version"}).version);
  CHECK(ncclkit::launch::launch_usage().find("--nproc-per-node N|auto") != std::string::npos);
}
