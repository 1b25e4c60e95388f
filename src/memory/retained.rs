//! The registry of owners whose copies could not be proven complete.
//!
//! When a transfer fails and the drain (stream synchronisation) fails too, nobody knows
//! whether the copies already queued have finished. Freeing their buffers could let the
//! copy engine write into memory that is someone else's by then, so the owners (staging
//! slots, device allocations, clones of the source tensors) move here instead, and their
//! bytes are counted. A later successful synchronisation of the same stream proves the
//! copies done and releases them; [`try_release`] attempts that for every stream.
//!
//! A `Drop` whose wait for recorded work runs past its bound
//! ([`Config::drop_sync_wait`](crate::config::Config::drop_sync_wait)) puts what it
//! guards here too, with the events that must complete first: released once they have
//! (checked without blocking by every waiting lease, `trim()` and `shutdown`, or by
//! [`try_release`]).

use crate::driver::{Event, Stream};
use std::any::Any;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Mutex;

struct Entry {
    /// Its place among the entries pushed (see [`position`]).
    seq: u64,
    proof: Proof,
    _keep: Box<dyn Any + Send>,
    bytes: usize,
}

/// What proves an entry's owners unused.
enum Proof {
    /// A successful synchronisation of this stream.
    Stream(Stream),
    /// All these events complete.
    Events(Vec<Event>),
}

impl Entry {
    /// Proven unused by a synchronisation of `stream` that began at `position` `before`.
    fn proven_by(&self, stream: &Stream, before: u64) -> bool {
        self.seq < before && matches!(&self.proof, Proof::Stream(s) if s.same_as(stream))
    }
}

/// Entries pushed so far; an entry's `seq` is the count before its push.
static PUSHED: AtomicU64 = AtomicU64::new(0);

/// The registry's position now, read before a synchronisation begins: the wait proves
/// unused the entries pushed before it (their copies were queued before they were
/// pushed), and only those. An entry another thread pushes during the wait, on a stream
/// the two share, may hold copies queued after the wait began.
pub(crate) fn position() -> u64 {
    // Acquire: sees every push counted before this value (the counts are one release
    // sequence), and so the queuing of their copies.
    PUSHED.load(Ordering::Acquire)
}

static ENTRIES: Mutex<Vec<Entry>> = Mutex::new(Vec::new());
/// The number of ENTRIES. Written under the ENTRIES lock; read without it as the fast
/// "nothing retained" check (an entry may count no bytes: a copy into existing tensors
/// from page-locked sources keeps only clones of the caller's tensors).
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// Sum of `bytes` over ENTRIES. Written under the ENTRIES lock; read without it (Relaxed)
/// as a statistic.
static BYTES: AtomicUsize = AtomicUsize::new(0);

fn lock() -> std::sync::MutexGuard<'static, Vec<Entry>> {
    ENTRIES.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes held because their copies could not be proven complete: the staging slots and
/// the buffers of pinlane's own that the retained owners hold (a small H2D output whose
/// device block would be kept counts the whole block, as it holds it). Clones of the caller's
/// tensors they keep (the sources, a copy's destinations) are not counted: an owner group
/// may hold no counted bytes at all ([`retained_count`] counts the groups).
///
/// ```
/// assert_eq!(pinlane::memory::retained::retained_bytes(), 0);
/// ```
pub fn retained_bytes() -> usize {
    BYTES.load(Ordering::Relaxed)
}

/// Number of retained groups (one per failed drain, or per drop that outlived its bound).
pub fn retained_count() -> usize {
    COUNT.load(Ordering::Acquire)
}

/// Whether nothing is retained (the fast path of every release).
fn nothing_retained() -> bool {
    // Acquire, read after `position()`: sees every push that position counts (a push
    // adds to COUNT before it takes its place).
    COUNT.load(Ordering::Acquire) == 0
}

pub(crate) fn retain(stream: Stream, keep: Box<dyn Any + Send>, bytes: usize) {
    push(Proof::Stream(stream), keep, bytes);
}

/// Keeps `keep` (counted as `bytes`) until every event of `events` has completed.
pub(crate) fn retain_until(events: Vec<Event>, keep: Box<dyn Any + Send>, bytes: usize) {
    push(Proof::Events(events), keep, bytes);
}

fn push(proof: Proof, keep: Box<dyn Any + Send>, bytes: usize) {
    let mut entries = lock();
    BYTES.fetch_add(bytes, Ordering::Relaxed);
    COUNT.fetch_add(1, Ordering::Relaxed);
    let seq = PUSHED.fetch_add(1, Ordering::AcqRel);
    entries.push(Entry {
        seq,
        proof,
        _keep: keep,
        bytes,
    });
}

/// Releases the entries of `stream` pushed before `before` ([`position`], read before
/// the wait): the caller has just synchronised it successfully.
pub(crate) fn release_proven(stream: &Stream, before: u64) {
    if nothing_retained() {
        return;
    }
    let released = take(|e| e.proven_by(stream, before));
    drop_released(released);
}

