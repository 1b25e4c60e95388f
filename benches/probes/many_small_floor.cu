// Probe (not project code): the floor under the Rust bench's "1000 x 1 KiB f32, H2D from
// pageable memory" row (issue 20: at most 80 us a call), with nothing of pinlane around it.
//
// The sources are laid out as the bench's: four rotated copies of the batch, each 1000
// separate 1 KiB heap allocations (so the caches do not hold one call's sources from the
// call before). A call does what any library that returns a fresh device copy of them
// must: allocate 1000 x 1 KiB of device memory (stream-ordered, from the device's pool,
// as pinlane does), stage the 1000 sources into one page-locked slot, copy the slot to
// the device, synchronise, and give the allocation back to the pool. No tensor objects
// are walked or built: pinlane's walk, plan and rebuild come on top of this floor.
//
// Rows (median and 10th percentile of 2000 timed calls after 200 warm-up ones):
//   the copy alone (1 MB, slot to a device buffer, with its synchronisation);
//   the fill alone, by the calling thread, and by T hot workers plus the caller;
//   whole calls: the fill by the caller alone, then by T hot workers plus the caller,
//   in one window or in two with the first window's copy queued as soon as it is filled;
//   each with memcpy and with streaming stores.
// The workers spin between calls (never asleep: no wake-up is paid), drawing pieces of 16
// sources from a shared counter, as pinlane's copy threads do; so the parallel rows are
// a floor for a pool that is always awake.
//
// Build and run on the GPU machine:
//   nvcc -O3 -Xcompiler -march=native -o many_small_floor many_small_floor.cu -lcuda -lpthread
//   ./many_small_floor
#include <cuda.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <immintrin.h>
#include <thread>
#include <vector>
#include "probe.h"

static const int N = 1000, BYTES = 1024, SETS = 4, PIECE = 16;

// A row of this probe: 2000 timed calls after 200 warm-up ones (probe.h's `row`).
static void row2k(const char* name, const std::function<void()>& f) { row(name, f, 200, 2000, 66); }

// How a source is stored into the slot: memcpy (ordinary stores), or AVX streaming
// stores, as pinlane fills staged regions under 32 MiB (the copy engine reads a slot just
// filled with ordinary stores slower: docs/performance.md, issue 11's fourth part).
static bool g_nt = false;
static inline void put(char* d, const char* s) {
#ifdef __AVX2__
  if (g_nt) {
    for (int k = 0; k < BYTES; k += 32)
      _mm256_stream_si256((__m256i*)(d + k), _mm256_loadu_si256((const __m256i*)(s + k)));
    return;
  }
#endif
  memcpy(d, s, BYTES);
}
static inline void fence() {
  if (g_nt) _mm_sfence();
}

// A pool of hot workers: each fill publishes a job (a range of sources into the slot);
// workers and the caller take pieces of it from its counter until none is left. A job is
// never reused (a worker late to one finds its counter spent), and all are freed at exit.
struct Job {
  char* const* src;
  char* dst;
  int lo, hi;
  std::atomic<int> next{0}, done{0};
  void work() {
    for (;;) {
      int a = lo + next.fetch_add(1) * PIECE;
      if (a >= hi) return;
      int b = std::min(a + PIECE, hi);
      for (int i = a; i < b; i++) put(dst + (size_t)i * BYTES, src[i]);
      fence();
      done.fetch_add(b - a, std::memory_order_release);
    }
  }
};

struct Pool {
  std::vector<std::thread> threads;
  std::vector<Job*> jobs;
  std::atomic<Job*> current{nullptr};
  std::atomic<bool> stop{false};

  explicit Pool(int t) {
    jobs.reserve(8192);
    for (int k = 0; k < t; k++)
      threads.emplace_back([this] {
        Job* seen = nullptr;
        while (!stop.load(std::memory_order_relaxed)) {
          Job* j = current.load(std::memory_order_acquire);
          if (j != seen) {
            seen = j;
            j->work();
          } else {
            _mm_pause();
          }
        }
      });
  }
  // Fills sources [a, b) of `s` into `d` and returns once every one is copied.
  void fill(char* const* s, char* d, int a, int b) {
    Job* j = new Job();
    j->src = s, j->dst = d, j->lo = a, j->hi = b;
    jobs.push_back(j);
    current.store(j, std::memory_order_release);
    j->work();
    while (j->done.load(std::memory_order_acquire) < b - a) _mm_pause();
  }
  ~Pool() {
    stop = true;
    for (auto& t : threads) t.join();
    for (Job* j : jobs) delete j;
  }
};

