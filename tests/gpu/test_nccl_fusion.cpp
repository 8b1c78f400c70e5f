// The fusion layer over the NCCL backend (ncclkit/fusion/gradient_sync.hpp with
// nccl::Communicator): every bucket reduced in place on the comm stream after an event of the
// compute stream, joined back by events; results equal a float64 average of every rank's
// gradients, each element within the rounding its path allows (support/reduction_bound.hpp),
// on ResNet-50's real shapes, with the ready order shuffled differently on every rank:
// float32, fp16 and bf16 compressed, loose tensors packed per bucket, a tensor never marked
// reduced as zeros; fp16 overflow counted on every rank alike, or rerun in float32; a timeline
// with CUDA timing events placed on the host's clock; the fused compressed reduction
// (Communicator::compressed_all_reduce) on its own, and with an optimizer update applied in its
// pass (alone and through the fused reducer); its window check failing on one rank.
#include <doctest/doctest.h>

#include <algorithm>  // std::shuffle
#include <chrono>     // std::chrono
#include <cmath>      // std::fabs, std::isfinite, std::pow
#include <cstdint>    // std::uint64_t
#include <cstdlib>    // std::getenv
#include <cstring>    // std::memcpy, std::memcmp
#include <map>        // std::map
#include <optional>   // std::optional
#include <random>     // std::mt19937_64, std::normal_distribution
#include <string>     // std::string
#include <vector>     // std::vector

#include "gpu/nccl_support.hpp"
#include "ncclkit/compression.hpp"
#include "ncclkit/core/detail/backend_memory.hpp"
#include "ncclkit/core/update.hpp"
#include "ncclkit/fusion/gradient_sync.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "support/model_shapes.hpp"
#include "support/stderr_capture.hpp"
#include "support/temp_dir.hpp"
#include "support/text.hpp"
#include "support/timeline_check.hpp"

