#pragma once
/// The benchmarks' baseline: a plain NCCL communicator, made as users make one
/// (ncclCommInitRank: blocking, NCCL's default config), on the current device. Rank 0 makes the
/// unique id and passes it through `store` under `key`. Bench code only (needs NCCL).

#include <nccl.h>  // ncclGetUniqueId, ncclCommInitRank

#include <cstdint>  // std::uint8_t
#include <cstring>  // std::memcpy
#include <string>   // std::string

#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/nccl/cuda_check.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit::bench {

inline ncclComm_t init_raw_comm(Store& store, const WorldInfo& world, const std::string& key) {
  ncclUniqueId id;
  if (world.rank == 0) {
    NCCLKIT_NCCL_CHECK(ncclGetUniqueId(&id));
    const auto* first = reinterpret_cast<const std::uint8_t*>(id.internal);
    store.set(key, Bytes(first, first + sizeof(id.internal)));
  }
  const Bytes bytes = store.get(key);
  if (bytes.size() != sizeof(id.internal)) {
    throw ConfigError("the raw NCCL id under '" + key + "' has " + std::to_string(bytes.size()) + " bytes, not " +
                      std::to_string(sizeof(id.internal)));
  }
  std::memcpy(id.internal, bytes.data(), sizeof(id.internal));
  ncclComm_t comm = nullptr;
  NCCLKIT_NCCL_CHECK(ncclCommInitRank(&comm, world.world_size, id, world.rank));
  return comm;
}

}  // namespace ncclkit::bench
