//! Host to device: [`transfer_tensor_h2d`](crate::transfer_tensor_h2d).
//!
//! One batch, one device allocation, one synchronisation:
//!
//! 1. Gather the batch's host tensors. Pageable ones, and page-locked ones under 256 KiB
//!    (64 KiB with `cuMemcpyBatchAsync`), are laid out back to back at the front of the
//!    batch's device buffer (the *staged region*), the larger page-locked ones after it.
//! 2. Allocate the buffer (`cuMemAllocFromPoolAsync`) on the thread's H2D stream.
//! 3. The larger page-locked sources: straight from their memory, all in one
//!    `cuMemcpyBatchAsync` where the driver has it, else one copy each.
//! 4. The staged region is cut into windows (at most one staging slot each, smaller for
//!    small batches so the first copy starts early): the copy threads copy the pieces of
//!    the pageable tensors that fall in a window into a slot (the slot has the window's
//!    exact layout, padding included), then one copy moves the whole window. Fills run up
//!    to two windows ahead of the copies; slots are reused round-robin, and refilling one
//!    waits for its previous copy only. Many small tensors share one copy.
//! 5. While the copies run, build the device tensors (views into the buffer) and the
//!    rebuilt batch; then synchronise the stream and hand them out.

use super::completion::{self, Pending};
use super::{plan, record_stats, thread_state, Mode, TransferStats};
use crate::batch::{self, Batch};
use crate::driver::{self, ContextGuard, Stream};
use crate::error::{Error, Result};
use crate::memory::{self, DeviceAlloc, DeviceView, InFlight, PinnedBuf, Stores, DEVICE_ALIGN};
use crate::tensor::{Storage, Tensor};
use crate::H2dOptions;
use std::collections::VecDeque;
use std::sync::Arc;

/// Page-locked sources smaller than this are staged like pageable ones: many of them then
/// share one copy, where each would otherwise cost a DMA of its own (~2.6 us apiece:
/// 1000 x 1 KiB took 2.7 ms that way; docs/performance.md).
const DIRECT_MIN_BYTES: usize = 256 << 10;

/// With `cuMemcpyBatchAsync` (CUDA 12.8+), page-locked sources from this size on are
/// copied directly, all in one batched submission.
const BATCHED_DIRECT_MIN_BYTES: usize = 64 << 10;

/// Staged regions up to this size are filled with streaming stores.
const SMALL_BATCH: usize = 32 << 20;

