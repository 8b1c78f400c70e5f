// Tests of ncclkit/bootstrap/environment.hpp: detect_world() over fake environments.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <cstdlib>  // setenv, unsetenv
#include <string>   // std::string

#include "ncclkit/bootstrap/environment.hpp"
#include "support/text.hpp"

using ncclkit::ConfigError;
using ncclkit::detect_world;
using ncclkit::fixed_environment;
using ncclkit::WorldInfo;
using ncclkit::WorldInfoOverrides;

namespace {

WorldInfo from_env(std::map<std::string, std::string, std::less<>> variables, WorldInfoOverrides overrides = {}) {
  return detect_world(overrides, fixed_environment(std::move(variables)));
}

using ncclkit_test::contains;

}  // namespace

TEST_CASE("no environment at all is a single process, and says so") {
  WorldInfo w = from_env({});
  CHECK(w.rank == 0);
  CHECK(w.world_size == 1);
  CHECK(w.local_rank == 0);
  CHECK(w.local_world_size == 1);
  CHECK(w.node_rank == 0);
  CHECK(w.num_nodes == 1);
  CHECK(w.init_url == "tcp://127.0.0.1:0");
  CHECK(contains(w.source, "single process"));
  // Unrelated variables and an salloc shell (SLURM_NTASKS without SLURM_PROCID) change nothing.
  WorldInfo salloc = from_env({{"SLURM_NTASKS", "8"}, {"SLURM_JOB_ID", "77"}, {"HOME", "/root"}});
  CHECK(salloc.world_size == 1);
  CHECK(contains(salloc.source, "single process"));
  // Empty values count as unset.
  CHECK(from_env({{"RANK", ""}, {"WORLD_SIZE", ""}}).world_size == 1);
}

TEST_CASE("torchrun variables") {
  WorldInfo w = from_env({{"RANK", "5"},
                          {"WORLD_SIZE", "8"},
                          {"LOCAL_RANK", "1"},
                          {"LOCAL_WORLD_SIZE", "4"},
                          {"GROUP_RANK", "1"},
                          {"GROUP_WORLD_SIZE", "2"},
                          {"MASTER_ADDR", "node0"},
                          {"MASTER_PORT", "29500"}});
  CHECK(w.rank == 5);
  CHECK(w.world_size == 8);
  CHECK(w.local_rank == 1);
  CHECK(w.local_world_size == 4);
  CHECK(w.node_rank == 1);
  CHECK(w.num_nodes == 2);
  CHECK(w.master_addr == "node0");
  CHECK(w.master_port == 29500);
  CHECK(w.init_url == "env://");
  CHECK(contains(w.source, "torchrun"));
  CHECK(contains(w.source, "RANK=5"));

  SUBCASE("without GROUP_RANK the node is derived from a node-by-node layout") {
    WorldInfo d = from_env({{"RANK", "6"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "4"}});
    CHECK(d.node_rank == 1);
    CHECK(d.num_nodes == 2);
    CHECK(contains(d.source, "node_rank = rank / local_world_size"));
  }
  SUBCASE("heterogeneous nodes need GROUP_RANK") {
    // 3 processes on the last node of a 4+4+3 job: 9 % 3 == 0 but 11 % 3 != 0.
    CHECK_THROWS_WITH_AS(
        from_env({{"RANK", "10"}, {"WORLD_SIZE", "11"}, {"LOCAL_RANK", "2"}, {"LOCAL_WORLD_SIZE", "3"}}),
        doctest::Contains("GROUP_RANK and GROUP_WORLD_SIZE"), ConfigError);
    WorldInfo h = from_env({{"RANK", "10"},
                            {"WORLD_SIZE", "11"},
                            {"LOCAL_RANK", "2"},
                            {"LOCAL_WORLD_SIZE", "3"},
                            {"GROUP_RANK", "2"},
                            {"GROUP_WORLD_SIZE", "3"}});
    CHECK(h.node_rank == 2);
    CHECK(h.num_nodes == 3);
  }
}

