// The fusion layer over the NCCL backend (ncclkit/fusion/gradient_sync.hpp with
// nccl::Communicator): every bucket reduced in place on the comm stream after an event of the
// compute stream, joined back by events; results equal a float64 average of every rank's
// gradients on ResNet-50's real shapes, with the ready order shuffled differently on every rank.
#include <doctest/doctest.h>

#include <algorithm>  // std::shuffle
#include <chrono>     // std::chrono
#include <cmath>      // std::sqrt
#include <cstdint>    // std::uint64_t
#include <cstring>    // std::memcpy
#include <random>     // std::mt19937_64, std::normal_distribution
#include <string>     // std::string
#include <vector>     // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "support/model_shapes.hpp"

namespace {

using namespace ncclkit_test;
using ncclkit::DataType;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::FusedBuffer;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::GradientSync;
using ncclkit::fusion::Slot;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::Options;

// Rank r's gradients of the whole float buffer at `step`, N(0, 1e-3), laid out as the layout
// says (padding left at zero).
std::vector<float> gradients(const FusedLayout& layout, int rank, int step) {
  std::vector<float> host(layout.total_bytes(DataType::kFloat32) / sizeof(float), 0.0f);
  std::mt19937_64 random(0x51ed27ULL * static_cast<std::uint64_t>(rank + 1) + static_cast<std::uint64_t>(step));
  std::normal_distribution<float> normal(0.0f, 1e-3f);
  for (std::uint32_t i = 0; i < layout.size(); ++i) {
    const Slot slot{i};
    float* values = host.data() + layout.offset_elements(slot);
    for (std::size_t j = 0; j < layout.count(slot); ++j) values[j] = normal(random);
  }
  return host;
}

TEST_CASE("bucketed gradients over NCCL equal the float64 average, in every rank's own ready order") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "fusion"});
      FusedBuffer<Communicator> grads(comm, ncclkit::testing::model_layout("resnet50"));
      const FusedLayout& layout = grads.layout();
      GradientSync<Communicator> sync(grads, BucketPlan::compute(layout));
      std::vector<std::uint32_t> order(layout.size());
      for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
      std::mt19937 shuffle_random(77u + static_cast<unsigned>(world.rank));
      const std::size_t bytes = layout.total_bytes(DataType::kFloat32);
      std::vector<float> out(bytes / sizeof(float));
      for (int step = 0; step < 3; ++step) {
        // The backward pass's writes, on the default stream the sync is told about.
        const std::vector<float> mine = gradients(layout, world.rank, step);
        comm.copy_from_host(grads.data(DataType::kFloat32), mine.data(), bytes, comm.default_stream());
        std::shuffle(order.begin(), order.end(), shuffle_random);
        for (std::uint32_t i : order) sync.mark_ready(Slot{i}, comm.default_stream());
        sync.finish(comm.default_stream());
        comm.copy_to_host(out.data(), grads.data(DataType::kFloat32), bytes, comm.default_stream());
        comm.synchronize(comm.default_stream());
        std::vector<double> reference(out.size(), 0.0);
        for (int r = 0; r < world.world_size; ++r) {
          const std::vector<float> theirs = r == world.rank ? mine : gradients(layout, r, step);
          for (std::size_t j = 0; j < reference.size(); ++j) reference[j] += theirs[j] / world.world_size;
        }
        double error = 0, norm = 0;
        for (std::size_t j = 0; j < reference.size(); ++j) {
          error += (out[j] - reference[j]) * (out[j] - reference[j]);
          norm += reference[j] * reference[j];
        }
        const double relative = std::sqrt(error / norm);
        checker.expect(relative <= 1e-6, "step " + std::to_string(step) + ": norm-relative error " +
                                             std::to_string(relative) + " > 1e-6");
      }
      checker.expect(sync.stats().launched_before_finish == sync.stats().buckets,
                     "every bucket launched as its last tensor became ready");
      return checker.finish("GradientSync over NCCL");
    });
  }
}

}  // namespace