pub(crate) fn transfer<B: Batch>(
    batch: &B,
    opts: &H2dOptions,
    mode: Mode,
) -> Result<(B, Option<Pending>)> {
    opts.device.check()?; // a string that names no device is an error on every machine
    opts.check()?; // before any copy: a bad option must not lose a finished transfer
    let Some(info) = driver::available() else {
        return Ok((batch::replace_tensors(batch, Vec::new()), None));
    };
    let device = opts.device.resolve(info.device_count)?.ordinal();
    driver::deferred::surface(device)?;
    if let Some(s) = &opts.consumer_stream {
        if s.index() != device {
            return Err(Error::StreamDeviceMismatch {
                stream_device: s.index(),
                device,
            });
        }
    }
    let all = batch::tensors(batch);
    // With the batched copy, direct copies are one submission for all of them, and
    // smaller page-locked tensors are worth copying directly.
    let direct_min = if memory::batch_copy_available() {
        BATCHED_DIRECT_MIN_BYTES
    } else {
        DIRECT_MIN_BYTES
    };
    // One pass over the batch: `order` lists (as indices into `all`) the host tensors,
    // staged ones first (pageable, and small page-locked ones), then those copied straight
    // from their page-locked memory; `staged` holds the first ones' bytes, `direct` the
    // others' buffers.
    let mut order = Vec::with_capacity(all.len());
    let mut staged: Vec<&[u8]> = Vec::with_capacity(all.len());
    let mut direct: Vec<(usize, &PinnedBuf)> = Vec::new();
    for (i, t) in all.iter().enumerate() {
        match t.storage() {
            Storage::Host(b) => {
                order.push(i);
                staged.push(b.bytes());
            }
            Storage::Pinned(b) if t.nbytes() < direct_min => {
                order.push(i);
                staged.push(b.bytes());
            }
            Storage::Pinned(b) => direct.push((i, b)),
            Storage::Device(_) => {}
        }
    }
    order.extend(direct.iter().map(|d| d.0));
    let direct: Vec<&PinnedBuf> = direct.into_iter().map(|d| d.1).collect();
    if order.is_empty() {
        return Ok((batch::replace_tensors(batch, Vec::new()), None));
    }

    super::trace::mark("gathered");
    let stream = thread_state::h2d_stream(device)?;
    let ctx = driver::bind(device)?;
    let consumer = match &opts.consumer_stream {
        Some(s) => s.clone(),
        None => Stream::legacy(crate::Device::cuda(device))?,
    };
    let sizes: Vec<usize> = order.iter().map(|&i| all[i].nbytes()).collect();
    let (offsets, end) = plan::pack(sizes.iter().copied(), DEVICE_ALIGN)?;
    let staged_end = staged
        .len()
        .checked_sub(1)
        .map_or(0, |last| offsets[last] + sizes[last]);

    super::trace::mark("planned");
    let mut job = InFlight::new(stream, crate::runtime::runtime().settings().drop_sync_wait);
    let mut stats = TransferStats {
        tensors: order.len(),
        bytes: sizes.iter().sum(),
        ..TransferStats::default()
    };
    // The output tensors (views into the batch's buffer, which `job` holds too) are made
    // while the host fills the staging slots, and the batch is rebuilt around them while
    // the copies run. They reach the caller only if the copies succeed; otherwise they are
    // dropped here, and `job` keeps the buffer until the stream has let go of it.
    let make_outputs = |alloc: Option<&Arc<DeviceAlloc>>| -> Result<Vec<Tensor>> {
        let views = match alloc {
            Some(a) => DeviceView::views(a, offsets.iter().copied().zip(sizes.iter().copied()))?,
            None => vec![DeviceView::empty(device); order.len()],
        };
        let made = order.iter().zip(views).map(|(&i, view)| {
            let t = all[i];
            Tensor::from_parts(
                t.dtype(),
                t.shape().clone(),
                t.nbytes(),
                Storage::Device(view),
            )
        });
        let made = made.collect();
        super::trace::mark("outputs made");
        Ok(made)
    };
    let run = submit(
        &ctx,
        device,
        &consumer,
        &mut job,
        &staged,
        &direct,
        &offsets,
        &sizes,
        end,
        staged_end,
        &mut stats,
        make_outputs,
    );
    let keep_sources = || {
        order
            .iter()
            .map(|&i| all[i].clone())
            .collect::<Vec<Tensor>>()
    };
    let (alloc, outputs) = match run {
        Ok(r) => r,
        Err(e) => return Err(job.abort(e, keep_sources)),
    };
    super::trace::mark("submitted");
    let moved = outputs.into_iter();
    let rebuilt = super::rebuild_with(batch, all.len(), &order, moved);
    super::trace::mark("rebuilt");
    let pending = match mode {
        Mode::Blocking => {
            job.finish(keep_sources)?;
            None
        }
        Mode::Async => Some(completion::detach(job, device, keep_sources)?),
    };
    super::trace::mark("synced");
    record_stats(stats);
    if let Some(a) = alloc {
        thread_state::cache_batch(device, a, opts.num_caches)?;
    }
    Ok((rebuilt, pending))
}