TEST_CASE("Open MPI variables; OMPI_COMM_WORLD_NODE_RANK is not taken for the node index") {
  WorldInfo w = from_env({{"OMPI_COMM_WORLD_RANK", "3"},
                          {"OMPI_COMM_WORLD_SIZE", "4"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                          {"OMPI_COMM_WORLD_NODE_RANK", "7"}});
  CHECK(w.rank == 3);
  CHECK(w.world_size == 4);
  CHECK(w.local_rank == 1);
  CHECK(w.local_world_size == 2);
  CHECK(w.node_rank == 1);
  CHECK(w.num_nodes == 2);
  CHECK(contains(w.source, "Open MPI"));
  // --map-by node: rank 1 is local rank 0 on the second node; the node cannot be derived.
  CHECK_THROWS_WITH_AS(from_env({{"OMPI_COMM_WORLD_RANK", "1"},
                                 {"OMPI_COMM_WORLD_SIZE", "4"},
                                 {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                 {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}),
                       doctest::Contains("not laid out node by node"), ConfigError);
  WorldInfo explicit_node = from_env({{"OMPI_COMM_WORLD_RANK", "1"},
                                      {"OMPI_COMM_WORLD_SIZE", "4"},
                                      {"OMPI_COMM_WORLD_LOCAL_RANK", "0"},
                                      {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}},
                                     {.node_rank = 1, .num_nodes = 2});
  CHECK(explicit_node.node_rank == 1);
}

TEST_CASE("SLURM variables: step values, task counts per node, first host of the node list") {
  WorldInfo w = from_env({{"SLURM_PROCID", "9"},
                          {"SLURM_NTASKS", "11"},
                          {"SLURM_LOCALID", "1"},
                          {"SLURM_NODEID", "2"},
                          {"SLURM_NNODES", "3"},
                          {"SLURM_TASKS_PER_NODE", "4(x2),3"},
                          {"SLURM_JOB_NODELIST", "gpu[08-10],cpu1"},
                          {"MASTER_PORT", "29400"}});
  CHECK(w.rank == 9);
  CHECK(w.world_size == 11);
  CHECK(w.local_rank == 1);
  CHECK(w.local_world_size == 3);
  CHECK(w.node_rank == 2);
  CHECK(w.num_nodes == 3);
  CHECK(w.master_addr == "gpu08");
  CHECK(w.master_port == 29400);
  CHECK(w.init_url == "env://");
  CHECK(contains(w.source, "SLURM environment"));
  CHECK(contains(w.source, "first host of the SLURM node list"));

  SUBCASE("the job step's values win over the allocation's") {
    WorldInfo s = from_env({{"SLURM_PROCID", "1"},
                            {"SLURM_NTASKS", "8"},
                            {"SLURM_STEP_NUM_TASKS", "2"},
                            {"SLURM_LOCALID", "1"},
                            {"SLURM_NODEID", "0"},
                            {"SLURM_NNODES", "2"},
                            {"SLURM_STEP_NUM_NODES", "1"},
                            {"SLURM_TASKS_PER_NODE", "4(x2)"},
                            {"SLURM_STEP_TASKS_PER_NODE", "2"},
                            {"SLURM_JOB_NODELIST", "a[1-2]"},
                            {"SLURM_STEP_NODELIST", "a2"}});
    CHECK(s.world_size == 2);
    CHECK(s.local_world_size == 2);
    CHECK(s.num_nodes == 1);
    CHECK(s.master_addr == "a2");
  }
  SUBCASE("SLURM_NTASKS_PER_NODE, and one node without any count") {
    WorldInfo p = from_env({{"SLURM_PROCID", "5"},
                            {"SLURM_NTASKS", "8"},
                            {"SLURM_LOCALID", "1"},
                            {"SLURM_NODEID", "1"},
                            {"SLURM_NNODES", "2"},
                            {"SLURM_NTASKS_PER_NODE", "4"}});
    CHECK(p.local_world_size == 4);
    WorldInfo one = from_env({{"SLURM_PROCID", "2"},
                              {"SLURM_NTASKS", "3"},
                              {"SLURM_LOCALID", "2"},
                              {"SLURM_NODEID", "0"},
                              {"SLURM_NNODES", "1"}});
    CHECK(one.local_world_size == 3);
    CHECK(one.master_addr.empty());
  }
  SUBCASE("MASTER_ADDR wins over the node list") {
    WorldInfo m = from_env({{"SLURM_PROCID", "0"},
                            {"SLURM_NTASKS", "1"},
                            {"SLURM_LOCALID", "0"},
                            {"SLURM_NODEID", "0"},
                            {"SLURM_NNODES", "1"},
                            {"SLURM_JOB_NODELIST", "gpu[1-2]"},
                            {"MASTER_ADDR", "10.0.0.5"}});
    CHECK(m.master_addr == "10.0.0.5");
    CHECK(m.init_url == "env://");
  }
}

TEST_CASE("contradictions within SLURM's variables are errors that list what was found") {
  std::map<std::string, std::string, std::less<>> base = {{"SLURM_PROCID", "1"},  {"SLURM_NTASKS", "8"},
                                                          {"SLURM_LOCALID", "1"}, {"SLURM_NODEID", "0"},
                                                          {"SLURM_NNODES", "2"},  {"SLURM_TASKS_PER_NODE", "4(x2)"}};
  CHECK(from_env(base).local_world_size == 4);
  auto with = [&](std::string name, std::string value) {
    auto copy = base;
    copy[name] = value;
    return copy;
  };
  CHECK_THROWS_WITH_AS(from_env(with("SLURM_NTASKS", "9")), doctest::Contains("add up to 8 tasks, not 9"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env(with("SLURM_NNODES", "3")), doctest::Contains("cover 2 nodes, not 3"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env(with("SLURM_NODEID", "2")), doctest::Contains("SLURM_NODEID=2"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env(with("SLURM_LOCALID", "4")), doctest::Contains("local_rank=4"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env(with("SLURM_PROCID", "8")), doctest::Contains("SLURM_PROCID=8"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env(with("SLURM_TASKS_PER_NODE", "4(2)")), doctest::Contains("SLURM task counts"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(from_env(with("SLURM_JOB_NODELIST", "\"gpu[1-2]\"")), doctest::Contains("remove the quotes"),
                       ConfigError);
  // Several nodes and no task counts: the local world size is unknown.
  auto no_counts = base;
  no_counts.erase("SLURM_TASKS_PER_NODE");
  CHECK_THROWS_WITH_AS(from_env(no_counts), doctest::Contains("task counts per node"), ConfigError);
}

TEST_CASE("missing values name what was found and what is needed") {
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "1"}}), doctest::Contains("world size is missing"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "1"}}), doctest::Contains("found: RANK=1"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "1"}}), doctest::Contains("needed: RANK and WORLD_SIZE"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"WORLD_SIZE", "4"}}), doctest::Contains("rank is missing"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"LOCAL_RANK", "0"}}), doctest::Contains("rank and the world size are missing"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "1"}, {"WORLD_SIZE", "4"}}),
                       doctest::Contains("LOCAL_RANK and LOCAL_WORLD_SIZE"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}}),
                       doctest::Contains("not the local world size"), ConfigError);
  CHECK_THROWS_WITH_AS(
      from_env(
          {{"RANK", "1"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}, {"GROUP_RANK", "0"}}),
      doctest::Contains("not the number of nodes"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"SLURM_PROCID", "0"}}), doctest::Contains("found: SLURM_PROCID=0"), ConfigError);
  // A single process needs no local values.
  WorldInfo single = from_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  CHECK(single.local_world_size == 1);
  CHECK(single.init_url == "tcp://127.0.0.1:0");
}

