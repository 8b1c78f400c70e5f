#pragma once
/// Compile-time maps from ncclkit's element types and reduce ops to NCCL's, and the CUDA
/// 16-bit types (`__half`, `__nv_bfloat16`) as element types.
///
/// An element type NCCL cannot move fails to compile with a readable message (through
/// `ncclkit::data_type_v`); host code only, compiles with g++ given the CUDA include folder.

#include <cuda_bf16.h>  // __nv_bfloat16
#include <cuda_fp16.h>  // __half
#include <nccl.h>       // ncclDataType_t, ncclRedOp_t

#include <string>  // std::string

// The oldest NCCL ncclkit supports: ncclCommSplit and non-blocking init through ncclConfig_t.
#if !defined(NCCL_VERSION_CODE) || NCCL_VERSION_CODE < NCCL_VERSION(2, 18, 0)
#error "ncclkit needs NCCL 2.18 or newer (found an older nccl.h); set NCCL_ROOT to a newer NCCL"
#endif

// NCCL 2.28 brought ncclAlltoAll, ncclGather and ncclScatter; with older NCCL, ncclkit issues
// them as grouped send/recv. Defining NCCLKIT_NCCL_GROUPED_FALLBACKS takes the grouped path
// on 2.28 too: the GPU tests build a variant of the collective matrix with it, so that the
// path older NCCL takes runs on every GPU run.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0) && !defined(NCCLKIT_NCCL_GROUPED_FALLBACKS)
#define NCCLKIT_NCCL_NATIVE_ALLTOALL_GATHER_SCATTER 1
#else
#define NCCLKIT_NCCL_NATIVE_ALLTOALL_GATHER_SCATTER 0
#endif

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/error.hpp"

namespace ncclkit {

// CUDA's own 16-bit types have the same bits as ncclkit::Half / BFloat16.
NCCLKIT_DATATYPE_OF(__half, kFloat16);
NCCLKIT_DATATYPE_OF(__nv_bfloat16, kBFloat16);

}  // namespace ncclkit

namespace ncclkit::nccl {

/// NCCL's name for `type`. Every DataType has one (bf16 since NCCL 2.10).
constexpr ncclDataType_t to_nccl(DataType type) {
  switch (type) {
    case DataType::kInt8:
      return ncclInt8;
    case DataType::kUint8:
      return ncclUint8;
    case DataType::kInt32:
      return ncclInt32;
    case DataType::kUint32:
      return ncclUint32;
    case DataType::kInt64:
      return ncclInt64;
    case DataType::kUint64:
      return ncclUint64;
    case DataType::kFloat16:
      return ncclFloat16;
    case DataType::kBFloat16:
      return ncclBfloat16;
    case DataType::kFloat32:
      return ncclFloat32;
    case DataType::kFloat64:
      return ncclFloat64;
  }
  return ncclFloat32;  // unreachable for valid enumerators
}

/// NCCL's op for `op` (kAvg is ncclAvg, NCCL >= 2.10: sum, then divide by the rank count;
/// integer types divide with truncation).
constexpr ncclRedOp_t to_nccl(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kProd:
      return ncclProd;
    case ReduceOp::kMin:
      return ncclMin;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kAvg:
      return ncclAvg;
  }
  return ncclSum;  // unreachable for valid enumerators
}

/// The NCCL type of C++ element type `T`; unsupported types fail to compile (see DataTypeOf).
template <class T>
inline constexpr ncclDataType_t nccl_type_v = to_nccl(data_type_v<T>);

/// Whether `type` is a valid DataType enumerator (a cast from a bad integer is not).
constexpr bool is_valid(DataType type) {
  return static_cast<int>(type) >= static_cast<int>(DataType::kInt8) &&
         static_cast<int>(type) <= static_cast<int>(DataType::kFloat64);
}
constexpr bool is_valid(ReduceOp op) {
  return static_cast<int>(op) >= static_cast<int>(ReduceOp::kSum) &&
         static_cast<int>(op) <= static_cast<int>(ReduceOp::kAvg);
}

}  // namespace ncclkit::nccl
