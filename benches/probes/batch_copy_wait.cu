// Probe (not project code, session 67): does a copy queued with cuMemcpyBatchAsync (how
// pinlane copies page-locked sources of 64 KiB and more straight from their memory) wait
// for another stream's host function, as host functions of independent streams do (the
// driver runs them one at a time)? tests/gpu_no_foreign_waits.rs saw a copy into existing
// tensors from page-locked memory take 2949 ms behind another stream's 3 s host function
// in one process of two, with every step that used no batched copy fast.
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o batch_copy_wait batch_copy_wait.cu -lcuda && ./batch_copy_wait
// Each row: a 1 MiB host-to-device copy on an idle stream of its own, queued and
// synchronised, timed while another stream runs a 500 ms host function (or on an idle
// device): cuMemcpyHtoDAsync and cuMemcpyBatchAsync, from cuMemHostAlloc memory and from
// memory registered device-mapped.
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include "probe.h"

static void CUDA_CB sleep_500ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(500)); }

static double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main() {
  primary_device0();
  CUstream busy, s;
  CK(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t n = 1 << 20;
  void* pinned = nullptr;
  CK(cuMemHostAlloc(&pinned, n, CU_MEMHOSTALLOC_PORTABLE));
  memset(pinned, 1, n);
  void* reg = aligned_alloc(4096, n);
  memset(reg, 2, n);
  CK(cuMemHostRegister(reg, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
  CUdeviceptr d;
  CK(cuMemAlloc(&d, n));
  auto plain = [&](void* src) { CK(cuMemcpyHtoDAsync(d, src, n, s)); };
  auto batched = [&](void* src) {
    CUdeviceptr dsts[1] = {d};
    CUdeviceptr srcs[1] = {(CUdeviceptr)src};
    size_t sizes[1] = {n};
    CUmemcpyAttributes attr;
    memset(&attr, 0, sizeof attr);
    attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
    attr.srcLocHint.type = CU_MEM_LOCATION_TYPE_HOST;
    attr.dstLocHint.type = CU_MEM_LOCATION_TYPE_DEVICE;
    attr.dstLocHint.id = 0;
    size_t idx[1] = {0};
    CK(cuMemcpyBatchAsync(dsts, srcs, sizes, 1, &attr, idx, 1, s));
  };
  // Behind the host function first: the first batched copy of the process may differ.
  const char* loads[] = {"host function", "idle"};
  for (const char* how : loads) {
    for (int rep = 0; rep < 3; rep++) {
      double t[4];
      int k = 0;
      for (int way = 0; way < 2; way++) {
        for (void* src : {pinned, reg}) {
          if (how[0] == 'h') {
            CK(cuLaunchHostFunc(busy, sleep_500ms, nullptr));
            std::this_thread::sleep_for(std::chrono::milliseconds(20));  // it has started
          }
          auto t0 = std::chrono::steady_clock::now();
          if (way == 0) plain(src); else batched(src);
          CK(cuStreamSynchronize(s));
          t[k++] = ms_since(t0);
          CK(cuStreamSynchronize(busy));
        }
      }
      printf("%-14s rep %d: cuMemcpyHtoDAsync from cuMemHostAlloc %8.3f ms, from a registration "
             "%8.3f ms; cuMemcpyBatchAsync from cuMemHostAlloc %8.3f ms, from a registration "
             "%8.3f ms\n", how, rep, t[0], t[1], t[2], t[3]);
      fflush(stdout);
    }
  }
  return 0;
}
