//! Gathering many small device tensors into one contiguous device buffer with the
//! `pinlane_gather` kernel, so that D2H moves them with one copy instead of one each
//! (each copy submission costs microseconds; a thousand tensors would cost milliseconds).
//!
//! ```text
//!  slot (pinned):   [desc0 desc1 ... descN-1]  ──H2D──►  scratch (device, freed in stream order)
//!  kernel:          scratch ──► for each piece: dst[dst_off..+len] = src[..len]
//!  result:          one DeviceAlloc with every tensor at its output offset
//! ```

use super::{DeviceAlloc, DeviceView, InFlight};
use crate::driver::{self, ContextGuard, GatherPiece, Stream};
use crate::error::Result;
use std::sync::Arc;

/// Whether `pinlane_gather` can run on `device`.
pub(crate) fn available(device: usize) -> bool {
    driver::gather_kernel(device).is_some()
}

/// Queues a gather of `views` (at `offsets`, in a buffer of `end` bytes) on `job`'s stream
/// and returns the buffer, held by `job`. The descriptors go through `job`'s first staging
/// slot (which must hold `24 * views.len()` bytes).
///
/// # Safety
/// Every view's producing work is ordered before this point of the stream, and every view
/// stays alive until the stream is proven idle.
pub(crate) unsafe fn gather_async(
    ctx: &ContextGuard,
    job: &mut InFlight,
    device: usize,
    views: &[&DeviceView],
    offsets: &[usize],
    end: usize,
) -> Result<Arc<DeviceAlloc>> {
    ctx.check("gather", device)?;
    // Every descriptor must be checked here: the kernel writes device memory unchecked.
    if views.len() != offsets.len() {
        return Err(crate::Error::LengthMismatch {
            op: "gather",
            what: "views and offsets",
        });
    }
    for (v, &off) in views.iter().zip(offsets) {
        super::check_range("gather destination", off, v.nbytes(), end)?;
    }
    let stream: Stream = job.stream().clone();
    let Some(lease) = job.leases.first_mut() else {
        return Err(crate::Error::InvalidOption {
            name: "gather",
            reason: "no staging slot leased".into(),
        });
    };
    let Some(kernel) = driver::gather_kernel(device) else {
        return Err(crate::Error::NoCuda {
            op: "gather",
            reason: driver::gather_unavailable_reason(crate::Device::cuda(device))
                .unwrap_or_default(),
        });
    };
    let desc_bytes = views.len() * std::mem::size_of::<GatherPiece>();
    let n = u32::try_from(views.len())
        .ok()
        .filter(|_| desc_bytes <= lease.len() && end > 0);
    let Some(n) = n else {
        return Err(crate::Error::InvalidOption {
            name: "gather",
            reason: format!("{} pieces do not fit the staging slot", views.len()),
        });
    };
    {
        let buf = lease.bytes_mut()?;
        let descs: &mut [GatherPiece] = bytemuck::cast_slice_mut(&mut buf[..desc_bytes]);
        for ((d, v), &off) in descs.iter_mut().zip(views).zip(offsets) {
            *d = GatherPiece {
                src: v.addr(0).unwrap_or(0),
                dst_off: off as u64,
                len: v.nbytes() as u64,
            };
        }
    }
    // The scratch is freed on the copy stream itself when dropped below: after the kernel
    // that reads it, in stream order.
    let scratch = DeviceAlloc::new_async(ctx, device, desc_bytes, &stream, stream.clone())?;
    // SAFETY: `scratch` was allocated on this stream and lives until the free queued when
    // it drops, after the kernel; the lease's event covers the slot.
    unsafe { lease.h2d_window(ctx, desc_bytes, &scratch, 0, &stream) }?;
    let dst = DeviceAlloc::new_async(ctx, device, end, &stream, stream.clone())?;
    // SAFETY: the descriptors were copied into `scratch` just before on this stream; each
    // describes a whole view (source in range by construction) going to `off..off+len`,
    // inside `dst` (every range was checked against `end` above); the views'
    // producing work and lifetime are the caller's obligation; `dst` is held by `job`.
    let launched =
        unsafe { driver::launch_gather(ctx, kernel, scratch.addr(0), n, dst.addr(0), &stream) };
    job.hold(&dst, end);
    drop(scratch);
    launched.map(|()| dst)
}
