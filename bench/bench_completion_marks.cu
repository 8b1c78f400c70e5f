// bench_completion_marks: why the NCCL communicator tracks each collective with a
// cudaEventRecord issued by the calling thread (docs/performance.md, "Host cost per NCCL call").
//
// 1. Host cost of the ways to mark a point on a stream that a watchdog thread could poll:
//    cudaEventRecord, cuStreamWriteValue32 into mapped host memory, cudaLaunchHostFunc; and of
//    the capture queries (cudaStreamIsCapturing, cudaStreamGetCaptureInfo). Median over 15
//    batches of 256 calls, the stream synchronised between batches (not timed).
// 2. Whether a second thread could mark completion instead (taking the event off the issuing
//    thread's path): it records an event into a stream that the first thread is capturing into
//    a CUDA graph, in relaxed mode, and we see what happens to the capture.
//
// 3. With two GPUs visible: the host cost of those calls on GPU 1's stream while GPU 0 is
//    current (one thread driving several GPUs), and of switching devices around them.
// 4. The same record and capture query through the driver API (cuEventRecord,
//    cuStreamIsCapturing, as ncclkit's issue path resolves them) against the runtime's
//    wrappers, alone and after a kernel launch, on the current GPU's stream and on GPU 1's.
//
// One or two GPUs, no NCCL. Run: build/bench/bench_completion_marks
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "ncclkit/nccl/detail/driver_calls.hpp"

