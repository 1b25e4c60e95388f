//! What a call's time goes to, three ways, none of which prints:
//!
//! * feature `tracing`: a `pinlane.call` span per call (field `call`: `h2d`, `d2h`,
//!   `h2d_async`, `d2h_async`) with a `pinlane.phase` span per phase inside it (field
//!   `since`: the mark the phase starts at, `start` for the first);
//! * feature `nvtx`: the same as nested NVTX ranges (`pinlane h2d`, `since planned`, ...);
//! * always: [`trace_next_call`] arms a timer for the calling thread's next call, and
//!   [`last_trace`] returns its marks' offsets from the call's start (the bench prints
//!   them).
//!
//! The marks are the engine's phase boundaries (`planned`, `allocated`, `submitted`,
//! `synced`, ...). Without a subscriber, the features, or an armed timer, a mark costs a
//! thread-local read.

use std::cell::RefCell;
use std::time::{Duration, Instant};

#[derive(Default)]
struct State {
    armed: bool,
    /// The armed call's start and marks.
    timer: Option<(Instant, Vec<(&'static str, Instant)>)>,
    /// The last armed call's marks, as offsets from its start.
    last: Option<Vec<(&'static str, Duration)>>,
    /// Open `tracing` spans: the call's, then the current phase's.
    #[cfg(feature = "tracing")]
    spans: Vec<tracing::span::EnteredSpan>,
    /// A panic of the `tracing` subscriber (the caller's code) in a mark, which may come
    /// while copies run: kept, and resumed when the call ends ([`end`]), where nothing
    /// the call queued is in flight any more (in the rare call that unwinds for another
    /// panic after it, at the end of the thread's next call). Until then the call makes
    /// no more phase spans.
    #[cfg(feature = "tracing")]
    panicked: Option<Box<dyn std::any::Any + Send>>,
    /// Open NVTX ranges (call and phase) of this thread's calls.
    #[cfg(feature = "nvtx")]
    ranges: usize,
}

thread_local! {
    static STATE: RefCell<State> = RefCell::new(State::default());
}

/// Arms the phase timer for the calling thread's next transfer call; [`last_trace`] then
/// returns what it measured.
pub fn trace_next_call() {
    let _ = STATE.try_with(|s| s.borrow_mut().armed = true);
}

/// The phases of the calling thread's last call made after [`trace_next_call`]: each
/// mark (`planned`, `allocated`, `submitted`, `synced`, ...) with its offset from the
/// call's start. `None` if no armed call has ended on this thread.
///
/// ```
/// pinlane::observe::trace_next_call();
/// let b = vec![pinlane::Tensor::scalar(1u8)];
/// let _ = pinlane::transfer_tensor_h2d(&b);
/// let marks = pinlane::observe::last_trace().unwrap(); // empty without CUDA: nothing to do
/// assert!(marks.windows(2).all(|w| w[0].1 <= w[1].1));
/// ```
pub fn last_trace() -> Option<Vec<(&'static str, Duration)>> {
    STATE.try_with(|s| s.borrow().last.clone()).ok().flatten()
}

/// A call starts.
pub(crate) fn start(call: &'static str) {
    let _ = STATE.try_with(|s| {
        let mut s = s.borrow_mut();
        if std::mem::take(&mut s.armed) {
            s.timer = Some((Instant::now(), Vec::new()));
        }
        #[cfg(feature = "tracing")]
        {
            let span = tracing::debug_span!("pinlane.call", call).entered();
            s.spans.push(span);
            s.spans
                .push(tracing::trace_span!("pinlane.phase", since = "start").entered());
        }
        #[cfg(feature = "nvtx")]
        {
            if crate::driver::nvtx::push("pinlane ", call).is_some() {
                s.ranges += 1;
                if crate::driver::nvtx::push("since ", "start").is_some() {
                    s.ranges += 1;
                }
            }
        }
        #[cfg(not(feature = "tracing"))]
        let _ = call;
    });
}

/// A phase boundary of the running call.
pub(crate) fn mark(label: &'static str) {
    let _ = STATE.try_with(|s| {
        let mut s = s.borrow_mut();
        if let Some((_, marks)) = s.timer.as_mut() {
            marks.push((label, Instant::now()));
        }
        #[cfg(feature = "tracing")]
        if s.spans.len() >= 2 && s.panicked.is_none() {
            let State {
                spans, panicked, ..
            } = &mut *s;
            let open = spans.len();
            let next = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                drop(spans.pop()); // the phase that ends here
                spans.push(tracing::trace_span!("pinlane.phase", since = label).entered());
            }));
            if let Err(panic) = next {
                *panicked = Some(panic);
                // The phase's span was closed, its successor not opened: in its place, a
                // span no subscriber sees (`end` closes two).
                spans.truncate(open);
                if spans.len() < open {
                    spans.push(tracing::Span::none().entered());
                }
            }
        }
        #[cfg(feature = "nvtx")]
        if s.ranges >= 2 {
            crate::driver::nvtx::pop();
            if crate::driver::nvtx::push("since ", label).is_none() {
                s.ranges -= 1;
            }
        }
    });
}

/// The call ends (whatever its result), with nothing it queued in flight any more: a
/// panic its marks kept is resumed here.
pub(crate) fn end() {
    let panicked = STATE.try_with(|s| {
        let mut s = s.borrow_mut();
        if let Some((t0, marks)) = s.timer.take() {
            s.last = Some(marks.into_iter().map(|(l, at)| (l, at - t0)).collect());
        }
        #[cfg(feature = "nvtx")]
        while s.ranges > 0 {
            crate::driver::nvtx::pop();
            s.ranges -= 1;
        }
        close_spans(s)
    });
    if let Ok(Some(panic)) = panicked {
        std::panic::resume_unwind(panic);
    }
}

/// Closes the call's `tracing` spans (the subscriber's code, run here where nothing is in
/// flight) and returns the panic a mark kept, or else one of closing them (each closed
/// under its own catch: a second panic while the first unwinds would abort).
#[cfg(feature = "tracing")]
fn close_spans(mut s: std::cell::RefMut<'_, State>) -> Option<Box<dyn std::any::Any + Send>> {
    use std::panic::{catch_unwind, AssertUnwindSafe};
    let (phase, call) = (s.spans.pop(), s.spans.pop());
    let panicked = s.panicked.take();
    drop(s);
    let phase = catch_unwind(AssertUnwindSafe(|| drop(phase)));
    let call = catch_unwind(AssertUnwindSafe(|| drop(call)));
    panicked.or(phase.err()).or(call.err())
}

#[cfg(not(feature = "tracing"))]
fn close_spans(_: std::cell::RefMut<'_, State>) -> Option<Box<dyn std::any::Any + Send>> {
    None
}
