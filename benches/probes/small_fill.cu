// Probe (not project code): what a serving step's staging fill costs, and why the copy
// threads did not make it faster (issue 23, session 37).
//
// The sources are the bench's (benches/copy_into.py) host tensors: 16 of 256 B to 4 KiB
// (19 KiB), 16 and 8 of 256 B to 256 KiB (280 KiB, 492 KiB), separate pageable
// allocations, warm (the same ones every step). They are copied into one page-locked
// slot at 256-byte-aligned offsets (as pinlane's one-slot step does), then a kernel reads
// the slot through its mapped address and writes device memory (as pinlane's scatter
// kernel does), then the stream is synchronised. Per fill style: the fill alone, and the
// whole step (fill + kernel + synchronisation), medians of 400 steps after 50 warm-up.
//
// Fill styles: one thread (memcpy; SSE streaming stores as pinlane's copy_nt_x86; AVX
// streaming stores), and a pool of T threads plus the caller (pieces of 16 KiB from a
// shared counter, as pinlane's CopyPool), with the caller waiting for the last piece by
// spinning on the counter or by sleeping on a condition variable (as CopyPool's
// Ticket::finish), and the workers either spinning between steps or asleep (woken by
// the submission, as after CopyPool's 50 us spin).
//
// Build and run on the GPU machine:
//   nvcc -O3 -Xcompiler -march=native -o small_fill small_fill.cu && ./small_fill
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <immintrin.h>
#include <mutex>
#include <random>
#include <thread>
#include <vector>
#include <cuda_runtime.h>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("ERR %s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
static double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

static void copy_sse_nt(char* d, const char* s, size_t n) {
  size_t head = std::min<size_t>((16 - ((uintptr_t)d & 15)) & 15, n);
  memcpy(d, s, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) {
    __m128i a = _mm_loadu_si128((const __m128i*)(s + i)), b = _mm_loadu_si128((const __m128i*)(s + i + 16));
    __m128i c = _mm_loadu_si128((const __m128i*)(s + i + 32)), e = _mm_loadu_si128((const __m128i*)(s + i + 48));
    _mm_stream_si128((__m128i*)(d + i), a); _mm_stream_si128((__m128i*)(d + i + 16), b);
    _mm_stream_si128((__m128i*)(d + i + 32), c); _mm_stream_si128((__m128i*)(d + i + 48), e);
  }
  memcpy(d + i, s + i, n - i);
}
__attribute__((target("avx2"))) static void copy_avx_nt(char* d, const char* s, size_t n) {
  size_t head = std::min<size_t>((32 - ((uintptr_t)d & 31)) & 31, n);
  memcpy(d, s, head);
  size_t i = head;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256((const __m256i*)(s + i)), b = _mm256_loadu_si256((const __m256i*)(s + i + 32));
    __m256i c = _mm256_loadu_si256((const __m256i*)(s + i + 64)), e = _mm256_loadu_si256((const __m256i*)(s + i + 96));
    _mm256_stream_si256((__m256i*)(d + i), a); _mm256_stream_si256((__m256i*)(d + i + 32), b);
    _mm256_stream_si256((__m256i*)(d + i + 64), c); _mm256_stream_si256((__m256i*)(d + i + 96), e);
  }
  memcpy(d + i, s + i, n - i);
}

enum Store { MEMCPY, SSE_NT, AVX_NT };
static void copy(Store st, char* d, const char* s, size_t n) {
  if (st == MEMCPY || n < 256) memcpy(d, s, n);
  else if (st == SSE_NT) copy_sse_nt(d, s, n);
  else copy_avx_nt(d, s, n);
}

struct Task { const char* s; char* d; size_t n; };

