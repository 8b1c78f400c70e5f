// Tests of ncclkit/bootstrap/slurm_nodelist.hpp: SLURM host lists and task counts per node.
// ncclkit-test: labels=unit
#include <doctest/doctest.h>

#include <string>  // std::string
#include <vector>  // std::vector

#include "ncclkit/bootstrap/slurm_nodelist.hpp"

using ncclkit::expand_slurm_nodelist;
using ncclkit::expand_slurm_tasks_per_node;
using ncclkit::first_slurm_host;
using Hosts = std::vector<std::string>;

TEST_CASE("plain host names and a single host") {
  CHECK(expand_slurm_nodelist("node7") == Hosts{"node7"});
  CHECK(expand_slurm_nodelist("a,b.example.com,c_d") == Hosts{"a", "b.example.com", "c_d"});
  CHECK(first_slurm_host("login-1") == "login-1");
}

TEST_CASE("bracket ranges expand, keep zero padding and mix with plain names") {
  CHECK(expand_slurm_nodelist("gpu[01-04,07],cpu3") == Hosts{"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu3"});
  CHECK(expand_slurm_nodelist("n[8-11]") == Hosts{"n8", "n9", "n10", "n11"});
  CHECK(expand_slurm_nodelist("n[08-10]") == Hosts{"n08", "n09", "n10"});
  CHECK(expand_slurm_nodelist("n[098-101]") == Hosts{"n098", "n099", "n100", "n101"});
  CHECK(expand_slurm_nodelist("n[5]") == Hosts{"n5"});
  CHECK(expand_slurm_nodelist("[1-2]x") == Hosts{"1x", "2x"});
  CHECK(expand_slurm_nodelist("rack[1-2]-gpu") == Hosts{"rack1-gpu", "rack2-gpu"});
  CHECK(first_slurm_host("gpu[01-04,07],cpu3") == "gpu01");
  CHECK(first_slurm_host("cpu3,gpu[01-04]") == "cpu3");
}

TEST_CASE("several bracket groups in one name multiply, the last varying fastest") {
  CHECK(expand_slurm_nodelist("a[1-2]-b[3-4]") == Hosts{"a1-b3", "a1-b4", "a2-b3", "a2-b4"});
  CHECK(expand_slurm_nodelist("r[1-2]n[01,03],x") == Hosts{"r1n01", "r1n03", "r2n01", "r2n03", "x"});
  CHECK(first_slurm_host("a[2-3]-b[07-09]") == "a2-b07");
}

TEST_CASE("malformed host lists are ConfigErrors that quote the list") {
  using ncclkit::ConfigError;
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("\"gpu[01-02]\""), doctest::Contains("remove the quotes"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("'gpu1'"), doctest::Contains("'gpu1''"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu1, gpu2"), doctest::Contains("white space"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu[01-04"), doctest::Contains("without a matching ']'"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu01-04]"), doctest::Contains("without a matching '['"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu[1-[2-3]]"), doctest::Contains("nested"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu[4-1]"), doctest::Contains("runs backwards"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu[a-b]"), doctest::Contains("is not a number"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu[1-2-3]"), doctest::Contains("is not a number"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu[]"), doctest::Contains("empty brackets"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu[1,,2]"), doctest::Contains("empty item"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("a,,b"), doctest::Contains("empty host name"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("a,"), doctest::Contains("empty host name"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist(""), doctest::Contains("empty"), ConfigError);
  CHECK_THROWS_WITH_AS(expand_slurm_nodelist("gpu[1-3]"
                                             "x[1-1000000000]"),
                       doctest::Contains("more than"), ConfigError);
  // first_slurm_host checks the whole list, not only the first name.
  CHECK_THROWS_AS(first_slurm_host("gpu[01-02],bad[1-"), ConfigError);
  CHECK_THROWS_AS(first_slurm_host("gpu[01-02,x]"), ConfigError);
}

TEST_CASE("a huge range is cut without allocating it when only the first host is wanted") {
  CHECK(first_slurm_host("n[000000001-999999999]") == "n000000001");
}

TEST_CASE("task counts per node") {
  using Counts = std::vector<int>;
  CHECK(expand_slurm_tasks_per_node("4") == Counts{4});
  CHECK(expand_slurm_tasks_per_node("4(x2),3") == Counts{4, 4, 3});
  CHECK(expand_slurm_tasks_per_node("2,1(x3),5") == Counts{2, 1, 1, 1, 5});
  for (const char* bad : {"", "x", "4(x)", "4(2)", "4(x0)", "0", "-1", "4,,3", "4(x2", "4 ,3", "+4", "4(x-2)", "'4'"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(expand_slurm_tasks_per_node(bad), doctest::Contains("SLURM task counts"),
                         ncclkit::ConfigError);
  }
  CHECK_THROWS_WITH_AS(expand_slurm_tasks_per_node("1(x99999999)"), doctest::Contains("nodes"), ncclkit::ConfigError);
}
