//! pinlane's device kernels: PTX committed in `kernels/`, loaded with `cuModuleLoadData`
//! once per device when its context is made (the device's slot in `context.rs` keeps
//! it), and launched here. If loading fails (a driver too old for the PTX, say), the
//! kernel is reported unavailable and callers take their kernel-free path.

use super::guard::ContextGuard;
use super::{check, fault_point, DevicePtr, FaultKindTag, Handle, Stream};
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::CString;

/// The gather kernel's PTX (kernels/gather.cu, built by kernels/build.sh).
pub const GATHER_PTX: &str = include_str!("../../kernels/gather.ptx");

/// Descriptor of one gather piece, as the kernel reads it (`struct GatherPiece`): `len`
/// bytes from `src` to `dst + dst_off`, then `zeros` zero bytes (the padding before the
/// next piece, so that a copy of the whole gathered range reads only written bytes).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GatherPiece {
    pub(crate) src: u64,
    pub(crate) dst_off: u64,
    pub(crate) len: u64,
    pub(crate) zeros: u64,
}

// SAFETY: four u64 fields, repr(C), no padding: all-zero is a valid value.
unsafe impl bytemuck::Zeroable for GatherPiece {}
// SAFETY: as above; every bit pattern is valid and the type is Copy + 'static.
unsafe impl bytemuck::Pod for GatherPiece {}

/// A loaded `pinlane_gather` of one device, with its variants that take the descriptors
/// in the launch's parameters.
#[derive(Clone, Copy)]
pub(crate) struct GatherKernel {
    func: Handle<sys::CUfunction>,
    /// `pinlane_gather_inline_{N}` for each of [`INLINE_SIZES`], in that order.
    inline: [Handle<sys::CUfunction>; 3],
}

/// How many descriptors each inline variant takes: the kernels' `InlineArgs<N>`
/// (kernels/gather.cu). 127 fills the 4 KiB of parameters every device from Turing on
/// takes; the smaller ones keep the launch's parameters short for few pieces.
pub(crate) const INLINE_SIZES: [usize; 3] = [15, 63, 127];

/// The most descriptors a launch passes in its parameters.
pub(crate) const INLINE_MAX: usize = INLINE_SIZES[2];

// The largest variant's parameters fit the 4 KiB a launch may pass on every device
// pinlane's PTX targets (compute_75 on).
const _: () = assert!(std::mem::size_of::<InlineArgs<INLINE_MAX>>() <= 4096);

/// The kernels' names, the pointer kernel's first.
const NAMES: [&std::ffi::CStr; 4] = [
    c"pinlane_gather",
    c"pinlane_gather_inline_15",
    c"pinlane_gather_inline_63",
    c"pinlane_gather_inline_127",
];

/// The parameters of `pinlane_gather_inline_{N}`: the destination base, the count, and up
/// to `N` descriptors, by value (`InlineArgs<N>` in kernels/gather.cu).
#[repr(C)]
struct InlineArgs<const N: usize> {
    dst: u64,
    n: u32,
    pad: u32,
    pieces: [GatherPiece; N],
}

/// Loads the gather kernel under `ctx`'s device context (made current by the guard).
/// Waits for all work on the device (`cuModuleLoadData`): callers do it once, when the
/// context is made.
pub(super) fn load_gather(_ctx: &ContextGuard) -> Result<GatherKernel> {
    let names: &[&str] = if super::simulated() {
        &[] // the simulated device runs the gather itself
    } else {
        &["cuModuleLoadData", "cuModuleGetFunction", "cuLaunchKernel"]
    };
    for name in names {
        // SAFETY: only resolves symbol addresses; `available()` already loaded the library.
        let lib = unsafe { sys::culib() };
        // SAFETY: resolving a symbol's address; the pointer is never called here.
        if unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err() {
            return Err(crate::error::Error::NoCuda {
                op: "gather kernel",
                reason: format!("the driver lacks {name}"),
            });
        }
    }
    let image = CString::new(GATHER_PTX).map_err(|_| crate::error::Error::Internal {
        op: "GATHER_PTX",
        reason: "contains a NUL byte".into(),
    })?;
    let mut module: sys::CUmodule = std::ptr::null_mut();
    // SAFETY: `image` is a NUL-terminated PTX string alive for the call; out-pointer to a
    // live local; the device's context is current. The module is never unloaded: it lives
    // as long as the process, like the primary context it belongs to.
    unsafe {
        check(
            "cuModuleLoadData",
            super::api::cuModuleLoadData(&mut module, image.as_ptr().cast()),
        )
    }?;
    let mut funcs = [std::ptr::null_mut(); 4];
    for (func, name) in funcs.iter_mut().zip(NAMES) {
        // SAFETY: `module` was just loaded; `name` is NUL-terminated; out-pointer to a
        // live local. Every name is in the committed PTX: a missing one is an error.
        unsafe {
            check(
                "cuModuleGetFunction",
                super::api::cuModuleGetFunction(func, module, name.as_ptr()),
            )
        }?;
    }
    let [func, a, b, c] = funcs.map(Handle);
    Ok(GatherKernel {
        func,
        inline: [a, b, c],
    })
}

/// Threads per block of the gather kernel.
const GATHER_BLOCK: u32 = 256;

/// Blocks of a launch for `n` pieces (grid-stride past 4096).
fn grid(n: u32) -> u32 {
    n.min(4096)
}

