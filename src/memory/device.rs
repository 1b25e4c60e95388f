//! [`DeviceAlloc`]: device memory of one batch (pinlane's) or of another owner (external),
//! [`DeviceView`]: one tensor in it, and [`DevicePtrGuard`]: a lent pointer whose use on a
//! stream the free waits for.

use super::device_blocks::{self, DeviceBlocks};
use super::device_gate::DeviceGate;
use super::device_reads::Reads;
use crate::device::Device;
use crate::driver::{self, ContextGuard, DevicePtr, Event, Stream};
use crate::error::Result;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Device memory that tensors are views of: one allocation from pinlane's stream-ordered
/// pool holding every tensor of one H2D batch (each at a
/// [`DEVICE_ALIGN`](super::DEVICE_ALIGN)-aligned offset), or memory another library
/// allocated, kept alive by its owner.
///
/// Released when the last [`DeviceView`] and the last ring or in-flight reference drop:
/// pinlane's memory with `cuMemFreeAsync` on `free_on` (the consumer stream), or, for a
/// small H2D output, given back to [`DeviceBlocks`] with an event recorded there; external
/// memory by dropping its owner. Either way only after every recorded pointer use (a
/// [`DevicePtrGuard`] on another stream) has run: pinlane's memory by making `free_on`
/// wait for those uses' events (no host wait), external memory by waiting for them on the
/// host before the owner drops (the owner's own release is not stream-ordered by pinlane).
pub(crate) struct DeviceAlloc {
    ptr: DevicePtr,
    nbytes: usize,
    device: usize,
    backing: Backing,
    /// One event per stream that used this memory through a lent pointer, re-recorded at
    /// each later use on that stream (stream order makes the newest cover the older ones).
    /// The stream itself is kept, not its handle: legacy streams of different devices
    /// share one handle, and a destroyed stream's handle may come back for a new stream
    /// (whose later point would not cover the old one's uses); kept here, a stream
    /// pinlane made is not destroyed before the memory is released.
    uses: Mutex<Vec<(Stream, Event)>>,
    /// Whether an H2D call's copies may still be writing it (see [`super::device_gate`]).
    gate: DeviceGate,
    /// The non-blocking D2H calls whose copies may still read it (see
    /// [`super::device_reads`]).
    reads: Reads,
}

/// Makes room for an allocation of `nbytes` that found `ctx`'s device out of memory, when
/// room can be made: frees the device's kept blocks ([`DeviceBlocks::free_device`]) and
/// waits up to `wait` for their streams to run the frees. `Ok(true)` when a retry may
/// succeed: blocks were freed, or another thread made room since `seen` (its
/// [`DeviceBlocks::rooms_made`] before the allocation). A driver error on the way (asking
/// the device's free memory, or the event that proves a stream past its frees) is
/// returned: it says more than the out-of-memory error it would otherwise leave.
///
/// One retry makes room at a time ([`DeviceBlocks::room_turn`]): a thread out of memory
/// while another frees the kept blocks waits for that round (itself bounded by `wait`),
/// then tries again, instead of failing because nothing was left for it to free. Nothing
/// is freed for an allocation larger than all that could serve it: the device's free
/// memory, the kept blocks, and the memory of pinlane's pool that backs no allocation.
///
/// That last needs no step here: the driver gives a pool's unused memory to an allocation
/// the device could not otherwise serve, one from the same pool included. Trimming the
/// pool before the retry (sessions 74 and 75) changed nothing on a GPU: the pool test of
/// `tests/gpu_oom_retry.rs` passed with no retry at all (session 76, an H200, driver 580;
/// `benches/probes/pool_trim.cu` shows the same without pinlane).
fn make_room(
    ctx: &ContextGuard,
    nbytes: usize,
    blocks: &DeviceBlocks,
    wait: Duration,
    seen: u64,
) -> Result<bool> {
    let _turn = blocks.room_turn();
    if blocks.rooms_made() != seen {
        return Ok(true);
    }
    let kept = blocks.kept_bytes_on(ctx.device());
    if kept == 0 || nbytes > driver::device_room(ctx, kept)? {
        return Ok(false);
    }
    let start = Instant::now();
    let freed_on = blocks.free_device(ctx);
    for s in &freed_on {
        if !s.done_within(wait.saturating_sub(start.elapsed()))? {
            return Ok(false);
        }
    }
    if freed_on.is_empty() {
        return Ok(false);
    }
    blocks.made_room();
    Ok(true)
}

