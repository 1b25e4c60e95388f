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

use super::copier::{Stores, Ticket};
use super::{check_range, CopyPool, CopyTask, DeviceAlloc, DeviceView, HostRegion};
use crate::driver::{self, ContextGuard, Event, Handle, Stream};
use crate::error::{Error, Result};
use std::sync::{Condvar, Mutex, OnceLock};

/// Sizes of the global arena. Set once, before the first transfer, with
/// [`PinnedArena::configure`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArenaConfig {
    /// Bytes per staging slot (default 8 MiB: large enough for the link's full rate,
    /// small enough that the first copy starts soon and a 256 MiB batch pipelines well).
    pub slot_bytes: usize,
    /// Most page-locked bytes the arena may hold, all slots together (default 128 MiB).
    /// Rounded down to whole slots, and at least one slot.
    pub max_bytes: usize,
}

impl Default for ArenaConfig {
    /// 8 MiB slots, 128 MiB in all; `PINLANE_SLOT_BYTES` and `PINLANE_ARENA_BYTES`
    /// override them.
    fn default() -> Self {
        ArenaConfig {
            slot_bytes: crate::env_knob("PINLANE_SLOT_BYTES")
                .unwrap_or(8 << 20)
                .max(4096),
            max_bytes: crate::env_knob("PINLANE_ARENA_BYTES").unwrap_or(128 << 20),
        }
    }
}

/// The process-wide pool of page-locked staging slots.
///
/// ```
/// use pinlane::memory::{ArenaConfig, PinnedArena};
/// let arena = PinnedArena::global();
/// assert!(arena.config().max_bytes >= arena.config().slot_bytes);
/// assert!(arena.held_bytes() <= arena.config().max_bytes);
/// ```
pub struct PinnedArena {
    config: ArenaConfig,
    max_slots: usize,
    state: Mutex<ArenaState>,
    /// Signalled when a slot goes back on the free list.
    returned: Condvar,
}

struct ArenaState {
    free: Vec<Slab>,
    /// Slots allocated so far (free or leased); never above `max_slots`.
    allocated: usize,
}

/// One page-locked slot. `event` is recorded after the last copy queued on it; `busy`
/// says that event has not been waited for yet.
struct Slab {
    ptr: Handle<*mut u8>,
    len: usize,
    event: Option<Event>,
    busy: bool,
}

static CONFIG: OnceLock<ArenaConfig> = OnceLock::new();
static GLOBAL: OnceLock<PinnedArena> = OnceLock::new();

impl PinnedArena {
    /// Sets the global arena's sizes. Only before its first use; later calls with another
    /// configuration are an [`Error::InvalidOption`].
    ///
    /// ```
    /// use pinlane::memory::{ArenaConfig, PinnedArena};
    /// let cfg = ArenaConfig { slot_bytes: 8 << 20, max_bytes: 64 << 20 };
    /// PinnedArena::configure(cfg).unwrap();
    /// assert_eq!(PinnedArena::global().config(), cfg);
    /// ```
    pub fn configure(config: ArenaConfig) -> Result<()> {
        if config.slot_bytes == 0 {
            return Err(Error::InvalidOption {
                name: "slot_bytes",
                reason: "must be above 0".into(),
            });
        }
        let set = *CONFIG.get_or_init(|| config);
        if set != config {
            return Err(Error::InvalidOption {
                name: "ArenaConfig",
                reason: format!("the arena is already configured as {set:?}"),
            });
        }
        Ok(())
    }

