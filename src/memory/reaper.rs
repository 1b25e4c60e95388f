//! Frees page-locked memory off the caller's thread.
//!
//! `cuMemFreeHost` waits for all work on every stream of the context to finish (measured
//! on the H200: a free issued while another stream ran a 1.5 s host function returned
//! after 1.5 s). A transfer must not wait for work that is not its own, so the frees on a
//! transfer's path (output blocks evicted to make room under the cap, staging slots above
//! a lowered cap) go to one dedicated thread, started on first use, which waits in its
//! place. Frees the caller causes directly stay on the caller's thread: the last drop of a
//! page-locked tensor of its own (`to_pinned`), and [`Runtime::trim`](crate::runtime::Runtime::trim)
//! (sending those here too was measured to be worse: thousands of queued frees, each
//! waiting for the device, ran during the next transfers and halved their speed) - unless
//! the program asked for bounded waits ([`Config::sync_wait`](crate::config::Config::sync_wait)):
//! then they come here as well, and the caller never waits for the device
//! ([`free_pinned_in_policy`]). Such a last drop made by pinlane itself comes here too:
//! on one of its own threads (the completion thread, which drops a non-blocking call's
//! owners: a page-locked source the caller let go of during the call), or while it
//! releases what earlier calls kept, on a transfer's path ([`releasing`]; session 64:
//! before, the completion thread waited there for other streams' work, and the handle's
//! wait with it).
//!
//! The memory handed over is no longer used by anything (its copies were proven
//! complete); it simply stays allocated a little longer.
//!
//! This spares the thread, not the process: while a free waits in the driver, every
//! thread's copies are held (measured on an H100, session 68: another thread's 1 MiB copy
//! took 475 ms to queue while a free here waited 480 ms behind another stream's kernel;
//! `benches/probes/free_hold.cu`). So the output pool reuses a larger free block at its
//! cap before it frees one.
//!
//! Ending a registration (`cuMemHostUnregister`, memory page-locked in place by
//! `Tensor::register_pinned`) waits for the whole device as well (measured on an H100,
//! session 66: 480 ms behind another stream's 500 ms of work, a host function or a kernel;
//! `benches/probes/unregister_wait.cu`), so it follows the same policy
//! ([`end_in_policy`]): before, the completion thread ended a registration whose last
//! view a non-blocking call held, and every handle waited for other streams' work.

use crate::driver::{self, HostPtr};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Mutex;
use std::time::Duration;

/// What the reaper thread does.
enum Job {
    /// Free a page-locked block: its address and the device whose context allocated it.
    /// Made only by [`free_pinned_later`], whose caller gives the free's obligations.
    Free(HostPtr<u8>, usize),
    /// Run other work that waits for `device` (ending a registration, then its owner's
    /// drop; waiting for another library's memory's lent uses, then its owner's drop:
    /// user code, so run under `catch_unwind`), named for [`Error::Panicked`](crate::error::Error::Panicked).
    /// Counted from the moment it is handed to the thread ([`runs_done_by`]).
    Run(
        Box<dyn FnOnce() + Send>,
        usize,
        &'static str,
        Option<Counted>,
    ),
}

/// A [`Job::Run`] handed to the free thread, counted in [`RUNS`] until it has run, or is
/// dropped unrun, or unwinds: the count is given back in `Drop`, so no path leaves it up.
struct Counted(());

impl Counted {
    fn new() -> Counted {
        RUNS.fetch_add(1, Ordering::Relaxed);
        Counted(())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        RUNS.fetch_sub(1, Ordering::Release);
    }
}

/// The reaper thread: its queue, and a channel that says when it has exited.
struct Reaper {
    tx: Sender<Job>,
    exited: Receiver<()>,
    /// Started by work of the free thread itself (a job's owner drop freeing a block),
    /// not by another thread: [`quiesce`] waits for such a one too.
    by_free_thread: bool,
}

/// The running reaper thread, if any: started on first use, and again after [`quiesce`].
static REAPER: Mutex<Option<Reaper>> = Mutex::new(None);
/// Frees that failed on the reaper thread (nobody to return them to).
static FAILED: AtomicUsize = AtomicUsize::new(0);
/// [`Job::Run`]s handed to the free thread and not yet run: each ends with a drop of user
/// code's owner, which [`settle`](crate::settle) waits for ([`runs_done_by`]).
static RUNS: AtomicUsize = AtomicUsize::new(0);

thread_local! {
    /// How many [`Releasing`] guards the thread holds.
    static RELEASING: Cell<u32> = const { Cell::new(0) };
}

/// While it lives, the calling thread is releasing what pinlane kept for earlier calls,
/// on a transfer's path: a page-locked block whose last owner goes then is freed on the
/// reaper thread (see the module docs).
pub(crate) struct Releasing(());

