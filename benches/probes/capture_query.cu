// Probe (not project code, session 65): what pinlane's capture check costs and what it
// answers. Every call that uses a caller's non-legacy stream (a copy stream given, a
// current stream set, a consumer stream) asks cuStreamIsCapturing once for it.
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o capture_query capture_query.cu -lcuda && ./capture_query
// Each timed row: 100 calls per timed iteration, median (and 10th percentile) of 3000
// iterations after 300 warm-up ones, printed per call.
#include <cuda.h>
#include <cstdio>
#include "probe.h"

static const char* status(CUstreamCaptureStatus s) {
  switch (s) {
    case CU_STREAM_CAPTURE_STATUS_NONE: return "NONE";
    case CU_STREAM_CAPTURE_STATUS_ACTIVE: return "ACTIVE";
    case CU_STREAM_CAPTURE_STATUS_INVALIDATED: return "INVALIDATED";
  }
  return "?";
}

int main() {
  primary_device0();
  CUstream s, other;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUstreamCaptureStatus st;
  const int k = 100;
  printf("cuStreamIsCapturing, per call (%d calls per timed iteration)\n", k);
  auto per_call = [&](const char* label, CUstream q) {
    for (int i = 0; i < 300; i++) CK(cuStreamIsCapturing(q, &st));
    std::vector<double> v(3000);
    for (auto& x : v) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < k; i++) CK(cuStreamIsCapturing(q, &st));
      x = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / k;
    }
    std::sort(v.begin(), v.end());
    printf("%-60s median %6.3f us  p10 %6.3f us  (answer %s)\n", label, v[1500], v[300], status(st));
  };
  per_call("an idle non-blocking stream", s);
  CUdeviceptr d;
  CK(cuMemAlloc(&d, 64 << 20));
  void* h;
  CK(cuMemHostAlloc(&h, 64 << 20, 0));
  CK(cuMemcpyHtoDAsync(d, h, 64 << 20, s));
  per_call("a non-blocking stream with a 64 MiB copy queued", s);
  CK(cuStreamSynchronize(s));
  CK(cuStreamBeginCapture(other, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL));
  per_call("a stream capturing (thread-local mode)", other);
  per_call("another stream while one captures", s);
  CUgraph g;
  CK(cuStreamEndCapture(other, &g));
  CK(cuGraphDestroy(g));
  per_call("the stream after its capture ended", other);
  return 0;
}
