//! Shutting a runtime down: [`Runtime::shutdown`] and [`shutdown`] (the default one).
//!
//! Here, in the engine, because it stops the completion thread, which the engine owns;
//! the memory it gives back belongs to the layers below.

use super::completion;
use crate::error::{Error, Result};
use crate::memory::{self, retained};
use crate::runtime::{self, Runtime};
use std::time::{Duration, Instant};

impl Runtime {
    /// Gives back the memory this runtime holds and stops its threads, waiting up to
    /// `timeout` in all. Afterwards:
    ///
    /// * It is no longer the process's default: the next transfer makes a new default
    ///   runtime from the same configuration (or the one [`Config::install`] sets now).
    /// * Its free staging slots and page-locked output blocks are freed (`cuMemFreeHost`,
    ///   on the calling thread: it waits for the device's queued work; on pinlane's free
    ///   thread, within `timeout`, when
    ///   [`Config::sync_wait`](crate::config::Config::sync_wait) is set), and so is each
    ///   one in use when it comes back: the slot of a call still running when it ends,
    ///   an output block when the last tensor over it drops. Its pageable pool and the
    ///   device pools' cached memory are given back.
    /// * Its copy threads have exited; a call that still uses it copies on its own thread.
    /// * pinlane's process-wide threads have finished their work and exited: the thread
    ///   that completes non-blocking calls (every pending call completes first, its owners
    ///   released and its handle woken) and the thread that frees page-locked memory off
    ///   the transfer path. Both start again when needed.
    ///
    /// What stays: tensors the caller holds (and the blocks under them, until they drop),
    /// each thread's cache ring of recent batches (released when the thread exits), and
    /// the per-device context, pool and kernel, which live as long as the process. So a
    /// program that drops its tensors, ends its threads and then calls [`shutdown`] leaves
    /// nothing of pinlane's for a leak checker (NVIDIA's compute-sanitizer) to report.
    ///
    /// Calls running on other threads meanwhile are not interrupted: they finish on
    /// whichever runtime they started with.
    ///
    /// # Errors
    /// [`Error::ShutdownIncomplete`] when something was still running at the deadline (a
    /// pending call whose stream has not finished, a thread that did not exit): the
    /// memory it uses stays held and counted, and is freed when it comes back.
    /// [`Error::ForkedChild`] at once in a child process forked after pinlane set up
    /// CUDA (nothing there is the child's to give back or stop). Otherwise the first
    /// failed free.
    ///
    /// ```
    /// let rt = pinlane::runtime();
    /// rt.shutdown(std::time::Duration::from_secs(5))?;
    /// assert!(rt.is_shut_down());
    /// assert_eq!(rt.memory_stats().staging.held_bytes, 0);
    /// assert!(!std::sync::Arc::ptr_eq(&rt, &pinlane::runtime())); // a new default
    /// # Ok::<(), pinlane::Error>(())
    /// ```
    ///
    /// [`Config::install`]: crate::config::Config::install
    pub fn shutdown(&self, timeout: Duration) -> Result<()> {
        // The pools, their locks and the threads to stop are the parent's: refused before
        // any lock is taken, instead of waiting out `timeout` for threads that are not
        // there.
        crate::driver::fork::check("shutdown")?;
        let started = Instant::now();
        let deadline = crate::driver::deadline_after(timeout);
        let left = || deadline.saturating_duration_since(Instant::now());
        runtime::retire(self);
        let mut unfinished = Vec::new();
        // Pending calls first: completing them releases their slots and blocks.
        unfinished.extend(settle_by(deadline));
        let freed = self.close_pools();
        if !self.copy.stop(left()) {
            unfinished.push("copy threads still copying");
        }
        // Last: the frees handed to it (slots that came back to the closed arena).
        if !memory::quiesce_frees(left()) {
            unfinished.push("page-locked frees still queued");
        }
        if unfinished.is_empty() {
            return freed;
        }
        Err(Error::ShutdownIncomplete {
            waited_ms: started.elapsed().as_millis() as u64,
            reason: unfinished.join(", "),
        })
    }
}

