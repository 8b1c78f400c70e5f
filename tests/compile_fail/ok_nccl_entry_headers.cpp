// Control: must compile. The umbrella header holds the whole GPU backend, DeviceBuffer,
// Stream and Event included, and init() for it; <ncclkit/nccl.hpp> holds the same.
#include <ncclkit/ncclkit.hpp>
#include <ncclkit/nccl.hpp>

#include <vector>  // std::vector

void uses_the_gpu_parts(const ncclkit::WorldInfo& world) {
  auto [me, store, comm] = ncclkit::init<ncclkit::nccl::Communicator>(world, ncclkit::nccl::Options{.name = "grads"});
  ncclkit::nccl::DeviceBuffer<float> buffer(1024, comm.device());
  ncclkit::nccl::Stream stream(comm.device());
  ncclkit::nccl::Event event(comm.device());
  buffer.upload(std::vector<float>(1024, 1.0f));
  comm.all_reduce(buffer.span(), ncclkit::ReduceOp::kSum, stream);
  event.record(stream);
  (void)me;
  (void)store;
}
