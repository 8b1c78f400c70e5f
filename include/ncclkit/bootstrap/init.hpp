#pragma once
/// init(): the common start of a worker in one call, as init_process_group is for PyTorch:
/// this process's WorldInfo, the store its init URL names, and a communicator over it.
///
///   auto [world, store, comm] = ncclkit::init<ncclkit::gloo::Communicator>();   // CPUs
///   auto [world, store, comm] = ncclkit::init<ncclkit::nccl::Communicator>();   // GPUs
///
/// Templated on the communicator type, so this header needs neither backend: include the
/// backend's entry header (<ncclkit/gloo.hpp> or <ncclkit/nccl.hpp>), which includes this one.

#include <memory>       // std::shared_ptr
#include <type_traits>  // std::is_same_v
#include <utility>      // std::move

#include "ncclkit/bootstrap/environment.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/world_info.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/store/store.hpp"

namespace ncclkit {

/// What init() returns. Members are destroyed in reverse order: the communicator before the
/// store it rendezvoused through. Unpack it with a structured binding, or keep it whole.
template <class Communicator>
struct Initialized {
  WorldInfo world;               ///< this process's place in the job
  std::shared_ptr<Store> store;  ///< the store world.init_url names (keep it for barriers, keys)
  Communicator comm;             ///< the communicator, ready for collectives
};

namespace detail {
/// Stands for "the communicator's default options" in init()'s signature.
struct DefaultCommunicatorOptions {};
}  // namespace detail

/// The store that `world.init_url` names (make_store), and a `Communicator` created over it
/// for `world`, with `options` (the backend's options type: gloo::Options or
/// nccl::Options; left out: the communicator's defaults). Every rank of the job calls it.
///
/// Throws what make_store() and the communicator's constructor throw: ConfigError for a bad
/// URL or WorldInfo, TimeoutError when the others do not arrive within the store's timeout or
/// the communicator's, StoreError, CommError.
template <class Communicator, class Options = detail::DefaultCommunicatorOptions>
Initialized<Communicator> init(const WorldInfo& world, Options options = {}) {
  std::shared_ptr<Store> store = make_store(world.init_url, world);
  if constexpr (std::is_same_v<Options, detail::DefaultCommunicatorOptions>) {
    return Initialized<Communicator>{world, store, Communicator(store, world)};
  } else {
    return Initialized<Communicator>{world, store, Communicator(store, world, std::move(options))};
  }
}

/// As init(world), with the world from the launcher's environment: detect_world() (torchrun,
/// ncclkit-run, srun or mpirun variables; NCCLKIT_INIT_URL, else env://). A process started
/// without a launcher is rank 0 of 1. For options too, write init<C>(detect_world(), options).
template <class Communicator>
Initialized<Communicator> init() {
  return init<Communicator>(detect_world());
}

}  // namespace ncclkit
