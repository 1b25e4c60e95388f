//! Host to device: [`transfer_tensor_h2d`](crate::transfer_tensor_h2d).
//!
//! One batch, one device allocation, one synchronisation:
//!
//! 1. Gather the batch's host tensors. Pageable ones are laid out back to back at the
//!    front of the batch's device buffer (the *staged region*), then the *mapped* ones:
//!    at least 4 page-locked tensors under 4 MiB, in memory pinlane page-locked, which a
//!    kernel reads straight from host memory ([`SmallH2d::Kernel`]); then the other
//!    page-locked ones, copied directly. Without the kernel, or with fewer such tensors,
//!    page-locked ones under 256 KiB (64 KiB with `cuMemcpyBatchAsync`) are staged.
//! 2. Allocate the buffer (`cuMemAllocFromPoolAsync`) on the thread's H2D stream, and
//!    queue step 3's copies. Where the staged region is one window and there is no
//!    kernel and no direct copy, this comes after step 4 has started that window's fill,
//!    so the copy threads fill while the driver allocates.
//! 3. The direct page-locked sources: straight from their memory, all in one
//!    `cuMemcpyBatchAsync` where the driver has it, else one copy each. The mapped ones:
//!    one launch of the gather kernel, its descriptors in the first staging slot.
//! 4. The staged region is cut into windows (at most one staging slot each, smaller for
//!    small batches and for the first windows of large ones, so the first copy starts
//!    early): the copy threads copy the pieces of the pageable tensors that fall in a
//!    window into a slot (the slot has the window's exact layout, padding included), then
//!    one copy moves the whole window. The calling thread polls ([`Pump`]): each filled
//!    window's copy is queued at once, in order, and a window's fill starts as soon as
//!    its slot's previous copy has finished; meanwhile it copies pieces itself. Many
//!    small tensors share one copy.
//! 5. Once every window's fill has started (with nothing staged: while the copies run),
//!    build the device tensors (views into the buffer) and the rebuilt batch, in one pass;
//!    every few tensors the pass queues the copy of each window whose fill has finished
//!    (a non-blocking look), so the copy crosses the link while the batch is rebuilt.
//!    Then (`transfer_tensor_h2d_overlapping`) run the caller's `while_copying` on it once
//!    every copy is queued, synchronise the stream and hand them out.

use super::completion::{self, Pending, Wake};
use super::H2dOptions;
use super::{plan, record_stats, thread_state, Call, Mode, WhileCopying};
use crate::batch::{self, Batch};
use crate::config::SmallH2d;
use crate::driver::{self, Stream};
use crate::error::{Error, Result};
use crate::memory::{self, DeviceAlloc, DeviceView, InFlight, PinnedBuf, Stores, DEVICE_ALIGN};
use crate::tensor::{Storage, Tensor};
use std::sync::Arc;

/// Page-locked sources smaller than this are staged like pageable ones: many of them then
/// share one copy, where each would otherwise cost a DMA of its own (~2.6 us apiece:
/// 1000 x 1 KiB took 2.7 ms that way; docs/performance.md).
pub(super) const DIRECT_MIN_BYTES: usize = 256 << 10;

/// With `cuMemcpyBatchAsync` (CUDA 12.8+), page-locked sources from this size on are
/// copied directly, all in one batched submission.
pub(super) const BATCHED_DIRECT_MIN_BYTES: usize = 64 << 10;

/// Staged regions up to this size are filled with streaming stores.
pub(super) const SMALL_BATCH: usize = 32 << 20;

/// Page-locked sources under this size may be read by the gather kernel: it reads host
/// memory at ~51 GB/s on the H200, where one DMA of 16 MiB or more reaches 55.
pub(super) const MAPPED_MAX_BYTES: usize = 4 << 20;

/// Fewest page-locked sources worth a kernel launch; fewer are copied.
pub(super) const MAPPED_MIN_COUNT: usize = 4;

/// How one host tensor moves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Route {
    /// Through the staging slots.
    Staged,
    /// Read by the gather kernel from its page-locked memory.
    Mapped,
    /// One copy (or one entry of a batched copy) from its page-locked memory.
    Direct,
}

