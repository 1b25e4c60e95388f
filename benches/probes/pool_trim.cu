// Probe (not project code, session 75): what cuMemPoolTrimTo gives back to an allocation
// right after it, on a device that is otherwise full. tests/gpu_oom_retry.rs's pool test
// failed on an H100 in session 75: a pool like pinlane's (its own pool, release threshold
// UINT64_MAX) held 256 MiB that backed nothing, the device had 10.2 MiB free, and 260 MiB
// asked on the copy stream failed with out of memory even after pinlane's retry, which
// trims the pool (cuMemPoolTrimTo(pool, 0)) and asks once more. This probe repeats that
// without pinlane and prints, after each step, the device's free memory, the pool's
// reserved and used bytes, and whether the allocation then succeeds:
//   the trim alone; 200 ms later; the copy stream synchronised; the stream the block was
//   freed on synchronised; the context synchronised; each followed by another trim.
// Cases: the block freed before the fill or after it, on the legacy stream or the copy
// stream, with 4 or 16 x 2 MiB given back after the fill.
// Found (session 76, driver 580: freed before the fill on an H100 and an H200, after it
// on the H200; benches/results/session76/): a block freed before the fill is gone by its
// end (the pool's reserved bytes fall to 0: the fill's cuMemAlloc took the pool's unused
// memory), so nothing can serve 258 MiB; a block freed after the fill serves the 258 MiB
// with no trim (35 MiB free + the pool's 256 MiB), and with 11 MiB free the allocation
// fails with or without a trim (267 MiB free after the trim: the pool maps more than it
// is asked). So trimming before a retry gives nothing.
// Build and run on the GPU machine (no pinlane needed):
//   nvcc -O2 -o pool_trim benches/probes/pool_trim.cu -lcuda && ./pool_trim
#include <cuda.h>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>
#include <vector>
#include "probe.h"

static const size_t MiB = 1 << 20;

static uint64_t attr(CUmemoryPool pool, CUmemPool_attribute a) {
  uint64_t v = 0;
  CK(cuMemPoolGetAttribute(pool, a, &v));
  return v;
}

static void show(const char* what, CUmemoryPool pool) {
  size_t free = 0, total = 0;
  CK(cuMemGetInfo(&free, &total));
  printf("  %-44s free %8.1f MiB, pool reserved %6.1f used %6.1f MiB\n", what,
         free / double(MiB), attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT) / double(MiB),
         attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT) / double(MiB));
}

// Allocates `n` bytes from `pool` on `stream`; frees it at once if it succeeded. True if it did.
static bool try_alloc(CUmemoryPool pool, size_t n, CUstream stream) {
  CUdeviceptr p = 0;
  CUresult got = cuMemAllocFromPoolAsync(&p, n, pool, stream);
  if (got == CUDA_SUCCESS) {
    CK(cuMemFreeAsync(p, stream));
    CK(cuStreamSynchronize(stream));
    return true;
  }
  if (got != CUDA_ERROR_OUT_OF_MEMORY) CK(got);
  return false;
}

static void one_case(CUdevice dev, bool free_on_legacy, int give_back_2mib, bool free_after_fill) {
  printf("case: freed %s the fill on the %s stream, %d x 2 MiB given back after the fill\n",
         free_after_fill ? "after" : "before", free_on_legacy ? "legacy" : "copy", give_back_2mib);
  CUmemPoolProps props = {};
  props.allocType = CU_MEM_ALLOCATION_TYPE_PINNED;
  props.handleTypes = CU_MEM_HANDLE_TYPE_NONE;
  props.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  props.location.id = dev;
  CUmemoryPool pool;
  CK(cuMemPoolCreate(&pool, &props));
  uint64_t keep_all = UINT64_MAX;
  CK(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep_all));
  CUstream copy;
  CK(cuStreamCreate(&copy, CU_STREAM_NON_BLOCKING));
  CUstream freed_on = free_on_legacy ? CU_STREAM_LEGACY : copy;

  // 256 MiB from the pool, freed before or after the fill: the pool keeps it, backing
  // nothing.
  CUdeviceptr big = 0;
  CK(cuMemAllocFromPoolAsync(&big, 256 * MiB, pool, copy));
  CK(cuStreamSynchronize(copy));
  auto free_big = [&] {
    CK(cuMemFreeAsync(big, freed_on));
    CK(cuStreamSynchronize(freed_on));
    show("the 256 MiB block freed, its stream synced", pool);
  };
  if (!free_after_fill) free_big();

  // The device filled with cuMemAlloc, then some 2 MiB pieces given back.
  std::vector<std::pair<CUdeviceptr, size_t>> fill;
  for (size_t chunk : {1024 * MiB, 64 * MiB, 2 * MiB}) {
    CUdeviceptr p;
    while (cuMemAlloc(&p, chunk) == CUDA_SUCCESS) fill.push_back({p, chunk});
  }
  for (int k = 0; k < give_back_2mib && !fill.empty(); ++k) {
    if (fill.back().second != 2 * MiB) break;
    CK(cuMemFree(fill.back().first));
    fill.pop_back();
  }
  show("the device filled", pool);
  if (free_after_fill) free_big();

  size_t n = 256 * MiB + 2 * MiB;
  printf("  asking %.1f MiB on the copy stream: %s\n", n / double(MiB),
         try_alloc(pool, n, copy) ? "allocated" : "out of memory");
  struct Step {
    const char* what;
    void (*run)(CUstream, CUstream);
  };
  Step steps[] = {
      {"trimmed", [](CUstream, CUstream) {}},
      {"200 ms later, trimmed",
       [](CUstream, CUstream) { std::this_thread::sleep_for(std::chrono::milliseconds(200)); }},
      {"the copy stream synced, trimmed", [](CUstream c, CUstream) { CK(cuStreamSynchronize(c)); }},
      {"the freeing stream synced, trimmed", [](CUstream, CUstream f) { CK(cuStreamSynchronize(f)); }},
      {"the context synced, trimmed", [](CUstream, CUstream) { CK(cuCtxSynchronize()); }},
  };
  for (const Step& step : steps) {
    step.run(copy, freed_on);
    CK(cuMemPoolTrimTo(pool, 0));
    show(step.what, pool);
    bool ok = try_alloc(pool, n, copy);
    printf("    then %.1f MiB: %s\n", n / double(MiB), ok ? "allocated" : "out of memory");
    if (ok) break;
  }
  for (auto& f : fill) CK(cuMemFree(f.first));
  CK(cuStreamDestroy(copy));
  CK(cuMemPoolDestroy(pool));
}

int main() {
  CUdevice dev = primary_device0();
  int driver = 0;
  CK(cuDriverGetVersion(&driver));
  char name[128];
  CK(cuDeviceGetName(name, sizeof name, dev));
  printf("%s, driver API %d\n", name, driver);
  one_case(dev, true, 16, false);
  for (bool legacy : {true, false}) one_case(dev, legacy, 16, true);
  one_case(dev, true, 4, true);
  return 0;
}