/// A foreign owner on its way to the retained registry (`Send` is all it needs there).
struct ForeignOwner(#[allow(dead_code)] Box<dyn Send + Sync>);

enum Backing {
    /// pinlane's pool; freed in order on this stream, or given back to `kept` after the
    /// work queued there.
    Pool { free_on: Stream, kept: Option<Kept> },
    /// Another library's memory; released by dropping the owner. `writable`: copies
    /// into existing tensors may write it (the importer took it as writable).
    Foreign {
        owner: Option<Box<dyn Send + Sync>>,
        writable: bool,
    },
}

/// Where a small output's block goes when released: `blocks`, in size class `class`, with
/// its consumer stream told apart by `key`.
struct Kept {
    blocks: Arc<DeviceBlocks>,
    class: usize,
    key: device_blocks::StreamKey,
}

impl DeviceAlloc {
    /// Allocates `nbytes` (> 0) on `device`, ready in `stream`'s order; it will be freed
    /// on `free_on`.
    pub(crate) fn new_async(
        ctx: &ContextGuard,
        device: usize,
        nbytes: usize,
        stream: &Stream,
        free_on: Stream,
    ) -> Result<Arc<DeviceAlloc>> {
        let ptr = driver::device_alloc_async(ctx, device, nbytes, stream)?;
        Ok(DeviceAlloc::pool(ptr, nbytes, device, free_on, None))
    }

    /// [`DeviceAlloc::new_async`] for an H2D batch's outputs: a small batch whose consumer
    /// stream is not `stream` (see [`device_blocks::keeps_for`]) gets a block `blocks`
    /// kept, when one is proven free, or a new one of its size class, and gives it back
    /// to `blocks` when released. So its allocation skips the pool's check of a block
    /// freed on another stream (docs/performance-log.md, session 69).
    ///
    /// When the device has no memory for it and room can be made ([`make_room`], which
    /// waits up to `wait` for kept blocks' frees), the allocation is tried once more.
    pub(crate) fn for_outputs(
        ctx: &ContextGuard,
        nbytes: usize,
        stream: &Stream,
        free_on: Stream,
        blocks: &Arc<DeviceBlocks>,
        wait: Duration,
    ) -> Result<Arc<DeviceAlloc>> {
        let device = ctx.device();
        let alloc = |n: usize| {
            let seen = blocks.rooms_made();
            match driver::device_alloc_async(ctx, device, n, stream) {
                Err(e) if e.is_out_of_memory() => match make_room(ctx, n, blocks, wait, seen)? {
                    true => driver::device_alloc_async(ctx, device, n, stream),
                    false => Err(e),
                },
                r => r,
            }
        };
        let kept = device_blocks::class_of(nbytes)
            .filter(|_| blocks.enabled())
            .and_then(|c| Some((c, device_blocks::keeps_for(stream, &free_on)?)));
        let Some(((class, block), key)) = kept else {
            return Ok(DeviceAlloc::pool(
                alloc(nbytes)?,
                nbytes,
                device,
                free_on,
                None,
            ));
        };
        let ptr = match blocks.take(device, class) {
            Some(p) => p,
            None => alloc(block)?,
        };
        let kept = Some(Kept {
            blocks: blocks.clone(),
            class,
            key,
        });
        Ok(DeviceAlloc::pool(ptr, nbytes, device, free_on, kept))
    }

    fn pool(
        ptr: DevicePtr,
        nbytes: usize,
        device: usize,
        free_on: Stream,
        kept: Option<Kept>,
    ) -> Arc<DeviceAlloc> {
        Arc::new(DeviceAlloc {
            ptr,
            nbytes,
            device,
            backing: Backing::Pool { free_on, kept },
            uses: Mutex::new(Vec::new()),
            gate: DeviceGate::new(),
            reads: Reads::default(),
        })
    }

    /// `nbytes` of another owner's device memory at `ptr`, on `device`. `writable`:
    /// copies into existing tensors (`transfer_tensor_h2d_into`, `H2dPairs`) may write it.
    ///
    /// # Safety
    /// `ptr..ptr+nbytes` is device memory of `device` (usable from its primary context)
    /// that stays allocated until `owner` is dropped; dropping `owner` may happen on any
    /// thread.
    pub(crate) unsafe fn foreign(
        ptr: DevicePtr,
        nbytes: usize,
        device: usize,
        owner: Box<dyn Send + Sync>,
        writable: bool,
    ) -> Arc<DeviceAlloc> {
        Arc::new(DeviceAlloc {
            ptr,
            nbytes,
            device,
            backing: Backing::Foreign {
                owner: Some(owner),
                writable,
            },
            uses: Mutex::new(Vec::new()),
            gate: DeviceGate::new(),
            reads: Reads::default(),
        })
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Device bytes it takes: [`DeviceAlloc::nbytes`], or its size class's whole block for
    /// an output whose block is kept (what the retained registry counts for it).
    pub(crate) fn held_bytes(&self) -> usize {
        match &self.backing {
            Backing::Pool { kept: Some(k), .. } => device_blocks::block_bytes(k.class),
            _ => self.nbytes,
        }
    }

    /// Whether copies into existing tensors may write it: pinlane's own memory, or another
    /// owner's taken as writable (never a read-only DLPack import).
    fn writable(&self) -> bool {
        match &self.backing {
            Backing::Pool { .. } => true,
            Backing::Foreign { writable, .. } => *writable,
        }
    }

    /// Whether an H2D call's copies may still be writing the allocation.
    pub(super) fn gate(&self) -> &DeviceGate {
        &self.gate
    }

    /// The non-blocking D2H calls that may still read the allocation.
    pub(super) fn reads(&self) -> &Reads {
        &self.reads
    }

    /// The device address at `offset` (<= nbytes).
    pub(crate) fn addr(&self, offset: usize) -> DevicePtr {
        debug_assert!(offset <= self.nbytes);
        self.ptr + offset as DevicePtr
    }

    /// Records that work queued on `stream` up to now may use this memory: its release
    /// waits for that work. Nothing to record for pinlane's memory used on its own
    /// consumer stream, which frees it in that stream's order anyway.
    pub(crate) fn record_use(&self, stream: &Stream) -> Result<()> {
        if let Backing::Pool { free_on, .. } = &self.backing {
            if free_on.same_as(stream) {
                return Ok(());
            }
        }
        let mut uses = self.uses.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, ev)) = uses.iter().find(|(s, _)| s.same_as(stream)) {
            return ev.record(stream);
        }
        let ev = Event::new(stream.device())?;
        ev.record(stream)?;
        uses.push((stream.clone(), ev));
        Ok(())
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        self.reads.dropped();
        if self.gate.marked() {
            // A failed call's mark (never proven done) ends with the memory.
            super::device_gate::count_end();
        }
        let uses = std::mem::take(self.uses.get_mut().unwrap_or_else(|p| p.into_inner()));
        match &mut self.backing {
            Backing::Pool { free_on, kept } => {
                let res = driver::bind(self.device).and_then(|ctx| {
                    for (_, ev) in &uses {
                        ev.wait_on(free_on)?;
                    }
                    if let Some(Kept { blocks, class, key }) = kept {
                        // Kept with an event recorded on `free_on` after all of the above
                        // (its own work and the waits for the lent uses), which proves
                        // them done before the block is handed out again; not kept (a
                        // full class, or the event failed), it is freed below.
                        if blocks.give_back(&ctx, *class, self.ptr, free_on, *key) {
                            return Ok(());
                        }
                    }
                    // SAFETY: the pointer came from device_alloc_async and this is its last
                    // owner. Every pinlane copy into it was synchronised before the batch
                    // was returned (or the registry would still own us); work queued on
                    // `free_on` is ordered before this free by the stream itself, and every
                    // lent-pointer use on another stream by the waits just queued (a failed
                    // wait returns before the free).
                    unsafe { driver::device_free_async(&ctx, self.ptr, free_on) }
                });
                if let Err(e) = res {
                    driver::deferred::record(self.device, e);
                }
            }
            Backing::Foreign { owner, .. } => {
                let owner = owner.take();
                // No clock is read where there is nothing to wait for (a batch's inputs,
                // dropped a thousand at a time).
                if uses.is_empty() {
                    drop(owner); // pinlane's copies finished before any view could drop
                    return;
                }
                let (device, nbytes) = (self.device, self.nbytes);
                let events: Vec<Event> = uses.into_iter().map(|(_, ev)| ev).collect();
                // The drop bound runs from now, wherever the wait happens.
                let deadline = driver::deadline_after(super::waits::drop_wait());
                // A drop pinlane makes (the completion thread dropping a non-blocking
                // call's owners, a wait or a transfer releasing what earlier calls kept)
                // waits for a lent use still running on the free thread: every handle,
                // or the transfer, would wait here meanwhile, for work on another stream.
                if super::reaper::pinlanes_own_free()
                    && !events.iter().all(|ev| matches!(ev.completed(), Ok(true)))
                {
                    super::reaper::run_later(
                        device,
                        "releasing another library's device memory",
                        Box::new(move || {
                            release_foreign(device, events, owner, nbytes, deadline);
                        }),
                    );
                } else {
                    release_foreign(device, events, owner, nbytes, deadline);
                }
            }
        }
    }
}

