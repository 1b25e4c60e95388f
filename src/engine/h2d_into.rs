//! Host to device into existing tensors: [`transfer_tensor_h2d_into`], the call and its
//! work.
//!
//! 1. Pair and check (`into.rs`): nothing is queued before every pair is known good and
//!    no two destinations overlap.
//! 2. Route each pair (`route`): page-locked sources the device maps at their host
//!    address (pinlane's own, or another owner's the driver says it maps) are read in
//!    place by the kernel, up to 4 MiB; other page-locked sources from the direct
//!    threshold on are copied straight from their memory
//!    ([`memory::scatter::h2d_direct`]); the rest are staged.
//! 3. When the staged bytes and the kernel's descriptors fit one staging slot (the
//!    serving step: a few small tensors), one slot is filled and one kernel launch
//!    scatters everything small ([`memory::scatter::h2d_scatter`]); when nothing is
//!    staged and the kernel's descriptors fit its launch's parameters (up to 127 pieces:
//!    an in-place step), no slot at all ([`memory::scatter::h2d_mapped`]). Otherwise (a batch
//!    larger than a slot, no kernel) the staged bytes go through the staging ring
//!    window by window as a transfer's do ([`super::h2d::run_windows`]), each window's
//!    pieces one copy each, batched into one submission where the driver can.
//! 4. Hand the call's owners (slots, clones of both sides) to the completion thread
//!    and return its [`Transfer`]: no synchronisation in the call.

use super::completion::{self, Wake};
use super::h2d::{self, Layout};
use super::into::{self, IntoOptions, Way};
use super::{plan, record_stats, thread_state, Call, Transfer};
use crate::batch::Batch;
use crate::config::SmallH2d;
use crate::driver::{self, GatherKernel, Stream};
use crate::error::{Error, Result};
use crate::memory::scatter::{self, Scatter, SlotPart};
use crate::memory::{self, DeviceView, InFlight, PinnedBuf, Stores};
use crate::tensor::{Storage, Tensor};