// A pool as CopyPool: workers take pieces from `next`, count them in `done`; an idle
// worker spins for `spin_s` watching for a job, then sleeps on `cv` until a job or a
// wake-up (`kick`, as CopyPool::prewake) comes, and spins again.
struct Pool {
  double spin_s;
  std::vector<std::thread> th;
  std::atomic<int> gen{0}, kick{0}, sleepers{0};
  std::atomic<bool> stop{false};
  std::mutex m; std::condition_variable cv, fin;
  // The same pieces every job (set once: a worker that wakes after its job has ended
  // draws an index past `n` and touches nothing, or a piece of the next job).
  const std::vector<Task> pieces; std::atomic<Store> st{SSE_NT};
  std::atomic<int> next{0}, done{0}, n{0};
  Pool(int w, double spin, std::vector<Task> cut) : spin_s(spin), pieces(std::move(cut)) {
    for (int k = 0; k < w; k++) th.emplace_back([this] { run(); });
  }
  ~Pool() { { std::lock_guard<std::mutex> g(m); stop = true; } cv.notify_all(); for (auto& t : th) t.join(); }
  void work() {
    for (;;) {
      int i = next.fetch_add(1);
      if (i >= n.load()) return;
      copy(st.load(), pieces[i].d, pieces[i].s, pieces[i].n);
      _mm_sfence();
      if (done.fetch_add(1, std::memory_order_release) + 1 == n.load()) { std::lock_guard<std::mutex> g(m); fin.notify_all(); }
    }
  }
  void run() {
    int seen = 0;
    for (;;) {
      double until = now() + spin_s;
      while (gen.load(std::memory_order_acquire) == seen && !stop && now() < until) _mm_pause();
      if (stop) return;
      if (gen.load() == seen) {
        std::unique_lock<std::mutex> g(m);
        int k = kick.load();
        sleepers++;
        cv.wait(g, [&] { return gen.load() != seen || kick.load() != k || stop; });
        sleepers--;
        continue;
      }
      seen = gen.load();
      work();
    }
  }
  void wake() {
    if (sleepers.load() > 0) { { std::lock_guard<std::mutex> g(m); kick++; } cv.notify_all(); }
  }
  // Runs a job; `prewake_us` >= 0: wakes the workers that long before (the caller busy
  // meanwhile, as with its checks); the caller works too, then waits by spinning or on
  // the condvar.
  void job(Store s, bool caller_spins, double prewake_us) {
    if (prewake_us >= 0) { wake(); double until = now() + prewake_us * 1e-6; while (now() < until) {} }
    n = 0; st = s; done = 0; next = 0; n = (int)pieces.size();
    { std::lock_guard<std::mutex> g(m); gen++; }
    if (sleepers.load() > 0) cv.notify_all();
    work();
    if (caller_spins) { while (done.load(std::memory_order_acquire) < n.load()) _mm_pause(); }
    else { std::unique_lock<std::mutex> g(m); fin.wait(g, [&] { return done.load(std::memory_order_acquire) >= n.load(); }); }
  }
};

__global__ void consume(const uint4* src, uint4* dst, size_t n16) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n16; i += (size_t)gridDim.x * blockDim.x) dst[i] = src[i];
}

static std::vector<size_t> sizes(int n, int seed, int top) {
  // benches/copy_into.py draws its sizes with Python's random; these are its lists.
  (void)seed; (void)top;
  if (n == 16 && top == 12) return {312, 320, 392, 456, 456, 520, 576, 584, 888, 944, 984, 1696, 1976, 2896, 3032, 3392};
  if (n == 16) return {888, 2864, 2864, 3208, 3832, 6584, 7000, 7792, 8672, 12440, 13888, 14936, 17544, 22104, 23784, 138632};
  return {360, 2704, 9392, 25056, 34680, 79080, 156104, 196472};
}

static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