/// Drops the `owner` of another library's device memory (`nbytes` on `device`) once the
/// lent uses' `events` have completed, waiting for them on the host until `deadline` (the
/// drop's bound, [`Config::drop_sync_wait`](crate::config::Config::drop_sync_wait), from
/// the drop): past it, the owner waits in the retained registry for the uses still
/// running; if a use cannot be proven complete, the owner is kept for ever (and the error
/// recorded).
fn release_foreign(
    device: usize,
    events: Vec<Event>,
    owner: Option<Box<dyn Send + Sync>>,
    nbytes: usize,
    deadline: std::time::Instant,
) {
    for (k, ev) in events.iter().enumerate() {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match ev.done_within(left) {
            Ok(true) => {}
            Ok(false) => {
                // Still running at the bound: the owner waits in the retained registry for
                // this use and the later ones, counted.
                let keep = owner.map(ForeignOwner);
                super::retained::retain_until(events[k..].to_vec(), Box::new(keep), nbytes);
                return;
            }
            Err(e) => {
                // The use cannot be proven complete: keep the memory forever.
                driver::deferred::record(device, e);
                std::mem::forget(owner);
                return;
            }
        }
    }
    drop(owner);
}

/// A tensor's bytes inside a [`DeviceAlloc`]. Empty tensors have no allocation.
#[derive(Clone)]
pub(crate) struct DeviceView {
    alloc: Option<Arc<DeviceAlloc>>,
    offset: usize,
    nbytes: usize,
    device: usize,
    /// The allocation's address at `offset` (0 without one), kept here so that a batch's
    /// addresses are read without touching each allocation (one cache miss per tensor
    /// when the sources are cold).
    at: DevicePtr,
}

