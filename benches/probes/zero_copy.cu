// Probe (not project code): can a kernel reading page-locked host memory directly
// (zero-copy) move many small pinned tensors to the device faster than DMA?
// Build and run on the GPU machine: nvcc -O3 -arch=sm_90 -o zc zero_copy.cu -lcuda && ./zc
// Results: benches/results/issue11_part5.txt (run 1); docs/performance.md, issue 11, third part.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <chrono>
#include <cuda.h>
#include <cuda_runtime.h>
struct Piece { unsigned long long src, dst_off, len; };
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("ERR %s line %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

extern "C" __global__ void k_plain(const Piece* __restrict__ pieces, unsigned n, unsigned char* __restrict__ dst) {
  for (unsigned i = blockIdx.x; i < n; i += gridDim.x) {
    const Piece p = pieces[i];
    const unsigned char* s = (const unsigned char*)p.src; unsigned char* d = dst + p.dst_off;
    unsigned long long head = 0;
    if (((p.src | (unsigned long long)d) & 15ull) == 0) {
      const unsigned long long n16 = p.len >> 4;
      const uint4* s4 = (const uint4*)s; uint4* d4 = (uint4*)d;
      for (unsigned long long j = threadIdx.x; j < n16; j += blockDim.x) d4[j] = s4[j];
      head = n16 << 4;
    }
    for (unsigned long long j = head + threadIdx.x; j < p.len; j += blockDim.x) d[j] = s[j];
  }
}
template <int U>
__global__ void k_unroll(const Piece* __restrict__ pieces, unsigned n, unsigned char* __restrict__ dst) {
  for (unsigned i = blockIdx.x; i < n; i += gridDim.x) {
    const Piece p = pieces[i];
    const unsigned char* s = (const unsigned char*)p.src; unsigned char* d = dst + p.dst_off;
    unsigned long long head = 0;
    if (((p.src | (unsigned long long)d) & 15ull) == 0) {
      const unsigned long long n16 = p.len >> 4;
      const uint4* s4 = (const uint4*)s; uint4* d4 = (uint4*)d;
      unsigned long long j = threadIdx.x;
      const unsigned long long step = blockDim.x;
      for (; j + (U - 1) * step < n16; j += U * step) {
        uint4 v[U];
#pragma unroll
        for (int u = 0; u < U; u++) v[u] = s4[j + u * step];
#pragma unroll
        for (int u = 0; u < U; u++) d4[j + u * step] = v[u];
      }
      for (; j < n16; j += step) d4[j] = s4[j];
      head = n16 << 4;
    }
    for (unsigned long long j = head + threadIdx.x; j < p.len; j += blockDim.x) d[j] = s[j];
  }
}

static double now_us() { return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now().time_since_epoch()).count(); }
static double median(std::vector<double> v) { std::sort(v.begin(), v.end()); return v[v.size() / 2]; }

// Split pieces into chunks of at most `chunk` bytes (multiple of 16).
static std::vector<Piece> split(const std::vector<Piece>& in, size_t chunk) {
  std::vector<Piece> out;
  for (auto p : in) {
    for (unsigned long long o = 0; o < p.len; o += chunk) {
      unsigned long long l = std::min<unsigned long long>(chunk, p.len - o);
      out.push_back({p.src + o, p.dst_off + o, l});
    }
  }
  return out;
}

