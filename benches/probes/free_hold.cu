// Probe (not project code, session 68): while another thread is inside cuMemFreeHost or
// cuMemHostUnregister (both wait for the device's queued work), are this thread's copies
// held? Session 67's batch_copy_wait.cu found a 1 MiB H2D copy held 475 ms behind an
// unregister, and (session 68, run 1) behind a free, with the device busy in a 500 ms
// host function. tests/gpu_no_foreign_waits.rs, where pinlane's free thread frees an
// evicted output block while a host function runs, passed with its later steps fast.
// This probe asks whether the hold depends on what keeps the device busy: a host
// function, or a kernel that spins 500 ms (what a user's other stream usually runs).
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o free_hold free_hold.cu -lcuda && ./free_hold
// Each row: the other thread's call time; this thread's 1 MiB H2D (from cuMemHostAlloc
// memory) and D2H (into it) copies, each queued on a stream of its own and synchronised.
#include <cuda.h>
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include "probe.h"

static void CUDA_CB sleep_500ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(500)); }

__global__ void spin_ns(unsigned long long ns) {
  unsigned long long t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (t - t0 < ns);
}

static double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main() {
  primary_device0();
  CUcontext ctx;
  CK(cuCtxGetCurrent(&ctx));
  CUstream busy, s;
  CK(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  const size_t n = 1 << 20;
  void* pinned = nullptr;
  CK(cuMemHostAlloc(&pinned, n, CU_MEMHOSTALLOC_PORTABLE));
  memset(pinned, 1, n);
  CUdeviceptr d;
  CK(cuMemAlloc(&d, n));
  // Warm the kernel and both copies.
  spin_ns<<<1, 1, 0, (cudaStream_t)busy>>>(1000);
  CK(cuStreamSynchronize(busy));
  CK(cuMemcpyHtoDAsync(d, pinned, n, s));
  CK(cuMemcpyDtoHAsync(pinned, d, n, s));
  CK(cuStreamSynchronize(s));
  const char* busies[] = {"host function", "kernel", "idle"};
  const char* calls[] = {"cuMemFreeHost", "cuMemHostUnregister"};
  for (const char* how : busies) {
    for (const char* call : calls) {
      for (int rep = 0; rep < 3; rep++) {
        double t_copy[2];
        double t_other = 0;
        for (int dir = 0; dir < 2; dir++) {
          void* victim = nullptr;
          if (call[5] == 'F') {
            CK(cuMemHostAlloc(&victim, n, CU_MEMHOSTALLOC_PORTABLE));
          } else {
            victim = aligned_alloc(4096, n);
            CK(cuMemHostRegister(victim, n, CU_MEMHOSTREGISTER_PORTABLE));
          }
          if (how[0] == 'h') {
            CK(cuLaunchHostFunc(busy, sleep_500ms, nullptr));
          } else if (how[0] == 'k') {
            spin_ns<<<1, 1, 0, (cudaStream_t)busy>>>(500ull * 1000 * 1000);
          }
          std::this_thread::sleep_for(std::chrono::milliseconds(20));  // it has started
          std::atomic<bool> inside{false};
          double other_ms = 0;
          std::thread other([&] {
            CK(cuCtxSetCurrent(ctx));
            inside.store(true);
            auto t0 = std::chrono::steady_clock::now();
            if (call[5] == 'F') {
              CK(cuMemFreeHost(victim));
            } else {
              CK(cuMemHostUnregister(victim));
            }
            other_ms = ms_since(t0);
          });
          while (!inside.load()) std::this_thread::yield();
          std::this_thread::sleep_for(std::chrono::milliseconds(5));  // it is inside the driver
          auto t0 = std::chrono::steady_clock::now();
          if (dir == 0) {
            CK(cuMemcpyHtoDAsync(d, pinned, n, s));
          } else {
            CK(cuMemcpyDtoHAsync(pinned, d, n, s));
          }
          CK(cuStreamSynchronize(s));
          t_copy[dir] = ms_since(t0);
          other.join();
          t_other += other_ms / 2;
          CK(cuStreamSynchronize(busy));
          if (call[5] != 'F') free(victim);
        }
        printf("busy: %-13s rep %d: another thread's %-19s %8.3f ms (mean of 2); meanwhile here "
               "1 MiB H2D + sync %8.3f ms, D2H + sync %8.3f ms\n",
               how, rep, call, t_other, t_copy[0], t_copy[1]);
        fflush(stdout);
      }
    }
  }
  // Part 2 (as tests/gpu_no_foreign_waits.rs has it, whose steps after an eviction were
  // fast): the busy work queued by this thread, the free made by a second thread, the
  // copies by a third (its own stream, made before); the copy's queueing and its
  // synchronisation timed apart; the freed block allocated before the busy work.
  for (const char* how : {"host function", "kernel"}) {
    for (int rep = 0; rep < 3; rep++) {
      void* victim = nullptr;
      CK(cuMemHostAlloc(&victim, n, CU_MEMHOSTALLOC_PORTABLE));
      CUstream s3;
      CK(cuStreamCreate(&s3, CU_STREAM_NON_BLOCKING));
      if (how[0] == 'h') {
        CK(cuLaunchHostFunc(busy, sleep_500ms, nullptr));
      } else {
        spin_ns<<<1, 1, 0, (cudaStream_t)busy>>>(500ull * 1000 * 1000);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::atomic<bool> inside{false};
      double free_ms = 0, q_ms[2] = {0, 0}, s_ms[2] = {0, 0};
      std::thread freer([&] {
        CK(cuCtxSetCurrent(ctx));
        inside.store(true);
        auto t0 = std::chrono::steady_clock::now();
        CK(cuMemFreeHost(victim));
        free_ms = ms_since(t0);
      });
      while (!inside.load()) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      std::thread copier([&] {
        CK(cuCtxSetCurrent(ctx));
        for (int dir = 0; dir < 2; dir++) {
          auto t0 = std::chrono::steady_clock::now();
          if (dir == 0) {
            CK(cuMemcpyHtoDAsync(d, pinned, n, s3));
          } else {
            CK(cuMemcpyDtoHAsync(pinned, d, n, s3));
          }
          q_ms[dir] = ms_since(t0);
          auto t1 = std::chrono::steady_clock::now();
          CK(cuStreamSynchronize(s3));
          s_ms[dir] = ms_since(t1);
        }
      });
      copier.join();
      freer.join();
      CK(cuStreamSynchronize(busy));
      CK(cuStreamDestroy(s3));
      printf("part 2, busy: %-13s rep %d: a second thread's cuMemFreeHost %8.3f ms; a third "
             "thread's 1 MiB H2D queued in %8.3f ms, synchronised in %8.3f ms; D2H %8.3f, "
             "%8.3f ms\n", how, rep, free_ms, q_ms[0], s_ms[0], q_ms[1], s_ms[1]);
      fflush(stdout);
    }
  }
  // Part 3 (session 68, after run 3): do allocations wait too? pinlane makes page-locked
  // blocks (cuMemHostAlloc) and device memory on a transfer's path when its pools grow.
  // Each timed on this thread while another stream runs a 500 ms kernel, then idle.
  for (const char* how : {"kernel", "idle"}) {
    for (size_t mib : {(size_t)2, (size_t)8, (size_t)64}) {
      if (how[0] == 'k') spin_ns<<<1, 1, 0, (cudaStream_t)busy>>>(500ull * 1000 * 1000);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      void* h = nullptr;
      auto t0 = std::chrono::steady_clock::now();
      CK(cuMemHostAlloc(&h, mib << 20, CU_MEMHOSTALLOC_PORTABLE));
      double host_ms = ms_since(t0);
      CUdeviceptr dp;
      auto t1 = std::chrono::steady_clock::now();
      CK(cuMemAlloc(&dp, mib << 20));
      double dev_ms = ms_since(t1);
      auto t2 = std::chrono::steady_clock::now();
      CK(cuMemFree(dp));
      double dev_free_ms = ms_since(t2);
      CK(cuStreamSynchronize(busy));
      CK(cuMemFreeHost(h));
      printf("part 3, busy: %-6s %3zu MiB: cuMemHostAlloc %8.3f ms, cuMemAlloc %8.3f ms, "
             "cuMemFree %8.3f ms\n", how, mib, host_ms, dev_ms, dev_free_ms);
      fflush(stdout);
    }
  }
  return 0;
}