impl DeviceView {
    /// `nbytes` at `offset` of `alloc`.
    ///
    /// # Errors
    /// A range outside the allocation (never a view that reaches past it).
    pub(crate) fn new(
        alloc: &Arc<DeviceAlloc>,
        offset: usize,
        nbytes: usize,
    ) -> Result<DeviceView> {
        super::check_range("device view", offset, nbytes, alloc.nbytes())?;
        Ok(DeviceView::inside(alloc, offset, nbytes))
    }

    /// `nbytes` at `offset` of `alloc`, a range the caller has checked to be inside it.
    fn inside(alloc: &Arc<DeviceAlloc>, offset: usize, nbytes: usize) -> DeviceView {
        debug_assert!(offset
            .checked_add(nbytes)
            .is_some_and(|e| e <= alloc.nbytes()));
        DeviceView {
            alloc: Some(alloc.clone()),
            offset,
            nbytes,
            device: alloc.device,
            at: alloc.addr(offset),
        }
    }

    /// All of `alloc`.
    pub(crate) fn whole(alloc: &Arc<DeviceAlloc>) -> DeviceView {
        DeviceView::inside(alloc, 0, alloc.nbytes())
    }

    /// Views of `alloc` for each `(offset, nbytes)`, an empty view where `nbytes` is 0:
    /// one H2D batch's output tensors. Every range is checked first, then the views are
    /// made lazily, as the caller takes them (the batch is rebuilt around them in the same
    /// pass: no list of views in between).
    ///
    /// # Errors
    /// The first range outside the allocation.
    pub(crate) fn views<'a>(
        alloc: &'a Arc<DeviceAlloc>,
        ranges: impl ExactSizeIterator<Item = (usize, usize)> + Clone + 'a,
    ) -> Result<impl ExactSizeIterator<Item = DeviceView> + 'a> {
        let len = alloc.nbytes();
        for (offset, nbytes) in ranges.clone() {
            if nbytes > 0 && offset.checked_add(nbytes).is_none_or(|e| e > len) {
                super::check_range("device view", offset, nbytes, len)?;
            }
        }
        // Every non-empty range is inside the allocation (checked above).
        Ok(ranges.map(move |(offset, nbytes)| {
            if nbytes == 0 {
                DeviceView::empty(alloc.device)
            } else {
                DeviceView::inside(alloc, offset, nbytes)
            }
        }))
    }

    /// A view of no bytes on `device`.
    pub(crate) fn empty(device: usize) -> DeviceView {
        DeviceView {
            alloc: None,
            offset: 0,
            nbytes: 0,
            device,
            at: 0,
        }
    }

    pub(crate) fn device(&self) -> usize {
        self.device
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The allocation the view is in (`None` for an empty view).
    pub(super) fn alloc(&self) -> Option<&Arc<DeviceAlloc>> {
        self.alloc.as_ref()
    }

    /// Whether copies into existing tensors may write the view (an empty one: nothing to
    /// write).
    pub(crate) fn writable(&self) -> bool {
        self.alloc.as_ref().is_none_or(|a| a.writable())
    }

    /// The address at `at` (<= nbytes) bytes into the view; `None` for an empty view.
    pub(crate) fn addr(&self, at: usize) -> Option<DevicePtr> {
        debug_assert!(at <= self.nbytes);
        self.alloc.as_ref().map(|_| self.at + at as DevicePtr)
    }

    /// `Ok` when the view may be used now by work that no stream orders (an export
    /// without a stream): no H2D call's copies may still be writing it (see
    /// [`super::device_gate`]). One load when no H2D call has copies in flight.
    ///
    /// # Errors
    /// [`Error::BytesInFlight`](crate::Error::BytesInFlight) naming `op`; the driver's
    /// error asking whether a non-blocking call's copies are done.
    pub(crate) fn usable(&self, op: &'static str) -> Result<()> {
        match &self.alloc {
            Some(a) => a.gate.check(op),
            None => Ok(()),
        }
    }

    /// What a use of the view must wait for: nothing (`Ok(None)`), or the returned event
    /// (an output of a non-blocking H2D call that has returned, its copies maybe not done);
    /// refused while an H2D call's copies may still write it unordered (see
    /// [`super::device_gate`]). One load when no H2D call has copies in flight.
    ///
    /// # Errors
    /// [`Error::BytesInFlight`](crate::Error::BytesInFlight) naming `op`.
    pub(crate) fn pending_use(&self, op: &'static str) -> Result<Option<Event>> {
        match &self.alloc {
            Some(a) => a.gate.pending(op),
            None => Ok(None),
        }
    }

    /// `Ok` when the view may be used by work queued on `stream` from now: no H2D call's
    /// copies may still be writing it, or those of a non-blocking call that has returned,
    /// which `stream` is then made to wait for. One load when no H2D call has copies in
    /// flight.
    ///
    /// # Errors
    /// [`Error::BytesInFlight`](crate::Error::BytesInFlight) naming `op`; the driver's
    /// error making `stream` wait.
    pub(crate) fn usable_on(&self, stream: &Stream, op: &'static str) -> Result<()> {
        match &self.alloc {
            Some(a) => a.gate.order_on(stream, op),
            None => Ok(()),
        }
    }

    /// `(address, bytes)` of the view, for overlap checks (`(0, 0)` for an empty view).
    pub(crate) fn range(&self) -> (u64, usize) {
        (self.addr(0).unwrap_or(0), self.nbytes)
    }

    /// Lends the view's address for work on `stream` (see [`DevicePtrGuard`]).
    pub(crate) fn lend(&self, stream: &Stream) -> DevicePtrGuard {
        DevicePtrGuard {
            view: self.clone(),
            stream: stream.clone(),
            recorded: false,
        }
    }

    /// Queues a copy of `src` over this view's bytes on `stream` (tests only).
    ///
    /// # Safety
    /// 1. `src` stays alive until the copy has finished.
    /// 2. The view's allocation stays alive until then, and nothing else reads or writes
    ///    these bytes meanwhile except in `stream`'s order.
    #[cfg(feature = "test-util")]
    pub(crate) unsafe fn overwrite_from_pinned_async(
        &self,
        src: &super::PinnedBuf,
        stream: &Stream,
    ) -> Result<()> {
        let Some(alloc) = &self.alloc else {
            return Ok(()); // empty view: nothing to write (sizes were checked equal)
        };
        let ctx = driver::bind(self.device)?;
        // SAFETY: obligations 1 and 2 are the caller's; h2d_async checks the range.
        unsafe { src.h2d_async(&ctx, alloc, self.offset, stream) }
    }

    /// Where the view starts in its owner's bytes.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// Whether both are views into one allocation (never for empty views).
    pub(crate) fn same_alloc(&self, other: &DeviceView) -> bool {
        matches!((&self.alloc, &other.alloc), (Some(a), Some(b)) if Arc::ptr_eq(a, b))
    }

    /// Whether two views are the same bytes of the same allocation (empty views: of the
    /// same device).
    pub(crate) fn same_as(&self, other: &DeviceView) -> bool {
        let same_alloc = match (&self.alloc, &other.alloc) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => self.device == other.device,
            _ => false,
        };
        same_alloc && self.offset == other.offset && self.nbytes == other.nbytes
    }
}

