//! Copies into existing tensors step after step, as a server makes them (simulated
//! device, every machine): what a step's call hands to the completion machinery is
//! released by the thread's next call, events are reused, no host function is queued
//! unless a handle is waited on, and what nobody waits for is still released. Its own
//! binary: it reads process-wide counters (staging slots in use, events made), so its
//! tests take turns, and its staging arena has one slot (so a call that leased before
//! the last step's slot came back would wait for it).
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::sim::activity;
use pinlane::{
    memory_stats, set_current_stream, transfer_tensor_d2h, transfer_tensor_h2d_into, D2hOptions,
    DType, IntoOptions, Stream, Tensor,
};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The simulated device with a one-slot staging arena (64 KiB: every batch here fits).
fn sim() {
    common::sim_with(
        || common::sim_runtime().arena_bytes(64 << 10),
        common::sim_device,
    );
}

/// One test at a time: they count process-wide things.
fn turn() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// A serving step's inputs: three small tensors, their bytes set by `step`.
fn inputs(step: u64) -> Vec<Tensor> {
    vec![
        common::tensor(DType::I64, &[256], step * 3),
        common::tensor(DType::I32, &[33], step * 3 + 1),
        common::tensor(DType::F32, &[1000], step * 3 + 2),
    ]
}

/// A stream of the test's own and static destinations for [`inputs`] in one buffer.
struct Statics {
    stream: Stream,
    dst: Vec<Tensor>,
    _buf: Tensor,
    opts: IntoOptions,
}

impl Statics {
    /// `skew`: as [`common::into::destinations`]'.
    fn new(skew: usize) -> Statics {
        let stream = Stream::new(common::dev()).unwrap();
        let (dst, _buf, _) = common::into::destinations(&inputs(0), skew);
        let opts = IntoOptions::default().stream(stream.clone());
        Statics {
            stream,
            dst,
            _buf,
            opts,
        }
    }

    /// Copies `inputs(step)` in; the handle.
    fn copy(&self, step: u64) -> pinlane::Transfer<()> {
        transfer_tensor_h2d_into(&inputs(step), &self.dst, &self.opts).unwrap()
    }

    /// What the destinations hold once the stream's work so far has run.
    fn read(&self) -> Vec<Tensor> {
        let _current = set_current_stream(&self.stream);
        transfer_tensor_d2h(&self.dst, &D2hOptions::default()).unwrap()
    }
}

/// Staging slots leased now, by any call.
fn slots_in_use() -> usize {
    memory_stats().staging.in_use_count
}

/// Waits (polling, at most `limit`) until no staging slot is leased.
fn until_no_slot_in_use(limit: Duration) -> bool {
    let end = Instant::now() + limit;
    while Instant::now() < end {
        if slots_in_use() == 0 {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    slots_in_use() == 0
}

/// A loop that synchronises its stream every step and drops the handles: each call
/// releases the last step's slot, reuses its event, and queues no host function.
#[test]
fn a_serving_loop_releases_each_step_on_the_next() {
    sim();
    let _turn = turn();
    let st = Statics::new(0);
    for step in 0..3 {
        drop(st.copy(step));
        st.stream.synchronize().unwrap();
    }
    let before = activity().unwrap();
    let waits = memory_stats().slot_waits;
    const STEPS: u64 = 200;
    for step in 3..3 + STEPS {
        drop(st.copy(step));
        st.stream.synchronize().unwrap();
    }
    let after = activity().unwrap();
    assert_eq!(
        memory_stats().slot_waits,
        waits,
        "a step waited for the staging slot its last step held"
    );
    let made = after.events_created - before.events_created;
    assert!(made <= 20, "{made} events made for {STEPS} steps");
    assert_eq!(
        after.host_functions, before.host_functions,
        "a host function was queued though no handle was waited on"
    );
    assert_eq!(st.read(), inputs(2 + STEPS));
    assert!(until_no_slot_in_use(Duration::from_secs(2)));
}

/// A dropped handle and no later call: the completion thread still releases what the
/// copies used once they are done.
#[test]
fn a_last_dropped_handle_is_released() {
    sim();
    let _turn = turn();
    let st = Statics::new(1);
    st.stream.delay_async(Duration::from_millis(20)).unwrap();
    drop(st.copy(7));
    assert!(
        slots_in_use() >= 1,
        "the slot was released before the copies ran"
    );
    assert!(
        until_no_slot_in_use(Duration::from_secs(2)),
        "{} staging slots still in use",
        slots_in_use()
    );
    assert_eq!(st.read(), inputs(7));
}

/// Waiting on a handle queues its wake-up once; `wait_timeout`, `is_ready` and `wait`
/// all see the copies done.
#[test]
fn waiting_arms_the_wake_up_once() {
    sim();
    let _turn = turn();
    let st = Statics::new(0);
    st.stream.delay_async(Duration::from_millis(30)).unwrap();
    let before = activity().unwrap().host_functions;
    let mut t = st.copy(1);
    assert_eq!(activity().unwrap().host_functions, before);
    assert!(t.wait_timeout(Duration::from_millis(1)).is_none());
    assert_eq!(activity().unwrap().host_functions, before + 1);
    let end = Instant::now() + Duration::from_secs(5);
    while !t.is_ready() {
        assert!(Instant::now() < end, "is_ready never became true");
        std::thread::sleep(Duration::from_micros(200));
    }
    assert_eq!(activity().unwrap().host_functions, before + 1);
    t.wait().unwrap();

    // Awaited as a future, and waited on after the copies ran.
    st.stream.delay_async(Duration::from_millis(10)).unwrap();
    futures_lite_block_on(st.copy(2)).unwrap();
    let t = st.copy(3);
    st.stream.synchronize().unwrap();
    t.wait().unwrap();
    assert_eq!(st.read(), inputs(3));
}

/// Polls `f` to completion on this thread, sleeping between polls (no executor crate).
fn futures_lite_block_on<F: std::future::Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(std::sync::Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        assert!(Instant::now() < end, "the future was never woken");
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

/// Threads on streams of their own, each dropping, waiting on or keeping its handles and
/// synchronising now and then, while the completion thread looks at the same queues:
/// every step's bytes arrive, and everything is released at the end.
#[test]
fn threads_taking_turns_with_the_completion_thread() {
    sim();
    let _turn = turn();
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let st = Statics::new(t as usize);
                let mut kept = Vec::new();
                for step in 0..120u64 {
                    let h = st.copy(1000 * t + step);
                    match (step + t) % 3 {
                        0 => drop(h),
                        1 => h.wait().unwrap(),
                        _ => kept.push(h),
                    }
                    if step % 7 == 3 {
                        st.stream.synchronize().unwrap();
                    }
                    if step % 10 == 9 {
                        assert_eq!(
                            st.read(),
                            inputs(1000 * t + step),
                            "thread {t}, step {step}"
                        );
                    }
                }
                for h in kept {
                    h.wait().unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert!(
        until_no_slot_in_use(Duration::from_secs(2)),
        "{} staging slots still in use",
        slots_in_use()
    );
}
