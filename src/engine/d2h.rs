//! Device to host: [`transfer_tensor_d2h`](crate::transfer_tensor_d2h).
//!
//! 1. Validate the options; pass the batch through if it has no tensor, or no CUDA.
//! 2. The copy stream (the thread's, or the caller's) waits for an event recorded on the
//!    caller's current stream, and for the producer event if one was given.
//! 3. The device tensors are laid out back to back (256-byte aligned) in one output
//!    region for the batch; each output tensor is a view into it. When there are several
//!    small tensors (up to 1 MiB each), they come first in the layout and a kernel gathers
//!    them into one device buffer with that same layout, which then moves as one piece.
//!    * Page-locked outputs ([`HostOutput::Pinned`], the default): the region is a block
//!      of the bounded [`PinnedOutputPool`]; one copy per tensor goes straight into it.
//!    * Pageable outputs ([`HostOutput::Pageable`], or when the pool's cap leaves no room):
//!      the region is recycled pageable memory ([`crate::memory::HostPool`]). It is cut
//!      into windows of one staging slot; each window's tensor pieces are copied into a
//!      page-locked slot, and while the next window's copies run, the previous slot is
//!      copied into the region by the copy threads.
//! 4. Synchronise the copy stream (or, for the non-blocking call into page-locked
//!    outputs, hand the call's owners to the completion thread), rebuild the batch.

use super::completion::{self, Pending};
use super::{plan, record_stats, thread_state, Mode, TransferStats};
use crate::batch::{self, Batch};
use crate::device::DeviceSpec;
use crate::driver::{self, ContextGuard};
use crate::error::{Error, Result};
use crate::location::Location;
use crate::memory::{
    self, DeviceView, HostBuf, HostRegion, InFlight, PinnedBlock, PinnedBuf, SlotLease,
    DEVICE_ALIGN,
};
use crate::tensor::{Storage, Tensor};
use crate::{D2hOptions, HostOutput, SmallD2h};

