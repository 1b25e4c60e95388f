//! Gathering many small device tensors into one contiguous device buffer with the
//! `pinlane_gather` kernel, so that D2H moves them with one copy instead of one each
//! (each copy submission costs microseconds; a thousand tensors would cost milliseconds).
//!
//! ```text
//!  descriptors:     up to 127 in the launch's parameters; more in the staging slot (read
//!                   in place through the device's mapping, or, where the device maps no
//!                   host memory, copied to a device scratch)
//!  kernel:          descriptors ──► for each piece: dst[dst_off..+len] = src[..len],
//!                   then zeros up to the next piece
//!  result:          one DeviceAlloc with every tensor at its output offset
//! ```
//!
//! The same kernel moves many small page-locked host tensors to the device (H2D): it
//! reads them at their host addresses, through the device's mapping of page-locked
//! memory, straight into the batch's device buffer, with no host copy and one launch for
//! them all ([`h2d_gather_async`]), its descriptors passed the same way.

use super::{DeviceAlloc, DeviceView, InFlight, PinnedBuf};
use crate::driver::{self, ContextGuard, GatherPiece, Stream};
use crate::error::Result;
use std::sync::Arc;

/// Whether `pinlane_gather` can run on `device`.
pub(crate) fn available(device: usize) -> bool {
    driver::gather_kernel(device).is_some()
}

/// Queues a gather of `views` (at `offsets`, in a buffer of `end` bytes) on `job`'s stream
/// and returns the buffer, held by `job`, and how many submissions that took (1, or 2 with
/// the descriptors' upload). Up to 127 descriptors go in the launch's parameters; more go
/// into `job`'s first staging slot (which must hold `32 * views.len()` bytes), where the
/// kernel reads them in place where the device maps page-locked host memory, else from a
/// device copy of them.
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
) -> Result<(Arc<DeviceAlloc>, usize)> {
    ctx.check("gather", device)?;
    // Every descriptor must be checked here: the kernel writes device memory unchecked.
    if views.len() != offsets.len() {
        return Err(crate::error::Error::LengthMismatch {
            op: "gather",
            what: "views and offsets",
        });
    }
    for (v, &off) in views.iter().zip(offsets) {
        super::check_range("gather destination", off, v.nbytes(), end)?;
    }
    let Some(kernel) = driver::gather_kernel(device) else {
        return Err(crate::error::Error::NoCuda {
            op: "gather",
            reason: driver::gather_unavailable_reason(crate::device::Device::cuda(device))
                .unwrap_or_default(),
        });
    };
    let slot_bytes = job.leases.first().map_or(0, |l| l.len());
    let desc_bytes = views.len() * std::mem::size_of::<GatherPiece>();
    let n = u32::try_from(views.len())
        .ok()
        .filter(|&n| n > 0 && end > 0 && desc_bytes <= slot_bytes);
    let Some(n) = n else {
        return Err(crate::error::Error::Internal {
            op: "gather",
            reason: format!(
                "{} pieces of {end} bytes for a staging slot of {slot_bytes} bytes",
                views.len()
            ),
        });
    };
    let stream: Stream = job.stream().clone();
    let dst = DeviceAlloc::new_async(ctx, device, end, &stream, stream.clone())?;
    job.hold(&dst, end);
    let lease = job
        .leases
        .first_mut()
        .ok_or_else(|| crate::error::Error::Internal {
            op: "gather",
            reason: "no staging slot leased".into(),
        })?;
    let descs = d2h_pieces(views, offsets, end);
    if driver::host_memory_mapped(device) {
        // SAFETY: the device maps page-locked host memory (checked just above), so the
        // kernel can read descriptors in the slot in place; the sources are device views
        // whose producing work and lifetime are the caller's obligation; `dst` was
        // allocated on this stream and `job` holds it; `gather_from_slot` checks every
        // destination against it.
        unsafe { lease.gather_from_slot(ctx, kernel, descs, &dst, &stream) }?;
        return Ok((dst, 1));
    }
    // Without the mapping, the kernel cannot read the slot: its descriptors go in the
    // launch's parameters, or (more than fit there) to a device scratch buffer first.
    let descs: &[GatherPiece] = {
        let buf = lease.bytes_mut()?;
        let slot: &mut [GatherPiece] = bytemuck::cast_slice_mut(&mut buf[..desc_bytes]);
        for (d, p) in slot.iter_mut().zip(descs) {
            *d = p;
        }
        slot
    };
    if descs.len() <= driver::INLINE_MAX {
        // SAFETY: the descriptors go in the launch's parameters; each describes a whole
        // view (source in range by construction) going to `off..off+len`, inside `dst`
        // (every range was checked against `end` above); the views' producing work and
        // lifetime are the caller's obligation; `dst` was allocated on this stream and
        // `job` holds it. The slot was not read by the device: it stays idle.
        unsafe { driver::launch_gather(ctx, kernel, descs, 0, dst.addr(0), &stream) }?;
        return Ok((dst, 1));
    }
    // The scratch is freed on the copy stream itself when dropped below: after the kernel
    // that reads it, in stream order.
    let scratch = DeviceAlloc::new_async(ctx, device, desc_bytes, &stream, stream.clone())?;
    let written: *const GatherPiece = descs.as_ptr();
    // SAFETY: `scratch` was allocated on this stream and lives until the free queued when
    // it drops, after the kernel; the lease's event covers the slot.
    unsafe { lease.h2d_window(ctx, desc_bytes, &scratch, 0, &stream) }?;
    // SAFETY: the slot's first descriptors, written above; the lease keeps the slot, and
    // the only use since, the copy just queued, reads it.
    let descs = unsafe { std::slice::from_raw_parts(written, n as usize) };
    // SAFETY: the descriptors were copied into `scratch` just before on this stream; each
    // describes a whole view (source in range by construction) going to `off..off+len`,
    // inside `dst` (every range was checked against `end` above); the views'
    // producing work and lifetime are the caller's obligation; `dst` is held by `job`.
    let launched =
        unsafe { driver::launch_gather(ctx, kernel, descs, scratch.addr(0), dst.addr(0), &stream) };
    drop(scratch);
    launched.map(|()| (dst, 2))
}

