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
// Then: while another thread is inside cuMemHostUnregister (which waits for the device:
// session 66), are this thread's driver calls held too? A copy on a stream of its own and
// its synchronisation, an event query, a stream made and destroyed, each timed.
#include <cuda.h>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <atomic>
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
  CUcontext ctx;
  CK(cuCtxGetCurrent(&ctx));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CK(cuEventRecord(ev, s));
  CK(cuStreamSynchronize(s));
  for (int rep = 0; rep < 3; rep++) {
    void* m = aligned_alloc(4096, n);
    CK(cuMemHostRegister(m, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
    CK(cuLaunchHostFunc(busy, sleep_500ms, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<bool> inside{false};
    double unreg = 0;
    std::thread other([&] {
      CK(cuCtxSetCurrent(ctx));
      inside.store(true);
      auto t0 = std::chrono::steady_clock::now();
      CK(cuMemHostUnregister(m));
      unreg = ms_since(t0);
    });
    while (!inside.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));  // it is inside the driver
    auto t0 = std::chrono::steady_clock::now();
    CK(cuMemcpyHtoDAsync(d, pinned, n, s));
    CK(cuStreamSynchronize(s));
    double copy = ms_since(t0);
    auto t1 = std::chrono::steady_clock::now();
    CK(cuEventQuery(ev));
    double query = ms_since(t1);
    auto t2 = std::chrono::steady_clock::now();
    CUstream tmp;
    CK(cuStreamCreate(&tmp, CU_STREAM_NON_BLOCKING));
    CK(cuStreamDestroy(tmp));
    double stream = ms_since(t2);
    other.join();
    CK(cuStreamSynchronize(busy));
    free(m);
    printf("rep %d: another thread's cuMemHostUnregister %8.3f ms; meanwhile here a 1 MiB copy "
           "and its synchronisation %8.3f ms, cuEventQuery %8.3f ms, a stream made and "
           "destroyed %8.3f ms\n", rep, unreg, copy, query, stream);
    fflush(stdout);
  }
  // The same with cuMemFreeHost in the other thread (added after run 6, not run yet): does
  // a free on pinlane's free thread hold the other threads' copies as an unregister does?
  for (int rep = 0; rep < 3; rep++) {
    void* h = nullptr;
    CK(cuMemHostAlloc(&h, n, CU_MEMHOSTALLOC_PORTABLE));
    CK(cuLaunchHostFunc(busy, sleep_500ms, nullptr));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<bool> inside{false};
    double freed = 0;
    std::thread other([&] {
      CK(cuCtxSetCurrent(ctx));
      inside.store(true);
      auto t0 = std::chrono::steady_clock::now();
      CK(cuMemFreeHost(h));
      freed = ms_since(t0);
    });
    while (!inside.load()) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto t0 = std::chrono::steady_clock::now();
    CK(cuMemcpyHtoDAsync(d, pinned, n, s));
    CK(cuStreamSynchronize(s));
    double copy = ms_since(t0);
    other.join();
    CK(cuStreamSynchronize(busy));
    printf("rep %d: another thread's cuMemFreeHost %8.3f ms; meanwhile here a 1 MiB copy and "
           "its synchronisation %8.3f ms\n", rep, freed, copy);
    fflush(stdout);
  }
  return 0;
}
