//! Copies into memory the caller owns (`transfer_tensor_h2d_into`,
//! `transfer_tensor_d2h_into`): host bytes to device views anywhere (a slice of a static
//! buffer, a graph's input), not into an allocation made for the batch; and device bytes
//! back into host tensors the caller keeps.
//!
//! ```text
//!  one staging slot:  [small source 0 | small source 1 | ... | descriptors]
//!  kernel (one launch, reading the slot through the device's mapping of page-locked
//!  memory, and small page-locked sources in place):
//!                     piece k: dst_k[..len] = src_k[..len]   (`dst` the lowest destination,
//!                                                             each `dst_off` relative to it)
//!  large page-locked sources: one DMA each (one cuMemcpyBatchAsync for all of them)
//!  larger batches: window after window of the slot ring, each part one DMA
//! ```

use super::{check_range, CopyPool, CopyTask, CopyTasks, DeviceView, PinnedBuf, SlotLease, Stores};
use crate::driver::{self, ContextGuard, DevicePtr, GatherKernel, GatherPiece, Stream};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Most bytes one kernel piece moves: one pass of a block's 256 threads, 16 bytes each.
/// The kernel reads host memory through the device's mapping, where each read waits a
/// PCIe round trip: a block looping over a larger piece would wait one per pass, while
/// small pieces spread the reads over many blocks, all in flight at once.
const PIECE: usize = 4 << 10;

/// Larger pieces a call's sources are cut into when that lets the descriptors go in the
/// launch ([`driver::INLINE_MAX`] of them at most): a block then loops over its piece, but
/// the blocks no longer read their descriptors from the slot, through host memory, before
/// their first byte. On the H200 (benches/probes/inplace_floor.cu, 8 page-locked sources
/// of 492 KiB in all: 128 pieces of 4 KiB) the step took 22.1 us with 67 pieces of 8 KiB
/// in the launch against 23.4 with 128 read from host memory.
const PIECES_INLINE: [usize; 3] = [PIECE, 2 * PIECE, 4 * PIECE];

/// The kernel copies 16 bytes at a time when both ends are aligned to this; a destination
/// that is not would be written a byte at a time, from host memory: such pieces go by DMA.
const VECTOR: u64 = 16;

/// Where descriptors start after the slot's data.
const DESC_ALIGN: usize = 256;

/// Kernel pieces of `piece` bytes a source of `nbytes` needs.
fn pieces(nbytes: usize, piece: usize) -> usize {
    nbytes.div_ceil(piece)
}

/// The piece size for sources of the sizes `sizes()` yields: the smallest of [`PIECES_INLINE`] whose
/// pieces the launch can take by value, else [`PIECE`] (the descriptors then go in the
/// slot), and the number of pieces.
fn piece_size<I: Iterator<Item = usize>>(sizes: impl Fn() -> I) -> (usize, usize) {
    let count = |piece| {
        sizes().try_fold(0usize, |n, len| {
            Some(n + pieces(len, piece)).filter(|&n| n <= driver::INLINE_MAX)
        })
    };
    PIECES_INLINE
        .iter()
        .find_map(|&piece| count(piece).map(|n| (piece, n)))
        .unwrap_or_else(|| (PIECE, sizes().map(|len| pieces(len, PIECE)).sum()))
}

/// Whether the kernel writes `view` at full speed: its address is 16-byte aligned (empty
/// views need no write at all).
pub(crate) fn kernel_writes_well(view: &DeviceView) -> bool {
    view.addr(0).is_none_or(|a| a % VECTOR == 0)
}

/// Whether the kernel reads `src` in place at full speed: its address is 16-byte aligned
/// (a view at an odd offset would be read a byte at a time, over PCIe).
pub(crate) fn kernel_reads_well(src: &PinnedBuf) -> bool {
    (src.as_ptr() as usize).is_multiple_of(VECTOR as usize)
}

