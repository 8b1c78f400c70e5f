#pragma once
/// ncclkit's umbrella header: everything this build can use.
///   - always: <ncclkit/store.hpp> (core types, stores, bootstrap: C++20 and POSIX only);
///   - <ncclkit/gloo.hpp>, the Gloo backend, when Gloo's headers are found and the compiler is
///     not nvcc (define NCCLKIT_NO_GLOO to leave it out);
///   - <ncclkit/nccl.hpp>, the NCCL backend with DeviceBuffer, Stream and Event, when NCCL's
///     and CUDA's headers are found (NCCLKIT_NO_NCCL leaves it out).
/// Including all of it costs seconds of compile time per source file: a file that needs one
/// part includes that part's entry header instead (README.md, "Which header").

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include "ncclkit/bootstrap/init.hpp"
#include "ncclkit/store.hpp"
#include "ncclkit/trainer.hpp"  // fusion, compression and the trainer

// Gloo's reduction loops use GCC vector extensions that nvcc's front end rejects: .cu files
// get the NCCL backend only (include the Gloo header from a .cpp file).
#if !defined(NCCLKIT_NO_GLOO) && !defined(__CUDACC__) && __has_include(<gloo/context.h>)
#include "ncclkit/gloo.hpp"
#endif

#if !defined(NCCLKIT_NO_NCCL) && __has_include(<nccl.h>) && __has_include(<cuda_runtime.h>)
#include "ncclkit/nccl.hpp"
#endif
