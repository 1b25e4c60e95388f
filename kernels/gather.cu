// pinlane's device kernels. Compiled to PTX on the GPU machine by kernels/build.sh; the
// PTX is committed (kernels/gather.ptx) and loaded at run time with cuModuleLoadData, so
// users need only the driver.

// One piece of a gather: `len` bytes at device address `src` go to `dst + dst_off`, and
// `zeros` zero bytes after them (the padding up to the next piece, so that the copy of the
// whole gathered range that follows reads only bytes that were written).
struct GatherPiece {
    unsigned long long src;
    unsigned long long dst_off;
    unsigned long long len;
    unsigned long long zeros;
};

// Copies many small device buffers into one contiguous buffer, so that one DMA can move
// them all to the host. Blocks take pieces in turn (grid-stride); the threads of a block
// copy one piece, 16 bytes at a time when both ends are 16-byte aligned.
extern "C" __global__ void pinlane_gather(const GatherPiece* __restrict__ pieces,
                                          unsigned int n,
                                          unsigned char* __restrict__ dst) {
    for (unsigned int i = blockIdx.x; i < n; i += gridDim.x) {
        const GatherPiece p = pieces[i];
        const unsigned char* s = reinterpret_cast<const unsigned char*>(p.src);
        unsigned char* d = dst + p.dst_off;
        unsigned long long head = 0;
        if (((p.src | reinterpret_cast<unsigned long long>(d)) & 15ull) == 0) {
            const unsigned long long n16 = p.len >> 4;
            const uint4* s4 = reinterpret_cast<const uint4*>(s);
            uint4* d4 = reinterpret_cast<uint4*>(d);
            for (unsigned long long j = threadIdx.x; j < n16; j += blockDim.x) {
                d4[j] = s4[j];
            }
            head = n16 << 4;
        }
        for (unsigned long long j = head + threadIdx.x; j < p.len; j += blockDim.x) {
            d[j] = s[j];
        }
        for (unsigned long long j = p.len + threadIdx.x; j < p.len + p.zeros; j += blockDim.x) {
            d[j] = 0;
        }
    }
}
