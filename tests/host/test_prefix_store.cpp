// Tests of ncclkit/store/prefix_store.hpp over a FileStore: key scoping for every operation,
// nesting, and scoped barriers and counters shared by real processes.
#include <doctest/doctest.h>

#include <signal.h>  // signal, SIGTERM
#include <stdlib.h>  // mkdtemp

#include <chrono>      // std::chrono
#include <filesystem>  // std::filesystem
#include <memory>      // std::make_shared
#include <stdexcept>   // std::runtime_error
#include <string>      // std::string

#include "support/temp_dir.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/file_store.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "support/checker.hpp"

using namespace std::chrono_literals;
using ncclkit::FileStore;
using ncclkit::PrefixStore;

namespace {

using ncclkit_test::TempDir;

using ncclkit_test::require;

}  // namespace

TEST_CASE("every operation of a PrefixStore stays inside its prefix") {
  TempDir dir;
  auto base = std::make_shared<FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = 1, .timeout = 5s});
  PrefixStore a("jobA", base), b("jobB", base);
  CHECK(a.default_timeout() == 5s);
  CHECK(a.prefix() == "jobA");
  CHECK(a.describe() == "file://" + dir.path + " (prefix 'jobA')");

  a.set("k", "from a");
  b.set("k", "from b");
  CHECK(a.get_string("k") == "from a");
  CHECK(b.get_string("k") == "from b");
  CHECK(base->get_string("jobA/k") == "from a");
  CHECK_FALSE(base->check({"k"}));
  CHECK(a.check({"k"}));

  CHECK(a.add("n", 2) == 2);
  CHECK(b.add("n", 5) == 5);
  CHECK(a.add("n", 1) == 3);
  CHECK(base->get_string("jobB/n") == "5");

  CHECK(a.compare_set("c", "", "x") == "x");
  CHECK(b.compare_set("c", "x", "y") == "x");  // b has no "c": expected comes back, nothing set
  CHECK_FALSE(b.check({"c"}));

  a.wait({"k", "n"}, 1s);
  CHECK_THROWS_WITH_AS(b.wait({"only-in-a"}, 50ms), doctest::Contains("'jobB/only-in-a'"), ncclkit::TimeoutError);
  CHECK_THROWS_WITH_AS(b.get("c", 50ms), doctest::Contains("'jobB/c'"), ncclkit::TimeoutError);

  CHECK(a.num_keys() == base->num_keys());  // documented: the whole underlying store's count
  CHECK(base->num_keys() == 5);             // jobA/k, jobB/k, jobA/n, jobB/n, jobA/c
  CHECK(b.delete_key("k"));
  CHECK_FALSE(b.delete_key("k"));
  CHECK(a.get_string("k") == "from a");
}

TEST_CASE("prefixes nest, and a null base is a clear error") {
  TempDir dir;
  auto base = std::make_shared<FileStore>(dir.path, ncclkit::FileStoreOptions{.world_size = 1});
  auto job = std::make_shared<PrefixStore>("job", base);
  PrefixStore comm("comm", job);
  comm.set("key", "v");
  CHECK(base->get_string("job/comm/key") == "v");
  CHECK(comm.describe().find("(prefix 'job') (prefix 'comm')") != std::string::npos);
  CHECK_THROWS_WITH_AS(PrefixStore("x", nullptr), doctest::Contains("null"), ncclkit::ConfigError);
}

TEST_CASE("scoped counters and barriers of several communicators do not mix across processes") {
  constexpr int kRanks = 8;
  auto result = ncclkit::spawn(
      kRanks,
      [](const ncclkit::WorldInfo& world) {
        ::signal(SIGTERM, SIG_DFL);
        auto base = std::make_shared<FileStore>(
            world.init_url.substr(7), ncclkit::FileStoreOptions{.world_size = world.world_size, .timeout = 60s});
        PrefixStore even("comm-even", base), all("comm-all", base);
        const bool is_even = world.rank % 2 == 0;
        // The even ranks form one communicator with their own ranks 0..3; everyone forms another.
        if (is_even) {
          even.add("count", 1);
          ncclkit::barrier(even, world.rank / 2, kRanks / 2, "sync", 30s);
          require(even.get_string("count") == std::to_string(kRanks / 2), "even count " + even.get_string("count"));
        }
        all.add("count", 10);
        ncclkit::barrier(all, world.rank, kRanks, "sync", 30s);
        require(all.get_string("count") == std::to_string(10 * kRanks), "all count " + all.get_string("count"));
        require(!base->check({"count"}), "an unscoped key appeared");
        ncclkit::barrier(all, world.rank, kRanks, "end", 30s);
      },
      {.timeout = 120s});
  CHECK_MESSAGE(result.ok(), result.describe());
}
