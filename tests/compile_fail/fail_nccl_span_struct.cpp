// A span of a user struct (two floats are not one element NCCL can reduce).
// expect-error: this element type is not supported
#include <span>  // std::span

#include "ncclkit/nccl/communicator.hpp"

struct Point {
  float x, y;
};

void unsupported(ncclkit::nccl::Communicator& comm, std::span<Point> points) { comm.all_reduce(points); }