/// Copies every host tensor of `src` into the device tensor at the same place in `dst`,
/// overwriting its memory: buffers a server keeps (a captured CUDA graph's inputs,
/// slices of one static buffer, a KV-cache index) fed every step without a device
/// allocation.
///
/// * Pairs: `src` and `dst` must have the same structure ([`Batch::visit_paths`] gives
///   the same paths; they pair in visit order, or by path when they hold a
///   `HashMap`); each pair has the same dtype
///   and byte size (shapes may differ). Sources are host tensors (pageable or
///   page-locked); destinations are device tensors of one device: pinlane's own
///   outputs, [`Tensor::from_device_ptr`] memory, DLPack imports, views into a larger
///   buffer. Destinations must not overlap.
/// * Order: the copies are queued on [`IntoOptions::stream`], else the thread's
///   [`current_stream`](crate::current_stream) of the destinations' device: they run
///   after the work queued there before the call, and work queued there after it sees
///   the new bytes. The returned [`Transfer`] completes when they have run
///   ([`Transfer::wait`], [`Transfer::ready_event`] to order another stream); dropping
///   it is fine (pinlane keeps what the copies use until they finish).
/// * How: pageable sources, and small page-locked ones the device cannot read in place,
///   are copied into one page-locked staging slot and scattered to their destinations by
///   one kernel launch that reads the slot through the device's mapping. Page-locked
///   sources under 4 MiB that the device maps at their host address (pinlane's own, and
///   DLPack imports whose memory the driver maps, such as torch's `pin_memory()`) are
///   read in place by the same launch (which needs no staging slot when every source is
///   read in place and they make at most 127 pieces of 4, 8 or 16 KiB). Other page-locked sources from 64 KiB on (256 KiB
///   where the driver lacks `cuMemcpyBatchAsync`) are copied straight from their memory,
///   in one batched submission; so are the mapped ones from that size on when nothing
///   else needs the launch and they are fewer than four. A batch too large for one slot
///   goes through the staging ring, one copy per piece.
/// * When the call returns, the sources are no longer read except page-locked ones,
///   which pinlane keeps alive until the copies have run (clones); pageable sources may
///   change at once.
/// * Maps pair by key. A `BTreeMap` pairs by key order and a `HashMap` by key (two maps
///   holding the same keys list them in orders of their own), so both must hold the same
///   keys: a source map whose keys differ from its destination's is refused at the map
///   ([`Error::IntoMismatch`], by [`Batch::keys_differ`]), as are two keys of one
///   `HashMap` with the same hash. Pairing a batch that holds a `HashMap` builds and sorts
///   every tensor's path on each call (other batches compare path hashes, with no
///   allocation per tensor); a loop that copies the same pairs again and again pairs them
///   once with [`H2dPairs`](crate::H2dPairs).
///
/// The rules for the destinations' memory while the copies run, and on failure, are in
/// `docs/semantics.md` ("Copies into existing tensors").
///
/// ```no_run
/// use pinlane::{transfer_tensor_h2d, transfer_tensor_h2d_into, IntoOptions, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// // Static device buffers, allocated once.
/// let statics = transfer_tensor_h2d(&vec![
///     Tensor::from_vec(vec![0i64; 256], [256])?,
///     Tensor::from_vec(vec![0i32; 256], [256])?,
/// ])?;
/// for step in 0..3i64 {
///     let inputs = vec![
///         Tensor::from_vec(vec![step; 256], [256])?,
///         Tensor::from_vec(vec![step as i32; 256], [256])?,
///     ];
///     transfer_tensor_h2d_into(&inputs, &statics, &IntoOptions::default())?.wait()?;
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// Before anything is queued, with no destination written: [`Error::IntoMismatch`]
/// (structure, placement, dtype or size), [`Error::OverlappingDestinations`],
/// [`Error::StreamDeviceMismatch`], [`Error::BytesInFlight`] (a page-locked source, or
/// for [`transfer_tensor_d2h_into`](crate::transfer_tensor_d2h_into) a page-locked
/// destination, that a D2H call is still writing; a device tensor that an H2D call is,
/// inside that call), [`Error::Deferred`], [`Error::StreamCapturing`] (the copies'
/// stream is capturing a CUDA graph). While queueing,
/// the driver's error or [`Error::StagingExhausted`] is the call's (what was queued is
/// drained first), and so is [`Error::Worker`] when pinlane's completion thread cannot
/// start (the copies drained within
/// [`Config::drop_sync_wait`](crate::config::Config::drop_sync_wait), retained past it:
/// they may still write the destinations then); once queued, a failure of the copies
/// comes from [`Transfer::wait`], or, if the handle was dropped, from a later call on the device ([`Error::Deferred`]: the
/// next one of the thread that dropped it, if the failure was known by then, else the next
/// one on any thread). Destinations may then be partly written; the copy did not succeed.
pub fn transfer_tensor_h2d_into<B: Batch>(
    src: &B,
    dst: &B,
    opts: &IntoOptions,
) -> Result<Transfer<()>> {
    super::trace::start("h2d_into");
    let r = transfer(src, dst, opts);
    super::trace::end();
    r
}

pub(crate) fn transfer<B: Batch>(src: &B, dst: &B, opts: &IntoOptions) -> Result<Transfer<()>> {
    let checked = pair_and_check(src, dst)?;
    match checked.device {
        Some(device) if !checked.pairs.is_empty() => run(&checked.pairs, device, opts),
        _ => Ok(Transfer::ready(())),
    }
}

/// Pairs `src` with `dst`, checks every pair and that no two destinations overlap: all
/// that depends only on the two batches.
pub(super) fn pair_and_check<'a, B: Batch>(src: &'a B, dst: &'a B) -> Result<into::Pairs<'a>> {
    let checked = into::pair_up(src, dst, Way::H2d)?;
    super::trace::mark("paired");
    let ranges: Vec<(u64, usize)> = checked
        .pairs
        .iter()
        .map(|p| device_view(p.1).map(DeviceView::range))
        .collect::<Result<_>>()?;
    into::check_overlap(dst, &checked.pairs, &ranges)?;
    Ok(checked)
}