/// Marks the calling thread as releasing what pinlane kept until the guard drops.
pub(crate) fn releasing() -> Releasing {
    let _ = RELEASING.try_with(|r| r.set(r.get().saturating_add(1)));
    Releasing(())
}

impl Drop for Releasing {
    fn drop(&mut self) {
        let _ = RELEASING.try_with(|r| r.set(r.get().saturating_sub(1)));
    }
}

/// Whether a free (or another release) made now is pinlane's own, not the caller's: on
/// one of pinlane's threads, or inside a [`Releasing`] guard.
pub(crate) fn pinlanes_own_free() -> bool {
    driver::deferred::is_background_thread() || RELEASING.try_with(Cell::get).unwrap_or(0) > 0
}

/// Frees `ptr` (page-locked, allocated under `device`'s context) on the reaper thread.
///
/// # Safety
/// `ptr` came from `host_alloc` under `device`'s context, is freed by nothing else, and no
/// copy touches it any more.
pub(crate) unsafe fn free_pinned_later(ptr: HostPtr<u8>, device: usize) {
    send_or_run(Job::Free(ptr, device));
}

/// Hands `job` to the reaper thread (started if need be, and once more if it has gone:
/// nothing known ends it but `quiesce`, which takes it off first), or runs it here if no
/// thread can be spawned, waiting if need be.
fn send_or_run(mut job: Job) {
    {
        let mut r = REAPER.lock().unwrap_or_else(|p| p.into_inner());
        for _ in 0..2 {
            if r.is_none() {
                // The free thread's own mark (`start` gives it).
                *r = start(driver::deferred::background_name() == Some(FREE_THREAD));
            }
            let Some(reaper) = r.as_ref() else { break };
            match reaper.tx.send(job) {
                Ok(()) => return,
                Err(unsent) => {
                    job = unsent.0;
                    *r = None;
                }
            }
        }
    }
    run(job);
}

/// Runs one job on this thread.
fn run(job: Job) {
    match job {
        Job::Free(ptr, device) => {
            // SAFETY: a `Job::Free` is made only by `free_pinned_later`, whose caller gave
            // the obligations for `ptr` (from `host_alloc` under `device`'s context, freed
            // by nothing else, no copy touching it).
            let freed = std::panic::catch_unwind(|| unsafe { free_now(ptr, device) });
            // No user code runs in a free: a panic is a bug (in pinlane or the driver's
            // loading), kept for the next call on the device; the thread goes on with the
            // next job instead of losing the ones queued behind this one.
            if let Err(panic) = freed {
                FAILED.fetch_add(1, Ordering::Relaxed);
                driver::deferred::record(
                    device,
                    crate::error::Error::Internal {
                        op: "freeing page-locked memory",
                        reason: format!(
                            "the free panicked ({})",
                            crate::error::panic_message(panic)
                        ),
                    },
                );
            }
        }
        Job::Run(f, device, what, _counted) => {
            driver::deferred::catch_user_panic(device, what, f);
        }
    }
}

/// Runs `end` (the end of a registration on `device`: `cuMemHostUnregister`, which waits
/// for all work queued on the device, then its owner's drop) where a free of the same
/// origin runs ([`free_pinned_in_policy`]): here when the caller drops the memory
/// directly and the program set no bound on waits; on the reaper thread when the drop
/// is pinlane's own (on its threads, or inside [`releasing`]) or waits are bounded
/// ([`Config::sync_wait`](crate::config::Config::sync_wait)). A panic in `end` (the
/// owner's drop is user code) is caught and recorded for the next call on `device`.
pub(crate) fn end_in_policy(device: usize, end: Box<dyn FnOnce() + Send>) {
    let what = "dropping the owner of memory page-locked in place";
    if super::waits::sync_wait().is_some() || pinlanes_own_free() {
        run_later(device, what, end);
    } else {
        run(Job::Run(end, device, what, None));
    }
}

/// Runs `work` (which waits for `device` and then drops user code's owner: `what`, as
/// [`Error::Panicked`](crate::error::Error::Panicked) names it if that panics) on the free
/// thread: for pinlane's own threads, whose waits would hold every handle meanwhile.
pub(crate) fn run_later(device: usize, what: &'static str, work: Box<dyn FnOnce() + Send>) {
    send_or_run(Job::Run(work, device, what, Some(Counted::new())));
}

/// Waits (polled, naps of at most 1 ms) until every [`Job::Run`] handed to the free
/// thread so far has run (its owner dropped), or `deadline`; says whether they all had. For
/// [`settle`](crate::settle): an owner that pinlane's threads let go of is handed back
/// before it returns, as one the completion thread drops itself is.
pub(crate) fn runs_done_by(deadline: std::time::Instant) -> bool {
    let mut nap = Duration::from_micros(50);
    loop {
        if RUNS.load(Ordering::Acquire) == 0 {
            return true;
        }
        let now = std::time::Instant::now();
        if now >= deadline {
            return false;
        }
        std::thread::sleep(nap.min(deadline - now));
        nap = (nap * 2).min(Duration::from_millis(1));
    }
}

