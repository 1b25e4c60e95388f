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
//!    * Pageable outputs ([`HostOutput::Pageable`], or when the pool has no block for the
//!      batch: its cap leaves no room, or the host can page-lock no more):
//!      the region is recycled pageable memory ([`crate::memory::HostPool`]). It is cut
//!      into windows of one staging slot; each window's tensor pieces are copied into a
//!      page-locked slot, and while the next window's copies run, the previous slot is
//!      copied into the region by the copy threads.
//! 4. Synchronise the copy stream (or, for the non-blocking call into page-locked
//!    outputs, hand the call's owners to the completion thread), rebuild the batch.

use super::completion::{self, Pending, Wake};
use super::{plan, record_stats, thread_state, Call, Mode, WhileCopying};
use super::{D2hOptions, HostOutput};
use crate::batch::{self, Batch};
use crate::config::SmallD2h;
use crate::device::DeviceSpec;
use crate::driver::{self, Stream};
use crate::error::{Error, Result};
use crate::location::Location;
use crate::memory::{
    self, AroundWait, DeviceView, HostBuf, HostRegion, InFlight, PinnedBlock, PinnedBuf,
    PinnedOutputPool, SlotLease, Taken, DEVICE_ALIGN,
};
use crate::tensor::{Storage, Tensor};
use std::sync::Arc;

/// The caller's code that a blocking call into page-locked outputs runs (the other paths
/// run neither: [`super::transfer_tensor_d2h_overlapping_around`] calls `while_copying` on
/// their finished batch).
pub(crate) struct Overlap<'h, B> {
    /// Called on the rebuilt batch once its copies are queued, before the call waits.
    pub(crate) while_copying: WhileCopying<'h, B>,
    /// Called with the part of the call that may block on the device, if it comes to
    /// one: the wait in the driver for the copies into page-locked outputs (no end flag,
    /// or none seen within its spin), a failed call's drain, or the whole copy through
    /// staging slots into pageable outputs. It runs that part, once.
    pub(crate) around_wait: Option<AroundWait<'h>>,
}

impl<B> Overlap<'_, B> {
    /// No caller's code: nothing while the copies run, the wait run as it is.
    pub(crate) fn none() -> Self {
        Overlap {
            while_copying: None,
            around_wait: None,
        }
    }
}

pub(crate) fn transfer<B: Batch>(
    batch: &B,
    opts: &D2hOptions,
    mode: Mode,
    overlap: Overlap<'_, B>,
) -> Result<(B, Option<Pending>)> {
    let all = batch::tensors(batch);
    let Some((device, picked, after)) = target(opts, &all)? else {
        return Ok((batch::replace_tensors(batch, Vec::new()), None));
    };
    let ctx = driver::bind(device)?;
    let stream = copy_stream(device, opts)?;
    after.order(&stream)?;
    super::trace::mark("ordered");
    let rt = crate::runtime::runtime();
    let (picked, small) = small_plan(&all, picked, device, &stream, opts, &rt);
    let mut views: Vec<&DeviceView> = Vec::with_capacity(picked.len());
    let mut sizes: Vec<usize> = Vec::with_capacity(picked.len());
    for &i in &picked {
        if let Storage::Device(v) = all[i].storage() {
            views.push(v);
            sizes.push(v.nbytes());
        } // else: not picked (every picked tensor is on the device)
    }
    let (offsets, end) = plan::pack(sizes.iter().copied(), DEVICE_ALIGN)?;
    // A blocking call into page-locked outputs learns that its copies ended from a word
    // after the outputs that the stream sets once they have (an end flag), spinning for
    // it up to `Config::spin` before it waits in the driver.
    let at = end.next_multiple_of(FLAG_ALIGN);
    let flag_at = (mode == Mode::Blocking
        && end > 0
        && opts.output == HostOutput::Pinned
        && PinnedOutputPool::room_after(end, at + FLAG_ALIGN - end)
        && end_flags(&rt, device))
    .then_some(at);
    let block = match opts.output {
        HostOutput::Pinned if end > 0 => {
            match rt
                .outputs
                .take(flag_at.map_or(end, |at| at + FLAG_ALIGN), device)?
            {
                Taken::Range(block, base) => Some((block, base)),
                // No block (the pool's cap, or the host out of page-locked memory):
                // pageable outputs, counted.
                Taken::AtCap | Taken::HostFull(_) => {
                    rt.outputs.fell_back();
                    None
                }
            }
        }
        HostOutput::Pinned => Some((PinnedBlock::empty(), 0)),
        HostOutput::Pageable => None,
    };

    super::trace::mark("planned");
    let mut call = Call::new(&ctx, device, &rt, picked.len(), sizes.iter().sum());
    let layout = Layout {
        views: &views,
        offsets: &offsets,
        sizes: &sizes,
        gather_n: small.gather_n,
        batched: small.batched,
        end,
    };
    let out = Outputs {
        all: &all,
        picked: &picked,
        layout: &layout,
    };
    // Without the caller's `around_wait`, the parts that may block run as they are.
    let mut plain = |part: &mut dyn FnMut()| part();
    let mut given = overlap.around_wait;
    let around: AroundWait<'_> = match &mut given {
        Some(a) => &mut **a,
        None => &mut plain,
    };
    // Pageable outputs are finished by host copies after the device copies, so that path
    // completes inside the call in both modes.
    let (rebuilt, pending) = match block {
        Some((block, base)) => {
            let at = (&block, base, flag_at);
            let hooks = (mode, overlap.while_copying, around);
            into_block(batch, &out, &mut call, InFlight::new(stream), at, hooks)?
        }
        // The copies through staging slots wait for the slots and the copies along the
        // way: all of it runs inside `around`, the rebuild (the caller's `Batch` code)
        // after it. The job is made there too: an `around` that unwinds before it runs
        // the part leaves no job to drop, whose drop would wait for the copy stream, and
        // so for the caller's stream, with nothing queued (session 86).
        None => {
            let region = memory::run_around(around, || {
                into_region(&out, &mut call, InFlight::new(stream))
            })?;
            (region_rebuilt(batch, &out, region)?, None)
        }
    };
    record_stats(call.stats);
    Ok((rebuilt, pending))
}