/// The call for pairs [`pair_and_check`] accepted, their destinations on `device`: the
/// checks of the moment (sources a D2H is writing, an earlier failure, the stream), then
/// the copies.
pub(super) fn run(
    pairs: &[(&Tensor, &Tensor)],
    device: usize,
    opts: &IntoOptions,
) -> Result<Transfer<()>> {
    // Not in a child forked after CUDA was set up: refused before any lock a parent's
    // thread held.
    driver::fork::check("transfer_tensor_h2d_into")?;
    // Sources a D2H call may still be writing, and destinations an H2D call's copies may
    // still be writing unordered (its outputs, in its rebuild or `while_copying`), are
    // refused; a non-blocking H2D call's outputs, once it returned, are written after its
    // copies.
    let after = memory::check_usable(
        pairs.iter().flat_map(|p| [p.0.storage(), p.1.storage()]),
        "transfer_tensor_h2d_into",
    )?;
    // Destinations a non-blocking D2H call's copies may still read are written after
    // them.
    let reads = memory::reads_before_write(pairs.iter().map(|p| p.1.storage()));
    driver::deferred::surface(device)?;
    let stream = stream_for(opts, device)?;
    after.order(&stream)?;
    reads.order(&stream)?;
    let views: Vec<&DeviceView> = pairs
        .iter()
        .map(|p| device_view(p.1))
        .collect::<Result<_>>()?;
    super::trace::mark("checked");

    let rt = crate::runtime::runtime();
    let kernel = (rt.settings().small_h2d == SmallH2d::Kernel
        && memory::h2d_gather_available(device))
    .then(|| driver::gather_kernel(device))
    .flatten();
    let ctx = driver::bind(device)?;
    let plan = route(&ctx, pairs, &views, kernel.is_some(), rt.arena.slot_bytes())?;
    // The copy threads will fill the slot: wake them now (as a transfer does).
    if plan.staged_bytes >= rt.copy.parallel_min() {
        rt.copy.prewake();
    }
    super::trace::mark("routed");
    let mut job = InFlight::new(stream.clone());
    let total = pairs.iter().map(|p| p.0.nbytes()).sum();
    let mut call = Call::new(&ctx, device, &rt, pairs.len(), total);
    // This thread's earlier calls on the stream that are done give back their slots once
    // this one's copies are queued (before it leases, if it finds no slot free): a
    // serving loop's device then starts on the step without waiting for the release
    // (about 1.5 us, most of it asking the driver whether the last step is done).
    call.reap = Some(stream.key());
    // The destinations stay alive until the copies have run (their memory must not be
    // freed under them), and so do the sources the device may still read.
    let keep = || {
        let dsts: Vec<Tensor> = pairs.iter().map(|p| p.1.clone()).collect();
        (dsts, super::device_read_sources(pairs.iter().map(|p| p.0)))
    };
    // The first staging slot before any copy is queued (the direct ones included): a
    // call that finds none has written nothing and has nothing on the stream to drain,
    // so it does not wait for the caller's earlier work there (session 79: the direct
    // copies went first, and a failed lease drained the caller's whole stream).
    let staged = Staged::of(&plan, kernel);
    if staged.needs_slot() {
        if let Err(e) = super::lease_slots(&call, &mut job, 1) {
            return Err(job.abort_unqueued(e, keep));
        }
    }
    if let Err(e) = submit(&mut call, &mut job, &plan, staged, &stream) {
        return Err(job.abort(e, keep));
    }
    super::trace::mark("submitted");
    completion::reap(stream.key());
    super::trace::mark("reaped");
    let pending = completion::detach(job, device, keep, Wake::Lazy, rt.settings().spin)?;
    super::trace::mark("detached");
    record_stats(call.stats);
    Ok(Transfer::pending((), pending))
}

