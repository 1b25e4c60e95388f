//! The non-blocking calls' completion: the handle a call returns ([`Transfer`]), and one
//! process-wide completion thread that, when a call's event completes, releases the
//! owners its copies used (staging slots, device allocations, output blocks, source
//! clones) and wakes the handle. A handle's wait, `is_ready` or poll that finds the event
//! done first does that itself, on its own thread, when the call is its stream's oldest
//! ([`Pending::finish_if_done`]; session 68), as a lazy call's [`reap`] does.
//!
//! The engine owns what the copies touch, not the handle: a handle dropped or forgotten
//! before its copies finish frees nothing early and leaks nothing. The thread sleeps on a
//! condition variable; a host function queued after a call's event wakes it (no polling
//! while copies run), on a wake stream of pinlane's, never on the call's stream (the
//! driver may run all streams' host functions one at a time, so one there could hold the
//! stream's later copies behind another program's host functions: see [`Wake`]). Because
//! the driver skips host functions after an error, and may run them late, the thread
//! also looks at the pending events every [`FALLBACK`] while any are pending. Calls on
//! one stream complete in their order: only the oldest of each stream's calls is asked
//! about.
//!
//! A copy into existing tensors ([`Wake::Lazy`], on the caller's stream) queues no
//! wake-up at first: it is queued only once its handle is waited on (or asked
//! [`Transfer::is_ready`]), and the same thread's next such call on that stream, before it
//! leases anything, releases what its earlier calls used once their events are done
//! ([`reap`]: a serving loop that synchronises each step finds the last step done). What
//! nobody waits for and no later call finds is released by the completion thread once it
//! has been pending [`LAZY_GRACE`] (until then it is left to its own thread, so the two
//! do not race for it: a call that found its last step taken by the completion thread,
//! still being released, would wait for that step's slot). Events of completed calls
//! that nobody else holds are kept for the next calls ([`SPARE_EVENTS`] at most; none
//! kept once [`quiesce`] has begun).
//!
//! The thread is supervised. Releasing owners runs user code (an owner's `Drop`, a
//! DLPack deleter) and waking a handle runs its waker: a panic there is caught, recorded
//! on the device for its next call on any thread ([`Error::Panicked`], see
//! [`crate::driver::deferred`]), and the thread goes on. (Released on a calling thread,
//! such a panic is recorded for that thread's next call, named `"caller"`.) Should the
//! thread stop anyway, every handle still waiting is woken at once with [`Error::Worker`]
//! (what its copies use is retained: nothing proves them done), and the next call starts
//! a new thread.

use crate::driver::{Event, Stream};
use crate::error::{Error, Result};
use crate::memory::{Detached, InFlight};
use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// How often the completion thread looks at pending events when no host function has
/// woken it (after a CUDA error, the driver skips host functions).
const FALLBACK: Duration = Duration::from_millis(2);

/// How long the completion thread leaves a lazy call nobody waits on to the thread that
/// made it ([`reap`]) before it takes it itself.
const LAZY_GRACE: Duration = Duration::from_millis(5);

/// Completed calls' events kept for reuse (an event costs a driver call to make and one
/// to destroy).
const SPARE_EVENTS: usize = 32;

/// At most this many of a thread's completed calls on a stream are released by its next
/// lazy call (the completion thread takes any others).
const REAP_MAX: usize = 4;

/// A call's completion state, shared by its handle and the completion thread.
struct Shared {
    status: Mutex<Status>,
    cv: Condvar,
    /// Threads asleep on `cv` (changed and read only with `status` locked): `finish`
    /// notifies only when there is one, as a `Condvar` notification is a system call
    /// even with nobody waiting (~0.5 us), and most handles are never waited on asleep.
    sleepers: AtomicUsize,
    /// The completion thread will be woken when the call's event completes (a host
    /// function is queued, or a lazy call's will be on its first wait).
    armed: AtomicBool,
    /// The call's device: where a failure nobody can be handed is recorded.
    device: usize,
}

enum Status {
    /// Copies may still run; the waker of the task awaiting the handle, if any.
    Pending(Option<Waker>),
    /// Done: `Ok` once the event completed, or the error that made completion
    /// unprovable (the owners are then retained).
    Done(Result<()>),
    /// The result was handed out.
    Taken,
    /// The handle was dropped while the copies could still run: a failure then has no
    /// one to go to, and is recorded for the device's next call instead.
    Abandoned,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    /// Whether the copies may still run (not yet known done or failed).
    fn is_pending(&self) -> bool {
        matches!(*lock(&self.status), Status::Pending(_))
    }

    fn finish(&self, r: Result<()>) {
        self.finish_with(|| r);
    }