/// The D2H gather's descriptors: each view to its offset, and zeros from its end up to the
/// next offset (or `end`), so that the pieces and their padding tile `0..end` and the one
/// copy of the range that follows reads only bytes the kernel wrote. The caller checked
/// that the offsets rise and each view fits before the next.
fn d2h_pieces<'a>(
    views: &'a [&'a DeviceView],
    offsets: &'a [usize],
    end: usize,
) -> impl Iterator<Item = GatherPiece> + 'a {
    let sources = views.iter().map(|v| (v.addr(0).unwrap_or(0), v.nbytes()));
    tile(sources, offsets, end)
}

/// Pieces from `(address, length)` sources to `offsets`, each padded with zeros up to the
/// next offset (the last up to `end`).
fn tile<'a>(
    sources: impl Iterator<Item = (u64, usize)> + 'a,
    offsets: &'a [usize],
    end: usize,
) -> impl Iterator<Item = GatherPiece> + 'a {
    let next = offsets.iter().skip(1).copied().chain(std::iter::once(end));
    sources
        .zip(offsets)
        .zip(next)
        .map(|(((src, len), &off), next)| GatherPiece {
            src,
            dst_off: off as u64,
            len: len as u64,
            zeros: next.saturating_sub(off + len) as u64,
        })
}

/// Most bytes one H2D gather piece reads: larger sources are cut into pieces this size, so
/// that many blocks of the kernel share a large tensor's reads (a block takes one piece).
const H2D_PIECE: usize = 64 << 10;

/// Gather descriptors a page-locked source of `nbytes` needs in [`h2d_gather_async`].
pub(crate) fn h2d_gather_pieces(nbytes: usize) -> usize {
    nbytes.div_ceil(H2D_PIECE)
}

/// Whether [`h2d_gather_async`] can run on `device`: the kernel is loaded and the device
/// maps page-locked host memory.
pub(crate) fn h2d_gather_available(device: usize) -> bool {
    driver::host_memory_mapped(device) && available(device)
}