namespace {

using namespace ncclkit_test;
using ncclkit::DataType;
using ncclkit::Store;
using ncclkit::WorldInfo;
using ncclkit::fusion::BucketOptions;
using ncclkit::fusion::BucketPlan;
using ncclkit::fusion::FusedBuffer;
using ncclkit::fusion::FusedLayout;
using ncclkit::fusion::GradientSync;
using ncclkit::fusion::MissingTensors;
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

struct Case {
  ncclkit::compression::Codec codec = ncclkit::compression::Codec::kNone;
  bool loose = false;      // every other tensor in an allocation of its own
  bool leave_one = false;  // never mark one tensor: kReduceAsZeros reduces it as zeros
  double bound = 1e-6;
  bool fused = true;  // CompressionOptions::fused_transfer
  BucketOptions caps{};
};

// Whether the sync's reducer is the fused kernel (compression/fused_reducer.hpp).
bool fused_runs(const GradientSync<Communicator>& sync) {
  return sync.reducer().name().find("fused") != std::string::npos;
}

// The fused compressed reduction must run on a GPU test run: its absence (an NCCL other than
// the one ncclkit was built against, GPUs that cannot reach each other's memory) is a failure,
// unless NCCLKIT_TEST_ALLOW_UNFUSED=1 says the run knows it cannot have it; then each test that
// could not run it says so with a SKIP line.
bool unfused_allowed() {
  const char* text = std::getenv("NCCLKIT_TEST_ALLOW_UNFUSED");
  return text != nullptr && std::string(text) == "1";
}

// Checks that the fused kernel runs here (`why` empty), or says why it does not: a failure,
// or with NCCLKIT_TEST_ALLOW_UNFUSED=1 a SKIP line (rank 0's). Returns whether it runs.
bool expect_fused(Checker& checker, int rank, const std::string& why, const char* what) {
  if (why.empty()) return true;
  if (unfused_allowed()) {
    if (rank == 0) {
      std::printf("SKIP: %s: the fused compressed reduction is unavailable (%s; NCCLKIT_TEST_ALLOW_UNFUSED=1)\n", what,
                  why.c_str());
      std::fflush(stdout);
    }
  } else {
    checker.expect(false, std::string(what) + ": the fused compressed reduction must run on a GPU test run, and: " +
                              why + " (NCCLKIT_TEST_ALLOW_UNFUSED=1 allows its absence)");
  }
  return false;
}

// The float64 average of float32 gradients, and what bounds each element's rounding: the average
// of the inputs' absolute values.
struct Average {
  std::vector<double> value, magnitude;
};

// The type GradientSync's data cross in with `codec`.
DataType wire_of(ncclkit::compression::Codec codec) {
  switch (codec) {
    case ncclkit::compression::Codec::kFloat16:
      return DataType::kFloat16;
    case ncclkit::compression::Codec::kBFloat16:
      return DataType::kBFloat16;
    default:
      return DataType::kFloat32;
  }
}

// Compares `out` with `average` element by element (data that crossed as `wire`: float32, or a
// 16-bit type), and by norm-relative error within `norm_bound` as a second guard.
void expect_average(Checker& checker, const std::vector<float>& out, const Average& average, int world, DataType wire,
                    double norm_bound, const std::string& what) {
  BoundCheck bounds;
  for (std::size_t j = 0; j < out.size(); ++j) {
    const double m = average.magnitude[j];
    const double bound = wire == DataType::kFloat32
                             ? reduction_bound<float>(ncclkit::ReduceOp::kAvg, world, m * world, average.value[j])
                             : compressed_average_bound(wire, world, m);
    bounds.add(j, out[j], average.value[j], bound);
  }
  checker.expect(bounds.ok(norm_bound), what + ": " + bounds.describe(norm_bound));
}

// Three steps of ResNet-50's gradients: write, mark in a shuffled order (its own on every
// rank), finish; compare with the float64 average.
int check_resnet(const WorldInfo& world, const std::shared_ptr<Store>& store, const Case& c) {
  Checker checker(world.rank);
  Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "fusion"});
  FusedBuffer<Communicator> grads(comm, ncclkit::testing::model_layout("resnet50"));
  const FusedLayout& layout = grads.layout();
  std::vector<ncclkit::detail::Allocation<Communicator>> own;
  std::vector<void*> loose;
  if (c.loose) {
    loose.assign(layout.size(), nullptr);
    for (std::uint32_t i = 1; i < layout.size(); i += 2) {
      own.emplace_back(comm, layout.bytes(Slot{i}));
      loose[i] = own.back().data();
    }
  }
  const Slot left{7};
  const BucketPlan plan = BucketPlan::compute(layout, c.caps);
  if (c.caps.bucket_bytes == (4u << 20)) {
    const auto b = plan.bucket_of(Slot{159});
    checker.expect(layout.name(Slot{159}) == "fc.weight" && b && plan[*b].slots.size() == 1,
                   "fc.weight has a bucket of its own");
  }
  GradientSync<Communicator> sync(grads, plan, loose,
                                  {.missing = c.leave_one ? MissingTensors::kReduceAsZeros : MissingTensors::kError,
                                   .reducer = ncclkit::compression::compressed({.codec = c.codec, .fused_transfer = c.fused})});
  if (c.codec != ncclkit::compression::Codec::kNone && c.fused) {
    const std::string why = comm.compressed_reduce_unavailable();
    checker.expect(fused_runs(sync) == why.empty(), "the reducer's name says whether the fused kernel runs");
    expect_fused(checker, world.rank, why, "GradientSync's fused transfer");
  } else {
    checker.expect(!fused_runs(sync), "no fused kernel without a codec or with fused_transfer off");
  }
  std::vector<std::uint32_t> order(layout.size());
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::mt19937 shuffle_random(77u + static_cast<unsigned>(world.rank));
  const std::size_t bytes = layout.total_bytes(DataType::kFloat32);
  std::vector<float> out(bytes / sizeof(float));
  const cudaStream_t compute = comm.default_stream();
  // Where a tensor's gradient lives: its loose allocation, or its view.
  const auto where = [&](std::uint32_t i) {
    return !loose.empty() && loose[i] != nullptr ? loose[i] : grads.view(Slot{i}).data;
  };
  for (int step = 0; step < 3; ++step) {
    // The backward pass's writes, on the stream the sync is told about.
    const std::vector<float> mine = gradients(layout, world.rank, step);
    for (std::uint32_t i = 0; i < layout.size(); ++i) {
      if (layout.bytes(Slot{i}) == 0) continue;
      comm.copy_from_host(where(i), mine.data() + layout.offset_elements(Slot{i}), layout.bytes(Slot{i}), compute);
    }
    std::shuffle(order.begin(), order.end(), shuffle_random);
    for (std::uint32_t i : order) {
      if (!(c.leave_one && Slot{i} == left)) sync.mark_ready(Slot{i}, compute);
    }
    sync.finish(compute);
    std::fill(out.begin(), out.end(), 0.0f);
    for (std::uint32_t i = 0; i < layout.size(); ++i) {
      if (layout.bytes(Slot{i}) == 0) continue;
      comm.copy_to_host(out.data() + layout.offset_elements(Slot{i}), where(i), layout.bytes(Slot{i}), compute);
    }
    comm.synchronize(compute);
    Average average{std::vector<double>(out.size(), 0.0), std::vector<double>(out.size(), 0.0)};
    for (int r = 0; r < world.world_size; ++r) {
      const std::vector<float> theirs = r == world.rank ? mine : gradients(layout, r, step);
      for (std::size_t j = 0; j < out.size(); ++j) {
        average.value[j] += static_cast<double>(theirs[j]) / world.world_size;
        average.magnitude[j] += std::fabs(static_cast<double>(theirs[j])) / world.world_size;
      }
    }
    if (c.leave_one) {
      // Reduced as zeros: exactly zero (a reference of 0 with a magnitude of 0 allows no error).
      const std::size_t first = layout.offset_elements(left);
      for (std::size_t j = 0; j < layout.count(left); ++j) average.value[first + j] = average.magnitude[first + j] = 0;
    }
    expect_average(checker, out, average, world.world_size, wire_of(c.codec), c.bound, "step " + std::to_string(step));
    checker.expect(sync.nonfinite() == 0, "no non-finite value in N(0, 1e-3) gradients");
  }
  checker.expect(c.leave_one || sync.stats().launched_before_finish == sync.stats().buckets,
                 "every bucket launched as its last tensor became ready");
  return checker.finish("GradientSync over NCCL");
}

TEST_CASE("bucketed gradients over NCCL equal the float64 average, in every rank's own ready order") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(
        n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) { return check_resnet(world, store, {}); });
  }
}

TEST_CASE(
    "fp16 and bf16 compressed buckets over NCCL equal the float64 average within 16-bit rounding, element by element") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      const int fp16 = check_resnet(world, store, {.codec = ncclkit::compression::Codec::kFloat16, .bound = 1e-3});
      const int bf16 = check_resnet(world, store, {.codec = ncclkit::compression::Codec::kBFloat16, .bound = 5e-3});
      // The separate path too: cast, 16-bit all-reduce, cast.
      const int separate =
          check_resnet(world, store, {.codec = ncclkit::compression::Codec::kFloat16, .bound = 1e-3, .fused = false});
      return fp16 != 0 ? fp16 : (bf16 != 0 ? bf16 : separate);
    });
  }
}