int main() {
  CUdevice dev = primary_device0();
  char name[128];
  CK(cuDeviceGetName(name, sizeof name, dev));
  printf("%s, %u host threads\n", name, std::thread::hardware_concurrency());
  CUstream st;
  CK(cuStreamCreate(&st, CU_STREAM_NON_BLOCKING));
  // The device's pool keeps what is freed (as pinlane's pools do): with the default
  // release threshold of 0 it gives its memory back at every synchronisation, and the
  // next allocation maps it again (about 120 us a call on an H100 host, session 60 run 1).
  CUmemoryPool mp;
  CK(cuDeviceGetDefaultMemPool(&mp, dev));
  cuuint64_t keep = ~0ull;
  CK(cuMemPoolSetAttribute(mp, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  const size_t total = (size_t)N * BYTES;
  char* slot;
  CK(cuMemHostAlloc((void**)&slot, total, 0));
  memset(slot, 0, total);
  CUdeviceptr fixed;
  CK(cuMemAlloc(&fixed, total));
  std::vector<std::vector<char*>> sets(SETS);
  for (int s = 0; s < SETS; s++)
    for (int i = 0; i < N; i++) {
      char* p = (char*)malloc(BYTES);
      memset(p, (s * 31 + i) & 0xff, BYTES);
      sets[s].push_back(p);
    }
  int call = 0;
  auto next_set = [&]() { return sets[call++ % SETS].data(); };
  auto fill1 = [&](char* const* s, int a, int b) {
    for (int i = a; i < b; i++) put(slot + (size_t)i * BYTES, s[i]);
    fence();
  };
  // A whole call: pool allocation, fill in `windows` windows (by `pool`, or the caller
  // alone), each window's copy queued once it is filled, synchronisation, free.
  auto whole = [&](Pool* pool, int windows) {
    char* const* s = next_set();
    CUdeviceptr d;
    CK(cuMemAllocAsync(&d, total, st));
    for (int w = 0; w < windows; w++) {
      int a = N * w / windows, b = N * (w + 1) / windows;
      if (pool)
        pool->fill(s, slot, a, b);
      else
        fill1(s, a, b);
      CK(cuMemcpyHtoDAsync(d + (size_t)a * BYTES, slot + (size_t)a * BYTES,
                           (size_t)(b - a) * BYTES, st));
    }
    CK(cuMemFreeAsync(d, st));
    CK(cuStreamSynchronize(st));
  };

  row2k("copy alone: 1 MB slot -> device, synchronised", [&] {
    CK(cuMemcpyHtoDAsync(fixed, slot, total, st));
    CK(cuStreamSynchronize(st));
  });
  row2k("allocation + copy + free, synchronised (no fill)", [&] {
    CUdeviceptr d;
    CK(cuMemAllocAsync(&d, total, st));
    CK(cuMemcpyHtoDAsync(d, slot, total, st));
    CK(cuMemFreeAsync(d, st));
    CK(cuStreamSynchronize(st));
  });
  char label[128];
  for (bool nt : {false, true}) {
    g_nt = nt;
    const char* how = nt ? "streaming stores" : "memcpy";
    snprintf(label, sizeof label, "fill alone, caller only, %s", how);
    row2k(label, [&] { fill1(next_set(), 0, N); });
    snprintf(label, sizeof label, "whole call, caller fills, one window, %s", how);
    row2k(label, [&] { whole(nullptr, 1); });
    snprintf(label, sizeof label, "whole call, caller fills, two windows, %s", how);
    row2k(label, [&] { whole(nullptr, 2); });
  }
  for (int t : {1, 3, 7, 11}) {
    if (t + 1 > (int)std::thread::hardware_concurrency()) continue;  // spinning needs a core each
    Pool pool(t);
    for (bool nt : {false, true}) {
      g_nt = nt;
      const char* how = nt ? "streaming" : "memcpy";
      snprintf(label, sizeof label, "fill alone, %d hot workers + caller, %s", t, how);
      row2k(label, [&] { pool.fill(next_set(), slot, 0, N); });
      snprintf(label, sizeof label, "whole call, %d hot workers + caller, one window, %s", t, how);
      row2k(label, [&] { whole(&pool, 1); });
      snprintf(label, sizeof label, "whole call, %d hot workers + caller, two windows, %s", t, how);
      row2k(label, [&] { whole(&pool, 2); });
    }
  }
  // Every byte of the last call's device copy, against its sources.
  {
    Pool* none = nullptr;
    int before = call;
    whole(none, 1);
    std::vector<char> back(total);
    CK(cuMemcpyHtoDAsync(fixed, slot, total, st));
    CK(cuMemcpyDtoH(back.data(), fixed, total));
    char* const* s = sets[before % SETS].data();
    for (int i = 0; i < N; i++)
      if (memcmp(back.data() + (size_t)i * BYTES, s[i], BYTES) != 0) {
        printf("MISMATCH at source %d\n", i);
        return 1;
      }
    printf("checked: the last call's staged bytes, copied to the device and back, match their sources\n");
  }
  return 0;
}