/// Queues the gather kernel on `job`'s stream to read page-locked `sources` straight from
/// host memory into `dst` at `offsets`. The descriptors (see [`h2d_gather_pieces`]) go
/// into `job`'s first staging slot, which the kernel reads in place.
///
/// # Errors
/// A source the kernel may not read ([`PinnedBuf::mapped`]), a device that does not map
/// host memory, a destination outside `dst`, or more pieces than the slot holds: all
/// before anything is queued.
///
/// # Safety
/// `dst` is usable in the stream's order and `job` holds it; every source stays alive and
/// unchanged until the stream is proven idle.
pub(crate) unsafe fn h2d_gather_async(
    ctx: &ContextGuard,
    job: &mut InFlight,
    device: usize,
    sources: &[&PinnedBuf],
    offsets: &[usize],
    dst: &DeviceAlloc,
) -> Result<()> {
    ctx.check("gather", device)?;
    if sources.len() != offsets.len() {
        return Err(crate::error::Error::LengthMismatch {
            op: "gather",
            what: "sources and offsets",
        });
    }
    // The engine routes here only sources the device can read: anything else is a bug.
    let unreadable = |reason: String| crate::error::Error::Internal {
        op: "gather",
        reason,
    };
    if !driver::host_memory_mapped(device) {
        return Err(unreadable(format!(
            "cuda:{device} does not map host memory"
        )));
    }
    if let Some(k) = sources.iter().position(|s| !s.mapped()) {
        return Err(unreadable(format!(
            "source {k} is not mapped for the device"
        )));
    }
    let Some(kernel) = driver::gather_kernel(device) else {
        return Err(crate::error::Error::NoCuda {
            op: "gather",
            reason: driver::gather_unavailable_reason(crate::device::Device::cuda(device))
                .unwrap_or_default(),
        });
    };
    let stream: Stream = job.stream().clone();
    let Some(lease) = job.leases.first_mut() else {
        return Err(unreadable("no staging slot leased".into()));
    };
    let pieces = sources.iter().zip(offsets).flat_map(|(s, &off)| {
        let (src, len) = (s.as_ptr() as u64, s.nbytes());
        (0..len).step_by(H2D_PIECE).map(move |at| GatherPiece {
            src: src + at as u64,
            dst_off: (off + at) as u64,
            len: H2D_PIECE.min(len - at) as u64,
            zeros: 0,
        })
    });
    // SAFETY: the device maps host memory (checked above); every source is page-locked
    // memory pinlane allocated or registered device-mapped, or inside such a registration
    // that the source's block holds (`mapped()`, checked above), kept alive and
    // unchanged by the caller until the stream is idle, which is after the kernel;
    // `dst` is the caller's obligation; `gather_from_slot` checks each destination.
    unsafe { lease.gather_from_slot(ctx, kernel, pieces, dst, &stream) }
}

#[cfg(test)]
mod tests {
    use super::tile;
    use proptest::prelude::*;

    /// Offsets of `sizes` back to back, each 256-byte aligned, and the end of the last.
    fn pack(sizes: &[usize]) -> (Vec<usize>, usize) {
        let mut end = 0usize;
        let offsets = sizes
            .iter()
            .map(|&n| {
                let at = end.next_multiple_of(256);
                end = at + n;
                at
            })
            .collect();
        (offsets, end)
    }

    proptest! {
        /// The pieces and their zeros cover the gathered range exactly once, in order: the
        /// copy of the whole range reads no byte the kernel left unwritten.
        #[test]
        fn pieces_and_padding_tile_the_range(sizes in proptest::collection::vec(0usize..2000, 1..40)) {
            let (offsets, end) = pack(&sizes);
            let sources = sizes.iter().enumerate().map(|(k, &n)| (k as u64 * 4096, n));
            let mut at = 0u64;
            for (k, p) in tile(sources, &offsets, end).enumerate() {
                prop_assert_eq!(p.dst_off, at);
                prop_assert_eq!(p.len, sizes[k] as u64);
                prop_assert_eq!(p.src, k as u64 * 4096);
                at += p.len + p.zeros;
            }
            prop_assert_eq!(at, end as u64);
        }
    }
}