TEST_CASE("loose tensors over NCCL, packed per bucket or alone in place; a tensor never marked is reduced as zeros") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      const int loose = check_resnet(world, store, {.loose = true});
      const int zeros = check_resnet(world, store, {.loose = true, .leave_one = true});
      const int both =
          check_resnet(world, store, {.codec = ncclkit::compression::Codec::kFloat16, .loose = true, .bound = 1e-3});
      // 4 MiB buckets: fc.weight (slot 159, loose, 7.8 MiB) has a bucket of its own and is
      // reduced where it lives, with no pack or unpack.
      const int in_place = check_resnet(world, store, {.loose = true, .caps = {.bucket_bytes = 4 << 20}});
      return loose != 0 ? loose : (zeros != 0 ? zeros : (both != 0 ? both : in_place));
    });
  }
}

TEST_CASE("fp16 overflow over NCCL is counted, the same on every rank; rerun_nonfinite gives the float32 result") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "overflow"});
      FusedLayout layout;
      layout.add("a", {100000}, DataType::kFloat32);
      layout.add("b", {1000}, DataType::kFloat32);
      layout.finalize();
      FusedBuffer<Communicator> grads(comm, layout);
      for (const bool rerun : {false, true}) {
        GradientSync<Communicator> sync(grads, BucketPlan::compute(grads.layout()),
                                        {.op = ncclkit::ReduceOp::kSum,
                                         .reducer = ncclkit::compression::compressed(
                                             {.codec = ncclkit::compression::Codec::kFloat16,
                                              .prescale = 1.0,
                                              .rerun_nonfinite = rerun})});
        std::vector<float> a(100000, 0.5f), b(1000, 0.25f);
        for (int i = 0; i < 3; ++i) b[static_cast<std::size_t>(i) * 100] = 60000.0f;  // x world > 65504
        const cudaStream_t s = comm.default_stream();
        comm.copy_from_host(grads.view("a").data, a.data(), a.size() * 4, s);
        comm.copy_from_host(grads.view("b").data, b.data(), b.size() * 4, s);
        sync.mark_ready("b", s);
        sync.mark_ready("a", s);
        sync.finish(s);
        const std::uint64_t counted = sync.nonfinite();
        comm.copy_to_host(b.data(), grads.view("b").data, b.size() * 4, s);
        comm.synchronize(s);
        // With rerun_nonfinite the rerun chunk counts its float32 result, which is finite.
        const std::uint64_t expected = world.world_size > 1 && !rerun ? 3 : 0;
        checker.expect(counted == expected, std::string(rerun ? "rerun: " : "") + std::to_string(counted) +
                                                " non-finite counted, expected " + std::to_string(expected));
        if (rerun || world.world_size == 1) {
          checker.expect(b[0] == 60000.0f * static_cast<float>(world.world_size) &&
                             b[1] == 0.25f * static_cast<float>(world.world_size),
                         "the float32 sum after a rerun: " + std::to_string(b[0]) + ", " + std::to_string(b[1]));
        } else {
          checker.expect(!std::isfinite(b[0]), "an fp16 sum past 65504 is not finite: " + std::to_string(b[0]));
        }
      }
      return checker.finish("overflow over NCCL");
    });
  }
}

