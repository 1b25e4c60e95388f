// Probe (not project code, session 64): what ordering a D2H copy after the caller's
// current stream costs, by an event (cuEventRecord on the current stream, cuStreamWaitEvent
// on the copy stream: what pinlane did) against asking the current stream whether it is
// idle (cuStreamQuery: when it is, everything queued on it has run, and there is nothing
// to wait for), and whether the query answers for what the event would have waited for.
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o order_query order_query.cu -lcuda && ./order_query
// Each timed row: median (and 10th percentile) of 3000 iterations after 300 warm-up ones,
// one thread, the primary context, 1 KiB from the device into page-locked memory on a
// non-blocking copy stream of its own, synchronised.
#include <cuda.h>
#include <cuda_runtime.h>
#include <cstdio>
#include "probe.h"

__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

static const char* name(CUresult r) {
  const char* s = nullptr;
  cuGetErrorName(r, &s);
  return s ? s : "?";
}

int main() {
  const size_t n = 1024;
  primary_device0();
  CUstream copy, other, blocking;
  CK(cuStreamCreate(&copy, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  CUstream legacy = CU_STREAM_LEGACY;
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  void* pinned;
  CK(cuMemHostAlloc(&pinned, 1 << 20, 0));
  CUdeviceptr d;
  CK(cuMemAlloc(&d, 1 << 20));
  CK(cuMemsetD8(d, 5, 1 << 20));
  CK(cuCtxSynchronize());

  // What each answer says while a kernel of about 20 ms runs on one stream.
  const long long cycles = 40000000;  // 20 ms at 2 GHz
  struct {
    const char* where;
    CUstream s;
  } busy[] = {{"the legacy stream", legacy}, {"a blocking stream", blocking},
              {"a non-blocking stream", other}, {"nothing", nullptr}};
  for (auto& b : busy) {
    if (b.s != nullptr) spin<<<1, 1, 0, (cudaStream_t)b.s>>>(cycles);
    CUresult q_legacy = cuStreamQuery(legacy);
    CK(cuEventRecord(ev, legacy));
    CUresult e_legacy = cuEventQuery(ev);
    CUresult q_other = cuStreamQuery(other);
    printf("kernel running on %-22s: cuStreamQuery(legacy) %-20s event recorded on legacy %-20s "
           "cuStreamQuery(non-blocking) %s\n",
           b.where, name(q_legacy), name(e_legacy), name(q_other));
    CK(cuCtxSynchronize());
    if (cudaGetLastError() != cudaSuccess) {
      printf("ERR the spin kernel's launch\n");
      return 1;
    }
  }

  auto d2h = [&] {
    CK(cuMemcpyDtoHAsync(pinned, d, n, copy));
    CK(cuStreamSynchronize(copy));
  };
  printf("one D2H copy of %zu bytes into page-locked memory, median of 3000\n", n);
  row("the copy and its synchronisation, no ordering", d2h);
  for (auto cur : {legacy, other}) {
    const char* w = cur == legacy ? "legacy" : "non-blocking";
    char label[128];
    snprintf(label, sizeof label, "ordered by an event on the %s current stream", w);
    row(label, [&] {
      CK(cuEventRecord(ev, cur));
      CK(cuStreamWaitEvent(copy, ev, 0));
      d2h();
    });
    snprintf(label, sizeof label, "ordered by cuStreamQuery of the idle %s stream", w);
    row(label, [&] {
      CUresult r = cuStreamQuery(cur);
      if (r != CUDA_SUCCESS) {
        CK(cuEventRecord(ev, cur));
        CK(cuStreamWaitEvent(copy, ev, 0));
      }
      d2h();
    });
    snprintf(label, sizeof label, "alone: cuEventRecord + cuStreamWaitEvent (%s)", w);
    row(label, [&] {
      CK(cuEventRecord(ev, cur));
      CK(cuStreamWaitEvent(copy, ev, 0));
    });
    snprintf(label, sizeof label, "alone: cuStreamQuery of the idle %s stream", w);
    row(label, [&] { CK(cuStreamQuery(cur)); });
  }
  return 0;
}
