// Probe (not project code): how fast can N host threads stage a pageable 1 GiB source
// through a ring of 8 x 8 MiB page-locked slots, with and without the DMA reading them?
// Build and run on the GPU machine: nvcc -O3 -Xcompiler -march=native -o fill staging_ceiling.cu && ./fill
// The reference for pinlane's staged H2D: the same ring (8 slots of 8 MiB), no library.
// Results: benches/results/issue11_part5.txt (runs 3, 4, 7, 8); docs/performance.md.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
#include <thread>
#include <atomic>
#include <algorithm>
#include <chrono>
#include <immintrin.h>
#include <cuda_runtime.h>
#include <sys/mman.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("ERR %s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

__attribute__((target("avx512f"))) static void copy_nt(char* d, const char* s, size_t n) {
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    __m512i a = _mm512_loadu_si512(s + i), b = _mm512_loadu_si512(s + i + 64), c = _mm512_loadu_si512(s + i + 128), e = _mm512_loadu_si512(s + i + 192);
    _mm512_stream_si512((__m512i*)(d + i), a); _mm512_stream_si512((__m512i*)(d + i + 64), b); _mm512_stream_si512((__m512i*)(d + i + 128), c); _mm512_stream_si512((__m512i*)(d + i + 192), e);
  }
  memcpy(d + i, s + i, n - i);
  _mm_sfence();
}
__attribute__((target("avx512f"))) static void copy_pf(char* d, const char* s, size_t n) {
  // cached stores, software prefetch 2 KiB ahead (crosses 4 KiB pages early)
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    _mm_prefetch(s + i + 4096, _MM_HINT_T0); _mm_prefetch(s + i + 4096 + 64, _MM_HINT_T0); _mm_prefetch(s + i + 4096 + 128, _MM_HINT_T0); _mm_prefetch(s + i + 4096 + 192, _MM_HINT_T0);
    __m512i a = _mm512_loadu_si512(s + i), b = _mm512_loadu_si512(s + i + 64), c = _mm512_loadu_si512(s + i + 128), e = _mm512_loadu_si512(s + i + 192);
    _mm512_storeu_si512(d + i, a); _mm512_storeu_si512(d + i + 64, b); _mm512_storeu_si512(d + i + 128, c); _mm512_storeu_si512(d + i + 192, e);
  }
  memcpy(d + i, s + i, n - i);
}
static void copy_movsb(char* d, const char* s, size_t n) { asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory"); }
static void copy_memcpy(char* d, const char* s, size_t n) { memcpy(d, s, n); }
typedef void (*CopyFn)(char*, const char*, size_t);

int main(int argc, char** argv) {
  { FILE* f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r"); char b[256] = {0}; if (f) { fgets(b, 255, f); fclose(f);} printf("THP: %s", b); }
  const size_t total = 1ull << 30, W = 8 << 20; const int NS = 8; const int NW = total / W;
  char* src = (char*)malloc(total);
  for (size_t i = 0; i < total; i += 8) *(unsigned long long*)(src + i) = i * 0x9E3779B97F4A7C15ull;
  char* src2 = (char*)aligned_alloc(2 << 20, total); madvise(src2, total, MADV_HUGEPAGE);
  memcpy(src2, src, total);
  char* slots[NS]; for (int k = 0; k < NS; k++) CK(cudaHostAlloc((void**)&slots[k], W, cudaHostAllocPortable));
  char* dev; CK(cudaMalloc(&dev, total));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t ev[NS]; for (int k = 0; k < NS; k++) CK(cudaEventCreateWithFlags(&ev[k], cudaEventDisableTiming));
  // DMA limit
  { double t = now(); for (int w = 0; w < NW; w++) CK(cudaMemcpyAsync(dev + (size_t)w * W, slots[w % NS], W, cudaMemcpyHostToDevice, st)); CK(cudaStreamSynchronize(st)); printf("DMA only, 8 MiB windows from the ring: %.1f GB/s\n", total / (now() - t) / 1e9); }
  const char* names[] = {"memcpy", "rep movsb", "avx512 NT", "avx512 prefetch"};
  CopyFn fns[] = {copy_memcpy, copy_movsb, copy_nt, copy_pf};
  for (int srcsel = 0; srcsel < 2; srcsel++)
  for (int dma = 0; dma < 2; dma++)
  for (int m = 0; m < 4; m++)
  for (int T : {8, 12, 14}) {
    const char* S = srcsel ? src2 : src;
    std::vector<double> res;
    for (int rep = 0; rep < 5; rep++) {
      std::vector<std::atomic<int>> done(NW); for (auto& d : done) d = 0;
      std::vector<std::atomic<int>> freed(NW); for (int w = 0; w < NW; w++) freed[w] = w < NS ? 1 : 0;
      std::atomic<bool> go{false};
      std::vector<std::thread> th;
      for (int t = 0; t < T; t++) th.emplace_back([&, t] {
        while (!go.load()) {}
        size_t part = W / T / 4096 * 4096, lo = t * part, hi = t == T - 1 ? W : lo + part;
        for (int w = 0; w < NW; w++) {
          while (!freed[w].load(std::memory_order_acquire)) _mm_pause();
          fns[m](slots[w % NS] + lo, S + (size_t)w * W + lo, hi - lo);
          done[w].fetch_add(1, std::memory_order_release);
        }
      });
      double t0 = now(); go = true;
      int next_dma = 0, next_free = NS;
      while (next_dma < NW) {
        if (done[next_dma].load(std::memory_order_acquire) == T) {
          if (dma) { CK(cudaMemcpyAsync(dev + (size_t)next_dma * W, slots[next_dma % NS], W, cudaMemcpyHostToDevice, st)); CK(cudaEventRecord(ev[next_dma % NS], st)); }
          next_dma++;
        } else _mm_pause();
        while (next_free < NW && next_free - NS < next_dma && (!dma || cudaEventQuery(ev[(next_free - NS) % NS]) == cudaSuccess)) {
          freed[next_free].store(1, std::memory_order_release); next_free++;
        }
      }
      if (dma) CK(cudaStreamSynchronize(st));
      double dt = now() - t0;
      for (auto& x : th) x.join();
      res.push_back(total / dt / 1e9);
    }
    std::sort(res.begin(), res.end());
    printf("%s source, %s, %-16s %2d threads: %.1f GB/s (min %.1f max %.1f)\n", srcsel ? "THP" : "malloc", dma ? "fill+DMA " : "fill only", names[m], T, res[2], res[0], res[4]);
    fflush(stdout);
  }
  // verify the last DMA pass
  std::vector<char> back(W);
  CK(cudaMemcpy(back.data(), dev + total - W, W, cudaMemcpyDeviceToHost));
  printf("verify last window: %s\n", memcmp(back.data(), src + total - W, W) == 0 ? "ok" : "BAD");
  return 0;
}
