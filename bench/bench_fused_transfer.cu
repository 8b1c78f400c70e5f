// bench_fused_transfer: can compression fused into the transfer beat NCCL's float32
// all-reduce by more than casting around a 16-bit all-reduce does? (docs/performance.md,
// "Compression fused into the transfer"). An experiment, not a part of the library.
//
// One thread per visible GPU (all in one process, so nothing to launch), one NCCL
// communicator per GPU, and for each size, side by side on the same buffers:
//   fp32 nccl        ncclAllReduce in float32 on a cudaMalloc buffer (the target's reference)
//   fp32 nccl sym    the same on a buffer from ncclMemAlloc registered as a symmetric window
//   fp16 nccl        ncclAllReduce in float16 alone (what the wire could give, casts excluded)
//   cast+fp16+cast   scale and cast, float16 all-reduce, cast back: the separate-kernel way
//   fused fp16/bf16  one kernel on NCCL 2.28's device API (LSA: the peers' windows are plain
//                    pointers over NVLink): each rank reads its float32 gradients, writes the
//                    16-bit shards of the others straight into their windows, sums its own
//                    shard in float32 (its own part unrounded), rounds it to 16 bits once,
//                    writes that to every peer, and every rank decodes all shards. Two
//                    barriers per call (one LSA barrier per block: block b of every rank
//                    handles the same elements). Every rank ends with the same bits.
// Each fused result is checked against a float64 sum of the inputs (norm-relative error).
//
// Run: build/bench/bench_fused_transfer [--iters N] [--blocks B] [--threads T] [MiB ...]
// (sizes in MiB of float32; default: 2 8 25 100 and GPT-2 small's 124439808 parameters).
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <nccl_device.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace {

[[noreturn]] void die(const char* what, const char* detail, int line) {
  std::fprintf(stderr, "bench_fused_transfer:%d: %s: %s\n", line, what, detail);
  std::exit(1);
}
#define CUDA(x)                                             \
  do {                                                      \
    cudaError_t e_ = (x);                                   \
    if (e_ != cudaSuccess) die(#x, cudaGetErrorString(e_), __LINE__); \
  } while (0)
#define NCCL(x)                                             \
  do {                                                      \
    ncclResult_t r_ = (x);                                  \
    if (r_ != ncclSuccess) die(#x, ncclGetErrorString(r_), __LINE__); \
  } while (0)

/// Deterministic N(0, 1e-3)-like gradients: a hash of (rank, index) to a uniform value, scaled.
__global__ void fill(float* g, std::size_t n, int rank) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n;
       i += std::size_t(gridDim.x) * blockDim.x) {
    std::uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (std::uint64_t(rank + 1) * 0xC2B2AE3D27D4EB4Full);
    x ^= x >> 31;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 29;
    const float u = float(x >> 40) / float(1ull << 24);  // [0, 1)
    g[i] = (u - 0.5f) * 3.4e-3f;                         // std ≈ 1e-3
  }
}

template <class T>
__device__ T to16(float v);
template <>
__device__ __half to16<__half>(float v) { return __float2half_rn(v); }
template <>
__device__ __nv_bfloat16 to16<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
__device__ float from16(__half v) { return __half2float(v); }
__device__ float from16(__nv_bfloat16 v) { return __bfloat162float(v); }

/// 8 floats -> 8 16-bit values in one 16-byte word.
template <class T>
__device__ uint4 pack8(float4 a, float4 b, float s) {
  union {
    T h[8];
    uint4 u;
  } r;
  r.h[0] = to16<T>(a.x * s), r.h[1] = to16<T>(a.y * s), r.h[2] = to16<T>(a.z * s), r.h[3] = to16<T>(a.w * s);
  r.h[4] = to16<T>(b.x * s), r.h[5] = to16<T>(b.y * s), r.h[6] = to16<T>(b.z * s), r.h[7] = to16<T>(b.w * s);
  return r.u;
}
template <class T>
__device__ void unpack8(uint4 u, float* out) {
  union {
    T h[8];
    uint4 u;
  } r;
  r.u = u;
#pragma unroll
  for (int k = 0; k < 8; ++k) out[k] = from16(r.h[k]);
}

/// The fused all-reduce: `g` (float32, n elements, in and out), shards of `shard` elements
/// (a multiple of 8), window of 2 * world * shard 16-bit values: [reduce-scatter inbox from
/// each rank | all-gather inbox from each rank]. Elements past n read as 0 and are not written.
template <class T>
__global__ void __launch_bounds__(512) fused_all_reduce(ncclDevComm comm, ncclWindow_t win, float* g, std::size_t n,
                                                        std::size_t shard, float encode, float decode) {
  const int world = comm.lsaSize;
  const int me = comm.lsaRank;
  const std::size_t vectors = shard / 8;
  const std::size_t stride = std::size_t(gridDim.x) * blockDim.x;
  const std::size_t first = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x;
  const std::size_t ag_base = std::size_t(world) * shard * sizeof(T);  // bytes

  auto load8 = [&](std::size_t e, float4& a, float4& b) {
    if (e + 8 <= n) {
      a = *reinterpret_cast<const float4*>(g + e);
      b = *reinterpret_cast<const float4*>(g + e + 4);
    } else {
      float t[8];
      for (int k = 0; k < 8; ++k) t[k] = e + k < n ? g[e + k] : 0.f;
      a = make_float4(t[0], t[1], t[2], t[3]);
      b = make_float4(t[4], t[5], t[6], t[7]);
    }
  };
  auto store8 = [&](std::size_t e, const float* v) {
    if (e + 8 <= n) {
      *reinterpret_cast<float4*>(g + e) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(g + e + 4) = make_float4(v[4], v[5], v[6], v[7]);
    } else {
      for (int k = 0; k < 8 && e + k < n; ++k) g[e + k] = v[k];
    }
  };

  ncclLsaBarrierSession<ncclCoopCta> bar(ncclCoopCta(), comm, ncclTeamTagLsa(), blockIdx.x);

  // 1. Reduce-scatter, pushed: the others' shards, encoded, into their inbox slot `me`.
  for (int step = 1; step < world; ++step) {
    const int peer = (me + step) % world;
    uint4* inbox = static_cast<uint4*>(ncclGetLsaPointer(win, std::size_t(me) * shard * sizeof(T), peer));
    for (std::size_t v = first; v < vectors; v += stride) {
      float4 a, b;
      load8(std::size_t(peer) * shard + v * 8, a, b);
      inbox[v] = pack8<T>(a, b, encode);
    }
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  // 2. This rank's shard: own part in float32 plus the others' 16-bit parts, rounded once;
  // the 16-bit result goes to every peer's all-gather inbox slot `me`, and is decoded here.
  for (std::size_t v = first; v < vectors; v += stride) {
    const std::size_t e = std::size_t(me) * shard + v * 8;
    float4 a, b;
    load8(e, a, b);
    float acc[8] = {a.x * encode, a.y * encode, a.z * encode, a.w * encode,
                    b.x * encode, b.y * encode, b.z * encode, b.w * encode};
    for (int q = 0; q < world; ++q) {
      if (q == me) continue;
      const uint4* from = static_cast<const uint4*>(ncclGetLocalPointer(win, std::size_t(q) * shard * sizeof(T)));
      float t[8];
      unpack8<T>(from[v], t);
#pragma unroll
      for (int k = 0; k < 8; ++k) acc[k] += t[k];
    }
    const uint4 out = pack8<T>(make_float4(acc[0], acc[1], acc[2], acc[3]), make_float4(acc[4], acc[5], acc[6], acc[7]), 1.f);
    for (int step = 1; step < world; ++step) {
      const int peer = (me + step) % world;
      static_cast<uint4*>(ncclGetLsaPointer(win, ag_base + std::size_t(me) * shard * sizeof(T), peer))[v] = out;
    }
    float r[8];
    unpack8<T>(out, r);
#pragma unroll
    for (int k = 0; k < 8; ++k) r[k] *= decode;
    store8(e, r);
  }
  bar.sync(ncclCoopCta(), cuda::memory_order_acq_rel);

  // 3. Everyone else's shards, decoded from the all-gather inbox.
  for (int q = 0; q < world; ++q) {
    if (q == me) continue;
    const uint4* from = static_cast<const uint4*>(ncclGetLocalPointer(win, ag_base + std::size_t(q) * shard * sizeof(T)));
    for (std::size_t v = first; v < vectors; v += stride) {
      float r[8];
      unpack8<T>(from[v], r);
#pragma unroll
      for (int k = 0; k < 8; ++k) r[k] *= decode;
      store8(std::size_t(q) * shard + v * 8, r);
    }
  }
}

template <class T>
__global__ void encode_kernel(const float* in, T* out, std::size_t n, float s) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = to16<T>(in[i] * s);
}
template <class T>
__global__ void decode_kernel(const T* in, float* out, std::size_t n, float s) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < n; i += std::size_t(gridDim.x) * blockDim.x)
    out[i] = from16(in[i]) * s;
}

