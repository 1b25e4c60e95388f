// What the driver-API probes share (not project code): a driver call checked, and one row
// of timings. Included by the probes next to it; nvcc finds it beside the .cu file.
#pragma once
#include <cuda.h>
#include <immintrin.h>
#include <cstdint>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

// A driver call that must succeed: prints the call, line and error, then exits.
#define CK(x)                                                                  \
  do {                                                                         \
    CUresult r = (x);                                                          \
    if (r != CUDA_SUCCESS) {                                                   \
      const char* s = nullptr;                                                 \
      cuGetErrorString(r, &s);                                                 \
      printf("ERR %s line %d: %s\n", #x, __LINE__, s ? s : "?");              \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

// Device 0 with its primary context current on this thread (the context pinlane uses).
static CUdevice primary_device0() {
  CK(cuInit(0));
  CUdevice dev;
  CK(cuDeviceGet(&dev, 0));
  CUcontext ctx;
  CK(cuDevicePrimaryCtxRetain(&ctx, dev));
  CK(cuCtxSetCurrent(ctx));
  return dev;
}

// Times `f`: `warm` untimed calls, then `reps` timed ones; prints the median and the 10th
// percentile, in microseconds, after `name` padded to `width` columns.
static void row(const char* name, const std::function<void()>& f, int warm = 300,
                int reps = 3000, int width = 72) {
  for (int i = 0; i < warm; i++) f();
  std::vector<double> v(reps);
  for (int i = 0; i < reps; i++) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    v[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  }
  std::sort(v.begin(), v.end());
  printf("%-*s median %6.2f us  p10 %6.2f us\n", width, name, v[reps / 2], v[reps / 10]);
  fflush(stdout);
}

// Spins until a stream has written `want` into the page-locked word `flag` (an end flag,
// `cuStreamWriteValue32`); exits after one second without it.
static void spin_flag(const volatile uint32_t* flag, uint32_t want) {
  auto t0 = std::chrono::steady_clock::now();
  while (*flag != want) {
    _mm_pause();
    if (std::chrono::steady_clock::now() - t0 > std::chrono::seconds(1)) {
      printf("ERR the flag never came\n");
      exit(1);
    }
  }
}
