// bench_symmetric_windows: does registering a buffer as an NCCL symmetric window
// (ncclMemAlloc + ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC)) make NCCL's float32
// all-reduce faster, and at which sizes (docs/performance.md, "Symmetric windows")? A fused
// buffer decides where its buckets live, so a bucket could be registered where it pays.
//
// One thread per visible GPU (all in one process, so nothing to launch), one NCCL communicator
// per GPU, and for each size, side by side: ncclAllReduce in float32 on a cudaMalloc buffer,
// the same on a registered symmetric window, and ncclAllReduce in float16 alone (what a codec's
// wire could give, casts excluded), plain and registered.
//
// Run: build/bench/bench_symmetric_windows [--iters N] [MiB ...] [--gpt2]
// (sizes in MiB of float32; default: 2 8 25 100 and GPT-2 small's 124439808 parameters).
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nccl.h>

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
  std::fprintf(stderr, "bench_symmetric_windows:%d: %s: %s\n", line, what, detail);
  std::exit(1);
}
#define CUDA(x)                                                       \
  do {                                                                \
    cudaError_t e_ = (x);                                             \
    if (e_ != cudaSuccess) die(#x, cudaGetErrorString(e_), __LINE__); \
  } while (0)
#define NCCL(x)                                                       \
  do {                                                                \
    ncclResult_t r_ = (x);                                            \
    if (r_ != ncclSuccess) die(#x, ncclGetErrorString(r_), __LINE__); \
  } while (0)

struct Shared {
  int world = 0;
  int iters = 40;
  ncclUniqueId id{};
  std::vector<std::size_t> elements;
  std::vector<std::vector<double>> ms;  // [size][row], rank 0's
};

const char* const kRows[] = {"fp32", "fp32 window", "fp16", "fp16 window"};
constexpr int kRowCount = 4;

template <class F>
double median_ms(cudaStream_t s, int iters, F&& f) {
  for (int i = 0; i < 5; ++i) f();
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

void rank_main(int rank, Shared& shared) {
  CUDA(cudaSetDevice(rank));
  cudaStream_t s;
  CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ncclComm_t comm;
  NCCL(ncclCommInitRank(&comm, shared.world, shared.id, rank));
  const std::size_t max_n = *std::max_element(shared.elements.begin(), shared.elements.end());
  const std::size_t bytes = (max_n * sizeof(float) + 4095) / 4096 * 4096;
  void* plain = nullptr;
  CUDA(cudaMalloc(&plain, bytes));
  CUDA(cudaMemset(plain, 0, bytes));
  void* symmetric = nullptr;
  NCCL(ncclMemAlloc(&symmetric, bytes));
  CUDA(cudaMemset(symmetric, 0, bytes));
  ncclWindow_t window;
  NCCL(ncclCommWindowRegister(comm, symmetric, bytes, &window, NCCL_WIN_COLL_SYMMETRIC));
  for (std::size_t si = 0; si < shared.elements.size(); ++si) {
    const std::size_t n = shared.elements[si];
    std::vector<double> ms(kRowCount);
    int row = 0;
    for (ncclDataType_t type : {ncclFloat, ncclHalf}) {
      for (void* buffer : {plain, symmetric}) {
        ms[row++] = median_ms(s, shared.iters, [&] { NCCL(ncclAllReduce(buffer, buffer, n, type, ncclSum, comm, s)); });
      }
    }
    if (rank == 0) shared.ms[si] = ms;
  }
  CUDA(cudaStreamSynchronize(s));
  NCCL(ncclCommWindowDeregister(comm, window));
  NCCL(ncclMemFree(symmetric));
  CUDA(cudaFree(plain));
  NCCL(ncclCommDestroy(comm));
}

}  // namespace

int main(int argc, char** argv) {
  Shared shared;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) {
      shared.iters = std::atoi(argv[++i]);
    } else if (a == "--gpt2") {
      shared.elements.push_back(124439808);
    } else if (!a.empty() && a[0] != '-' && std::atof(a.c_str()) > 0) {
      shared.elements.push_back(static_cast<std::size_t>(std::atof(a.c_str()) * (1 << 20) / 4));
    } else {
      die("arguments", ("unknown argument " + a + "; see the comment at the top of bench_symmetric_windows.cu").c_str(),
          __LINE__);
    }
  }
  if (shared.iters < 1) die("arguments", "--iters must be at least 1", __LINE__);
  if (shared.elements.empty()) {
    for (double mib : {2.0, 8.0, 25.0, 100.0}) shared.elements.push_back(static_cast<std::size_t>(mib * (1 << 20) / 4));
    shared.elements.push_back(124439808);
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) {
    std::printf("SKIPPED: needs 2 or more GPUs\n");
    return 77;
  }
  shared.world = devices;
  NCCL(ncclGetUniqueId(&shared.id));
  shared.ms.resize(shared.elements.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < devices; ++r) threads.emplace_back(rank_main, r, std::ref(shared));
  for (auto& t : threads) t.join();

  cudaDeviceProp prop{};
  CUDA(cudaGetDeviceProperties(&prop, 0));
  int version = 0;
  NCCL(ncclGetVersion(&version));
  std::printf(
      "# bench_symmetric_windows: %d x %s, NCCL %d, all_reduce sum, median of %d calls, ms "
      "(x: time on a cudaMalloc buffer / on the window)\n",
      devices, prop.name, version, shared.iters);
  std::printf("%10s", "MiB fp32");
  for (const char* r : kRows) std::printf(" | %18s", r);
  std::printf("\n");
  for (std::size_t si = 0; si < shared.elements.size(); ++si) {
    std::printf("%10.1f", static_cast<double>(shared.elements[si]) * 4 / (1 << 20));
    const auto& m = shared.ms[si];
    std::printf(" | %18.3f | %8.3f (%5.2fx) | %18.3f | %8.3f (%5.2fx)\n", m[0], m[1], m[0] / m[1], m[2], m[3],
                m[2] / m[3]);
  }
  return 0;
}
