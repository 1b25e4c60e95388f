//! [`InFlight`]: the owners a call's queued copies may still touch, released only after
//! the stream is proven idle.

use super::arena::Synced;
use super::filling::Fill;
use super::{retained, waits, DeviceAlloc, PinnedBlock, SlotLease};
use super::{DeviceFill, DeviceReads, DeviceView};
use crate::driver::{ContextGuard, HostPtr, Stream};
use crate::error::{Error, Result};
use std::any::Any;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Everything one transfer call has queued copies against on `stream`: its staging slot
/// leases, device allocations and page-locked output blocks. A call ends it with
/// [`InFlight::finish`], [`InFlight::abort`] (or `abort_around`, `abort_unqueued`),
/// [`InFlight::detach`] or, unwinding from a panic, [`InFlight::unwind`]; a drop without
/// any of them (a bug, or a panic no call catches) still proves the stream idle first,
/// within the drop bound, or retains what it holds.
pub(crate) struct InFlight {
    stream: Stream,
    pub(crate) leases: Vec<SlotLease>,
    /// Other owners (device allocations, output blocks) with their sizes.
    held: Vec<(Arc<dyn Any + Send + Sync>, usize)>,
    /// The output ranges the copies write, marked until they are proven done (reads of
    /// them are refused until then: see `super::filling`).
    fills: Vec<Fill>,
    /// An H2D call's device output ([`InFlight::hold_device_output`]): cleared only with
    /// the proof that every copy into it was queued and is done (`finish`, `unwind`), or
    /// ordered after a non-blocking call's event and handed to its `Detached` (`detach`);
    /// a call that fails or panics before every copy was queued leaves it marked (its
    /// bytes may be partly unwritten).
    device_fill: Option<DeviceFill>,
    /// The device allocations a non-blocking D2H call's copies read
    /// ([`InFlight::read_device`]): marked with its event by `detach`, the marks ended
    /// by its `Detached` once the copies are proven done.
    device_reads: Option<DeviceReads>,
    /// Set once the job is ended (finish, abort, detach, unwind), so Drop knows not to
    /// synchronise again.
    done: bool,
    /// A queued end flag ([`InFlight::end_flag`]): a word of a held output block the
    /// stream sets after the copies, and how long [`InFlight::finish`] spins for it
    /// before it waits in the driver.
    end_flag: Option<(HostPtr<u32>, Duration)>,
}

impl InFlight {
    pub(crate) fn new(stream: Stream) -> InFlight {
        InFlight {
            stream,
            leases: Vec::new(),
            held: Vec::new(),
            fills: Vec::new(),
            device_fill: None,
            device_reads: None,
            done: false,
            end_flag: None,
        }
    }

    /// Queues on the stream, after everything queued so far, the write of the end flag
    /// at `at` of `block`, so that [`InFlight::finish`] learns that the copies ended from
    /// that word (spinning for it at most `spin`) instead of waiting in the driver; call
    /// it once every copy of the call is queued. Queued early, the device's round trip
    /// for the write overlaps what the call does before it waits (its rebuild). If the
    /// write cannot be queued, `finish` waits in the driver. A word outside the block, or
    /// not 4-byte aligned, is refused (no flag). `ctx` is the stream's device's context.
    ///
    /// # Safety
    /// 1. `at..at + 4` lies in a range of `block` this call holds
    ///    ([`InFlight::hold_output`]), outside every output view, that nothing else
    ///    reads or writes.
    /// 2. The block comes from `cuMemHostAlloc` and the stream's device reads it at its
    ///    host address (`driver::host_memory_mapped`).
    pub(crate) unsafe fn end_flag(
        &mut self,
        ctx: &ContextGuard,
        block: &PinnedBlock,
        at: usize,
        spin: Duration,
    ) {
        if !block.holds_word(at) {
            return;
        }
        let word = block.ptr_at(at).cast::<u32>();
        // SAFETY: inside the block and aligned (checked above); the call holds the range
        // and nothing else touches it (obligation 1), and no write is queued yet.
        unsafe { std::sync::atomic::AtomicU32::from_ptr(word) }.store(0, Ordering::Relaxed);
        // SAFETY: page-locked and mapped for the device (obligation 2); held by this call
        // (`hold_output`) until the stream is proven past the write: the flag seen, or a
        // synchronisation, and on a failed one the block is retained with the rest; only
        // this write changes it (obligation 1). An error leaves the wait to the driver,
        // which reports the stream's own errors (a write the driver refuses
        // as unsupported turns flags off for the process).
        if let Ok(true) = unsafe { crate::driver::flag::queue_write(ctx, &self.stream, word, 1) } {
            self.end_flag = Some((HostPtr(word), spin));
        }
    }