/// The stream the copies go on: the caller's, or the thread's current one of `device`;
/// not one a CUDA graph capture is running on.
fn stream_for(opts: &IntoOptions, device: usize) -> Result<Stream> {
    let s = match &opts.stream {
        Some(s) => s.clone(),
        None => thread_state::current_stream(crate::device::Device::cuda(device))?,
    };
    if s.index() != device {
        return Err(Error::StreamDeviceMismatch {
            stream_device: s.device(),
            device: crate::device::Device::cuda(device),
        });
    }
    // The copies go on it: during a capture they would be recorded into the caller's
    // graph, and the completion's event would never pass.
    s.refuse_capturing("transfer_tensor_h2d_into")?;
    Ok(s)
}

/// A destination's device memory (the pairs were checked to be device tensors).
fn device_view(t: &Tensor) -> Result<&DeviceView> {
    match t.storage() {
        Storage::Device(v) => Ok(v),
        _ => Err(Error::Internal {
            op: "copy into",
            reason: "a checked destination is not on a device".into(),
        }),
    }
}

/// Every pair's route: straight from page-locked memory, read in place by the kernel, or
/// staged (sources and their destinations, at `offsets` in the staged region).
struct Plan<'a> {
    direct: Vec<(&'a PinnedBuf, &'a DeviceView)>,
    mapped: Vec<(&'a PinnedBuf, &'a DeviceView)>,
    staged: Vec<&'a [u8]>,
    staged_to: Vec<&'a DeviceView>,
    offsets: Vec<usize>,
    sizes: Vec<usize>,
    /// The staged sources' bytes, and the end of their region in the slot (padding
    /// included).
    staged_bytes: usize,
    staged_end: usize,
    /// Everything small goes in one slot and one launch.
    one_slot: bool,
}

/// Routes the pairs (see the module docs). `kernel`: the scatter kernel can run; `slot`:
/// the staging slots' size; `ctx`: the destinations' device's context, for asking the
/// driver whether it maps a page-locked source of another owner's.
///
/// A page-locked source the kernel can read in place (under 4 MiB, aligned, mapped for
/// the device) is read by it; from the direct threshold on, only when the launch happens
/// anyway (something small goes by the kernel too) or four or more such sources would
/// share it: then they take no copy submission of their own. The rest of the page-locked
/// sources from the threshold on are copied directly, the smaller ones staged.
///
/// # Errors
/// The staged sources' layout overflows (sizes no live tensors can have: their
/// destinations do not overlap), before anything is queued.
fn route<'a>(
    ctx: &driver::ContextGuard,
    pairs: &[(&'a Tensor, &'a Tensor)],
    views: &[&'a DeviceView],
    kernel: bool,
    slot: usize,
) -> Result<Plan<'a>> {
    let direct_min = if memory::batch_copy_available() {
        h2d::BATCHED_DIRECT_MIN_BYTES
    } else {
        h2d::DIRECT_MIN_BYTES
    };
    let mut p = Plan {
        direct: Vec::new(),
        mapped: Vec::new(),
        staged: Vec::with_capacity(pairs.len()),
        staged_to: Vec::with_capacity(pairs.len()),
        offsets: Vec::new(),
        sizes: Vec::new(),
        staged_bytes: 0,
        staged_end: 0,
        one_slot: false,
    };
    let mut large_mapped = Vec::new();
    for (&(s, _), &view) in pairs.iter().zip(views) {
        let n = s.nbytes();
        match s.storage() {
            Storage::Pinned(b) => {
                let in_place = kernel
                    && n < h2d::MAPPED_MAX_BYTES
                    && scatter::kernel_reads_well(b)
                    && scatter::kernel_writes_well(view)
                    && b.mapped_on(ctx);
                match (in_place, n >= direct_min) {
                    (true, false) => p.mapped.push((b, view)),
                    (true, true) => large_mapped.push((b, view)),
                    (false, true) => p.direct.push((b, view)),
                    (false, false) => {
                        p.staged.push(b.bytes_unchecked());
                        p.staged_to.push(view);
                    }
                }
            }
            Storage::Host(b) => {
                p.staged.push(b.bytes());
                p.staged_to.push(view);
            }
            Storage::Device(_) => {} // refused by the pairing
        }
    }
    if p.staged.is_empty() && p.mapped.is_empty() && large_mapped.len() < h2d::MAPPED_MIN_COUNT {
        p.direct.append(&mut large_mapped);
    } else {
        p.mapped.append(&mut large_mapped);
    }
    p.sizes = p.staged.iter().map(|b| b.len()).collect();
    p.staged_bytes = p.sizes.iter().sum();
    // 256-byte aligned, as a batch's buffer: the kernel reads 16 bytes at a time.
    // Sizes of live tensors cannot overflow together; should they, an error (session 64:
    // the staged sources were left out and the call returned `Ok`).
    let (offsets, end) = plan::pack(p.sizes.iter().copied(), memory::DEVICE_ALIGN)?;
    (p.offsets, p.staged_end) = (offsets, end);
    p.one_slot =
        kernel && scatter::descriptors_at(p.staged_end, p.scatter().descriptors(), slot).is_some();
    if !p.one_slot {
        // No launch: the small page-locked sources are copied directly too.
        p.direct.append(&mut p.mapped);
    }
    Ok(p)
}