/// A device tensor's address lent for work on one stream, from
/// [`Tensor::device_ptr`](crate::tensor::Tensor::device_ptr).
///
/// **The rule:** queue every use of the pointer on the guard's stream while the guard
/// lives. When it drops (or [`DevicePtrGuard::finish`] is called), an event is recorded
/// on that stream, and the tensor's memory is released only after that event: pinlane's
/// memory by a wait queued on its consumer stream before the stream-ordered free (the
/// host does not block), external memory by a host wait before its owner drops. While
/// the guard lives it also keeps the memory alive, so a guard that is leaked
/// (`mem::forget`) leaks the memory rather than freeing it under a kernel.
///
/// Use on the tensor's consumer stream needs no event (the free is queued there, after
/// the use), and records none.
///
/// pinlane tensors are immutable: the pointer is for reading. Writing through it changes
/// the bytes under every clone of the tensor and under a cache-ring entry.
///
/// ```no_run
/// # fn main() -> pinlane::Result<()> {
/// use pinlane::{transfer_tensor_h2d, Device, Stream, Tensor};
/// let on_gpu = transfer_tensor_h2d(&Tensor::from_vec(vec![1.0f32; 1024], [1024])?)?;
/// let compute = Stream::new(Device::cuda(0))?;
/// let guard = on_gpu.device_ptr(&compute)?;
/// let (ptr, nbytes) = (guard.ptr(), guard.nbytes());
/// // ... launch a kernel reading `ptr..ptr + nbytes` on `compute` ...
/// guard.finish()?; // or drop it: the free now waits for that kernel
/// drop(on_gpu);
/// # let _ = (ptr, nbytes);
/// # Ok(()) }
/// ```
#[must_use = "queue the work that uses the pointer while the guard lives"]
pub struct DevicePtrGuard {
    view: DeviceView,
    stream: Stream,
    recorded: bool,
}