/// The route of a page-locked source of `nbytes`: `mapped` when the kernel may read it
/// (the kernel is on, the device maps host memory, pinlane page-locked the memory, and
/// its pieces still fit the descriptor slot); else staged below `direct_min`, else direct.
fn pinned_route(nbytes: usize, mapped: bool, direct_min: usize) -> Route {
    if mapped && nbytes < MAPPED_MAX_BYTES {
        Route::Mapped
    } else if nbytes < direct_min {
        Route::Staged
    } else {
        Route::Direct
    }
}

/// `while_copying` (blocking calls only) runs on the rebuilt batch once every copy is
/// queued, before the call waits for them; not on a batch that passes through (its
/// caller runs it on the finished batch then).
pub(crate) fn transfer<B: Batch>(
    batch: &B,
    opts: &H2dOptions,
    mode: Mode,
    while_copying: WhileCopying<'_, B>,
) -> Result<(B, Option<Pending>)> {
    let Some(device) = target(opts)? else {
        return Ok((batch::replace_tensors(batch, Vec::new()), None));
    };
    let all = batch::tensors(batch);
    // Device tensors pass through unread (an H2D output still in flight too: its clone
    // stays gated), so only page-locked storages are checked.
    memory::check_readable(all.iter().map(|t| t.storage()), "transfer_tensor_h2d")?;
    let rt = crate::runtime::runtime();
    let src = route(&all, device, &rt);
    let order = &src.order;
    if order.is_empty() {
        return Ok((batch::replace_tensors(batch, Vec::new()), None));
    }
    // The copy threads will fill staging slots: wake them now, so that they are up by the
    // time the first window is handed out (planning and the allocation come first).
    if src.staged.iter().map(|b| b.len()).sum::<usize>() >= rt.copy.parallel_min() {
        rt.copy.prewake();
    }

    super::trace::mark("gathered");
    let stream = thread_state::h2d_stream(device)?;
    let ctx = driver::bind(device)?;
    let consumer = consumer_stream(opts, device)?;
    let sizes: Vec<usize> = order.iter().map(|&i| all[i].nbytes()).collect();
    let (offsets, end) = plan::pack(sizes.iter().copied(), DEVICE_ALIGN)?;
    let staged_end = src
        .staged
        .len()
        .checked_sub(1)
        .map_or(0, |last| offsets[last] + sizes[last]);

    super::trace::mark("planned");
    let mut job = InFlight::new(stream);
    let mut call = Call::new(&ctx, device, &rt, order.len(), sizes.iter().sum());
    let layout = Layout {
        offsets: &offsets,
        sizes: &sizes,
        end,
        staged_end,
    };
    // The output tensors (views into the batch's buffer, which `job` holds too) are made
    // as the batch is rebuilt around them, in one pass, while the copy threads fill the
    // staging windows (or, with nothing staged, while the copies run). They reach the
    // caller only if the copies succeed (and its `while_copying` before that, under the
    // contract that nothing uses them until the call returns); otherwise they are dropped
    // here, and `job` keeps the buffer until the stream has let go of it.
    let rebuild = |alloc: Option<&Arc<DeviceAlloc>>, tick: &mut dyn FnMut()| {
        let outputs = device_outputs(&all, order, &layout, device, alloc)?;
        let rebuilt = super::rebuild_with(batch, &all, order, outputs, tick);
        super::trace::mark("rebuilt");
        rebuilt
    };
    let keep_sources = || super::device_read_sources(order.iter().map(|&i| all[i]));
    // The caller's `Batch::rebuild` runs inside, while copies may run (not all queued).
    let run = job.guarded(keep_sources, false, |job| {
        submit(&mut call, &consumer, job, &src, &layout, rebuild)
    });
    let (alloc, rebuilt) = match run {
        Ok(r) => r,
        Err(e) => return Err(job.abort(e, keep_sources)),
    };
    super::trace::mark("submitted");
    let pending = match mode {
        Mode::Blocking => {
            // The caller's work on the outputs that needs no bytes overlaps the copies.
            if let Some(f) = while_copying {
                job = super::run_while_copying(f, &rebuilt, job, keep_sources);
            }
            job.finish(keep_sources)?;
            None
        }
        Mode::Async => {
            debug_assert!(
                while_copying.is_none(),
                "while_copying is for blocking calls"
            );
            // The outputs were refused during the rebuild; once `detach` has recorded its
            // event, their uses are ordered after it until the completion proves the
            // copies done (`memory::DeviceFill::ordered_by`).
            Some(completion::detach(
                job,
                device,
                keep_sources,
                Wake::Now,
                rt.settings().spin,
            )?)
        }
    };
    super::trace::mark("synced");
    record_stats(call.stats);
    if let Some(a) = alloc {
        thread_state::cache_batch(device, a, opts.num_caches)?;
    }
    Ok((rebuilt, pending))
}

