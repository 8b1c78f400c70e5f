#pragma once
/// Element types ncclkit moves and reduces, and the compile-time map from C++ types to them.

#include <cstddef>      // std::size_t
#include <cstdint>      // fixed-width integers
#include <string>       // std::to_string
#include <string_view>  // std::string_view

#include "ncclkit/core/error.hpp"
#include "ncclkit/core/half.hpp"

namespace ncclkit {

/// Element type of a buffer.
enum class DataType : int {
  kInt8,
  kUint8,
  kInt32,
  kUint32,
  kInt64,
  kUint64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

/// Bytes per element.
constexpr std::size_t size_of(DataType type) {
  switch (type) {
    case DataType::kInt8:
    case DataType::kUint8:
      return 1;
    case DataType::kFloat16:
    case DataType::kBFloat16:
      return 2;
    case DataType::kInt32:
    case DataType::kUint32:
    case DataType::kFloat32:
      return 4;
    case DataType::kInt64:
    case DataType::kUint64:
    case DataType::kFloat64:
      return 8;
  }
  return 0;
}

/// The name nccl-tests prints for the type ("float", "half", "bfloat16", "int32", ...).
constexpr std::string_view name_of(DataType type) {
  switch (type) {
    case DataType::kInt8:
      return "int8";
    case DataType::kUint8:
      return "uint8";
    case DataType::kInt32:
      return "int32";
    case DataType::kUint32:
      return "uint32";
    case DataType::kInt64:
      return "int64";
    case DataType::kUint64:
      return "uint64";
    case DataType::kFloat16:
      return "half";
    case DataType::kBFloat16:
      return "bfloat16";
    case DataType::kFloat32:
      return "float";
    case DataType::kFloat64:
      return "double";
  }
  return "unknown";
}

constexpr bool is_floating(DataType type) {
  return type == DataType::kFloat16 || type == DataType::kBFloat16 || type == DataType::kFloat32 ||
         type == DataType::kFloat64;
}

/// Maps a C++ element type to its DataType. Backends add specialisations for their own
/// 16-bit types (CUDA's __half and __nv_bfloat16 in the NCCL headers).
template <class T>
struct DataTypeOf {
  static_assert(sizeof(T) == 0,
                "ncclkit: this element type is not supported; use int8_t, uint8_t, int32_t, "
                "uint32_t, int64_t, uint64_t, float, double, ncclkit::Half or ncclkit::BFloat16");
};
template <class T>
struct DataTypeOf<const T> : DataTypeOf<T> {};

#define NCCLKIT_DATATYPE_OF(Type, Value)               \
  template <>                                          \
  struct DataTypeOf<Type> {                            \
    static constexpr DataType value = DataType::Value; \
  }
NCCLKIT_DATATYPE_OF(std::int8_t, kInt8);
NCCLKIT_DATATYPE_OF(std::uint8_t, kUint8);
NCCLKIT_DATATYPE_OF(std::int32_t, kInt32);
NCCLKIT_DATATYPE_OF(std::uint32_t, kUint32);
NCCLKIT_DATATYPE_OF(std::int64_t, kInt64);
NCCLKIT_DATATYPE_OF(std::uint64_t, kUint64);
NCCLKIT_DATATYPE_OF(Half, kFloat16);
NCCLKIT_DATATYPE_OF(BFloat16, kBFloat16);
NCCLKIT_DATATYPE_OF(float, kFloat32);
NCCLKIT_DATATYPE_OF(double, kFloat64);

/// The DataType of `T`; fails to compile, with a readable message, for unsupported types.
template <class T>
inline constexpr DataType data_type_v = DataTypeOf<T>::value;

/// Calls `visit.template operator()<T>()` with the C++ element type of `type` and returns
/// what it returns: one switch for every place that turns a run-time DataType into a type.
template <class Visitor>
decltype(auto) visit_data_type(DataType type, Visitor&& visit) {
  switch (type) {
    case DataType::kInt8:
      return visit.template operator()<std::int8_t>();
    case DataType::kUint8:
      return visit.template operator()<std::uint8_t>();
    case DataType::kInt32:
      return visit.template operator()<std::int32_t>();
    case DataType::kUint32:
      return visit.template operator()<std::uint32_t>();
    case DataType::kInt64:
      return visit.template operator()<std::int64_t>();
    case DataType::kUint64:
      return visit.template operator()<std::uint64_t>();
    case DataType::kFloat16:
      return visit.template operator()<Half>();
    case DataType::kBFloat16:
      return visit.template operator()<BFloat16>();
    case DataType::kFloat32:
      return visit.template operator()<float>();
    case DataType::kFloat64:
      return visit.template operator()<double>();
  }
  throw ConfigError("ncclkit: unknown data type " + std::to_string(static_cast<int>(type)));
}

/// Reduction operations. `kAvg` is sum divided by the number of ranks.
enum class ReduceOp : int { kSum, kProd, kMin, kMax, kAvg };

/// The name nccl-tests prints for the op.
constexpr std::string_view name_of(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kProd:
      return "prod";
    case ReduceOp::kMin:
      return "min";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kAvg:
      return "avg";
  }
  return "unknown";
}

}  // namespace ncclkit
