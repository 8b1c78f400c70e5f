// A user's program that includes ncclkit's host headers: rendezvous of 2 processes through a
// FileStore, then a barrier. Built three ways by .ci/run (add_subdirectory, find_package, -I).
#include <cstdio>

#include <ncclkit/ncclkit.hpp>

int main() {
  auto result = ncclkit::spawn(2, [](const ncclkit::WorldInfo& world) {
    auto store = ncclkit::make_store(world.init_url, world);
    store->set("hello/" + std::to_string(world.rank), "hi");
    ncclkit::barrier(*store, world.rank, world.world_size, "consumer");
    return store->get_string("hello/" + std::to_string(1 - world.rank)) == "hi" ? 0 : 1;
  });
  std::printf("consumer: %s\n", result.describe().c_str());
  return result.ok() ? 0 : 1;
}