/// Queues every copy of the batch on `job`'s stream, calling `meanwhile` with the batch's
/// allocation once: while the host fills the last staging windows, before waiting for
/// those fills (or after the direct copies when nothing is staged; with `None` when all
/// host tensors are empty and there is nothing to copy). Returns the batch's allocation
/// and what `meanwhile` made.
#[allow(clippy::too_many_arguments)]
fn submit<T>(
    ctx: &ContextGuard,
    device: usize,
    consumer: &Stream,
    job: &mut InFlight,
    staged: &[&[u8]],
    direct: &[&PinnedBuf],
    offsets: &[usize],
    sizes: &[usize],
    end: usize,
    staged_end: usize,
    stats: &mut TransferStats,
    meanwhile: impl FnOnce(Option<&Arc<DeviceAlloc>>) -> Result<T>,
) -> Result<(Option<Arc<DeviceAlloc>>, T)> {
    if end == 0 {
        return Ok((None, meanwhile(None)?));
    }
    let stream = job.stream().clone();
    let alloc = DeviceAlloc::new_async(ctx, device, end, &stream, consumer.clone())?;
    job.hold(&alloc, end);
    super::trace::mark("allocated");

    // The direct sources follow the staged ones in `offsets` and `sizes`.
    let direct: Vec<(&PinnedBuf, usize)> = direct
        .iter()
        .zip(staged.len()..)
        .filter(|&(_, k)| sizes[k] > 0)
        .map(|(&buf, k)| {
            stats.direct_bytes += sizes[k];
            (buf, offsets[k])
        })
        .collect();
    if direct.len() >= 2 && memory::batch_copy_available() && !stream.is_legacy() {
        let (bufs, at): (Vec<&PinnedBuf>, Vec<usize>) = direct.into_iter().unzip();
        // SAFETY: as for the single copies below, for every source; the stream is
        // pinlane's own H2D stream, never the legacy one.
        unsafe { memory::h2d_batch_async(ctx, &bufs, &alloc, &at, device, &stream) }?;
        stats.copies += 1;
    } else {
        for (buf, at) in direct {
            // SAFETY: `alloc` was allocated on this stream and `job` holds it until the
            // stream is proven idle; the source is borrowed from the caller's batch for
            // this whole call, and cloned into the retained registry (or, for a
            // non-blocking call, into its owners) until the copy is proven done.
            unsafe { buf.h2d_async(ctx, &alloc, at, &stream) }?;
            stats.copies += 1;
        }
    }

    if staged_end > 0 {
        let rt = crate::runtime::runtime();
        let window = plan::window_size(staged_end, rt.arena.slot_bytes());
        let nslots = super::lease_slots(ctx, job, staged_end.div_ceil(window))?;
        super::trace::mark("leased");
        // Windows whose fill has started but whose copy is not queued yet, oldest first.
        // Up to `ahead` fills run at once, so the copy threads go from one window to the
        // next without a gap; fewer than `nslots`, so a slot is never refilled before its
        // own window's copy is queued.
        let ahead = (nslots - 1).min(2);
        // Streaming stores fill small batches faster, ordinary ones large batches
        // (measured: docs/performance.md).
        let stores = rt.fill_stores(if staged_end <= SMALL_BATCH {
            Stores::Streaming
        } else {
            Stores::Cached
        });
        let mut filling: VecDeque<(usize, usize, usize)> = VecDeque::new(); // (slot, start, len)
        let (offsets, sizes) = (&offsets[..staged.len()], &sizes[..staged.len()]);
        stats.staged_bytes += sizes.iter().sum::<usize>();
        let mut windows = plan::windows(staged_end, window).enumerate().peekable();
        while let Some((w_idx, w)) = windows.next() {
            let k = w_idx % nslots;
            let pieces = w.parts(offsets, sizes).map(|p| {
                let bytes = staged[p.item];
                (p.window_off, &bytes[p.item_off..p.item_off + p.len])
            });
            // SAFETY: the pieces borrow the caller's batch, alive for this whole call; the
            // lease settles its fill before the call ends (InFlight::finish/abort settle
            // every lease, and so does dropping one).
            unsafe { job.leases[k].fill_start(pieces, &rt.copy, stores) }?;
            super::trace::mark("fill started");
            filling.push_back((k, w.start, w.len));
            // After the last fill no slot is needed again: its copies are queued below,
            // once `meanwhile` has run while the copy threads fill.
            let last = windows.peek().is_none();
            while filling.len() > ahead && !last {
                let Some((k, start, len)) = filling.pop_front() else {
                    break;
                };
                queue_window(ctx, job, k, len, &alloc, start, &stream, stats)?;
            }
        }
        let made = meanwhile(Some(&alloc))?;
        while let Some((k, start, len)) = filling.pop_front() {
            queue_window(ctx, job, k, len, &alloc, start, &stream, stats)?;
        }
        Ok((Some(alloc), made))
    } else {
        let made = meanwhile(Some(&alloc))?;
        Ok((Some(alloc), made))
    }
}

/// Queues the copy of a filled slot (waiting for its fill first) to `alloc` at `start`.
#[allow(clippy::too_many_arguments)]
fn queue_window(
    ctx: &ContextGuard,
    job: &mut InFlight,
    k: usize,
    len: usize,
    alloc: &DeviceAlloc,
    start: usize,
    stream: &Stream,
    stats: &mut TransferStats,
) -> Result<()> {
    // SAFETY: `alloc` was allocated on this stream and `job` holds it until the stream is
    // proven idle.
    unsafe { job.leases[k].h2d_window(ctx, len, alloc, start, stream) }?;
    super::trace::mark("window queued");
    stats.copies += 1;
    stats.windows += 1;
    Ok(())
}
