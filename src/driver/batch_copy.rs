//! `cuMemcpyBatchAsync` (CUDA 12.8+): many copies in one submission. Not in the CUDA 11.4
//! header set pinlane binds, so the symbol is looked up by hand when first needed; on a
//! driver without it, [`available`] is false and callers take another path.

use super::{check, fault_point, ContextGuard, DevicePtr, FaultKindTag, Stream};
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::OnceLock;

/// `CUmemcpyAttributes` as CUDA 12.8 to 13.1 lay it out: 24 bytes.
#[repr(C)]
struct MemcpyAttributes {
    src_access_order: i32,
    src_loc_type: i32,
    src_loc_id: i32,
    dst_loc_type: i32,
    dst_loc_id: i32,
    flags: u32,
}

/// `CU_MEMCPY_SRC_ACCESS_ORDER_STREAM`: sources are read in stream order.
const ACCESS_ORDER_STREAM: i32 = 1;
/// `CU_MEM_LOCATION_TYPE_DEVICE` / `_HOST`.
const LOC_DEVICE: i32 = 1;
const LOC_HOST: i32 = 2;

/// CUDA 13's `cuMemcpyBatchAsync_v2` (no `failIdx`).
type V2 = unsafe extern "C" fn(
    *mut DevicePtr,
    *mut DevicePtr,
    *mut usize,
    usize,
    *mut MemcpyAttributes,
    *mut usize,
    usize,
    sys::CUstream,
) -> sys::CUresult;
/// CUDA 12.8's `cuMemcpyBatchAsync` (with `failIdx`).
type V1 = unsafe extern "C" fn(
    *mut DevicePtr,
    *mut DevicePtr,
    *mut usize,
    usize,
    *mut MemcpyAttributes,
    *mut usize,
    usize,
    *mut usize,
    sys::CUstream,
) -> sys::CUresult;

#[derive(Clone, Copy)]
enum Entry {
    V1(V1),
    V2(V2),
}

fn entry() -> Option<Entry> {
    static E: OnceLock<Option<Entry>> = OnceLock::new();
    *E.get_or_init(|| {
        super::available()?;
        if super::simulated() {
            return None; // not simulated
        }
        // SAFETY: the library is loaded (available() checked it); `get` only resolves
        // addresses, and the types match the CUDA 13.0 / 12.8 prototypes above.
        unsafe {
            let lib = sys::culib();
            if let Ok(f) = lib.get::<V2>(b"cuMemcpyBatchAsync_v2") {
                return Some(Entry::V2(*f));
            }
            lib.get::<V1>(b"cuMemcpyBatchAsync")
                .ok()
                .map(|f| Entry::V1(*f))
        }
    })
}

/// Whether the driver has `cuMemcpyBatchAsync`.
pub(crate) fn available() -> bool {
    entry().is_some()
}

/// Queues device-to-host copies `srcs[i] -> dsts[i]` of `sizes[i]` bytes as one batch.
///
/// # Safety
/// For every i: `dsts[i]..+sizes[i]` is page-locked host memory nobody else touches until
/// the copies finish; `srcs[i]..+sizes[i]` is device memory whose producing work is
/// ordered before this point of `stream`, alive until the copies finish. The legacy
/// stream is refused with an error.
pub(crate) unsafe fn memcpy_batch_d2h_async(
    ctx: &ContextGuard,
    dsts: &mut [DevicePtr],
    srcs: &mut [DevicePtr],
    sizes: &mut [usize],
    device: usize,
    stream: &Stream,
) -> Result<()> {
    // SAFETY: the caller's obligations, passed on.
    unsafe { memcpy_batch_async(ctx, dsts, srcs, sizes, device, stream, false) }
}

/// Queues host-to-device copies `srcs[i] -> dsts[i]` of `sizes[i]` bytes as one batch.
///
/// # Safety
/// For every i: `srcs[i]..+sizes[i]` is page-locked host memory, alive and unchanged until
/// the copies finish; `dsts[i]..+sizes[i]` is device memory of `device` that nothing else
/// uses until then. The legacy stream is refused with an error.
pub(crate) unsafe fn memcpy_batch_h2d_async(
    ctx: &ContextGuard,
    dsts: &mut [DevicePtr],
    srcs: &mut [DevicePtr],
    sizes: &mut [usize],
    device: usize,
    stream: &Stream,
) -> Result<()> {
    // SAFETY: the caller's obligations, passed on.
    unsafe { memcpy_batch_async(ctx, dsts, srcs, sizes, device, stream, true) }
}

/// The batch copy either way (`to_device`: host sources, device destinations).
///
/// # Safety
/// As [`memcpy_batch_d2h_async`] / [`memcpy_batch_h2d_async`].
unsafe fn memcpy_batch_async(
    ctx: &ContextGuard,
    dsts: &mut [DevicePtr],
    srcs: &mut [DevicePtr],
    sizes: &mut [usize],
    device: usize,
    stream: &Stream,
    to_device: bool,
) -> Result<()> {
    fault_point(FaultKindTag::Copy, "cuMemcpyBatchAsync")?;
    ctx.check("cuMemcpyBatchAsync", device)?;
    let n = dsts.len();
    if srcs.len() != n || sizes.len() != n {
        // Queueing nothing would hand out the uninitialised destination as results.
        return Err(crate::error::Error::LengthMismatch {
            op: "cuMemcpyBatchAsync",
            what: "destinations, sources and sizes",
        });
    }
    if n == 0 {
        return Ok(());
    }
    if stream.is_legacy() {
        // The batched copy's stream-ordered source access is defined for ordinary
        // streams; the legacy stream is refused rather than trusted.
        return Err(crate::error::Error::LegacyStream {
            op: "cuMemcpyBatchAsync",
        });
    }
    let Some(e) = entry() else {
        return Err(crate::error::Error::NoCuda {
            op: "cuMemcpyBatchAsync",
            reason: "the driver lacks it (CUDA 12.8+)".into(),
        });
    };
    let (device_side, host_side) = ((LOC_DEVICE, device as i32), (LOC_HOST, 0));
    let (src, dst) = if to_device {
        (host_side, device_side)
    } else {
        (device_side, host_side)
    };
    let mut attr = MemcpyAttributes {
        src_access_order: ACCESS_ORDER_STREAM,
        src_loc_type: src.0,
        src_loc_id: src.1,
        dst_loc_type: dst.0,
        dst_loc_id: dst.1,
        flags: 0,
    };
    let mut idx = [0usize];
    // SAFETY: the arrays hold `n` entries each and live for the call; one attribute set
    // applies from index 0; the copies' memory is the caller's obligation.
    let res = unsafe {
        match e {
            Entry::V2(f) => f(
                dsts.as_mut_ptr(),
                srcs.as_mut_ptr(),
                sizes.as_mut_ptr(),
                n,
                &mut attr,
                idx.as_mut_ptr(),
                1,
                stream.raw(),
            ),
            Entry::V1(f) => {
                let mut fail = 0usize;
                f(
                    dsts.as_mut_ptr(),
                    srcs.as_mut_ptr(),
                    sizes.as_mut_ptr(),
                    n,
                    &mut attr,
                    idx.as_mut_ptr(),
                    1,
                    &mut fail,
                    stream.raw(),
                )
            }
        }
    };
    check("cuMemcpyBatchAsync", res)
}