// compressed_all_reduce on its own: odd counts (not a multiple of 8, fewer than the ranks, one),
// every rank ends with the same bits within the codec's bound of the float64 average, overflow
// is counted alike on every rank, and misuse is a ConfigError naming what is wrong.
TEST_CASE("compressed_all_reduce: the same bits on every rank, within bound, overflow counted; misuse named") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "fused"});
      const std::string why = comm.compressed_reduce_unavailable();
      if (!expect_fused(checker, world.rank, why, "compressed_all_reduce")) {
        checker.expect(!comm.prepare_compressed_reduce(1000, DataType::kFloat16).has_value(),
                       "no workspace where it cannot run");
        return checker.finish("compressed_all_reduce (unavailable)");
      }
      constexpr std::size_t kCapacity = 1 << 20;
      for (const DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
        auto workspace = comm.prepare_compressed_reduce(kCapacity, wire);
        if (!checker.expect(workspace.has_value(), "a workspace where it can run")) break;
        ncclkit::detail::Allocation<Communicator> data(comm, kCapacity * sizeof(float));
        ncclkit::detail::Allocation<Communicator> count(comm, sizeof(std::uint64_t));
        ncclkit::detail::Allocation<Communicator> hashes(comm, sizeof(std::uint64_t) * world.world_size);
        const cudaStream_t s = comm.default_stream();
        const double bound = wire == DataType::kFloat16 ? 1e-3 : 5e-3;
        const std::size_t odd = static_cast<std::size_t>(world.world_size) - 1;
        for (const std::size_t n_values :
             {kCapacity, std::size_t{1000003} % kCapacity, std::size_t{13}, odd, std::size_t{1}}) {
          if (n_values == 0) continue;
          std::vector<std::vector<float>> all(static_cast<std::size_t>(world.world_size));
          for (int r = 0; r < world.world_size; ++r) {
            std::mt19937_64 random(991u * static_cast<std::uint64_t>(r + 1) + n_values);
            std::normal_distribution<float> normal(0.0f, 1e-3f);
            all[static_cast<std::size_t>(r)].resize(n_values);
            for (float& v : all[static_cast<std::size_t>(r)]) v = normal(random);
          }
          const std::vector<float>& mine = all[static_cast<std::size_t>(world.rank)];
          comm.copy_from_host(data.data(), mine.data(), n_values * sizeof(float), s);
          const std::uint64_t zero = 0;
          comm.copy_from_host(count.data(), &zero, sizeof zero, s);
          const ncclkit::TensorView view{data.data(), n_values, DataType::kFloat32, ncclkit::MemoryKind::kDevice};
          comm.compressed_all_reduce(*workspace, view, 1.0 / world.world_size, 1.0,
                                     reinterpret_cast<std::uint64_t*>(count.data()), s);
          std::vector<float> out(n_values);
          std::uint64_t bad = 1;
          comm.copy_to_host(out.data(), data.data(), n_values * sizeof(float), s);
          comm.copy_to_host(&bad, count.data(), sizeof bad, s);
          comm.synchronize(s);
          Average average{std::vector<double>(n_values, 0.0), std::vector<double>(n_values, 0.0)};
          std::uint64_t hash = 1469598103934665603ull;
          for (std::size_t j = 0; j < n_values; ++j) {
            for (const auto& theirs : all) {
              average.value[j] += static_cast<double>(theirs[j]) / world.world_size;
              average.magnitude[j] += std::fabs(static_cast<double>(theirs[j])) / world.world_size;
            }
            std::uint32_t bits;
            std::memcpy(&bits, &out[j], sizeof bits);
            hash = (hash ^ bits) * 1099511628211ull;
          }
          const std::string what = std::string(ncclkit::name_of(wire)) + ", " + std::to_string(n_values) + " values: ";
          expect_average(checker, out, average, world.world_size, wire, bound, what);
          checker.expect(bad == 0, what + std::to_string(bad) + " non-finite counted in N(0, 1e-3) values");
          // The same bits on every rank: all-gather the hashes.
          comm.copy_from_host(data.data(), &hash, sizeof hash, s);
          comm.all_gather(ncclkit::TensorView{data.data(), 1, DataType::kUint64, ncclkit::MemoryKind::kDevice},
                          ncclkit::TensorView{hashes.data(), static_cast<std::size_t>(world.world_size),
                                              DataType::kUint64, ncclkit::MemoryKind::kDevice},
                          s);
          std::vector<std::uint64_t> gathered(static_cast<std::size_t>(world.world_size));
          comm.copy_to_host(gathered.data(), hashes.data(), gathered.size() * sizeof(std::uint64_t), s);
          comm.synchronize(s);
          for (std::uint64_t h : gathered) checker.expect(h == gathered[0], what + "ranks hold different bits");
        }
        // Back to back on one stream, no host wait between: the window and the barrier counts
        // carry from one call to the next, whatever the counts.
        {
          const std::size_t counts[] = {kCapacity, 13, kCapacity - 7, 1};
          std::vector<ncclkit::detail::Allocation<Communicator>> buffers;
          std::vector<Average> want(4);
          for (std::size_t k = 0; k < 4; ++k) {
            buffers.emplace_back(comm, counts[k] * sizeof(float));
            std::vector<float> values(counts[k]);
            want[k].value.assign(counts[k], 0.0);
            want[k].magnitude.assign(counts[k], 0.0);
            for (int r = 0; r < world.world_size; ++r) {
              for (std::size_t j = 0; j < counts[k]; ++j) {
                const float v = static_cast<float>(((j * 7 + k * 3 + static_cast<std::size_t>(r) * 5) % 29)) * 1e-4f;
                if (r == world.rank) values[j] = v;
                want[k].value[j] += static_cast<double>(v) / world.world_size;
                want[k].magnitude[j] += static_cast<double>(v) / world.world_size;  // v >= 0
              }
            }
            comm.copy_from_host(buffers.back().data(), values.data(), counts[k] * sizeof(float), s);
          }
          for (std::size_t k = 0; k < 4; ++k) {
            comm.compressed_all_reduce(
                *workspace,
                ncclkit::TensorView{buffers[k].data(), counts[k], DataType::kFloat32, ncclkit::MemoryKind::kDevice},
                1.0 / world.world_size, 1.0, nullptr, s);
          }
          for (std::size_t k = 0; k < 4; ++k) {
            std::vector<float> out(counts[k]);
            comm.copy_to_host(out.data(), buffers[k].data(), counts[k] * sizeof(float), s);
            comm.synchronize(s);
            expect_average(checker, out, want[k], world.world_size, wire, bound,
                           "back to back, call " + std::to_string(k));
          }
        }
        // Overflow: 60000 on every rank sums past fp16's 65504 with encode 1 (two ranks and up);
        // every rank counts all 5 such values, its own shard's and the others'.
        if (wire == DataType::kFloat16) {
          std::vector<float> values(4096, 0.25f);
          for (int i = 0; i < 5; ++i) values[static_cast<std::size_t>(i) * 800] = 60000.0f;
          comm.copy_from_host(data.data(), values.data(), values.size() * sizeof(float), s);
          const std::uint64_t zero = 0;
          comm.copy_from_host(count.data(), &zero, sizeof zero, s);
          comm.compressed_all_reduce(
              *workspace,
              ncclkit::TensorView{data.data(), values.size(), DataType::kFloat32, ncclkit::MemoryKind::kDevice}, 1.0,
              1.0, reinterpret_cast<std::uint64_t*>(count.data()), s);
          std::uint64_t bad = 0;
          comm.copy_to_host(&bad, count.data(), sizeof bad, s);
          comm.synchronize(s);
          const std::uint64_t expected = world.world_size > 1 ? 5 : 0;
          checker.expect(bad == expected,
                         "overflow: " + std::to_string(bad) + " counted, expected " + std::to_string(expected));
        }
        // Misuse: too many values, another element type, a misaligned pointer.
        const auto rejects = [&](ncclkit::TensorView view, const char* needle) {
          try {
            comm.compressed_all_reduce(*workspace, view, 1.0, 1.0, nullptr, s);
            checker.expect(false, std::string("no ConfigError for ") + needle);
          } catch (const ncclkit::ConfigError& e) {
            checker.expect(std::string(e.what()).find(needle) != std::string::npos,
                           std::string("the error names ") + needle + ": " + e.what());
          }
        };
        rejects({data.data(), kCapacity + 1, DataType::kFloat32, ncclkit::MemoryKind::kDevice}, "prepared for");
        rejects({data.data(), 100, DataType::kFloat64, ncclkit::MemoryKind::kDevice}, "reduces float32");
        rejects({reinterpret_cast<float*>(data.data()) + 1, 100, DataType::kFloat32, ncclkit::MemoryKind::kDevice},
                "16-byte aligned");
      }
      try {
        (void)comm.prepare_compressed_reduce(10, DataType::kFloat32);
        checker.expect(false, "no ConfigError for a float32 wire");
      } catch (const ncclkit::ConfigError& e) {
        checker.expect(std::string(e.what()).find("not float16 or bfloat16") != std::string::npos, e.what());
      }
      return checker.finish("compressed_all_reduce");
    });
  }
}

