// The kernel of examples/inference_server.rs (not used by the library itself): normalises
// a batch of u8 images to f32 and computes exact per-image statistics. Compiled to PTX on
// the GPU machine by kernels/build.sh; the PTX is committed and loaded at run time.

// One image of the batch: `channels` planes of `hw` u8 pixels at `src`; the f32 result
// goes to `out` (same element count), the statistics to `stats` (4 x u64, zeroed first):
// sum of pixels, sum of squared pixels, 255 - min pixel, max pixel.
struct ImageJob {
    unsigned long long src;
    unsigned long long out;
    unsigned long long stats;
    unsigned long long hw;
    unsigned long long channels;
};

// Channel c of every image: out = x * scale[c] + shift[c], each operation rounded on its
// own (no fused multiply-add), so the host computes bit-identical values.
struct Affine {
    float scale[4];
    float shift[4];
};

// blockIdx.y picks the image; the blocks along x stride over its pixels. Statistics are
// integers, so the atomics make them exact whatever the order.
extern "C" __global__ void pinlane_normalize(const ImageJob* __restrict__ jobs, Affine affine) {
    const ImageJob j = jobs[blockIdx.y];
    const unsigned char* src = reinterpret_cast<const unsigned char*>(j.src);
    float* out = reinterpret_cast<float*>(j.out);
    const unsigned long long n = j.hw * j.channels;
    unsigned long long sum = 0, sq = 0, inv_min = 0, max = 0;
    for (unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x; i < n;
         i += (unsigned long long)gridDim.x * blockDim.x) {
        const unsigned int x = src[i];
        const unsigned int c = (unsigned int)(i / j.hw) & 3u;
        out[i] = __fadd_rn(__fmul_rn((float)x, affine.scale[c]), affine.shift[c]);
        sum += x;
        sq += (unsigned long long)x * x;
        inv_min = inv_min > 255u - x ? inv_min : 255u - x;
        max = max > x ? max : x;
    }
    // Reduce within the warp, then one atomic per warp.
    for (int off = 16; off > 0; off >>= 1) {
        sum += __shfl_down_sync(0xffffffffu, sum, off);
        sq += __shfl_down_sync(0xffffffffu, sq, off);
        const unsigned long long m = __shfl_down_sync(0xffffffffu, inv_min, off);
        const unsigned long long x = __shfl_down_sync(0xffffffffu, max, off);
        inv_min = inv_min > m ? inv_min : m;
        max = max > x ? max : x;
    }
    if ((threadIdx.x & 31u) == 0) {
        unsigned long long* stats = reinterpret_cast<unsigned long long*>(j.stats);
        atomicAdd(&stats[0], sum);
        atomicAdd(&stats[1], sq);
        atomicMax(&stats[2], inv_min);
        atomicMax(&stats[3], max);
    }
}
