//! Errors raised where they cannot be returned (inside `Drop`), kept for the next call.
//!
//! A `Drop` must not panic, and a failed `cuMemFreeAsync` or `cuStreamDestroy` there has
//! nobody to return to. It is recorded here; the next transfer call returns it as
//! [`crate::Error::Deferred`] before doing anything, and
//! [`take`] lets a caller collect it at any time. Only the first unseen error is kept
//! (later ones are usually consequences of it); [`dropped_count`] says how many were not.

use crate::error::Error;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

static FIRST: Mutex<Option<Error>> = Mutex::new(None);
/// Fast-path flag: set (Release) after FIRST is filled, read (Acquire) before locking it,
/// so the common "nothing recorded" case takes no lock.
static PENDING: AtomicBool = AtomicBool::new(false);
/// Errors recorded while one was already pending. Relaxed: a statistic only.
static DROPPED: AtomicUsize = AtomicUsize::new(0);

/// Records an error raised in `Drop`.
pub(crate) fn record(err: Error) {
    let mut first = FIRST.lock().unwrap_or_else(|p| p.into_inner());
    if first.is_some() {
        DROPPED.fetch_add(1, Ordering::Relaxed);
    } else {
        *first = Some(err);
        PENDING.store(true, Ordering::Release);
    }
}

/// Takes the recorded error, if any.
///
/// ```
/// assert!(pinlane::driver::deferred::take().is_none());
/// ```
pub fn take() -> Option<Error> {
    if !PENDING.load(Ordering::Acquire) {
        return None;
    }
    let mut first = FIRST.lock().unwrap_or_else(|p| p.into_inner());
    PENDING.store(false, Ordering::Release);
    first.take()
}

/// How many errors were recorded while another was still pending (and so not kept).
pub fn dropped_count() -> usize {
    DROPPED.load(Ordering::Relaxed)
}

/// `Err(Error::Deferred)` if an error is pending: what every transfer call checks first.
pub(crate) fn surface() -> Result<(), Error> {
    match take() {
        Some(e) => Err(Error::Deferred(Box::new(e))),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_error_is_kept_and_taken_once() {
        // One test only touches the global, so no other test races it.
        record(Error::StreamWithoutDevice);
        record(Error::InvalidDevice { value: "x".into() });
        assert_eq!(dropped_count(), 1);
        assert_eq!(
            surface(),
            Err(Error::Deferred(Box::new(Error::StreamWithoutDevice)))
        );
        assert_eq!(take(), None);
        assert_eq!(surface(), Ok(()));
    }
}
