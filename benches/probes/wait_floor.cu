// Probe (not project code): ways for the calling thread to learn that one small copy has
// ended, each way, with nothing of pinlane or torch around it (issue 20: one 1 KiB tensor
// at <= 8 us a call in Rust, >= 1.1x torch's `d.cpu()` from Python). small_floor.cu
// measured the copy with `cuStreamSynchronize`; this asks whether another wait is faster:
// an event, polling the stream, a flag the stream writes into page-locked memory after the
// copy (`cuStreamWriteValue32`), and a kernel that moves the bytes through mapped memory
// and then sets the flag.
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o wait_floor wait_floor.cu -lcuda && ./wait_floor [bytes]
// Each row: median and 10th percentile of 3000 timed iterations after 300 warm-up ones,
// one thread, a non-blocking stream of its own, the primary context. Rows that end on a
// flag also check, in 2000 further iterations with a new byte pattern each, that every
// byte had landed when the flag was seen ("bytes ok" or the count of bad iterations).
#include <cuda.h>
#include <cuda_runtime.h>
#include <immintrin.h>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>
#include "probe.h"

// Copies n bytes (a multiple of 16) with one block, then, once every thread's stores are
// visible to the host, sets the flag.
__global__ void k_copy_flag(const uint4* src, uint4* dst, size_t n16, volatile uint32_t* flag,
                            uint32_t value) {
  for (size_t i = threadIdx.x; i < n16; i += blockDim.x) dst[i] = src[i];
  __threadfence_system();
  __syncthreads();
  if (threadIdx.x == 0) *flag = value;
}

