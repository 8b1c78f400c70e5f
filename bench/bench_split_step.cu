// bench_split_step: would cutting the 16-bit exchange in two, one half under backward and one
// under the next step's forward, make train_mlp's step faster at 2 GPUs, and which cut? It
// decides what the fused kernel (nccl/detail/compressed_reduce_kernels.cuh) is split into before
// anyone writes it (docs/dev/gpu-runs.md, issue 29).
//
// A model of the step, not the trainer: per GPU, the MLP of train_mlp's benchmark (8 layers,
// 4096 wide, batch B, TF32 GEMMs): forward, then backward (weight-gradient GEMM, the layer's
// gradients ready, data-gradient GEMM). Each layer's exchange has the 2-GPU fused kernel's
// shape, as kernels on the comm stream (high priority) that store into the other GPU's memory:
//   scatter  cast half the gradients to 16 bits and store them into the peer (16 MiB a layer),
//            then sum this GPU's half and update its parameters (the owner's part)
//   push     store this GPU's 16-bit results into the peer (16 MiB)
//   local    decode the peer's results and update the other half of the parameters
// The two GPUs do not wait for each other's stores (timing only: the values are not used), so
// the model leaves out the kernel's barriers. Modes:
//   none          no exchange: the 1-GPU step
//   fused         scatter, push, local after each layer's gradients; the next forward waits
//                 for all of it (how the fused kernel runs today)
//   split         scatter after each layer's gradients; push and local of layer l at the start
//                 of the next step, in layer order, layer l's forward waiting for them
//   split-local   scatter and push after each layer's gradients; only local at the next step
//                 (the fused kernel cut after its second barrier: phase 3 deferred)
// Prints each mode's step time (ms, events on GPU 0, 30 steps after 10) in two rounds.
// With one GPU it stores into its own memory: a smoke test of the program, not a measurement.
//
// Run: build/bench/bench_split_step [batches per GPU, default 64,256] [blocks per exchange kernel, 198]
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>  // std::max_element
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace {

const char* describe(cudaError_t e) { return cudaGetErrorString(e); }
const char* describe(cublasStatus_t s) { return cublasGetStatusString(s); }

[[noreturn]] void die(const char* what, const char* why, int line) {
  std::fprintf(stderr, "bench_split_step:%d: %s failed: %s\n", line, what, why);
  std::exit(1);
}
#define CHECK_CALL(x)                             \
  do {                                            \
    const auto c_ = (x);                          \
    if (c_ != 0) die(#x, describe(c_), __LINE__); \
  } while (0)

constexpr int kLayers = 8;
constexpr int kWidth = 4096;
constexpr std::size_t kLayerElements = std::size_t(kWidth) * kWidth;
constexpr std::size_t kHalf = kLayerElements / 2;  // the elements one GPU owns per layer
constexpr int kThreads = 512;

__global__ void store_words(const uint4* __restrict__ from, uint4* __restrict__ to, std::size_t words) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < words;
       i += std::size_t(gridDim.x) * blockDim.x)
    to[i] = from[i];
}
// Four float32 gradients to four 16-bit values (bit patterns only: what it costs, not what it makes).
__global__ void narrow(const float4* grad, uint2* out, std::size_t quads) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < quads;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const float4 g = grad[i];
    out[i] = make_uint2(__float_as_uint(g.x + g.y), __float_as_uint(g.z + g.w));
  }
}
// Reads four gradients and four received 16-bit values, updates four parameters; with `out`,
// writes four 16-bit results (the owner's sum).
__global__ void sum_update(const float4* grad, const uint2* in, float4* param, uint2* out, std::size_t quads) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < quads;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const float4 g = grad[i];
    const uint2 r = in[i];
    float4 p = param[i];
    p.x -= 1e-9f * (g.x + __uint_as_float(r.x));
    p.y -= 1e-9f * (g.y + __uint_as_float(r.y));
    p.z -= 1e-9f * g.z;
    p.w -= 1e-9f * g.w;
    param[i] = p;
    if (out != nullptr) out[i] = make_uint2(__float_as_uint(p.x), __float_as_uint(p.y));
  }
}
// Decodes four received 16-bit results into four parameters.
__global__ void decode_update(const uint2* in, float4* param, std::size_t quads) {
  for (std::size_t i = blockIdx.x * std::size_t(blockDim.x) + threadIdx.x; i < quads;
       i += std::size_t(gridDim.x) * blockDim.x) {
    const uint2 r = in[i];
    float4 p = param[i];
    p.x -= 1e-9f * __uint_as_float(r.x);
    p.y -= 1e-9f * __uint_as_float(r.y);
    param[i] = p;
  }
}

