//! The registry of owners whose copies could not be proven complete.
//!
//! When a transfer fails and the drain (stream synchronisation) fails too, nobody knows
//! whether the copies already queued have finished. Freeing their buffers could let the
//! copy engine write into memory that is someone else's by then, so the owners (staging
//! slots, device allocations, clones of the source tensors) move here instead, and their
//! bytes are counted. A later successful synchronisation of the same stream proves the
//! copies done and releases them; [`try_release`] attempts that for every stream.

use crate::driver::Stream;
use std::any::Any;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

struct Entry {
    stream: Stream,
    _keep: Box<dyn Any + Send>,
    bytes: usize,
}

static ENTRIES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
/// Sum of `bytes` over ENTRIES. Written under the ENTRIES lock; read without it (Relaxed)
/// as a fast "nothing retained" check and a statistic.
static BYTES: AtomicUsize = AtomicUsize::new(0);

fn lock() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    ENTRIES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes held because their copies could not be proven complete.
///
/// ```
/// assert_eq!(pinlane::memory::retained::retained_bytes(), 0);
/// ```
pub fn retained_bytes() -> usize {
    BYTES.load(Ordering::Relaxed)
}

/// Number of retained groups (one per failed drain).
pub fn retained_count() -> usize {
    lock().len()
}

pub(crate) fn retain(stream: Stream, keep: Box<dyn Any + Send>, bytes: usize) {
    let mut entries = lock();
    BYTES.fetch_add(bytes, Ordering::Relaxed);
    entries.push(Entry {
        stream,
        _keep: keep,
        bytes,
    });
}

/// Releases the entries of `stream`: the caller has just synchronised it successfully.
pub(crate) fn release_proven(stream: &Stream) {
    if retained_bytes() == 0 {
        return;
    }
    let released: Vec<Entry> = {
        let mut entries = lock();
        let (gone, kept): (Vec<_>, Vec<_>) =
            entries.drain(..).partition(|e| e.stream.same_as(stream));
        *entries = kept;
        let bytes: usize = gone.iter().map(|e| e.bytes).sum();
        BYTES.fetch_sub(bytes, Ordering::Relaxed);
        gone
    };
    // Dropped outside the lock: drops call the driver.
    drop(released);
}

/// Releases, without blocking, the entries whose stream has finished all the work queued
/// on it so far (an event recorded now completes within `limit`): what a call waiting
/// for a staging slot does, since a blocking synchronisation could wait forever on a
/// hung device.
pub(crate) fn release_finished(limit: std::time::Duration) {
    if retained_bytes() == 0 {
        return;
    }
    let mut streams: Vec<Stream> = Vec::new();
    for e in lock().iter() {
        if !streams.iter().any(|s| s.same_as(&e.stream)) {
            streams.push(e.stream.clone());
        }
    }
    for s in streams {
        if s.idle_within(limit) {
            release_proven(&s);
        }
    }
}

/// Tries to synchronise every stream with retained owners and releases those that
/// succeed. Returns the bytes still retained.
pub fn try_release() -> usize {
    let streams: Vec<Stream> = lock().iter().map(|e| e.stream.clone()).collect();
    for s in streams {
        if s.synchronize().is_ok() {
            release_proven(&s);
        }
    }
    retained_bytes()
}
