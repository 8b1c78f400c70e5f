// Throughput of the element-wise reductions the Gloo backend hands to Gloo
// (ncclkit/gloo/reduce_kernels.hpp), both compiled copies, against Gloo's own callbacks
// (gloo::sum<float>, gloo::sum<gloo::float16>, the ones PyTorch's gloo backend passes).
// Measures out[i] = a[i] + b[i] over `count` elements; reports elements and bytes moved
// (two reads and one write per element) per second.
//
//   bench_gloo_reduce_kernels --benchmark_filter=sum/.*/262144
#include <benchmark/benchmark.h>
#include <gloo/math.h>
#include <gloo/types.h>

#include <cstdint>
#include <vector>

#include "ncclkit/gloo/reduce_kernels.hpp"
#include "gbench_main.hpp"  // NCCLKIT_BENCHMARK_MAIN: a failed check exits 1

namespace {

using ncclkit::DataType;
using ncclkit::ReduceOp;
namespace kg = ncclkit::gloo;

template <class T>
void run(benchmark::State& state, kg::ReduceFunction fn) {
  const auto count = static_cast<std::size_t>(state.range(0));
  std::vector<T> a(count), b(count), out(count);
  for (std::size_t i = 0; i < count; ++i) {
    // Values that stay finite and normal under repeated sums in every type.
    const float x = static_cast<float>(i % 1000) * 0.001f;
    if constexpr (sizeof(T) == 2) {
      a[i] = T(x);
      b[i] = T(1.0f - x);
    } else {
      a[i] = static_cast<T>(x);
      b[i] = static_cast<T>(1.0f - x);
    }
  }
  for (auto _ : state) {
    fn(out.data(), a.data(), b.data(), count);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetItemsProcessed(static_cast<std::int64_t>(state.iterations()) * static_cast<std::int64_t>(count));
  state.SetBytesProcessed(static_cast<std::int64_t>(state.iterations()) *
                          static_cast<std::int64_t>(count * 3 * sizeof(T)));
}

template <class T>
void ncclkit_sum(benchmark::State& state, kg::KernelIsa isa) {
  if (!kg::isa_supported(isa)) {
    state.SkipWithError("skipped: this CPU lacks the instruction set");  // no failure (gbench_main.hpp)
    return;
  }
  run<T>(state, kg::reduce_function(ncclkit::data_type_v<T>, ReduceOp::kSum, isa));
}

void gloo_sum_float(benchmark::State& state) { run<float>(state, static_cast<kg::ReduceFunction>(&gloo::sum<float>)); }
void gloo_sum_float16(benchmark::State& state) {
  run<ncclkit::Half>(state, static_cast<kg::ReduceFunction>(&gloo::sum<gloo::float16>));
}

constexpr std::int64_t kSmall = 1 << 18;  // 256 Ki elements: in cache
constexpr std::int64_t kLarge = 1 << 24;  // 16 Mi elements: memory-bound

}  // namespace

// (Plain functions: BENCHMARK_CAPTURE cannot take a template name.)
void sum_float(benchmark::State& state, kg::KernelIsa isa) { ncclkit_sum<float>(state, isa); }
void sum_half(benchmark::State& state, kg::KernelIsa isa) { ncclkit_sum<ncclkit::Half>(state, isa); }
void sum_bfloat16(benchmark::State& state, kg::KernelIsa isa) { ncclkit_sum<ncclkit::BFloat16>(state, isa); }

BENCHMARK_CAPTURE(sum_float, avx2, kg::KernelIsa::kAvx2F16c)->Name("sum/float/ncclkit-avx2")->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(sum_float, generic, kg::KernelIsa::kGeneric)
    ->Name("sum/float/ncclkit-generic")
    ->Arg(kSmall)
    ->Arg(kLarge);
BENCHMARK(gloo_sum_float)->Name("sum/float/gloo")->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(sum_half, avx2, kg::KernelIsa::kAvx2F16c)->Name("sum/half/ncclkit-avx2")->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(sum_half, generic, kg::KernelIsa::kGeneric)
    ->Name("sum/half/ncclkit-generic")
    ->Arg(kSmall)
    ->Arg(kLarge);
BENCHMARK(gloo_sum_float16)->Name("sum/half/gloo")->Arg(kSmall)->Arg(kLarge);
BENCHMARK_CAPTURE(sum_bfloat16, avx2, kg::KernelIsa::kAvx2F16c)
    ->Name("sum/bfloat16/ncclkit-avx2")
    ->Arg(kSmall)
    ->Arg(kLarge);
BENCHMARK_CAPTURE(sum_bfloat16, generic, kg::KernelIsa::kGeneric)
    ->Name("sum/bfloat16/ncclkit-generic")
    ->Arg(kSmall)
    ->Arg(kLarge);

NCCLKIT_BENCHMARK_MAIN()