    /// Synchronises the stream; on success the leases are marked idle and the output
    /// ranges readable, with the proof. A wait in the driver (no end flag, or none seen
    /// within its spin) runs inside `around_wait`, once.
    /// `all_queued`: every copy of the call was queued (its device output, if any, is then
    /// complete once the stream is proven past them).
    fn synchronize(&mut self, around_wait: AroundWait<'_>, all_queued: bool) -> Result<()> {
        let before = retained::position();
        let flagged = self.end_flag.take().and_then(|(word, spin)| {
            // SAFETY: the word lies in an output block this call holds (`held`), and only
            // the device writes it now (`end_flag` queued the write); if the flag does
            // not come, the driver's wait below proves the stream past the write before
            // the block can go, and on its failure the block is retained with the rest.
            unsafe { Synced::by_flag(&self.stream, word, spin) }
        });
        let (proof, stream_idle) = match flagged {
            Some(p) => (p, false),
            None => (driver_wait(&self.stream, around_wait)?, true),
        };
        self.leases.iter_mut().for_each(|l| l.mark_idle(&proof));
        filled(&mut self.fills, &proof);
        if all_queued {
            if let Some(f) = self.device_fill.take() {
                f.done(&proof);
            }
        }
        if stream_idle {
            // Only the driver's wait covers what others queued on the stream (the flag
            // covers this call's copies, all queued before its write).
            retained::release_proven(&self.stream, before);
        }
        Ok(())
    }

    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Keeps `owner` (of `bytes`) alive until the stream is proven idle.
    pub(crate) fn hold<T: Any + Send + Sync>(&mut self, owner: &Arc<T>, bytes: usize) {
        self.held.push((owner.clone(), bytes));
    }

    /// Keeps `block` alive (as [`InFlight::hold`]) and marks `at..at + len` of it as
    /// being written by this call's copies, until they are proven done: call it before
    /// any view of the range exists.
    pub(crate) fn hold_output(&mut self, block: &Arc<PinnedBlock>, at: usize, len: usize) {
        self.hold(block, len);
        self.fills.extend(block.start_fill(at, len));
    }

    /// Keeps `alloc` alive (as [`InFlight::hold`]) and marks all of it as being written
    /// by this call's copies, until they are proven done: call it before any view of it
    /// exists.
    pub(crate) fn hold_device_output(&mut self, alloc: &Arc<DeviceAlloc>) {
        self.hold(alloc, alloc.held_bytes());
        self.device_fill = Some(DeviceFill::start(alloc));
    }

    /// For a call that will return before its copies are done (`detach`): `views` are
    /// read by them, so copies into their memory wait for the call's event until the
    /// copies are proven done (see `super::device_reads`).
    pub(crate) fn read_device(&mut self, views: &[&DeviceView]) {
        self.device_reads = Some(DeviceReads::of(views));
    }

    fn held_bytes(&self) -> usize {
        self.leases.iter().map(SlotLease::len).sum::<usize>()
            + self.held.iter().map(|h| h.1).sum::<usize>()
    }