pub(crate) fn transfer<B: Batch>(
    batch: &B,
    opts: &D2hOptions,
    mode: Mode,
) -> Result<(B, Option<Pending>)> {
    // Checks that need no driver come first, so bad options are errors everywhere.
    let spec = opts.device.as_ref().unwrap_or(&DeviceSpec::LocalRank);
    spec.check()?;
    if opts.stream.is_some() && opts.device.is_none() {
        return Err(Error::StreamWithoutDevice);
    }
    let all = batch::tensors(batch);
    if all.is_empty() {
        return Ok((batch::replace_tensors(batch, Vec::new()), None));
    }
    let Some(info) = driver::available() else {
        return Ok((batch::replace_tensors(batch, Vec::new()), None));
    };
    let device = spec.resolve(info.device_count)?.ordinal();
    if let Some(s) = &opts.stream {
        if s.index() != device {
            return Err(Error::StreamDeviceMismatch {
                stream_device: s.index(),
                device,
            });
        }
    }
    if let Some(e) = &opts.producer_event {
        if e.index() != device {
            return Err(Error::EventDeviceMismatch {
                event_device: e.index(),
                device,
            });
        }
    }
    let picked: Vec<usize> = (0..all.len())
        .filter(|&i| all[i].location() == Location::Cuda(device))
        .collect();
    if picked.is_empty() {
        return Ok((batch::replace_tensors(batch, Vec::new()), None));
    }
    driver::deferred::surface(device)?;

    let stream = match &opts.stream {
        Some(s) => s.clone(),
        None => thread_state::d2h_stream(device)?,
    };
    let ctx = driver::bind(device)?;
    let current = thread_state::current_stream(crate::Device::cuda(device))?;
    if !current.same_as(&stream) {
        let ready = thread_state::ready_event(device)?;
        ready.record(&current)?;
        ready.wait_on(&stream)?;
    }
    if let Some(e) = &opts.producer_event {
        e.wait_on(&stream)?;
    }

    // Small tensors go first in the output layout, so that when they are gathered on the
    // device (one kernel) they form one contiguous range that one copy moves.
    let mut picked = picked;
    let small = |i: &usize| is_small(all[*i].nbytes());
    let n_small = picked.iter().filter(|i| small(i)).count();
    // Small tensors into page-locked outputs: one cuMemcpyBatchAsync instead of the
    // gather kernel with `SmallD2h::Batch` (an experiment; docs/performance.md). Never on
    // the legacy stream (a caller's `D2hOptions::stream` may be it), which the batched
    // copy does not take.
    let rt = crate::runtime::runtime();
    let batch_small = n_small >= GATHER_MIN_COUNT
        && !stream.is_legacy()
        && opts.output == HostOutput::Pinned
        && rt.settings().small_d2h == SmallD2h::Batch
        && memory::batch_copy_available();
    let gather_n = if !batch_small
        && n_small >= GATHER_MIN_COUNT
        && rt.settings().small_d2h == SmallD2h::Gather
        && memory::gather_available(device)
    {
        // Stable: visit order is kept within each group (all-small batches are in order
        // already).
        if !picked.is_sorted_by_key(|i| !small(i)) {
            picked.sort_by_key(|i| !small(i));
        }
        // The descriptors go through one staging slot: gather as many as fit (32 bytes
        // each); any further small tensors are copied one by one.
        n_small.min(rt.arena.slot_bytes() / GATHER_DESC_BYTES)
    } else {
        0
    };
    let mut views: Vec<&DeviceView> = Vec::with_capacity(picked.len());
    let mut sizes: Vec<usize> = Vec::with_capacity(picked.len());
    for &i in &picked {
        if let Storage::Device(v) = all[i].storage() {
            views.push(v);
            sizes.push(v.nbytes());
        } // else: not picked (every picked tensor is on the device)
    }
    let (offsets, end) = plan::pack(sizes.iter().copied(), DEVICE_ALIGN)?;
    let block = match opts.output {
        HostOutput::Pinned if end > 0 => rt.outputs.take(end, device)?,
        HostOutput::Pinned => Some((PinnedBlock::empty(), 0)),
        HostOutput::Pageable => None,
    };

    super::trace::mark("planned");
    let mut job = InFlight::new(stream, crate::runtime::runtime().settings().drop_sync_wait);
    let mut stats = TransferStats {
        tensors: picked.len(),
        bytes: sizes.iter().sum(),
        ..TransferStats::default()
    };
    let keep_sources = || {
        picked
            .iter()
            .map(|&i| all[i].clone())
            .collect::<Vec<Tensor>>()
    };
    let layout = Layout {
        views: &views,
        offsets: &offsets,
        sizes: &sizes,
        gather_n,
        end,
    };
    // Pageable outputs are finished by host copies after the device copies, so that path
    // completes inside the call in both modes.
    let mut pending = None;
    let rebuilt = match block {
        Some((block, base)) => {
            job.hold(&block, end);
            let run = if batch_small {
                submit_batch(
                    &ctx, device, &mut job, &block, base, &views, &offsets, &mut stats,
                )
            } else {
                submit(
                    &ctx,
                    device,
                    &mut job,
                    &layout,
                    Dest::Block(&block, base),
                    &mut stats,
                )
            };
            if let Err(e) = run {
                return Err(job.abort(e, keep_sources));
            }
            // The output views are made while the copies run; nobody reads them before
            // the copies are proven done (on failure they are dropped unread, and `job`
            // keeps the block until the stream has let go of it).
            let views = PinnedBuf::views(
                &block,
                base,
                offsets.iter().copied().zip(sizes.iter().copied()),
            );
            let views = match views {
                Ok(v) => v,
                Err(e) => return Err(job.abort(e, keep_sources)),
            };
            let storages = views.into_iter().map(Storage::Pinned);
            let rebuilt = match rebuild(batch, &all, &picked, &sizes, storages) {
                Ok(b) => b,
                Err(e) => return Err(job.abort(e, keep_sources)),
            };
            super::trace::mark("rebuilt");
            pending = match mode {
                Mode::Blocking => {
                    job.finish(keep_sources)?;
                    None
                }
                Mode::Async => Some(completion::detach(job, device, keep_sources)?),
            };
            super::trace::mark("synced");
            rebuilt
        }
        None => {
            let mut region = HostRegion::take(&rt.host_pool, end);
            if let Err(e) = submit(
                &ctx,
                device,
                &mut job,
                &layout,
                Dest::Region(&mut region),
                &mut stats,
            ) {
                return Err(job.abort(e, keep_sources));
            }
            job.finish(keep_sources)?;
            super::trace::mark("synced");
            let frozen = region.freeze();
            let views =
                HostBuf::views(&frozen, offsets.iter().copied().zip(sizes.iter().copied()))?;
            let rebuilt = rebuild(
                batch,
                &all,
                &picked,
                &sizes,
                views.into_iter().map(Storage::Host),
            )?;
            super::trace::mark("rebuilt");
            rebuilt
        }
    };
    record_stats(stats);
    Ok((rebuilt, pending))
}

