//! The binding's own phases of one call, for the benches (where a call's time goes
//! outside the engine, which traces itself): armed with the engine's trace by
//! `_native.trace_next_call()`, read by `_native.last_split()`. A call's outermost native
//! entry starts the timer ([`start`]); its steps mark the end of each phase ([`mark`]).
//! Unarmed, a mark is one thread-local look; nothing here can fail or panic a call.

use std::cell::RefCell;
use std::time::Instant;

#[derive(Default)]
struct State {
    /// The next call is timed.
    armed: bool,
    /// Entries of the timed call now running (an entry calls another: the flat calls
    /// call the list ones).
    depth: usize,
    start: Option<Instant>,
    marks: Vec<(&'static str, Instant)>,
    /// The last timed call's marks, in microseconds from its start, ending with `"end"`.
    last: Option<Vec<(&'static str, f64)>>,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Runs `f` on the thread's state, unless it is gone (thread exit) or in use.
fn with(f: impl FnOnce(&mut State)) {
    let _ = STATE.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            f(&mut s);
        }
    });
}

/// Times the calling thread's next call.
pub(crate) fn arm() {
    with(|s| s.armed = true);
}

/// A native entry of a call: ends the timing when the outermost one is dropped.
pub(crate) struct Entry(bool);

impl Entry {
    /// The entry turned the call away (a flat entry given a batch that is not flat, which
    /// the Python half then moves by another entry): nothing is recorded, and the thread
    /// stays armed for that entry.
    pub(crate) fn decline(mut self) {
        if !std::mem::take(&mut self.0) {
            return;
        }
        with(|s| {
            s.depth = s.depth.saturating_sub(1);
            if s.depth == 0 {
                s.start = None;
                s.marks.clear();
                s.armed = true;
            }
        });
    }
}

/// Enters a native entry: the timed call's first when the thread is armed.
pub(crate) fn start() -> Entry {
    let mut counted = false;
    with(|s| {
        if s.depth > 0 {
            s.depth += 1;
            counted = true;
        } else if std::mem::take(&mut s.armed) {
            s.depth = 1;
            s.start = Some(Instant::now());
            s.marks.clear();
            counted = true;
        }
    });
    Entry(counted)
}

/// Ends the phase `name` of the timed call, if one is running on this thread.
pub(crate) fn mark(name: &'static str) {
    with(|s| {
        if s.depth > 0 {
            s.marks.push((name, Instant::now()));
        }
    });
}

impl Drop for Entry {
    fn drop(&mut self) {
        if !self.0 {
            return;
        }
        with(|s| {
            s.depth = s.depth.saturating_sub(1);
            if s.depth > 0 {
                return;
            }
            if let Some(t0) = s.start.take() {
                let us = |t: Instant| t.duration_since(t0).as_secs_f64() * 1e6;
                let mut v: Vec<_> = s.marks.drain(..).map(|(n, t)| (n, us(t))).collect();
                v.push(("end", us(Instant::now())));
                s.last = Some(v);
            }
        });
    }
}

/// The last timed call's phases on this thread: `[(mark, microseconds from its start)]`.
pub(crate) fn last() -> Option<Vec<(&'static str, f64)>> {
    STATE
        .try_with(|s| s.try_borrow().ok().and_then(|s| s.last.clone()))
        .ok()
        .flatten()
}
