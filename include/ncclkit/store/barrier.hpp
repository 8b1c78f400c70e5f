#pragma once
/// barrier(): every rank of a group waits until all have arrived, through a store.

#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "ncclkit/store/store.hpp"

namespace ncclkit {

/// Blocks until all `world` ranks have called barrier() with the same `tag` as often as this
/// rank has. Reusable: the n-th call of each rank meets the n-th call of the others.
/// Throws TimeoutError after `timeout`, naming the ranks that never arrived.
///
/// Cost: two store writes, one add and one wait per rank; the last rank to arrive releases
/// the others by setting one key, so waiting ranks poll a single key.
inline void barrier(Store& store, int rank, int world, std::string_view tag, Store::Duration timeout) {
  if (world <= 0 || rank < 0 || rank >= world) {
    throw ConfigError("barrier '" + std::string(tag) + "': rank " + std::to_string(rank) + " is outside a world of " +
                      std::to_string(world) + " ranks");
  }
  const std::string base = "barrier/" + std::string(tag);
  const std::int64_t arrival = store.add(base + "/arrived", 1);
  const std::int64_t generation = (arrival - 1) / world;
  const std::string round = base + "/" + std::to_string(generation);
  store.set(round + "/rank/" + std::to_string(rank), std::string_view("1"));
  if (arrival % world == 0) store.set(round + "/done", std::string_view("1"));
  try {
    store.wait({round + "/done"}, timeout);
  } catch (const TimeoutError& e) {
    std::string missing;
    int missing_count = 0;
    for (int r = 0; r < world; ++r) {
      if (!store.check({round + "/rank/" + std::to_string(r)})) {
        if (missing_count < 32) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
        ++missing_count;
      }
    }
    if (missing_count > 32) missing += ", ... (" + std::to_string(missing_count) + " in all)";
    throw TimeoutError("barrier '" + std::string(tag) + "' (rank " + std::to_string(rank) + " of " +
                       std::to_string(world) + ", round " + std::to_string(generation) +
                       ") timed out: rank(s) never arrived: " +
                       (missing.empty() ? "none missing now (they arrived late)" : missing) + "; " + e.what());
  }
}

inline void barrier(Store& store, int rank, int world, std::string_view tag) {
  barrier(store, rank, world, tag, store.default_timeout());
}

}  // namespace ncclkit
