// Probe (not project code, session 66): does cuMemHostUnregister wait for work queued on
// other streams, as cuMemFreeHost does? pinlane unregisters a registered block
// (Tensor::register_pinned, the in-place registration of small sources) inline, on
// whichever thread drops its last view: the completion thread, or a transfer releasing
// what earlier calls kept. If the driver waited for the whole device there, a busy
// stream of someone else's would stall them (cuMemFreeHost does: see src/memory/reaper.rs).
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o unregister_wait unregister_wait.cu -lcuda && ./unregister_wait
// Each row: one call timed while another stream runs ~500 ms of work (a host function
// that sleeps, or a kernel that spins), against the same call on an idle device.
// Session 67: the registrations are timed before the unregister (runs 2 and 3 of session
// 66 timed them after it, on a device it had waited for), and a host function queued on
// a third stream is timed from its launch to its run.
#include <cuda.h>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <atomic>
#include "probe.h"

__global__ void spin(long long cycles) {
  long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

static void CUDA_CB sleep_500ms(void*) { std::this_thread::sleep_for(std::chrono::milliseconds(500)); }

// Set by a host function on another stream (`other`): does the driver run it while the
// busy stream's host function sleeps? (CUDA's docs: host functions of independent
// streams "may be serialized".)
static std::atomic<bool> ran{false};
static void CUDA_CB mark_ran(void*) { ran.store(true); }

static double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

int main() {
  CUdevice dev = primary_device0();
  int khz = 0;
  CK(cuDeviceGetAttribute(&khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev));
  CUstream busy;
  CK(cuStreamCreate(&busy, CU_STREAM_NON_BLOCKING));
  CUstream other;
  CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  const size_t n = 1 << 20;
  // The runtime API's kernel launch needs the runtime's context: the primary one, current.
  auto load = [&](const char* how) {
    if (how[0] == 'h') {
      CK(cuLaunchHostFunc(busy, sleep_500ms, nullptr));
    } else {
      spin<<<1, 1, 0, busy>>>((long long)khz * 500);  // ~500 ms at the base clock
    }
  };
  const char* loads[] = {"idle", "host function", "kernel"};
  for (const char* how : loads) {
    for (int rep = 0; rep < 2; rep++) {
      void* p = aligned_alloc(4096, n);
      CK(cuMemHostRegister(p, n, CU_MEMHOSTREGISTER_PORTABLE));
      void* h = nullptr;
      CK(cuMemHostAlloc(&h, n, CU_MEMHOSTALLOC_PORTABLE));
      if (how[0] != 'i') load(how);
      std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the work has started
      // The registrations first, while the other stream still runs (session 67: runs 2
      // and 3 timed them after the unregister below, which had waited for the device).
      auto t1 = std::chrono::steady_clock::now();
      void* q = aligned_alloc(4096, n);
      CK(cuMemHostRegister(q, n, CU_MEMHOSTREGISTER_PORTABLE));
      double reg = ms_since(t1);
      auto t3 = std::chrono::steady_clock::now();
      void* m = aligned_alloc(4096, n);
      CK(cuMemHostRegister(m, n, CU_MEMHOSTREGISTER_PORTABLE | CU_MEMHOSTREGISTER_DEVICEMAP));
      double reg_mapped = ms_since(t3);
      // A host function on another stream: how long until the driver runs it.
      CK(cuLaunchHostFunc(other, mark_ran, nullptr));
      auto t4 = std::chrono::steady_clock::now();
      while (!ran.load()) std::this_thread::yield();
      double hostfn = ms_since(t4);
      ran.store(false);
      auto t0 = std::chrono::steady_clock::now();
      CK(cuMemHostUnregister(p));
      double unreg = ms_since(t0);
      auto t2 = std::chrono::steady_clock::now();
      CK(cuMemFreeHost(h));
      double freed = ms_since(t2);
      CK(cuStreamSynchronize(busy));
      CK(cuMemHostUnregister(q));
      CK(cuMemHostUnregister(m));
      free(p);
      free(q);
      free(m);
      printf("%-14s rep %d: cuMemHostRegister %8.3f ms, device-mapped %8.3f ms, another "
             "stream's host function ran after %8.3f ms; then cuMemHostUnregister %8.3f ms, "
             "cuMemFreeHost (after it) %8.3f ms\n",
             how, rep, reg, reg_mapped, hostfn, unreg, freed);
      fflush(stdout);
    }
  }
  return 0;
}