/// Queues the gather kernel for `pieces` on `stream`: with up to [`INLINE_MAX`] of them,
/// `pinlane_gather_inline_{N}` gets them by value in its parameters (the driver copies
/// them at launch), so no block waits for a read of `pieces`' memory before it starts;
/// with more, `pinlane_gather` reads them at `readable`.
///
/// # Safety
/// 1. With more than [`INLINE_MAX`] pieces, `readable` is memory the kernel may read (as
///    for sources, below) holding the same descriptors as `pieces`, written before this
///    point of `stream`, alive and unchanged until the kernel has run.
/// 2. Every piece's source range is memory the kernel may read (device memory, or
///    page-locked host memory mapped for the device: [`host_memory_mapped`](super::host_memory_mapped))
///    whose producing work is ordered before this point of `stream`, alive until the
///    kernel has run; every `dst + dst_off .. + len + zeros` range is inside device memory at `dst`, alive
///    and written by nothing else meanwhile.
pub(crate) unsafe fn launch_gather(
    _ctx: &ContextGuard,
    k: GatherKernel,
    pieces: &[GatherPiece],
    readable: DevicePtr,
    dst: DevicePtr,
    stream: &Stream,
) -> Result<()> {
    fault_point(FaultKindTag::Copy, "cuLaunchKernel")?;
    if pieces.is_empty() {
        return Ok(());
    }
    let n = u32::try_from(pieces.len()).map_err(|_| crate::error::Error::Internal {
        op: "gather",
        reason: format!("{} pieces", pieces.len()),
    })?;
    const SMALL: usize = INLINE_SIZES[0];
    const MID: usize = INLINE_SIZES[1];
    let len = pieces.len();
    if len <= SMALL {
        // SAFETY: `SMALL` is at least `len`; the sources and destinations are obligation 2.
        return unsafe { launch_inline::<SMALL>(k, pieces, n, dst, stream) };
    }
    if len <= MID {
        // SAFETY: as above, `MID` at least `len`.
        return unsafe { launch_inline::<MID>(k, pieces, n, dst, stream) };
    }
    if len <= INLINE_MAX {
        // SAFETY: as above, `INLINE_MAX` at least `len`.
        return unsafe { launch_inline::<INLINE_MAX>(k, pieces, n, dst, stream) };
    }
    let (mut p, mut count, mut d) = (readable, n, dst);
    let mut params: [*mut std::ffi::c_void; 3] = [
        (&mut p as *mut DevicePtr).cast(),
        (&mut count as *mut u32).cast(),
        (&mut d as *mut DevicePtr).cast(),
    ];
    // SAFETY: `params` points to three live locals whose types match the kernel's (u64,
    // u32, u64) parameters; obligations 1 and 2 are the caller's.
    unsafe { launch(k.func, n, &mut params, stream) }
}

/// Launches `k`'s variant taking `N` pieces (one of [`INLINE_SIZES`]) with `pieces` (at
/// most `N`).
///
/// # Safety
/// The pieces' sources and destinations are as [`launch_gather`]'s obligation 2 says.
unsafe fn launch_inline<const N: usize>(
    k: GatherKernel,
    pieces: &[GatherPiece],
    n: u32,
    dst: DevicePtr,
    stream: &Stream,
) -> Result<()> {
    let mut args = InlineArgs::<N> {
        dst,
        n,
        pad: 0,
        pieces: [bytemuck::Zeroable::zeroed(); N],
    };
    let Some(into) = args.pieces.get_mut(..pieces.len()) else {
        return Err(crate::error::Error::Internal {
            op: "gather",
            reason: format!("{} pieces for an inline launch of {N}", pieces.len()),
        });
    };
    into.copy_from_slice(pieces);
    // The variant whose parameter is `InlineArgs<N>`: `NAMES[1 + i]` names
    // `INLINE_SIZES[i]` (a unit test checks).
    let Some(func) = INLINE_SIZES
        .iter()
        .position(|&s| s == N)
        .map(|i| k.inline[i])
    else {
        return Err(crate::error::Error::Internal {
            op: "gather",
            reason: format!("no inline variant of {N} pieces"),
        });
    };
    let mut params: [*mut std::ffi::c_void; 1] = [(&mut args as *mut InlineArgs<N>).cast()];
    // SAFETY: `params` points to one live local laid out as the kernel's one parameter
    // (`InlineArgs<N>`, repr(C) on both sides); the driver copies it at launch; the
    // rest is the caller's obligation.
    unsafe { launch(func, n, &mut params, stream) }
}

/// `cuLaunchKernel` of `func` with one block per piece (up to 4096), no shared memory.
///
/// # Safety
/// `params` matches `func`'s parameters, and the kernel's reads and writes are valid in
/// `stream`'s order.
unsafe fn launch(
    func: Handle<sys::CUfunction>,
    n: u32,
    params: &mut [*mut std::ffi::c_void],
    stream: &Stream,
) -> Result<()> {
    // SAFETY: the caller's obligations; no shared memory, no extra options.
    let res = unsafe {
        super::api::cuLaunchKernel(
            func.0,
            grid(n),
            1,
            1,
            GATHER_BLOCK,
            1,
            1,
            0,
            stream.raw(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
    };
    check("cuLaunchKernel", res)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_inline_name_is_its_size() {
        assert_eq!(NAMES[0], c"pinlane_gather");
        for (k, size) in INLINE_SIZES.iter().enumerate() {
            let name = format!("pinlane_gather_inline_{size}");
            assert_eq!(NAMES[1 + k].to_str(), Ok(name.as_str()));
        }
        assert!(INLINE_SIZES.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(std::mem::size_of::<InlineArgs<127>>(), 16 + 127 * 32);
    }
}
