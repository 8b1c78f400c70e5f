// bench_nccl_enqueue: host time to enqueue one collective through ncclkit against ncclAllReduce
// called directly, on 2 processes (one GPU each; 1 when only one GPU is visible).
//
// What it measures: the host time of issuing a batch of K small all_reduces (8 bytes, so the
// GPU is never the bottleneck) back to back on one stream, divided by K, without waiting for
// them; the stream is synchronised between batches (not timed). Median over R batches,
// implementations interleaved batch by batch so drift hits all alike. Both ranks issue the
// same calls, so the collectives always match.
//
// Variants: raw (ncclAllReduce on a plain blocking communicator); raw followed by a
// cudaEventRecord (what completion tracking adds); ncclAllReduce called directly on the NCCL
// communicator ncclkit made (its config and split origin); ncclkit with pointer checks (the default)
// in place, out of place, on a stream of the caller's, cycling through 16 buffers (which the
// checks remember) and through 128 (twice as many as they remember, so every call queries
// CUDA); ncclkit without checks
// (Options::check_pointers = false); and raw/ncclkit with 8 all_reduces fused in one group
// (per call).
//
// Then the cost of each CUDA runtime call on ncclkit's issue path, alone, on the same thread
// (median of R batches of K calls), and of its host-only steps (clock reads, the handle's
// lock): where the overhead goes. The header names the kernel's clock source.
//
// A self-made timing loop rather than Google Benchmark: its adaptive iteration count would
// differ between ranks and leave collectives unmatched, and the binary must run on GPU
// machines without libbenchmark.
//
//   bench_nccl_enqueue [--batch K] [--repeats R] [--json FILE]
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "ncclkit/bootstrap/init_url.hpp"
#include "ncclkit/bootstrap/local_gpus.hpp"
#include "ncclkit/bootstrap/spawn.hpp"
#include "ncclkit/core/detail/coarse_clock.hpp"
#include "ncclkit/nccl/communicator.hpp"
#include "ncclkit/nccl/detail/checked_pointers.hpp"
#include "ncclkit/nccl/device_buffer.hpp"
#include "ncclkit/nccl/group.hpp"
#include "raw_nccl_comm.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using ncclkit::ReduceOp;
using ncclkit::nccl::Communicator;
using ncclkit::nccl::DeviceBuffer;

struct Settings {
  int batch = 256;
  int repeats = 41;
  std::string json_path;
};

struct Variant {
  std::string name;
  int calls_per_issue = 1;
  std::function<void()> issue;        // one call (or one group)
  std::function<void()> synchronize;  // untimed, between batches
  std::vector<double> samples_ns;     // per call
};

/// The kernel's clock source (tsc, kvm-clock, ...): what steady_clock::now() costs depends on it.
std::string clock_source() {
  std::FILE* file = std::fopen("/sys/devices/system/clocksource/clocksource0/current_clocksource", "r");
  if (file == nullptr) return "unknown";
  char text[64] = {};
  if (std::fgets(text, sizeof text, file) == nullptr) text[0] = 0;
  std::fclose(file);
  std::string source(text);
  while (!source.empty() && (source.back() == '\n' || source.back() == ' ')) source.pop_back();
  return source.empty() ? "unknown" : source;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const std::size_t mid = values.size() / 2;
  return values.size() % 2 ? values[mid] : 0.5 * (values[mid - 1] + values[mid]);
}

