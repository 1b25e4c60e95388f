//! Errors raised where they cannot be returned (inside `Drop`), kept for the next call.
//!
//! A `Drop` must not panic, and a failed `cuMemFreeAsync` or `cuStreamDestroy` there has
//! nobody to return to. It is kept with what it belongs to: the thread that dropped the
//! owner and the device the owner was on. That thread's next transfer call on that device
//! returns it as [`crate::Error::Deferred`] before doing anything, and [`take`] lets the
//! thread collect it at any time; other threads and other devices never see it. Only the
//! first unseen error per thread and device is kept (later ones are usually consequences
//! of it); [`dropped_count`] says how many were not, process-wide.

use crate::device::Device;
use crate::error::Error;
use std::cell::RefCell;
use std::sync::atomic::{AtomicUsize, Ordering};

thread_local! {
    /// This thread's pending errors, at most one per device.
    static PENDING: RefCell<Vec<(usize, Error)>> = const { RefCell::new(Vec::new()) };
}

/// Errors not kept: recorded while one was pending for the same thread and device, or on
/// a thread that was exiting. Relaxed: a statistic only.
static DROPPED: AtomicUsize = AtomicUsize::new(0);

/// Records an error raised in `Drop` of an owner on `device`.
pub(crate) fn record(device: usize, err: Error) {
    let kept = PENDING.try_with(|p| {
        let mut p = p.borrow_mut();
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

/// Takes the calling thread's pending error for `device`, if any.
///
/// ```
/// assert!(pinlane::driver::deferred::take(pinlane::Device::cuda(0)).is_none());
/// ```
pub fn take(device: Device) -> Option<Error> {
    let device = device.ordinal();
    PENDING
        .try_with(|p| {
            let mut p = p.borrow_mut();
            let i = p.iter().position(|(d, _)| *d == device)?;
            Some(p.swap_remove(i).1)
        })
        .ok()
        .flatten()
}

/// How many errors were not kept (see the module docs), process-wide.
pub fn dropped_count() -> usize {
    DROPPED.load(Ordering::Relaxed)
}

/// `Err(Error::Deferred)` if the calling thread has an error pending for `device`: what
/// every transfer call checks first.
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
    fn another_threads_error_is_not_seen() {
        // Regression: one process-wide slot made an error from one thread's Drop fail
        // another thread's unrelated transfer.
        std::thread::spawn(|| record(3, Error::StreamWithoutDevice))
            .join()
            .unwrap();
        assert_eq!(surface(3), Ok(()));
        assert_eq!(take(Device::cuda(3)), None);
    }
}