/// The stream whose order frees the batch's device memory: the caller's consumer stream
/// (refused while a CUDA graph capture runs on it), or the legacy stream.
fn consumer_stream(opts: &H2dOptions, device: usize) -> Result<Stream> {
    match &opts.consumer_stream {
        Some(s) => {
            // Its device memory is freed in its order (a free queued there during a
            // capture would be a node of the caller's graph), and a non-blocking call
            // orders it after the copies.
            s.refuse_capturing("transfer_tensor_h2d")?;
            Ok(s.clone())
        }
        None => Stream::legacy(crate::device::Device::cuda(device)),
    }
}

/// The output tensors, made lazily as they are taken: views of `alloc` at the layout's
/// offsets, with the dtypes and shapes of the sources at `order` (empty views when
/// nothing was allocated). Every range is checked before the first is made.
fn device_outputs<'a>(
    all: &'a [&Tensor],
    order: &'a [usize],
    l: &'a Layout,
    device: usize,
    alloc: Option<&'a Arc<DeviceAlloc>>,
) -> Result<impl Iterator<Item = Tensor> + 'a> {
    let mut views = match alloc {
        Some(a) => {
            let ranges = l.offsets.iter().copied().zip(l.sizes.iter().copied());
            Some(DeviceView::views(a, ranges)?)
        }
        None => None,
    };
    debug_assert!(views.as_ref().is_none_or(|v| v.len() == order.len()));
    Ok(order.iter().map(move |&i| {
        let t = all[i];
        let view = views
            .as_mut()
            .and_then(Iterator::next)
            .unwrap_or_else(|| DeviceView::empty(device));
        Tensor::from_parts(
            t.dtype(),
            t.shape().clone(),
            t.nbytes(),
            Storage::Device(view),
        )
    }))
}

/// The device the call copies to, after the checks that come before any copy; `None`
/// without CUDA (the batch passes through).
fn target(opts: &H2dOptions) -> Result<Option<usize>> {
    opts.device.check()?; // a string that names no device is an error on every machine
    opts.check()?; // before any copy: a bad option must not lose a finished transfer
    driver::fork::check("transfer_tensor_h2d")?; // in a forked child: before any lock
    let Some(info) = driver::available() else {
        return Ok(None);
    };
    let device = opts.device.resolve(info.device_count)?.ordinal();
    driver::deferred::surface(device)?;
    if let Some(s) = &opts.consumer_stream {
        if s.index() != device {
            return Err(Error::StreamDeviceMismatch {
                stream_device: crate::device::Device::cuda(s.index()),
                device: crate::device::Device::cuda(device),
            });
        }
    }
    Ok(Some(device))
}

/// The batch's host tensors by route: `order` lists them (as indices into the visit
/// order) staged ones first, then mapped ones, then direct ones; `staged` holds the first
/// ones' bytes, `mapped` and `direct` the others' buffers.
struct Routed<'a> {
    order: Vec<usize>,
    staged: Vec<&'a [u8]>,
    mapped: Vec<&'a PinnedBuf>,
    direct: Vec<&'a PinnedBuf>,
}

