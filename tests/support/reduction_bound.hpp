#pragma once
// The element-wise error bound of each reduction the GPU tests check (tests/gpu/nccl_support.hpp,
// test_nccl_large.cpp, test_nccl_fusion.cpp), on summation_bound.hpp's bounds of sums and
// products: by reduce op, for results computed in T, and for float32 averages whose data cross
// in 16 bits. Host code, no CUDA: its test is tests/host/test_reduction_bound.cpp.
#include <cmath>  // std::fabs

#include "ncclkit/core/dtype.hpp"  // ncclkit::ReduceOp, ncclkit::data_type_v
#include "support/summation_bound.hpp"

namespace ncclkit_test {

/// The error allowed in one element of a reduction over `world` ranks of T inputs computed in
/// T, where `magnitude` is the sum over ranks of the inputs' absolute values and `exact` the
/// exact result:
///   sum: n - 1 additions;
///   avg: the inputs scaled by 1/n (a rounded factor: two roundings each) and summed, or summed
///        and then divided (n - 1 additions of values n times larger, one more rounding: no
///        more than the first), counted on sum |x_r| / n;
///   prod: n - 1 multiplications, relative to the result;
///   min, max: none (the result is one of the inputs, exactly).
template <class T>
double reduction_bound(ncclkit::ReduceOp op, int world, double magnitude, double exact) {
  constexpr ncclkit::DataType type = ncclkit::data_type_v<T>;
  switch (op) {
    case ncclkit::ReduceOp::kSum:
      return sum_bound(type, world, magnitude);
    case ncclkit::ReduceOp::kAvg:
      return sum_bound(type, world, magnitude / world, 2);
    case ncclkit::ReduceOp::kProd:
      return product_bound(type, world, exact);
    case ncclkit::ReduceOp::kMin:
    case ncclkit::ReduceOp::kMax:
      return 0.0;
  }
  return 0.0;
}

/// The error allowed in a float32 average over `world` ranks whose data cross in the 16-bit
/// type `wire` (GradientSync's codecs, Communicator::compressed_all_reduce), where `magnitude`
/// is sum |x_r| / world: each rank's input scaled in float32 and rounded once to `wire`, the
/// n - 1 additions rounded to `wire` (the separate casts: cast, 16-bit all-reduce, cast; the
/// fused kernel rounds fewer: it adds in float32 and rounds the sum once), plus float32's
/// roundings of the scaling and the additions.
inline double compressed_average_bound(ncclkit::DataType wire, int world, double magnitude) {
  return sum_bound(wire, world, magnitude, 1) + sum_bound(ncclkit::DataType::kFloat32, world, magnitude, 1);
}

}  // namespace ncclkit_test
