//! [`PinnedArena`]: the page-locked staging slots, allocated once and reused.
//!
//! Pageable tensors cannot be copied to the device asynchronously; they are streamed
//! through fixed-size page-locked slots instead. The arena allocates slots lazily, up to a
//! cap, and never frees them on the hot path: a slot is leased to one call
//! ([`SlotLease`]) and goes back on the free list when the lease drops.
//!
//! Each slot carries the event recorded after the last copy that used it; writing into it
//! or reading from it ([`SlotLease::bytes_mut`], [`SlotLease::bytes`]) first waits for that
//! event, so a slot is never refilled while the copy engine may still read it.
//!
//! Leasing cannot deadlock: a call blocks only for its *first* slot (when every slot is
//! leased to other calls, which release theirs when they end); further slots it only
//! takes if free, and otherwise it cycles the slots it has.

use super::copier::{CopyPanicked, Packed, Stores, Ticket};
use super::{
    check_range, retained, waits, CopyPool, CopyTask, CopyTasks, DeviceAlloc, DeviceView,
    HostRegion,
};
use crate::driver::{self, ContextGuard, Event, GatherKernel, GatherPiece, HostPtr, Stream};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// The page-locked staging slots of the [`Runtime`](crate::runtime::Runtime).
///
/// ```
/// let arena = &pinlane::runtime().memory_stats().staging;
/// assert!(arena.in_use_bytes <= arena.held_bytes);
/// ```
pub struct PinnedArena {
    slot_bytes: usize,
    /// Most slots (changeable at run time; at least 1).
    max_slots: AtomicUsize,
    /// Longest a lease waits for a slot.
    slot_wait: Duration,
    state: Mutex<ArenaState>,
    /// Signalled when a slot goes back on the free list.
    returned: Condvar,
    /// Set by [`PinnedArena::close`]: slots are freed as they come back.
    closed: AtomicBool,
    /// Leases that found every slot leased and waited.
    waits: AtomicU64,
    /// How often a waiting lease looks again without being woken: [`RECHECK`] (tests
    /// set it longer, to prove that a wake-up came).
    recheck: Duration,
}

struct ArenaState {
    free: Vec<Slab>,
    /// Slots allocated so far (free or leased); above `max_slots` only after a lower cap
    /// was set, until the leased ones come back.
    allocated: usize,
    /// Highest `allocated` so far.
    peak: usize,
    /// Leases asleep on `returned` now: a slab coming back wakes one only if there is
    /// one (a `Condvar` notification is a system call even with nobody waiting, ~0.5 us,
    /// and every transfer gives a slot back).
    sleepers: usize,
}

/// One page-locked slot, allocated under `device`'s context. `event` is recorded after
/// the last copy queued on it; `busy` says that event has not been waited for yet.
struct Slab {
    ptr: HostPtr<u8>,
    len: usize,
    device: usize,
    event: Option<Event>,
    busy: bool,
}

/// How often a waiting lease looks again at the retained registry (whose owners may hold
/// every slot, and may be releasable by now).
const RECHECK: Duration = Duration::from_millis(10);

impl PinnedArena {
    pub(crate) fn new(slot_bytes: usize, max_bytes: usize, slot_wait: Duration) -> PinnedArena {
        PinnedArena {
            slot_bytes,
            max_slots: AtomicUsize::new((max_bytes / slot_bytes).max(1)),
            slot_wait,
            state: Mutex::new(ArenaState {
                free: Vec::new(),
                allocated: 0,
                peak: 0,
                sleepers: 0,
            }),
            returned: Condvar::new(),
            closed: AtomicBool::new(false),
            waits: AtomicU64::new(0),
            recheck: RECHECK,
        }
    }

    /// This arena with waiting leases looking again only every `every`, unless woken
    /// (for the simulator's lib tests).
    #[cfg(all(test, feature = "test-util"))]
    pub(crate) fn with_recheck(mut self, every: Duration) -> PinnedArena {
        self.recheck = every;
        self
    }

    /// Bytes per slot.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// The cap, in bytes (whole slots).
    pub fn max_bytes(&self) -> usize {
        self.max_slots.load(Ordering::Relaxed) * self.slot_bytes
    }

    /// Page-locked bytes held by the arena now (allocated slots, free or leased).
    pub fn held_bytes(&self) -> usize {
        self.lock().allocated * self.slot_bytes
    }

