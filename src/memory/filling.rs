//! Which ranges of page-locked blocks a D2H call's copies may still be writing.
//!
//! A D2H call into page-locked outputs rebuilds the caller's batch around views of its
//! output block while the copies into it run (one pass, overlapped with the copies). The
//! rebuild is the caller's `Batch::rebuild`, safe code that may read a view's bytes, keep
//! a clone of it, or hand it to another call; without a gate that read would race the
//! device's writes. So the call marks its range of the block as being filled
//! ([`PinnedBlock::start_fill`]) before any view of it exists, and clears the mark only
//! with the proof that its copies are done (`InFlight` and `Detached` clear their fills
//! with a `Synced` in hand); every read of a view's bytes ([`Ranges::check`]) is refused
//! meanwhile with [`Error::BytesInFlight`]. A range whose copies were never proven done (a
//! failed call) stays marked until its block drops.
//!
//! An H2D call marks its batch's device allocation likewise (`super::device_gate`, with
//! its own count).
//!
//! Cost: reads look at one process-wide count of marked ranges ([`PINNED`]) and touch the
//! block only while some range is marked somewhere; a D2H call marks and clears once.

use super::PinnedBlock;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// A process-wide count on a cache line of its own: D2H calls write [`PINNED`] on every
/// call, H2D calls `device_gate`'s count, and the other kind's checks read theirs.
#[repr(align(128))]
pub(super) struct Count(pub(super) AtomicUsize);

/// Ranges marked in all page-locked blocks. Only read-modify-writes change it, so a read
/// that sees 0 (with `Acquire`) has seen every earlier clear (`Release`).
static PINNED: Count = Count(AtomicUsize::new(0));

/// Whether any range of any page-locked block is marked (a read must then ask the block).
pub(crate) fn pinned_any() -> bool {
    PINNED.0.load(Ordering::Acquire) != 0
}

/// A block's marked ranges: `(start, len)`, a few at a time (one per call in flight on
/// it; small D2H batches share blocks), and how many there are (read without the lock:
/// a block nobody fills is passed with one load, even while others are filled).
pub(crate) struct Ranges {
    count: AtomicUsize,
    list: Mutex<Vec<(usize, usize)>>,
}

impl Ranges {
    /// The ranges of a page-locked block.
    pub(crate) fn pinned() -> Ranges {
        Ranges {
            count: AtomicUsize::new(0),
            list: Mutex::new(Vec::new()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Vec<(usize, usize)>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Ok` when `at..at + len` may be read: it overlaps no marked range.
    ///
    /// # Errors
    /// [`Error::BytesInFlight`] naming `op`.
    pub(crate) fn check(&self, at: usize, len: usize, op: &'static str) -> Result<()> {
        // Both counts change by read-modify-writes only (as `PINNED`'s comment says).
        if len == 0
            || PINNED.0.load(Ordering::Acquire) == 0
            || self.count.load(Ordering::Acquire) == 0
        {
            return Ok(());
        }
        let end = at.saturating_add(len);
        let marked = self.lock().iter().any(|&(s, n)| s < end && at < s + n);
        if marked {
            return Err(Error::BytesInFlight { op });
        }
        Ok(())
    }

    /// Marks `at..at + len` (`len > 0`); call it before any view of the range exists.
    fn mark(&self, at: usize, len: usize) {
        // Counted before the range is listed, and both before any view exists: whoever
        // is handed a view later sees counts that include this range.
        PINNED.0.fetch_add(1, Ordering::AcqRel);
        self.count.fetch_add(1, Ordering::AcqRel);
        self.lock().push((at, len));
    }

    /// Clears the mark of `at..at + len`: only [`Fill::done`] calls it, with the proof
    /// that the copies that write the range are done.
    fn unmark(&self, at: usize, len: usize) {
        let mut list = self.lock();
        if let Some(i) = list.iter().position(|&r| r == (at, len)) {
            list.swap_remove(i);
            drop(list);
            self.count.fetch_sub(1, Ordering::Release);
            PINNED.0.fetch_sub(1, Ordering::Release);
        }
    }
}

impl Drop for Ranges {
    /// The block is gone (no view of it is left): its marks no longer gate anything.
    fn drop(&mut self) {
        let n = *self.count.get_mut();
        if n > 0 {
            PINNED.0.fetch_sub(n, Ordering::Release);
        }
    }
}

/// One call's range of a block, marked from [`Fill::start`] until [`Fill::done`].
/// Dropped without it (the copies were never proven done), the range stays marked until
/// the block drops: its bytes may be partly written.
pub(crate) struct Fill {
    block: Arc<PinnedBlock>,
    at: usize,
    len: usize,
}

impl Fill {
    /// Marks `at..at + len` of `block` as being written by a call's copies, until
    /// [`Fill::done`]. Call it before any view of the range exists. `None` for an empty
    /// range (nothing to gate).
    pub(crate) fn start(block: Arc<PinnedBlock>, at: usize, len: usize) -> Option<Fill> {
        if len == 0 {
            return None;
        }
        block.ranges().mark(at, len);
        Some(Fill { block, at, len })
    }

    /// The copies that write the range are proven done (`proof`): reads of it are
    /// allowed from now.
    pub(crate) fn done(self, proof: &super::arena::Synced) {
        let _ = proof;
        self.block.ranges().unmark(self.at, self.len);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{PinnedBlock, PinnedBuf};
    use std::sync::Arc;

    /// A block over 1 KiB of a `Vec` (nothing page-locked: only the marks are tested).
    fn block() -> Arc<PinnedBlock> {
        let mut mem = vec![0u8; 1024];
        let ptr = mem.as_mut_ptr();
        // SAFETY: `mem` (moved into the owner) keeps the 1 KiB allocated and unchanged
        // until the block drops; a Vec's buffer does not move when the Vec does.
        unsafe { PinnedBlock::foreign_in(ptr, 1024, Box::new(mem), false, None) }
    }

    fn read(b: &Arc<PinnedBlock>, at: usize, n: usize) -> bool {
        PinnedBuf::view(b, at, n).unwrap().bytes("test").is_ok()
    }

    #[test]
    fn only_views_that_overlap_a_marked_range_are_refused() {
        let b = block();
        let fill = b.start_fill(256, 256).expect("a non-empty range is marked");
        assert!(pinned_any());
        assert!(read(&b, 0, 256), "just before");
        assert!(read(&b, 512, 512), "just after");
        assert!(read(&b, 300, 0), "an empty view reads nothing");
        assert!(!read(&b, 256, 256), "the range itself");
        assert!(!read(&b, 255, 2), "across its start");
        assert!(!read(&b, 511, 2), "across its end");
        assert!(!read(&b, 0, 1024), "around it");
        let err = PinnedBuf::view(&b, 300, 8)
            .unwrap()
            .bytes("as_bytes")
            .unwrap_err();
        assert!(
            matches!(err, Error::BytesInFlight { op: "as_bytes" }),
            "{err:?}"
        );
        // Never proven done: the range stays marked after its `Fill` is gone.
        drop(fill);
        assert!(!read(&b, 256, 256));
        assert!(b.start_fill(0, 0).is_none(), "an empty range is not marked");
    }
}