// The bits of `count` floats at `device` (a synchronising copy on `s`).
std::vector<std::uint32_t> device_bits(Communicator& comm, const void* device, std::size_t count, cudaStream_t s) {
  std::vector<std::uint32_t> bits(count);
  comm.copy_to_host(bits.data(), device, count * sizeof(float), s);
  comm.synchronize(s);
  return bits;
}

// Rank r's float values of `count`, N(0, sigma), from `seed` (absolute values where `positive`).
std::vector<float> normal_values(std::uint64_t seed, int rank, std::size_t count, float sigma, bool positive = false) {
  std::mt19937_64 random(seed * 7919u + static_cast<std::uint64_t>(rank));
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> v(count);
  for (float& x : v) x = positive ? std::fabs(normal(random)) : normal(random);
  return v;
}

// AdamW at step 3: lr 1e-3, weight decay 1e-2, PyTorch's betas, the host's double factors.
ncclkit::UpdateRule adamw_rule() {
  const double beta1 = 0.9, beta2 = 0.999;
  return {.kind = ncclkit::UpdateRule::Kind::kAdamW,
          .lr = 1e-3f,
          .weight_decay = 1e-2f,
          .beta1 = static_cast<float>(beta1),
          .beta2 = static_cast<float>(beta2),
          .one_minus_beta1 = static_cast<float>(1.0 - beta1),
          .one_minus_beta2 = static_cast<float>(1.0 - beta2),
          .eps = 1e-8f,
          .bias_correction1 = static_cast<float>(1.0 - std::pow(beta1, 3)),
          .bias_correction2 = static_cast<float>(1.0 - std::pow(beta2, 3))};
}