/// The tensors a call moves (indices into the batch's tensors in visit order), with what
/// [`small_plan`] needs to know of them, counted in the same pass (a batch's tensors are
/// usually cold in the CPU caches: each pass over a thousand cost microseconds).
struct Picked {
    picked: Vec<usize>,
    /// How many are small ([`is_small`]).
    n_small: usize,
    /// Whether the small ones all come before the others.
    small_first: bool,
}

/// The device the call copies from, the tensors it moves, and the events its copy stream
/// must wait for before it reads them, after the checks that come before any copy; `None`
/// when the batch passes through (no tensor on that device, or no CUDA).
fn target(
    opts: &D2hOptions,
    all: &[&Tensor],
) -> Result<Option<(usize, Picked, memory::UsesAfter)>> {
    // Checks that need no driver come first, so bad options are errors everywhere.
    let spec = opts.device.as_ref().unwrap_or(&DeviceSpec::LocalRank);
    spec.check()?;
    if opts.stream.is_some() && opts.device.is_none() {
        return Err(Error::StreamWithoutDevice);
    }
    if all.is_empty() {
        return Ok(None);
    }
    let Some(info) = driver::available() else {
        return Ok(None);
    };
    let device = spec.resolve(info.device_count)?.ordinal();
    if let Some(s) = &opts.stream {
        if s.index() != device {
            return Err(Error::StreamDeviceMismatch {
                stream_device: crate::device::Device::cuda(s.index()),
                device: crate::device::Device::cuda(device),
            });
        }
    }
    if let Some(e) = &opts.producer_event {
        if e.index() != device {
            return Err(Error::EventDeviceMismatch {
                event_device: crate::device::Device::cuda(e.index()),
                device: crate::device::Device::cuda(device),
            });
        }
    }
    let on = Location::Cuda(crate::device::Device::cuda(device));
    let mut p = Picked {
        picked: Vec::with_capacity(all.len()),
        n_small: 0,
        small_first: true,
    };
    for (i, t) in all.iter().enumerate() {
        if t.location() == on {
            if is_small(t.nbytes()) {
                p.small_first &= p.n_small == p.picked.len();
                p.n_small += 1;
            }
            p.picked.push(i);
        }
    }
    if p.picked.is_empty() {
        return Ok(None);
    }
    // Something to copy from the device: not in a child forked after CUDA was set up, and
    // refused before any lock a parent's thread held.
    driver::fork::check("transfer_tensor_d2h")?;
    // An H2D call's output whose copies may still run unordered is refused (in its
    // rebuild or `while_copying`); a non-blocking call's, once it returned, is read after
    // its copies (the copy stream waits for them).
    let after = memory::check_usable(
        p.picked.iter().map(|&i| all[i].storage()),
        "transfer_tensor_d2h",
    )?;
    driver::deferred::surface(device)?;
    Ok(Some((device, p, after)))
}

