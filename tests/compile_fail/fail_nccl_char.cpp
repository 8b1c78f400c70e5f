// char is a type of its own, neither int8_t (signed char) nor uint8_t: its signedness is the
// platform's, so ncclkit does not guess.
// expect-error: this element type is not supported
#include "ncclkit/nccl/communicator.hpp"

void unsupported(ncclkit::nccl::Communicator& comm, char* data) { comm.all_reduce(data, data, 4); }