    pub(crate) fn set_max_bytes(&self, bytes: usize) -> Result<()> {
        self.max_slots
            .store((bytes / self.slot_bytes).max(1), Ordering::Relaxed);
        // Free slots above the new cap go now; leased ones as they come back.
        let (excess, room) = {
            let mut st = self.lock();
            let cap = self.max_slots.load(Ordering::Relaxed);
            let n = st.allocated.saturating_sub(cap).min(st.free.len());
            st.allocated -= n;
            let keep = st.free.len() - n;
            (
                st.free.split_off(keep),
                st.sleepers > 0 && st.allocated < cap,
            )
        };
        if room {
            // A raised cap: every waiting lease may allocate now.
            self.returned.notify_all();
        }
        free_slabs(excess)
    }

    /// Frees every free slot, and from now on every slot as it comes back (a lease made
    /// later still works; its slot is freed when it ends). For the runtime's shutdown.
    pub(crate) fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::SeqCst);
        self.trim()
    }

    /// Frees every free slot.
    pub(crate) fn trim(&self) -> Result<()> {
        let free = {
            let mut st = self.lock();
            st.allocated -= st.free.len();
            std::mem::take(&mut st.free)
        };
        free_slabs(free)
    }

    pub(crate) fn stats(&self) -> super::PoolStats {
        let st = self.lock();
        let leased = st.allocated - st.free.len();
        super::PoolStats {
            held_bytes: st.allocated * self.slot_bytes,
            in_use_bytes: leased * self.slot_bytes,
            in_use_count: leased,
            peak_bytes: st.peak * self.slot_bytes,
        }
    }

    pub(crate) fn waits(&self) -> u64 {
        self.waits.load(Ordering::Relaxed)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ArenaState> {
        // A poisoned lock only means a panic elsewhere; the free list is still coherent
        // (every mutation is a single push/pop or counter change).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leases a slot. With `wait`, blocks until one is free when all are leased; without,
    /// returns `None` then. When a new slot's page-locked memory cannot be allocated (out
    /// of memory), a lease without `wait` returns `None` too, and one with it waits for a
    /// slot other calls hold, as when all are leased, or returns the error when no slot
    /// is allocated.
    ///
    /// A wait is bounded: every [`RECHECK`] it tries to release owners retained after
    /// failed synchronisations (they may hold every slot, and nothing else would release
    /// them), and after the arena's `slot_wait` it fails with
    /// [`Error::StagingExhausted`].
    pub(crate) fn lease(
        self: &Arc<Self>,
        ctx: &ContextGuard,
        wait: bool,
    ) -> Result<Option<SlotLease>> {
        let started = Instant::now();
        let mut counted = false;
        // Cleared when the host could page-lock no more: the lease then waits for a slot
        // another call gives back, as at the cap.
        let mut may_grow = true;
        let mut st = self.lock();
        loop {
            // A free slot allocated under another device's context is still usable
            // (page-locked memory is portable).
            if let Some(slab) = st.free.pop() {
                return Ok(Some(SlotLease::new(slab, self)));
            }
            if may_grow && st.allocated < self.max_slots.load(Ordering::Relaxed) {
                st.allocated += 1;
                st.peak = st.peak.max(st.allocated);
                drop(st);
                match Slab::alloc(ctx, self.slot_bytes) {
                    Ok(slab) => return Ok(Some(SlotLease::new(slab, self))),
                    Err(e) => {
                        self.release_place();
                        // The host can page-lock no more: a lease that does not wait (a
                        // call's slot beyond its first) finds no slot, and the call goes
                        // on with those it has; a waiting one waits for a slot that other
                        // calls hold, if any do, and fails the call otherwise.
                        if !e.is_out_of_memory() {
                            return Err(e);
                        }
                        if !wait {
                            return Ok(None);
                        }
                        st = self.lock();
                        if st.allocated == 0 {
                            return Err(e);
                        }
                        may_grow = false;
                        continue;
                    }
                }
            }
            if !wait {
                return Ok(None);
            }
            if !counted {
                self.waits.fetch_add(1, Ordering::Relaxed);
                counted = true;
            }
            let waited = started.elapsed();
            if waited >= self.slot_wait {
                return Err(Error::StagingExhausted {
                    waited_ms: waited.as_millis() as u64,
                    retained_bytes: retained::retained_bytes(),
                });
            }
            let step = self.recheck.min(self.slot_wait - waited);
            st.sleepers += 1;
            let (g, timeout) = self
                .returned
                .wait_timeout(st, step)
                .unwrap_or_else(|p| p.into_inner());
            st = g;
            st.sleepers -= 1;
            if timeout.timed_out() && retained::retained_bytes() > 0 {
                // Outside the lock: releasing returns slots to this arena. Non-blocking:
                // a stream that is still busy (or hung) is simply tried again later.
                drop(st);
                retained::release_finished(Duration::from_millis(1));
                st = self.lock();
            }
        }
    }

    /// Takes a returned slab back: on the free list, or freed if the cap was lowered.
    fn give_back(&self, slab: Slab) {
        let (excess, wake) = {
            let mut st = self.lock();
            let cap = self.max_slots.load(Ordering::Relaxed);
            let excess = if st.allocated > cap || self.closed.load(Ordering::SeqCst) {
                st.allocated -= 1;
                Some(slab)
            } else {
                st.free.push(slab);
                None
            };
            // Read under the lock a sleeper counts itself under before it sleeps: none
            // can be missed. A freed slab wakes one only if it left room under the cap
            // (a closed arena's).
            let room = excess.is_none() || st.allocated < cap;
            (excess, st.sleepers > 0 && room)
        };
        if wake {
            self.returned.notify_one();
        }
        if let Some(slab) = excess {
            let (ptr, device) = (slab.ptr, slab.device);
            drop(slab.event);
            // SAFETY: the slab's copies were proven complete (its lease's drop) and it is
            // on no list. On the reaper thread: this runs at the end of a transfer.
            unsafe { super::reaper::free_pinned_later(ptr, device) };
        }
    }

    /// Forgets a slab whose copies could not be proven complete: its memory is leaked
    /// (never freed or reused, since a copy may still touch it) and its place in the cap
    /// is given back, so the arena can allocate another.
    fn forget(&self, slab: Slab) {
        // A slab owns its memory only through this arena (it has no Drop): dropping it
        // here frees nothing, which is the point.
        drop(slab);
        self.release_place();
    }

    /// Gives a slot's place in the cap back (its slab is gone): a waiting lease may
    /// allocate one now, so one is woken.
    fn release_place(&self) {
        let sleepers = {
            let mut st = self.lock();
            st.allocated -= 1;
            st.sleepers > 0
        };
        if sleepers {
            self.returned.notify_one();
        }
    }
}

/// Waits for `ev`, a call's copies: in the driver, or for at most
/// [`Config::sync_wait`](crate::config::Config::sync_wait) when one is set, then
/// [`Error::SyncTimeout`] (also [`crate::wait_for_event`]).
pub(crate) fn wait_for(ev: &Event) -> Result<()> {
    let Some(limit) = waits::sync_wait() else {
        return ev.synchronize();
    };
    let started = Instant::now();
    if ev.done_within(limit)? {
        return Ok(());
    }
    Err(timed_out(started))
}

/// [`Error::SyncTimeout`] for a bounded wait that began at `started`.
fn timed_out(started: Instant) -> Error {
    Error::SyncTimeout {
        waited_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
    }
}

/// Frees slabs (each under the context of the device that allocated it).
fn free_slabs(slabs: Vec<Slab>) -> Result<()> {
    // SAFETY: free slabs: each lease dropped after its copies were proven complete
    // (SlotLease::drop), and none is on the free list any more, so nothing uses them.
    unsafe { super::reaper::free_all(slabs.into_iter().map(|s| (s.ptr, s.device))) }
}

impl Slab {
    fn alloc(ctx: &ContextGuard, len: usize) -> Result<Slab> {
        let ptr = driver::host_alloc(ctx, len)?;
        // SAFETY: a fresh allocation of `len` bytes that nothing else sees. Zeroing it
        // once makes every later `&mut [u8]` view point at initialised bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(Slab {
            ptr: HostPtr(ptr),
            len,
            device: ctx.device(),
            event: None,
            busy: false,
        })
    }
}