/// `batch` with the tensors at `picked` (visit indices into `all`) replaced by host
/// tensors over `storages` (of `sizes` bytes), in that order.
fn rebuild<B: Batch>(
    batch: &B,
    all: &[&Tensor],
    picked: &[usize],
    sizes: &[usize],
    storages: impl Iterator<Item = Storage>,
) -> Result<B> {
    let moved = picked
        .iter()
        .zip(storages)
        .zip(sizes)
        .map(|((&i, storage), &n)| {
            let t = all[i];
            Tensor::from_parts(t.dtype(), t.shape().clone(), n, storage)
        });
    super::rebuild_with(batch, all, picked, moved)
}

/// Tensors up to this size are gathered on the device when there are enough of them.
const GATHER_MAX_BYTES: usize = 1 << 20;

/// Whether a tensor of `nbytes` counts as small (gathered, or batched).
fn is_small(nbytes: usize) -> bool {
    (1..=GATHER_MAX_BYTES).contains(&nbytes)
}
/// Bytes of one gather descriptor (`GatherPiece`).
const GATHER_DESC_BYTES: usize = std::mem::size_of::<driver::GatherPiece>();
/// Fewest small tensors worth a kernel launch and a descriptor upload.
const GATHER_MIN_COUNT: usize = 4;

/// Page-locked outputs with `SmallD2h::Batch`: the small tensors in one batched copy,
/// the rest one copy each.
#[allow(clippy::too_many_arguments)]
fn submit_batch(
    ctx: &ContextGuard,
    device: usize,
    job: &mut InFlight,
    block: &PinnedBlock,
    base: usize,
    views: &[&DeviceView],
    offsets: &[usize],
    stats: &mut TransferStats,
) -> Result<()> {
    let stream = job.stream().clone();
    let (small, rest): (Vec<usize>, Vec<usize>) =
        (0..views.len()).partition(|&k| is_small(views[k].nbytes()));
    let sv: Vec<&DeviceView> = small.iter().map(|&k| views[k]).collect();
    let so: Vec<usize> = small.iter().map(|&k| base + offsets[k]).collect();
    // SAFETY: as in submit_direct: the block is new to this call and held by `job`; the
    // views are borrowed from the caller's batch; the copy stream waits for the current
    // stream and the producer event (and is not the legacy stream: the caller checked).
    unsafe { block.d2h_batch_async(ctx, &sv, &so, device, &stream) }?;
    stats.copies += 1;
    stats.direct_bytes += sv.iter().map(|v| v.nbytes()).sum::<usize>();
    let rv: Vec<&DeviceView> = rest.iter().map(|&k| views[k]).collect();
    let ro: Vec<usize> = rest.iter().map(|&k| offsets[k]).collect();
    submit_direct(ctx, job, block, base, &rv, &ro, stats)
}

/// The batch's output layout: tensors (in output order), their offsets and sizes, how
/// many leading ones are gathered, and the end of the last.
struct Layout<'a> {
    views: &'a [&'a DeviceView],
    offsets: &'a [usize],
    sizes: &'a [usize],
    gather_n: usize,
    end: usize,
}