impl Plan<'_> {
    /// The kernel's work: everything small.
    fn scatter(&self) -> Scatter<'_> {
        Scatter {
            offsets: &self.offsets,
            sizes: &self.sizes,
            to: &self.staged_to,
            mapped: &self.mapped,
            data_end: self.staged_end,
        }
    }
}

/// How [`submit`] moves `plan`'s staged pieces and the page-locked sources the kernel
/// reads in place (the direct copies aside): decided once, before anything is queued,
/// so that the first staging slot is leased before any copy.
#[derive(Clone, Copy)]
enum Staged {
    /// One kernel launch, through one staging slot unless `slot_free` (nothing staged,
    /// and the descriptors fit the launch's parameters).
    Kernel {
        kernel: GatherKernel,
        slot_free: bool,
    },
    /// Window by window through the staging ring.
    Windows,
    /// Nothing staged or read in place.
    Nothing,
}

impl Staged {
    /// `kernel`: the scatter kernel, where it can run.
    fn of(plan: &Plan, kernel: Option<GatherKernel>) -> Staged {
        match kernel {
            Some(kernel) if plan.one_slot && (plan.staged_end > 0 || !plan.mapped.is_empty()) => {
                Staged::Kernel {
                    kernel,
                    slot_free: plan.scatter().slot_free(),
                }
            }
            _ if plan.staged_end > 0 => Staged::Windows,
            _ => Staged::Nothing,
        }
    }

    fn needs_slot(self) -> bool {
        matches!(
            self,
            Staged::Kernel {
                slot_free: false,
                ..
            } | Staged::Windows
        )
    }
}

/// Queues every copy of `plan` on `stream` (`job`'s) as `staged` routes it, its first
/// staging slot, where it needs one, leased already.
fn submit(
    call: &mut Call,
    job: &mut InFlight,
    plan: &Plan,
    staged: Staged,
    stream: &Stream,
) -> Result<()> {
    let (ctx, device) = (call.ctx, call.device);
    if !plan.direct.is_empty() {
        // SAFETY: the destinations were checked (device memory of `device`, not
        // overlapping) and, like the sources, are cloned into the call's owners, kept
        // until its event proves the copies done; the caller orders other users of the
        // destinations (docs/semantics.md).
        call.stats.copies += unsafe { scatter::h2d_direct(ctx, &plan.direct, device, stream) }?;
        call.stats.direct_bytes += plan.direct.iter().map(|d| d.0.nbytes()).sum::<usize>();
    }
    match staged {
        Staged::Kernel { kernel, slot_free } => {
            one_slot(call, job, plan, kernel, slot_free, stream)
        }
        Staged::Windows => windows(call, job, plan, stream),
        Staged::Nothing => Ok(()),
    }
}