/// One slot, leased to one call. Returned to the arena on drop, which requires proof that
/// no copy still uses it: a [`Synced`] token given to [`SlotLease::mark_idle`] after the
/// stream was synchronised, or else the drop itself waits for the slot's event (and if
/// that wait fails, the slot is never reused).
pub(crate) struct SlotLease {
    /// `Some` until drop.
    slab: Option<Slab>,
    arena: Arc<PinnedArena>,
    /// The host copies filling the slot, when started with [`SlotLease::fill_start`] or
    /// [`SlotLease::fill_window_start`] and not yet waited for. Every other use of the slot
    /// waits for it first.
    filling: Option<Ticket>,
    /// Set when a host copy filling the slot panicked (a pinlane bug): the slot's bytes
    /// are not what the fill asked for, and every later use through this lease says so.
    fill_failed: Option<CopyPanicked>,
}

/// Proof that the copies a call queued on a stream have finished: made only by
/// synchronising the stream or seeing an event recorded on it complete (everything queued
/// before), or by seeing a call's end flag set ([`Synced::by_flag`]: only what was queued
/// before the flag's write, not what other code queued on the stream after it).
pub(crate) struct Synced<'a>(&'a Stream);

impl<'a> Synced<'a> {
    /// Synchronises `stream`: in the driver, or, with a
    /// [`Config::sync_wait`](crate::config::Config::sync_wait), by polling an event
    /// recorded now, for at most that long.
    ///
    /// # Errors
    /// The driver's error, or [`Error::SyncTimeout`]: the stream's copies are then not
    /// proven complete.
    pub(crate) fn synchronize(stream: &'a Stream) -> Result<Synced<'a>> {
        match waits::sync_wait() {
            None => stream.synchronize()?,
            Some(limit) => {
                let started = Instant::now();
                if !stream.done_within(limit)? {
                    return Err(timed_out(started));
                }
            }
        }
        Ok(Synced(stream))
    }

    /// The proof for the work queued on `stream` before the write of the end flag at
    /// `word` (queued by `InFlight::end_flag`), if the word is seen set within `spin`. It
    /// says nothing of work queued on the stream after the write (by a nested call in the
    /// caller's rebuild, say): not a proof for the retained registry.
    /// `None` when it is not, or when a test armed a fault of the driver's wait (feature
    /// `test-util`), which must fire there: the caller then waits in the driver, after
    /// which the write has landed.
    ///
    /// # Safety
    /// `word` is 4-byte aligned page-locked memory that stays allocated until the flag is
    /// seen or the stream is proven idle, and that only the queued write changes.
    pub(crate) unsafe fn by_flag(
        stream: &'a Stream,
        word: HostPtr<u32>,
        spin: Duration,
    ) -> Option<Synced<'a>> {
        if driver::flag::wait_fault_armed() {
            return None;
        }
        // SAFETY: aligned and allocated (the caller's obligation); only the device writes
        // it now.
        unsafe { driver::flag::spin_until(word.0, 1, spin) }.then_some(Synced(stream))
    }

