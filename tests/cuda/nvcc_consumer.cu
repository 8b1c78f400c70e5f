// A user's CUDA source that uses the fusion and compression layers over the NCCL backend,
// compiled and linked by nvcc (the build fails where it would not compile or link). What nvcc
// once broke: `Slot == Slot` and the plan comparisons of tuning did not link (nvcc never emitted
// an operator== implied by a defaulted <=>), and NCCL's device header, which ncclkit's kernels
// include, took the global name `nccl` from the user. Run without arguments it only compares on
// the host; with `--gpu` it runs one tuned, compressed step on a world of one GPU.
#include <ncclkit/compression.hpp>
#include <ncclkit/nccl.hpp>

#include <cstdio>
#include <cstring>

namespace nccl = ncclkit::nccl;  // the obvious alias, and a global name of the user's
namespace fusion = ncclkit::fusion;

static int one_step_on_a_gpu() {
  ncclkit::WorldInfo world;
  world.init_url = "file:///tmp/ncclkit-nvcc-consumer";
  auto [me, store, comm] = ncclkit::init<nccl::Communicator>(world);
  fusion::FusedLayout layout;
  layout.add("w", {1024}, ncclkit::DataType::kFloat32);
  layout.add("b", {16}, ncclkit::DataType::kFloat32);
  layout.finalize();
  fusion::FusedBuffer<nccl::Communicator> gradients(comm, layout);
  fusion::GradientSync<nccl::Communicator> sync(
      gradients, {.reducer = ncclkit::compression::compressed({.codec = ncclkit::compression::Codec::kFloat16}),
                  .tuning = fusion::TuningOptions{.warmup_steps = 0, .measured_steps = 1}});
  for (int step = 0; step < 10; ++step) {
    sync.mark_ready("b");
    sync.mark_ready("w");
    sync.finish();
  }
  comm.synchronize();
  std::printf("%s\n", sync.tuning().describe().c_str());
  return 0;
}

int main(int argc, char** argv) {
  const fusion::Slot a{1};
  const fusion::Slot b{1};
  fusion::FusedLayout layout;
  layout.add("x", {300}, ncclkit::DataType::kFloat32);
  layout.finalize();
  const bool plans_equal = fusion::BucketPlan::compute(layout) == fusion::BucketPlan::compute(layout);
  if (!(a == b) || a != b || !(a <= b) || !plans_equal) {
    std::printf("nvcc consumer: comparisons gave wrong answers\n");
    return 1;
  }
  if (argc > 1 && std::strcmp(argv[1], "--gpu") == 0) return one_step_on_a_gpu();
  std::printf("nvcc consumer: ok\n");
  return 0;
}
