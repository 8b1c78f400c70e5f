// A TensorView (what both backends' type-erased collectives take) of long double.
// expect-error: this element type is not supported
#include "ncclkit/core/tensor.hpp"

ncclkit::TensorView unsupported(long double* data) { return ncclkit::TensorView::of(data, 4); }