enum Mode { kNone, kFused, kSplit, kSplitLocal, kModes };
const char* const kModeNames[kModes] = {"none (1-GPU step)", "fused (today)", "split", "split-local"};

struct Gpu {
  cublasHandle_t blas = nullptr;
  cudaStream_t compute = nullptr, comm = nullptr;
  float *weights = nullptr, *grads = nullptr, *acts = nullptr, *dy = nullptr, *dx = nullptr;
  // Per layer: [this GPU's 16-bit half for the peer | its 16-bit results], both sent from here;
  // the inbox has the same shape and is written by the peer.
  char *outbox = nullptr, *inbox = nullptr;
  cudaEvent_t ready[kLayers]{}, params[kLayers]{}, comm_done = nullptr, forward_go = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
};

struct Step {
  Gpu g[2];
  int gpus = 1, batch = 64;
  unsigned blocks = 198;

  Gpu& peer_of(int d) { return g[gpus == 2 ? 1 - d : d]; }
  char* out(int d, int l, int part) { return g[d].outbox + (2 * std::size_t(l) + part) * kHalf * 2; }
  char* in_peer(int d, int l, int part) { return peer_of(d).inbox + (2 * std::size_t(l) + part) * kHalf * 2; }
  char* in_own(int d, int l, int part) { return g[d].inbox + (2 * std::size_t(l) + part) * kHalf * 2; }
  const float4* grad(int d, int l, std::size_t half) {
    return reinterpret_cast<const float4*>(g[d].grads + l * kLayerElements + half * kHalf);
  }
  float4* param(int d, int l, std::size_t half) {
    return reinterpret_cast<float4*>(g[d].weights + l * kLayerElements + half * kHalf);
  }

  void scatter(int d, int l) {
    const cudaStream_t s = g[d].comm;
    narrow<<<blocks, kThreads, 0, s>>>(grad(d, l, 1), reinterpret_cast<uint2*>(out(d, l, 0)), kHalf / 4);
    store_words<<<blocks, kThreads, 0, s>>>(reinterpret_cast<const uint4*>(out(d, l, 0)),
                                            reinterpret_cast<uint4*>(in_peer(d, l, 0)), kHalf * 2 / 16);
    sum_update<<<blocks, kThreads, 0, s>>>(grad(d, l, 0), reinterpret_cast<const uint2*>(in_own(d, l, 0)),
                                           param(d, l, 0), reinterpret_cast<uint2*>(out(d, l, 1)), kHalf / 4);
    CHECK_CALL(cudaGetLastError());
  }
  void push(int d, int l) {
    store_words<<<blocks, kThreads, 0, g[d].comm>>>(reinterpret_cast<const uint4*>(out(d, l, 1)),
                                                    reinterpret_cast<uint4*>(in_peer(d, l, 1)), kHalf * 2 / 16);
    CHECK_CALL(cudaGetLastError());
  }
  void local(int d, int l) {
    decode_update<<<blocks, kThreads, 0, g[d].comm>>>(reinterpret_cast<const uint2*>(in_own(d, l, 1)), param(d, l, 1),
                                                      kHalf / 4);
    CHECK_CALL(cudaGetLastError());
  }