/// The stream the copies go on (the thread's, or the caller's), made to wait for the
/// caller's current stream and for the producer event if one was given; neither of the
/// caller's streams may be capturing a CUDA graph. The caller has the device's context
/// bound.
fn copy_stream(device: usize, opts: &D2hOptions) -> Result<Stream> {
    let stream = match &opts.stream {
        Some(s) => {
            s.refuse_capturing("transfer_tensor_d2h")?;
            s.clone()
        }
        None => thread_state::d2h_stream(device)?,
    };
    let current = thread_state::current_stream(crate::device::Device::cuda(device))?;
    if !current.same_as(&stream) {
        // Before the record: an event recorded on a capturing stream would pull the copy
        // stream into the caller's graph.
        current.refuse_capturing("transfer_tensor_d2h")?;
        let ready = thread_state::ready_event(device)?;
        ready.record(&current)?;
        ready.wait_on(&stream)?;
    }
    if let Some(e) = &opts.producer_event {
        e.wait_on(&stream)?;
    }
    Ok(stream)
}

/// How the small tensors move: in one batched copy, or the first `gather_n` (in output
/// order) gathered on the device by one kernel; the rest one copy each.
struct Small {
    batched: bool,
    gather_n: usize,
}

/// Chooses how the small tensors of `picked` move, and puts them first in the output
/// layout (so that, gathered on the device, they form one contiguous range that one copy
/// moves).
fn small_plan(
    all: &[&Tensor],
    picked: Picked,
    device: usize,
    stream: &Stream,
    opts: &D2hOptions,
    rt: &crate::runtime::Runtime,
) -> (Vec<usize>, Small) {
    let Picked {
        mut picked,
        n_small,
        small_first,
    } = picked;
    // Small tensors into page-locked outputs: one cuMemcpyBatchAsync instead of the
    // gather kernel with `SmallD2h::Batch` (an experiment; docs/performance.md). Never on
    // the legacy stream (a caller's `D2hOptions::stream` may be it), which the batched
    // copy does not take.
    let batched = n_small >= GATHER_MIN_COUNT
        && !stream.is_legacy()
        && opts.output == HostOutput::Pinned
        && rt.settings().small_d2h == SmallD2h::Batch
        && memory::batch_copy_available();
    let gather_n = if !batched
        && n_small >= GATHER_MIN_COUNT
        && rt.settings().small_d2h == SmallD2h::Gather
        && memory::gather_available(device)
    {
        // Stable: visit order is kept within each group (all-small batches are in order
        // already).
        if !small_first {
            picked.sort_by_key(|&i| !is_small(all[i].nbytes()));
        }
        // The descriptors go through one staging slot: gather as many as fit (32 bytes
        // each); any further small tensors are copied one by one.
        n_small.min(rt.arena.slot_bytes() / GATHER_DESC_BYTES)
    } else {
        0
    };
    (picked, Small { batched, gather_n })
}

/// The moved tensors: the batch's tensors in visit order, the indices of those moved (in
/// output order), and their layout.
struct Outputs<'a> {
    all: &'a [&'a Tensor],
    picked: &'a [usize],
    layout: &'a Layout<'a>,
}

impl Outputs<'_> {
    /// Clones of the source tensors, for whatever must keep them alive past the call.
    fn sources(&self) -> impl FnOnce() -> Vec<Tensor> + '_ {
        || self.picked.iter().map(|&i| self.all[i].clone()).collect()
    }
}

