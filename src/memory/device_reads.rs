//! Device allocations that a non-blocking D2H call's copies may still read, and how a
//! copy into them is ordered after those reads.
//!
//! `transfer_tensor_d2h_async` returns once its copies are queued on pinlane's stream;
//! they read the batch's device tensors until its handle's event completes. A copy into
//! existing tensors (`transfer_tensor_h2d_into`, `H2dPairs`) on another stream, queued
//! meanwhile with one of those tensors as its destination, could write it first: the D2H
//! would return the new bytes, or a mix. So the call's handle marks each allocation it
//! reads with its event ([`DeviceReads::ordered_by`], once the event is recorded after
//! every copy), a copy into one first makes its stream wait for the events there
//! ([`reads_before_write`]: on the device, no host wait), and the call's completion ends
//! the marks ([`DeviceReads::done`]). A completion that cannot be proven keeps them with
//! what its copies use in the retained registry, until a later synchronisation of the
//! stream proves those copies done: a copy into the memory meanwhile still waits for the
//! event.
//!
//! Blocking D2H calls mark nothing: their copies are done when they return. Cost: a copy
//! into existing tensors reads the process-wide count of marked allocations ([`READ`])
//! and looks at its destinations' allocations only while some allocation is marked; a
//! non-blocking D2H call finds its sources' distinct allocations (a sort of their
//! addresses) and takes each one's lock twice.

use super::filling::Count;
use super::{DeviceAlloc, DeviceView, Storage, UsesAfter};
use crate::driver::Event;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Device allocations with a read mark in the process. Only read-modify-writes change
/// it, so a read that sees 0 (with `Acquire`) has seen every earlier end (`Release`).
static READ: Count = Count(AtomicUsize::new(0));

/// The events of the non-blocking D2H calls that may still read one allocation.
#[derive(Default)]
pub(super) struct Reads(Mutex<Vec<Event>>);

impl Reads {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Event>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A call whose copies read the allocation until `done` completes.
    fn add(&self, done: &Event) {
        let mut v = self.lock();
        if v.is_empty() {
            READ.0.fetch_add(1, Ordering::AcqRel);
        }
        v.push(done.clone());
    }

    /// That call's copies are proven done.
    fn end(&self, done: &Event) {
        let mut v = self.lock();
        let before = v.len();
        v.retain(|e| e.as_raw() != done.as_raw());
        if before > 0 && v.is_empty() {
            READ.0.fetch_sub(1, Ordering::Release);
        }
    }

    /// Adds the events not in `out` yet.
    fn events_into(&self, out: &mut UsesAfter) {
        self.lock().iter().for_each(|e| out.add(e));
    }

    /// The allocation is released with marks left (their calls never proven done).
    pub(super) fn dropped(&mut self) {
        let v = self.0.get_mut().unwrap_or_else(|p| p.into_inner());
        if !v.is_empty() {
            READ.0.fetch_sub(1, Ordering::Release);
        }
    }
}

/// The distinct allocations one non-blocking D2H call reads, marked with its event once
/// it is recorded after every copy.
pub(crate) struct DeviceReads {
    allocs: Vec<Arc<DeviceAlloc>>,
    done: Option<Event>,
}

impl DeviceReads {
    /// The allocations of `views` (empty views have none), each once.
    pub(crate) fn of(views: &[&DeviceView]) -> DeviceReads {
        let mut allocs: Vec<Arc<DeviceAlloc>> =
            views.iter().filter_map(|v| v.alloc().cloned()).collect();
        // A batch's tensors usually share one allocation: consecutive ones first, then
        // the rest by address.
        allocs.dedup_by(|a, b| Arc::ptr_eq(a, b));
        if allocs.len() > 1 {
            allocs.sort_unstable_by_key(|a| Arc::as_ptr(a) as usize);
            allocs.dedup_by(|a, b| Arc::ptr_eq(a, b));
        }
        DeviceReads { allocs, done: None }
    }

    /// Every copy that reads the allocations is queued before `done`: a copy into them
    /// waits for it from now on.
    pub(crate) fn ordered_by(&mut self, done: &Event) {
        for a in &self.allocs {
            a.reads().add(done);
        }
        self.done = Some(done.clone());
    }

    /// The copies are proven done: the marks end. (Dropped without this or
    /// [`DeviceReads::until_released`], an unproven call's marks stay until their
    /// allocations are released.)
    pub(crate) fn done(mut self) {
        self.end();
    }

    fn end(&mut self) {
        if let Some(done) = self.done.take() {
            for a in &self.allocs {
                a.reads().end(&done);
            }
        }
    }

    /// The call's completion was not proven: its owners go to the retained registry, and
    /// the marks with them, to end when the entry is released (a later synchronisation of
    /// the stream, which proves the copies done), not stay (with the process-wide count
    /// above 0, and every copy into existing tensors asking its destinations) until the
    /// allocations are freed.
    pub(crate) fn until_released(self) -> ReadsUntilReleased {
        ReadsUntilReleased(self)
    }
}

/// [`DeviceReads`] kept in a retained entry: the marks end when it drops, which the
/// registry does only once the copies are proven done.
pub(crate) struct ReadsUntilReleased(DeviceReads);

impl Drop for ReadsUntilReleased {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// The events that copies writing `storages` (destinations of a copy into existing
/// tensors) must wait for: those of non-blocking D2H calls that may still read them. One
/// load while no allocation is marked.
pub(crate) fn reads_before_write<'a>(storages: impl IntoIterator<Item = &'a Storage>) -> UsesAfter {
    let mut after = UsesAfter(Vec::new());
    if READ.0.load(Ordering::Acquire) == 0 {
        return after;
    }
    for s in storages {
        if let Storage::Device(v) = s {
            if let Some(a) = v.alloc() {
                a.reads().events_into(&mut after);
            }
        }
    }
    after
}