    /// The global arena (configured with [`ArenaConfig::default`] unless
    /// [`PinnedArena::configure`] came first).
    pub fn global() -> &'static PinnedArena {
        GLOBAL.get_or_init(|| {
            let config = *CONFIG.get_or_init(ArenaConfig::default);
            PinnedArena {
                config,
                max_slots: (config.max_bytes / config.slot_bytes).max(1),
                state: Mutex::new(ArenaState {
                    free: Vec::new(),
                    allocated: 0,
                }),
                returned: Condvar::new(),
            }
        })
    }

    /// The sizes in force.
    pub fn config(&self) -> ArenaConfig {
        self.config
    }

    /// Page-locked bytes held by the arena now (allocated slots, free or leased).
    pub fn held_bytes(&self) -> usize {
        self.lock().allocated * self.config.slot_bytes
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ArenaState> {
        // A poisoned lock only means a panic elsewhere; the free list is still coherent
        // (every mutation is a single push/pop or counter change).
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Leases a slot. With `wait`, blocks until one is free when all are leased; without,
    /// returns `None` then.
    pub(crate) fn lease(
        &'static self,
        ctx: &ContextGuard,
        wait: bool,
    ) -> Result<Option<SlotLease>> {
        let mut st = self.lock();
        loop {
            if let Some(slab) = st.free.pop() {
                return Ok(Some(SlotLease {
                    slab: Some(slab),
                    arena: self,
                    filling: None,
                }));
            }
            if st.allocated < self.max_slots {
                st.allocated += 1;
                drop(st);
                return match Slab::alloc(ctx, self.config.slot_bytes) {
                    Ok(slab) => Ok(Some(SlotLease {
                        slab: Some(slab),
                        arena: self,
                        filling: None,
                    })),
                    Err(e) => {
                        self.lock().allocated -= 1;
                        Err(e)
                    }
                };
            }
            if !wait {
                return Ok(None);
            }
            st = self.returned.wait(st).unwrap_or_else(|p| p.into_inner());
        }
    }
}

impl Slab {
    fn alloc(ctx: &ContextGuard, len: usize) -> Result<Slab> {
        let ptr = driver::host_alloc(ctx, len)?;
        // SAFETY: a fresh allocation of `len` bytes that nothing else sees. Zeroing it
        // once makes every later `&mut [u8]` view point at initialised bytes.
        unsafe { std::ptr::write_bytes(ptr, 0, len) };
        Ok(Slab {
            ptr: Handle(ptr),
            len,
            event: None,
            busy: false,
        })
    }
}

/// One slot, leased to one call. Returned to the arena on drop, which the engine lets
/// happen only after the slot's copies are proven complete (see the memory module docs).
pub(crate) struct SlotLease {
    /// `Some` until drop.
    slab: Option<Slab>,
    arena: &'static PinnedArena,
    /// The host copies filling the slot, when started with [`SlotLease::fill_start`] and
    /// not yet waited for. Every other use of the slot waits for it first.
    filling: Option<Ticket>,
}

impl SlotLease {
    fn slab(&mut self) -> &mut Slab {
        // `slab` is only taken in Drop.
        self.slab.as_mut().expect("slot lease used after drop")
    }

    /// Bytes in the slot.
    pub(crate) fn len(&self) -> usize {
        self.slab.as_ref().map_or(0, |s| s.len)
    }

    /// Waits for the slot's last copy, if it was not waited for yet.
    fn wait_idle(&mut self) -> Result<()> {
        let slab = self.slab();
        if slab.busy {
            if let Some(ev) = &slab.event {
                ev.synchronize()?;
            }
            slab.busy = false;
        }
        Ok(())
    }

    /// Waits for host copies into the slot started by [`SlotLease::fill_start`].
    pub(crate) fn settle(&mut self) {
        if let Some(t) = self.filling.take() {
            t.wait();
        }
    }

    /// The slot's bytes; waits first for the copies that last used it (device and host).
    pub(crate) fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.settle();
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
    pub(crate) unsafe fn fill_start(
        &mut self,
        pieces: &[(usize, &[u8])],
        stores: Stores,
    ) -> Result<()> {
        let buf = self.bytes_mut()?;
        let len = buf.len();
        let base = buf.as_mut_ptr();
        let mut end = 0;
        let mut tasks = Vec::with_capacity(pieces.len());
        for &(at, src) in pieces {
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
        self.filling = Some(unsafe {
            CopyPool::global().submit(&tasks, stores.or_env("PINLANE_FILL_STORES"))
        });
        Ok(())
    }

    /// Copies `(slot offset, region offset, bytes)` pieces from the slot into `region`, in
    /// parallel, after waiting for the D2H copies into the slot. Region ranges must be
    /// sorted and must not overlap.
    pub(crate) fn drain_into(
        &mut self,
        region: &mut HostRegion,
        pieces: &[(usize, usize, usize)],
    ) -> Result<()> {
        let slot_len = self.len();
        let src = self.bytes_mut()?.as_ptr();
        let dst = region.bytes_mut();
        let dst_len = dst.len();
        let dst = dst.as_mut_ptr();
        let mut end = 0;
        let mut tasks = Vec::with_capacity(pieces.len());
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
        unsafe { CopyPool::global().run(&tasks, drain_stores()) };
        Ok(())
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
        self.settle(); // the host copies into the slot must be done before the DMA reads it
        let src = self.slab().ptr.0;
        // Busy before queueing: if the call fails after this, the slot is waited for.
        self.slab().busy = true;
        // SAFETY: source: `len` bytes of the slot (checked above), owned by this lease and
        // unchanged until its event completes (bytes_mut waits for it). Destination: inside
        // `dst` (checked above), alive and stream-ordered by the caller's obligation.
        unsafe { driver::memcpy_h2d_async(ctx, dst.addr(at), src, len, stream) }?;
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
        self.settle();
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

/// Stores for draining slots into outputs (D2H): streaming by default,
/// `PINLANE_DRAIN_STORES` overrides.
fn drain_stores() -> Stores {
    static S: OnceLock<Stores> = OnceLock::new();
    *S.get_or_init(|| Stores::Streaming.or_env("PINLANE_DRAIN_STORES"))
}

impl Drop for SlotLease {
    fn drop(&mut self) {
        // Host copies into the slot finish before it can go back to the arena.
        self.settle();
        if let Some(mut slab) = self.slab.take() {
            // Callers drop a lease only after its copies completed (module docs), so the
            // event needs no waiting; clear the flag so the next lease does not wait.
            slab.busy = false;
            if crate::driver::sim::is_enabled() {
                // On the simulated device, a recycled slot is poisoned: a copy still
                // reading it, or a caller reading it before its copy, sees wrong bytes.
                // SAFETY: the slab owns `len` bytes at `ptr`, and no copy touches them
                // any more (the lease's copies completed, see above).
                unsafe {
                    std::ptr::write_bytes(slab.ptr.0, crate::driver::sim::POISON_RECYCLED, slab.len)
                };
            }
            self.arena.lock().free.push(slab);
            self.arena.returned.notify_one();
        }
    }
}