impl DevicePtrGuard {
    /// The device address of the tensor's first byte (0 for a tensor of no bytes).
    pub fn ptr(&self) -> u64 {
        self.view.addr(0).unwrap_or(0)
    }

    /// Bytes at [`DevicePtrGuard::ptr`].
    pub fn nbytes(&self) -> usize {
        self.view.nbytes
    }

    /// The device the memory is on.
    pub fn device(&self) -> Device {
        Device::cuda(self.view.device)
    }

    /// The stream the pointer is lent for.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Records the use now (as dropping the guard does) and returns the driver's error,
    /// if any, instead of deferring it.
    ///
    /// # Errors
    /// The driver's error from creating or recording the event. The memory is then kept
    /// until the stream is idle: waited for up to
    /// [`Config::drop_sync_wait`](crate::config::Config::drop_sync_wait), then held in the
    /// retained registry (counted in `memory_stats().retained_bytes`) until a later check
    /// finds the stream idle.
    pub fn finish(mut self) -> Result<()> {
        self.record()
    }

    fn record(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.recorded, true) {
            return Ok(());
        }
        let Some(alloc) = &self.view.alloc else {
            return Ok(()); // no bytes, nothing to protect
        };
        alloc.record_use(&self.stream).inspect_err(|_| {
            // Fall back to waiting on the host, within the drop bound; past it, the memory
            // waits in the retained registry until the stream is proven idle.
            if !self.stream.idle_within(super::waits::drop_wait()) {
                let keep = Box::new(alloc.clone());
                super::retained::retain(self.stream.clone(), keep, alloc.held_bytes());
            }
        })
    }
}

impl Drop for DevicePtrGuard {
    fn drop(&mut self) {
        if let Err(e) = self.record() {
            driver::deferred::record(self.stream.index(), e);
        }
    }
}

impl std::fmt::Debug for DevicePtrGuard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DevicePtrGuard")
            .field("ptr", &format_args!("{:#x}", self.ptr()))
            .field("nbytes", &self.nbytes())
            .field("device", &self.device())
            .finish()
    }
}
