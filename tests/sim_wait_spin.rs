//! A handle's `wait` asks the call's event for up to `Config::spin` before it sleeps, and
//! once the event is done finishes the call on the waiting thread, as the completion
//! thread would. Before (session 67, `benches/async_small.rs` on an H100), a non-blocking
//! 1 KiB H2D and its wait took about 28.5 us against 9.5 us blocking: the wait slept
//! until the completion thread, woken by a host function, had released the call and woken
//! it in turn.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_d2h_async, transfer_tensor_h2d, transfer_tensor_h2d_async,
    transfer_tensor_h2d_into, D2hOptions, DType, Device, H2dOptions, IntoOptions, Stream, Tensor,
    Transfer,
};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

/// How long the completion thread is kept busy in a handle's waker.
const HELD: Duration = Duration::from_millis(600);

/// One test at a time: they share pinlane's spare events and completion thread.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

fn setup() {
    // A spin long enough for the simulated device's copies (each operation delayed up to
    // 40 us, on a loaded machine more): the tests are about who finishes the call.
    common::sim_with(
        || common::sim_runtime().spin(Duration::from_millis(200)),
        common::sim_device,
    );
}

fn batch(seed: u64) -> Vec<Tensor> {
    vec![
        common::tensor(DType::F32, &[3000], seed),
        common::tensor(DType::U8, &[500], seed + 1),
    ]
}

/// A waker that, woken (on the completion thread), says so and then sleeps [`HELD`]: the
/// completion thread does nothing else meanwhile.
struct Sleepy(Mutex<Sender<()>>);

impl Wake for Sleepy {
    fn wake(self: Arc<Self>) {
        let _ = self.0.lock().unwrap().send(());
        std::thread::sleep(HELD);
    }
}