/// Where `n` descriptors start in a slot of `slot_len` bytes whose first `data_end` hold
/// staged data; `None` if they do not fit.
pub(crate) fn descriptors_at(data_end: usize, n: usize, slot_len: usize) -> Option<usize> {
    let at = data_end.checked_next_multiple_of(DESC_ALIGN)?;
    let end = at.checked_add(n.checked_mul(std::mem::size_of::<GatherPiece>())?)?;
    (end <= slot_len).then_some(at)
}

/// An internal error of this module: the engine hands it only consistent plans.
fn bug(reason: String) -> Error {
    Error::Internal {
        op: "copy into",
        reason,
    }
}

/// One copy submission for all `(dst, src, len)` (where the driver has the batched copy,
/// there are two or more, and the stream is not the legacy one), else one each. Returns
/// the submissions made.
///
/// # Safety
/// Every `src..+len` is page-locked host memory alive and unchanged until the copies have
/// finished, every `dst..+len` device memory of `device` nothing else uses until then.
unsafe fn queue_h2d(
    ctx: &ContextGuard,
    copies: Vec<(DevicePtr, *const u8, usize)>,
    device: usize,
    stream: &Stream,
) -> Result<usize> {
    if copies.len() >= 2 && driver::batch_copy_available() && !stream.is_legacy() {
        let mut dsts: Vec<DevicePtr> = copies.iter().map(|c| c.0).collect();
        let mut srcs: Vec<DevicePtr> = copies.iter().map(|c| c.1 as DevicePtr).collect();
        let mut sizes: Vec<usize> = copies.iter().map(|c| c.2).collect();
        // SAFETY: the caller's obligations, for every copy; with unified addressing a
        // page-locked host address is a valid source.
        unsafe {
            driver::memcpy_batch_h2d_async(ctx, &mut dsts, &mut srcs, &mut sizes, device, stream)
        }?;
        return Ok(1);
    }
    for &(dst, src, len) in &copies {
        // SAFETY: the caller's obligations, for this copy.
        unsafe { driver::memcpy_h2d_async(ctx, dst, src, len, stream) }?;
    }
    Ok(copies.len())
}

/// The address of `view`, checked to hold `len` bytes.
fn dst_addr(view: &DeviceView, at: usize, len: usize) -> Result<DevicePtr> {
    check_range("copy destination", at, len, view.nbytes())?;
    view.addr(at)
        .ok_or_else(|| bug(format!("an empty destination for {len} bytes")))
}

/// Queues copies of page-locked sources straight from their memory into their
/// destinations (same sizes). Returns the submissions made.
///
/// # Safety
/// Every source stays alive and unchanged, and every destination's memory allocated and
/// used by nothing else, until the copies have finished; the destinations are usable in
/// `stream`'s order.
pub(crate) unsafe fn h2d_direct(
    ctx: &ContextGuard,
    pairs: &[(&PinnedBuf, &DeviceView)],
    device: usize,
    stream: &Stream,
) -> Result<usize> {
    let mut copies = Vec::with_capacity(pairs.len());
    for (src, dst) in pairs {
        let n = src.nbytes();
        if n > 0 {
            copies.push((dst_addr(dst, 0, n)?, src.as_ptr(), n));
        }
    }
    // SAFETY: each range is a whole source and lies inside its destination (checked by
    // dst_addr); the rest is the caller's obligation.
    unsafe { queue_h2d(ctx, copies, device, stream) }
}

/// A piece of a staged source, in a slot, bound for a destination.
pub(crate) struct SlotPart<'a> {
    /// Where the piece is in the slot.
    pub slot_off: usize,
    /// Its bytes.
    pub len: usize,
    /// The destination and where in it the piece goes.
    pub view: &'a DeviceView,
    pub view_off: usize,
}