    /// Synchronises the stream, then releases everything. If the synchronisation fails,
    /// the owners and `sources()` (clones of the caller's source buffers) are retained
    /// until a later synchronisation succeeds, and the error is returned.
    pub(crate) fn finish<S: Send + 'static>(self, sources: impl FnOnce() -> S) -> Result<()> {
        self.finish_around(sources, &mut |wait| wait())
    }

    /// [`InFlight::finish`], with a wait in the driver run inside `around_wait` (see
    /// [`driver_wait`]).
    pub(crate) fn finish_around<S: Send + 'static>(
        mut self,
        sources: impl FnOnce() -> S,
        around_wait: AroundWait<'_>,
    ) -> Result<()> {
        self.settle();
        self.end_keeping(sources, around_wait, true)
    }

    /// Ends the job with the stream synchronised (`all_queued`: every copy was queued;
    /// else a drain, and a device output stays marked) inside `around_wait`, the caller's
    /// code, run [`guarded`](InFlight::guarded). What the copies use is retained with
    /// `sources()` when the synchronisation fails, as when the caller's code panics;
    /// `sources()` is made at most once, by whichever comes.
    fn end_keeping<S: Send + 'static>(
        &mut self,
        sources: impl FnOnce() -> S,
        around_wait: AroundWait<'_>,
        all_queued: bool,
    ) -> Result<()> {
        let mut sources = Some(sources);
        let mut keep = || sources.take().map(|f| f());
        let synced = self.guarded(&mut keep, all_queued, |job| {
            job.synchronize(around_wait, all_queued)
        });
        self.done = true;
        if synced.is_err() {
            self.retain(keep());
        }
        synced
    }

    /// Instead of synchronising, for a call that returns before its copies finish:
    /// settles the host fills (they read the caller's borrowed sources), records `done`
    /// on the stream after everything queued, and returns the owners with `sources()`
    /// (clones of the sources the device copies still read), to be kept until `done`
    /// completes. If `done` cannot be recorded, drains as [`InFlight::abort`] does and
    /// returns the error.
    pub(crate) fn detach<S: Send + 'static>(
        mut self,
        done: &crate::driver::Event,
        sources: impl FnOnce() -> S,
    ) -> Result<Detached> {
        self.settle();
        if let Err(e) = done.record(&self.stream) {
            return Err(self.abort(e, sources));
        }
        // Every copy is queued before `done`: from here a use of the device output on a
        // stream waits for `done` there, and the handle's completion ends the mark.
        let device_fill = self.device_fill.take();
        if let Some(f) = &device_fill {
            f.ordered_by(done);
        }
        let mut device_reads = self.device_reads.take();
        if let Some(r) = &mut device_reads {
            r.ordered_by(done);
        }
        self.done = true;
        let bytes = self.held_bytes();
        let sources: Box<dyn Any + Send> = Box::new(sources());
        Ok(Detached {
            stream: self.stream.clone(),
            parts: Some((
                std::mem::take(&mut self.leases),
                std::mem::take(&mut self.held),
                sources,
                bytes,
            )),
            fills: std::mem::take(&mut self.fills),
            device_fill,
            device_reads,
        })
    }

    /// After a failure part way: drains the copies already queued (synchronises), then
    /// returns `err`. If the drain fails too, retains the owners and `sources()` as in
    /// [`InFlight::finish`], and still returns the original `err`.
    pub(crate) fn abort<S: Send + 'static>(self, err: Error, sources: impl FnOnce() -> S) -> Error {
        self.abort_around(err, sources, &mut |wait| wait())
    }

    /// [`InFlight::abort`] without the drain where the job holds nothing: no slot
    /// leased, no owner or output held, no mark. For a call whose copies all hold what
    /// they touch here (the transfers': slots, outputs, gather buffers), that means
    /// nothing was queued; a call whose copies' memory is held elsewhere (a copy into
    /// existing tensors) calls it only where it knows it queued nothing. Then the call
    /// does not wait for the stream: a drain would wait for all the work queued there
    /// before (the caller's own, or what a D2H's copy stream waits for), without
    /// `Config::sync_wait` as long as that takes. Otherwise as `abort`.
    pub(crate) fn abort_unqueued<S: Send + 'static>(
        mut self,
        err: Error,
        sources: impl FnOnce() -> S,
    ) -> Error {
        let nothing = self.leases.is_empty()
            && self.held.is_empty()
            && self.fills.is_empty()
            && self.device_fill.is_none()
            && self.device_reads.is_none()
            && self.end_flag.is_none();
        if nothing {
            self.done = true;
            return err;
        }
        self.abort(err, sources)
    }

    /// [`InFlight::abort`], with the drain's wait in the driver run inside `around_wait`
    /// (see [`run_around`]).
    pub(crate) fn abort_around<S: Send + 'static>(
        mut self,
        err: Error,
        sources: impl FnOnce() -> S,
        around_wait: AroundWait<'_>,
    ) -> Error {
        self.end_flag = None;
        self.settle();
        // A copy may never have been queued: a device output stays marked. The drain's
        // own failure is retained, not returned: `err` is the call's.
        let _ = self.end_keeping(sources, around_wait, false);
        err
    }

    /// Waits for host-side copies into the staging slots: they read the caller's
    /// borrowed sources, so they must end before the call does, whatever happens next.
    /// (A fill that panicked is reported where its slot is used: every device copy from
    /// a slot settles it first, with an error then.)
    fn settle(&mut self) {
        self.leases.iter_mut().for_each(|l| {
            let _ = l.settle();
        });
    }

    fn retain<S: Send + 'static>(&mut self, sources: S) {
        self.settle();
        let bytes = self.held_bytes();
        let keep = (
            std::mem::take(&mut self.leases),
            std::mem::take(&mut self.held),
            sources,
        );
        retained::retain(self.stream.clone(), Box::new(keep), bytes);
    }
}