/// Routes every host tensor of `all` (one pass over the batch).
fn route<'a>(all: &[&'a Tensor], device: usize, rt: &crate::runtime::Runtime) -> Routed<'a> {
    // With the batched copy, direct copies are one submission for all of them, and
    // smaller page-locked tensors are worth copying directly.
    let direct_min = if memory::batch_copy_available() {
        BATCHED_DIRECT_MIN_BYTES
    } else {
        DIRECT_MIN_BYTES
    };
    let kernel =
        rt.settings().small_h2d == SmallH2d::Kernel && memory::h2d_gather_available(device);
    // The kernel's descriptors must fit one staging slot.
    let mut room = if kernel {
        rt.arena.slot_bytes() / std::mem::size_of::<driver::GatherPiece>()
    } else {
        0
    };
    let mut order = Vec::with_capacity(all.len());
    let mut staged: Vec<&[u8]> = Vec::with_capacity(all.len());
    let mut mapped: Vec<(usize, &PinnedBuf)> = Vec::new();
    let mut direct: Vec<(usize, &PinnedBuf)> = Vec::new();
    for (i, t) in all.iter().enumerate() {
        match t.storage() {
            Storage::Host(b) => {
                order.push(i);
                staged.push(b.bytes());
            }
            Storage::Pinned(b) => {
                let pieces = memory::h2d_gather_pieces(t.nbytes());
                // (An empty tensor needs no piece: only `kernel` keeps it off the kernel
                // where the kernel cannot run.)
                let readable = kernel && pieces <= room && b.mapped();
                match pinned_route(t.nbytes(), readable, direct_min) {
                    Route::Mapped => {
                        room -= pieces;
                        mapped.push((i, b));
                    }
                    Route::Staged => {
                        order.push(i);
                        staged.push(b.bytes_unchecked());
                    }
                    Route::Direct => direct.push((i, b)),
                }
            }
            Storage::Device(_) => {}
        }
    }
    // Too few for a launch: copied after all.
    if mapped.len() < MAPPED_MIN_COUNT {
        for (i, b) in mapped.drain(..) {
            match pinned_route(b.nbytes(), false, direct_min) {
                Route::Direct => direct.push((i, b)),
                _ => {
                    order.push(i);
                    staged.push(b.bytes_unchecked());
                }
            }
        }
    }
    order.extend(mapped.iter().map(|d| d.0));
    order.extend(direct.iter().map(|d| d.0));
    Routed {
        order,
        staged,
        mapped: mapped.into_iter().map(|d| d.1).collect(),
        direct: direct.into_iter().map(|d| d.1).collect(),
    }
}

/// The batch's layout in its device buffer: each tensor's offset and size (in layout
/// order), the buffer's size, and the end of the staged region at its front.
pub(super) struct Layout<'a> {
    pub offsets: &'a [usize],
    pub sizes: &'a [usize],
    pub end: usize,
    pub staged_end: usize,
}

