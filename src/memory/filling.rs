//! Which ranges of page-locked blocks a D2H call's copies may still be writing.
//!
//! A D2H call into page-locked outputs rebuilds the caller's batch around views of its
//! output block while the copies into it run (one pass, overlapped with the copies). The
//! rebuild is the caller's `Batch::rebuild`, safe code that may read a view's bytes, keep
//! a clone of it, or hand it to another call; without a gate that read would race the
//! device's writes. So the call marks its range of the block as being filled
//! ([`PinnedBlock::start_fill`](super::pinned::PinnedBlock::start_fill)) before any view
//! of it exists, and clears the mark only with the proof that its copies are done
//! (`InFlight` and `Detached` clear their fills with a `Synced` in hand); every read of a
//! view's bytes ([`Ranges::check`]) is refused meanwhile with [`Error::BytesInFlight`]. A
//! range whose copies were never proven done (a failed call) stays marked until its
//! block drops.
//!
//! Cost: reads look at one process-wide count of marked ranges ([`FILLING`]) and touch the
//! block only while some range is marked somewhere; a D2H call marks and clears once.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard};

/// Ranges marked in all blocks. Only read-modify-writes change it, so a read that sees 0
/// (with `Acquire`) has seen every earlier clear (`Release`) and what it proved.
static FILLING: AtomicUsize = AtomicUsize::new(0);

/// Whether any range of any block is marked (a read must then ask the block).
pub(crate) fn any() -> bool {
    FILLING.load(Ordering::Acquire) != 0
}

/// A block's marked ranges: `(start, len)`, a few at a time (one per D2H call in flight
/// on the block; small batches share blocks), and how many there are (read without the
/// lock: a block nobody fills is passed with one load, even while other blocks are
/// filled).
#[derive(Default)]
pub(crate) struct Ranges {
    count: AtomicUsize,
    list: Mutex<Vec<(usize, usize)>>,
}

impl Ranges {
    fn lock(&self) -> MutexGuard<'_, Vec<(usize, usize)>> {
        self.list.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// `Ok` when `at..at + len` may be read: it overlaps no marked range.
    ///
    /// # Errors
    /// [`Error::BytesInFlight`] naming `op`.
    pub(crate) fn check(&self, at: usize, len: usize, op: &'static str) -> Result<()> {
        // Both counts change by read-modify-writes only (as `FILLING`'s comment says).
        if len == 0 || !any() || self.count.load(Ordering::Acquire) == 0 {
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
    pub(super) fn mark(&self, at: usize, len: usize) {
        // Counted before the range is listed, and both before any view exists: whoever
        // is handed a view later sees counts that include this range.
        FILLING.fetch_add(1, Ordering::AcqRel);
        self.count.fetch_add(1, Ordering::AcqRel);
        self.lock().push((at, len));
    }

    /// Clears the mark of `at..at + len`: only `Fill::done` calls it, with the proof that
    /// the copies that write the range are done.
    pub(super) fn unmark(&self, at: usize, len: usize) {
        let mut list = self.lock();
        if let Some(i) = list.iter().position(|&r| r == (at, len)) {
            list.swap_remove(i);
            drop(list);
            self.count.fetch_sub(1, Ordering::Release);
            FILLING.fetch_sub(1, Ordering::Release);
        }
    }
}

impl Drop for Ranges {
    /// The block is gone (no view of it is left): its marks no longer gate anything.
    fn drop(&mut self) {
        let n = *self.count.get_mut();
        if n > 0 {
            FILLING.fetch_sub(n, Ordering::Release);
        }
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
        assert!(any());
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
