// Probe (not project code): does the copy engine read a staging slot more slowly when host
// threads have just filled it with ordinary stores (its lines still modified in the
// cores' private caches), and does pushing the lines out after the fill (cldemote to the
// shared cache, clwb or clflushopt to memory) help?
// Build and run on the GPU machine:
//   nvcc -O3 -Xcompiler -march=native -o hot hot_slots.cu && ./hot
// Part 1 times the DMA of one 8 MiB slot just after 12 threads filled it, per fill style.
// Part 2 stages 256 MiB and 1 GiB through a ring of 8 x 8 MiB slots as
// staging_ceiling.cu does (12 threads), per fill style.
// With the argument `lag` (./hot lag), part 3 times the DMA of a slot filled with memcpy
// after the same threads wrote X MiB more elsewhere (do later writes cool its lines?), and
// part 4 runs the ring with each window's DMA held until the window L later is filled,
// the last L windows filled with non-temporal stores.
// With `mix` (./hot mix), part 5 runs the ring with every P-th window (and the last two)
// filled with non-temporal stores and queued as soon as filled, the others with memcpy
// and queued only once the K windows after them are filled (their lines cooled), so the
// copy engine's order is not the fill order.
// With `first` (./hot first), part 6 (session 50) runs the ring with the first K windows
// filled with non-temporal stores and the rest with memcpy, K taking turns round by
// round: the copy engine reads the first windows right after their fill (hot lines, ~20
// GB/s with memcpy), when the fill is not yet ahead.
// Results: benches/results/issue11_part6.txt (runs 1 to 3); docs/performance.md, issue 11, fourth part.
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
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("ERR %s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// cldemote [rax]: NP 0F 1C /0, a hint (a no-op where unsupported).
static inline void cldemote(const void* p) { asm volatile(".byte 0x0f, 0x1c, 0x00" : : "a"(p) : "memory"); }
__attribute__((target("clwb"))) static inline void clwb(void* p) { _mm_clwb(p); }
__attribute__((target("clflushopt"))) static inline void clflushopt(void* p) { _mm_clflushopt(p); }

static void copy_plain(char* d, const char* s, size_t n) { memcpy(d, s, n); }
// The copy in 64 KiB chunks, each chunk's lines pushed out right after it is written.
template <int How> static void copy_then(char* d, const char* s, size_t n) {
  const size_t C = 64 << 10;
  for (size_t at = 0; at < n; at += C) {
    size_t len = std::min(C, n - at);
    memcpy(d + at, s + at, len);
    char* lo = (char*)((uintptr_t)(d + at) & ~(uintptr_t)63);
    for (char* p = lo; p < d + at + len; p += 64) {
      if (How == 0) cldemote(p);
      else if (How == 1) clwb(p);
      else clflushopt(p);
    }
  }
  if (How != 0) _mm_sfence();
}
__attribute__((target("avx512f"))) static void copy_nt(char* d, const char* s, size_t n) {
  size_t i = 0;
  for (; i + 256 <= n; i += 256) {
    __m512i a = _mm512_loadu_si512(s + i), b = _mm512_loadu_si512(s + i + 64), c = _mm512_loadu_si512(s + i + 128), e = _mm512_loadu_si512(s + i + 192);
    _mm512_stream_si512((__m512i*)(d + i), a); _mm512_stream_si512((__m512i*)(d + i + 64), b); _mm512_stream_si512((__m512i*)(d + i + 128), c); _mm512_stream_si512((__m512i*)(d + i + 192), e);
  }
  memcpy(d + i, s + i, n - i);
  _mm_sfence();
}
typedef void (*CopyFn)(char*, const char*, size_t);
static const char* names[] = {"memcpy", "memcpy+cldemote", "memcpy+clwb", "memcpy+clflushopt", "nt stores"};
static CopyFn fns[] = {copy_plain, copy_then<0>, copy_then<1>, copy_then<2>, copy_nt};
static const int NF = 5;

int main(int argc, char** argv) {
  const bool lag = argc > 1 && strcmp(argv[1], "lag") == 0;
  const bool mix = argc > 1 && strcmp(argv[1], "mix") == 0;
  const bool first = argc > 1 && strcmp(argv[1], "first") == 0;
  { FILE* f = fopen("/proc/cpuinfo", "r"); char b[8192]; bool d = false; while (f && fgets(b, sizeof b, f)) if (strstr(b, "flags") && strstr(b, " cldemote")) d = true; if (f) fclose(f); printf("cpuinfo lists cldemote: %s\n", d ? "yes" : "no"); }
  const int T = 12, NS = 8;
  const size_t W = 8 << 20, MAXT = 1ull << 30;
  char* src = (char*)malloc(MAXT);
  for (size_t i = 0; i < MAXT; i += 8) *(unsigned long long*)(src + i) = i * 0x9E3779B97F4A7C15ull;
  char* slots[NS]; for (int k = 0; k < NS; k++) CK(cudaHostAlloc((void**)&slots[k], W, cudaHostAllocPortable));
  char* dev; CK(cudaMalloc(&dev, MAXT));
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t ev[NS]; for (int k = 0; k < NS; k++) CK(cudaEventCreateWithFlags(&ev[k], cudaEventDisableTiming));
  cudaEvent_t t0, t1; CK(cudaEventCreate(&t0)); CK(cudaEventCreate(&t1));
  { double t = now(); for (int w = 0; w < 128; w++) CK(cudaMemcpyAsync(dev + (size_t)w * W, slots[w % NS], W, cudaMemcpyHostToDevice, st)); CK(cudaStreamSynchronize(st)); printf("DMA only, 8 MiB windows from the ring: %.1f GB/s\n", MAXT / (now() - t) / 1e9); }

  if (lag) {
    // Part 3: DMA of slot 0 after X MiB more were written by the same threads.
    const size_t XMAX = 64ull << 20;
    char* other; CK(cudaHostAlloc((void**)&other, XMAX, cudaHostAllocPortable));
    for (size_t X : {0ull, 4ull << 20, 8ull << 20, 16ull << 20, 24ull << 20, 32ull << 20, 48ull << 20, 64ull << 20}) {
      std::vector<double> dma;
      for (int rep = 0; rep < 15; rep++) {
        const char* S = src + (size_t)(rep % 32) * W;
        std::vector<std::thread> th;
        for (int t = 0; t < T; t++) th.emplace_back([&, t] {
          size_t part = W / T / 4096 * 4096, lo = t * part, hi = t == T - 1 ? W : lo + part;
          memcpy(slots[0] + lo, S + lo, hi - lo);
          size_t xp = X / T / 4096 * 4096;
          memcpy(other + t * xp, src + 512ull * 1024 * 1024 + t * xp, xp);
        });
        for (auto& x : th) x.join();
        CK(cudaEventRecord(t0, st));
        CK(cudaMemcpyAsync(dev, slots[0], W, cudaMemcpyHostToDevice, st));
        CK(cudaEventRecord(t1, st));
        CK(cudaStreamSynchronize(st));
        float ms; CK(cudaEventElapsedTime(&ms, t0, t1));
        dma.push_back(W / (ms * 1e-3) / 1e9);
      }
      std::sort(dma.begin(), dma.end());
      printf("8 MiB slot filled with memcpy, then %2zu MiB more written by the same %d threads: its DMA %.1f GB/s (min %.1f max %.1f)\n", X >> 20, T, dma[7], dma[0], dma[14]);
      fflush(stdout);
    }
    // Part 4: the ring with held DMAs and a non-temporal tail.
    for (size_t total : {256ull << 20, 1ull << 30})
    for (int round = 0; round < 2; round++)
    for (int L : {0, 1, 2, 3, 4, 5}) {
      const int NW = total / W;
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
            (w >= NW - L ? copy_nt : copy_plain)(slots[w % NS] + lo, src + (size_t)w * W + lo, hi - lo);
            done[w].fetch_add(1, std::memory_order_release);
          }
        });
        double s0 = now(); go = true;
        int next_dma = 0, next_free = NS;
        while (next_dma < NW) {
          int gate = next_dma < NW - L ? next_dma + L : next_dma;
          if (done[next_dma].load(std::memory_order_acquire) == T && done[gate].load(std::memory_order_acquire) == T) {
            CK(cudaMemcpyAsync(dev + (size_t)next_dma * W, slots[next_dma % NS], W, cudaMemcpyHostToDevice, st));
            CK(cudaEventRecord(ev[next_dma % NS], st));
            next_dma++;
          } else _mm_pause();
          while (next_free < NW && next_free - NS < next_dma && cudaEventQuery(ev[(next_free - NS) % NS]) == cudaSuccess) {
            freed[next_free].store(1, std::memory_order_release); next_free++;
          }
        }
        CK(cudaStreamSynchronize(st));
        double dt = now() - s0;
        for (auto& x : th) x.join();
        res.push_back(total / dt / 1e9);
      }
      std::sort(res.begin(), res.end());
      printf("ring, %4zu MiB, %d threads, DMA held until window +%d is filled, last %d windows nt: %.1f GB/s (min %.1f max %.1f)\n", total >> 20, T, L, L, res[2], res[0], res[4]);
      fflush(stdout);
    }
    return 0;
  }

  if (mix) {
    // Part 5: non-temporal windows go first, ordinary ones once cooled.
    for (size_t total : {256ull << 20, 1ull << 30})
    for (int round = 0; round < 2; round++)
    for (int P : {0, 2, 3, 4})
    for (int K : {1, 2}) {
      if (P == 0 && K == 2) continue;
      const int NW = total / W;
      auto is_nt = [&](int w) { return P > 0 && (w % P == 0 || w >= NW - 2); };
      std::vector<double> res;
      for (int rep = 0; rep < 5; rep++) {
        std::vector<std::atomic<int>> done(NW); for (auto& d : done) d = 0;
        std::vector<std::atomic<int>> freed(NW); for (int w = 0; w < NW; w++) freed[w] = w < NS ? 1 : 0;
        std::vector<char> queued(NW, 0);
        std::vector<int> slot_last(NS, -1);  // the window whose DMA the slot's event follows
        std::atomic<bool> go{false};
        std::vector<std::thread> th;
        for (int t = 0; t < T; t++) th.emplace_back([&, t] {
          while (!go.load()) {}
          size_t part = W / T / 4096 * 4096, lo = t * part, hi = t == T - 1 ? W : lo + part;
          for (int w = 0; w < NW; w++) {
            while (!freed[w].load(std::memory_order_acquire)) _mm_pause();
            (is_nt(w) ? copy_nt : copy_plain)(slots[w % NS] + lo, src + (size_t)w * W + lo, hi - lo);
            done[w].fetch_add(1, std::memory_order_release);
          }
        });
        double s0 = now(); go = true;
        int nqueued = 0, next_free = NS, oldest = 0;
        while (nqueued < NW) {
          bool any = false;
          for (int w = oldest; w < NW; w++) {
            if (queued[w]) continue;
            if (done[w].load(std::memory_order_acquire) != T) break;  // fills finish in order
            int gate = is_nt(w) ? w : std::min(w + K, NW - 1);
            if (done[gate].load(std::memory_order_acquire) != T) continue;
            CK(cudaMemcpyAsync(dev + (size_t)w * W, slots[w % NS], W, cudaMemcpyHostToDevice, st));
            CK(cudaEventRecord(ev[w % NS], st));
            slot_last[w % NS] = w; queued[w] = 1; nqueued++; any = true;
          }
          while (oldest < NW && queued[oldest]) oldest++;
          // A window's slot is free once its previous window's DMA is queued and done.
          while (next_free < NW && queued[next_free - NS] && cudaEventQuery(ev[next_free % NS]) == cudaSuccess) {
            freed[next_free].store(1, std::memory_order_release); next_free++;
          }
          if (!any) _mm_pause();
        }
        CK(cudaStreamSynchronize(st));
        double dt = now() - s0;
        for (auto& x : th) x.join();
        res.push_back(total / dt / 1e9);
      }
      std::sort(res.begin(), res.end());
      if (P == 0) printf("ring, %4zu MiB, %d threads, memcpy, in order: %.1f GB/s (min %.1f max %.1f)\n", total >> 20, T, res[2], res[0], res[4]);
      else printf("ring, %4zu MiB, %d threads, every %d. window nt, others queued %d windows later: %.1f GB/s (min %.1f max %.1f)\n", total >> 20, T, P, K, res[2], res[0], res[4]);
      fflush(stdout);
    }
    std::vector<char> back(W);
    CK(cudaMemcpy(back.data(), dev + (1ull << 30) - 3 * W, W, cudaMemcpyDeviceToHost));
    printf("verify a late window: %s\n", memcmp(back.data(), src + (1ull << 30) - 3 * W, W) == 0 ? "ok" : "BAD");
    return 0;
  }

  if (first) {
    // Part 6: the first K windows non-temporal, the rest memcpy; K in turn, 6 rounds of
    // 3 passes each, per size.
    const int Ks[] = {0, 1, 2, 3, 4, 6, 1000};
    for (size_t total : {256ull << 20, 1ull << 30}) {
      const int NW = total / W;
      std::vector<std::vector<double>> res(7);
      for (int round = 0; round < 6; round++)
      for (int ki = 0; ki < 7; ki++)
      for (int rep = 0; rep < 3; rep++) {
        const int K = Ks[ki];
        std::vector<std::atomic<int>> done(NW); for (auto& d : done) d = 0;
        std::vector<std::atomic<int>> freed(NW); for (int w = 0; w < NW; w++) freed[w] = w < NS ? 1 : 0;
        std::atomic<bool> go{false};
        std::vector<std::thread> th;
        for (int t = 0; t < T; t++) th.emplace_back([&, t] {
          while (!go.load()) {}
          size_t part = W / T / 4096 * 4096, lo = t * part, hi = t == T - 1 ? W : lo + part;
          for (int w = 0; w < NW; w++) {
            while (!freed[w].load(std::memory_order_acquire)) _mm_pause();
            (w < K ? copy_nt : copy_plain)(slots[w % NS] + lo, src + (size_t)w * W + lo, hi - lo);
            done[w].fetch_add(1, std::memory_order_release);
          }
        });
        double s0 = now(); go = true;
        int next_dma = 0, next_free = NS;
        while (next_dma < NW) {
          if (done[next_dma].load(std::memory_order_acquire) == T) {
            CK(cudaMemcpyAsync(dev + (size_t)next_dma * W, slots[next_dma % NS], W, cudaMemcpyHostToDevice, st));
            CK(cudaEventRecord(ev[next_dma % NS], st));
            next_dma++;
          } else _mm_pause();
          while (next_free < NW && next_free - NS < next_dma && cudaEventQuery(ev[(next_free - NS) % NS]) == cudaSuccess) {
            freed[next_free].store(1, std::memory_order_release); next_free++;
          }
        }
        CK(cudaStreamSynchronize(st));
        double dt = now() - s0;
        for (auto& x : th) x.join();
        res[ki].push_back(total / dt / 1e9);
      }
      for (int ki = 0; ki < 7; ki++) {
        auto& r = res[ki];
        std::sort(r.begin(), r.end());
        printf("ring, %4zu MiB, %d threads, first %4d windows nt, the rest memcpy: median %.1f GB/s (p25 %.1f p75 %.1f, %zu passes)\n", total >> 20, T, Ks[ki], r[r.size() / 2], r[r.size() / 4], r[r.size() * 3 / 4], r.size());
      }
      fflush(stdout);
    }
    std::vector<char> back(W);
    CK(cudaMemcpy(back.data(), dev + (1ull << 30) - W, W, cudaMemcpyDeviceToHost));
    printf("verify last window: %s\n", memcmp(back.data(), src + (1ull << 30) - W, W) == 0 ? "ok" : "BAD");
    return 0;
  }

  // Part 1: one slot filled by T threads, then its DMA alone, timed by events.
  for (int m = 0; m < NF; m++) {
    std::vector<double> dma, fill;
    for (int rep = 0; rep < 21; rep++) {
      const char* S = src + (size_t)(rep % 64) * W;
      double f0 = now();
      std::vector<std::thread> th;
      for (int t = 0; t < T; t++) th.emplace_back([&, t] {
        size_t part = W / T / 4096 * 4096, lo = t * part, hi = t == T - 1 ? W : lo + part;
        fns[m](slots[0] + lo, S + lo, hi - lo);
      });
      for (auto& x : th) x.join();
      fill.push_back(W / (now() - f0) / 1e9);
      CK(cudaEventRecord(t0, st));
      CK(cudaMemcpyAsync(dev, slots[0], W, cudaMemcpyHostToDevice, st));
      CK(cudaEventRecord(t1, st));
      CK(cudaStreamSynchronize(st));
      float ms; CK(cudaEventElapsedTime(&ms, t0, t1));
      dma.push_back(W / (ms * 1e-3) / 1e9);
    }
    std::sort(dma.begin(), dma.end()); std::sort(fill.begin(), fill.end());
    printf("one 8 MiB slot, filled by %d threads with %-18s: its DMA %.1f GB/s (min %.1f max %.1f); fill with thread start %.1f GB/s\n", T, names[m], dma[10], dma[0], dma[20], fill[10]);
    fflush(stdout);
  }

  // Part 2: the ring, as staging_ceiling.cu.
  for (size_t total : {256ull << 20, 1ull << 30})
  for (int round = 0; round < 2; round++)
  for (int m = 0; m < NF; m++) {
    const int NW = total / W;
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
          fns[m](slots[w % NS] + lo, src + (size_t)w * W + lo, hi - lo);
          done[w].fetch_add(1, std::memory_order_release);
        }
      });
      double s0 = now(); go = true;
      int next_dma = 0, next_free = NS;
      while (next_dma < NW) {
        if (done[next_dma].load(std::memory_order_acquire) == T) {
          CK(cudaMemcpyAsync(dev + (size_t)next_dma * W, slots[next_dma % NS], W, cudaMemcpyHostToDevice, st));
          CK(cudaEventRecord(ev[next_dma % NS], st));
          next_dma++;
        } else _mm_pause();
        while (next_free < NW && next_free - NS < next_dma && cudaEventQuery(ev[(next_free - NS) % NS]) == cudaSuccess) {
          freed[next_free].store(1, std::memory_order_release); next_free++;
        }
      }
      CK(cudaStreamSynchronize(st));
      double dt = now() - s0;
      for (auto& x : th) x.join();
      res.push_back(total / dt / 1e9);
    }
    std::sort(res.begin(), res.end());
    printf("ring, %4zu MiB, %d threads, %-18s: %.1f GB/s (min %.1f max %.1f)\n", total >> 20, T, names[m], res[2], res[0], res[4]);
    fflush(stdout);
  }
  std::vector<char> back(W);
  CK(cudaMemcpy(back.data(), dev + (1ull << 30) - W, W, cudaMemcpyDeviceToHost));
  printf("verify last window: %s\n", memcmp(back.data(), src + (1ull << 30) - W, W) == 0 ? "ok" : "BAD");
  return 0;
}
