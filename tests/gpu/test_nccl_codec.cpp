// The NCCL backend's codec kernels (ncclkit/nccl/detail/codec_kernels.cuh, launched by
// Communicator::cast and copy_batch) against the host: every pair of floating types, scaled,
// aligned and misaligned, byte for byte (float64 to 16 bits against values rounded once, the
// host's cast rounding through float), with non-finite outputs counted; batched copies of
// hundreds of odd sizes and alignments beside one large copy, byte for byte. compute-sanitizer
// memcheck runs this file on the GPU machine (scripts/gpu-run.sh, phase codec-memcheck).
// ncclkit-test: labels=nccl timeout=300
#include <doctest/doctest.h>

#include <chrono>   // std::chrono
#include <cstdint>  // std::uint64_t
#include <cstring>  // std::memcmp
#include <limits>   // std::numeric_limits
#include <memory>   // std::shared_ptr
#include <string>   // std::string
#include <vector>   // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/core/detail/cast.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/device_buffer.hpp"

namespace {

using namespace ncclkit_test;
using ncclkit::CopyItem;
using ncclkit::DataType;
using ncclkit::Store;
using ncclkit::TensorView;
using ncclkit::WorldInfo;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;
using ncclkit::nccl::Options;

/// `count` values of `type` (host bytes): N(0, 1) scaled by 1000, with every 97th an Inf or a
/// value beyond fp16's range, so casts to 16 bits overflow some of them.
std::vector<std::byte> values_of(DataType type, std::size_t count) {
  std::vector<double> doubles(count);
  for (std::size_t i = 0; i < count; ++i) {
    doubles[i] = (unit(11, 0, i) - 0.5) * 2000.0;
    if (i % 97 == 5) doubles[i] = 1e5;
    if (i % 389 == 7) doubles[i] = std::numeric_limits<double>::infinity();
    // Just above a tie of Half (1 + 2^-11) and of bfloat16 (1 + 2^-8), scaled by 4 against the
    // casts' factor 0.25: rounded through float they become the tie and go to the even
    // neighbour, rounded once they go up.
    if (i % 1013 == 11) doubles[i] = 4.0 * (1.0 + 0x1p-11 + 0x1p-40);
    if (i % 1013 == 12) doubles[i] = 4.0 * (1.0 + 0x1p-8 + 0x1p-40);
  }
  std::vector<std::byte> bytes(count * ncclkit::size_of(type));
  std::vector<double> scratch = doubles;
  ncclkit::detail::cast_on_host(TensorView{scratch.data(), count, DataType::kFloat64},
                                TensorView{bytes.data(), count, type}, 1.0);
  return bytes;
}

/// `count` float64 values (host bytes) times `factor`, each rounded once to the 16-bit `type`.
std::vector<std::byte> rounded_once(const std::vector<std::byte>& doubles, std::size_t count, DataType type,
                                    double factor) {
  std::vector<std::byte> bytes(count * 2);
  for (std::size_t i = 0; i < count; ++i) {
    double value = 0;
    std::memcpy(&value, doubles.data() + i * sizeof(double), sizeof value);
    const std::uint16_t bits = type == DataType::kFloat16 ? round_nearest_even<ncclkit::Half>(value * factor).bits
                                                          : round_nearest_even<ncclkit::BFloat16>(value * factor).bits;
    std::memcpy(bytes.data() + i * 2, &bits, 2);
  }
  return bytes;
}

TEST_CASE("cast kernels equal the host cast for every pair of floating types, and count non-finite outputs alike") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "codec"});
    Checker checker(world.rank);
    const cudaStream_t s = comm.default_stream();
    const DataType types[] = {DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32, DataType::kFloat64};
    const std::size_t count = 300007;  // not a multiple of any vector width
    DeviceBuffer<std::byte> in(count * 8 + 64, comm.device());
    DeviceBuffer<std::byte> out(count * 8 + 64, comm.device());
    DeviceBuffer<std::uint64_t> counter(1, comm.device());
    for (DataType from : types) {
      const std::vector<std::byte> host_in = values_of(from, count);
      for (DataType to : types) {
        // Offsets of one element: the kernels' scalar path; zero: the vector path.
        for (std::size_t shift : {std::size_t{0}, std::size_t{1}}) {
          const std::size_t n = count - shift;
          std::byte* in_at = in.data() + shift * ncclkit::size_of(from);
          std::byte* out_at = out.data() + shift * ncclkit::size_of(to);
          comm.copy_from_host(in_at, host_in.data(), n * ncclkit::size_of(from), s);
          const std::uint64_t zero = 0;
          comm.copy_from_host(counter.data(), &zero, sizeof zero, s);
          comm.cast(TensorView{in_at, n, from, ncclkit::MemoryKind::kDevice},
                    TensorView{out_at, n, to, ncclkit::MemoryKind::kDevice}, 0.25, counter.data(), s);
          std::vector<std::byte> got(n * ncclkit::size_of(to));
          std::uint64_t gpu_count = 0;
          comm.copy_to_host(got.data(), out_at, got.size(), s);
          comm.copy_to_host(&gpu_count, counter.data(), sizeof gpu_count, s);
          comm.synchronize(s);
          std::vector<std::byte> expected(got.size());
          const std::uint64_t host_count = ncclkit::detail::cast_on_host(
              TensorView{const_cast<std::byte*>(host_in.data()), n, from}, TensorView{expected.data(), n, to}, 0.25);
          const std::vector<std::byte> host_twice = expected;
          const std::string what = std::string(ncclkit::name_of(from)) + " to " + std::string(ncclkit::name_of(to)) +
                                   (shift ? " (misaligned)" : "");
          // float64 to 16 bits rounds once on the GPU and twice (through float) on the host:
          // there the reference is the double rounded once to nearest, ties to even.
          if (from == DataType::kFloat64 && ncclkit::size_of(to) == 2) {
            expected = rounded_once(host_in, n, to, 0.25);
            std::size_t differ = 0, through_float = 0;
            for (std::size_t i = 0; i < expected.size(); i += 2) {
              if (std::memcmp(&got[i], &expected[i], 2) != 0) ++differ;
            }
            for (std::size_t i = 0; i < expected.size(); ++i) through_float += expected[i] != host_twice[i] ? 1 : 0;
            checker.expect(differ == 0, what + ": " + std::to_string(differ) + " of " + std::to_string(n) +
                                            " values differ from the correctly rounded ones");
            // The inputs hold values where rounding twice goes wrong, so this compares more
            // than the host cast would.
            checker.expect(through_float > 0, what + ": no input where rounding through float differs");
          }
          checker.expect(std::memcmp(got.data(), expected.data(), got.size()) == 0, what + ": bytes differ");
          checker.expect(gpu_count == host_count, what + ": " + std::to_string(gpu_count) + " non-finite counted, " +
                                                      std::to_string(host_count) + " on the host");
          checker.expect(host_count > 0, what + ": the data holds infinities, which must be counted");
        }
      }
    }
    // In place, one type, factor 1: leaves the values and only counts.
    DeviceBuffer<float> same(1000, comm.device());
    std::vector<float> ones(1000, 1.0f);
    ones[10] = std::numeric_limits<float>::quiet_NaN();
    comm.copy_from_host(same.data(), ones.data(), 4000, s);
    const std::uint64_t zero = 0;
    comm.copy_from_host(counter.data(), &zero, sizeof zero, s);
    comm.cast(same.view(), same.view(), 1.0, counter.data(), s);
    std::uint64_t counted = 0;
    comm.copy_to_host(&counted, counter.data(), sizeof counted, s);
    comm.synchronize(s);
    checker.expect(counted == 1, "in-place count: " + std::to_string(counted));
    // Bad views are ConfigErrors that say what is wrong.
    try {
      comm.cast(same.view(), TensorView{same.data(), 500, DataType::kFloat16, ncclkit::MemoryKind::kDevice}, 1.0,
                nullptr, s);
      checker.expect(false, "a cast of 1000 into 500 elements was accepted");
    } catch (const ncclkit::ConfigError& e) {
      checker.expect(std::string(e.what()).find("as many outputs as inputs") != std::string::npos, e.what());
    }
    return checker.finish("cast kernels");
  });
}