/// Page-locked outputs: every copy straight into `block` from `base`, the batch rebuilt
/// around views of it, then the copies waited for (or handed to the completion thread).
/// With `flag_at`, the range taken goes on past the outputs to an end flag there.
fn into_block<B: Batch>(
    batch: &B,
    out: &Outputs,
    call: &mut Call,
    mut job: InFlight,
    (block, base, flag_at): (&Arc<PinnedBlock>, usize, Option<usize>),
    (mode, while_copying, around): (Mode, WhileCopying<'_, B>, AroundWait<'_>),
) -> Result<(B, Option<Pending>)> {
    let l = out.layout;
    // The gather's staging slot first, before the output is held or anything queued: a
    // call that finds none has queued nothing and returns without waiting for the copy
    // stream, which waits for the caller's stream (session 79: it drained it, waiting
    // for all the caller's earlier work there).
    if !l.batched && l.gather_n > 0 {
        if let Err(e) = super::lease_slots(call, &mut job, 1) {
            return Err(job.abort_unqueued(e, out.sources()));
        }
    }
    // Marked as being written before any view of it exists: the rebuild below is the
    // caller's code, and reads of the views are refused until the copies are proven done.
    job.hold_output(block, base, flag_at.map_or(l.end, |at| at + FLAG_ALIGN));
    let run = if l.batched {
        submit_batch(call, &mut job, block, base, l.views, l.offsets)
    } else {
        submit(call, &mut job, l, Dest::Block(block, base))
    };
    if let Err(e) = run {
        return Err(job.abort_around(e, out.sources(), around));
    }
    super::trace::mark("copies queued");
    if let Some(at) = flag_at {
        // Queued now, after every copy, so the device's round trip for it overlaps the
        // rebuild.
        // SAFETY: after the last output (`at >= l.end`), inside the range taken for this
        // call and held above, which no view covers and nothing else uses; the pool's
        // blocks come from `cuMemHostAlloc`, and `end_flags` checked that the device maps
        // host memory.
        unsafe { job.end_flag(call.ctx, block, base + at, call.rt.settings().spin) };
    }
    // The output views are made while the copies run, as the batch is rebuilt around them
    // (one pass). Their range is marked (`hold_output`), so the caller's rebuild cannot
    // read them before the copies are proven done: its reads get `BytesInFlight` (on
    // failure the views are dropped unread, and `job` keeps the block until the stream
    // has let go of it).
    let ranges = l.offsets.iter().copied().zip(l.sizes.iter().copied());
    let views = match PinnedBuf::views(block, base, ranges) {
        Ok(v) => v,
        Err(e) => return Err(job.abort_around(e, out.sources(), around)),
    };
    // The caller's `Batch::rebuild` runs while the copies may (all queued by now).
    let rebuilt = job.guarded(out.sources(), true, |_| {
        rebuild(batch, out, views.map(Storage::Pinned))
    });
    let rebuilt = match rebuilt {
        Ok(b) => b,
        Err(e) => return Err(job.abort_around(e, out.sources(), around)),
    };
    super::trace::mark("rebuilt");
    let pending = match mode {
        Mode::Blocking => {
            // The caller's work on the outputs that needs no bytes overlaps the copies.
            if let Some(f) = while_copying {
                job = super::run_while_copying(f, &rebuilt, job, out.sources());
            }
            job.finish_around(out.sources(), around)?;
            None
        }
        Mode::Async => {
            // Copies into the sources queued after this returns wait for these copies.
            job.read_device(l.views);
            Some(completion::detach(
                job,
                call.device,
                out.sources(),
                Wake::Now,
                call.rt.settings().spin,
            )?)
        }
    };
    super::trace::mark("synced");
    Ok((rebuilt, pending))
}

/// Pageable outputs: the copies through staging slots into a recycled region, waited for
/// inside the call in both modes (the batch is then rebuilt around views of it, by
/// [`region_rebuilt`]). It runs no caller code: [`transfer`] runs it inside the caller's
/// `around_wait`.
fn into_region(out: &Outputs, call: &mut Call, mut job: InFlight) -> Result<HostRegion> {
    let l = out.layout;
    let mut region = HostRegion::take(&call.rt.host_pool, l.end);
    if let Err(e) = submit(call, &mut job, l, Dest::Region(&mut region)) {
        // With no slot leased (the first lease failed), nothing was queued: no drain.
        return Err(job.abort_unqueued(e, out.sources()));
    }
    job.finish(out.sources())?;
    super::trace::mark("synced");
    Ok(region)
}

/// `batch` rebuilt around views of `region`, whose copies [`into_region`] finished.
fn region_rebuilt<B: Batch>(batch: &B, out: &Outputs, region: HostRegion) -> Result<B> {
    let l = out.layout;
    let frozen = region.freeze();
    let ranges = l.offsets.iter().copied().zip(l.sizes.iter().copied());
    let views = HostBuf::views(&frozen, ranges)?;
    let rebuilt = rebuild(batch, out, views.map(Storage::Host))?;
    super::trace::mark("rebuilt");
    Ok(rebuilt)
}

