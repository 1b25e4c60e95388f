//! Whether an H2D call's copies may still be writing a device allocation (its batch's
//! outputs), and how a use of it is then ordered after them.
//!
//! An H2D call's outputs exist while the copies into them run: its `Batch::rebuild` and
//! the `while_copying` of `transfer_tensor_h2d_overlapping` are handed them, and may keep
//! clones. So the batch's allocation is marked *filling* before any view of it exists
//! ([`DeviceFill::start`]), and every use of a view (a lent pointer, a DLPack export, a
//! transfer from or into it) is refused with [`Error::BytesInFlight`] while it is. The
//! mark ends in one of three ways:
//!
//! * **Done**: with the proof that every copy into it was queued and is done
//!   ([`DeviceFill::done`]: a blocking call's wait, a non-blocking call's completion).
//! * **Ordered**: a non-blocking call returns before its copies are done, with every copy
//!   queued before its handle's event ([`DeviceFill::ordered_by`]). A use on a stream then
//!   makes that stream wait for the event (on the device: no host wait) before it goes
//!   on; a use without a stream (`to_dlpack`) asks whether the event has completed, and
//!   is refused until it has. The call's completion ends this as *done*.
//! * **Never**: a call that failed, or whose copies were not all queued, is never proven
//!   done: its bytes may be partly unwritten, and a clone kept from it stays refused until
//!   the allocation drops (an ordered mark whose completion fails goes back to filling).
//!
//! Cost: a use reads the process-wide count of marked allocations ([`MARKED`])
//! and looks at the allocation only while some allocation is marked. A blocking call
//! marks and ends once, two atomic swaps and two counts; only a non-blocking call's
//! ordered mark takes the lock (to keep and then drop the event).

use super::arena::Synced;
use super::filling::Count;
use super::DeviceAlloc;
use crate::driver::{Event, Stream};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Device allocations marked in the process. Only read-modify-writes change it, so a read
/// that sees 0 (with `Acquire`) has seen every earlier end of a mark (`Release`).
static MARKED: Count = Count(AtomicUsize::new(0));

/// Whether any device allocation is marked (a use must then ask the allocation).
pub(super) fn any() -> bool {
    MARKED.0.load(Ordering::Acquire) != 0
}

/// A device allocation was marked: counted before any view of it exists.
fn count_mark() {
    MARKED.0.fetch_add(1, Ordering::AcqRel);
}

/// A device allocation's mark ended (proven done, or the allocation dropped).
pub(super) fn count_end() {
    let before = MARKED.0.fetch_sub(1, Ordering::Release);
    debug_assert!(before > 0, "a device mark ended twice");
}

/// No copy may still write the allocation (never marked, or proven done).
const CLEAR: u8 = 0;
/// Copies into it may run, and nothing orders a use after them.
const FILLING: u8 = 1;
/// Copies into it may run, all queued before the event in `after`.
const ORDERED: u8 = 2;

/// A device allocation's mark (see the module's docs).
pub(crate) struct DeviceGate {
    /// `CLEAR`, `FILLING` or `ORDERED`. `ORDERED` is entered with `after` locked and set,
    /// so whoever reads it under the lock finds the event; every way out of a mark is one
    /// atomic exchange, and only the one that leaves it counts the end.
    state: AtomicU8,
    /// While `ORDERED`: the event recorded after every copy into the allocation.
    after: Mutex<Option<Event>>,
}