/// Queues one DMA per part from `lease`'s slot to its destination (one batched submission
/// where the driver has it), then records the slot's event. Returns the submissions made.
///
/// # Safety
/// Every destination's memory stays allocated, and is used by nothing else, until the
/// slot's event has completed; the destinations are usable in `stream`'s order.
pub(crate) unsafe fn h2d_from_slot(
    ctx: &ContextGuard,
    lease: &mut SlotLease,
    parts: &[SlotPart],
    device: usize,
    stream: &Stream,
) -> Result<usize> {
    let mut made = 0;
    let queue = |base: *const u8, slot_len: usize| -> Result<()> {
        let mut copies = Vec::with_capacity(parts.len());
        for p in parts.iter().filter(|p| p.len > 0) {
            check_range("slot part", p.slot_off, p.len, slot_len)?;
            let dst = dst_addr(p.view, p.view_off, p.len)?;
            copies.push((dst, base.wrapping_add(p.slot_off), p.len));
        }
        // SAFETY: every source is inside the slot (checked above), which the lease keeps
        // unchanged until its event completes (recorded by queue_reads after these); every
        // destination inside its view (checked by dst_addr); the rest is the caller's.
        made = unsafe { queue_h2d(ctx, copies, device, stream) }?;
        Ok(())
    };
    // SAFETY: `queue` reads only the slot's own range, on `stream`.
    unsafe { lease.queue_reads(stream, queue) }?;
    Ok(made)
}

/// The kernel's work for one call: the staged sources in the slot (at `offsets`, of
/// `sizes` bytes, bound for `to`, in that order) and the page-locked sources it reads in
/// place.
pub(crate) struct Scatter<'a> {
    pub offsets: &'a [usize],
    pub sizes: &'a [usize],
    pub to: &'a [&'a DeviceView],
    pub mapped: &'a [(&'a PinnedBuf, &'a DeviceView)],
    /// End of the staged data in the slot.
    pub data_end: usize,
}

impl Scatter<'_> {
    /// The staged sources whose destinations the kernel writes (the others go by DMA):
    /// `(slot offset, bytes, destination)`.
    fn by_kernel(&self) -> impl Iterator<Item = (usize, usize, &DeviceView)> + '_ {
        self.staged().filter(|s| kernel_writes_well(s.2))
    }

    fn staged(&self) -> impl Iterator<Item = (usize, usize, &DeviceView)> + '_ {
        self.offsets
            .iter()
            .zip(self.sizes)
            .zip(self.to)
            .map(|((&o, &n), &v)| (o, n, v))
    }

    /// The size the kernel's sources are cut into, and the descriptors that makes (staged
    /// pieces whose destinations it writes badly go by DMA and need none).
    fn pieces(&self) -> (usize, usize) {
        let mapped = || self.mapped.iter().map(|m| m.0.nbytes());
        piece_size(|| self.by_kernel().map(|s| s.1).chain(mapped()))
    }

    /// Descriptors the kernel needs.
    pub(crate) fn descriptors(&self) -> usize {
        self.pieces().1
    }

    /// Whether the work needs no staging slot: nothing staged, and every descriptor fits
    /// the launch's parameters ([`h2d_mapped`]).
    pub(crate) fn slot_free(&self) -> bool {
        self.data_end == 0 && self.sizes.is_empty() && self.descriptors() <= driver::INLINE_MAX
    }
}

/// The kernel's checks of `work` before anything is queued: the device maps page-locked
/// memory, and every mapped source is mapped for it.
fn check_mapped(ctx: &ContextGuard, work: &Scatter, device: usize) -> Result<()> {
    if !driver::host_memory_mapped(device) {
        return Err(bug(format!("cuda:{device} does not map host memory")));
    }
    if let Some(k) = work.mapped.iter().position(|m| !m.0.mapped_on(ctx)) {
        return Err(bug(format!("page-locked source {k} is not mapped")));
    }
    Ok(())
}

