//! [`InFlight`]: the owners a call's queued copies may still touch, released only after
//! the stream is proven idle.

use super::arena::Synced;
use super::{retained, SlotLease};
use crate::driver::Stream;
use crate::error::{Error, Result};
use std::any::Any;
use std::sync::Arc;

/// Everything one transfer call has queued copies against on `stream`: its staging slot
/// leases, device allocations and page-locked output blocks. Ending it any way other than [`InFlight::finish`] or
/// [`InFlight::abort`] is a bug; dropping it without either still synchronises first.
pub(crate) struct InFlight {
    stream: Stream,
    pub(crate) leases: Vec<SlotLease>,
    /// Other owners (device allocations, output blocks) with their sizes.
    held: Vec<(Arc<dyn Any + Send + Sync>, usize)>,
    /// Set once finish/abort has run, so Drop knows not to synchronise again.
    done: bool,
    /// Longest the Drop fallback waits for the stream.
    drop_wait: std::time::Duration,
}

impl InFlight {
    pub(crate) fn new(stream: Stream, drop_wait: std::time::Duration) -> InFlight {
        InFlight {
            stream,
            leases: Vec::new(),
            held: Vec::new(),
            done: false,
            drop_wait,
        }
    }

    /// Synchronises the stream; on success the leases are marked idle with the proof.
    fn synchronize(&mut self) -> Result<()> {
        let proof = Synced::synchronize(&self.stream)?;
        self.leases.iter_mut().for_each(|l| l.mark_idle(&proof));
        retained::release_proven(&self.stream);
        Ok(())
    }

    pub(crate) fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Keeps `owner` (of `bytes`) alive until the stream is proven idle.
    pub(crate) fn hold<T: Any + Send + Sync>(&mut self, owner: &Arc<T>, bytes: usize) {
        self.held.push((owner.clone(), bytes));
    }

    fn held_bytes(&self) -> usize {
        self.leases.iter().map(SlotLease::len).sum::<usize>()
            + self.held.iter().map(|h| h.1).sum::<usize>()
    }

    /// Synchronises the stream, then releases everything. If the synchronisation fails,
    /// the owners and `sources()` (clones of the caller's source buffers) are retained
    /// until a later synchronisation succeeds, and the error is returned.
    pub(crate) fn finish<S: Send + 'static>(mut self, sources: impl FnOnce() -> S) -> Result<()> {
        self.done = true;
        self.settle();
        match self.synchronize() {
            Ok(()) => Ok(()),
            Err(e) => {
                self.retain(sources());
                Err(e)
            }
        }
    }

    /// After a failure part way: drains the copies already queued (synchronises), then
    /// returns `err`. If the drain fails too, retains the owners and `sources()` as in
    /// [`InFlight::finish`], and still returns the original `err`.
    pub(crate) fn abort<S: Send + 'static>(
        mut self,
        err: Error,
        sources: impl FnOnce() -> S,
    ) -> Error {
        self.done = true;
        self.settle();
        if self.synchronize().is_err() {
            self.retain(sources());
        }
        err
    }

    /// Waits for host-side copies into the staging slots: they read the caller's
    /// borrowed sources, so they must end before the call does, whatever happens next.
    fn settle(&mut self) {
        self.leases.iter_mut().for_each(SlotLease::settle);
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

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Not reached by the engine (every path calls finish or abort); kept so that no
        // lease goes back to the arena with a copy still running. Bounded: a hung device
        // must not hang the dropping thread, so the stream is polled through an event
        // for at most `drop_wait`; if it is not proven idle by then, everything is
        // retained (never freed early) and the drop returns.
        self.settle();
        let stream = self.stream.clone();
        match Synced::within(&stream, self.drop_wait) {
            Some(proof) => self.leases.iter_mut().for_each(|l| l.mark_idle(&proof)),
            None => self.retain(()),
        }
    }
}