impl DeviceGate {
    pub(super) fn new() -> DeviceGate {
        DeviceGate {
            state: AtomicU8::new(CLEAR),
            after: Mutex::new(None),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Option<Event>> {
        self.after.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a use may go on now (`Ok(None)`), after the returned event (`Ok(Some)`),
    /// or not at all.
    pub(super) fn pending(&self, op: &'static str) -> Result<Option<Event>> {
        // The process-wide count first: one load while no allocation is marked.
        if !any() {
            return Ok(None);
        }
        match self.state.load(Ordering::Acquire) {
            CLEAR => Ok(None),
            ORDERED => {
                let after = self.lock();
                // Read again under the lock: the mark may have ended since.
                match (self.state.load(Ordering::Acquire), after.as_ref()) {
                    (CLEAR, _) => Ok(None),
                    (ORDERED, Some(e)) => Ok(Some(e.clone())),
                    _ => Err(Error::BytesInFlight { op }),
                }
            }
            _ => Err(Error::BytesInFlight { op }),
        }
    }

    /// `Ok` when the allocation may be used now, by work no stream orders (an export
    /// without a stream): not marked, or ordered after an event that has completed (the
    /// mark then ends).
    ///
    /// # Errors
    /// [`Error::BytesInFlight`] naming `op`; the driver's error asking the event.
    pub(super) fn check(&self, op: &'static str) -> Result<()> {
        let Some(after) = self.pending(op)? else {
            return Ok(());
        };
        if !after.completed()? {
            return Err(Error::BytesInFlight { op });
        }
        self.end_if_ordered();
        Ok(())
    }

    /// `Ok` when the allocation may be used by work queued on `stream` from now: not
    /// marked, or ordered after an event, which `stream` is made to wait for.
    ///
    /// # Errors
    /// [`Error::BytesInFlight`] naming `op`; the driver's error making `stream` wait.
    pub(super) fn order_on(&self, stream: &Stream, op: &'static str) -> Result<()> {
        match self.pending(op)? {
            Some(after) => after.wait_on(stream),
            None => Ok(()),
        }
    }

    /// Ends an ordered mark whose event has completed (asked by [`DeviceGate::check`]).
    fn end_if_ordered(&self) {
        let ended =
            self.state
                .compare_exchange(ORDERED, CLEAR, Ordering::AcqRel, Ordering::Acquire);
        if ended.is_ok() {
            count_end();
            self.drop_event();
        }
    }

    /// Drops the event an ordered mark kept (outside the lock: it may be its last handle).
    fn drop_event(&self) {
        let event = self.lock().take();
        drop(event);
    }

    /// Whether the allocation is marked: for its drop, which ends the mark in the count.
    pub(super) fn marked(&mut self) -> bool {
        *self.state.get_mut() != CLEAR
    }
}

/// One H2D call's mark of its batch's allocation, from [`DeviceFill::start`] to
/// [`DeviceFill::done`]. Dropped without it (the copies never proven done), the
/// allocation stays refused until it drops, an ordered mark included.
pub(crate) struct DeviceFill {
    alloc: Arc<DeviceAlloc>,
    /// [`DeviceFill::done`] has run: the drop has nothing to undo.
    ended: bool,
}

impl DeviceFill {
    /// Marks `alloc` as being written by a call's copies. Call it before any view of it
    /// exists, once: the allocation is the call's own, new.
    pub(crate) fn start(alloc: &Arc<DeviceAlloc>) -> DeviceFill {
        // Counted before the mark, both before any view exists: whoever is handed a view
        // sees the count and the mark.
        count_mark();
        if alloc.gate().state.swap(FILLING, Ordering::AcqRel) != CLEAR {
            count_end(); // marked already (not a new allocation): one count
        }
        DeviceFill {
            alloc: alloc.clone(),
            ended: false,
        }
    }

    /// Every copy into the allocation was queued before `done` was recorded: uses from
    /// now are ordered after `done` ([`DeviceGate::order_on`]) until the copies are proven
    /// done. For a non-blocking call, as it returns.
    pub(crate) fn ordered_by(&self, done: &Event) {
        let gate = self.alloc.gate();
        let mut after = gate.lock();
        *after = Some(done.clone());
        let ordered =
            gate.state
                .compare_exchange(FILLING, ORDERED, Ordering::AcqRel, Ordering::Acquire);
        if ordered.is_err() {
            after.take(); // not filling (cannot be: the mark is this call's)
        }
    }

    /// The copies into the allocation are proven done (`proof`), all of them queued: every
    /// use is allowed from now.
    pub(crate) fn done(mut self, proof: &Synced) {
        let _ = proof;
        self.ended = true;
        let gate = self.alloc.gate();
        match gate.state.swap(CLEAR, Ordering::AcqRel) {
            CLEAR => {} // an ordered mark a use saw completed ended it
            FILLING => count_end(),
            _ => {
                count_end();
                gate.drop_event();
            }
        }
    }
}

impl Drop for DeviceFill {
    /// Without [`DeviceFill::done`]: the copies were never proven done. An ordered mark
    /// goes back to refusing every use (the event may stand after failed copies).
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let gate = self.alloc.gate();
        let back =
            gate.state
                .compare_exchange(ORDERED, FILLING, Ordering::AcqRel, Ordering::Acquire);
        if back.is_ok() {
            gate.drop_event();
        }
    }
}
