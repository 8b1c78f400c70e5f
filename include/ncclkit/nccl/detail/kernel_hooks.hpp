#pragma once
/// Hooks through which host code (compiled by g++ or nvcc) reaches the element-wise kernels of
/// ncclkit/nccl/kernels.cuh. The kernels exist only in translation units compiled by nvcc;
/// including kernels.cuh in any one of them (communicator.hpp does so under nvcc) fills the
/// hooks for the whole program.

#include <cuda_runtime_api.h>  // cudaStream_t

#include <cstddef>  // std::size_t

#include "ncclkit/core/dtype.hpp"

namespace ncclkit::nccl::detail {

/// Multiplies `count` elements of `type` at `data` by `factor` on `stream`.
using ScaleLauncher = void (*)(void* data, std::size_t count, DataType type, double factor, cudaStream_t stream);

/// The program-wide scale launcher; null until a translation unit compiled by nvcc included
/// ncclkit/nccl/kernels.cuh.
inline ScaleLauncher& scale_launcher() {
  static ScaleLauncher launcher = nullptr;
  return launcher;
}

}  // namespace ncclkit::nccl::detail
