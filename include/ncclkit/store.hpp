#pragma once
/// Entry header for rendezvous without a backend: stores, barrier, WorldInfo and its detection,
/// init URLs and make_store(), spawn(), this node's GPUs (found without CUDA), and the core
/// types (errors, dtypes, Half/BFloat16, tensor views). C++20 and POSIX only.
/// <ncclkit/gloo.hpp> and <ncclkit/nccl.hpp> include it.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include "ncclkit/version.hpp"

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/knobs.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"

#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/file_store.hpp"
#include "ncclkit/store/memory_store.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "ncclkit/store/store.hpp"
#include "ncclkit/store/tcp_store.hpp"
#include "ncclkit/store/tcp_store_options.hpp"
#include "ncclkit/store/tcp_store_server.hpp"

#include "ncclkit/bootstrap/environment.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/local_gpus.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/bootstrap/world_info.hpp"
