//! Errors raised where they cannot be returned (inside `Drop`), kept for the next call.
//!
//! A `Drop` must not panic, and a failed `cuMemFreeAsync` or `cuStreamDestroy` there has
//! nobody to return to. Where it is kept depends on the thread:
//!
//! * On a caller's thread, it is kept with that thread and the device the owner was on:
//!   that thread's next transfer call on that device returns it as
//!   [`crate::error::Error::Deferred`] before doing anything, and [`take`] lets the thread
//!   collect it at any time; other threads never see it.
//! * On one of pinlane's own threads (the completion thread of the non-blocking calls,
//!   which drops owners, and any other marked with `mark_background_thread`), no call
//!   will ever run on that thread: it is kept with the device, and the next transfer call
//!   for that device on any thread returns it (cudarc's `error_state` on its context is
//!   the model). [`background_count`] counts these, and `memory_stats()` reports it.
//!
//! Only the first unseen error per thread and device (and per device, for pinlane's
//! threads) is kept: later ones are usually consequences of it; [`dropped_count`] says
//! how many were not, process-wide, counting too those a caller's thread still held
//! when it exited.

use crate::device::Device;
use crate::error::Error;
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// A thread's pending errors; those still there when the thread exits are counted as
/// not kept ([`dropped_count`]): no call of that thread will see them.
struct ThreadPending(RefCell<Vec<(usize, Error)>>);

impl Drop for ThreadPending {
    fn drop(&mut self) {
        let left = self.0.get_mut().len();
        if left > 0 {
            DROPPED.fetch_add(left, Ordering::Relaxed);
        }
    }
}

thread_local! {
    /// This thread's pending errors, at most one per device.
    static PENDING: ThreadPending = const { ThreadPending(RefCell::new(Vec::new())) };
    /// The name of this thread when it is one of pinlane's own (`"completion"`, ...).
    static BACKGROUND: Cell<Option<&'static str>> = const { Cell::new(None) };
}

/// Errors recorded on pinlane's own threads, at most one per device.
static ON_DEVICE: Mutex<Vec<(usize, Error)>> = Mutex::new(Vec::new());
/// Whether `ON_DEVICE` may hold anything: lets every call skip its lock when it is
/// empty. Release when set after a push, Acquire when read: a call that sees `true`
/// then takes the lock, which orders the rest.
static ANY_ON_DEVICE: AtomicBool = AtomicBool::new(false);

/// Errors not kept: recorded while one was pending for the same thread (or, on pinlane's
/// threads, device), or on a thread that was exiting. Relaxed: a statistic only.
static DROPPED: AtomicUsize = AtomicUsize::new(0);
/// Errors recorded on pinlane's own threads, kept or not. Relaxed: a statistic only.
static BACKGROUND_ERRORS: AtomicUsize = AtomicUsize::new(0);

fn lock_on_device() -> std::sync::MutexGuard<'static, Vec<(usize, Error)>> {
    ON_DEVICE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Marks the calling thread as one of pinlane's own (see the module docs), named `name`
/// in [`Error::Panicked`] (`"completion"`, `"free"`, `"prefetch"`).
pub(crate) fn mark_background_thread(name: &'static str) {
    let _ = BACKGROUND.try_with(|b| b.set(Some(name)));
}

/// The calling thread's name if it is one of pinlane's own (see the module docs).
pub(crate) fn background_name() -> Option<&'static str> {
    BACKGROUND.try_with(Cell::get).ok().flatten()
}

/// Whether the calling thread is one of pinlane's own (see the module docs).
pub(crate) fn is_background_thread() -> bool {
    background_name().is_some()
}

/// Runs `f`, user code that pinlane runs outside the call it belongs to (another call's
/// owner's drop, a waker), under `catch_unwind`: a panic is recorded for the next call on
/// `device` as [`Error::Panicked`] naming the thread (pinlane's own by the name it was
/// marked with, else `"caller"`: then that thread's next call) and `what` pinlane was
/// doing. Says whether `f` returned (false: it panicked).
pub(crate) fn catch_user_panic(device: usize, what: &'static str, f: impl FnOnce()) -> bool {
    let Err(panic) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) else {
        return true;
    };
    record(
        device,
        Error::Panicked {
            thread: background_name().unwrap_or("caller"),
            what,
            message: crate::error::panic_message(panic),
        },
    );
    false
}

/// Records an error raised where it cannot be returned (in `Drop` of an owner on
/// `device`, or in user code pinlane ran on its own threads).
pub(crate) fn record(device: usize, err: Error) {
    if is_background_thread() {
        record_for_device(device, err);
        return;
    }
    let kept = PENDING.try_with(|p| {
        let mut p = p.0.borrow_mut();
        if p.iter().any(|(d, _)| *d == device) {
            false
        } else {
            p.push((device, err));
            true
        }
    });
    if kept != Ok(true) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    }
}

/// Records an error of pinlane's own threads for the next call on `device` on any thread,
/// whichever thread records it: one such a thread raised that another thread hands back
/// (a prefetcher's worker's error its consumer dropped unreceived).
pub(crate) fn record_for_device(device: usize, err: Error) {
    BACKGROUND_ERRORS.fetch_add(1, Ordering::Relaxed);
    keep_for_device(device, err);
}