/// `batch` with the moved tensors replaced by host tensors over `storages`, in output
/// order.
fn rebuild<B: Batch>(
    batch: &B,
    out: &Outputs,
    storages: impl Iterator<Item = Storage>,
) -> Result<B> {
    let moved = out
        .picked
        .iter()
        .zip(storages)
        .zip(out.layout.sizes)
        .map(|((&i, storage), &n)| {
            let t = out.all[i];
            Tensor::from_parts(t.dtype(), t.shape().clone(), n, storage)
        });
    super::rebuild_with(batch, out.all, out.picked, moved, &mut || {})
}

/// Bytes kept for an end flag after a blocking call's page-locked outputs (one 4-byte
/// word, aligned to 8).
const FLAG_ALIGN: usize = 8;

/// Whether a blocking call on `device` may learn that its copies ended from an end flag:
/// a word of page-locked memory its stream sets after them, spun on for up to
/// `Config::spin` before the call waits in the driver (`memory::InFlight::end_flag`).
/// Only D2H into page-locked outputs uses them (the word goes after the outputs in their
/// block): on H2D's stream they did not pay on the H200, where the next call's device
/// allocation took longer (docs/performance-log.md, session 44).
fn end_flags(rt: &crate::runtime::Runtime, device: usize) -> bool {
    !rt.settings().spin.is_zero() && driver::flag::available() && driver::host_memory_mapped(device)
}

/// Whether blocking D2H calls from `device` into page-locked outputs end on an end flag
/// now (see [`transfer_tensor_d2h_overlapping_around`](crate::transfer_tensor_d2h_overlapping_around)):
/// the driver has `cuStreamWriteValue32_v2` (CUDA 11.7 and later) and has not failed one,
/// the device maps page-locked memory, and [`Config::spin`](crate::Config::spin) is not
/// zero. Without them a call waits in the driver, which is as correct and a little slower.
/// Once the driver fails a write, it is false for the rest of the process.
///
/// It sets nothing up: before pinlane's first transfer on `device` (no runtime, no
/// context made) it is false, and it loads no driver.
///
/// ```
/// // Before any transfer: false, and nothing was started to find out.
/// assert!(!pinlane::observe::end_flags_available(pinlane::Device::cuda(0)));
/// ```
pub fn end_flags_available(device: crate::device::Device) -> bool {
    let d = device.ordinal();
    // The engine's own test, asked only once the device's context exists (`end_flags`
    // would make it otherwise) and with the runtime pinlane has (it would make one).
    driver::probed()
        && driver::context_made(d)
        && crate::runtime::current().is_some_and(|rt| end_flags(&rt, d))
}

/// Tensors up to this size are gathered on the device when there are enough of them.
const GATHER_MAX_BYTES: usize = 1 << 20;

/// Whether a tensor of `nbytes` counts as small (gathered, or batched).
fn is_small(nbytes: usize) -> bool {
    (1..=GATHER_MAX_BYTES).contains(&nbytes)
}
/// Bytes of one gather descriptor (`GatherPiece`).
const GATHER_DESC_BYTES: usize = std::mem::size_of::<driver::GatherPiece>();
/// Fewest small tensors worth a kernel launch and a descriptor upload. Fewer, into
/// page-locked outputs, take no staging slot, which `transfer_tensor_d2h_overlapping_around`'s
/// docs promise (the Python binding keeps the GIL through D2H calls of up to three tensors
/// on that promise).
const GATHER_MIN_COUNT: usize = 4;

/// Page-locked outputs with `SmallD2h::Batch`: the small tensors in one batched copy,
/// the rest one copy each.
fn submit_batch(
    call: &mut Call,
    job: &mut InFlight,
    block: &PinnedBlock,
    base: usize,
    views: &[&DeviceView],
    offsets: &[usize],
) -> Result<()> {
    let stream = job.stream().clone();
    let (small, rest): (Vec<usize>, Vec<usize>) =
        (0..views.len()).partition(|&k| is_small(views[k].nbytes()));
    let sv: Vec<&DeviceView> = small.iter().map(|&k| views[k]).collect();
    let so: Vec<usize> = small.iter().map(|&k| base + offsets[k]).collect();
    // SAFETY: as in submit_direct: the block is new to this call and held by `job`; the
    // views are borrowed from the caller's batch; the copy stream waits for the current
    // stream and the producer event (and is not the legacy stream: the caller checked).
    unsafe { block.d2h_batch_async(call.ctx, &sv, &so, call.device, &stream) }?;
    call.stats.copies += 1;
    call.stats.direct_bytes += sv.iter().map(|v| v.nbytes()).sum::<usize>();
    let rv: Vec<&DeviceView> = rest.iter().map(|&k| views[k]).collect();
    let ro: Vec<usize> = rest.iter().map(|&k| offsets[k]).collect();
    submit_direct(call, job, block, base, &rv, &ro)
}