int run_rank(const ncclkit::WorldInfo& world, const Settings& settings) {
  auto store = ncclkit::make_store(world.init_url, world);
  Communicator checked(store, world, {.timeout = std::chrono::seconds(120), .name = "enqueue-checked"});
  Communicator unchecked(store, world,
                         {.timeout = std::chrono::seconds(120), .name = "enqueue-unchecked", .check_pointers = false});
  ncclkit::nccl::DeviceGuard guard(checked.device());
  ncclComm_t raw = ncclkit::bench::init_raw_comm(*store, world, "enqueue/raw_id");

  DeviceBuffer<float> buffer(2 * 8, checked.device());
  float* data = buffer.data();
  // Separate allocations: 16, which the pointer checks remember (a trainer's buckets), and
  // twice as many as they remember, so that every call queries CUDA.
  constexpr int kRemembered = 16;
  constexpr int kTooMany = 2 * static_cast<int>(ncclkit::nccl::detail::CheckedPointers::kSlots);
  std::vector<DeviceBuffer<float>> many;
  for (int i = 0; i < kTooMany; ++i) many.emplace_back(2, checked.device());
  int next_remembered = 0, next_too_many = 0;
  const cudaStream_t stream = checked.comm_stream();
  ncclkit::nccl::Stream user_stream(checked.device());
  cudaEvent_t marker = nullptr;
  NCCLKIT_CUDA_CHECK(cudaEventCreateWithFlags(&marker, cudaEventDisableTiming));
  // Thousands of events taken in turn, as the watchdog's pool hands them out when it retires
  // work every 50 ms: whether recording an event that has not been touched for a while costs
  // more than recording the same one again.
  std::vector<ncclkit::nccl::Event> pool;
  for (int k = 0; k < 8192; ++k) pool.emplace_back(checked.device());
  std::size_t next_event = 0;

  std::vector<Variant> variants;
  variants.push_back({"raw ncclAllReduce",
                      1,
                      [&] { NCCLKIT_NCCL_CHECK(ncclAllReduce(data, data, 2, ncclFloat32, ncclSum, raw, stream)); },
                      [&] { NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(stream)); },
                      {}});
  variants.push_back({"raw ncclAllReduce + cudaEventRecord",
                      1,
                      [&] {
                        NCCLKIT_NCCL_CHECK(ncclAllReduce(data, data, 2, ncclFloat32, ncclSum, raw, stream));
                        NCCLKIT_CUDA_CHECK(cudaEventRecord(marker, stream));
                      },
                      [&] { NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(stream)); },
                      {}});
  variants.push_back({"raw + cudaEventRecord, 8192 events in turn",
                      1,
                      [&] {
                        NCCLKIT_NCCL_CHECK(ncclAllReduce(data, data, 2, ncclFloat32, ncclSum, raw, stream));
                        pool[next_event].record(stream);
                        next_event = (next_event + 1) % pool.size();
                      },
                      [&] { NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(stream)); },
                      {}});
  // ncclkit's own NCCL communicator (split from a non-blocking one, with a config) called
  // directly: whether NCCL's per-call cost differs from the plain communicator's.
  variants.push_back({"raw ncclAllReduce on ncclkit's NCCL comm",
                      1,
                      [&] {
                        NCCLKIT_NCCL_CHECK(ncclAllReduce(data, data, 2, ncclFloat32, ncclSum, unchecked.native(),
                                                         unchecked.comm_stream()));
                      },
                      [&] { NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(unchecked.comm_stream())); },
                      {}});
  variants.push_back({"ncclkit all_reduce (pointer checks on)",
                      1,
                      [&] { checked.all_reduce(data, data, 2, ReduceOp::kSum); },
                      [&] { checked.synchronize(); },
                      {}});
  variants.push_back({"ncclkit checks on, out of place",
                      1,
                      [&] { checked.all_reduce(data, data + 2, 2, ReduceOp::kSum); },
                      [&] { checked.synchronize(); },
                      {}});
  variants.push_back({"ncclkit checks on, caller's stream",
                      1,
                      [&] { checked.all_reduce(data, data, 2, ReduceOp::kSum, user_stream); },
                      [&] { checked.synchronize(user_stream); },
                      {}});
  variants.push_back({"ncclkit checks on, 16 buffers in turn",
                      1,
                      [&] {
                        float* p = many[static_cast<std::size_t>(next_remembered)].data();
                        next_remembered = (next_remembered + 1) % kRemembered;
                        checked.all_reduce(p, p, 2, ReduceOp::kSum);
                      },
                      [&] { checked.synchronize(); },
                      {}});
  variants.push_back({"ncclkit checks on, " + std::to_string(kTooMany) + " buffers in turn",
                      1,
                      [&] {
                        float* p = many[static_cast<std::size_t>(next_too_many)].data();
                        next_too_many = (next_too_many + 1) % kTooMany;
                        checked.all_reduce(p, p, 2, ReduceOp::kSum);
                      },
                      [&] { checked.synchronize(); },
                      {}});
  variants.push_back({"ncclkit all_reduce (pointer checks off)",
                      1,
                      [&] { unchecked.all_reduce(data, data, 2, ReduceOp::kSum); },
                      [&] { unchecked.synchronize(); },
                      {}});
  variants.push_back({"raw group of 8",
                      8,
                      [&] {
                        NCCLKIT_NCCL_CHECK(ncclGroupStart());
                        for (int i = 0; i < 8; ++i)
                          NCCLKIT_NCCL_CHECK(
                              ncclAllReduce(data + 2 * i, data + 2 * i, 2, ncclFloat32, ncclSum, raw, stream));
                        NCCLKIT_NCCL_CHECK(ncclGroupEnd());
                      },
                      [&] { NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(stream)); },
                      {}});
  variants.push_back({"ncclkit group of 8 (checks off)",
                      8,
                      [&] {
                        ncclkit::nccl::GroupGuard group;
                        for (int i = 0; i < 8; ++i) unchecked.all_reduce(data + 2 * i, data + 2 * i, 2, ReduceOp::kSum);
                        group.end();
                      },
                      [&] { unchecked.synchronize(); },
                      {}});

  // Warm up: connections, event pools, caches.
  for (auto& v : variants) {
    for (int i = 0; i < 200; ++i) v.issue();
    v.synchronize();
  }
  const int issues_per_batch = settings.batch;
  for (int repeat = 0; repeat < settings.repeats; ++repeat) {
    for (auto& v : variants) {
      const int issues = std::max(1, issues_per_batch / v.calls_per_issue);
      const auto start = Clock::now();
      for (int i = 0; i < issues; ++i) v.issue();
      const auto end = Clock::now();
      v.synchronize();
      v.samples_ns.push_back(std::chrono::duration<double, std::nano>(end - start).count() /
                             (issues * v.calls_per_issue));
    }
  }
  checked.barrier();

  // The CUDA runtime calls of ncclkit's issue path, one at a time, on an idle stream.
  std::vector<Variant> parts;
  if (world.rank == 0) {
    cudaStreamCaptureStatus capture{};
    cudaPointerAttributes attributes{};
    parts.push_back({"cudaEventRecord", 1, [&] { NCCLKIT_CUDA_CHECK(cudaEventRecord(marker, stream)); }, {}, {}});
    parts.push_back(
        {"cudaStreamIsCapturing", 1, [&] { NCCLKIT_CUDA_CHECK(cudaStreamIsCapturing(stream, &capture)); }, {}, {}});
    parts.push_back({"cudaPointerGetAttributes",
                     1,
                     [&] { NCCLKIT_CUDA_CHECK(cudaPointerGetAttributes(&attributes, data)); },
                     {},
                     {}});
#if CUDART_VERSION >= 12080
    int stream_device = -1;
    parts.push_back({"cudaStreamGetDevice",
                     1,
                     [&] { NCCLKIT_CUDA_CHECK(cudaStreamGetDevice(user_stream.get(), &stream_device)); },
                     {},
                     {}});
#endif
    parts.push_back(
        {"NVTX range (no profiler attached)", 1, [&] { ncclkit::detail::NvtxRange range("bench"); }, {}, {}});
    // Host-only steps of the issue path, for hosts where they are not cheap.
    volatile std::int64_t sink = 0;
    parts.push_back({"steady_clock::now", 1, [&] { sink = Clock::now().time_since_epoch().count(); }, {}, {}});
    parts.push_back({"coarse_now (issue stamps)",
                     1,
                     [&] { sink = ncclkit::detail::coarse_now().time_since_epoch().count(); },
                     {},
                     {}});
    std::timed_mutex mutex;
    parts.push_back({"timed_mutex lock + unlock", 1, [&] { std::lock_guard lock(mutex); }, {}, {}});
    for (int repeat = 0; repeat < settings.repeats; ++repeat) {
      for (auto& part : parts) {
        const auto start = Clock::now();
        for (int i = 0; i < settings.batch; ++i) part.issue();
        const auto end = Clock::now();
        NCCLKIT_CUDA_CHECK(cudaStreamSynchronize(stream));
        part.samples_ns.push_back(std::chrono::duration<double, std::nano>(end - start).count() / settings.batch);
      }
    }
  }

  if (world.rank == 0) {
    cudaDeviceProp prop{};
    NCCLKIT_CUDA_CHECK(cudaGetDeviceProperties(&prop, checked.device()));
    std::printf("# bench_nccl_enqueue: %d ranks, %s, %s, batch %d calls, %d repeats (median; host time per call)\n",
                world.world_size, prop.name, ncclkit::nccl::version_text().c_str(), settings.batch, settings.repeats);
    std::printf("# clock source: %s, coarse clock tick %.3f ms\n", clock_source().c_str(),
                std::chrono::duration<double, std::milli>(ncclkit::detail::coarse_resolution()).count());
    const double raw_single = median(variants[0].samples_ns);
    double raw_group = 0;
    for (const auto& v : variants)
      if (v.name == "raw group of 8") raw_group = median(v.samples_ns);
    std::printf("# %-42s %12s %12s %12s %18s\n", "variant", "median(ns)", "p10(ns)", "p90(ns)", "vs raw (ns/call)");
    for (std::size_t k = 0; k < variants.size(); ++k) {
      auto sorted = variants[k].samples_ns;
      std::sort(sorted.begin(), sorted.end());
      const double med = median(sorted);
      const double baseline = variants[k].calls_per_issue > 1 ? raw_group : raw_single;
      std::printf("  %-42s %12.0f %12.0f %12.0f %+18.0f\n", variants[k].name.c_str(), med, sorted[sorted.size() / 10],
                  sorted[sorted.size() * 9 / 10], med - baseline);
    }
    std::printf("# %-42s %12s %12s %12s\n", "one call alone", "median(ns)", "p10(ns)", "p90(ns)");
    for (auto& part : parts) {
      auto sorted = part.samples_ns;
      std::sort(sorted.begin(), sorted.end());
      std::printf("  %-42s %12.0f %12.0f %12.0f\n", part.name.c_str(), median(sorted), sorted[sorted.size() / 10],
                  sorted[sorted.size() * 9 / 10]);
    }
    if (!settings.json_path.empty()) {
      std::FILE* json = std::fopen(settings.json_path.c_str(), "w");
      if (json != nullptr) {
        std::fprintf(json, "{\"ranks\": %d, \"gpu\": \"%s\", \"batch\": %d, \"repeats\": %d, \"variants\": [",
                     world.world_size, prop.name, settings.batch, settings.repeats);
        for (std::size_t k = 0; k < variants.size(); ++k) {
          std::fprintf(json, "%s\n  {\"name\": \"%s\", \"median_ns_per_call\": %.1f}", k ? "," : "",
                       variants[k].name.c_str(), median(variants[k].samples_ns));
        }
        std::fprintf(json, "\n], \"calls\": [");
        for (std::size_t k = 0; k < parts.size(); ++k) {
          std::fprintf(json, "%s\n  {\"name\": \"%s\", \"median_ns_per_call\": %.1f}", k ? "," : "",
                       parts[k].name.c_str(), median(parts[k].samples_ns));
        }
        std::fprintf(json, "\n]}\n");
        std::fclose(json);
      }
    }
  }
  NCCLKIT_CUDA_CHECK(cudaEventDestroy(marker));
  NCCLKIT_NCCL_CHECK(ncclCommDestroy(raw));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Settings settings;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--batch" && i + 1 < argc)
      settings.batch = std::stoi(argv[++i]);
    else if (flag == "--repeats" && i + 1 < argc)
      settings.repeats = std::stoi(argv[++i]);
    else if (flag == "--json" && i + 1 < argc)
      settings.json_path = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_nccl_enqueue [--batch K] [--repeats R] [--json FILE]\n");
      return 1;
    }
  }
  const auto inventory = ncclkit::find_gpus();  // no CUDA before fork
  if (inventory.visible.empty()) {
    std::printf("SKIPPED: no GPU visible\n");
    return 77;
  }
  const int ranks = std::min<int>(2, static_cast<int>(inventory.visible.size()));
  auto result = ncclkit::spawn(ranks, [&](const ncclkit::WorldInfo& world) { return run_rank(world, settings); },
                               {.timeout = std::chrono::minutes(10)});
  if (!result.ok()) {
    std::fprintf(stderr, "bench_nccl_enqueue: %s\n", result.describe().c_str());
    return 1;
  }
  return 0;
}