/// With the completion thread held in a waker for 600 ms, a non-blocking call's `wait`
/// (H2D, D2H, and a copy into existing tensors) still returns as soon as its copies are
/// done, with the right bytes: the waiting thread finishes the call itself. Without the
/// spin each wait slept until the completion thread was free again (600 ms).
#[test]
fn a_wait_finishes_its_call_without_the_completion_thread() {
    setup();
    let _turn = serial();
    let dev = Device::cuda(0);
    let b = batch(68);
    let on = transfer_tensor_h2d(&b).unwrap();
    transfer_tensor_h2d_async(&b, &H2dOptions::default())
        .unwrap()
        .wait()
        .unwrap(); // warm

    // A call on a stream of the test's, behind 20 ms of work, polled once with the
    // sleepy waker: when it completes, the completion thread runs the waker.
    let slow = Stream::new(dev).unwrap();
    slow.delay_async(Duration::from_millis(20)).unwrap();
    let mut held = Box::pin(
        transfer_tensor_d2h_async(&on, &D2hOptions::default().device(dev).stream(slow.clone()))
            .unwrap(),
    );
    let (tx, rx) = channel();
    let waker = Waker::from(Arc::new(Sleepy(Mutex::new(tx))));
    assert!(held
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the completion thread ran the waker");
    let t0 = Instant::now();

    let moved = transfer_tensor_h2d_async(&b, &H2dOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    let back = transfer_tensor_d2h_async(&on, &D2hOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    let (dst, _buf, _) = common::into::destinations(&b, 0);
    let copies = Stream::new(dev).unwrap();
    let into: Transfer<()> =
        transfer_tensor_h2d_into(&b, &dst, &IntoOptions::default().stream(copies)).unwrap();
    into.wait().unwrap();
    let took = t0.elapsed();
    assert!(
        took < HELD / 2,
        "three waits took {took:?} while the completion thread was busy for {HELD:?}: \
         they waited for it"
    );
    assert_eq!(back, b);
    assert_eq!(
        transfer_tensor_d2h(&moved, &D2hOptions::default()).unwrap(),
        b
    );
    assert_eq!(
        transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap(),
        b
    );

    // The held call completes once the waker returns.
    let deadline = Instant::now() + Duration::from_secs(10);
    let noop = Waker::from(Arc::new(Noop));
    let out = loop {
        if let Poll::Ready(r) = held.as_mut().poll(&mut Context::from_waker(&noop)) {
            break r.unwrap();
        }
        assert!(Instant::now() < deadline, "the held call never completed");
        std::thread::sleep(Duration::from_millis(5));
    };
    assert_eq!(out, b);
}

/// A waited call's event serves a later call (it is kept as a spare once its handle is
/// done with it), unless the caller holds a clone of it: before, every waited call's event
/// was destroyed with its handle and the next call made a new one (two driver calls).
#[test]
fn a_waited_calls_event_serves_a_later_call() {
    setup();
    let _turn = serial();
    let b = batch(69);
    let opts = H2dOptions::default();
    transfer_tensor_h2d_async(&b, &opts)
        .unwrap()
        .wait()
        .unwrap(); // warm
    let mut reused = 0;
    for _ in 0..20 {
        let first = transfer_tensor_h2d_async(&b, &opts).unwrap();
        let raw = first.ready_event().unwrap().as_raw();
        first.wait().unwrap();
        let next = transfer_tensor_h2d_async(&b, &opts).unwrap();
        reused += usize::from(next.ready_event().unwrap().as_raw() == raw);
        next.wait().unwrap();
    }
    // (Not all 20: the completion thread may finish a call while its handle still holds
    // the event; neither then keeps it.)
    assert!(
        reused >= 10,
        "a waited call's event served the next call {reused} times of 20"
    );

    // A clone the caller keeps stays the caller's: sealed, and never handed to a call.
    let third = transfer_tensor_h2d_async(&b, &opts).unwrap();
    let kept = third.ready_event().unwrap().clone();
    third.wait().unwrap();
    for _ in 0..5 {
        let later = transfer_tensor_h2d_async(&b, &opts).unwrap();
        assert_ne!(later.ready_event().unwrap().as_raw(), kept.as_raw());
        later.wait().unwrap();
    }
    let s = Stream::new(Device::cuda(0)).unwrap();
    assert!(matches!(
        kept.record(&s),
        Err(pinlane::Error::SealedEvent { .. })
    ));
}

/// The owner of a lent device tensor whose `Drop` says it has begun, then takes 300 ms.
struct SlowOwner {
    _memory: Tensor,
    began: Mutex<Sender<()>>,
    ended: Arc<AtomicBool>,
}

impl Drop for SlowOwner {
    fn drop(&mut self) {
        let _ = self.began.lock().unwrap().send(());
        std::thread::sleep(Duration::from_millis(300));
        self.ended.store(true, Ordering::SeqCst);
    }
}

/// `settle` (and shutdown) waits for a call whose wait is releasing it on the waiting
/// thread, as it waits for the completion thread's: before, it returned while the
/// waiter was still dropping the call's owners (here a source's owner, 300 ms).
#[test]
fn settle_waits_for_a_release_on_a_waiting_thread() {
    setup();
    let _turn = serial();
    let dev = Device::cuda(0);
    let t = common::tensor(DType::F32, &[1000], 70);
    let theirs = transfer_tensor_h2d(&t).unwrap(); // "another library's" device memory
    let lent = Stream::legacy(dev).unwrap();
    let g = theirs.device_ptr(&lent).unwrap();
    let ptr = g.ptr();
    drop(g);
    let (began, rx) = channel();
    let ended = Arc::new(AtomicBool::new(false));
    let owner = SlowOwner {
        _memory: theirs,
        began: Mutex::new(began),
        ended: ended.clone(),
    };
    // SAFETY: `ptr` is the 4000 bytes of cuda:0 memory `theirs` holds, kept alive by the
    // owner, and nothing writes it.
    let ext = unsafe { Tensor::from_device_ptr(ptr, dev, DType::F32, [1000], owner) }.unwrap();
    // The call's job holds the last reference to `ext`: its release drops the owner.
    let pending = transfer_tensor_d2h_async(&vec![ext], &D2hOptions::default()).unwrap();
    let waiter = std::thread::spawn(move || pending.wait());
    rx.recv_timeout(Duration::from_secs(10))
        .expect("the owner's drop began");
    pinlane::settle(Duration::from_secs(10)).unwrap();
    assert!(
        ended.load(Ordering::SeqCst),
        "settle returned while the call's owners were still being released"
    );
    assert_eq!(waiter.join().unwrap().unwrap(), vec![t]);
}

struct Noop;

impl Wake for Noop {
    fn wake(self: Arc<Self>) {}
}