int main() {
  cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  int uva = 0, hp = 0; cudaDeviceGetAttribute(&uva, cudaDevAttrUnifiedAddressing, 0);
  cudaDeviceGetAttribute(&hp, cudaDevAttrCanUseHostPointerForRegisteredMem, 0);
  printf("unified addressing %d, host pointer for registered mem %d\n", uva, hp);
  // Peak: one 256 MiB DMA vs one kernel read of 256 MiB.
  size_t big = 256 << 20;
  unsigned char *hbig, *dbig; CK(cudaHostAlloc((void**)&hbig, big, cudaHostAllocPortable)); CK(cudaMalloc(&dbig, big));
  memset(hbig, 7, big);
  Piece* hdesc; CK(cudaHostAlloc((void**)&hdesc, 1 << 22, cudaHostAllocPortable));
  Piece* ddesc; CK(cudaMalloc(&ddesc, 1 << 22));
  unsigned char* dout; CK(cudaMalloc(&dout, 64 << 20));
  auto time_dma = [&](void* d, void* h, size_t n, int reps) {
    std::vector<double> t;
    for (int r = 0; r < reps; r++) { double a = now_us(); CK(cudaMemcpyAsync(d, h, n, cudaMemcpyHostToDevice, st)); CK(cudaStreamSynchronize(st)); t.push_back(now_us() - a); }
    return median(t);
  };
  double tb = time_dma(dbig, hbig, big, 7);
  printf("DMA 256 MiB: %.1f GB/s\n", big / tb / 1e3);
  // kernel reading 256 MiB in 64 KiB chunks
  auto run_kernel = [&](const std::vector<Piece>& ps, unsigned char* dst, int variant, bool host_desc, int grid_cap, int block, int reps, double* kernel_us) {
    memcpy(hdesc, ps.data(), ps.size() * sizeof(Piece));
    std::vector<double> wall, kt;
    for (int r = 0; r < reps; r++) {
      double a = now_us();
      const Piece* dp = hdesc;
      if (!host_desc) { CK(cudaMemcpyAsync(ddesc, hdesc, ps.size() * sizeof(Piece), cudaMemcpyHostToDevice, st)); dp = ddesc; }
      unsigned n = ps.size(); unsigned grid = std::min<unsigned>(n, grid_cap);
      cudaEventRecord(e0, st);
      if (variant == 0) k_plain<<<grid, block, 0, st>>>(dp, n, dst);
      else if (variant == 2) k_unroll<2><<<grid, block, 0, st>>>(dp, n, dst);
      else if (variant == 4) k_unroll<4><<<grid, block, 0, st>>>(dp, n, dst);
      else k_unroll<8><<<grid, block, 0, st>>>(dp, n, dst);
      cudaEventRecord(e1, st);
      CK(cudaStreamSynchronize(st));
      wall.push_back(now_us() - a);
      float ms; cudaEventElapsedTime(&ms, e0, e1); kt.push_back(ms * 1e3);
    }
    CK(cudaGetLastError());
    *kernel_us = median(kt);
    return median(wall);
  };
  for (size_t chunk : {size_t(16) << 10, size_t(64) << 10, size_t(256) << 10}) for (int v : {0, 4, 8}) {
    std::vector<Piece> ps = split({{(unsigned long long)hbig, 0, big}}, chunk);
    double k; double w = run_kernel(ps, dbig, v, true, 1 << 30, 256, 5, &k);
    printf("kernel read 256 MiB, chunk %zu KiB, unroll %d: wall %.1f GB/s, kernel %.1f GB/s\n", chunk >> 10, v, big / w / 1e3, big / k / 1e3);
  }
  // 64 images of 3x224x224 u8, each its own pinned allocation.
  const size_t img = 3 * 224 * 224;
  std::vector<unsigned char*> imgs(64);
  std::vector<Piece> ip;
  size_t off = 0;
  for (int i = 0; i < 64; i++) { CK(cudaHostAlloc((void**)&imgs[i], img, cudaHostAllocPortable)); for (size_t b = 0; b < img; b++) imgs[i][b] = (unsigned char)(i * 31 + b * 7); ip.push_back({(unsigned long long)imgs[i], off, img}); off += (img + 255) / 256 * 256; }
  size_t total = img * 64;
  {
    std::vector<double> t;
    for (int r = 0; r < 20; r++) { double a = now_us(); size_t o = 0; for (int i = 0; i < 64; i++) { CK(cudaMemcpyAsync(dout + o, imgs[i], img, cudaMemcpyHostToDevice, st)); o += (img + 255) / 256 * 256; } CK(cudaStreamSynchronize(st)); t.push_back(now_us() - a); }
    printf("64 images, 64 DMAs: %.1f GB/s (%.1f us)\n", total / median(t) / 1e3, median(t));
    double tc = time_dma(dout, hbig, total, 20);
    printf("64 images' bytes, one contiguous DMA: %.1f GB/s (%.1f us)\n", total / tc / 1e3, tc);
  }
  for (size_t chunk : {size_t(8) << 10, size_t(16) << 10, size_t(32) << 10, size_t(64) << 10, size_t(1) << 20})
    for (int v : {0, 2, 4, 8}) for (int blk : {256, 512}) for (int hd : {1, 0}) {
      std::vector<Piece> ps = split(ip, chunk);
      double k; double w = run_kernel(ps, dout, v, hd, 1 << 30, blk, 20, &k);
      printf("64 images kernel chunk %zu KiB unroll %d block %d desc %s: %u pieces wall %.1f us = %.1f GB/s, kernel %.1f us = %.1f GB/s\n", chunk >> 10, v, blk, hd ? "host" : "dev", (unsigned)ps.size(), w, total / w / 1e3, k, total / k / 1e3);
    }
  // verify once
  {
    std::vector<unsigned char> back(total + 64 * 256);
    CK(cudaMemset(dout, 0, 64 << 20));
    double k; run_kernel(split(ip, 16 << 10), dout, 4, true, 1 << 30, 256, 1, &k);
    CK(cudaMemcpy(back.data(), dout, off, cudaMemcpyDeviceToHost));
    size_t bad = 0; for (int i = 0; i < 64; i++) bad += memcmp(back.data() + ip[i].dst_off, imgs[i], img) != 0;
    printf("64 images verify: %zu bad\n", bad);
  }
  // 1000 x 1 KiB
  std::vector<Piece> tp;
  for (int i = 0; i < 1000; i++) tp.push_back({(unsigned long long)(hbig + i * 1088), (unsigned long long)i * 1024, 1024});
  {
    std::vector<double> t;
    for (int r = 0; r < 50; r++) { double a = now_us(); CK(cudaMemcpyAsync(dout, hbig, 1 << 20, cudaMemcpyHostToDevice, st)); CK(cudaStreamSynchronize(st)); t.push_back(now_us() - a); }
    printf("1 MiB DMA + sync: %.1f us\n", median(t));
  }
  for (int v : {0, 4}) for (int blk : {64, 128, 256}) for (int hd : {1, 0}) {
    double k; double w = run_kernel(tp, dout, v, hd, 1 << 30, blk, 50, &k);
    printf("1000 x 1 KiB kernel unroll %d block %d desc %s: wall %.1f us, kernel %.1f us\n", v, blk, hd ? "host" : "dev", w, k);
  }
  return 0;
}