/// [`Runtime::shutdown`] of the process's default runtime; with none (no transfer yet, or
/// shut down already), it still stops pinlane's process-wide threads and trims the device
/// pools.
///
/// ```
/// pinlane::shutdown(std::time::Duration::from_secs(5))?;
/// assert_eq!(pinlane::memory_stats().staging.held_bytes, 0);
/// # Ok::<(), pinlane::Error>(())
/// ```
///
/// # Errors
/// As [`Runtime::shutdown`].
pub fn shutdown(timeout: Duration) -> Result<()> {
    crate::driver::fork::check("shutdown")?;
    if let Some(rt) = runtime::current() {
        return rt.shutdown(timeout);
    }
    let started = Instant::now();
    let deadline = crate::driver::deadline_after(timeout);
    let left = || deadline.saturating_duration_since(Instant::now());
    let done = completion::quiesce(left()) & memory::quiesce_frees(left());
    if !done {
        return Err(Error::ShutdownIncomplete {
            waited_ms: started.elapsed().as_millis() as u64,
            reason: "pinlane's threads still working".into(),
        });
    }
    crate::driver::trim_device_pools()
}

/// Waits up to `timeout` for pinlane's pending non-blocking calls to complete and hands
/// back what they hold: their staging slots, and the clones of the caller's tensors they
/// keep while the device may still read or write them (memory another library lent
/// through DLPack, say). Unlike [`shutdown`], it frees nothing and makes no CUDA call
/// that waits for the device, so it is bounded by `timeout` even on a hung device, and
/// the runtime, its pools and its threads' caches stay as they are. The completion thread
/// exits once it is done (it starts again with the next such call).
///
/// For the end of a program whose tensors belong to another library: call it before
/// that library tears down, so that nothing of it is handed back afterwards from
/// pinlane's thread. The Python package calls it as the interpreter exits.
///
/// ```
/// pinlane::settle(std::time::Duration::from_secs(5))?; // nothing pending: returns at once
/// # Ok::<(), pinlane::Error>(())
/// ```
///
/// # Errors
/// [`Error::ShutdownIncomplete`] when a call was still pending at the deadline, or an
/// owner a completed call let go of was still waiting on the free thread for another
/// stream's use of it (another library's device memory lent to that stream): what it
/// holds stays held until it completes. [`Error::ForkedChild`] at once in a child process
/// forked after pinlane set up CUDA: the parent's pending calls are never completed there
/// (the thread that completes them is the parent's).
pub fn settle(timeout: Duration) -> Result<()> {
    crate::driver::fork::check("settle")?;
    let started = Instant::now();
    let unfinished = settle_by(crate::driver::deadline_after(timeout));
    if unfinished.is_empty() {
        return Ok(());
    }
    Err(Error::ShutdownIncomplete {
        waited_ms: started.elapsed().as_millis() as u64,
        reason: unfinished.join(", "),
    })
}

/// The pending non-blocking calls completed (their owners released) by `deadline`, the
/// owners their release handed to the free thread (another library's device memory whose
/// lent use was still running, memory page-locked in place) dropped there, and the
/// owners retained after failed synchronisations released where their streams have
/// finished since (polled, at most 100 ms of what is left); what was not done by then.
fn settle_by(deadline: Instant) -> Vec<&'static str> {
    let left = || deadline.saturating_duration_since(Instant::now());
    let mut unfinished = Vec::new();
    if !completion::quiesce(left()) {
        unfinished.push("non-blocking calls still pending");
    }
    // Before the free thread's drops are waited for: a release here may hand it more.
    retained::release_finished(left().min(Duration::from_millis(100)));
    if !crate::memory::reaper::runs_done_by(deadline) {
        unfinished.push("owners still being released on the free thread");
    }
    unfinished
}