int main(int argc, char** argv) {
  size_t n = argc > 1 ? strtoull(argv[1], nullptr, 10) : 1024;
  n = (n + 15) / 16 * 16;
  CUdevice dev = primary_device0();
  unsigned int flags = 0;
  int active = 0;
  CK(cuDevicePrimaryCtxGetState(dev, &flags, &active));
  int memops = 0;
  CK(cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev));
  printf("one copy of %zu bytes, one thread; primary context flags 0x%x; stream memops %d\n", n,
         flags, memops);
  CUstream s, other;
  CK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&other, CU_STREAM_NON_BLOCKING));
  CUevent ev, done;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  CK(cuEventCreate(&done, CU_EVENT_DISABLE_TIMING));
  void* pinned;
  CK(cuMemHostAlloc(&pinned, 1 << 20, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  memset(pinned, 3, 1 << 20);
  // The flag: one word of page-locked memory the device can write (its own page).
  uint32_t* flag;
  CK(cuMemHostAlloc((void**)&flag, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *flag = 0;
  CUdeviceptr flag_d, pinned_d;
  CK(cuMemHostGetDevicePointer(&flag_d, flag, 0));
  CK(cuMemHostGetDevicePointer(&pinned_d, pinned, 0));
  CUdeviceptr d, d2;
  CK(cuMemAlloc(&d, 1 << 20));
  CK(cuMemAlloc(&d2, 1 << 20));
  CK(cuMemsetD8(d, 5, 1 << 20));
  uint32_t seq = 0;
  auto signal = [&](CUstream st) {
    seq++;
    CK(cuStreamWriteValue32(st, flag_d, seq, 0));
    spin_flag(flag, seq);
  };
  cudaStream_t rs = (cudaStream_t)s;
  size_t n16 = n / 16;

  printf("-- pieces\n");
  row("cuStreamSynchronize of an idle stream", [&] { CK(cuStreamSynchronize(s)); });
  row("cuStreamQuery of an idle stream", [&] { (void)cuStreamQuery(s); });
  row("cuStreamWriteValue32 + spin on the flag (nothing before it)", [&] { signal(s); });
  row("cuMemcpyDtoHAsync into page-locked, no wait (then one sync untimed)", [&] {
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
  });
  CK(cuStreamSynchronize(s));
  row("kernel launch (1 block), no wait", [&] {
    k_copy_flag<<<1, 64, 0, rs>>>((const uint4*)d, (uint4*)d2, n16, (volatile uint32_t*)(flag + 64), 1);
  });
  CK(cuStreamSynchronize(s));

  printf("-- D2H into page-locked, %zu bytes\n", n);
  row("D2H async + cuStreamSynchronize", [&] {
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
    CK(cuStreamSynchronize(s));
  });
  row("D2H async + cuEventRecord + cuEventSynchronize", [&] {
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
    CK(cuEventRecord(done, s));
    CK(cuEventSynchronize(done));
  });
  row("D2H async + spin on cuStreamQuery", [&] {
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
    while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY) _mm_pause();
  });
  row("D2H async + cuStreamWriteValue32 + spin on the flag", [&] {
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
    signal(s);
  });
  row("D2H by a kernel into mapped page-locked memory, which sets the flag", [&] {
    seq++;
    k_copy_flag<<<1, 64, 0, rs>>>((const uint4*)d, (uint4*)pinned_d, n16, (volatile uint32_t*)flag_d, seq);
    spin_flag(flag, seq);
  });
  row("D2H cuMemcpyDtoH (synchronous, the legacy stream)", [&] { CK(cuMemcpyDtoH(pinned, d, n)); });
  row("whole: event record/wait, D2H async, cuStreamSynchronize", [&] {
    CK(cuEventRecord(ev, other));
    CK(cuStreamWaitEvent(s, ev, 0));
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
    CK(cuStreamSynchronize(s));
  });
  row("whole: event record/wait, D2H async, cuStreamWriteValue32 + spin", [&] {
    CK(cuEventRecord(ev, other));
    CK(cuStreamWaitEvent(s, ev, 0));
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
    signal(s);
  });
  row("whole: event record/wait, D2H async, spin on cuStreamQuery", [&] {
    CK(cuEventRecord(ev, other));
    CK(cuStreamWaitEvent(s, ev, 0));
    CK(cuMemcpyDtoHAsync(pinned, d, n, s));
    while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY) _mm_pause();
  });

  printf("-- H2D from page-locked, %zu bytes\n", n);
  row("H2D async + cuStreamSynchronize", [&] {
    CK(cuMemcpyHtoDAsync(d2, pinned, n, s));
    CK(cuStreamSynchronize(s));
  });
  row("H2D async + cuEventRecord + cuEventSynchronize", [&] {
    CK(cuMemcpyHtoDAsync(d2, pinned, n, s));
    CK(cuEventRecord(done, s));
    CK(cuEventSynchronize(done));
  });
  row("H2D async + spin on cuStreamQuery", [&] {
    CK(cuMemcpyHtoDAsync(d2, pinned, n, s));
    while (cuStreamQuery(s) == CUDA_ERROR_NOT_READY) _mm_pause();
  });
  row("H2D async + cuStreamWriteValue32 + spin on the flag", [&] {
    CK(cuMemcpyHtoDAsync(d2, pinned, n, s));
    signal(s);
  });
  row("H2D by a kernel reading mapped page-locked memory, which sets the flag", [&] {
    seq++;
    k_copy_flag<<<1, 64, 0, rs>>>((const uint4*)pinned_d, (uint4*)d2, n16, (volatile uint32_t*)flag_d, seq);
    spin_flag(flag, seq);
  });

  row("whole: event record/wait, H2D async, cuStreamSynchronize", [&] {
    CK(cuEventRecord(ev, other));
    CK(cuStreamWaitEvent(s, ev, 0));
    CK(cuMemcpyHtoDAsync(d2, pinned, n, s));
    CK(cuStreamSynchronize(s));
  });
  row("whole: event record/wait, H2D async, cuStreamWriteValue32 + spin", [&] {
    CK(cuEventRecord(ev, other));
    CK(cuStreamWaitEvent(s, ev, 0));
    CK(cuMemcpyHtoDAsync(d2, pinned, n, s));
    signal(s);
  });

  printf("-- a kernel (1 block, device to device, %zu bytes)\n", n);
  row("kernel + cuStreamSynchronize", [&] {
    k_copy_flag<<<1, 64, 0, rs>>>((const uint4*)d, (uint4*)d2, n16, (volatile uint32_t*)(flag + 64), 1);
    CK(cuStreamSynchronize(s));
  });
  row("kernel + cuStreamWriteValue32 + spin on the flag", [&] {
    k_copy_flag<<<1, 64, 0, rs>>>((const uint4*)d, (uint4*)d2, n16, (volatile uint32_t*)(flag + 64), 1);
    signal(s);
  });

  // Does a stream that has run flags wait more slowly afterwards? pinlane's D2H into
  // pageable outputs waits twice (the slot's event, then the stream) and copies the slot
  // out between; compared on a stream that never ran a flag and on one that did.
  printf("-- after flags\n");
  CUstream fresh;
  CK(cuStreamCreate(&fresh, CU_STREAM_NON_BLOCKING));
  std::vector<unsigned char> out(n);
  auto pageable_way = [&](CUstream st) {
    CK(cuMemcpyDtoHAsync(pinned, d, n, st));
    CK(cuEventRecord(done, st));
    CK(cuEventSynchronize(done));
    memcpy(out.data(), pinned, n);
    CK(cuStreamSynchronize(st));
  };
  auto flag_way = [&](CUstream st) {
    CK(cuMemcpyDtoHAsync(pinned, d, n, st));
    signal(st);
  };
  row("D2H the pageable way, a stream that never ran a flag", [&] { pageable_way(fresh); });
  row("D2H the pageable way, the stream that ran every flag above", [&] { pageable_way(s); });
  row("D2H ended by a flag, then the pageable way, on the fresh stream (both)", [&] {
    flag_way(fresh);
    pageable_way(fresh);
  });
  row("D2H ended by a flag, then the pageable way, on two streams (both)", [&] {
    flag_way(other);
    pageable_way(s);
  });
  row("D2H ended by cuStreamSynchronize, then the pageable way (both)", [&] {
    CK(cuMemcpyDtoHAsync(pinned, d, n, fresh));
    CK(cuStreamSynchronize(fresh));
    pageable_way(fresh);
  });

  // Do the flag's ways see every byte? A new pattern each iteration, checked on the host
  // (D2H) or copied back and checked (H2D, outside the flag's wait).
  printf("-- checks, 2000 iterations each\n");
  std::vector<unsigned char> want(n), back(n);
  auto check = [&](const char* name, int dir, int way) {
    int bad = 0;
    for (int i = 0; i < 2000; i++) {
      unsigned char p = (unsigned char)(i * 7 + 1);
      memset(want.data(), p, n);
      if (dir == 0) {  // D2H: the device's bytes set, the host's cleared
        CK(cuMemsetD8(d, p, n));
        CK(cuStreamSynchronize(nullptr));
        CK(cuCtxSynchronize());
        memset(pinned, 0, n);
        if (way == 0) {
          CK(cuMemcpyDtoHAsync(pinned, d, n, s));
          signal(s);
        } else {
          seq++;
          k_copy_flag<<<1, 64, 0, rs>>>((const uint4*)d, (uint4*)pinned_d, n16, (volatile uint32_t*)flag_d, seq);
          spin_flag(flag, seq);
        }
        if (memcmp(pinned, want.data(), n) != 0) bad++;
      } else {  // H2D: the host's bytes set; is the device's copy whole once the flag is up?
        memset(pinned, p, n);
        if (way == 0) {
          CK(cuMemcpyHtoDAsync(d2, pinned, n, s));
          signal(s);
        } else {
          seq++;
          k_copy_flag<<<1, 64, 0, rs>>>((const uint4*)pinned_d, (uint4*)d2, n16, (volatile uint32_t*)flag_d, seq);
          spin_flag(flag, seq);
        }
        CK(cuMemcpyDtoH(back.data(), d2, n));
        if (memcmp(back.data(), want.data(), n) != 0) bad++;
      }
    }
    if (bad == 0)
      printf("%-76s bytes ok\n", name);
    else
      printf("%-76s %d of 2000 iterations WRONG\n", name, bad);
  };
  check("D2H async + cuStreamWriteValue32 + flag", 0, 0);
  check("D2H kernel + flag", 0, 1);
  check("H2D async + cuStreamWriteValue32 + flag", 1, 0);
  check("H2D kernel + flag", 1, 1);
  return 0;
}