/// The caller's code a wait in the driver runs inside (given the wait, it runs it).
pub(crate) type AroundWait<'a> = &'a mut dyn FnMut(&mut dyn FnMut());

/// Runs `step` (a part of a call that may block: a wait in the driver, say) inside
/// `around_wait`, where a binding lets go of its interpreter's lock. `step` runs once
/// whatever `around_wait` does: if it did not call it, it runs here after it returned (a
/// wait is never skipped); calls after the first do nothing.
pub(crate) fn run_around<T>(
    around_wait: AroundWait<'_>,
    step: impl FnOnce() -> Result<T>,
) -> Result<T> {
    let mut step = Some(step);
    let mut out = None;
    around_wait(&mut || {
        if let Some(f) = step.take() {
            out = Some(f());
        }
    });
    match (out, step) {
        (Some(r), _) => r,
        (None, Some(f)) => f(),
        // `step` was taken to be run but gave no result: it panicked, and `around_wait`
        // caught the panic (`catch_unwind`) and returned. The step's own unwinding has
        // left its owners held (a drop that waits, bounded, or keeps them), so the call
        // fails here.
        (None, None) => Err(Error::Internal {
            op: "run_around",
            reason: "the step was taken and gave no result".into(),
        }),
    }
}

/// Waits in the driver for `stream` ([`Synced::synchronize`]) inside `around_wait` (see
/// [`run_around`]).
fn driver_wait<'a>(stream: &'a Stream, around_wait: AroundWait<'_>) -> Result<Synced<'a>> {
    run_around(around_wait, || Synced::synchronize(stream))
}

/// The output ranges of `fills` are written: `proof` says the copies queued before it
/// are done, these among them. Reads of the ranges are allowed from now.
fn filled(fills: &mut Vec<Fill>, proof: &Synced) {
    fills.drain(..).for_each(|f| f.done(proof));
}

/// The owners of a detached call ([`InFlight::detach`]): kept until its event completes,
/// then released ([`Detached::release`]), or retained ([`Detached::retain`]). Dropped any
/// other way, it retains them: with no proof, nothing is freed.
pub(crate) struct Detached {
    stream: Stream,
    parts: Option<Parts>,
    /// The output ranges the copies write: readable once the event proves them done;
    /// dropped unproven otherwise (they stay unreadable).
    fills: Vec<Fill>,
    /// An H2D call's device output, its uses ordered after the event meanwhile: usable
    /// by all once the event proves the copies done; refused otherwise.
    device_fill: Option<DeviceFill>,
    /// A non-blocking D2H call's device sources, copies into them ordered after the
    /// event meanwhile: the marks end once the event proves the copies done; otherwise
    /// they are retained with the parts, and end when those are released.
    device_reads: Option<DeviceReads>,
}

type Parts = (
    Vec<SlotLease>,
    Vec<(Arc<dyn Any + Send + Sync>, usize)>,
    Box<dyn Any + Send>,
    usize,
);