TEST_CASE("contradictory and garbage values") {
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}}),
                       doctest::Contains("rank=4 must be in [0, world_size=4)"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "1"}}),
                       doctest::Contains("(RANK=4, WORLD_SIZE=4"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "1"},
                                 {"WORLD_SIZE", "4"},
                                 {"LOCAL_RANK", "3"},
                                 {"LOCAL_WORLD_SIZE", "2"},
                                 {"GROUP_RANK", "0"},
                                 {"GROUP_WORLD_SIZE", "2"}}),
                       doctest::Contains("local_rank=3"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "1"},
                                 {"WORLD_SIZE", "2"},
                                 {"LOCAL_RANK", "0"},
                                 {"LOCAL_WORLD_SIZE", "1"},
                                 {"GROUP_RANK", "1"},
                                 {"GROUP_WORLD_SIZE", "3"}}),
                       doctest::Contains("num_nodes=3 exceeds world_size=2"), ConfigError);
  for (const char* garbage : {"abc", "1.5", "0x10", " 1", "2 ", "99999999999999999999"}) {
    CAPTURE(garbage);
    const std::string expected = std::string("RANK='") + garbage + "' is not a whole number";
    CHECK_THROWS_WITH_AS(from_env({{"RANK", garbage}, {"WORLD_SIZE", "4"}}), doctest::Contains(expected.c_str()),
                         ConfigError);
  }
  CHECK_THROWS_WITH_AS(from_env({{"RANK", "-1"}, {"WORLD_SIZE", "4"}}), doctest::Contains("not in the range"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"WORLD_SIZE", "0"}, {"RANK", "0"}}), doctest::Contains("WORLD_SIZE='0'"),
                       ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"MASTER_PORT", "70000"}}), doctest::Contains("MASTER_PORT='70000'"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"MASTER_PORT", "http"}}), doctest::Contains("MASTER_PORT='http'"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({{"OMPI_COMM_WORLD_SIZE", "four"}}), doctest::Contains("OMPI_COMM_WORLD_SIZE='four'"),
                       ConfigError);
}

