#pragma once
/// ncclkit's umbrella header: everything this build can use.
///   - always: core types, stores, bootstrap (C++20 and POSIX only);
///   - the Gloo backend when Gloo's headers are found and the compiler is not nvcc (define
///     NCCLKIT_NO_GLOO to leave it out);
///   - the NCCL backend when NCCL's and CUDA's headers are found (NCCLKIT_NO_NCCL leaves it out).

#include "ncclkit/version.hpp"

#include "ncclkit/core/backend.hpp"
#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/env.hpp"
#include "ncclkit/core/error.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/log.hpp"
#include "ncclkit/core/tensor.hpp"

#include "ncclkit/store/barrier.hpp"
#include "ncclkit/store/file_store.hpp"
#include "ncclkit/store/prefix_store.hpp"
#include "ncclkit/store/store.hpp"
#include "ncclkit/store/tcp_store.hpp"

#include "ncclkit/bootstrap/environment.hpp"
#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/bootstrap/world_info.hpp"

// Gloo's reduction loops use GCC vector extensions that nvcc's front end rejects: .cu files
// get the NCCL backend only (include the Gloo header from a .cpp file).
#if !defined(NCCLKIT_NO_GLOO) && !defined(__CUDACC__) && __has_include(<gloo/context.h>)
#include "ncclkit/gloo/communicator.hpp"
#endif

#if !defined(NCCLKIT_NO_NCCL) && __has_include(<nccl.h>) && __has_include(<cuda_runtime.h>)
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/local_group.hpp"
#endif
