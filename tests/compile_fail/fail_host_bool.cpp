// bool is no element type any backend moves.
// expect-error: this element type is not supported
#include "ncclkit/core/dtype.hpp"

ncclkit::DataType unsupported() { return ncclkit::data_type_v<bool>; }