  void gemm(Gpu& G, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const float* a, int lda,
            const float* b, int ldb, float* c, int ldc) {
    const float one = 1.f, zero = 0.f;
    CHECK_CALL(cublasGemmEx(G.blas, ta, tb, m, n, k, &one, a, CUDA_R_32F, lda, b, CUDA_R_32F, ldb, &zero, c, CUDA_R_32F,
                            ldc, CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
  }

  void run(Mode mode) {
    for (int d = 0; d < gpus; ++d) {
      Gpu& G = g[d];
      CHECK_CALL(cudaSetDevice(d));
      const bool deferred = mode == kSplit || mode == kSplitLocal;
      if (mode == kFused) CHECK_CALL(cudaStreamWaitEvent(G.compute, G.comm_done));
      if (deferred) {
        // The last step's second halves, in the order forward needs them.
        CHECK_CALL(cudaEventRecord(G.forward_go, G.compute));
        CHECK_CALL(cudaStreamWaitEvent(G.comm, G.forward_go));
        for (int l = 0; l < kLayers; ++l) {
          if (mode == kSplit) push(d, l);
          local(d, l);
          CHECK_CALL(cudaEventRecord(G.params[l], G.comm));
        }
      }
      for (int l = 0; l < kLayers; ++l) {
        if (deferred) CHECK_CALL(cudaStreamWaitEvent(G.compute, G.params[l]));
        gemm(G, CUBLAS_OP_N, CUBLAS_OP_N, kWidth, batch, kWidth, G.weights + l * kLayerElements, kWidth,
             G.acts + std::size_t(l) * batch * kWidth, kWidth, G.acts + std::size_t(l + 1) * batch * kWidth, kWidth);
      }
      for (int l = kLayers - 1; l >= 0; --l) {
        gemm(G, CUBLAS_OP_N, CUBLAS_OP_T, kWidth, kWidth, batch, G.dy, kWidth, G.acts + std::size_t(l) * batch * kWidth,
             kWidth, G.grads + l * kLayerElements, kWidth);
        CHECK_CALL(cudaEventRecord(G.ready[l], G.compute));
        if (l > 0) {
          gemm(G, CUBLAS_OP_T, CUBLAS_OP_N, kWidth, batch, kWidth, G.weights + l * kLayerElements, kWidth, G.dy, kWidth,
               G.dx, kWidth);
        }
        if (mode == kNone) continue;
        CHECK_CALL(cudaStreamWaitEvent(G.comm, G.ready[l]));
        scatter(d, l);
        if (mode == kFused || mode == kSplitLocal) push(d, l);
        if (mode == kFused) local(d, l);
      }
      if (mode != kNone) CHECK_CALL(cudaEventRecord(G.comm_done, G.comm));
    }
  }

  void setup(int device, int count) {
    Gpu& G = g[device];
    CHECK_CALL(cudaSetDevice(device));
    if (count == 2) CHECK_CALL(cudaDeviceEnablePeerAccess(1 - device, 0));
    CHECK_CALL(cublasCreate(&G.blas));
    CHECK_CALL(cublasSetMathMode(G.blas, CUBLAS_TF32_TENSOR_OP_MATH));
    int lowest = 0, highest = 0;
    CHECK_CALL(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
    CHECK_CALL(cudaStreamCreateWithPriority(&G.compute, cudaStreamNonBlocking, lowest));
    CHECK_CALL(cudaStreamCreateWithPriority(&G.comm, cudaStreamNonBlocking, highest));
    CHECK_CALL(cublasSetStream(G.blas, G.compute));
    const auto zeroed = [](auto** p, std::size_t bytes) {
      CHECK_CALL(cudaMalloc(reinterpret_cast<void**>(p), bytes));
      CHECK_CALL(cudaMemset(*p, 0, bytes));
    };
    zeroed(&G.weights, kLayers * kLayerElements * 4);
    zeroed(&G.grads, kLayers * kLayerElements * 4);
    zeroed(&G.acts, std::size_t(batch) * kWidth * 4 * (kLayers + 1));
    zeroed(&G.dy, std::size_t(batch) * kWidth * 4);
    zeroed(&G.dx, std::size_t(batch) * kWidth * 4);
    zeroed(&G.outbox, kLayers * kLayerElements * 2);
    zeroed(&G.inbox, kLayers * kLayerElements * 2);
    for (auto& e : G.ready) CHECK_CALL(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    for (auto& e : G.params) CHECK_CALL(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CHECK_CALL(cudaEventCreateWithFlags(&G.comm_done, cudaEventDisableTiming));
    CHECK_CALL(cudaEventCreateWithFlags(&G.forward_go, cudaEventDisableTiming));
    CHECK_CALL(cudaEventCreate(&G.start));
    CHECK_CALL(cudaEventCreate(&G.stop));
  }

  void synchronize_all() {
    for (int d = 0; d < gpus; ++d) {
      CHECK_CALL(cudaSetDevice(d));
      CHECK_CALL(cudaDeviceSynchronize());
    }
  }
};

/// "64,256" as {64, 256}; empty where an entry is not a whole number from 1 to 4096.
std::vector<int> parse_list(const char* text) {
  std::vector<int> out;
  for (const char* p = text;;) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v < 1 || v > 4096 || (*end != ',' && *end != '\0')) return {};
    out.push_back(static_cast<int>(v));
    if (*end == '\0') return out;
    p = end + 1;
  }
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int> batches = parse_list(argc > 1 ? argv[1] : "64,256");
  const std::vector<int> block_list = parse_list(argc > 2 ? argv[2] : "198");
  if (batches.empty() || block_list.size() != 1 || argc > 3) {
    std::fprintf(stderr, "bench_split_step: usage: %s [batches per GPU, 1..4096, comma-separated] [blocks, 1..4096]\n",
                 argv[0]);
    return 2;
  }
  Step step;
  step.blocks = static_cast<unsigned>(block_list[0]);
  step.batch = *std::max_element(batches.begin(), batches.end());  // what the buffers hold
  int visible = 0;
  CHECK_CALL(cudaGetDeviceCount(&visible));
  step.gpus = visible >= 2 ? 2 : 1;
  if (step.gpus == 1) std::printf("one GPU: it stores into its own memory (a smoke test, not a measurement)\n");
  for (int d = 0; d < step.gpus; ++d) step.setup(d, step.gpus);
  for (int batch : batches) {
    step.batch = batch;
    for (int round = 0; round < 2; ++round) {
      for (int m = 0; m < kModes; ++m) {
        const auto mode = static_cast<Mode>(m);
        for (int i = 0; i < 10; ++i) step.run(mode);
        step.synchronize_all();
        CHECK_CALL(cudaSetDevice(0));
        CHECK_CALL(cudaEventRecord(step.g[0].start, step.g[0].compute));
        for (int i = 0; i < 30; ++i) step.run(mode);
        CHECK_CALL(cudaSetDevice(0));
        // The step is over when GPU 0's compute and comm streams are (a deferred half runs on).
        CHECK_CALL(cudaStreamWaitEvent(step.g[0].compute, step.g[0].comm_done));
        CHECK_CALL(cudaEventRecord(step.g[0].stop, step.g[0].compute));
        CHECK_CALL(cudaEventSynchronize(step.g[0].stop));
        float ms = 0;
        CHECK_CALL(cudaEventElapsedTime(&ms, step.g[0].start, step.g[0].stop));
        std::printf("gpus %d batch %d blocks %u round %d %-18s step %.3f ms\n", step.gpus, batch, step.blocks, round,
                    kModeNames[m], ms / 30);
        step.synchronize_all();
      }
    }
  }
  return 0;
}