TEST_CASE("precedence between launchers: torchrun > Open MPI > SLURM, recorded in source") {
  // srun torchrun: one torchrun per node (SLURM numbers nodes), torchrun numbers the workers.
  std::map<std::string, std::string, std::less<>> nested = {{"SLURM_PROCID", "1"},  {"SLURM_NTASKS", "2"},
                                                            {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"},
                                                            {"SLURM_NNODES", "2"},  {"SLURM_TASKS_PER_NODE", "1(x2)"},
                                                            {"RANK", "6"},          {"WORLD_SIZE", "8"},
                                                            {"LOCAL_RANK", "2"},    {"LOCAL_WORLD_SIZE", "4"},
                                                            {"MASTER_ADDR", "n1"},  {"MASTER_PORT", "1234"}};
  WorldInfo w = from_env(nested);
  CHECK(w.rank == 6);
  CHECK(w.world_size == 8);
  CHECK(w.local_rank == 2);
  CHECK(contains(w.source, "torchrun environment"));
  CHECK(contains(w.source, "ignored, lower precedence than torchrun: SLURM (SLURM_PROCID=1"));

  // mpirun inside an sbatch job: SLURM_PROCID numbers mpirun's daemons, not the processes.
  WorldInfo m = from_env({{"SLURM_PROCID", "0"},
                          {"SLURM_NTASKS", "2"},
                          {"SLURM_LOCALID", "0"},
                          {"SLURM_NODEID", "0"},
                          {"SLURM_NNODES", "2"},
                          {"OMPI_COMM_WORLD_RANK", "3"},
                          {"OMPI_COMM_WORLD_SIZE", "8"},
                          {"OMPI_COMM_WORLD_LOCAL_RANK", "3"},
                          {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  CHECK(m.rank == 3);
  CHECK(m.world_size == 8);
  CHECK(m.node_rank == 0);
  CHECK(contains(m.source, "Open MPI environment"));
  CHECK(contains(m.source, "ignored, lower precedence than Open MPI: SLURM"));

  // A lower-precedence launcher's garbage does not matter: it is not parsed.
  WorldInfo g = from_env({{"RANK", "0"}, {"WORLD_SIZE", "1"}, {"OMPI_COMM_WORLD_RANK", "junk"}});
  CHECK(g.rank == 0);
  CHECK(contains(g.source, "OMPI_COMM_WORLD_RANK=junk"));
}

TEST_CASE("explicit arguments win field by field") {
  std::map<std::string, std::string, std::less<>> env = {{"RANK", "1"},
                                                         {"WORLD_SIZE", "4"},
                                                         {"LOCAL_RANK", "1"},
                                                         {"LOCAL_WORLD_SIZE", "2"},
                                                         {"MASTER_ADDR", "a"},
                                                         {"MASTER_PORT", "1000"},
                                                         {"NCCLKIT_INIT_URL", "file:///shared/rdv"}};
  WorldInfo w = from_env(env, {.rank = 2, .local_rank = 0, .master_port = 2000});
  CHECK(w.rank == 2);
  CHECK(w.world_size == 4);
  CHECK(w.local_rank == 0);
  CHECK(w.node_rank == 1);
  CHECK(w.master_addr == "a");
  CHECK(w.master_port == 2000);
  CHECK(w.init_url == "file:///shared/rdv");
  CHECK(contains(w.source, "arguments: rank=2 (environment: 1)"));

  WorldInfo u = from_env(env, {.init_url = "tcp://h:1"});
  CHECK(u.init_url == "tcp://h:1");

  // Arguments alone, with no environment.
  WorldInfo a = from_env({}, {.rank = 3, .world_size = 4, .local_rank = 1, .local_world_size = 2});
  CHECK(a.rank == 3);
  CHECK(a.node_rank == 1);
  CHECK(a.num_nodes == 2);
  CHECK(a.source == "arguments; derived: node_rank = rank / local_world_size");
  CHECK(a.init_url == "env://");
  CHECK_THROWS_WITH_AS(from_env({}, {.rank = 3}), doctest::Contains("world size is missing"), ConfigError);
  CHECK_THROWS_WITH_AS(from_env({}, {.rank = 3, .world_size = 2, .local_rank = 0, .local_world_size = 1}),
                       doctest::Contains("rank=3 must be in [0, world_size=2)"), ConfigError);
}

TEST_CASE("the default lookup reads the process environment") {
  ::setenv("RANK", "1", 1);
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("LOCAL_RANK", "1", 1);
  ::setenv("LOCAL_WORLD_SIZE", "2", 1);
  ::setenv("NCCLKIT_INIT_URL", "file:///tmp/x", 1);
  WorldInfo w = detect_world();
  for (const char* name : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NCCLKIT_INIT_URL"})
    ::unsetenv(name);
  CHECK(w.rank == 1);
  CHECK(w.local_world_size == 2);
  CHECK(w.init_url == "file:///tmp/x");
}
