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

// The threads of a block copy one piece, 16 bytes at a time when both ends are 16-byte
// aligned, then write its zeros.
__device__ __forceinline__ void copy_piece(const GatherPiece p, unsigned char* __restrict__ dst) {
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

// Copies many small buffers (device memory, or page-locked host memory the device maps)
// into device memory at `dst + dst_off`: one contiguous buffer, so that one DMA can move
// them all to the host, or scattered destinations. Blocks take pieces in turn
// (grid-stride). The descriptors are read from `pieces`.
extern "C" __global__ void pinlane_gather(const GatherPiece* __restrict__ pieces,
                                          unsigned int n,
                                          unsigned char* __restrict__ dst) {
    for (unsigned int i = blockIdx.x; i < n; i += gridDim.x) {
        copy_piece(pieces[i], dst);
    }
}

// The same with up to N descriptors passed by value, in the launch's parameters: a block
// reads its descriptor from the parameter bank instead of from memory, which for
// descriptors in host memory saves a PCIe round trip before any byte moves. The struct
// matches `InlineArgs<N>` in src/driver/kernels.rs; N = 127 fills the 4 KiB that every
// device from Turing on takes as parameters.
template <int N>
struct InlineArgs {
    unsigned long long dst;
    unsigned int n;
    unsigned int pad;
    GatherPiece pieces[N];
};

template <int N>
__device__ __forceinline__ void gather_inline(const InlineArgs<N>& a) {
    unsigned char* dst = reinterpret_cast<unsigned char*>(a.dst);
    const unsigned int n = a.n < N ? a.n : N;
    for (unsigned int i = blockIdx.x; i < n; i += gridDim.x) {
        copy_piece(a.pieces[i], dst);
    }
}

extern "C" __global__ void pinlane_gather_inline_15(const InlineArgs<15> a) { gather_inline(a); }
extern "C" __global__ void pinlane_gather_inline_63(const InlineArgs<63> a) { gather_inline(a); }
extern "C" __global__ void pinlane_gather_inline_127(const InlineArgs<127> a) { gather_inline(a); }