#define CK(x)                                                                                             \
  do {                                                                                                    \
    cudaError_t e_ = (x);                                                                                 \
    if (e_ != cudaSuccess) std::printf("%s:%d %s -> %s\n", __FILE__, __LINE__, #x, cudaGetErrorName(e_)); \
  } while (0)

__global__ void tiny(int* p) {
  if (p) *p += 1;
}

using Clock = std::chrono::steady_clock;

cudaStream_t g_stream;
template <class F>
double per_call_ns(F&& f, int n = 4096) {
  std::vector<double> samples;
  for (int r = 0; r < 15; ++r) {
    auto t0 = Clock::now();
    for (int i = 0; i < n / 16; ++i) f();
    auto t1 = Clock::now();
    cudaStreamSynchronize(g_stream);
    samples.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / (n / 16));
  }
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("SKIPPED: no GPU visible\n");
    return 77;
  }
  CK(cudaSetDevice(0));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t ev;
  CK(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  std::vector<cudaEvent_t> pool(4096);
  for (auto& e : pool) CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  unsigned* host_flag = nullptr;
  CK(cudaHostAlloc(&host_flag, 4096, cudaHostAllocMapped));
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q{};
  CK(cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &fn, 12000, cudaEnableDefault, &q));
  auto write_value = reinterpret_cast<CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned)>(fn);
  unsigned* device_view = nullptr;
  CK(cudaHostGetDevicePointer(reinterpret_cast<void**>(&device_view), host_flag, 0));

  // The very entry points the issue path uses (ncclkit/nccl/detail/driver_calls.hpp).
  const auto cu_record = ncclkit::nccl::detail::driver_calls().event_record;
  const auto cu_capturing = ncclkit::nccl::detail::driver_calls().stream_is_capturing;
  if (cu_record == nullptr || cu_capturing == nullptr) {
    std::printf("the driver entry points are missing: no driver rows\n");
    return 1;
  }
  CUstreamCaptureStatus cu_status;
  auto cu_check = [](CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) std::printf("%s -> CUresult %d\n", what, static_cast<int>(r));
  };

  g_stream = s;
  int k = 0;
  std::printf("host ns per call (median of 15 batches of 256):\n");
  std::printf("  tiny kernel launch           %8.1f\n", per_call_ns([&] { tiny<<<1, 1, 0, s>>>(nullptr); }));
  std::printf("  kernel + cudaEventRecord     %8.1f\n", per_call_ns([&] {
                tiny<<<1, 1, 0, s>>>(nullptr);
                CK(cudaEventRecord(pool[k++ % 4096], s));
              }));
  std::printf("  kernel + cuStreamWriteValue32%8.1f\n", per_call_ns([&] {
                tiny<<<1, 1, 0, s>>>(nullptr);
                if (write_value(s, reinterpret_cast<CUdeviceptr>(device_view), 7, 0) != CUDA_SUCCESS)
                  std::printf("wv fail\n");
              }));
  std::printf("  cudaEventRecord, one event   %8.1f\n", per_call_ns([&] { CK(cudaEventRecord(ev, s)); }));
  std::printf("  cudaEventRecord, event pool  %8.1f\n", per_call_ns([&] { CK(cudaEventRecord(pool[k++ % 4096], s)); }));
  unsigned value = 0;
  std::printf("  cuStreamWriteValue32 (host)  %8.1f\n", per_call_ns([&] {
                if (write_value(s, reinterpret_cast<CUdeviceptr>(device_view), ++value, 0) != CUDA_SUCCESS)
                  std::printf("wv fail\n");
              }));
  cudaStreamCaptureStatus status;
  std::printf("  cudaStreamIsCapturing        %8.1f\n", per_call_ns([&] { CK(cudaStreamIsCapturing(s, &status)); }));
  unsigned long long id = 0;
  std::printf("  cudaStreamGetCaptureInfo     %8.1f\n",
              per_call_ns([&] { CK(cudaStreamGetCaptureInfo(s, &status, &id)); }));
  std::printf("  cudaEventQuery (pending)     %8.1f\n", per_call_ns([&] { (void)cudaEventQuery(ev); }));
  std::printf("  cudaLaunchHostFunc           %8.1f\n", per_call_ns(
                                                            [&] {
                                                              CK(cudaLaunchHostFunc(
                                                                  s, [](void*) {}, nullptr));
                                                            },
                                                            512));
  CK(cudaStreamSynchronize(s));
  (void)cudaGetLastError();

  std::printf("runtime against driver, host ns per call (median of 15 batches of 256):\n");
  for (int round = 0; round < 2; ++round) {
    std::printf("  record one event: cudaEventRecord %8.1f  cuEventRecord %8.1f\n",
                per_call_ns([&] { CK(cudaEventRecord(ev, s)); }),
                per_call_ns([&] { cu_check(cu_record(ev, s), "cuEventRecord"); }));
    std::printf("  capture query: cudaStreamIsCapturing %8.1f  cuStreamIsCapturing %8.1f\n",
                per_call_ns([&] { CK(cudaStreamIsCapturing(s, &status)); }),
                per_call_ns([&] { cu_check(cu_capturing(s, &cu_status), "cuStreamIsCapturing"); }));
    std::printf("  kernel + query + record (pool): runtime %8.1f  driver %8.1f\n", per_call_ns([&] {
                  tiny<<<1, 1, 0, s>>>(nullptr);
                  CK(cudaStreamIsCapturing(s, &status));
                  CK(cudaEventRecord(pool[k++ % 4096], s));
                }),
                per_call_ns([&] {
                  tiny<<<1, 1, 0, s>>>(nullptr);
                  cu_check(cu_capturing(s, &cu_status), "cuStreamIsCapturing");
                  cu_check(cu_record(pool[k++ % 4096], s), "cuEventRecord");
                }));
  }

  // Capture semantics: thread A captures s2 in global mode; thread B (relaxed) records an event
  // into s2 and queries it.
  cudaStream_t s2;
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  int* counter = nullptr;
  CK(cudaMalloc(&counter, sizeof(int)));
  CK(cudaMemset(counter, 0, sizeof(int)));
  CK(cudaStreamBeginCapture(s2, cudaStreamCaptureModeGlobal));
  tiny<<<1, 1, 0, s2>>>(counter);
  std::thread other([&] {
    CK(cudaSetDevice(0));
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    CK(cudaThreadExchangeStreamCaptureMode(&mode));
    cudaError_t r = cudaEventRecord(ev, s2);
    std::printf("other thread: cudaEventRecord into a capturing stream -> %s\n", cudaGetErrorName(r));
    (void)cudaGetLastError();
    cudaError_t qr = cudaEventQuery(ev);
    std::printf("other thread: cudaEventQuery of that event -> %s\n", cudaGetErrorName(qr));
    (void)cudaGetLastError();
  });
  other.join();
  tiny<<<1, 1, 0, s2>>>(counter);
  cudaGraph_t graph = nullptr;
  cudaError_t end = cudaStreamEndCapture(s2, &graph);
  std::printf("end capture -> %s\n", cudaGetErrorName(end));
  (void)cudaGetLastError();
  if (graph) {
    size_t nodes = 0;
    CK(cudaGraphGetNodes(graph, nullptr, &nodes));
    std::printf("graph nodes: %zu (2 kernels expected)\n", nodes);
    cudaGraphExec_t exec;
    cudaError_t ir = cudaGraphInstantiate(&exec, graph, 0);
    std::printf("instantiate -> %s\n", cudaGetErrorName(ir));
    if (ir == cudaSuccess) {
      CK(cudaGraphLaunch(exec, s2));
      CK(cudaStreamSynchronize(s2));
      int h = 0;
      CK(cudaMemcpy(&h, counter, sizeof(int), cudaMemcpyDeviceToHost));
      std::printf("graph ran: counter %d (2 expected)\n", h);
    }
  }
  cudaError_t qr = cudaEventQuery(ev);
  std::printf("main: cudaEventQuery of the event after capture -> %s\n", cudaGetErrorName(qr));

  // 3. One thread driving several GPUs (LocalGroup): what the calls on GPU 1's stream cost
  //    while GPU 0 is current, against GPU 1 current, and what switching there and back costs.
  if (devices >= 2) {
    cudaStream_t s1;
    cudaEvent_t ev1;
    CK(cudaSetDevice(1));
    CK(cudaStreamCreateWithFlags(&s1, cudaStreamNonBlocking));
    CK(cudaEventCreateWithFlags(&ev1, cudaEventDisableTiming));
    g_stream = s1;
    std::printf("GPU 1's stream, host ns per call (median of 15 batches of 256):\n");
    for (int current : {1, 0}) {
      CK(cudaSetDevice(current));
      std::printf("  GPU %d current: cudaEventRecord %8.1f, cudaStreamIsCapturing %8.1f, tiny kernel launch %8.1f\n",
                  current, per_call_ns([&] { CK(cudaEventRecord(ev1, s1)); }),
                  per_call_ns([&] { CK(cudaStreamIsCapturing(s1, &status)); }),
                  current == 1 ? per_call_ns([&] { tiny<<<1, 1, 0, s1>>>(nullptr); }) : 0.0);
    }
    CK(cudaSetDevice(0));
    int was = -1;
    std::printf("  switch to GPU 1 and back (cudaGetDevice + 2 cudaSetDevice) %8.1f\n", per_call_ns([&] {
                  CK(cudaGetDevice(&was));
                  CK(cudaSetDevice(1));
                  CK(cudaSetDevice(was));
                }));
    std::printf(
        "  the same around cudaEventRecord + cudaStreamIsCapturing on GPU 1  %8.1f (without the switch %8.1f)\n",
        per_call_ns([&] {
          CK(cudaGetDevice(&was));
          CK(cudaSetDevice(1));
          CK(cudaStreamIsCapturing(s1, &status));
          CK(cudaEventRecord(ev1, s1));
          CK(cudaSetDevice(was));
        }),
        per_call_ns([&] {
          CK(cudaStreamIsCapturing(s1, &status));
          CK(cudaEventRecord(ev1, s1));
        }));
    std::printf("  GPU 0 current, driver: cuEventRecord %8.1f, cuStreamIsCapturing %8.1f (runtime: %8.1f, %8.1f)\n",
                per_call_ns([&] { cu_check(cu_record(ev1, s1), "cuEventRecord on GPU 1's stream"); }),
                per_call_ns([&] { cu_check(cu_capturing(s1, &cu_status), "cuStreamIsCapturing on GPU 1's stream"); }),
                per_call_ns([&] { CK(cudaEventRecord(ev1, s1)); }),
                per_call_ns([&] { CK(cudaStreamIsCapturing(s1, &status)); }));
  }
  std::printf("done\n");
  return 0;
}