/// Queues every copy of the batch on `job`'s stream, calling `meanwhile` with the batch's
/// allocation once: once every staging window's fill has started, with a `tick` to call
/// now and then, which queues the copies of the windows filled by then (or after the
/// direct copies and the kernel when nothing is staged; with `None` when all host tensors
/// are empty and there is nothing to copy). Returns the batch's allocation and what
/// `meanwhile` made.
fn submit<T>(
    call: &mut Call,
    consumer: &Stream,
    job: &mut InFlight,
    src: &Routed,
    l: &Layout,
    meanwhile: impl FnOnce(Option<&Arc<DeviceAlloc>>, &mut dyn FnMut()) -> Result<T>,
) -> Result<(Option<Arc<DeviceAlloc>>, T)> {
    if l.end == 0 {
        return Ok((None, meanwhile(None, &mut || {})?));
    }
    let stream = job.stream().clone();
    // The mapped sources follow the staged ones in `offsets` and `sizes`, the direct ones
    // follow those.
    let (n_staged, n_mapped) = (src.staged.len(), src.mapped.len());
    // The batch's buffer, and the direct copies into it. Where the staged region is one
    // window and nothing else (no kernel, no direct copies) needs the buffer, it is made
    // once that window's fill has started, so that the driver allocates while the copy
    // threads fill; otherwise first, so that the direct copies and the kernel overlap the
    // fills and no window's copy waits for the allocation.
    let buffer = std::cell::OnceCell::new();
    let allocate = |call: &mut Call, job: &mut InFlight| -> Result<&Arc<DeviceAlloc>> {
        if let Some(alloc) = buffer.get() {
            return Ok(alloc);
        }
        let blocks = &call.rt.device_blocks;
        let wait = call.rt.settings().slot_wait;
        let alloc =
            DeviceAlloc::for_outputs(call.ctx, l.end, &stream, consumer.clone(), blocks, wait)?;
        // Marked as being written until the copies are proven done, before any view of
        // it exists: the outputs (rebuilt, and handed to `while_copying`, while the copies
        // run) refuse uses not ordered after the copies until then.
        job.hold_device_output(&alloc);
        super::trace::mark("allocated");
        // Kept before the direct copies are queued: a failure there fails the call, and
        // nothing allocates twice.
        let alloc = buffer.get_or_init(|| alloc);
        queue_direct(call, &stream, &src.direct, n_staged + n_mapped, l, alloc)?;
        Ok(alloc)
    };
    let window = plan::window_size(l.staged_end, call.rt.arena.slot_bytes());
    let one_window = plan::windows(l.staged_end, window).nth(1).is_none();
    if l.staged_end == 0 || n_mapped > 0 || !src.direct.is_empty() || !one_window {
        allocate(call, job)?;
    }
    // With the kernel's descriptors in the first slot, the windows start at the second,
    // so that the first fill does not wait for the kernel (unless there is one slot only).
    let mut first_window_slot = 0;
    if n_mapped > 0 {
        let at = &l.offsets[n_staged..n_staged + n_mapped];
        super::lease_slots(call, job, 1)?;
        let alloc = allocate(call, job)?;
        // SAFETY: `alloc` was allocated on this stream and `job` holds it until the stream
        // is proven idle; the sources are borrowed from the caller's batch for this whole
        // call, and cloned into the retained registry (or, for a non-blocking call, into
        // its owners) until the kernel is proven done.
        unsafe { memory::h2d_gather_async(call.ctx, job, call.device, &src.mapped, at, alloc) }?;
        call.stats.copies += 1;
        call.stats.mapped_bytes += l.sizes[n_staged..n_staged + n_mapped].iter().sum::<usize>();
        first_window_slot = 1;
        super::trace::mark("gather queued");
    }
    if l.staged_end == 0 {
        let alloc = allocate(call, job)?.clone();
        let made = meanwhile(Some(&alloc), &mut || {})?;
        return Ok((Some(alloc), made));
    }
    let drain = |call: &mut Call, job: &mut InFlight, k: usize, w: plan::Window| {
        let alloc = allocate(call, job)?;
        queue_window(call, job, k, w, alloc)
    };
    // `started` makes the buffer before `meanwhile` runs (or fails the call).
    let made_buffer = || {
        buffer.get().ok_or_else(|| Error::Internal {
            op: "transfer_tensor_h2d",
            reason: "the batch's device buffer was not allocated".into(),
        })
    };
    let made = run_windows(
        call,
        job,
        &src.staged,
        l,
        first_window_slot,
        |call, job| allocate(call, job).map(|_| ()),
        |tick| meanwhile(Some(made_buffer()?), tick),
        drain,
    )?;
    Ok((Some(made_buffer()?.clone()), made))
}

/// Queues the direct copies of the page-locked sources `direct`, which are at `first` and
/// after in the layout: one batched copy where the driver has it, else one each.
fn queue_direct(
    call: &mut Call,
    stream: &Stream,
    direct: &[&PinnedBuf],
    first: usize,
    l: &Layout,
    alloc: &Arc<DeviceAlloc>,
) -> Result<()> {
    let stats = &mut call.stats;
    let direct: Vec<(&PinnedBuf, usize)> = direct
        .iter()
        .zip(first..)
        .filter(|&(_, k)| l.sizes[k] > 0)
        .map(|(&buf, k)| {
            stats.direct_bytes += l.sizes[k];
            (buf, l.offsets[k])
        })
        .collect();
    if direct.len() >= 2 && memory::batch_copy_available() && !stream.is_legacy() {
        let (bufs, at): (Vec<&PinnedBuf>, Vec<usize>) = direct.into_iter().unzip();
        // SAFETY: as for the single copies below, for every source; the stream is
        // pinlane's own H2D stream, never the legacy one.
        unsafe { memory::h2d_batch_async(call.ctx, &bufs, alloc, &at, call.device, stream) }?;
        call.stats.copies += 1;
    } else {
        for (buf, at) in direct {
            // SAFETY: `alloc` was allocated on this stream and the caller's `job` holds it
            // until the stream is proven idle; the source is borrowed from the caller's
            // batch for this whole call, and cloned into the retained registry (or, for a
            // non-blocking call, into its owners) until the copy is proven done; `transfer`
            // found it readable (`check_readable`) before routing.
            unsafe { buf.h2d_async(call.ctx, alloc, at, stream) }?;
            call.stats.copies += 1;
        }
    }
    Ok(())
}

