#pragma once
/// Entry header for the GPU backend: everything of <ncclkit/store.hpp>, nccl::Communicator,
/// LocalGroup (one process, several GPUs), DeviceBuffer, Stream, Event and init(). Host code:
/// compiles with g++ given the CUDA include folder, and with nvcc. Link ncclkit::nccl (CMake:
/// it brings NCCL and the CUDA runtime), or -lnccl -lcudart by hand.

#include "ncclkit/core/error.hpp"  // first: stops a pre-C++20 build with one message

#include "ncclkit/bootstrap/init.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"
#include "ncclkit/nccl/local_group.hpp"
#include "ncclkit/nccl/stream.hpp"
#include "ncclkit/store.hpp"