// compressed_all_reduce with an optimizer update: the parameters and state get exactly the bits
// of compressed_all_reduce without one followed by Communicator::update on its result (the same
// update_element), for plain SGD, SGD with momentum, weight decay and Nesterov (its first step
// and a later one) and AdamW, at a count whose last vector of 8 is partial (the scalar tail); the
// gradients keep this rank's own values; the state a rule does not keep is left alone; misuse
// (no values, missing state, a misaligned pointer, values over the data) is a ConfigError.
TEST_CASE("compressed_all_reduce with an update: the bits of reduce then update, gradients kept; misuse named") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "fused-update"});
      const std::string why = comm.compressed_reduce_unavailable();
      if (!expect_fused(checker, world.rank, why, "compressed_all_reduce with an update")) {
        return checker.finish("compressed_all_reduce with an update (unavailable)");
      }
      // Not a multiple of 8 x world for any world size: every rank's shard ends in a partial vector
      // or the data ends inside one.
      constexpr std::size_t kCount = 100003;
      for (const DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
        auto workspace = comm.prepare_compressed_reduce(kCount, wire);
        if (!checker.expect(workspace.has_value(), "a workspace where it can run")) break;
        using Allocation = ncclkit::detail::Allocation<Communicator>;
        const std::size_t bytes = kCount * sizeof(float);
        Allocation grad(comm, bytes), reduced(comm, bytes), param(comm, bytes), param_ref(comm, bytes),
            state0(comm, bytes), state0_ref(comm, bytes), state1(comm, bytes), state1_ref(comm, bytes),
            nonfinite(comm, sizeof(std::uint64_t));
        const auto view = [](Allocation& a) {
          return ncclkit::TensorView{a.data(), kCount, DataType::kFloat32, ncclkit::MemoryKind::kDevice};
        };
        const cudaStream_t s = comm.default_stream();
        const std::vector<float> mine = normal_values(1, world.rank, kCount, 1e-3f);
        // Parameters and state are replicas: the same on every rank.
        const std::vector<float> params = normal_values(2, 0, kCount, 0.1f),
                                 first_state = normal_values(3, 0, kCount, 1e-3f),
                                 second_state = normal_values(4, 0, kCount, 1e-6f, /*positive=*/true);
        struct RuleCase {
          const char* name;
          ncclkit::UpdateRule rule;
        };
        const RuleCase rules[] = {
            {"SGD", {.lr = 0.1f}},
            {"SGD, momentum, weight decay, Nesterov, first step",
             {.lr = 0.05f, .weight_decay = 1e-2f, .momentum = 0.9f, .nesterov = true, .first_step = true}},
            {"SGD, momentum, weight decay, Nesterov, later step",
             {.lr = 0.05f, .weight_decay = 1e-2f, .momentum = 0.9f, .dampening = 0.1f, .nesterov = true}},
            {"AdamW", adamw_rule()},
        };
        for (const RuleCase& c : rules) {
          const std::string what = std::string(ncclkit::name_of(wire)) + ", " + c.name + ": ";
          comm.copy_from_host(grad.data(), mine.data(), bytes, s);
          comm.copy_from_host(reduced.data(), mine.data(), bytes, s);
          for (Allocation* a : {&param, &param_ref}) comm.copy_from_host(a->data(), params.data(), bytes, s);
          for (Allocation* a : {&state0, &state0_ref}) comm.copy_from_host(a->data(), first_state.data(), bytes, s);
          for (Allocation* a : {&state1, &state1_ref}) comm.copy_from_host(a->data(), second_state.data(), bytes, s);
          comm.fill_zero(ncclkit::TensorView{nonfinite.data(), 1, DataType::kUint64, ncclkit::MemoryKind::kDevice}, s);
          // The reference: reduce, then the backend's update kernel.
          comm.compressed_all_reduce(*workspace, view(reduced), 1.0 / world.world_size, 1.0, nullptr, s);
          comm.update(c.rule, view(param_ref), view(reduced), view(state0_ref), view(state1_ref), {}, s);
          // Fused: the state pointers are given for every rule; those it does not keep stay as they are.
          const ncclkit::FusedUpdate update{c.rule, reinterpret_cast<float*>(param.data()),
                                            reinterpret_cast<float*>(state0.data()),
                                            reinterpret_cast<float*>(state1.data())};
          comm.compressed_all_reduce(*workspace, view(grad), 1.0 / world.world_size, 1.0, update,
                                     reinterpret_cast<std::uint64_t*>(nonfinite.data()), s);
          checker.expect(device_bits(comm, param.data(), kCount, s) == device_bits(comm, param_ref.data(), kCount, s),
                         what + "the parameters differ from reduce, then update");
          checker.expect(device_bits(comm, state0.data(), kCount, s) == device_bits(comm, state0_ref.data(), kCount, s),
                         what + "the first state differs from reduce, then update");
          checker.expect(device_bits(comm, state1.data(), kCount, s) == device_bits(comm, state1_ref.data(), kCount, s),
                         what + "the second state differs from reduce, then update");
          std::vector<float> kept(kCount);
          comm.copy_to_host(kept.data(), grad.data(), bytes, s);
          std::uint64_t bad = 1;
          comm.copy_to_host(&bad, nonfinite.data(), sizeof bad, s);
          comm.synchronize(s);
          checker.expect(std::memcmp(kept.data(), mine.data(), bytes) == 0,
                         what + "the gradients changed; with an update they keep this rank's own values");
          checker.expect(bad == 0, what + std::to_string(bad) + " non-finite counted in N(0, 1e-3) values");
          // The update did something: not the parameters it started from.
          const std::vector<std::uint32_t> after = device_bits(comm, param.data(), kCount, s);
          checker.expect(std::memcmp(after.data(), params.data(), bytes) != 0, what + "the parameters did not move");
        }
        // Misuse, named on every rank (no collective is issued).
        const auto rejects = [&](const ncclkit::FusedUpdate& update, const char* needle) {
          try {
            comm.compressed_all_reduce(*workspace, view(grad), 1.0, 1.0, update, nullptr, s);
            checker.expect(false, std::string("no ConfigError for ") + needle);
          } catch (const ncclkit::ConfigError& e) {
            checker.expect(std::string(e.what()).find(needle) != std::string::npos,
                           std::string("the error names ") + needle + ": " + e.what());
          }
        };
        auto* p = reinterpret_cast<float*>(param.data());
        auto* m = reinterpret_cast<float*>(state0.data());
        auto* v = reinterpret_cast<float*>(state1.data());
        rejects({.rule = {.lr = 0.1f}}, "update.values is null");
        rejects({adamw_rule(), p, m, nullptr}, "update.state1 is null");
        rejects({{.lr = 0.1f, .momentum = 0.9f}, p, nullptr, nullptr}, "update.state0 is null");
        rejects({{.lr = 0.1f}, p + 1, nullptr, nullptr}, "update.values is not 16-byte aligned");
        rejects({adamw_rule(), p, m, v + 2}, "update.state1 is not 16-byte aligned");
        rejects({{.lr = 0.1f}, reinterpret_cast<float*>(grad.data()) + 4, nullptr, nullptr},
                "update.values overlaps data");
        // Still usable after the refusals.
        comm.copy_from_host(grad.data(), mine.data(), bytes, s);
        comm.compressed_all_reduce(*workspace, view(grad), 1.0 / world.world_size, 1.0, {{.lr = 0.1f}, p}, nullptr, s);
        comm.synchronize(s);
      }
      return checker.finish("compressed_all_reduce with an update");
    });
  }
}

// The window check's stand-in for detail::window_probe_launcher: it reports `window_decoy` as
// both pointers the kernel computes for byte 0 of this rank's window, as the kernel would find
// them with an NCCL that lays out its window structure otherwise than the headers it was
// compiled against.
void* window_decoy = nullptr;
int window_decoy_calls = 0;
cudaError_t decoy_window_probe(void*, int, void** out, cudaStream_t stream) {
  static void* pointers[2];
  pointers[0] = pointers[1] = window_decoy;
  ++window_decoy_calls;
  return cudaMemcpyAsync(out, pointers, sizeof pointers, cudaMemcpyDefault, stream);
}