    /// The proof for the work queued on `stream` before `done` was recorded there, if
    /// `done` has completed (asked here, without blocking).
    pub(crate) fn by_event(stream: &'a Stream, done: &crate::driver::Event) -> Option<Synced<'a>> {
        matches!(done.completed(), Ok(true)).then_some(Synced(stream))
    }

    /// The proof, if an event recorded on `stream` now completes within `limit` (polled,
    /// never blocking in the driver).
    pub(crate) fn within(stream: &'a Stream, limit: Duration) -> Option<Synced<'a>> {
        stream.idle_within(limit).then_some(Synced(stream))
    }
}

impl SlotLease {
    fn new(slab: Slab, arena: &Arc<PinnedArena>) -> SlotLease {
        SlotLease {
            slab: Some(slab),
            arena: arena.clone(),
            filling: None,
            fill_failed: None,
        }
    }

    /// Records that the slot's copies are complete: its last copies were queued on the
    /// stream `proof` synchronised (every use of a lease is on its call's one stream).
    pub(crate) fn mark_idle(&mut self, proof: &Synced) {
        let _ = proof.0;
        if let Some(slab) = &mut self.slab {
            slab.busy = false;
        }
    }

    fn slab(&mut self) -> &mut Slab {
        // `slab` is only taken in Drop.
        self.slab.as_mut().expect("slot lease used after drop")
    }

    /// Bytes in the slot.
    pub(crate) fn len(&self) -> usize {
        self.slab.as_ref().map_or(0, |s| s.len)
    }

    /// Waits for the slot's last copy, if it was not waited for yet (for at most
    /// [`Config::sync_wait`](crate::config::Config::sync_wait) when one is set).
    fn wait_idle(&mut self) -> Result<()> {
        let slab = self.slab();
        if slab.busy {
            if let Some(ev) = &slab.event {
                wait_for(ev)?;
            }
            slab.busy = false;
        }
        Ok(())
    }

    /// Whether the slot's last device copy is known to be finished, asked without blocking.
    ///
    /// # Errors
    /// The driver's error for the slot's event.
    pub(crate) fn idle_now(&mut self) -> Result<bool> {
        let slab = self.slab();
        if slab.busy {
            match &slab.event {
                Some(ev) if !ev.query()? => return Ok(false),
                _ => slab.busy = false,
            }
        }
        Ok(true)
    }

    /// Whether the host copies started by [`SlotLease::fill_start`] or
    /// [`SlotLease::fill_window_start`] are finished (true when none were started).
    pub(crate) fn fill_done(&self) -> bool {
        self.filling.as_ref().is_none_or(Ticket::is_done)
    }

    /// Takes part in the fill started by [`SlotLease::fill_start`] or
    /// [`SlotLease::fill_window_start`]: copies its pieces that no copy thread has taken
    /// yet.
    pub(crate) fn help_fill(&self) {
        if let Some(t) = &self.filling {
            t.help();
        }
    }

    /// Waits for host copies into the slot started by [`SlotLease::fill_start`] or
    /// [`SlotLease::fill_window_start`].
    ///
    /// # Errors
    /// [`Error::Internal`](crate::error::Error::Internal) if one of them panicked (a bug
    /// in pinlane), now and at every later use of the slot through this lease: its bytes
    /// are not what the fill asked for.
    pub(crate) fn settle(&mut self) -> Result<()> {
        if let Some(t) = self.filling.take() {
            if let Err(e) = t.wait() {
                self.fill_failed = Some(e);
            }
        }
        self.fill_failed.clone().map_or(Ok(()), |e| Err(e.into()))
    }

    /// The slot's bytes; waits first for the copies that last used it (device and host).
    pub(crate) fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.settle()?;
        self.wait_idle()?;
        let slab = self.slab();
        // SAFETY: `ptr` points to `len` initialised (zeroed at allocation) bytes owned by
        // this lease alone; no copy touches them any more (wait_idle above).
        Ok(unsafe { std::slice::from_raw_parts_mut(slab.ptr.0, slab.len) })
    }

    /// Starts copying each `(slot offset, bytes)` piece into the slot, in parallel on the
    /// [`CopyPool`], after waiting for the slot's previous device copy; returns without
    /// waiting for the host copies. Every later use of the slot (and its drop) waits for
    /// them. Pieces must be sorted by offset and must not overlap.
    ///
    /// # Safety
    /// Every piece's bytes stay alive and unchanged until the slot is next used, settled
    /// or dropped.
    pub(crate) unsafe fn fill_start<'a>(
        &mut self,
        pieces: impl Iterator<Item = (usize, &'a [u8])>,
        copy: &Arc<CopyPool>,
        stores: Stores,
    ) -> Result<()> {
        let buf = self.bytes_mut()?;
        let len = buf.len();
        let base = buf.as_mut_ptr();
        let mut end = 0;
        // The pieces' upper bound when it is a real one (Window::parts' is exact): no
        // more pieces than bytes of slot can be valid.
        let (least, most) = pieces.size_hint();
        let cap = most.filter(|&m| m <= len.max(least)).unwrap_or(least);
        let mut tasks = CopyTasks::with_capacity(cap);
        for (at, src) in pieces {
            // Sorted and disjoint: a piece starting inside the previous one is refused too.
            check_range("slot fill", at, src.len(), len)?;
            check_range("slot fill order", end, 0, at)?;
            end = at + src.len();
            tasks.push(CopyTask {
                src: src.as_ptr(),
                dst: base.wrapping_add(at),
                len: src.len(),
            });
        }
        // SAFETY: every destination is inside the slot (checked above) and they do not
        // overlap (sorted, checked above); the slot is this lease's alone, and every use of
        // it waits for the ticket first (settle), so nothing else touches those bytes until
        // the copies are done; the sources stay valid that long by the caller's contract,
        // and cannot overlap the slot, which is exclusively ours.
        self.filling = Some(unsafe { copy.submit(tasks, stores) });
        Ok(())
    }

    /// Starts filling the slot with bytes `start..start + len` of the `packed` layout (in
    /// parallel: [`CopyPool::submit_window`]), after waiting for the copies that last used
    /// the slot; the copy threads find each piece's sources themselves. Byte `start` of the
    /// layout lands at the slot's first byte; bytes between sources are left as they are.
    ///
    /// # Errors
    /// [`Error::Internal`](crate::error::Error::Internal) when `len` exceeds the slot; the
    /// driver's error for the slot's last copy.
    ///
    /// # Safety
    /// Every source of `packed` with bytes in the window stays readable and unchanged until
    /// the fill is settled (this lease's [`SlotLease::settle`], its next use of the slot,
    /// or its drop).
    pub(crate) unsafe fn fill_window_start(
        &mut self,
        packed: &Arc<Packed>,
        start: usize,
        len: usize,
        copy: &Arc<CopyPool>,
        stores: Stores,
    ) -> Result<()> {
        // The pieces' places are `start + i * piece`, up to `start + len`: never wrapping.
        check_range("slot fill window", start, len, usize::MAX)?;
        let buf = self.bytes_mut()?;
        check_range("slot fill", 0, len, buf.len())?;
        let dst = buf.as_mut_ptr();
        // SAFETY: `dst..dst + len` is inside the slot (checked above), which is this
        // lease's alone, and every use of it waits for the ticket first (settle), so
        // nothing else touches those bytes until the copies are done; the sources stay
        // valid that long by the caller's contract, and cannot overlap the slot, which is
        // exclusively ours.
        self.filling = Some(unsafe { copy.submit_window(packed, start, len, dst, stores) });
        Ok(())
    }

    /// Copies `(slot offset, region offset, bytes)` pieces from the slot into `region`, in
    /// parallel, after waiting for the D2H copies into the slot. Region ranges must be
    /// sorted and must not overlap.
    pub(crate) fn drain_into(
        &mut self,
        region: &mut HostRegion,
        pieces: &[(usize, usize, usize)],
        copy: &Arc<CopyPool>,
        stores: Stores,
    ) -> Result<()> {
        let slot_len = self.len();
        let src = self.bytes_mut()?.as_ptr();
        let dst = region.bytes_mut();
        let dst_len = dst.len();
        let dst = dst.as_mut_ptr();
        let mut end = 0;
        let mut tasks = CopyTasks::with_capacity(pieces.len());
        for &(from, to, n) in pieces {
            check_range("slot drain", from, n, slot_len)?;
            check_range("region", to, n, dst_len)?;
            check_range("region order", end, 0, to)?;
            end = to + n;
            tasks.push(CopyTask {
                src: src.wrapping_add(from),
                dst: dst.wrapping_add(to),
                len: n,
            });
        }
        // SAFETY: sources are inside the slot, whose D2H copies have completed (bytes_mut
        // waited) and which this lease owns; destinations are inside the region, which is
        // borrowed mutably for the whole call, and do not overlap (checked above).
        unsafe { copy.run(tasks, stores) }
    }

    /// Queues one copy of the slot's first `len` bytes to `dst` at `at`, then records the
    /// slot's event on `stream`.
    ///
    /// # Safety
    /// `dst` is usable in `stream`'s order (allocated on it, or its allocation ordered
    /// before) and is kept alive until the slot's event completes.
    pub(crate) unsafe fn h2d_window(
        &mut self,
        ctx: &ContextGuard,
        len: usize,
        dst: &DeviceAlloc,
        at: usize,
        stream: &Stream,
    ) -> Result<()> {
        check_range("h2d window slot", 0, len, self.len())?;
        check_range("h2d window", at, len, dst.nbytes())?;
        self.settle()?; // the host copies into the slot must be done before the DMA reads it
        let src = self.slab().ptr.0;
        // Busy before queueing: if the call fails after this, the slot is waited for.
        self.slab().busy = true;
        // SAFETY: source: `len` bytes of the slot (checked above), owned by this lease and
        // unchanged until its event completes (bytes_mut waits for it). Destination: inside
        // `dst` (checked above), alive and stream-ordered by the caller's obligation.
        unsafe { driver::memcpy_h2d_async(ctx, dst.addr(at), src, len, stream) }?;
        self.mark_used(stream)
    }

    /// Queues device work that reads the slot: waits for the host copies filling it,
    /// marks it busy, calls `queue` with the slot's address and length, then records the
    /// slot's event on `stream` (also when `queue` fails part way, so that the slot is
    /// waited for after whatever it queued).
    ///
    /// # Safety
    /// Everything `queue` queues is on `stream` and, of the slot, reads only the
    /// `addr..addr + len` it is given (by copies, or through the device's mapping of
    /// page-locked memory where [`driver::host_memory_mapped`]).
    pub(crate) unsafe fn queue_reads(
        &mut self,
        stream: &Stream,
        queue: impl FnOnce(*const u8, usize) -> Result<()>,
    ) -> Result<()> {
        self.settle()?; // the host copies into the slot must be done before a read
        let (ptr, len) = {
            let slab = self.slab();
            (slab.ptr.0.cast_const(), slab.len)
        };
        // Busy before queueing: if the call fails after this, the slot is waited for.
        self.slab().busy = true;
        let queued = queue(ptr, len);
        let marked = self.mark_used(stream);
        queued.and(marked)
    }

    /// Queues the gather kernel for `pieces` on `stream`. Up to [`driver::INLINE_MAX`] of
    /// them go in the launch's parameters: the slot is neither waited for nor used (the
    /// kernel never reads it). More are written into the slot as descriptors, which the
    /// kernel reads in place through its device mapping, and the slot's event is recorded
    /// after it. Every piece's destination must lie inside `dst`.
    ///
    /// # Safety
    /// 1. `stream`'s device maps page-locked host memory
    ///    ([`driver::host_memory_mapped`]), so the kernel can read the slot.
    /// 2. Every piece's source is memory a kernel on that device may read (device memory,
    ///    or page-locked host memory mapped for it) whose producing work is ordered before
    ///    this point of `stream`, alive and unchanged until the kernel has run (the slot's
    ///    event, or the stream's next proof of completion, says so).
    /// 3. `dst` is usable in `stream`'s order (allocated on it, or its allocation ordered
    ///    before) and is kept alive until the kernel has run.
    pub(crate) unsafe fn gather_from_slot(
        &mut self,
        ctx: &ContextGuard,
        kernel: GatherKernel,
        pieces: impl Iterator<Item = GatherPiece>,
        dst: &DeviceAlloc,
        stream: &Stream,
    ) -> Result<()> {
        // Checked here: the kernel writes device memory unchecked.
        let checked = |p: &GatherPiece| -> Result<()> {
            let (off, len) = (p.dst_off as usize, p.len as usize);
            let span = usize::try_from(p.zeros)
                .ok()
                .and_then(|z| len.checked_add(z))
                .ok_or_else(|| crate::error::Error::Internal {
                    op: "gather",
                    reason: format!("piece of {len} + {} bytes", p.zeros),
                })?;
            check_range("gather destination", off, span, dst.nbytes())
        };
        let mut local = [<GatherPiece as bytemuck::Zeroable>::zeroed(); driver::INLINE_MAX];
        let mut pieces = pieces.peekable();
        let mut n = 0;
        while n < local.len() {
            let Some(p) = pieces.next() else { break };
            checked(&p)?;
            local[n] = p;
            n += 1;
        }
        if pieces.peek().is_none() {
            // SAFETY: the descriptors go in the launch's parameters, so the slot is not
            // read (obligation 1 is not needed); each destination lies inside `dst`
            // (checked above), which obligation 3 keeps alive and stream-ordered; the
            // sources are obligation 2.
            return unsafe {
                driver::launch_gather(ctx, kernel, &local[..n], 0, dst.addr(0), stream)
            };
        }
        let buf = self.bytes_mut()?;
        let whole = buf.len() - buf.len() % std::mem::size_of::<GatherPiece>();
        let descs: &mut [GatherPiece] =
            bytemuck::try_cast_slice_mut(&mut buf[..whole]).map_err(|e| {
                crate::error::Error::Internal {
                    op: "gather",
                    reason: format!("staging slot: {e}"),
                }
            })?;
        let capacity = descs.len();
        if capacity < n {
            return Err(crate::error::Error::Internal {
                op: "gather",
                reason: format!("more than {capacity} pieces do not fit the staging slot"),
            });
        }
        descs[..n].copy_from_slice(&local[..n]);
        for p in pieces {
            checked(&p)?;
            let Some(d) = descs.get_mut(n) else {
                return Err(crate::error::Error::Internal {
                    op: "gather",
                    reason: format!("more than {capacity} pieces do not fit the staging slot"),
                });
            };
            *d = p;
            n += 1;
        }
        let written: *const GatherPiece = descs.as_ptr();
        let at = self.slab().ptr.0 as u64;
        // Busy before queueing: if the call fails after this, the slot is waited for.
        self.slab().busy = true;
        // SAFETY: the first `n` descriptors of the slot, written above; this lease owns
        // the slot, and nothing writes it while `&mut self` is held here.
        let descs = unsafe { std::slice::from_raw_parts(written, n) };
        // SAFETY: the descriptors are in the slot, which this lease owns and nothing
        // changes until its event completes (bytes_mut waits for it), and which the kernel
        // can read at its host address (obligation 1), there being more than fit the
        // launch; each destination lies inside `dst` (checked above), which obligation 3
        // keeps alive and stream-ordered; the sources are obligation 2.
        unsafe { driver::launch_gather(ctx, kernel, descs, at, dst.addr(0), stream) }?;
        self.mark_used(stream)
    }

    /// Queues copies of device ranges into the slot, each `(slot offset, source view,
    /// offset in the view, bytes)`, then records the slot's event on `stream`.
    ///
    /// # Safety
    /// Each source view's producing work is ordered before this point of `stream`, and the
    /// view is kept alive until the slot's event completes.
    pub(crate) unsafe fn d2h_window<'v>(
        &mut self,
        ctx: &ContextGuard,
        parts: impl Iterator<Item = (usize, &'v DeviceView, usize, usize)>,
        stream: &Stream,
    ) -> Result<()> {
        self.settle()?;
        self.wait_idle()?;
        let (base, len) = {
            let s = self.slab();
            (s.ptr.0, s.len)
        };
        for (at, view, from, n) in parts {
            check_range("d2h window slot", at, n, len)?;
            check_range("d2h window source", from, n, view.nbytes())?;
            let Some(src) = view.addr(from) else {
                continue; // an empty view: nothing to copy (n is 0, checked above)
            };
            // Mark busy before queueing: if a later part fails, the earlier ones may still
            // be writing, and the slot must be waited for before reuse.
            self.slab().busy = true;
            // SAFETY: `at + n <= len` (checked above), so the destination is inside the
            // slot, which this lease owns and nothing reads until its event completes;
            // the source is the caller's obligation.
            unsafe { driver::memcpy_d2h_async(ctx, base.add(at), src, n, stream) }?;
        }
        self.mark_used(stream)
    }

    fn mark_used(&mut self, stream: &Stream) -> Result<()> {
        let slab = self.slab();
        // The copy is queued: from here until the event is waited for, the slot is busy.
        slab.busy = true;
        let reuse = matches!(&slab.event, Some(ev) if ev.device() == stream.device());
        if !reuse {
            slab.event = Some(Event::new(stream.device())?);
        }
        // The branch above guarantees Some.
        let ev = slab.event.as_ref().expect("event set above");
        ev.record(stream)
    }
}

/// A slot whose copy outlived its lease's bounded wait, held in the retained registry
/// until its event completes; dropping it (the proof given) returns the slot.
struct SlabBack {
    slab: Option<Slab>,
    arena: Arc<PinnedArena>,
}

impl Drop for SlabBack {
    fn drop(&mut self) {
        if let Some(mut slab) = self.slab.take() {
            slab.busy = false;
            self.arena.give_back(slab);
        }
    }
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        // Host copies into the slot finish before it can go back to the arena (a failed
        // one was reported to the call that made it).
        let _ = self.settle();
        let Some(mut slab) = self.slab.take() else {
            return;
        };
        if slab.busy {
            // No proof of completion was given: wait for the slot's event, within the drop
            // bound. Past it, the slot waits in the retained registry for that event and
            // comes back to the arena then. If the wait fails, nobody knows whether a copy
            // still touches the slot; it is never reused.
            let ev = slab.event.clone();
            let waited = ev
                .as_ref()
                .map_or(Ok(true), |e| e.done_within(waits::drop_wait()));
            match waited {
                Ok(true) => slab.busy = false,
                Ok(false) => {
                    let bytes = slab.len;
                    let back = SlabBack {
                        slab: Some(slab),
                        arena: self.arena.clone(),
                    };
                    retained::retain_until(ev.into_iter().collect(), Box::new(back), bytes);
                    return;
                }
                Err(e) => {
                    driver::deferred::record(slab.device, e);
                    self.arena.forget(slab);
                    return;
                }
            }
        }
        #[cfg(feature = "sim")]
        if crate::driver::sim::is_enabled() {
            // On the simulated device, a recycled slot is poisoned: a copy still reading
            // it, or a caller reading it before its copy, sees wrong bytes.
            // SAFETY: the slab owns `len` bytes at `ptr`, and no copy touches them any more
            // (proven above).
            unsafe {
                std::ptr::write_bytes(slab.ptr.0, crate::driver::sim::POISON_RECYCLED, slab.len)
            };
        }
        self.arena.give_back(slab);
    }
}