int main() {
  CK(cudaSetDevice(0));
  cudaStream_t s; CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  char* slot; CK(cudaHostAlloc(&slot, 8 << 20, cudaHostAllocPortable | cudaHostAllocMapped));
  char* slot_dev; CK(cudaHostGetDevicePointer((void**)&slot_dev, slot, 0));
  char* out; CK(cudaMalloc(&out, 8 << 20));
  unsigned hw = std::thread::hardware_concurrency();
  printf("host threads: %u\n", hw);
  struct Cfg { const char* name; int n, top; };
  Cfg cfgs[] = {{"16 x 19 KiB", 16, 12}, {"16 x 280 KiB", 16, 18}, {"8 x 492 KiB", 8, 18}};
  for (auto& c : cfgs) {
    auto sz = sizes(c.n, 0, c.top);
    std::vector<char*> src; std::vector<Task> tasks; size_t off = 0, total = 0;
    for (size_t k = 0; k < sz.size(); k++) {
      char* p = (char*)malloc(sz[k]); for (size_t i = 0; i < sz[k]; i++) p[i] = (char)(i * 7 + k);
      src.push_back(p); tasks.push_back({p, slot + off, sz[k]}); off = (off + sz[k] + 255) / 256 * 256; total += sz[k];
    }
    size_t end = off;
    // Pieces of 16 KiB (CopyPool's PIECE_MIN), small tasks kept whole.
    std::vector<Task> cut;
    for (auto& t : tasks) for (size_t o = 0; o < t.n; o += 16384) cut.push_back({t.s + o, t.d + o, std::min<size_t>(16384, t.n - o)});
    printf("\n%s: %zu bytes in %zu tensors, %zu pieces of <= 16 KiB, staged end %zu\n", c.name, total, tasks.size(), cut.size(), end);
    printf("%-64s %9s %9s %9s %8s\n", "fill; device side", "fill us", "step us", "device us", "fill GB/s");
    auto check = [&]() {
      for (auto& t : tasks) if (memcmp(t.d, t.s, t.n)) { printf("MISMATCH\n"); exit(1); }
    };
    // How the device takes the staged bytes: the kernel reading the slot's mapped
    // address (as pinlane's scatter kernel does) with 64 or 264 blocks, or one DMA of the
    // slot into device memory.
    const char* how_names[] = {"kernel 64 blocks", "kernel 264 blocks", "DMA"};
    auto measure = [&](const char* name, auto&& fill) {
      for (int how = 0; how < 3; how++) {
        std::vector<double> f, w;
        for (int r = 0; r < 450; r++) {
          memset(slot, 0, 256);  // the first line changes each step (a serving loop's slot is rewritten)
          double t0 = now();
          fill();
          double t1 = now();
          if (how == 2) CK(cudaMemcpyAsync(out, slot, end, cudaMemcpyHostToDevice, s));
          else consume<<<how ? 264 : 64, 256, 0, s>>>((const uint4*)slot_dev, (uint4*)out, (end + 15) / 16);
          CK(cudaStreamSynchronize(s));
          double t2 = now();
          if (r == 0) check();
          if (r >= 50) { f.push_back((t1 - t0) * 1e6); w.push_back((t2 - t0) * 1e6); }
          // the steps are apart as a serving loop's are (other work between them)
          double until = now() + 150e-6; while (now() < until) {}
        }
        double mf = median(f), mw = median(w);
        char full[160]; snprintf(full, sizeof full, "%s; %s", name, how_names[how]);
        printf("%-64s %9.2f %9.2f %9.2f %8.1f\n", full, mf, mw, mw - mf, total / mf / 1e3);
      }
    };
    measure("1 thread memcpy", [&] { for (auto& t : tasks) copy(MEMCPY, t.d, t.s, t.n); });
    measure("1 thread SSE streaming (pinlane's)", [&] { for (auto& t : tasks) copy(SSE_NT, t.d, t.s, t.n); _mm_sfence(); });
    // 11 workers + the caller (pinlane's 12 copy threads on 16 cores), SSE streaming.
    struct V { const char* name; double spin_s; bool caller_spins; double prewake_us; };
    V vs[] = {
      {"11+1 thr, workers awake (spin 1 s), caller spins", 1.0, true, -1},
      {"11+1 thr, workers awake (spin 1 s), caller sleeps", 1.0, false, -1},
      {"11+1 thr, asleep (spin 50 us), caller sleeps", 50e-6, false, -1},
      {"11+1 thr, asleep (spin 50 us), caller spins", 50e-6, true, -1},
      {"11+1 thr, asleep, woken 3 us ahead, caller spins", 50e-6, true, 3},
      {"11+1 thr, asleep, woken 8 us ahead, caller spins", 50e-6, true, 8},
      {"11+1 thr, asleep, woken 15 us ahead, caller spins", 50e-6, true, 15},
      {"3+1 thr, asleep, woken 8 us ahead, caller spins", 50e-6, true, 8},
    };
    for (auto& v : vs) {
      Pool p(v.name[0] == '3' ? 3 : 11, v.spin_s, cut);
      measure(v.name, [&] { p.job(SSE_NT, v.caller_spins, v.prewake_us); });
    }
    for (auto p : src) free(p);
  }
  return 0;
}