// prepare_compressed_reduce's window check (CompressedReduce::probe_layout), made to fail on the
// last rank by a decoy: once with pointers to other memory of the GPU, once with a pointer to
// memory of no GPU. Every rank then gets no workspace; the failing rank says why and warns once,
// the others name it. With the real check back, every rank gets a workspace that reduces right.
// One rank is not checked (alone, the kernel reaches no window): the decoy is never asked.
TEST_CASE(
    "the fused kernel's window check: a rank it fails on leaves every rank without a workspace, said and warned") {
  ncclkit_test::TempDir dir("window-check");
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [&](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "window"});
      if (!expect_fused(checker, world.rank, comm.compressed_reduce_unavailable(), "the window check")) {
        return checker.finish("the window check (unavailable)");
      }
      auto& probe = ncclkit::nccl::detail::window_probe_launcher();
      const auto real = probe;
      const int last = world.world_size - 1;
      const cudaStream_t s = comm.default_stream();
      ncclkit::detail::Allocation<Communicator> other(comm, 4096);  // this GPU's memory, not the window's
      const std::vector<char> zeros(4096, 0);
      comm.copy_from_host(other.data(), zeros.data(), zeros.size(), s);
      comm.synchronize(s);
      const struct {
        void* pointer;
        const char* says;
      } decoys[] = {{other.data(), "its local pointer reads other memory than the window's"},
                    {const_cast<char*>(zeros.data()), "its local pointer is not memory of this GPU"}};
      bool first = true;
      for (const auto& decoy : decoys) {
        window_decoy = decoy.pointer;
        window_decoy_calls = 0;
        if (world.rank == last) probe = &decoy_window_probe;
        std::optional<Communicator::CompressedReduce> workspace;
        const std::string log = ncclkit_test::stderr_of(dir.path + "/rank" + std::to_string(world.rank) + ".log", [&] {
          workspace = comm.prepare_compressed_reduce(4096, DataType::kFloat16);
        });
        probe = real;
        const std::string why = comm.compressed_reduce_unavailable();
        const std::string what = std::string(decoy.says) + ": ";
        if (world.world_size == 1) {
          checker.expect(window_decoy_calls == 0, what + "one rank's window was checked");
          checker.expect(workspace.has_value() && why.empty(), what + "one rank gets a workspace: " + why);
          break;
        }
        checker.expect(!workspace.has_value(),
                       what + "a workspace although rank " + std::to_string(last) + " failed the check");
        const bool warned = ncclkit_test::contains(log, "the fused compressed all-reduce cannot run");
        if (world.rank == last) {
          checker.expect(window_decoy_calls == 1,
                         what + "the decoy ran " + std::to_string(window_decoy_calls) + " times");
          checker.expect(ncclkit_test::contains(why, decoy.says) &&
                             ncclkit_test::contains(why, "build ncclkit against the headers of the NCCL it runs with"),
                         what + "the failing rank's reason: " + why);
          // Warned once per communicator, with the reason.
          checker.expect(warned == first && (!first || ncclkit_test::contains(log, decoy.says)),
                         what + (first ? "no warning with the reason: " : "warned twice: ") + log);
        } else {
          checker.expect(ncclkit_test::contains(why, "on rank " + std::to_string(last) + ", the fused kernel's view"),
                         what + "a peer names the failing rank: " + why);
          checker.expect(!warned, what + "a rank that checked out warned: " + log);
        }
        first = false;
      }
      // The real check again: a workspace on every rank, and it reduces (exact in fp16: each
      // rank's (rank + 1) / 4 averaged gives (world + 1) / 8).
      auto workspace = comm.prepare_compressed_reduce(4096, DataType::kFloat16);
      checker.expect(workspace.has_value() && comm.compressed_reduce_unavailable().empty(),
                     "no workspace after the real check: " + comm.compressed_reduce_unavailable());
      if (workspace) {
        const std::vector<float> mine(4096, 0.25f * static_cast<float>(world.rank + 1));
        ncclkit::detail::Allocation<Communicator> data(comm, mine.size() * sizeof(float));
        comm.copy_from_host(data.data(), mine.data(), mine.size() * sizeof(float), s);
        comm.compressed_all_reduce(
            *workspace, ncclkit::TensorView{data.data(), mine.size(), DataType::kFloat32, ncclkit::MemoryKind::kDevice},
            1.0 / world.world_size, 1.0, nullptr, s);
        std::vector<float> out(mine.size());
        comm.copy_to_host(out.data(), data.data(), out.size() * sizeof(float), s);
        comm.synchronize(s);
        const float want = 0.125f * static_cast<float>(world.world_size + 1);
        std::size_t wrong = 0;
        for (float v : out) wrong += v != want ? 1 : 0;
        checker.expect(wrong == 0, std::to_string(wrong) + " values differ from " + std::to_string(want));
      }
      return checker.finish("the window check");
    });
  }
}

// The fused reducer through a GradientSync over NCCL, driven through the reducer seam: a float32
// bucket can take an update and a float16 one cannot; set_update applies to its bucket, piece by
// piece (1 KiB chunks, the last one clipped at the tensor's end), with the bits of the same
// reduction followed by Communicator::update; the gradients keep this rank's own values.
TEST_CASE("the fused reducer over NCCL applies a bucket's update where it lands: can_update, set_update") {
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "fused-reducer-update"});
      FusedLayout layout;
      layout.add("w", {1001}, DataType::kFloat32);
      layout.add("h", {50}, DataType::kFloat16);
      layout.finalize();
      FusedBuffer<Communicator> grads(comm, layout);
      GradientSync<Communicator> sync(grads, BucketPlan::compute(grads.layout()),
                                      {.reducer = ncclkit::compression::compressed(
                                           {.codec = ncclkit::compression::Codec::kFloat16, .chunk_bytes = 1024})});
      if (!expect_fused(checker, world.rank, comm.compressed_reduce_unavailable(), "the fused reducer's update")) {
        return checker.finish("the fused reducer's update (unavailable)");
      }
      // GradientSync hands its buckets' updates to the reducer; this test drives the seam itself.
      auto& reducer = const_cast<ncclkit::fusion::BucketReducer<Communicator>&>(sync.reducer());
      const Slot w = layout.slot("w"), h = layout.slot("h");
      const std::size_t bucket_w = *sync.plan().bucket_of(w), bucket_h = *sync.plan().bucket_of(h);
      checker.expect(reducer.can_update(bucket_w), "a float32 bucket can take an update");
      checker.expect(!reducer.can_update(bucket_h), "a float16 bucket cannot");
      const cudaStream_t s = comm.default_stream();
      const std::vector<float> mine = normal_values(5, world.rank, 1001, 1e-3f);
      const auto step = [&] {
        comm.copy_from_host(grads.view(w).data, mine.data(), 1001 * sizeof(float), s);
        sync.mark_ready(w, s);
        sync.mark_ready(h, s);
        sync.finish(s);
      };
      using Allocation = ncclkit::detail::Allocation<Communicator>;
      const std::size_t bytes = 1001 * sizeof(float);
      Allocation param(comm, bytes), param_ref(comm, bytes), momentum(comm, bytes), momentum_ref(comm, bytes);
      const std::vector<float> params = normal_values(6, 0, 1001, 0.1f), moments = normal_values(7, 0, 1001, 1e-3f);
      for (Allocation* a : {&param, &param_ref}) comm.copy_from_host(a->data(), params.data(), bytes, s);
      for (Allocation* a : {&momentum, &momentum_ref}) comm.copy_from_host(a->data(), moments.data(), bytes, s);
      const ncclkit::UpdateRule rule{.lr = 0.05f, .weight_decay = 1e-2f, .momentum = 0.9f, .nesterov = true};
      const auto view = [](void* p) {
        return ncclkit::TensorView{p, 1001, DataType::kFloat32, ncclkit::MemoryKind::kDevice};
      };
      // The reference: the step without an update, then the backend's update on its result.
      step();
      comm.update(rule, view(param_ref.data()), grads.view(w), view(momentum_ref.data()), ncclkit::TensorView{},
                  ncclkit::TensorView{}, s);
      // With the update: the same gradients, the result into the parameters and momentum.
      reducer.set_update(bucket_w,
                         {rule, reinterpret_cast<float*>(param.data()), reinterpret_cast<float*>(momentum.data())});
      step();
      checker.expect(device_bits(comm, param.data(), 1001, s) == device_bits(comm, param_ref.data(), 1001, s),
                     "the parameters differ from reduce, then update");
      checker.expect(device_bits(comm, momentum.data(), 1001, s) == device_bits(comm, momentum_ref.data(), 1001, s),
                     "the momentum differs from reduce, then update");
      std::vector<float> kept(1001);
      comm.copy_to_host(kept.data(), grads.view(w).data, bytes, s);
      comm.synchronize(s);
      checker.expect(std::memcmp(kept.data(), mine.data(), bytes) == 0, "the gradients keep this rank's own values");
      // Forgotten at the step's end: the next step reduces the gradients, the parameters stay.
      step();
      checker.expect(device_bits(comm, param.data(), 1001, s) == device_bits(comm, param_ref.data(), 1001, s),
                     "a step without an update leaves the parameters");
      comm.copy_to_host(kept.data(), grads.view(w).data, bytes, s);
      comm.synchronize(s);
      checker.expect(std::memcmp(kept.data(), mine.data(), bytes) != 0,
                     "a step without an update reduces the gradients");
      return checker.finish("the fused reducer's update");
    });
  }
}