struct Config {
  int iters = 40;
  int warmup = 5;
  int blocks = 0;  // 0: one per SM
  int threads = 512;
  std::vector<std::size_t> elements;
};

struct Shared {
  int world = 0;
  ncclUniqueId id{};
  Config config;
  // results[size][row] = median ms, rank 0 only
  std::vector<std::vector<double>> ms;
  std::vector<std::vector<double>> error;
};

const char* const kRows[] = {"fp32 nccl", "fp32 nccl sym", "fp16 nccl", "cast+fp16+cast", "fused fp16", "fused bf16"};
constexpr int kRowCount = 6;

bool g_verbose = false;

template <class F>
double median_ms(cudaStream_t s, int warmup, int iters, F&& f) {
  static thread_local int row = 0;
  if (g_verbose) std::fprintf(stderr, "row %d\n", row++);
  f();
  CUDA(cudaStreamSynchronize(s));
  for (int i = 1; i < warmup; ++i) f();
  std::vector<cudaEvent_t> ev(iters + 1);
  for (auto& e : ev) CUDA(cudaEventCreate(&e));
  CUDA(cudaEventRecord(ev[0], s));
  for (int i = 0; i < iters; ++i) {
    f();
    CUDA(cudaEventRecord(ev[i + 1], s));
  }
  CUDA(cudaStreamSynchronize(s));
  std::vector<double> t(iters);
  for (int i = 0; i < iters; ++i) {
    float ms = 0;
    CUDA(cudaEventElapsedTime(&ms, ev[i], ev[i + 1]));
    t[i] = ms;
  }
  for (auto& e : ev) CUDA(cudaEventDestroy(e));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Norm-relative error of g against the float64 sum over ranks of fill(), times `scale`.
double relative_error(const float* g_device, std::size_t n, int world, double scale) {
  std::vector<float> got(n);
  CUDA(cudaMemcpy(got.data(), g_device, n * sizeof(float), cudaMemcpyDeviceToHost));
  std::vector<std::vector<float>> inputs(world, std::vector<float>(n));
  float* tmp = nullptr;
  CUDA(cudaMalloc(&tmp, n * sizeof(float)));
  for (int r = 0; r < world; ++r) {
    fill<<<1024, 256>>>(tmp, n, r);
    CUDA(cudaMemcpy(inputs[r].data(), tmp, n * sizeof(float), cudaMemcpyDeviceToHost));
  }
  CUDA(cudaFree(tmp));
  double num = 0, den = 0;
  for (std::size_t i = 0; i < n; ++i) {
    double want = 0;
    for (int r = 0; r < world; ++r) want += inputs[r][i];
    want *= scale;
    num += (got[i] - want) * (got[i] - want);
    den += want * want;
  }
  return std::sqrt(num / den);
}

void rank_main(int rank, Shared& shared) {
  const int world = shared.world;
  const Config& cfg = shared.config;
  CUDA(cudaSetDevice(rank));
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, world, shared.id, rank));
  int sms = 0;
  CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rank));
  const int blocks = cfg.blocks > 0 ? cfg.blocks : sms;

  std::size_t max_n = 0;
  for (std::size_t n : cfg.elements) max_n = std::max(max_n, n);
  const std::size_t max_shard = ((max_n + world - 1) / world + 7) / 8 * 8;
  const std::size_t win_bytes = (2 * world * max_shard * sizeof(__half) + 4095) / 4096 * 4096;
  void* win_mem = nullptr;
  NCCL(ncclMemAlloc(&win_mem, win_bytes));
  ncclWindow_t win;
  NCCL(ncclCommWindowRegister(comm, win_mem, win_bytes, &win, NCCL_WIN_COLL_SYMMETRIC));

  const std::size_t sym_bytes = (max_n * sizeof(float) + 4095) / 4096 * 4096;
  void* sym_mem = nullptr;
  NCCL(ncclMemAlloc(&sym_mem, sym_bytes));
  ncclWindow_t sym_win;
  NCCL(ncclCommWindowRegister(comm, sym_mem, sym_bytes, &sym_win, NCCL_WIN_COLL_SYMMETRIC));

  ncclDevCommRequirements reqs;
  std::memset(&reqs, 0, sizeof(reqs));
  reqs.lsaBarrierCount = blocks;
  ncclDevComm dev;
  NCCL(ncclDevCommCreate(comm, &reqs, &dev));
  if (g_verbose) {
    int version = 0;
    NCCL(ncclGetVersion(&version));
    std::fprintf(stderr, "rank %d: nccl %d, lsa %d of %d, flat base %p, stride4G %u, barriers %d\n", rank, version,
                 dev.lsaRank, dev.lsaSize, dev.resourceWindow_inlined.lsaFlatBase, dev.resourceWindow_inlined.stride4G,
                 dev.lsaBarrier.nBarriers);
  }
  if (dev.lsaSize != world) die("device API", "not every rank is load/store accessible (LSA team < world)", __LINE__);

  float* g = nullptr;
  CUDA(cudaMalloc(&g, max_n * sizeof(float)));
  __half* h = nullptr;
  CUDA(cudaMalloc(&h, max_n * sizeof(__half)));

  for (std::size_t si = 0; si < cfg.elements.size(); ++si) {
    const std::size_t n = cfg.elements[si];
    const std::size_t shard = ((n + world - 1) / world + 7) / 8 * 8;
    const float encode = 1.f / world, decode = 1.f;  // the average: encode 1/world, decode 1
    std::vector<double> ms(kRowCount), err(kRowCount, -1);
    ms[0] = median_ms(s, cfg.warmup, cfg.iters, [&] { NCCL(ncclAllReduce(g, g, n, ncclFloat, ncclSum, comm, s)); });
    ms[1] = median_ms(s, cfg.warmup, cfg.iters,
                      [&] { NCCL(ncclAllReduce(sym_mem, sym_mem, n, ncclFloat, ncclSum, comm, s)); });
    ms[2] = median_ms(s, cfg.warmup, cfg.iters, [&] { NCCL(ncclAllReduce(h, h, n, ncclHalf, ncclSum, comm, s)); });
    ms[3] = median_ms(s, cfg.warmup, cfg.iters, [&] {
      encode_kernel<__half><<<sms * 4, 512, 0, s>>>(g, h, n, encode);
      NCCL(ncclAllReduce(h, h, n, ncclHalf, ncclSum, comm, s));
      decode_kernel<__half><<<sms * 4, 512, 0, s>>>(h, g, n, decode);
    });
    ms[4] = median_ms(s, cfg.warmup, cfg.iters, [&] {
      fused_all_reduce<__half><<<blocks, cfg.threads, 0, s>>>(dev, win, g, n, shard, encode, decode);
      CUDA(cudaGetLastError());
    });
    ms[5] = median_ms(s, cfg.warmup, cfg.iters, [&] {
      fused_all_reduce<__nv_bfloat16><<<blocks, cfg.threads, 0, s>>>(dev, win, g, n, shard, encode, decode);
      CUDA(cudaGetLastError());
    });
    // Correctness: one call from fresh inputs, against float64 (average over ranks).
    if (n <= (std::size_t{32} << 20)) {
      for (int row : {3, 4, 5}) {
        fill<<<1024, 256, 0, s>>>(g, n, rank);
        if (row == 3) {
          encode_kernel<__half><<<sms * 4, 512, 0, s>>>(g, h, n, encode);
          NCCL(ncclAllReduce(h, h, n, ncclHalf, ncclSum, comm, s));
          decode_kernel<__half><<<sms * 4, 512, 0, s>>>(h, g, n, decode);
        } else if (row == 4) {
          fused_all_reduce<__half><<<blocks, cfg.threads, 0, s>>>(dev, win, g, n, shard, encode, decode);
        } else {
          fused_all_reduce<__nv_bfloat16><<<blocks, cfg.threads, 0, s>>>(dev, win, g, n, shard, encode, decode);
        }
        CUDA(cudaStreamSynchronize(s));
        err[row] = relative_error(g, n, world, 1.0 / world);
      }
    }
    if (rank == 0) {
      shared.ms[si] = ms;
      shared.error[si] = err;
    }
    // Keep ranks in step between sizes.
    NCCL(ncclAllReduce(g, g, 1, ncclFloat, ncclSum, comm, s));
    CUDA(cudaStreamSynchronize(s));
  }

  NCCL(ncclCommWindowDeregister(comm, win));
  NCCL(ncclCommWindowDeregister(comm, sym_win));
  NCCL(ncclDevCommDestroy(comm, &dev));
  NCCL(ncclMemFree(win_mem));
  NCCL(ncclMemFree(sym_mem));
  CUDA(cudaFree(g));
  CUDA(cudaFree(h));
  NCCL(ncclCommDestroy(comm));
}

}  // namespace