impl Detached {
    /// The stream the copies were queued on.
    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// `done` (recorded by [`InFlight::detach`]) has completed: every copy is done, so
    /// everything goes back, and the outputs' ranges are readable. The event is asked once
    /// more here, so the proof stands on its own; if it does not say completed (an error
    /// asking it), everything is retained instead, the outputs stay unreadable, and this
    /// returns `false`: the call must not be reported a success.
    #[must_use]
    pub(crate) fn release(mut self, done: &crate::driver::Event) -> bool {
        let Some(proof) = Synced::by_event(&self.stream, done) else {
            self.retain();
            return false;
        };
        filled(&mut self.fills, &proof);
        if let Some(f) = self.device_fill.take() {
            f.done(&proof);
        }
        if let Some(r) = self.device_reads.take() {
            r.done();
        }
        if let Some((mut leases, held, sources, _)) = self.parts.take() {
            leases.iter_mut().for_each(|l| l.mark_idle(&proof));
            drop((leases, held, sources));
        }
        true
    }

    /// Completion could not be proven (the event failed): everything is retained until a
    /// later synchronisation of the stream succeeds.
    pub(crate) fn retain(mut self) {
        self.retain_parts();
    }

    fn retain_parts(&mut self) {
        if let Some((leases, held, sources, bytes)) = self.parts.take() {
            let reads = self.device_reads.take().map(DeviceReads::until_released);
            let keep = Box::new((leases, held, sources, reads));
            retained::retain(self.stream.clone(), keep, bytes);
        }
    }
}

impl Drop for Detached {
    fn drop(&mut self) {
        self.retain_parts(); // no proof of completion: nothing is freed
    }
}

impl InFlight {
    /// Runs `f` on the job: code that may panic while the copies may run (the caller's
    /// `Batch::rebuild`, `while_copying`, or `around_wait` with the wait inside it). A
    /// panic is caught until the job has kept what the copies use, `sources()` included
    /// ([`InFlight::unwind`], with `all_queued`), then resumed.
    pub(crate) fn guarded<T, S: Send + 'static>(
        &mut self,
        sources: impl FnOnce() -> S,
        all_queued: bool,
        f: impl FnOnce(&mut InFlight) -> T,
    ) -> T {
        match catch_unwind(AssertUnwindSafe(|| f(self))) {
            Ok(t) => t,
            Err(panic) => {
                self.unwind(sources, all_queued);
                resume_unwind(panic)
            }
        }
    }

    /// For a call unwinding from a panic while its copies may run (the caller's code
    /// there: the overlapping calls' `while_copying`, a `Batch::rebuild`, an
    /// `around_wait`; caught there and resumed after this): as the drop does, but what
    /// cannot be proven idle within the drop bound is retained with `sources()` too
    /// (clones of the sources the device copies still read), which the unwinding caller
    /// would otherwise free. `all_queued`: every copy of the call was queued (a device
    /// output is then marked done once the stream is proven idle; otherwise it stays
    /// marked).
    pub(crate) fn unwind<S: Send + 'static>(
        &mut self,
        sources: impl FnOnce() -> S,
        all_queued: bool,
    ) {
        if !self.idle_within_drop_wait(all_queued) {
            self.retain(sources());
        }
        self.done = true;
    }

    /// Settles the fills, then proves the stream idle within the drop bound
    /// (`waits::drop_wait`, polled through an event: a hung device must not hang the
    /// thread) and marks what the call holds idle (a device output only if `all_queued`,
    /// as in [`InFlight::synchronize`]); false if it could not.
    fn idle_within_drop_wait(&mut self, all_queued: bool) -> bool {
        self.settle();
        let stream = self.stream.clone();
        match Synced::within(&stream, waits::drop_wait()) {
            Some(proof) => {
                self.leases.iter_mut().for_each(|l| l.mark_idle(&proof));
                filled(&mut self.fills, &proof);
                if all_queued {
                    if let Some(f) = self.device_fill.take() {
                        f.done(&proof);
                    }
                }
                true
            }
            None => false,
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Reached only on an unwind that no call catches (the caller's code that runs while
        // copies may, a `Batch::rebuild`, `while_copying` or `around_wait`, is caught and
        // calls `unwind`, which keeps the sources too): every other path calls finish,
        // abort or unwind. So that no lease goes back to the arena with a copy still
        // running, fills are settled first (the batch they read is still borrowed then);
        // if the stream is not proven idle within the drop bound, everything held is
        // retained (never freed early) and the drop returns.
        if !self.idle_within_drop_wait(false) {
            self.retain(());
        }
    }
}