/// Everything small through one slot and one kernel launch; with `slot_free` (nothing
/// staged and few enough pieces for the launch's parameters: page-locked sources read in
/// place, an in-place `Pairs` step), one launch and no slot.
fn one_slot(
    call: &mut Call,
    job: &mut InFlight,
    plan: &Plan,
    kernel: GatherKernel,
    slot_free: bool,
    stream: &Stream,
) -> Result<()> {
    let work = plan.scatter();
    if slot_free {
        // SAFETY: the mapped sources and the destinations are cloned into the call's
        // owners, kept until its event (recorded after this launch, on the same stream)
        // proves the copies done; the destinations were checked and are ordered by the
        // caller (docs/semantics.md).
        call.stats.copies +=
            unsafe { scatter::h2d_mapped(call.ctx, kernel, &work, call.device, stream) }?;
        call.stats.mapped_bytes += plan.mapped.iter().map(|m| m.0.nbytes()).sum::<usize>();
        return Ok(());
    }
    super::lease_slots(call, job, 1)?;
    super::trace::mark("leased");
    let rt = call.rt;
    let lease = job.leases.first_mut().ok_or_else(|| Error::Internal {
        op: "copy into",
        reason: "no staging slot leased".into(),
    })?;
    if plan.staged_end > 0 {
        let pieces = plan
            .offsets
            .iter()
            .copied()
            .zip(plan.staged.iter().copied());
        // SAFETY: the sources are borrowed from the caller's batch for this whole call,
        // and the fill is settled before the call returns (the scatter waits for it, and
        // so do abort and drop).
        unsafe { lease.fill_start(pieces, &rt.copy, rt.fill_stores(Stores::Streaming)) }?;
        call.stats.staged_bytes += plan.staged_bytes;
        call.stats.windows += 1;
        super::trace::mark("fill started");
    }
    // SAFETY: the staged bytes are being filled through this lease; the mapped sources
    // and the destinations are cloned into the call's owners, kept until its event
    // proves the copies done (after the slot's event, on the same stream); the
    // destinations were checked and are ordered by the caller (docs/semantics.md).
    call.stats.copies +=
        unsafe { scatter::h2d_scatter(call.ctx, lease, kernel, &work, call.device, stream) }?;
    call.stats.mapped_bytes += plan.mapped.iter().map(|m| m.0.nbytes()).sum::<usize>();
    Ok(())
}

/// The staged region through the staging ring, each window's pieces copied to their
/// destinations.
fn windows(call: &mut Call, job: &mut InFlight, plan: &Plan, stream: &Stream) -> Result<()> {
    let layout = Layout {
        offsets: &plan.offsets,
        sizes: &plan.sizes,
        end: plan.staged_end,
        staged_end: plan.staged_end,
    };
    let drain = |call: &mut Call, job: &mut InFlight, k: usize, w: plan::Window| {
        let parts: Vec<SlotPart> = w
            .parts(&plan.offsets, &plan.sizes)
            .map(|p| SlotPart {
                slot_off: p.window_off,
                len: p.len,
                view: plan.staged_to[p.item],
                view_off: p.item_off,
            })
            .collect();
        let lease = job.leases.get_mut(k).ok_or_else(|| Error::Internal {
            op: "copy into",
            reason: format!("no staging slot {k}"),
        })?;
        // SAFETY: as for the direct copies: the destinations were checked, are cloned into
        // the call's owners until its event, and are ordered by the caller.
        call.stats.copies +=
            unsafe { scatter::h2d_from_slot(call.ctx, lease, &parts, call.device, stream) }?;
        call.stats.windows += 1;
        Ok(())
    };
    h2d::run_windows(
        call,
        job,
        &plan.staged,
        &layout,
        0,
        |_, _| Ok(()),
        |_| Ok(()),
        drain,
    )
}