/// The staged region (`l.staged_end` bytes: the `staged` sources at the layout's offsets)
/// through the staging slots, window by window ([`Pump`]), the first window in slot
/// `first_slot`; `drain` queues the device's reads of a filled slot (the window's copy to
/// its place); calls `started`, then `meanwhile`, once every window's fill has started,
/// and returns what `meanwhile` made. `meanwhile`'s tick queues the windows filled by
/// then, in order, without waiting: call it every microsecond or so, so that no filled
/// window waits long.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_windows<T, M>(
    call: &mut Call,
    job: &mut InFlight,
    staged: &[&[u8]],
    l: &Layout,
    first_slot: usize,
    started: impl FnOnce(&mut Call, &mut InFlight) -> Result<()>,
    meanwhile: impl FnOnce(&mut dyn FnMut()) -> Result<M>,
    mut drain: impl FnMut(&mut Call, &mut InFlight, usize, plan::Window) -> Result<T>,
) -> Result<M> {
    let rt = call.rt;
    let window = plan::window_size(l.staged_end, rt.arena.slot_bytes());
    let windows: Vec<plan::Window> = plan::windows(l.staged_end, window).collect();
    let nslots = super::lease_slots(call, job, windows.len() + first_slot)?;
    super::trace::mark("leased");
    // Streaming stores fill small batches faster, ordinary ones large batches
    // (measured: docs/performance.md).
    let stores = rt.fill_stores(if l.staged_end <= SMALL_BATCH {
        Stores::Streaming
    } else {
        Stores::Cached
    });
    call.stats.staged_bytes += l.sizes[..staged.len()].iter().sum::<usize>();
    // The sources at their places, once for all windows: each window's fill job finds its
    // pieces' sources in it, on the copy threads (a list of 1000 small tensors' pieces
    // made here cost the calling thread several microseconds before the fill began).
    let packed = Arc::new(memory::Packed::new(staged, &l.offsets[..staged.len()]));
    let mut pump = Pump {
        windows: &windows,
        first_slot,
        nslots,
        queued: 0,
        started: 0,
        patience: super::patience::Patience::new(rt.settings().slot_wait),
    };
    let fill = |job: &mut InFlight, k: usize, w: plan::Window| {
        // SAFETY: the sources borrow the caller's batch, alive for this whole call; the
        // lease settles its fill before the call ends (InFlight::finish/abort settle
        // every lease, and so does dropping one).
        unsafe { job.leases[k].fill_window_start(&packed, w.start, w.len, &rt.copy, stores) }
    };
    let mut queue =
        |job: &mut InFlight, k: usize, w: plan::Window| drain(call, job, k, w).map(|_| ());
    while pump.started < windows.len() {
        pump.turn(job, &fill, &mut queue)?;
    }
    // Every fill started: `started`, then `meanwhile`, run while the copy threads fill, and
    // `meanwhile`'s ticks queue each window's copy as its fill ends (an error there is
    // kept for after it).
    started(call, job)?;
    let mut queue =
        |job: &mut InFlight, k: usize, w: plan::Window| drain(call, job, k, w).map(|_| ());
    let mut failed = None;
    let made = meanwhile(&mut || {
        if failed.is_none() {
            if let Err(e) = pump.advance(job, &fill, &mut queue) {
                failed = Some(e);
            }
        }
    });
    if let Some(e) = failed {
        return Err(e);
    }
    let made = made?;
    while pump.queued < windows.len() {
        pump.turn(job, &fill, &mut queue)?;
    }
    Ok(made)
}

/// The staging windows of one call in flight. Window `w` uses slot
/// `(w + first_slot) % nslots`; windows before `queued` have their copy queued, those from
/// `queued` to `started` are filling. Turns without progress back off and, after
/// [`Config::slot_wait`](crate::config::Config::slot_wait) of them, fail (a hung device).
struct Pump<'a> {
    windows: &'a [plan::Window],
    first_slot: usize,
    nslots: usize,
    queued: usize,
    started: usize,
    patience: super::patience::Patience,
}

