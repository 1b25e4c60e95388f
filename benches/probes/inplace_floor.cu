// Probe (not project code): the device's floor for one in-place serving step of issue 23,
// with nothing of pinlane or torch around it: 8 page-locked sources (copy_into.py's
// "8 tensors, 492 KiB" sizes) into 256-byte-aligned slices of one device buffer, each
// way below launched and followed by cudaStreamSynchronize, timed on the host.
// Which kernel shape reads them fastest, and how far is the fastest from the link?
// Build and run on the GPU machine:
//   nvcc -O3 -arch=sm_90 -o inplace_floor inplace_floor.cu && ./inplace_floor
// Each row: median (and 10th percentile) of 3000 timed steps after 300 warm-up ones, one
// thread, a non-blocking stream of its own. Every way's bytes are checked once.
#include <cuda_runtime.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#define CK(x)                                                                      \
  do {                                                                             \
    cudaError_t e = (x);                                                           \
    if (e != cudaSuccess) {                                                        \
      printf("ERR %s line %d: %s\n", #x, __LINE__, cudaGetErrorString(e));         \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

// As kernels/gather.cu.
struct GatherPiece {
  unsigned long long src, dst_off, len, zeros;
};

__device__ __forceinline__ void copy_piece(const GatherPiece p, unsigned char* __restrict__ dst) {
  const unsigned char* s = reinterpret_cast<const unsigned char*>(p.src);
  unsigned char* d = dst + p.dst_off;
  unsigned long long head = 0;
  if (((p.src | reinterpret_cast<unsigned long long>(d)) & 15ull) == 0) {
    const unsigned long long n16 = p.len >> 4;
    const uint4* s4 = reinterpret_cast<const uint4*>(s);
    uint4* d4 = reinterpret_cast<uint4*>(d);
    for (unsigned long long j = threadIdx.x; j < n16; j += blockDim.x) d4[j] = s4[j];
    head = n16 << 4;
  }
  for (unsigned long long j = head + threadIdx.x; j < p.len; j += blockDim.x) d[j] = s[j];
  for (unsigned long long j = p.len + threadIdx.x; j < p.len + p.zeros; j += blockDim.x) d[j] = 0;
}

__global__ void k_pointer(const GatherPiece* __restrict__ pieces, unsigned n, unsigned char* __restrict__ dst) {
  for (unsigned i = blockIdx.x; i < n; i += gridDim.x) copy_piece(pieces[i], dst);
}

template <int N>
struct InlineArgs {
  unsigned long long dst;
  unsigned n, pad;
  GatherPiece pieces[N];
};

template <int N>
__global__ void k_inline(const InlineArgs<N> a) {
  unsigned char* dst = reinterpret_cast<unsigned char*>(a.dst);
  const unsigned n = a.n < N ? a.n : N;
  for (unsigned i = blockIdx.x; i < n; i += gridDim.x) copy_piece(a.pieces[i], dst);
}

// The launch's parameters for the first `n` (at most N) of `p`, into `dst`.
template <int N>
static InlineArgs<N> inline_args(const std::vector<GatherPiece>& p, unsigned n, unsigned char* dst) {
  InlineArgs<N> a;
  memset(&a, 0, sizeof a);
  a.dst = (unsigned long long)dst;
  a.n = n;
  memcpy(a.pieces, p.data(), n * sizeof(GatherPiece));
  return a;
}

__global__ void k_empty() {}

// The host time of `f`, then `after` untimed (the launch-call rows synchronise there).
static double row(const char* name, const std::function<void()>& f, const std::function<void()>& after = [] {}) {
  const int warm = 300, reps = 3000;
  for (int i = 0; i < warm; i++) { f(); after(); }
  std::vector<double> v(reps);
  for (int i = 0; i < reps; i++) {
    auto t0 = std::chrono::steady_clock::now();
    f();
    v[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    after();
  }
  std::sort(v.begin(), v.end());
  printf("%-76s median %6.2f us  p10 %6.2f us\n", name, v[reps / 2], v[reps / 10]);
  fflush(stdout);
  return v[reps / 2];
}

int main() {
  const size_t sizes[8] = {9392, 196472, 2704, 34680, 156104, 360, 25056, 79080};
  size_t total = 0, off[8], end = 0;
  for (int i = 0; i < 8; i++) {
    total += sizes[i];
    off[i] = end;
    end = (end + sizes[i] + 255) / 256 * 256;
  }
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  unsigned char* src[8];
  for (int i = 0; i < 8; i++) {
    CK(cudaHostAlloc(reinterpret_cast<void**>(&src[i]), sizes[i], cudaHostAllocDefault));
    for (size_t j = 0; j < sizes[i]; j++) src[i][j] = (unsigned char)(j * 31 + i * 7 + 1);
  }
  unsigned char* dst;
  CK(cudaMalloc(&dst, end));
  unsigned char* contig;  // the same bytes in one page-locked block, for one DMA
  CK(cudaHostAlloc(reinterpret_cast<void**>(&contig), total, cudaHostAllocDefault));
  GatherPiece* host_desc;  // descriptors in page-locked memory the device maps (a slot)
  CK(cudaHostAlloc(reinterpret_cast<void**>(&host_desc), 1024 * sizeof(GatherPiece), cudaHostAllocDefault));
  GatherPiece* dev_desc;
  CK(cudaMalloc(&dev_desc, 1024 * sizeof(GatherPiece)));
  std::vector<unsigned char> back(end);

  auto cut = [&](size_t piece, std::vector<GatherPiece>& out) {
    out.clear();
    for (int i = 0; i < 8; i++)
      for (size_t p = 0; p < sizes[i]; p += piece)
        out.push_back({(unsigned long long)(src[i] + p), off[i] + p, std::min(piece, sizes[i] - p), 0});
  };
  auto check = [&](const char* name) {
    CK(cudaStreamSynchronize(s));
    CK(cudaMemcpy(back.data(), dst, end, cudaMemcpyDeviceToHost));
    bool ok = true;
    for (int i = 0; i < 8; i++) ok = ok && memcmp(back.data() + off[i], src[i], sizes[i]) == 0;
    printf("  %s: bytes %s\n", name, ok ? "ok" : "WRONG");
    CK(cudaMemset(dst, 0, end));
    CK(cudaDeviceSynchronize());
  };
  printf("8 page-locked sources, %zu bytes, into slices of one device buffer\n", total);
  std::vector<GatherPiece> p;

  row("empty kernel + sync", [&] {
    k_empty<<<1, 32, 0, s>>>();
    CK(cudaStreamSynchronize(s));
  });
  row("one DMA of the bytes contiguous (one page-locked block) + sync", [&] {
    CK(cudaMemcpyAsync(dst, contig, total, cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
  });
  row("8 DMAs, one a source + sync (torch's per-tensor copy_, without torch)", [&] {
    for (int i = 0; i < 8; i++) CK(cudaMemcpyAsync(dst + off[i], src[i], sizes[i], cudaMemcpyHostToDevice, s));
    CK(cudaStreamSynchronize(s));
  });
  check("8 DMAs");

  for (size_t piece : {4096, 8192, 16384}) {
    cut(piece, p);
    memcpy(host_desc, p.data(), p.size() * sizeof(GatherPiece));
    CK(cudaMemcpy(dev_desc, p.data(), p.size() * sizeof(GatherPiece), cudaMemcpyHostToDevice));
    for (unsigned block : {256u, 512u, 1024u}) {
      if (block * 16 > piece * 2) continue;
      char name[160];
      unsigned n = (unsigned)p.size();
      snprintf(name, sizeof name, "kernel, descriptors in host memory: %zu B pieces (%u), %u threads + sync", piece, n, block);
      row(name, [&] {
        k_pointer<<<n, block, 0, s>>>(host_desc, n, dst);
        CK(cudaStreamSynchronize(s));
      });
      check(name);
      snprintf(name, sizeof name, "kernel, descriptors in device memory: %zu B pieces (%u), %u threads + sync", piece, n, block);
      row(name, [&] {
        k_pointer<<<n, block, 0, s>>>(dev_desc, n, dst);
        CK(cudaStreamSynchronize(s));
      });
      check(name);
      if (n <= 127) {
        const InlineArgs<127> a = inline_args<127>(p, n, dst);
        snprintf(name, sizeof name, "kernel, descriptors in the launch: %zu B pieces (%u), %u threads + sync", piece, n, block);
        row(name, [&] {
          k_inline<<<n, block, 0, s>>>(a);
          CK(cudaStreamSynchronize(s));
        });
        check(name);
        snprintf(name, sizeof name, "  the same, descriptors filled at each step");
        row(name, [&] {
          InlineArgs<127> b;
          b.dst = (unsigned long long)dst;
          b.n = n;
          b.pad = 0;
          unsigned k = 0;
          for (int i = 0; i < 8; i++)
            for (size_t q = 0; q < sizes[i]; q += piece)
              b.pieces[k++] = {(unsigned long long)(src[i] + q), off[i] + q, std::min(piece, sizes[i] - q), 0};
          k_inline<<<n, block, 0, s>>>(b);
          CK(cudaStreamSynchronize(s));
        });
      }
    }
  }
  // The launch call alone, what the host spends before its next step (idle device).
  {
    auto sync = [&] { CK(cudaStreamSynchronize(s)); };
    row("launch call only: empty kernel", [&] { k_empty<<<1, 32, 0, s>>>(); }, sync);
    cut(8192, p);
    memcpy(host_desc, p.data(), p.size() * sizeof(GatherPiece));
    unsigned n = (unsigned)p.size();
    row("launch call only: kernel, descriptors in host memory (3 parameters, 67 blocks)",
        [&] { k_pointer<<<n, 256, 0, s>>>(host_desc, n, dst); }, sync);
    const InlineArgs<127> a = inline_args<127>(p, n, dst);
    row("launch call only: kernel, 67 descriptors in the launch (4 KiB of parameters)",
        [&] { k_inline<<<n, 256, 0, s>>>(a); }, sync);
    const InlineArgs<15> b = inline_args<15>(p, 15, dst);
    row("launch call only: kernel, 15 descriptors in the launch (496 B of parameters)",
        [&] { k_inline<<<15, 256, 0, s>>>(b); }, sync);
    row("launch call only: cudaMemcpyAsync of the bytes contiguous (one DMA)",
        [&] { CK(cudaMemcpyAsync(dst, contig, total, cudaMemcpyHostToDevice, s)); }, sync);
  }
  return 0;
}
