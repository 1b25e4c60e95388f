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

/// A loaded `pinlane_gather` of one device.
#[derive(Clone, Copy)]
pub(crate) struct GatherKernel {
    func: Handle<sys::CUfunction>,
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
    let mut func: sys::CUfunction = std::ptr::null_mut();
    let name = c"pinlane_gather";
    // SAFETY: `module` was just loaded; `name` is NUL-terminated; out-pointer to a local.
    unsafe {
        check(
            "cuModuleGetFunction",
            super::api::cuModuleGetFunction(&mut func, module, name.as_ptr()),
        )
    }?;
    Ok(GatherKernel { func: Handle(func) })
}

/// Threads per block of the gather kernel.
const GATHER_BLOCK: u32 = 256;

/// Queues `pinlane_gather(pieces, n, dst)` on `stream`.
///
/// # Safety
/// 1. `pieces` is memory the kernel may read (as for sources, below) holding `n`
///    [`GatherPiece`]s, written before this point of `stream`, alive and unchanged until
///    the kernel has run.
/// 2. Every piece's source range is memory the kernel may read (device memory, or
///    page-locked host memory mapped for the device: [`host_memory_mapped`](super::host_memory_mapped))
///    whose producing work is ordered before this point of `stream`, alive until the
///    kernel has run; every `dst + dst_off .. + len + zeros` range is inside device memory at `dst`, alive
///    and written by nothing else meanwhile.
pub(crate) unsafe fn launch_gather(
    _ctx: &ContextGuard,
    k: GatherKernel,
    pieces: DevicePtr,
    n: u32,
    dst: DevicePtr,
    stream: &Stream,
) -> Result<()> {
    fault_point(FaultKindTag::Copy, "cuLaunchKernel")?;
    if n == 0 {
        return Ok(());
    }
    let (mut p, mut count, mut d) = (pieces, n, dst);
    let mut params: [*mut std::ffi::c_void; 3] = [
        (&mut p as *mut DevicePtr).cast(),
        (&mut count as *mut u32).cast(),
        (&mut d as *mut DevicePtr).cast(),
    ];
    let grid = n.min(4096);
    // SAFETY: `params` points to three live locals whose types match the kernel's
    // (u64, u32, u64) parameters; obligations 1 and 2 are the caller's; no shared memory,
    // no extra options.
    let res = unsafe {
        super::api::cuLaunchKernel(
            k.func.0,
            grid,
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
