// The demo's training on GPUs: one GPU per worker (the local rank's), the model in CUDA
// kernels (mlp_gpu.cuh), the data on the GPU, the same trainer code as on CPUs (train.hpp).
#include <ncclkit/nccl.hpp>
#include <ncclkit/trainer.hpp>

#include "digits/data.hpp"
#include "digits/mlp_gpu.cuh"
#include "digits/train.hpp"

namespace digits {

double train_on_gpus(const ncclkit::WorldInfo& world, const Samples& train, const Samples& test, const RunOptions& run) {
  auto [me, store, comm] = ncclkit::init<ncclkit::nccl::Communicator>(world);
  MlpGpu<ncclkit::nccl::Communicator> model(128, 7);
  const DeviceData train_data(train, comm.device()), test_data(test, comm.device());
  return digits::train(comm, model, train_data, test_data, run);
}

}  // namespace digits
