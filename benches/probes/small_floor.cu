// Probe (not project code): the driver's own floor for one small transfer, each way,
// with nothing of pinlane or torch around it. Bounds what any library's whole call for
// one 1 KiB tensor can take (issue 20: Rust <= 8 us a call; Python >= 1.25x torch).
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o small_floor small_floor.cu -lcuda && ./small_floor [bytes]
// Each row: median (and 10th percentile) of 3000 timed iterations after 300 warm-up ones,
// one thread, a non-blocking stream of its own, the primary context.
#include <cuda.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include "probe.h"

int main(int argc, char** argv) {
  size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : 1024;
  CUdevice dev = primary_device0();
  CUstream s, other;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  void* pinned;
  CK(cuMemHostAlloc(&pinned, 1 << 20, 0));
  std::vector<unsigned char> pageable(1 << 20, 7);
  memset(pinned, 3, 1 << 20);
  CUdeviceptr d;
  CK(cuMemAlloc(&d, 1 << 20));
  CUmemoryPool pool;
  CK(cuDeviceGetDefaultMemPool(&pool, dev));
  printf("one copy of %zu bytes, one thread, median of 3000\n", n);

  row("empty: cuStreamSynchronize of an idle stream", [&] { CK(cuStreamSynchronize(s)); });
  row("cuEventRecord on one stream + cuStreamWaitEvent on another", [&] {
    CK(cuEventRecord(ev, other));
    CK(cuStreamWaitEvent(s, ev, 0));
  });
  row("cuMemAllocFromPoolAsync + cuMemFreeAsync (no sync)", [&] {
    CUdeviceptr p;
    CK(cuMemAllocFromPoolAsync(&p, n, pool, s));
    CK(cuMemFreeAsync(p, s));
  });
  row("H2D: cuMemcpyHtoDAsync from page-locked + cuStreamSynchronize", [&] {
    CK(cuMemcpyHtoDAsync(d, pinned, n, s));
    CK(cuStreamSynchronize(s));
  });
  row("H2D: memcpy into page-locked, cuMemcpyHtoDAsync + cuStreamSynchronize", [&] {
    memcpy(pinned, pageable.data(), n);
    CK(cuMemcpyHtoDAsync(d, pinned, n, s));
    CK(cuStreamSynchronize(s));
  });
  row("H2D: cuMemcpyHtoDAsync from pageable + cuStreamSynchronize", [&] {
    CK(cuMemcpyHtoDAsync(d, pageable.data(), n, s));
    CK(cuStreamSynchronize(s));
  });
  row("H2D: + event record/wait before, pool alloc/free around (a whole call's driver work)", [&] {
    CUdeviceptr p;
    CK(cuEventRecord(ev, other));
    CK(cuStreamWaitEvent(s, ev, 0));
    CK(cuMemAllocFromPoolAsync(&p, n, pool, s));
    memcpy(pinned, pageable.data(), n);
    CK(cuMemcpyHtoDAsync(p, pinned, n, s));
    CK(cuStreamSynchronize(s));
    CK(cuMemFreeAsync(p, s));
  });
  row("D2H: cuMemcpyDtoHAsync into page-locked + cuStreamSynchronize", [&] {
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
    CK(cuStreamSynchronize(s));
  });
  row("D2H: cuMemcpyDtoHAsync into pageable + cuStreamSynchronize", [&] {
    CK(cuMemcpyDtoHAsync(pageable.data(), d, n, s));
    CK(cuStreamSynchronize(s));
  });
  row("D2H: event record/wait, cuMemcpyDtoHAsync into page-locked + sync", [&] {
    CK(cuEventRecord(ev, other));
    CK(cuStreamWaitEvent(s, ev, 0));
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
    CK(cuStreamSynchronize(s));
  });
  row("D2H: into page-locked on the producer's stream itself + sync (no event)", [&] {
    CK(cuMemcpyDtoHAsync(pinned, d, n, other));
    CK(cuStreamSynchronize(other));
  });
  return 0;
}
