// The element-wise kernels of ncclkit/nccl/kernels.cuh (scale, fill) against the host, for every
// element type. The only GPU test source nvcc compiles: the other GPU tests are host code.
// Including the kernels here registers the scale launcher for the whole GPU test executable.
// ncclkit-test: labels=nccl timeout=300
#include <doctest/doctest.h>

#include <chrono>  // std::chrono
#include <cmath>   // std::nearbyint
#include <limits>  // std::numeric_limits
#include <memory>  // std::shared_ptr
#include <string>  // std::string
#include <vector>  // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"
#include "ncclkit/nccl/kernels.cuh"

namespace {

using namespace ncclkit_test;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;
using ncclkit::nccl::Options;

TEST_CASE("the scale launcher is registered by including the kernels") {
  CHECK(static_cast<bool>(ncclkit::nccl::detail::scale_launcher() != nullptr));
}

// ---- kernels ----------------------------------------------------------------------------------

TEST_CASE("scale and fill kernels agree with the host for every type") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "kernels"});
    Checker checker(world.rank);
    const cudaStream_t s = comm.default_stream();
    for_each_type([&]<class T>() {
      const std::size_t count = 100003;
      const auto input = make_input<T>(3, 0, count);
      DeviceBuffer<T> buffer(count, comm.device());
      for (double factor : {0.5, -3.0}) {
        upload(buffer, input, s);
        comm.scale(buffer.view(), factor);
        const auto got = download(comm, buffer, s);
        std::size_t wrong = 0;
        for (std::size_t i = 0; i < count; ++i) {
          const double x = as_double(input[i]) * factor;
          double expected = 0;
          if constexpr (is_float_v<T>) {
            // float arithmetic, then rounding to T (what the kernel does): compare within 1 ulp of T
            expected = as_double(from_double<T>(static_cast<float>(as_double(input[i])) * static_cast<float>(factor)));
            if constexpr (std::is_same_v<T, double>) expected = x;
          } else {
            double r = std::nearbyint(x);
            const double lo = static_cast<double>(std::numeric_limits<T>::lowest());
            const double hi = static_cast<double>(std::numeric_limits<T>::max());
            expected = r < lo ? lo : (r > hi ? hi : r);
          }
          if (as_double(got[i]) != expected) ++wrong;
        }
        checker.expect(wrong == 0, "scale " + type_name<T>() + " by " + std::to_string(factor) + ": " +
                                       std::to_string(wrong) + " wrong elements");
      }
    });
    DeviceBuffer<float> filled(777, comm.device());
    ncclkit::nccl::fill(filled.data(), filled.size(), 2.5f, s);
    checker.expect(download(comm, filled, s) == std::vector<float>(777, 2.5f), "fill");
    return checker.finish("kernels");
  });
}

}  // namespace
