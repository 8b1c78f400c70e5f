// Tests of ncclkit/bootstrap/init.hpp with the Gloo backend: init() gives every rank its
// world, the store and a communicator in one call (multi-process, through spawn()).
#include <doctest/doctest.h>

#include <chrono>   // std::chrono
#include <cstdlib>  // setenv
#include <span>     // std::span
#include <string>   // std::string
#include <vector>   // std::vector

#include "ncclkit/gloo.hpp"

using namespace std::chrono_literals;

TEST_CASE("init<gloo::Communicator>(world): four processes get world, store and communicator") {
  auto result = ncclkit::spawn(4, [](const ncclkit::WorldInfo& given) {
    auto [world, store, comm] = ncclkit::init<ncclkit::gloo::Communicator>(
        given, ncclkit::gloo::Options{.timeout = 60s, .hostname = "127.0.0.1"});
    if (world.rank != given.rank || comm.rank() != given.rank || comm.size() != 4) return 1;
    // The store is the job's: every rank sees the others' keys.
    store->set("init/" + std::to_string(world.rank), "here");
    store->wait({"init/0", "init/1", "init/2", "init/3"}, 30s);
    std::vector<float> values(1000, static_cast<float>(world.rank + 1));
    comm.all_reduce(std::span<float>(values), ncclkit::ReduceOp::kSum);
    return values.front() == 10.0f && values.back() == 10.0f ? 0 : 2;
  });
  INFO(result.describe());
  CHECK(result.ok());
}

TEST_CASE("init<gloo::Communicator>() reads the world from the launcher's variables") {
  auto result = ncclkit::spawn(2, [](const ncclkit::WorldInfo& given) {
    // What ncclkit-run or torchrun would set for this worker.
    ::setenv("RANK", std::to_string(given.rank).c_str(), 1);
    ::setenv("WORLD_SIZE", "2", 1);
    ::setenv("LOCAL_RANK", std::to_string(given.rank).c_str(), 1);
    ::setenv("LOCAL_WORLD_SIZE", "2", 1);
    ::setenv("NCCLKIT_INIT_URL", given.init_url.c_str(), 1);
    ::setenv("NCCLKIT_GLOO_HOSTNAME", "127.0.0.1", 1);
    auto job = ncclkit::init<ncclkit::gloo::Communicator>();
    std::vector<int> values{job.world.rank};
    job.comm.all_reduce(std::span<int>(values), ncclkit::ReduceOp::kMax);
    return job.world.rank == given.rank && job.world.world_size == 2 && values[0] == 1 ? 0 : 1;
  });
  INFO(result.describe());
  CHECK(result.ok());
}

TEST_CASE("init() passes on make_store's errors, naming the URL") {
  ncclkit::WorldInfo world;
  world.init_url = "file://relative/dir";
  CHECK_THROWS_WITH_AS(ncclkit::init<ncclkit::gloo::Communicator>(world), doctest::Contains("three slashes"),
                       ncclkit::ConfigError);
}
