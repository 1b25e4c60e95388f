//! A phase timer for one call, for finding where a transfer's time goes on the GPU
//! machine: [`trace_next_call`] arms it for the calling thread's next transfer, which then
//! prints each phase's offset from the start to stderr. Costs one thread-local read per
//! phase when not armed.

use std::cell::RefCell;
use std::time::Instant;

/// A running trace: its start and its phases.
type Running = Option<(Instant, Vec<(&'static str, Instant)>)>;

thread_local! {
    static TRACE: RefCell<Running> = const { RefCell::new(None) };
    static ARMED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Arms the phase timer for the calling thread's next transfer call.
#[doc(hidden)]
pub fn trace_next_call() {
    let _ = ARMED.try_with(|a| a.set(true));
}

/// Starts a trace if one is armed.
pub(crate) fn start() {
    if ARMED.try_with(|a| a.replace(false)).unwrap_or(false) {
        let _ = TRACE.try_with(|t| *t.borrow_mut() = Some((Instant::now(), Vec::new())));
    }
}

/// Records a phase of the running trace, if any.
pub(crate) fn mark(label: &'static str) {
    let _ = TRACE.try_with(|t| {
        if let Some((_, marks)) = t.borrow_mut().as_mut() {
            marks.push((label, Instant::now()));
        }
    });
}

/// Ends the running trace, printing it.
pub(crate) fn end(call: &str) {
    let _ = TRACE.try_with(|t| {
        if let Some((t0, marks)) = t.borrow_mut().take() {
            let phases: Vec<String> = marks
                .iter()
                .map(|(l, at)| format!("{l} {:.1}", (*at - t0).as_secs_f64() * 1e6))
                .collect();
            eprintln!("trace {call} (us from start): {}", phases.join(", "));
        }
    });
}