/// Writes the kernel's descriptors of `work` into `out` (exactly as many as
/// [`Scatter::pieces`] plans, cut at its size; staged sources read at `slot_base` plus
/// their offset), each destination checked first: the kernel writes device memory
/// unchecked. Returns the lowest destination the kernel writes (each descriptor's
/// `dst_off` is relative to it, never to a null base) and the staged pieces that go by DMA
/// instead (their destination is not 16-byte aligned).
fn describe<'w>(
    work: &'w Scatter,
    slot_base: u64,
    out: &mut [GatherPiece],
) -> Result<(DevicePtr, Vec<SlotPart<'w>>)> {
    let (cut_len, n) = work.pieces();
    if out.len() != n {
        return Err(bug(format!("{n} descriptors into room for {}", out.len())));
    }
    let kernel_views = work
        .by_kernel()
        .map(|s| s.2)
        .chain(work.mapped.iter().map(|m| m.1));
    let dst_base = kernel_views.filter_map(|v| v.addr(0)).min().unwrap_or(0);
    let mut written = 0;
    let mut cut = |src: u64, len: usize, view: &DeviceView| -> Result<()> {
        for piece in (0..len).step_by(cut_len) {
            let piece_len = cut_len.min(len - piece);
            let dst = dst_addr(view, piece, piece_len)?;
            let d = out
                .get_mut(written)
                .ok_or_else(|| bug(format!("more descriptors than the {n} planned")))?;
            *d = GatherPiece {
                src: src + piece as u64,
                dst_off: dst - dst_base,
                len: piece_len as u64,
                zeros: 0,
            };
            written += 1;
        }
        Ok(())
    };
    let mut by_dma: Vec<SlotPart> = Vec::new();
    for (slot_off, len, view) in work.staged() {
        check_range("staged source", slot_off, len, work.data_end)?;
        if kernel_writes_well(view) {
            cut(slot_base + slot_off as u64, len, view)?;
        } else {
            by_dma.push(SlotPart {
                slot_off,
                len,
                view,
                view_off: 0,
            });
        }
    }
    for &(src, view) in work.mapped {
        cut(src.as_ptr() as u64, src.nbytes(), view)?;
    }
    if written != n {
        return Err(bug(format!("{written} descriptors, {n} planned")));
    }
    Ok((dst_base, by_dma))
}

