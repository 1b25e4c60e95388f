//! The lead of an H2D batch: its first pageable tensors copied into a staging slot by the
//! copy threads while the calling thread is still walking the rest of the batch.
//!
//! A batch of many small tensors spends tens of microseconds in its walk (1000 tensors
//! read cold: 16 to 18 us on the H200's host, session 58) before its staging fill could
//! start, and the fill and the window's copy then come after it. But the tensors before
//! the batch's first page-locked or device tensor are staged first, at the front of the
//! layout and in visit order (`h2d::route`, `plan::pack`), so each one's place is known
//! as soon as it is seen; and the front [`plan::lead_bytes`] of the staged region are in
//! its first window whatever the batch's size. So, as the walk goes on, every [`CHUNK`]
//! leading tensors inside those bytes are handed to the copy threads
//! ([`SlotLease::fill_ahead`]); the call later fills the rest of the first window after
//! them (`SlotLease::fill_window_rest`). A batch with fewer leading tensors starts nothing
//! early, and its call is as before.

use super::plan;
use crate::driver::ContextGuard;
use crate::error::{Error, Result};
use crate::memory::{SlotLease, Stores, DEVICE_ALIGN};
use crate::tensor::{Storage, Tensor};

/// Leading tensors handed to the copy threads at a time: enough that a hand-out (one job
/// queued, a copy thread woken) is worth it, few enough that the first starts early in
/// the walk (1000 x 1 KiB: seven hand-outs, the last 104 tensors filled with the window).
pub(super) const CHUNK: usize = 128;

/// The lead of a batch being walked: [`Lead::see`] each tensor in visit order, then
/// [`Lead::finish`].
pub(super) struct Lead<'c> {
    rt: &'c crate::runtime::Runtime,
    ctx: &'c ContextGuard,
    /// The bytes at the front of the layout that may be filled ahead.
    limit: usize,
    /// Still in the lead: every tensor seen so far is pageable, and in `limit`.
    open: bool,
    /// Leading tensors seen, and the end of their layout.
    seen: usize,
    end: usize,
    /// Leading tensors handed to the copy threads, and the end of their layout.
    handed: usize,
    handed_end: usize,
    /// The slot they are copied into, leased at the first hand-out.
    lease: Option<SlotLease>,
    /// The first error of a hand-out, which fails the call.
    failed: Option<Error>,
}

/// What [`Lead::finish`] hands the call: the slot its first window is filled in, whose
/// bytes before `end` (the layout of the batch's first `tensors` tensors) are being
/// filled already.
pub(super) struct LeadFill {
    pub lease: SlotLease,
    pub tensors: usize,
    pub end: usize,
}

impl<'c> Lead<'c> {
    pub(super) fn new(rt: &'c crate::runtime::Runtime, ctx: &'c ContextGuard) -> Lead<'c> {
        Lead {
            rt,
            ctx,
            limit: plan::lead_bytes(rt.arena.slot_bytes()),
            open: true,
            seen: 0,
            end: 0,
            handed: 0,
            handed_end: 0,
            lease: None,
            failed: None,
        }
    }

    /// Takes the walk's newest tensor, the last of `walked` (every tensor walked so far, in
    /// visit order).
    pub(super) fn see(&mut self, walked: &[&Tensor]) {
        if !self.open {
            return;
        }
        let place = walked.last().and_then(|t| match t.storage() {
            Storage::Host(b) => place_after(self.end, b.bytes().len(), self.limit),
            _ => None,
        });
        let Some((_, end)) = place else {
            self.open = false;
            return;
        };
        self.seen += 1;
        self.end = end;
        if self.seen - self.handed >= CHUNK {
            self.hand_out(&walked[self.handed..self.seen]);
        }
    }

    /// Hands `fresh` (the leading tensors seen since the last hand-out) to the copy
    /// threads.
    fn hand_out(&mut self, fresh: &[&Tensor]) {
        if self.lease.is_none() {
            // Only a free slot: where the call would wait for one, it waits as before.
            match self.rt.arena.lease(self.ctx, false) {
                Ok(Some(l)) => self.lease = Some(l),
                Ok(None) => return self.close(None),
                Err(e) => return self.close(Some(e)),
            }
        }
        let Some(lease) = self.lease.as_mut() else {
            return;
        };
        let mut end = self.handed_end;
        let pieces = fresh.iter().filter_map(|t| {
            let Storage::Host(b) = t.storage() else {
                return None;
            };
            let bytes = b.bytes();
            let (at, e) = place_after(end, bytes.len(), usize::MAX)?;
            end = e;
            (!bytes.is_empty()).then_some((at, bytes))
        });
        // Streaming stores: the lead is at most a window of a small batch's first bytes.
        // SAFETY: the pieces borrow the caller's batch, alive and unchanged for the whole
        // call (its contract); the lease is settled before the call returns: dropped with
        // this lead, or handed to the call's `InFlight`, whose finish and abort settle it.
        match unsafe { lease.fill_ahead(pieces, &self.rt.copy, Stores::Streaming) } {
            Ok(true) => {
                if self.handed == 0 {
                    super::trace::mark("lead fill started");
                }
                (self.handed, self.handed_end) = (self.seen, self.end);
            }
            // The device still reads the slot: the call fills it later, as before.
            Ok(false) => self.close(None),
            Err(e) => self.close(Some(e)),
        }
    }

    fn close(&mut self, failed: Option<Error>) {
        self.open = false;
        if self.failed.is_none() {
            self.failed = failed;
        }
    }

    /// The lead's slot and what was handed out (`None` when nothing was).
    ///
    /// # Errors
    /// A hand-out's error (a lease's allocation, a driver error asking the slot's last
    /// copy, a range refused): the lead's fills are settled first.
    pub(super) fn finish(mut self) -> Result<Option<LeadFill>> {
        if let Some(e) = self.failed.take() {
            return Err(e);
        }
        Ok(self.lease.take().map(|lease| LeadFill {
            lease,
            tensors: self.handed,
            end: self.handed_end,
        }))
    }
}

/// The place of a tensor of `n` bytes after a layout ending at `end` (as `plan::pack`
/// places it) and the layout's new end, if that is within `limit`.
fn place_after(end: usize, n: usize, limit: usize) -> Option<(usize, usize)> {
    let at = end.checked_add(DEVICE_ALIGN - 1)? & !(DEVICE_ALIGN - 1);
    let new_end = at.checked_add(n)?;
    (new_end <= limit).then_some((at, new_end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The lead's places are the layout's.
        #[test]
        fn places_follow_the_layout(sizes in proptest::collection::vec(0usize..5000, 0..60)) {
            let (offsets, end) = plan::pack(sizes.iter().copied(), DEVICE_ALIGN).unwrap();
            let mut e = 0;
            for (i, &n) in sizes.iter().enumerate() {
                let (at, next) = place_after(e, n, usize::MAX).unwrap();
                prop_assert_eq!(at, offsets[i]);
                e = next;
            }
            prop_assert_eq!(e, end);
        }
    }

    #[test]
    fn places_stop_at_the_limit() {
        assert_eq!(place_after(0, 1024, 1024), Some((0, 1024)));
        assert_eq!(place_after(1, 10, 1024), Some((256, 266)));
        assert_eq!(place_after(1, 1000, 1024), None);
        assert_eq!(place_after(usize::MAX - 3, 1, usize::MAX), None);
    }
}
