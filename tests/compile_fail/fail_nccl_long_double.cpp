// NCCL has no long double.
// expect-error: this element type is not supported
#include "ncclkit/nccl/communicator.hpp"

void unsupported(ncclkit::nccl::Communicator& comm, long double* data) { comm.all_reduce(data, data, 4); }