/// Queues the scatter of `work` with one launch of the gather kernel, whose descriptors go
/// into `lease`'s slot after the staged data; staged sources whose destination is not
/// 16-byte aligned go by DMA from the slot. Records the slot's event. Returns the
/// submissions made (the launch counts as one).
///
/// # Errors
/// A device that does not map page-locked memory, a mapped source it cannot read, more
/// descriptors than fit the slot, a destination too small: all before anything is queued.
///
/// # Safety
/// The staged bytes are in the slot (filled, or being filled through the lease); every
/// mapped source stays alive and unchanged, and every destination's memory allocated and
/// used by nothing else, until the slot's event has completed; the destinations are
/// usable in `stream`'s order.
pub(crate) unsafe fn h2d_scatter(
    ctx: &ContextGuard,
    lease: &mut SlotLease,
    kernel: GatherKernel,
    work: &Scatter,
    device: usize,
    stream: &Stream,
) -> Result<usize> {
    check_mapped(ctx, work, device)?;
    let n = work.descriptors();
    let buf = lease.bytes_mut()?; // waits for the fill and for the slot's last use
    let Some(at) = descriptors_at(work.data_end, n, buf.len()) else {
        return Err(bug(format!(
            "{n} descriptors after {} bytes do not fit a slot of {}",
            work.data_end,
            buf.len()
        )));
    };
    let base = buf.as_ptr() as u64;
    // Every piece written straight into the slot.
    let slot: &mut [GatherPiece] = bytemuck::try_cast_slice_mut(&mut buf[at..at + n * 32])
        .map_err(|e| bug(format!("descriptors in the slot: {e}")))?;
    let (dst_base, by_dma) = describe(work, base, slot)?;
    let descs: *const GatherPiece = slot.as_ptr();
    let mut made = 0;
    let queue = |slot_base: *const u8, slot_len: usize| -> Result<()> {
        let mut dma = Vec::with_capacity(by_dma.len());
        for p in by_dma.iter().filter(|p| p.len > 0) {
            check_range("slot part", p.slot_off, p.len, slot_len)?;
            dma.push((
                dst_addr(p.view, 0, p.len)?,
                slot_base.wrapping_add(p.slot_off),
                p.len,
            ));
        }
        // SAFETY: sources inside the slot, unchanged until its event; destinations
        // inside their views (dst_addr); the rest is the caller's obligation.
        made += unsafe { queue_h2d(ctx, dma, device, stream) }?;
        // SAFETY: the slot's `n` descriptors, written above; nothing writes the slot
        // while its lease queues reads of it.
        let descs = unsafe { std::slice::from_raw_parts(descs, n) };
        // SAFETY: the descriptors are in the slot (written above), which the device reads
        // in place through its mapping (checked above) where there are too many to pass
        // in the launch, and which stays unchanged until its event; each piece reads a
        // range of the slot's data or of a mapped page-locked source (checked above; the
        // caller keeps those alive) and writes `dst_base + dst_off ..+ len`, a range
        // inside its destination (dst_addr, made relative to the lowest destination the
        // kernel writes), whose memory the caller keeps: the pieces' ranges lie in several
        // allocations, each one device memory.
        unsafe {
            driver::launch_gather(
                ctx,
                kernel,
                descs,
                slot_base as u64 + at as u64,
                dst_base,
                stream,
            )
        }?;
        made += usize::from(n > 0);
        Ok(())
    };
    // SAFETY: `queue` reads the slot's own range only, on `stream`; the mapped sources and
    // the destinations are the caller's obligation.
    unsafe { lease.queue_reads(stream, queue) }?;
    Ok(made)
}

/// Queues the scatter of `work`, which stages nothing (every source is page-locked memory
/// the kernel reads in place, [`Scatter::slot_free`]), with one launch whose descriptors
/// go in its parameters: no staging slot is leased, waited for or marked. Returns the
/// submissions made (one).
///
/// # Errors
/// Work that stages something or has more pieces than the launch takes, a device that
/// does not map page-locked memory, a mapped source it cannot read, a destination too
/// small: all before anything is queued.
///
/// # Safety
/// Every mapped source stays alive and unchanged, and every destination's memory
/// allocated and used by nothing else, until `stream` has passed the launch (the caller's
/// event recorded after it says so); the destinations are usable in `stream`'s order.
pub(crate) unsafe fn h2d_mapped(
    ctx: &ContextGuard,
    kernel: GatherKernel,
    work: &Scatter,
    device: usize,
    stream: &Stream,
) -> Result<usize> {
    if !work.slot_free() {
        return Err(bug("work that needs a staging slot, without one".into()));
    }
    check_mapped(ctx, work, device)?;
    let n = work.descriptors();
    let mut local = [<GatherPiece as bytemuck::Zeroable>::zeroed(); driver::INLINE_MAX];
    let (dst_base, by_dma) = describe(work, 0, &mut local[..n])?;
    if !by_dma.is_empty() {
        return Err(bug("staged pieces to copy, without a slot".into()));
    }
    // SAFETY: at most INLINE_MAX descriptors (slot_free), so they go in the launch's
    // parameters and `readable` is never read; each piece reads a range of a mapped
    // page-locked source (checked above; the caller keeps it alive and unchanged) and
    // writes `dst_base + dst_off ..+ len`, inside its destination (dst_addr in describe),
    // which the caller keeps and orders.
    unsafe { driver::launch_gather(ctx, kernel, &local[..n], 0, dst_base, stream) }?;
    Ok(usize::from(n > 0))
}