/// Where the bytes go.
enum Dest<'a> {
    /// A page-locked output block and where the batch's range starts in it: copies go
    /// straight into it.
    Block(&'a PinnedBlock, usize),
    /// A pageable output region: copies go through staging slots.
    Region(&'a mut HostRegion),
}

/// Queues every copy of the batch: the gather of the leading small tensors (if any) into
/// one device range, then that range and the remaining tensors to `dest`.
fn submit(
    ctx: &ContextGuard,
    device: usize,
    job: &mut InFlight,
    l: &Layout,
    dest: Dest,
    stats: &mut TransferStats,
) -> Result<()> {
    let gathered;
    let mut items: Vec<&DeviceView> = Vec::with_capacity(l.views.len() - l.gather_n + 1);
    let mut offsets = Vec::with_capacity(items.capacity());
    let mut sizes = Vec::with_capacity(items.capacity());
    let mut first_each = l.gather_n;
    if l.gather_n > 0 {
        let small_end = l.offsets[l.gather_n - 1] + l.sizes[l.gather_n - 1];
        super::lease_slots(ctx, job, 1)?;
        // SAFETY: the views are borrowed from the caller's batch for this whole call (and
        // cloned into the retained registry if it ends with copies unproven); the copy
        // stream already waits for the current stream and the producer event.
        let g = unsafe {
            memory::gather_async(
                ctx,
                job,
                device,
                &l.views[..l.gather_n],
                &l.offsets[..l.gather_n],
                small_end,
            )
        };
        match g {
            Ok((g, submitted)) => {
                stats.copies += submitted; // the kernel (and the descriptors' upload)
                super::trace::mark("gather queued");
                gathered = DeviceView::new(&g, 0, small_end)?;
                items.push(&gathered);
                offsets.push(0);
                sizes.push(small_end);
            }
            // The gather needs a device buffer; the device is full. Copying the small
            // tensors one by one needs none: slower, but the call succeeds. What the
            // failed gather queued (if anything) runs before, in stream order, and writes
            // only its own buffers.
            Err(e) if e.is_out_of_memory() => first_each = 0,
            Err(e) => return Err(e),
        }
    }
    items.extend_from_slice(&l.views[first_each..]);
    offsets.extend_from_slice(&l.offsets[first_each..]);
    sizes.extend_from_slice(&l.sizes[first_each..]);
    match dest {
        Dest::Block(block, base) => submit_direct(ctx, job, block, base, &items, &offsets, stats),
        Dest::Region(region) => {
            submit_staged(ctx, job, &items, &offsets, &sizes, l.end, region, stats)
        }
    }
}

/// Page-locked outputs: one copy per item, straight into the output block.
fn submit_direct(
    ctx: &ContextGuard,
    job: &mut InFlight,
    block: &PinnedBlock,
    base: usize,
    views: &[&DeviceView],
    offsets: &[usize],
    stats: &mut TransferStats,
) -> Result<()> {
    let stream = job.stream().clone();
    for (k, v) in views.iter().enumerate() {
        if v.nbytes() == 0 {
            continue;
        }
        // SAFETY: the block is new to this call (its views, made while the copies run,
        // leave the call only once the copies are proven complete) and `job` holds it;
        // each view is borrowed from the caller's batch for the whole call (cloned into
        // the retained registry if the call ends with copies unproven), or is the
        // gathered buffer that `job` holds; the copy stream waits for the current stream
        // and the producer event above.
        unsafe { block.d2h_async(ctx, base + offsets[k], v, &stream) }?;
        stats.copies += 1;
        stats.direct_bytes += v.nbytes();
    }
    Ok(())
}

/// Pageable outputs: window by window through staging slots; each slot is drained into
/// the output region (in parallel) once its copies have finished, while the next
/// window's copies run.
#[allow(clippy::too_many_arguments)]
fn submit_staged(
    ctx: &ContextGuard,
    job: &mut InFlight,
    views: &[&DeviceView],
    offsets: &[usize],
    sizes: &[usize],
    end: usize,
    region: &mut HostRegion,
    stats: &mut TransferStats,
) -> Result<()> {
    if end == 0 {
        return Ok(());
    }
    let stream = job.stream().clone();
    let slot = plan::window_size(end, crate::runtime::runtime().arena.slot_bytes());
    let windows: Vec<plan::Window> = plan::windows(end, slot).collect();
    let n_windows = windows.len();
    let nslots = super::lease_slots(ctx, job, n_windows)?;
    let mut pending: Vec<Option<plan::Window>> = vec![None; nslots];
    for (w_idx, &w) in windows.iter().enumerate() {
        let k = w_idx % nslots;
        if let Some(prev) = pending[k].take() {
            drain(&mut job.leases[k], prev, offsets, sizes, region)?;
        }
        // The stats are counted as the parts are queued (one pass over them).
        let (mut copies, mut bytes) = (0, 0);
        let parts = w.parts(offsets, sizes).map(|p| {
            copies += 1;
            bytes += p.len;
            (p.window_off, views[p.item], p.item_off, p.len)
        });
        // SAFETY: every view is borrowed from the caller's batch for this whole call (and
        // cloned into the retained registry if the call ends with copies unproven); the
        // copy stream waits for the current stream and the producer event above, which
        // order the views' producing work before these copies.
        unsafe { job.leases[k].d2h_window(ctx, parts, &stream) }?;
        stats.copies += copies;
        stats.staged_bytes += bytes;
        stats.windows += 1;
        pending[k] = Some(w);
    }
    // Drain what is left, oldest first (the slot after the last one used).
    for j in 0..nslots {
        let k = (n_windows + j) % nslots;
        if let Some(prev) = pending[k].take() {
            drain(&mut job.leases[k], prev, offsets, sizes, region)?;
        }
    }
    Ok(())
}

/// Copies a finished window out of its slot into the output region.
fn drain(
    lease: &mut SlotLease,
    w: plan::Window,
    offsets: &[usize],
    sizes: &[usize],
    region: &mut HostRegion,
) -> Result<()> {
    let pieces: Vec<(usize, usize, usize)> = w
        .parts(offsets, sizes)
        .map(|p| (p.window_off, offsets[p.item] + p.item_off, p.len))
        .collect();
    let rt = crate::runtime::runtime();
    lease.drain_into(region, &pieces, &rt.copy, rt.drain_stores())
}