/// The batch's output layout: tensors (in output order), their offsets and sizes, how
/// many leading ones are gathered (or whether the small ones go in one batched copy), and
/// the end of the last.
struct Layout<'a> {
    views: &'a [&'a DeviceView],
    offsets: &'a [usize],
    sizes: &'a [usize],
    gather_n: usize,
    batched: bool,
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
fn submit(call: &mut Call, job: &mut InFlight, l: &Layout, dest: Dest) -> Result<()> {
    let gathered;
    let mut items: Vec<&DeviceView> = Vec::with_capacity(l.views.len() - l.gather_n + 1);
    let mut offsets = Vec::with_capacity(items.capacity());
    let mut sizes = Vec::with_capacity(items.capacity());
    let mut first_each = l.gather_n;
    if l.gather_n > 0 {
        let small_end = l.offsets[l.gather_n - 1] + l.sizes[l.gather_n - 1];
        super::lease_slots(call, job, 1)?;
        // SAFETY: the views are borrowed from the caller's batch for this whole call (and
        // cloned into the retained registry if it ends with copies unproven); the copy
        // stream already waits for the current stream and the producer event.
        let g = unsafe {
            memory::gather_async(
                call.ctx,
                job,
                call.device,
                &l.views[..l.gather_n],
                &l.offsets[..l.gather_n],
                small_end,
            )
        };
        match g {
            Ok((g, submitted)) => {
                call.stats.copies += submitted; // the kernel (and the descriptors' upload)
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
        Dest::Block(block, base) => submit_direct(call, job, block, base, &items, &offsets),
        Dest::Region(region) => {
            let items = Layout {
                views: &items,
                offsets: &offsets,
                sizes: &sizes,
                gather_n: 0,
                batched: false,
                end: l.end,
            };
            submit_staged(call, job, &items, region)
        }
    }
}

/// Page-locked outputs: one copy per item, straight into the output block.
fn submit_direct(
    call: &mut Call,
    job: &mut InFlight,
    block: &PinnedBlock,
    base: usize,
    views: &[&DeviceView],
    offsets: &[usize],
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
        unsafe { block.d2h_async(call.ctx, base + offsets[k], v, &stream) }?;
        call.stats.copies += 1;
        call.stats.direct_bytes += v.nbytes();
    }
    Ok(())
}

/// Pageable outputs: window by window through staging slots; each slot is drained into
/// the output region (in parallel) once its copies have finished, while the next
/// window's copies run. `items` are the copies' sources (no gather left to do).
fn submit_staged(
    call: &mut Call,
    job: &mut InFlight,
    items: &Layout,
    region: &mut HostRegion,
) -> Result<()> {
    let (views, offsets, sizes, end) = (items.views, items.offsets, items.sizes, items.end);
    if end == 0 {
        return Ok(());
    }
    let stream = job.stream().clone();
    let slot = plan::window_size(end, call.rt.arena.slot_bytes());
    let windows: Vec<plan::Window> = plan::windows(end, slot).collect();
    let n_windows = windows.len();
    let nslots = super::lease_slots(call, job, n_windows)?;
    let mut pending: Vec<Option<plan::Window>> = vec![None; nslots];
    for (w_idx, &w) in windows.iter().enumerate() {
        let k = w_idx % nslots;
        if let Some(prev) = pending[k].take() {
            drain(call.rt, &mut job.leases[k], prev, offsets, sizes, region)?;
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
        unsafe { job.leases[k].d2h_window(call.ctx, parts, &stream) }?;
        call.stats.copies += copies;
        call.stats.staged_bytes += bytes;
        call.stats.windows += 1;
        pending[k] = Some(w);
    }
    // Drain what is left, oldest first (the slot after the last one used).
    for j in 0..nslots {
        let k = (n_windows + j) % nslots;
        if let Some(prev) = pending[k].take() {
            drain(call.rt, &mut job.leases[k], prev, offsets, sizes, region)?;
        }
    }
    Ok(())
}

/// Copies a finished window out of its slot into the output region.
fn drain(
    rt: &crate::runtime::Runtime,
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
    lease.drain_into(region, &pieces, &rt.copy, rt.drain_stores())
}
