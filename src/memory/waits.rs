//! The two process-wide bounds on the memory layer's waits, set by the runtime from its
//! [`Config`](crate::config::Config) when it is installed: how long a `Drop` may wait for
//! recorded work ([`drop_wait`]), and how long a blocking call may wait for its copies
//! ([`sync_wait`]). Read where the waits are (the reaper, the retained registry, the
//! staging arena, the pools), which is why they live apart from all of them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The bound on a wait inside a `Drop` of the memory layer: set by the runtime from
/// [`Config::drop_sync_wait`](crate::config::Config::drop_sync_wait) (60 s until one is
/// made), in milliseconds.
static DROP_WAIT_MS: AtomicU64 = AtomicU64::new(60_000);

/// Sets the bound of [`drop_wait`].
pub(crate) fn set_drop_wait(d: Duration) {
    DROP_WAIT_MS.store(
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// How long a `Drop` may wait for recorded work before it retains instead.
pub(crate) fn drop_wait() -> Duration {
    Duration::from_millis(DROP_WAIT_MS.load(Ordering::Relaxed))
}

/// The bound on a blocking call's waits for its copies, in milliseconds (`u64::MAX`:
/// none): set by the runtime from
/// [`Config::sync_wait`](crate::config::Config::sync_wait).
static SYNC_WAIT_MS: AtomicU64 = AtomicU64::new(u64::MAX);

/// Sets the bound of [`sync_wait`].
pub(crate) fn set_sync_wait(d: Option<Duration>) {
    let ms = d.map_or(u64::MAX, |d| {
        u64::try_from(d.as_millis()).unwrap_or(u64::MAX - 1)
    });
    SYNC_WAIT_MS.store(ms, Ordering::Relaxed);
}

/// How long a blocking call may wait for its copies (`None`: as long as they take).
pub(crate) fn sync_wait() -> Option<Duration> {
    match SYNC_WAIT_MS.load(Ordering::Relaxed) {
        u64::MAX => None,
        ms => Some(Duration::from_millis(ms)),
    }
}