    /// Finishes with `r()` if still pending (finished once only); `r` is not called
    /// otherwise, so a fallback result costs nothing when it is not needed.
    fn finish_with(&self, r: impl FnOnce() -> Result<()>) {
        let (waker, sleepers) = {
            let mut s = lock(&self.status);
            let sleepers = self.sleepers.load(Ordering::Relaxed) > 0;
            match &*s {
                Status::Pending(_) => match std::mem::replace(&mut *s, Status::Done(r())) {
                    Status::Pending(w) => (w, sleepers),
                    _ => (None, sleepers),
                },
                Status::Abandoned => {
                    // Decided under the lock the handle's drop took: recorded once.
                    *s = Status::Taken;
                    drop(s);
                    if let Err(e) = r() {
                        crate::driver::deferred::record(self.device, e);
                    }
                    return;
                }
                Status::Done(_) | Status::Taken => return,
            }
        };
        if sleepers {
            self.cv.notify_all();
        }
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// One call in flight: its event, its owners (until released or retained), its handle's
/// state.
struct Job {
    /// Its place in the queues: a stream's oldest job may be taken by the completion
    /// thread or by a lazy call, and each takes it only if it is still the one it asked
    /// about.
    id: u64,
    /// The thread that made the call: only that thread's later calls release it
    /// ([`reap`]), so a panic in its owners' drops lands where its own errors do.
    thread: std::thread::ThreadId,
    /// For a lazy call: when it was queued (see [`LAZY_GRACE`]).
    lazy_since: Option<std::time::Instant>,
    done: Event,
    owners: Option<Detached>,
    shared: Arc<Shared>,
}

impl Job {
    /// A lazy call nobody waits on, queued less than [`LAZY_GRACE`] ago: its own thread's
    /// next call releases it ([`reap`]), not the completion thread.
    fn left_to_its_thread(&self) -> bool {
        self.lazy_since.is_some_and(|t| t.elapsed() < LAZY_GRACE)
            && !self.shared.armed.load(Ordering::Acquire)
    }
}

impl Drop for Job {
    /// A job dropped before [`complete`] finished it (the thread stopped): its handle is
    /// woken with an error, and its owners, dropped unreleased, are retained.
    fn drop(&mut self) {
        // Built only for a job still pending: a completed one (every job, normally) pays
        // one lock, no allocation.
        self.shared.finish_with(|| {
            Err(Error::Worker {
                reason: "pinlane's completion thread stopped before this transfer completed; \
                         what its copies use is retained"
                    .into(),
            })
        });
    }
}

/// Pending calls, per stream, oldest first.
#[derive(Default)]
struct Queues {
    by_stream: HashMap<(usize, usize), VecDeque<Job>>,
    /// A host function ran since the thread last looked.
    poked: bool,
    started: bool,
    /// Set by [`quiesce`]: the thread exits once no call is pending (the next call starts
    /// a new one).
    stop: bool,
    /// The thread sleeps with nothing pending and no timeout: a new job must wake it.
    idle: bool,
    next_id: u64,
    /// Completed calls' events that nobody else holds, for the next calls.
    spare: Vec<Event>,
    /// Jobs a calling thread took off the queues ([`reap`], a handle's wait) and is still
    /// releasing: [`quiesce`] waits for them too.
    off_thread: usize,
}

struct Completer {
    queues: Mutex<Queues>,
    cv: Condvar,
    /// Signalled when the thread exits after [`quiesce`] (its own condvar: a wake-up for
    /// the thread must never go to a waiter here instead).
    exited: Condvar,
}

static COMPLETER: LazyLock<Completer> = LazyLock::new(|| Completer {
    queues: Mutex::new(Queues::default()),
    cv: Condvar::new(),
    exited: Condvar::new(),
});

/// Queued on the wake stream after a call's event ([`queue_wake`]): wakes the completion
/// thread. Calls no CUDA function, as a host function must not.
fn poke() {
    lock(&COMPLETER.queues).poked = true;
    COMPLETER.cv.notify_one();
}

/// When a detached call's wake-up (the host function that pokes the completion thread)
/// is queued. Either way it goes on pinlane's wake stream of the device, made to wait for
/// the call's event ([`queue_wake`]), never on the call's stream: the driver may run the
/// host functions of all streams one at a time (measured on an H100, driver 580, session
/// 67: one queued on an idle stream ran 479 ms late, behind another stream's 500 ms host
/// function), so a host function on the call's stream held every later copy there (the
/// thread's next transfer waited 2968 ms for another thread's host function).
pub(crate) enum Wake {
    /// At once (a call on pinlane's own stream, or a D2H on the caller's `stream`).
    Now,
    /// For a call on the caller's stream (copies into existing tensors): only once the
    /// handle is waited on. Until then the calling thread's next lazy call on the stream
    /// ([`reap`], which that call makes once its copies are queued), or the completion
    /// thread once the call has been pending [`LAZY_GRACE`], finds the event done.
    Lazy,
}

/// Queues the host function that pokes the completion thread once `done` (recorded on the
/// call stream `stream`) has completed, on that stream's wake stream (see [`Wake`]). A
/// failure is not the call's: without the wake-up the completion thread's fallback still
/// finds the event done, a little later.
fn queue_wake(done: &Event, stream: (usize, usize)) {
    let _ = wake_stream(stream).and_then(|s| {
        done.wait_on(&s)?;
        s.call_after(poke)
    });
}

/// Instead of synchronising `job`'s stream: records an event after its copies and hands
/// its owners (and `sources()`) to the completion thread, its wake-up queued where `wake`
/// says. On error (the event cannot be made or recorded) the copies are drained first,
/// as a failed blocking call does.
pub(crate) fn detach<S: Send + 'static>(
    job: InFlight,
    device: usize,
    sources: impl FnOnce() -> S,
    wake: Wake,
    spin: Duration,
) -> Result<Pending> {
    let done = match spare_event(device) {
        Ok(e) => e,
        Err(e) => return Err(job.abort(e, sources)),
    };
    let owners = job.detach(&done, sources)?;
    // Recorded after the copies; from here on it may reach the caller (`ready_event`), who
    // must not record it again.
    done.seal();
    super::trace::mark("event recorded");
    let lazy = match wake {
        Wake::Now => {
            queue_wake(&done, owners.stream().key());
            false
        }
        Wake::Lazy => true,
    };
    enqueue(owners, done, lazy, spin)
}

/// An event of `device` for a call: a spare one, else a new one.
fn spare_event(device: usize) -> Result<Event> {
    let spare = {
        let mut q = lock(&COMPLETER.queues);
        let at = q.spare.iter().rposition(|e| e.index() == device);
        at.map(|k| q.spare.swap_remove(k))
    };
    match spare {
        Some(e) => Ok(e),
        None => Event::new(crate::device::Device::cuda(device)),
    }
}

/// Keeps a completed call's event for the next calls if nobody else holds it, there is
/// room, and no [`quiesce`] has begun; else it is destroyed here, outside the queues'
/// lock (destroying it enters the driver).
fn recycle(done: Event) {
    let Some(done) = reusable(done) else { return };
    let refused = {
        let mut q = lock(&COMPLETER.queues);
        if q.spare.len() < SPARE_EVENTS && !q.stop {
            q.spare.push(done);
            None
        } else {
            Some(done)
        }
    };
    drop(refused);
}

/// `done`, unsealed for pinlane's next call, if no other handle holds it (a caller's
/// clone of a ready event stays sealed, so it can never record it).
fn reusable(done: Event) -> Option<Event> {
    if !done.reusable() {
        return None;
    }
    // The last handle: no caller holds it any more.
    done.unseal();
    Some(done)
}

/// Releases, on the calling thread, what its own oldest calls on stream `key` used, for
/// those (at most [`REAP_MAX`]) whose events completed without error: a copy into
/// existing tensors makes this once its own copies are queued (or before it leases, when
/// it finds no staging slot free), so a serving loop's last step's slot is back in the
/// ring for the next one. It stops at a stream's oldest call that is another thread's,
/// not done, or failed: the completion thread takes those (a failure of a dropped handle
/// is recorded there for the device's next call on any thread). Events are asked with
/// the queues unlocked (see [`run`]); a job is taken only if it is still its stream's
/// oldest.
pub(crate) fn reap(key: (usize, usize)) {
    let me = std::thread::current().id();
    for _ in 0..REAP_MAX {
        let head = {
            let q = lock(&COMPLETER.queues);
            let head = q.by_stream.get(&key).and_then(VecDeque::front);
            head.filter(|j| j.thread == me)
                .map(|j| (j.id, j.done.clone()))
        };
        let Some((id, done)) = head else { return };
        if !matches!(done.completed(), Ok(true)) {
            return;
        }
        drop(done);
        match take_off_thread(key, id) {
            Some((job, _releasing)) => {
                // Pinlane's own release, on a transfer's path: a page-locked block freed
                // here goes to the reaper thread (`memory::reaper`).
                let _own = crate::memory::reaper::releasing();
                complete(job, Ok(()));
            }
            None => return, // the completion thread took it
        }
    }
}

/// Stream `key`'s oldest job, if it is job `id`, taken off the queues for release on the
/// calling thread ([`reap`], a handle's wait), with a guard that tells [`quiesce`] when
/// that release has ended.
fn take_off_thread(key: (usize, usize), id: u64) -> Option<(Job, OffThread)> {
    let mut q = lock(&COMPLETER.queues);
    let job = take_head(&mut q, key, id);
    if q.by_stream.get(&key).is_some_and(VecDeque::is_empty) {
        q.by_stream.remove(&key);
    }
    let job = job?;
    q.off_thread += 1;
    Some((job, OffThread))
}

/// A job being released on a calling thread ([`take_off_thread`]): counted in
/// `Queues::off_thread` until dropped.
struct OffThread;

impl Drop for OffThread {
    fn drop(&mut self) {
        let mut q = lock(&COMPLETER.queues);
        q.off_thread -= 1;
        if q.off_thread == 0 && q.stop {
            COMPLETER.exited.notify_all();
        }
    }
}

/// Stream `key`'s oldest job, if it is job `id`.
fn take_head(q: &mut Queues, key: (usize, usize), id: u64) -> Option<Job> {
    let jobs = q.by_stream.get_mut(&key)?;
    if jobs.front()?.id != id {
        return None;
    }
    jobs.pop_front()
}

/// Wake streams per device. A wake-up waits in its wake stream's order, behind the events
/// of the wake-ups queued there before it, so the call's stream picks one ([`wake_stream`]):
/// calls on one stream, which complete in order anyway, share one. Calls on streams that
/// hash to the same wake stream can queue behind each other's events (with four streams
/// in use, two share one more often than not); such a call is then found done by the
/// completion thread's look every [`FALLBACK`], about 2 ms late, not by its wake-up.
const WAKE_STREAMS: usize = 8;

/// The wake stream of the call stream `key` (its device and handle): one of
/// [`WAKE_STREAMS`] per device, made on first use and kept for the process (a stream holds
/// no memory).
fn wake_stream(key: (usize, usize)) -> Result<crate::driver::Stream> {
    static STREAMS: Mutex<Vec<((usize, usize), crate::driver::Stream)>> = Mutex::new(Vec::new());
    // The handle's address times a large odd constant, middle bits (its low bits are
    // alignment).
    let slot = ((key.1 as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) as usize % WAKE_STREAMS;
    let at = (key.0, slot);
    let mut streams = lock(&STREAMS);
    if let Some((_, s)) = streams.iter().find(|(k, _)| *k == at) {
        return Ok(s.clone());
    }
    let s = crate::driver::Stream::new(crate::device::Device::cuda(key.0))?;
    streams.push((at, s.clone()));
    Ok(s)
}

/// Hands a detached call's owners and event to the completion thread (started if need
/// be) and returns what its handle waits on.
fn enqueue(owners: Detached, done: Event, lazy: bool, spin: Duration) -> Result<Pending> {
    let shared = Arc::new(Shared {
        status: Mutex::new(Status::Pending(None)),
        cv: Condvar::new(),
        sleepers: AtomicUsize::new(0),
        armed: AtomicBool::new(!lazy),
        device: done.index(),
    });
    let k = owners.stream().key();
    let mut q = lock(&COMPLETER.queues);
    let id = q.next_id;
    q.next_id += 1;
    let job = Job {
        id,
        thread: std::thread::current().id(),
        lazy_since: lazy.then(std::time::Instant::now),
        done: done.clone(),
        owners: Some(owners),
        shared: shared.clone(),
    };
    q.by_stream.entry(k).or_default().push_back(job);
    if !q.started {
        q.stop = false;
        let spawned = match crate::driver::fault_point(
            crate::driver::FaultKindTag::ThreadStart,
            "start the completion thread",
        ) {
            // A test's injected fault (feature `test-util`): the start fails.
            Err(e) => Err(std::io::Error::other(e.to_string())),
            Ok(()) => std::thread::Builder::new()
                .name("pinlane-complete".into())
                .spawn(run)
                .map(drop),
        };
        match spawned {
            Ok(()) => q.started = true,
            Err(e) => {
                // No thread: the call fails, its copies drained first as a failed blocking
                // call's are, within the drop bound; past it, what they use is retained
                // (released by a later call once their stream is found idle).
                let job = q.by_stream.get_mut(&k).and_then(VecDeque::pop_back);
                drop(q);
                let e = Error::Worker {
                    reason: format!("cannot start the completion thread: {e}"),
                };
                if let Some(job) = job {
                    let device = job.done.index();
                    let waited = job.done.done_within(crate::memory::waits::drop_wait());
                    if let Err(drain) = &waited {
                        // The call returns why it failed; the device's error goes to its
                        // next call, as any error no call can return.
                        crate::driver::deferred::record(device, drain.clone());
                    }
                    let r = waited.and_then(|done| if done { Ok(()) } else { Err(e.clone()) });
                    complete(job, r);
                }
                return Err(e);
            }
        }
    }
    // A thread that sleeps with a timeout looks at the new job then (its wake-up, if
    // armed, pokes it sooner).
    let idle = std::mem::take(&mut q.idle);
    drop(q);
    if idle {
        COMPLETER.cv.notify_one();
    }
    Ok(Pending {
        shared,
        done,
        stream: k,
        id,
        spin,
    })
}

/// What a non-blocking call returns besides its batch: the state to wait on and the event
/// after its copies.
pub(crate) struct Pending {
    shared: Arc<Shared>,
    done: Event,
    /// The call stream's key, which picks the wake stream ([`wake_stream`]).
    stream: (usize, usize),
    /// The call's job in its stream's queue.
    id: u64,
    /// How long a wait spins on the event before it sleeps ([`Pending::finish_if_done`]).
    spin: Duration,
}

impl Pending {
    /// Before a wait: makes sure the completion thread is woken when the copies are done
    /// (a lazy call's wake-up is queued on its first wait, see [`Wake::Lazy`]).
    fn arm(&self) {
        if self.shared.armed.load(Ordering::Acquire)
            || !self.shared.is_pending()
            || self.shared.armed.swap(true, Ordering::AcqRel)
        {
            return;
        }
        queue_wake(&self.done, self.stream);
    }

    /// Asks the call's event, for up to `limit` (at most the call's `Config::spin`; once
    /// for zero) and, once it is done, finishes the call on this thread as the completion
    /// thread would (owners released, status done) if it is still its stream's oldest.
    /// A wait does this before it sleeps, `is_ready` and `poll` once: the completion
    /// thread's wake-up (a host function, then two thread wake-ups) cost about 19 us on
    /// a call whose copies take a few (session 67, `benches/async_small.rs`). Says
    /// whether the call is no longer pending. An error asking the event, a call that is
    /// not its stream's oldest, or one the completion thread took meanwhile, is left to
    /// that thread (a wait then sleeps as before).
    fn finish_if_done(&self, limit: Duration) -> bool {
        if !self.shared.is_pending() {
            return true;
        }
        let limit = limit.min(self.spin);
        let start = std::time::Instant::now();
        loop {
            match self.done.completed() {
                Ok(true) => break,
                Ok(false) if start.elapsed() < limit => std::hint::spin_loop(),
                _ => return false,
            }
        }
        if let Some((job, _releasing)) = take_off_thread(self.stream, self.id) {
            // Pinlane's own release, as in `reap`: a page-locked block freed here goes to
            // the free thread (`memory::reaper`), so the wait does not wait for the
            // device's other work.
            let _own = crate::memory::reaper::releasing();
            complete(job, Ok(()));
        }
        !self.shared.is_pending()
    }
}

impl Drop for Pending {
    /// A handle dropped before its result was handed out: a failure already known is
    /// recorded for the device's next call now; one still to come is recorded by
    /// [`Shared::finish_with`] (the status says which, under one lock, so once).
    fn drop(&mut self) {
        let mut status = lock(&self.shared.status);
        match std::mem::replace(&mut *status, Status::Taken) {
            Status::Pending(_) => *status = Status::Abandoned,
            Status::Done(Err(e)) => {
                drop(status);
                crate::driver::deferred::record(self.shared.device, e);
            }
            Status::Done(Ok(())) | Status::Taken | Status::Abandoned => {}
        }
    }
}

/// Releases (or, on error, retains) a finished job's owners and wakes its handle, on the
/// completion thread or a calling thread (a wait, a lazy call's [`reap`]). Both run user
/// code (owners' drops, the waker): a panic there is recorded for the device's next call
/// (`deferred::catch_user_panic`: on any thread from the completion thread, on that
/// thread from a caller's), and the handle still gets `r`.
fn complete(mut job: Job, r: Result<()>) {
    let mut outcome = r.clone();
    let device = job.done.index();
    let released = crate::driver::deferred::catch_user_panic(
        device,
        "releasing a completed transfer's owners",
        || match (job.owners.take(), r) {
            (Some(owners), Ok(())) => {
                if owners.release(&job.done) {
                    job.shared.finish(Ok(()));
                } else {
                    // Seen done, then not proven when asked again: what the copies used
                    // is retained and the outputs stay unreadable, so no success.
                    let e = Error::Internal {
                        op: "completion",
                        reason:
                            "the call's event could not be asked again after it was seen done; \
                                 what its copies used is retained"
                                .into(),
                    };
                    outcome = Err(e.clone());
                    job.shared.finish(Err(e));
                }
            }
            (owners, r) => {
                if let Some(owners) = owners {
                    owners.retain();
                }
                // A handle dropped already (a copy into existing tensors, say) has left
                // the status abandoned: `finish` records the error for the device then.
                job.shared.finish(r);
            }
        },
    );
    if !released {
        // A no-op if the panic came after it; the waker it may run is user code too.
        let shared = &job.shared;
        crate::driver::deferred::catch_user_panic(
            device,
            "waking a handle after its release panicked",
            || shared.finish(outcome.clone()),
        );
    }
    if outcome.is_ok() {
        let done = job.done.clone();
        drop(job);
        recycle(done);
    }
}

/// Waits up to `limit` for every pending non-blocking call to complete (owners released,
/// handles woken; also those a calling thread is releasing) and the completion thread to
/// exit; says whether both happened. A call made meanwhile starts a new thread. For
/// [`Runtime::shutdown`](crate::runtime::Runtime::shutdown).
pub(crate) fn quiesce(limit: std::time::Duration) -> bool {
    let deadline = crate::driver::deadline_after(limit);
    let mut q = lock(&COMPLETER.queues);
    q.stop = true;
    COMPLETER.cv.notify_all();
    let exited = loop {
        if !q.started && q.off_thread == 0 {
            break true;
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            break false;
        }
        // The thread notifies when it exits; the step bounds a missed wake-up.
        q = COMPLETER
            .exited
            .wait_timeout(q, left.min(std::time::Duration::from_millis(5)))
            .unwrap_or_else(|p| p.into_inner())
            .0;
    };
    // The spare events go too (no more are kept while `stop` is set), destroyed outside
    // the lock: that enters the driver.
    let spare = std::mem::take(&mut q.spare);
    drop(q);
    drop(spare);
    exited
}

/// Dropped when the completion thread ends by unwinding: wakes every
/// waiting handle with an error (dropping their jobs) and lets the next call start a new
/// thread.
struct Supervisor;

impl Drop for Supervisor {
    fn drop(&mut self) {
        let jobs = {
            let mut q = lock(&COMPLETER.queues);
            q.started = false;
            std::mem::take(&mut q.by_stream)
        };
        // Each job's drop wakes its handle's waker (user code): one at a time, each
        // caught, since a panic escaping a drop while this thread unwinds would abort the
        // process; what one raises is recorded for the device's next call.
        for job in jobs.into_values().flatten() {
            crate::driver::deferred::catch_user_panic(
                job.done.index(),
                "waking a handle as the completion thread ended",
                || drop(job),
            );
        }
    }
}

thread_local! {
    /// Set on the completion thread: a blocking wait there for a call still pending would
    /// wait for the thread that ends it ([`refuse_own_wait`]).
    static ON_COMPLETION_THREAD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Refuses a blocking wait for a call still pending (`shared`) on the completion thread
/// (from a waker or a `Drop` it runs): that thread is the one that would end the wait,
/// so it would wait for ever (`wait`) or always to its limit (`wait_timeout`). The
/// thread is asked first (a thread-local read): other threads never take the status
/// lock for it.
fn refuse_own_wait(shared: &Shared, op: &'static str) -> Result<()> {
    let on_it = ON_COMPLETION_THREAD
        .try_with(std::cell::Cell::get)
        .unwrap_or(false);
    if on_it && shared.is_pending() {
        return Err(Error::WaitOnCompletionThread { op });
    }
    Ok(())
}

/// The completion thread.
fn run() {
    crate::driver::deferred::mark_background_thread("completion");
    let _ = ON_COMPLETION_THREAD.try_with(|c| c.set(true));
    let supervisor = Supervisor;
    let mut q = lock(&COMPLETER.queues);
    loop {
        // The oldest call of each stream whose event has an answer. The events are asked
        // with the queues unlocked: `poke` (a host function, on the driver's thread) takes
        // that lock, and must not wait on a thread that is inside the driver.
        let mut finished = Vec::new();
        loop {
            let heads: Vec<((usize, usize), u64, Event)> = q
                .by_stream
                .iter()
                .filter_map(|(k, jobs)| jobs.front().map(|j| (k, j)))
                .filter(|(_, j)| !j.left_to_its_thread())
                .map(|(k, j)| (*k, j.id, j.done.clone()))
                .collect();
            drop(q);
            let answers: Vec<((usize, usize), u64, Result<()>)> = heads
                .into_iter()
                .filter_map(|(k, id, e)| match e.completed() {
                    Ok(false) => None,
                    r => Some((k, id, r.map(|_| ()))),
                })
                .collect();
            q = lock(&COMPLETER.queues);
            if answers.is_empty() {
                break;
            }
            // A lazy call may have taken a head meanwhile ([`reap`]): a job is taken only
            // if it is still the one asked about.
            for (k, id, r) in answers {
                if let Some(job) = take_head(&mut q, k, id) {
                    finished.push((job, r));
                }
            }
        }
        q.by_stream.retain(|_, jobs| !jobs.is_empty());
        if !finished.is_empty() {
            drop(q);
            for (job, r) in finished {
                complete(job, r);
            }
            q = lock(&COMPLETER.queues);
            continue;
        }
        if std::mem::take(&mut q.poked) {
            continue;
        }
        if q.by_stream.is_empty() && q.stop {
            // Asked to stop, and nothing pending. `started` goes false under the same lock
            // that found the queues empty, so a call queued after this starts a new thread;
            // the supervisor must not take that thread's jobs.
            q.started = false;
            std::mem::forget(supervisor);
            COMPLETER.exited.notify_all();
            return;
        }
        q = if q.by_stream.is_empty() {
            q.idle = true;
            let mut q = COMPLETER.cv.wait(q).unwrap_or_else(|p| p.into_inner());
            q.idle = false;
            q
        } else {
            COMPLETER
                .cv
                .wait_timeout(q, FALLBACK)
                .unwrap_or_else(|p| p.into_inner())
                .0
        };
    }
}

/// A transfer that may still be running: what [`transfer_tensor_h2d_async`] and
/// [`transfer_tensor_d2h_async`] return once the copies are queued.
///
/// * [`Transfer::wait`] waits until the copies are done and returns the batch, or the
///   error that made them fail: it asks the call's event for up to
///   [`Config::spin`](crate::Config::spin) (50 us by default), as a blocking call waits
///   for its end flag, then sleeps. `.await` does the same in async code (the handle is
///   a `Future`), asking once per poll, never spinning.
/// * [`Transfer::is_ready`] asks without waiting.
/// * Whichever of these first finds the copies done releases what they used, on the
///   calling thread, if the call is its stream's oldest pending one; otherwise pinlane's
///   completion thread does, woken when they end. So these may run owners' drops (a
///   DLPack deleter of a source, say) and a task's waker on the calling thread: do not
///   call them holding a lock such code takes. A small call's wait is much closer to the
///   blocking call's than before (H100, session 68: one 1 KiB H2D and its wait 12.9 to
///   19.9 us against 32.4 to 34.2 before, blocking 11.6 to 13.4).
/// * [`Transfer::ready_event`] is an event recorded after the copies: a consumer stream
///   that waits on it ([`Event::wait_on`]) runs after them, without the host waiting;
///   [`Transfer::batch_for`] does that and lends the device batch for work queued there.
/// * Dropping (or forgetting) a handle before its copies finish is safe: pinlane keeps
///   what the copies use until they are done, then frees it. A driver's failure that a
///   dropped (not forgotten) handle held or would have held (the copies', or the call's
///   while queueing them) is not lost: it is recorded for the device's next call
///   ([`Error::Deferred`]; which thread's call sees it: [`crate::driver::deferred`]).
///
/// [`transfer_tensor_h2d_async`]: crate::transfer_tensor_h2d_async
/// [`transfer_tensor_d2h_async`]: crate::transfer_tensor_d2h_async
#[must_use = "a transfer's batch and errors come from wait() or .await"]
pub struct Transfer<B> {
    batch: Option<B>,
    pending: Option<Pending>,
    /// A failure while queueing (drained already), delivered by `wait()`.
    failed: Option<Failed>,
}

/// A non-blocking call's failure while queueing, kept by its handle: delivered by
/// `wait()` (or `.await`, `wait_timeout`), else, for a driver's failure, recorded for the
/// device's next call when the handle drops, as [`Pending`]'s drop records a failure of
/// the copies: a handle dropped unwaited loses no error (session 86; before, this one
/// was lost).
struct Failed {
    error: Error,
    /// Where to record it: the call's device; `None` for nowhere (no device, or an error
    /// that is no failure of the device's: a staging slot's wait given up).
    device: Option<usize>,
    /// [`Transfer::batch_for`] returned it already: nothing to record.
    seen: AtomicBool,
}

// The handle never pins its batch: moving it is always fine.
impl<B> Unpin for Transfer<B> {}

impl<B> Drop for Transfer<B> {
    /// In a child process forked after the call, the handle's batch and completion state
    /// are the parent's: they are forgotten, not dropped, since their drops could wait for
    /// a lock a parent's thread held at the fork (as [`Transfer::wait`] forgets the handle
    /// there; session 64: after `wait_timeout` or `.await` gave `Error::ForkedChild`, the
    /// handle was still dropped).
    ///
    /// A handle whose call failed while queueing, dropped before its error was handed
    /// out, records the error for the device's next call (on this thread, as a failure of
    /// the copies already known when a handle drops is).
    fn drop(&mut self) {
        // A handle with copies in flight can only be the parent's (a child's calls are
        // refused before they queue any); a ready one may be the child's own.
        if self.pending.is_some() && crate::driver::fork::marked() {
            std::mem::forget(self.pending.take());
            std::mem::forget(self.batch.take());
        }
        if let Some(f) = self.failed.take() {
            if let (Some(device), false) = (f.device, f.seen.load(Ordering::Relaxed)) {
                crate::driver::deferred::record(device, f.error);
            }
        }
    }
}

impl<B> Transfer<B> {
    /// A transfer with nothing in flight (a pass-through, no CUDA, or a path that
    /// finished its copies inside the call).
    pub(crate) fn ready(batch: B) -> Transfer<B> {
        Transfer {
            batch: Some(batch),
            pending: None,
            failed: None,
        }
    }

    pub(crate) fn pending(batch: B, pending: Pending) -> Transfer<B> {
        Transfer {
            batch: Some(batch),
            pending: Some(pending),
            failed: None,
        }
    }

    /// A transfer on `device` that failed while its copies were being queued (they were
    /// drained, and retained if the drain failed, as in a blocking call): `wait()`
    /// returns `e`; dropped before that, the handle records it for the device.
    pub(crate) fn failed(e: Error, device: Option<usize>) -> Transfer<B> {
        Transfer {
            batch: None,
            pending: None,
            failed: Some(Failed {
                error: e,
                device,
                seen: AtomicBool::new(false),
            }),
        }
    }

    /// Whether the copies are done (or have failed): [`Transfer::wait`] then returns at
    /// once. Asks the call's event once (no wait); when it is done, the call's owners
    /// may be released here (see the type's docs). For a copy into existing tensors
    /// not yet done, the first call also asks to be told when the copies end (as waiting
    /// does), so that asking again soon after sees them done.
    pub fn is_ready(&self) -> bool {
        // In a forked child: `wait` returns `Error::ForkedChild` at once.
        if crate::driver::fork::marked() {
            return true;
        }
        self.pending.as_ref().is_none_or(|p| {
            if p.finish_if_done(Duration::ZERO) {
                return true;
            }
            p.arm();
            !p.shared.is_pending()
        })
    }

    /// An event recorded after the transfer's copies, on its device; `None` when nothing
    /// is in flight. A stream that waits on it ([`Event::wait_on`]) runs after the copies.
    /// It is pinlane's: its [`Event::record`] (and a clone's) is refused with
    /// [`Error::SealedEvent`], since pinlane waits for it before it lets go of the copies'
    /// buffers and orders the outputs' uses after it.
    pub fn ready_event(&self) -> Option<&Event> {
        self.pending.as_ref().map(|p| &p.done)
    }

    /// The batch for work queued on `stream`, before the copies are done: `stream` is
    /// made to wait for them on the device (the host does not wait). Only for batches
    /// whose moved tensors are on the device (an H2D transfer): host outputs cannot be
    /// read before the copies are done, so a D2H transfer's batch comes from
    /// [`Transfer::wait`]. Until the copies are proven done, the batch's outputs (and
    /// clones of them) stay ordered after them: a use on another stream
    /// ([`Tensor::device_ptr`](crate::Tensor::device_ptr),
    /// [`Tensor::to_dlpack_on`](crate::Tensor::to_dlpack_on), a transfer) makes that
    /// stream wait too, and [`Tensor::to_dlpack`](crate::Tensor::to_dlpack), which has no
    /// stream to order, is refused with
    /// [`Error::BytesInFlight`](crate::Error::BytesInFlight).
    ///
    /// # Errors
    /// [`Error::NotOnDevice`] for a transfer whose outputs are on the host; the error of
    /// a transfer that failed while queueing; the driver's error from
    /// `cuStreamWaitEvent`.
    pub fn batch_for(&self, stream: &Stream) -> Result<&B>
    where
        B: crate::batch::Batch,
    {
        if let Some(f) = &self.failed {
            f.seen.store(true, Ordering::Relaxed);
            return Err(f.error.clone());
        }
        let Some(batch) = self.batch.as_ref() else {
            return Err(taken());
        };
        if let Some(p) = &self.pending {
            crate::driver::fork::check("Transfer::batch_for")?;
            if crate::batch::tensors(batch).iter().any(|t| !t.is_cuda()) {
                return Err(Error::NotOnDevice {
                    op: "Transfer::batch_for",
                    location: crate::location::Location::Host,
                });
            }
            p.done.wait_on(stream)?;
        }
        Ok(batch)
    }

    /// Waits for the copies and returns the batch: asks their event for up to
    /// [`Config::spin`](crate::Config::spin), then sleeps. On a device that never
    /// finishes them this waits for ever; [`Transfer::wait_timeout`] bounds the wait.
    ///
    /// # Errors
    /// The error that made the copies fail, with the blocking calls' rules: nothing the
    /// copies used is freed before they are proven done (it is retained instead).
    /// [`Error::ForkedChild`] in a child process forked after the call (the thread that
    /// would end the wait is not there), at once; the handle is then forgotten, not
    /// dropped (its batch and completion state are the parent's, and dropping them could
    /// wait for a lock a parent's thread held at the fork).
    /// [`Error::WaitOnCompletionThread`] when called on pinlane's completion thread (from
    /// a waker, or a drop that thread runs) before the copies are known done, at once:
    /// that thread is the one that would end the wait.
    pub fn wait(mut self) -> Result<B> {
        if let Some(p) = &self.pending {
            // (The handle's drop then forgets what it holds: see `Drop for Transfer`.)
            crate::driver::fork::check("Transfer::wait")?;
            // (Refused, the handle is dropped unfinished: the completion thread finishes
            // the call later.)
            refuse_own_wait(&p.shared, "Transfer::wait")?;
            if p.finish_if_done(Duration::MAX) {
                return self.take();
            }
            p.arm();
            let mut s = lock(&p.shared.status);
            p.shared.sleepers.fetch_add(1, Ordering::Relaxed);
            while let Status::Pending(_) = *s {
                s = p.shared.cv.wait(s).unwrap_or_else(|e| e.into_inner());
            }
            p.shared.sleepers.fetch_sub(1, Ordering::Relaxed);
        }
        self.take()
    }

    /// Waits at most `limit` for the copies (spinning for at most
    /// [`Config::spin`](crate::Config::spin) of it, as [`wait`](Transfer::wait) does):
    /// `Some` with what [`wait`](Transfer::wait) returns once they are done, `None` if they are not done
    /// by then. After `None` the handle is as before (wait again, or drop it: pinlane keeps
    /// what the copies use until they finish); after `Some` its batch is taken, except
    /// after `Some(Err(Error::WaitOnCompletionThread))`: called on pinlane's completion
    /// thread before the copies are known done, it refuses at once and keeps the handle
    /// as it was (that thread is the one that would end the wait).
    ///
    /// ```
    /// # fn main() -> pinlane::Result<()> {
    /// let batch = vec![pinlane::Tensor::from_vec(vec![1u8; 16], [16])?];
    /// let mut t = pinlane::transfer_tensor_h2d_async(&batch, &pinlane::H2dOptions::default())?;
    /// let on_gpu = loop {
    ///     match t.wait_timeout(std::time::Duration::from_millis(100)) {
    ///         Some(r) => break r?,
    ///         None => eprintln!("still copying"), // a server would check its deadline here
    ///     }
    /// };
    /// # let _ = on_gpu;
    /// # Ok(()) }
    /// ```
    pub fn wait_timeout(&mut self, limit: std::time::Duration) -> Option<Result<B>> {
        if let Some(p) = &self.pending {
            if let Err(e) = crate::driver::fork::check("Transfer::wait") {
                return Some(Err(e));
            }
            if let Err(e) = refuse_own_wait(&p.shared, "Transfer::wait_timeout") {
                return Some(Err(e));
            }
            let deadline = crate::driver::deadline_after(limit);
            if p.finish_if_done(limit) {
                return Some(self.take());
            }
            p.arm();
            let mut s = lock(&p.shared.status);
            let sleepers = &p.shared.sleepers;
            sleepers.fetch_add(1, Ordering::Relaxed);
            while let Status::Pending(_) = *s {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    sleepers.fetch_sub(1, Ordering::Relaxed);
                    return None;
                }
                s = p
                    .shared
                    .cv
                    .wait_timeout(s, left)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            sleepers.fetch_sub(1, Ordering::Relaxed);
        }
        Some(self.take())
    }

    /// The result, once done.
    fn take(&mut self) -> Result<B> {
        if let Some(f) = self.failed.take() {
            return Err(f.error);
        }
        let r = match &self.pending {
            None => Ok(()),
            Some(p) => {
                let mut s = lock(&p.shared.status);
                match std::mem::replace(&mut *s, Status::Taken) {
                    Status::Done(r) => r,
                    Status::Pending(w) => {
                        *s = Status::Pending(w);
                        return Err(taken());
                    }
                    Status::Taken | Status::Abandoned => return Err(taken()),
                }
            }
        };
        if r.is_ok() {
            // Done: the event goes back for the next calls if nobody else holds it (the
            // completion thread, a caller's clone from `ready_event`, an output still
            // ordered after it). Before, a waited call's event was destroyed here and the
            // next call made one: two driver calls a call.
            if let Some(p) = self.pending.take() {
                let done = p.done.clone();
                drop(p);
                recycle(done);
            }
        }
        let batch = self.batch.take().ok_or_else(taken);
        r.and(batch)
    }
}

fn taken() -> Error {
    Error::InvalidOption {
        name: "Transfer",
        reason: "its batch was already taken (polled after completion)".into(),
    }
}

impl<B> Future for Transfer<B> {
    type Output = Result<B>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Result<B>> {
        if let Some(p) = &self.pending {
            if let Err(e) = crate::driver::fork::check("Transfer::wait") {
                return Poll::Ready(Err(e));
            }
            if p.finish_if_done(Duration::ZERO) {
                return Poll::Ready(self.take());
            }
            p.arm();
            let mut s = lock(&p.shared.status);
            if let Status::Pending(w) = &mut *s {
                match w {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => *w = Some(cx.waker().clone()),
                }
                return Poll::Pending;
            }
        }
        Poll::Ready(self.take())
    }
}

impl<B> std::fmt::Debug for Transfer<B> {
    /// Says whether the copies are known done, without queueing a lazy call's wake-up
    /// (as [`Transfer::is_ready`] does).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ready = self.pending.as_ref().is_none_or(|p| !p.shared.is_pending());
        f.debug_struct("Transfer").field("ready", &ready).finish()
    }
}

#[cfg(all(test, feature = "test-util"))]
mod tests {
    use super::*;

    fn spare() -> usize {
        lock(&COMPLETER.queues).spare.len()
    }

    /// A call's sealed event is unsealed for the next call once no caller holds it, and
    /// not while one does.
    #[test]
    fn a_sealed_event_is_recorded_again_once_its_last_handle_is_pinlanes() {
        crate::sim_tests::setup();
        let s = crate::driver::Stream::new(crate::device::Device::cuda(0)).unwrap();
        let sealed = |e: &Event| matches!(e.record(&s), Err(Error::SealedEvent { .. }));
        let e = Event::new(crate::device::Device::cuda(0)).unwrap();
        e.seal();
        assert!(sealed(&e));
        let kept = e.clone();
        assert!(reusable(e).is_none(), "a caller holds a clone");
        assert!(sealed(&kept), "the caller's clone stays sealed");
        let again = reusable(kept).expect("the last handle");
        again.record(&s).unwrap();
    }

    /// Shutdown's quiesce destroys the spare events, and none is kept while it holds (a
    /// call after it starts a new thread and keeps them again).
    #[test]
    fn quiesce_leaves_no_spare_event() {
        crate::sim_tests::setup();
        let e = spare_event(0).unwrap();
        let kept = spare();
        recycle(e);
        assert_eq!(spare(), kept + 1, "a reusable event was not kept");
        let in_use = spare_event(0).unwrap();
        let clone = in_use.clone();
        recycle(in_use);
        assert_eq!(spare(), kept, "an event another handle holds was kept");
        drop(clone);
        assert!(quiesce(Duration::from_secs(5)));
        assert_eq!(spare(), 0, "spare events left after quiesce");
        recycle(Event::new(crate::device::Device::cuda(0)).unwrap());
        assert_eq!(spare(), 0, "an event kept after quiesce");
    }
}
