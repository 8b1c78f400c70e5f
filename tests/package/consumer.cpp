// A user's program that includes ncclkit's store entry header: rendezvous of 2 processes
// through a FileStore, then a barrier. It names options structs with designated initialisers
// the way the docs show them, and is compiled with -Wall -Wextra -Werror, so that a missing
// default member initialiser (-Wmissing-field-initializers) fails CI. Built three ways by
// .ci/run (add_subdirectory, find_package, -I).
#include <chrono>
#include <cstdio>
#include <string>

#include <ncclkit/store.hpp>

using namespace std::chrono_literals;

// Each options struct, with one field named: compiled, not run.
[[maybe_unused]] static void documented_options() {
  [[maybe_unused]] ncclkit::TcpStoreServerOptions server{.port = 0};
  [[maybe_unused]] ncclkit::TcpStoreOptions client{.port = 29500, .timeout = 30s};
  [[maybe_unused]] ncclkit::FileStoreOptions file{.world_size = 2};
  [[maybe_unused]] ncclkit::MakeStoreOptions make{.timeout = 30s};
  [[maybe_unused]] ncclkit::SpawnOptions spawn{.grace = 1s};
  [[maybe_unused]] ncclkit::WorldInfoOverrides overrides{.rank = 0};
  [[maybe_unused]] ncclkit::WorldInfo world{.rank = 0, .world_size = 1};
}

int main() {
  auto result = ncclkit::spawn(2,
                               [](const ncclkit::WorldInfo& world) {
                                 auto store = ncclkit::make_store(world.init_url, world, {.timeout = 60s});
                                 store->set("hello/" + std::to_string(world.rank), "hi");
                                 ncclkit::barrier(*store, world.rank, world.world_size, "consumer");
                                 return store->get_string("hello/" + std::to_string(1 - world.rank)) == "hi" ? 0 : 1;
                               },
                               {.timeout = 120s});
  std::printf("consumer: %s\n", result.describe().c_str());
  return result.ok() ? 0 : 1;
}
