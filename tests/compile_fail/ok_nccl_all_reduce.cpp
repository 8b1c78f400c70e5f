// Control: must compile. The same header and calls as the fail_nccl_* sources, with
// supported element types (g++ alone, given the CUDA and NCCL include folders).
#include <cuda_fp16.h>  // __half

#include <cstdint>  // std::int8_t
#include <span>     // std::span

#include "ncclkit/core/half.hpp"
#include "ncclkit/nccl/communicator.hpp"

void control(ncclkit::nccl::Communicator& comm, float* floats, std::int8_t* bytes, std::span<ncclkit::Half> halves,
             std::span<__half> cuda_halves) {
  comm.all_reduce(floats, floats, 4);
  comm.all_reduce(bytes, bytes, 4);
  comm.all_reduce(halves);
  comm.all_reduce(cuda_halves);
}