impl Pump<'_> {
    fn slot(&self, w: usize) -> usize {
        (w + self.first_slot) % self.nslots
    }

    /// Queues the copy of every filled window, in order, so the copy engine gets each
    /// window as soon as it is ready; then starts the fill of every window whose slot is
    /// free (its previous window's copy queued and finished, asked without blocking).
    /// Never waits; says whether it did anything.
    fn advance(
        &mut self,
        job: &mut InFlight,
        fill: &impl Fn(&mut InFlight, usize, plan::Window) -> Result<()>,
        queue: &mut impl FnMut(&mut InFlight, usize, plan::Window) -> Result<()>,
    ) -> Result<bool> {
        let mut progress = false;
        while self.queued < self.started && job.leases[self.slot(self.queued)].fill_done() {
            queue(job, self.slot(self.queued), self.windows[self.queued])?;
            self.queued += 1;
            progress = true;
        }
        while self.started < self.windows.len()
            && self.started - self.queued < self.nslots
            && job.leases[self.slot(self.started)].idle_now()?
        {
            fill(job, self.slot(self.started), self.windows[self.started])?;
            super::trace::mark("fill started");
            self.started += 1;
            progress = true;
        }
        Ok(progress)
    }

    /// One turn: [`Pump::advance`]. With nothing to do, this thread copies pieces of the
    /// oldest fill; with no fill left either (every slot busy on the device), it pauses
    /// ([`Patience`](super::patience::Patience)).
    ///
    /// # Errors
    /// A failed fill, copy or event query; [`Error::StagingExhausted`](crate::error::Error::StagingExhausted)
    /// once the device has kept every slot busy for `slot_wait`.
    fn turn(
        &mut self,
        job: &mut InFlight,
        fill: &impl Fn(&mut InFlight, usize, plan::Window) -> Result<()>,
        queue: &mut impl FnMut(&mut InFlight, usize, plan::Window) -> Result<()>,
    ) -> Result<()> {
        if self.advance(job, fill, queue)? {
            self.patience.progress();
            return Ok(());
        }
        if self.queued < self.started {
            // Waiting for host copies (ours and the copy threads'), which always end:
            // help, and do not count it against the device.
            job.leases[self.slot(self.queued)].help_fill();
            self.patience.progress();
            std::hint::spin_loop();
            return Ok(());
        }
        // Waiting for the device to finish a slot's copy.
        self.patience
            .pause()
            .map_err(|waited| crate::error::Error::StagingExhausted {
                waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                retained_bytes: crate::memory::retained::retained_bytes(),
            })
    }
}

/// Queues the copy of a filled slot `k` (waiting for its fill first) to window `w` of
/// `alloc`.
fn queue_window(
    call: &mut Call,
    job: &mut InFlight,
    k: usize,
    w: plan::Window,
    alloc: &DeviceAlloc,
) -> Result<()> {
    let stream = job.stream().clone();
    // SAFETY: `alloc` was allocated on this stream and `job` holds it until the stream is
    // proven idle.
    unsafe { job.leases[k].h2d_window(call.ctx, w.len, alloc, w.start, &stream) }?;
    super::trace::mark("window queued");
    call.stats.copies += 1;
    call.stats.windows += 1;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_locked_routes() {
        let direct_min = 64 << 10;
        // The kernel may read it: under 4 MiB, whatever the direct threshold.
        assert_eq!(pinned_route(1024, true, direct_min), Route::Mapped);
        assert_eq!(pinned_route((4 << 20) - 1, true, direct_min), Route::Mapped);
        // Too large for the kernel, or not readable by it: staged or direct by size.
        assert_eq!(pinned_route(4 << 20, true, direct_min), Route::Direct);
        assert_eq!(pinned_route(1024, false, direct_min), Route::Staged);
        assert_eq!(
            pinned_route(direct_min - 1, false, direct_min),
            Route::Staged
        );
        assert_eq!(pinned_route(direct_min, false, direct_min), Route::Direct);
    }
}
