// Probe (not project code; session 70): what ordering one small D2H after the caller's
// stream costs when that stream is the legacy default stream (torch's current stream
// unless the caller picked another). pinlane's D2H records an event on the caller's stream
// and makes its own non-blocking stream wait for it (the engine's "ordered" mark, 0.75 to
// 0.78 us in run 1's one_d2h_phases.py). A blocking stream (created without
// CU_STREAM_NON_BLOCKING) is ordered after earlier legacy-stream work by the driver
// itself, with no event: is that any cheaper?
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o legacy_order legacy_order.cu -lcuda && ./legacy_order
// Each row: one thread, the primary context; per iteration, optionally a 4-byte memset
// of the source on the legacy stream (the caller's work), then the 1 KiB copy into
// page-locked memory and a flag written after it, and a spin on the flag. Median and
// 10th percentile of 3000 iterations after 300 warm-up ones. The rows with the caller's
// memset check in every iteration that the copy saw it (the memset's byte differs each
// iteration): "order ok" or the count of iterations that read stale bytes. First, one row
// timing `cuStreamGetId` alone (added after run 2).
#include <cuda.h>
#include <immintrin.h>
#include <chrono>
#include <cstdint>
#include <cstring>
#include "probe.h"

int main() {
  const size_t n = 1024;
  primary_device0();
  CUstream nonblocking, blocking;
  CK(cuStreamCreate(&nonblocking, CU_STREAM_NON_BLOCKING));
  CK(cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
  CUevent ev;
  CK(cuEventCreate(&ev, CU_EVENT_DISABLE_TIMING));
  uint8_t* out;
  CK(cuMemHostAlloc((void**)&out, 1 << 16, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  uint32_t* flag;
  CK(cuMemHostAlloc((void**)&flag, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE));
  *flag = 0;
  CUdeviceptr flag_d;
  CK(cuMemHostGetDevicePointer(&flag_d, flag, 0));
  CUdeviceptr src;
  CK(cuMemAlloc(&src, 1 << 16));
  CK(cuMemsetD8(src, 1, 1 << 16));
  CK(cuCtxSynchronize());
  uint32_t seq = 0;
  uint8_t byte = 0;
  long stale = 0;
  // One iteration: `caller` queues the caller's work on the legacy stream; `ordered`
  // records and waits for an event (the non-blocking way); `s` takes the copy and flag.
  auto once = [&](CUstream s, bool caller, bool ordered) {
    if (caller) {
      byte = byte == 250 ? 2 : byte + 1;
      CK(cuMemsetD8Async(src, byte, 4, CU_STREAM_LEGACY));
    }
    if (ordered) {
      CK(cuEventRecord(ev, CU_STREAM_LEGACY));
      CK(cuStreamWaitEvent(s, ev, 0));
    }
    CK(cuMemcpyDtoHAsync(out, src, n, s));
    CK(cuStreamWriteValue32(s, flag_d, ++seq, 0));
    spin_flag(flag, seq);
    if (caller && out[0] != byte) stale++;
  };
  struct Way {
    const char* name;
    CUstream s;
    bool caller, ordered;
  } ways[] = {
      {"non-blocking stream, no ordering (the floor)", nonblocking, false, false},
      {"non-blocking stream, event record + wait (pinlane now)", nonblocking, false, true},
      {"blocking stream, no event", blocking, false, false},
      {"caller's memset; non-blocking, event record + wait", nonblocking, true, true},
      {"caller's memset; blocking stream, no event", blocking, true, false},
      {"caller's memset; non-blocking, no ordering (may read stale)", nonblocking, true, false},
  };
  // What pinlane's kept device blocks ask of a borrowed consumer stream on every small
  // H2D call (session 70): the driver's id for it.
  unsigned long long id = 0;
  row("cuStreamGetId of a created stream (alone)", [&] { CK(cuStreamGetId(blocking, &id)); });
  for (int round = 0; round < 3; round++) {
    printf("-- round %d\n", round + 1);
    for (auto& w : ways) {
      stale = 0;
      char name[160];
      row(w.name, [&] { once(w.s, w.caller, w.ordered); });
      if (w.caller) printf("    %s\n", stale ? (snprintf(name, sizeof name, "stale in %ld", stale), name) : "order ok");
    }
  }
  return 0;
}