/// A host destination's first byte, for writing: only memory pinlane may write (see
/// `Storage::host_write_ptr`).
pub(crate) struct HostDst {
    ptr: *mut u8,
    len: usize,
}

impl HostDst {
    /// `t`'s bytes as a destination, if pinlane may write them.
    pub(crate) fn of(t: &crate::tensor::Tensor) -> Option<HostDst> {
        let ptr = t.storage().host_write_ptr()?;
        Some(HostDst {
            ptr,
            len: t.nbytes(),
        })
    }

    /// `(start, len)`, for the overlap check.
    pub(crate) fn range(&self) -> (u64, usize) {
        (self.ptr as u64, self.len)
    }
}

/// Copies each source's bytes into its destination (same lengths), in parallel on the
/// copy threads when they add up to enough.
///
/// # Safety
/// Every destination is writable memory of `len` bytes that nothing else reads or writes
/// until this returns, and overlaps no source or other destination.
pub(crate) unsafe fn write_host(copy: &Arc<CopyPool>, pairs: &[(&[u8], HostDst)]) -> Result<()> {
    let mut tasks = CopyTasks::with_capacity(pairs.len());
    for (src, dst) in pairs {
        if src.len() != dst.len {
            return Err(bug(format!(
                "{} bytes for a destination of {}",
                src.len(),
                dst.len
            )));
        }
        if !src.is_empty() {
            tasks.push(CopyTask {
                src: src.as_ptr(),
                dst: dst.ptr,
                len: src.len(),
            });
        }
    }
    // SAFETY: the caller's obligations, and `run` returns only when every byte is copied.
    unsafe { copy.run(tasks, Stores::Cached) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_go_after_the_data_when_they_fit() {
        assert_eq!(descriptors_at(0, 0, 0), Some(0));
        assert_eq!(descriptors_at(1, 2, 1024), Some(256));
        assert_eq!(descriptors_at(256, 24, 1024), Some(256));
        assert_eq!(descriptors_at(256, 25, 1024), None, "256 + 25 * 32 > 1024");
        assert_eq!(descriptors_at(usize::MAX, 1, usize::MAX), None);
        assert_eq!(descriptors_at(0, usize::MAX, usize::MAX), None);
    }

    #[test]
    fn large_sources_are_cut_into_pieces() {
        assert_eq!(pieces(0, PIECE), 0);
        assert_eq!(pieces(1, PIECE), 1);
        assert_eq!(pieces(PIECE, PIECE), 1);
        assert_eq!(pieces(PIECE + 1, PIECE), 2);
    }

    #[test]
    fn pieces_grow_only_as_far_as_the_launch_needs() {
        let max = driver::INLINE_MAX;
        let sizes = |v: &[usize]| piece_size(|| v.iter().copied());
        assert_eq!(sizes(&[]), (PIECE, 0));
        assert_eq!(sizes(&[1, 2, 3]), (PIECE, 3));
        // Fits the launch at 4 KiB: unchanged.
        assert_eq!(sizes(&[max * PIECE]), (PIECE, max));
        // One piece too many at 4 KiB: 8 KiB pieces (64 of them).
        assert_eq!(sizes(&[max * PIECE + 1]), (2 * PIECE, 64));
        // The 8 sources of copy_into.py's "8 tensors, 492 KiB": 128 pieces, then 67.
        let step = [9392, 196472, 2704, 34680, 156104, 360, 25056, 79080];
        assert_eq!(sizes(&step), (2 * PIECE, 67));
        // 16 KiB pieces when 8 KiB ones are still too many.
        assert_eq!(sizes(&[300 * PIECE]), (4 * PIECE, 75));
        // Many small sources are one piece each whatever the size: 4 KiB, from the slot.
        assert_eq!(sizes(&vec![100; max + 1]), (PIECE, max + 1));
        // Too many at every size: 4 KiB pieces, every one counted.
        assert_eq!(sizes(&[600 * PIECE, 1]), (PIECE, 601));
    }
}