TEST_CASE(
    "a timeline over NCCL: every bucket's all_reduce timed on the comm stream, after its launch, codec phases in "
    "order") {
  ncclkit_test::TempDir dir("nccl-timeline");
  const std::string prefix = dir.path + "/nccl";
  for (int n : world_sizes()) {
    CAPTURE(n);
    run_workers(n, [&](const WorldInfo& world, const std::shared_ptr<Store>& store) {
      Checker checker(world.rank);
      Communicator comm(store, world, Options{.timeout = std::chrono::seconds(60), .name = "timeline"});
      FusedBuffer<Communicator> grads(comm, ncclkit::testing::model_layout("resnet50"));
      const FusedLayout& layout = grads.layout();
      // Both ways of compressing: the fused kernel (where it runs) shows as the reduction alone.
      for (const bool fused : {true, false}) {
        const std::string run = prefix + ".world" + std::to_string(world.world_size) + (fused ? ".fused" : "");
        std::size_t buckets = 0, chunks = 0;
        bool fused_ran = false;
        {
          GradientSync<Communicator> sync(
              grads, BucketPlan::compute(layout, {.bucket_bytes = 16 << 20}),
              {.reducer = ncclkit::compression::compressed(
                   {.codec = ncclkit::compression::Codec::kFloat16, .fused_transfer = fused}),
               .timeline = ncclkit::fusion::TimelineOptions{.prefix = run, .max_steps = 3}});
          fused_ran = fused_runs(sync);
          checker.expect(sync.timeline() != nullptr, "the timeline is on");
          buckets = sync.plan().size();
          chunks = sync.stats().compressed_chunks;
          const cudaStream_t compute = comm.default_stream();
          for (int step = 0; step < 5; ++step) {
            const std::vector<float> mine = gradients(layout, world.rank, step);
            comm.copy_from_host(grads.data(DataType::kFloat32), mine.data(), mine.size() * sizeof(float), compute);
            for (std::uint32_t i = static_cast<std::uint32_t>(layout.size()); i-- > 0;)
              sync.mark_ready(Slot{i}, compute);
            sync.finish(compute);
          }
          comm.synchronize(compute);
        }
        const std::string file = run + ".rank" + std::to_string(world.rank) + ".json";
        checker.expect(chunks == buckets, "one chunk a bucket");
        const std::string problems =
            trace_problems(file, {.rank = world.rank, .buckets = buckets, .steps = 3, .codec = !fused_ran});
        checker.expect(problems.empty(), file + ": " + problems);
        // The anchor puts the GPU's times on the host's clock: no collective ends before the host
        // issued it (50 us of slack for the anchor's own error).
        std::map<std::pair<long, std::string>, double> launched;
        for (const TraceEvent& e : read_trace(file, world.rank)) {
          if (e.name.rfind("launch ", 0) == 0) launched[{e.step, e.name.substr(7)}] = e.ts;
        }
        for (const TraceEvent& e : read_trace(file, world.rank)) {
          if (e.name.rfind("done ", 0) != 0) continue;
          const double issued = launched[{e.step, e.name.substr(5)}];
          checker.expect(e.ts + 50.0 >= issued, "step " + std::to_string(e.step) + " " + e.name + " at " +
                                                    std::to_string(e.ts) + " us, before its launch at " +
                                                    std::to_string(issued));
          checker.expect(e.ts - issued < 10e6, e.name + " more than 10 s after its launch: the anchor is off");
        }
      }
      return checker.finish("timeline over NCCL");
    });
  }
}

}  // namespace