/// Keeps `err` for the next call on `device` on any thread, unless one is kept there
/// already (then it is counted as not kept).
fn keep_for_device(device: usize, err: Error) {
    let mut on = lock_on_device();
    if on.iter().any(|(d, _)| *d == device) {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    } else {
        on.push((device, err));
        ANY_ON_DEVICE.store(true, Ordering::Release);
    }
}

/// Takes the pending error for `device` that the calling thread should see: its own
/// first, else one recorded for the device on pinlane's own threads.
///
/// ```
/// assert!(pinlane::driver::deferred::take(pinlane::Device::cuda(0)).is_none());
/// ```
pub fn take(device: Device) -> Option<Error> {
    let device = device.ordinal();
    let own = PENDING
        .try_with(|p| {
            let mut p = p.0.borrow_mut();
            let i = p.iter().position(|(d, _)| *d == device)?;
            Some(p.swap_remove(i).1)
        })
        .ok()
        .flatten();
    if own.is_some() || !ANY_ON_DEVICE.load(Ordering::Acquire) {
        return own;
    }
    let mut on = lock_on_device();
    let i = on.iter().position(|(d, _)| *d == device)?;
    let e = on.swap_remove(i).1;
    if on.is_empty() {
        ANY_ON_DEVICE.store(false, Ordering::Relaxed);
    }
    Some(e)
}

/// Gives back an error the caller will not handle, for the next transfer call on
/// `device` on any thread: one that a call returned as [`Error::Deferred`] (the error
/// inside it is kept) or that [`take`] gave, taken by a worker whose consumer has gone
/// (the Python package's `prefetch` after `close()`). It is kept as an error of pinlane's
/// own threads is, and not counted again by [`background_count`] (it is no new error); if
/// one is kept for `device` already, it is counted as not kept ([`dropped_count`]).
///
/// ```
/// use pinlane::{driver::deferred, Device, Error};
/// let taken = Error::Deferred(Box::new(Error::StreamWithoutDevice));
/// let counted = deferred::background_count();
/// deferred::put_back(Device::cuda(3), taken);
/// assert_eq!(deferred::background_count(), counted); // no new error
/// assert_eq!(deferred::take(Device::cuda(3)), Some(Error::StreamWithoutDevice));
/// ```
pub fn put_back(device: Device, err: Error) {
    let err = match err {
        Error::Deferred(inner) => *inner,
        e => e,
    };
    keep_for_device(device.ordinal(), err);
}

/// How many errors were not kept (see the module docs), process-wide.
pub fn dropped_count() -> usize {
    DROPPED.load(Ordering::Relaxed)
}

/// How many errors were recorded on pinlane's own threads (kept for the next call on
/// their device, or not kept when one was pending there already), process-wide.
pub fn background_count() -> usize {
    BACKGROUND_ERRORS.load(Ordering::Relaxed)
}

/// `Err(Error::Deferred)` if an error is pending for `device` that the calling thread
/// should see ([`take`]): what every transfer call checks first.
pub(crate) fn surface(device: usize) -> Result<(), Error> {
    match take(Device::cuda(device)) {
        Some(e) => Err(Error::Deferred(Box::new(e))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_error_per_device_is_kept_and_taken_once() {
        record(0, Error::StreamWithoutDevice);
        record(0, Error::InvalidDevice { value: "x".into() });
        assert!(dropped_count() >= 1);
        assert_eq!(surface(1), Ok(()), "another device's call does not see it");
        assert_eq!(
            surface(0),
            Err(Error::Deferred(Box::new(Error::StreamWithoutDevice)))
        );
        assert_eq!(take(Device::cuda(0)), None);
        assert_eq!(surface(0), Ok(()));
    }

    #[test]
    fn an_error_on_pinlanes_own_thread_reaches_the_next_call_on_any_thread() {
        // Regression (issue 19): an error recorded on the completion thread went to that
        // thread's own slot, which no call ever reads.
        let before = background_count();
        std::thread::spawn(|| {
            mark_background_thread("test");
            record(5, Error::StreamWithoutDevice);
            record(5, Error::InvalidDevice { value: "y".into() }); // one per device
        })
        .join()
        .unwrap();
        assert!(background_count() >= before + 2);
        assert_eq!(surface(4), Ok(()), "another device's call does not see it");
        let seen = std::thread::spawn(|| surface(5)).join().unwrap();
        assert_eq!(
            seen,
            Err(Error::Deferred(Box::new(Error::StreamWithoutDevice)))
        );
        assert_eq!(surface(5), Ok(()), "reported once");
    }

    #[test]
    fn another_threads_error_is_not_seen() {
        // Regression: one process-wide slot made an error from one thread's Drop fail
        // another thread's unrelated transfer.
        let before = dropped_count();
        std::thread::spawn(|| {
            record(3, Error::StreamWithoutDevice);
            // 50 more, unseen when the thread exits (other tests add a few at most).
            for d in 100..150 {
                record(d, Error::StreamWithoutDevice);
            }
        })
        .join()
        .unwrap();
        assert_eq!(surface(3), Ok(()));
        assert_eq!(take(Device::cuda(3)), None);
        // Unseen when its thread exited: counted as not kept (session 64: lost silently).
        assert!(dropped_count() >= before + 51);
    }
}