/// Takes the entries that pass `gone` out of the registry, counts adjusted.
fn take(gone: impl Fn(&Entry) -> bool) -> Vec<Entry> {
    let mut entries = lock();
    let (out, kept): (Vec<_>, Vec<_>) = entries.drain(..).partition(|e| gone(e));
    *entries = kept;
    BYTES.fetch_sub(out.iter().map(|e| e.bytes).sum(), Ordering::Relaxed);
    COUNT.fetch_sub(out.len(), Ordering::Release);
    out
}

/// Drops released entries, outside the registry's lock (drops call the driver), as
/// pinlane's own release (a page-locked block freed here goes to the reaper thread).
/// They hold clones of other calls' tensors, whose owners' drops and DLPack deleters are
/// user code: each entry is dropped alone under `catch_unwind`, so a panic there does not
/// unwind into whichever call released it, and the other entries are still dropped; it is
/// recorded for the next call on the entry's device (on this thread, when it is a
/// caller's). Two panics inside one entry's drop still abort the process, as two panics
/// in the drop of one `Vec` do.
fn drop_released(released: Vec<Entry>) {
    let _own = super::reaper::releasing();
    for e in released {
        let device = match &e.proof {
            Proof::Stream(s) => s.index(),
            Proof::Events(evs) => evs.first().map_or(0, Event::index),
        };
        crate::driver::deferred::catch_user_panic(
            device,
            "releasing owners retained after a failed synchronisation",
            || drop(e),
        );
    }
}

/// Releases, without blocking, the entries whose stream has finished all the work queued
/// on it so far (an event recorded now on each such stream completes within `limit`):
/// what a call waiting for a staging slot does, since a blocking synchronisation could
/// wait forever on a hung device. `limit` bounds the whole call, however many streams
/// hold entries: their events are asked in turn until all are done or it has passed, so
/// a busy stream neither holds the call past it nor keeps an idle one from being released
/// (session 85: `limit` was each stream's, so `settle` and `shutdown` could run past their
/// timeouts by a multiple of it).
pub(crate) fn release_finished(limit: std::time::Duration) {
    if nothing_retained() {
        return;
    }
    let deadline = crate::driver::deadline_after(limit);
    let mut streams: Vec<Stream> = Vec::new();
    for e in lock().iter() {
        if let Proof::Stream(s) = &e.proof {
            if !streams.iter().any(|x| x.same_as(s)) {
                streams.push(s.clone());
            }
        }
    }
    // Every entry pushed before this point was queued before the events recorded below.
    let before = position();
    // A stream whose event cannot be made or recorded is not proven idle: its entries stay.
    let mut pending: Vec<(Stream, Event)> = streams
        .into_iter()
        .filter_map(|s| {
            let ev = Event::new(s.device()).ok()?;
            ev.record(&s).ok()?;
            Some((s, ev))
        })
        .collect();
    loop {
        pending.retain(|(s, ev)| match ev.query() {
            Ok(true) => {
                release_proven(s, before);
                false
            }
            Ok(false) => true,
            // Not proven: its entries stay, as for a stream still busy.
            Err(_) => false,
        });
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let Some((_, ev)) = pending.first() else {
            break;
        };
        if left.is_zero() {
            break;
        }
        // A nap on one of them (its own polling, at most 1 ms), then all are asked again.
        let _ = ev.done_within(left.min(std::time::Duration::from_millis(1)));
    }
    release_completed(|e| e.query() == Ok(true));
}

/// Releases the event-proven entries whose events all pass `done`, which runs under the
/// registry's lock and so must not block (an event query, not a wait).
fn release_completed(done: impl Fn(&Event) -> bool) {
    let released = take(|e| match &e.proof {
        Proof::Events(evs) => evs.iter().all(&done),
        Proof::Stream(_) => false,
    });
    drop_released(released);
}

/// Waits for every stream and event with retained owners, for at most
/// [`Config::drop_sync_wait`](crate::config::Config::drop_sync_wait) in all (polling:
/// a hung device does not hold the caller past it), and releases those found done.
/// Returns the bytes still retained (groups holding none of pinlane's bytes may remain:
/// [`retained_count`]).
pub fn try_release() -> usize {
    let deadline = crate::driver::deadline_after(super::waits::drop_wait());
    let left = || deadline.saturating_duration_since(std::time::Instant::now());
    let streams: Vec<Stream> = lock()
        .iter()
        .filter_map(|e| match &e.proof {
            Proof::Stream(s) => Some(s.clone()),
            Proof::Events(_) => None,
        })
        .collect();
    for s in streams {
        let before = position();
        if s.idle_within(left()) {
            release_proven(&s, before);
        }
    }
    // The events are waited for outside the lock (a wait may be long, and every retain
    // takes the lock), then released by a query, which does not block.
    let events: Vec<Event> = lock()
        .iter()
        .filter_map(|e| match &e.proof {
            Proof::Events(evs) => Some(evs.clone()),
            Proof::Stream(_) => None,
        })
        .flatten()
        .collect();
    for e in &events {
        let _ = e.done_within(left());
    }
    release_completed(|e| e.query() == Ok(true));
    retained_bytes()
}
