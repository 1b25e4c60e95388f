//! A child forked after pinlane set up CUDA: told so, instead of reaching state it cannot use.
//!
//! The driver's state (contexts, streams, pools, page-locked mappings) does not survive a
//! `fork`, and neither do pinlane's threads: a lock one of them held at the fork stays
//! held in the child. CUDA's answer is that a child must not use what its parent set up;
//! torch raises "Cannot re-initialize CUDA in forked subprocess". pinlane does the same:
//! from the start of the driver's set-up ([`watch`], from the driver's probe; a set-up
//! that fails takes it back), a `pthread_atfork` handler marks every child, and the calls
//! that would use the parent's state ([`check`]: the transfer calls before their first
//! lock, [`require`](super::require), [`bind`](super::bind)) return
//! [`Error::ForkedChild`] there before they touch the driver; so do waits that only the parent's threads could end (a non-blocking call's
//! handle, a prefetcher), at once. A child forked before pinlane set up CUDA is not
//! marked: it sets up its own. The parent is never affected.
//!
//! The cost on the hot path is one relaxed atomic load per check.

use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Once;

/// Set in a child forked after [`watch`] ran (by the handler, in the child only).
static FORKED: AtomicBool = AtomicBool::new(false);

/// Whether a child forked now is marked: from [`watch`] (as the driver's set-up starts)
/// until [`unwatch`] (a set-up that failed, leaving no state).
static ARMED: AtomicBool = AtomicBool::new(false);

/// Registers the handler once.
static WATCH: Once = Once::new();

extern "C" fn in_child() {
    // Async-signal-safe: one atomic load and one store.
    if ARMED.load(Ordering::Relaxed) {
        FORKED.store(true, Ordering::Relaxed);
    }
}

/// Marks every child forked from now on (the driver's state is about to exist). Called
/// as the driver's set-up starts, so that a child forked while it runs (another thread
/// inside `cuInit`, the set-up's lock held) is marked too.
pub(crate) fn watch() {
    ARMED.store(true, Ordering::SeqCst);
    WATCH.call_once(|| {
        // SAFETY: `in_child` is an `extern "C" fn()` that lives as long as the process (a
        // static function) and only loads and stores atomics, which is async-signal-safe
        // as a handler run in the child of a multi-threaded process must be. The other two
        // handlers are none.
        // It fails only without memory for the handler: then children are not marked and
        // get the driver's own errors, as they did before this module.
        let _ = unsafe { libc::pthread_atfork(None, None, Some(in_child)) };
    });
}

/// Children forked from now on are not marked: the set-up [`watch`] announced failed and
/// left no driver state (a child sets up its own, or fails as its parent did).
pub(crate) fn unwatch() {
    ARMED.store(false, Ordering::SeqCst);
}

/// Whether this process is a child marked at its fork.
#[inline]
pub(crate) fn marked() -> bool {
    FORKED.load(Ordering::Relaxed)
}

/// `Err(Error::ForkedChild)` in a child forked after pinlane set up CUDA; `op` names the
/// call that was refused.
#[inline]
pub(crate) fn check(op: &'static str) -> Result<()> {
    if marked() {
        return Err(Error::ForkedChild { op });
    }
    Ok(())
}
