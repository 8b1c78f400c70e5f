// Control: must compile. The same headers, flags and include folders as the fail_host_*
// sources, with supported element types, so that a broken include path or flag cannot pass
// for the expected failure.
#include <cstdint>  // std::int8_t, std::uint8_t, std::int64_t

#include "ncclkit/core/dtype.hpp"
#include "ncclkit/core/half.hpp"
#include "ncclkit/core/tensor.hpp"

static_assert(ncclkit::data_type_v<float> == ncclkit::DataType::kFloat32);
static_assert(ncclkit::data_type_v<const double> == ncclkit::DataType::kFloat64);
static_assert(ncclkit::data_type_v<std::int8_t> == ncclkit::DataType::kInt8);
static_assert(ncclkit::data_type_v<std::uint8_t> == ncclkit::DataType::kUint8);
static_assert(ncclkit::data_type_v<ncclkit::BFloat16> == ncclkit::DataType::kBFloat16);

ncclkit::TensorView control(std::int64_t* data) { return ncclkit::TensorView::of(data, 4); }