TEST_CASE("copy_batch moves hundreds of odd copies and one large one in one kernel, byte for byte") {
  run_workers(1, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
    Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "copy-batch"});
    Checker checker(world.rank);
    const cudaStream_t s = comm.default_stream();
    const std::size_t total = 8 << 20;
    DeviceBuffer<std::byte> from(total, comm.device());
    DeviceBuffer<std::byte> to(total, comm.device());
    std::vector<std::byte> host(total);
    for (std::size_t i = 0; i < total; ++i) host[i] = static_cast<std::byte>((i * 131 + 7) & 0xff);
    comm.copy_from_host(from.data(), host.data(), total, s);
    std::vector<std::byte> zeros(total);
    comm.copy_from_host(to.data(), zeros.data(), total, s);
    // 400 copies of 0 to 1000 bytes at odd offsets, then one of 5 MiB at a 16-byte offset.
    std::vector<CopyItem> items;
    std::vector<std::byte> expected(total);
    std::size_t at = 3;
    for (int i = 0; i < 400; ++i) {
      const std::size_t bytes = static_cast<std::size_t>((i * 37) % 1001);
      items.push_back({to.data() + at + 1, from.data() + at, bytes});
      for (std::size_t b = 0; b < bytes; ++b) expected[at + 1 + b] = host[at + b];
      at += bytes + 5;
    }
    at = (at + 64) / 16 * 16;
    const std::size_t large = 5 << 20;
    items.push_back({to.data() + at, from.data() + at, large});
    for (std::size_t b = 0; b < large; ++b) expected[at + b] = host[at + b];
    const auto batch = comm.prepare_copies(items);
    checker.expect(batch.size() < items.size(), "empty copies are dropped");
    for (int round = 0; round < 2; ++round) comm.copy_batch(batch, s);  // a batch runs again
    std::vector<std::byte> got(total);
    comm.copy_to_host(got.data(), to.data(), total, s);
    comm.synchronize(s);
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < total; ++i) wrong += got[i] != expected[i] ? 1 : 0;
    checker.expect(wrong == 0, std::to_string(wrong) + " bytes differ");
    try {
      std::vector<CopyItem> bad{{nullptr, from.data(), 8}};
      (void)comm.prepare_copies(bad);
      checker.expect(false, "a null copy was accepted");
    } catch (const ncclkit::ConfigError& e) {
      checker.expect(std::string(e.what()).find("null pointer") != std::string::npos, e.what());
    }
    return checker.finish("copy_batch");
  });
}

}  // namespace