int main(int argc, char** argv) {
  Shared shared;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> int {
      if (i + 1 >= argc) die("arguments", (a + " needs a value").c_str(), __LINE__);
      return std::atoi(argv[++i]);
    };
    if (a == "--verbose") {
      g_verbose = true;
    } else if (a == "--iters") {
      shared.config.iters = value();
    } else if (a == "--blocks") {
      shared.config.blocks = value();
    } else if (a == "--threads") {
      shared.config.threads = value();
    } else if (a == "--gpt2") {
      shared.config.elements.push_back(124439808);
    } else if (!a.empty() && a[0] != '-') {
      shared.config.elements.push_back(std::size_t(std::atof(a.c_str()) * (1 << 20) / 4));
    } else {
      die("arguments", ("unknown argument " + a + "; see the comment at the top of bench_fused_transfer.cu").c_str(),
          __LINE__);
    }
  }
  if (shared.config.iters < 1 || shared.config.threads < 32 || shared.config.threads > 512 ||
      shared.config.threads % 32 != 0) {
    die("arguments", "--iters must be >= 1 and --threads a multiple of 32 in [32, 512]", __LINE__);
  }
  if (shared.config.elements.empty()) {
    for (double mib : {2.0, 8.0, 25.0, 100.0}) shared.config.elements.push_back(std::size_t(mib * (1 << 20) / 4));
    shared.config.elements.push_back(124439808);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::printf("SKIPPED: needs 2 or more GPUs\n");
    return 77;
  }
  shared.world = devices;
  NCCL(ncclGetUniqueId(&shared.id));
  shared.ms.resize(shared.config.elements.size());
  shared.error.resize(shared.config.elements.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < devices; ++r) threads.emplace_back(rank_main, r, std::ref(shared));
  for (auto& t : threads) t.join();

  cudaDeviceProp prop{};
  CUDA(cudaGetDeviceProperties(&prop, 0));
  std::printf("# bench_fused_transfer: %d x %s, NCCL %d, median of %d calls, ms (x: fp32 nccl / row)\n", devices,
              prop.name, NCCL_VERSION_CODE, shared.config.iters);
  std::printf("%12s", "elements");
  for (const char* r : kRows) std::printf(" | %22s", r);
  std::printf("\n");
  for (std::size_t si = 0; si < shared.config.elements.size(); ++si) {
    std::printf("%12zu", shared.config.elements[si]);
    for (int r = 0; r < kRowCount; ++r) {
      std::printf(" | %8.3f (%5.2fx)", shared.ms[si][r], shared.ms[si][0] / shared.ms[si][r]);
      if (shared.error[si][r] >= 0) std::printf(" e=%.1e", shared.error[si][r]);
    }
    std::printf("\n");
  }
  return 0;
}