/// Lets the reaper thread free what it was given and exit; waits up to `limit` for that
/// and says whether it happened (no thread running counts). A later free starts a new
/// thread. For [`Runtime::shutdown`](crate::runtime::Runtime::shutdown).
///
/// A job the exiting thread runs may hand over work of its own (an owner's drop there
/// frees a `to_pinned` block: a free of pinlane's own, for the free thread), which starts
/// a new thread once this one is taken off: that one is let finish and waited for too,
/// until none is left (session 86: before, `shutdown` returned with it running). One
/// that another thread's free started meanwhile is left running, as before: other
/// threads' calls are not interrupted, and waiting for them could take the whole limit.
pub(crate) fn quiesce(limit: Duration) -> bool {
    let deadline = driver::deadline_after(limit);
    let mut reaper = REAPER.lock().unwrap_or_else(|p| p.into_inner()).take();
    while let Some(Reaper { tx, exited, .. }) = reaper {
        drop(tx); // the thread's loop ends after the frees already queued
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if exited.recv_timeout(left).is_err() {
            return false;
        }
        let mut r = REAPER.lock().unwrap_or_else(|p| p.into_inner());
        reaper = if r.as_ref().is_some_and(|n| n.by_free_thread) {
            r.take()
        } else {
            None
        };
    }
    true
}

/// Frees that failed on the reaper thread so far.
pub(crate) fn failed() -> usize {
    FAILED.load(Ordering::Relaxed)
}

/// The free thread's name among pinlane's own threads (`mark_background_thread`), by
/// which `send_or_run` knows it.
const FREE_THREAD: &str = "free";

fn start(by_free_thread: bool) -> Option<Reaper> {
    let (tx, rx) = channel::<Job>();
    let (done, exited) = channel::<()>();
    std::thread::Builder::new()
        .name("pinlane-free".into())
        .spawn(move || {
            // No call runs here: errors recorded while freeing go to the device.
            driver::deferred::mark_background_thread(FREE_THREAD);
            for job in rx {
                run(job);
            }
            let _ = done.send(());
        })
        .ok()
        .map(|_| Reaper {
            tx,
            exited,
            by_free_thread,
        })
}

/// Frees a pinned allocation under the context it was allocated under, on this thread
/// (`cuMemFreeHost` waits for all work on the device).
///
/// # Safety
/// `ptr` came from `host_alloc` under `device`'s context, is not freed yet, and no copy
/// touches it any more.
unsafe fn free_pinned(ptr: HostPtr<u8>, device: usize) -> crate::error::Result<()> {
    let ctx = driver::bind(device)?;
    // SAFETY: the caller's obligations.
    unsafe { driver::host_free(&ctx, ptr.0) }
}

/// Frees a block the caller gives up directly (a dropped `to_pinned` tensor, a trim):
/// here, waiting for the device, when the program set no bound on waits; on the reaper
/// thread when it did ([`Config::sync_wait`](crate::config::Config::sync_wait)), so the
/// caller does not wait for other work on the device, and when the drop is pinlane's own
/// (on its threads, or inside [`releasing`]). An error from a free done there is counted
/// ([`failed`]) instead of returned.
///
/// # Safety
/// As [`free_pinned_later`].
pub(crate) unsafe fn free_pinned_in_policy(
    ptr: HostPtr<u8>,
    device: usize,
) -> crate::error::Result<()> {
    if super::waits::sync_wait().is_some() || pinlanes_own_free() {
        // SAFETY: the caller's obligations.
        unsafe { free_pinned_later(ptr, device) };
        Ok(())
    } else {
        // SAFETY: the caller's obligations.
        unsafe { free_pinned(ptr, device) }
    }
}

/// # Safety
/// As [`free_pinned_later`].
unsafe fn free_now(ptr: HostPtr<u8>, device: usize) {
    // SAFETY: the caller's obligations.
    if let Err(e) = unsafe { free_pinned(ptr, device) } {
        FAILED.fetch_add(1, Ordering::Relaxed);
        // On the reaper thread, kept for the next call on the device, on any thread.
        driver::deferred::record(device, e);
    }
}

/// Frees every `(ptr, device)` with [`free_pinned_in_policy`]; all are attempted, the
/// first error is returned.
///
/// # Safety
/// As [`free_pinned_in_policy`], for each.
pub(crate) unsafe fn free_all(
    items: impl IntoIterator<Item = (HostPtr<u8>, usize)>,
) -> crate::error::Result<()> {
    let mut first = None;
    for (ptr, device) in items {
        // SAFETY: the caller's obligations, for this item.
        if let Err(e) = unsafe { free_pinned_in_policy(ptr, device) } {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}
