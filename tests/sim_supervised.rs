//! pinlane's own threads on the simulated device (issue 19): user code they run (an
//! owner's `Drop`) may panic without stopping them, and what goes wrong there reaches the
//! next call on the device, on any thread, and the statistics.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    memory_stats, set_current_stream, transfer_tensor_d2h, transfer_tensor_d2h_async,
    transfer_tensor_h2d, transfer_tensor_h2d_async, D2hOptions, DType, Device, Error, H2dOptions,
    Prefetcher, Stream, Tensor, Transfer,
};
use std::sync::mpsc;
use std::time::Duration;

/// The tests take turns: what pinlane's threads record is kept for the device, process-
/// wide, so one test's recorded panic would be another's next call's error.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// `t.wait()` on another thread, given `limit`: `None` if it has not returned by then.
fn wait_within<B: Send + 'static>(t: Transfer<B>, limit: Duration) -> Option<pinlane::Result<B>> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(t.wait());
    });
    rx.recv_timeout(limit).ok()
}

/// An owner whose `Drop` panics (it keeps the device memory it lends alive).
struct PanickingOwner(#[allow(dead_code)] Tensor);

impl Drop for PanickingOwner {
    fn drop(&mut self) {
        panic!("the owner's Drop panicked on purpose");
    }
}

/// Makes an owner's `Drop` panic on the completion thread (a non-blocking D2H of `t`
/// holds the last reference to it), then checks that the call still came back right:
/// the panic is recorded for the device's next call.
fn panic_on_the_completion_thread(t: &Tensor) {
    panic_on_the_completion_thread_with(t, PanickingOwner);
}

/// [`panic_on_the_completion_thread`] with the owner `owner` makes of the tensor it keeps.
fn panic_on_the_completion_thread_with<O: Send + Sync + 'static>(
    t: &Tensor,
    owner: impl FnOnce(Tensor) -> O,
) {
    let dev = Device::cuda(0);
    let theirs = transfer_tensor_h2d(t).unwrap(); // "another library's" device memory
    let lent = Stream::legacy(dev).unwrap();
    let g = theirs.device_ptr(&lent).unwrap();
    let ptr = g.ptr();
    drop(g);
    // SAFETY: `ptr` is the 4000 bytes of cuda:0 memory `theirs` holds, kept alive by the
    // owner, and nothing writes it.
    let ext =
        unsafe { Tensor::from_device_ptr(ptr, dev, DType::F32, [1000], owner(theirs)) }.unwrap();
    let errors_before = memory_stats().background_errors;
    let slow = Stream::new(dev).unwrap();
    let pending = {
        // The copy waits 500 ms behind the current stream (long enough that a loaded
        // machine still finds it pending below): the call's job holds the last reference
        // to `ext`, so the owner drops (and panics) on the completion thread.
        let _current = set_current_stream(&slow);
        slow.delay_async(Duration::from_millis(500)).unwrap();
        transfer_tensor_d2h_async(&vec![ext], &D2hOptions::default()).unwrap()
    };
    assert!(!pending.is_ready());
    let back = wait_within(pending, Duration::from_secs(10))
        .expect("wait() hung: the completion thread died in the owner's Drop")
        .expect("the copies themselves succeeded");
    assert_eq!(&back[0], t);
    assert_eq!(memory_stats().background_errors, errors_before + 1);
}

#[test]
fn a_panicking_owner_neither_stops_the_completion_thread_nor_goes_unseen() {
    common::sim();
    let _turn = serial();
    let t = common::tensor(DType::F32, &[1000], 3);
    panic_on_the_completion_thread(&t);
    // The next call for the device, on another thread, reports the panic once.
    let t2 = t.clone();
    let first = std::thread::spawn(move || transfer_tensor_h2d(&t2))
        .join()
        .unwrap();
    match first {
        Err(Error::Deferred(e)) => match *e {
            Error::Panicked {
                thread, message, ..
            } => {
                assert_eq!(thread, "completion");
                assert!(message.contains("on purpose"), "{message}");
            }
            other => panic!("deferred {other:?}, not the panic"),
        },
        other => panic!("the panic was not reported: {other:?}"),
    }
    assert!(transfer_tensor_h2d(&t).is_ok(), "reported once");
    // The completion thread still completes non-blocking calls.
    for _ in 0..3 {
        let h = transfer_tensor_h2d_async(&t, &H2dOptions::default()).unwrap();
        let on = wait_within(h, Duration::from_secs(10))
            .expect("wait() hung after the panic")
            .unwrap();
        let d = transfer_tensor_d2h_async(&on, &D2hOptions::default()).unwrap();
        let back = wait_within(d, Duration::from_secs(10))
            .expect("wait() hung after the panic")
            .unwrap();
        assert_eq!(back, t);
    }

    // A prefetcher's worker whose transfer meets such an error (no batch's doing: the
    // transfer stops before it touches the batch) gives it as an item of its own, then
    // the batch it was moving: none is lost.
    panic_on_the_completion_thread(&t);
    let host = |i: u64| vec![common::tensor(DType::F32, &[64], 10 + i)];
    let out: Vec<_> = Prefetcher::new((0..3).map(host), 1, H2dOptions::default())
        .unwrap()
        .collect();
    assert_eq!(out.len(), 4, "the error and three batches");
    assert!(
        matches!(&out[0], Err(Error::Deferred(e)) if matches!(**e, Error::Panicked { .. })),
        "{:?}",
        out[0].as_ref().err()
    );
    for (i, b) in (0..).zip(&out[1..]) {
        let b = b.as_ref().expect("a batch");
        assert_eq!(
            transfer_tensor_d2h(b, &D2hOptions::default()).unwrap(),
            host(i)
        );
    }

    // A retry that panics (the batch's own `visit`) loses none of the errors taken
    // before it (session 79's review of the retry: the panic replaced them).
    struct Fragile(Vec<Tensor>);
    impl pinlane::Batch for Fragile {
        fn visit<'a>(&'a self, _: &mut dyn FnMut(&'a Tensor)) {
            panic!("a broken batch");
        }
        fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
            Fragile(self.0.rebuild(f))
        }
    }
    panic_on_the_completion_thread(&t);
    let out: Vec<_> = Prefetcher::new(vec![Fragile(host(0))], 1, H2dOptions::default())
        .unwrap()
        .collect();
    assert_eq!(out.len(), 2, "the recorded error, then the batch's panic");
    assert!(
        matches!(&out[0], Err(Error::Deferred(_))),
        "{:?}",
        out[0].as_ref().err()
    );
    assert!(
        matches!(
            &out[1],
            Err(Error::Panicked {
                thread: "prefetch",
                ..
            })
        ),
        "{:?}",
        out[1].as_ref().err()
    );
}

/// A prefetcher dropped while the error its worker's transfer met (one recorded for the
/// device by earlier work) waits unreceived in its queue: the error goes back to the
/// record, and the dropping thread's next call on the device reports it (session 86:
/// before, it was dropped with the queue, and nobody saw it).
#[test]
fn a_prefetcher_dropped_with_an_earlier_error_unreceived_loses_none() {
    common::sim();
    let _turn = serial();
    let t = common::tensor(DType::F32, &[1000], 5);
    panic_on_the_completion_thread(&t);
    let (asked_tx, asked) = mpsc::channel();
    let mut first = true;
    let source = std::iter::from_fn(move || {
        if std::mem::take(&mut first) {
            return Some(vec![common::tensor(DType::F32, &[64], 20)]);
        }
        // The worker asks again only once the error and the batch are queued.
        let _ = asked_tx.send(());
        None
    });
    let p = Prefetcher::new(source, 3, H2dOptions::default()).unwrap();
    asked
        .recv_timeout(Duration::from_secs(10))
        .expect("the worker moved the batch");
    drop(p);
    match transfer_tensor_h2d(&t) {
        Err(Error::Deferred(e)) => assert!(
            matches!(
                *e,
                Error::Panicked {
                    thread: "completion",
                    ..
                }
            ),
            "{e:?}"
        ),
        other => panic!("the earlier error was lost with the queue: {other:?}"),
    }
    assert!(transfer_tensor_h2d(&t).is_ok(), "reported once");
}

/// A batch the consumer did not take, whose own drop panics (user code), dropped by the
/// prefetcher's drop: the panic is caught and kept for the device's next call, as the
/// worker keeps its own, instead of unwinding out of the drop (session 86).
#[test]
fn a_prefetcher_dropping_an_untaken_batch_that_panics_keeps_the_panic() {
    common::sim();
    let _turn = serial();
    struct Bomb(Vec<Tensor>, bool);
    impl pinlane::Batch for Bomb {
        fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
            self.0.visit(f)
        }
        fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
            Bomb(self.0.rebuild(f), true) // the device batch is armed, the host one not
        }
    }
    impl Drop for Bomb {
        fn drop(&mut self) {
            if self.1 {
                panic!("the device batch's drop panicked on purpose");
            }
        }
    }
    let (asked_tx, asked) = mpsc::channel();
    let mut first = true;
    let source = std::iter::from_fn(move || {
        if std::mem::take(&mut first) {
            return Some(Bomb(vec![common::tensor(DType::F32, &[64], 21)], false));
        }
        let _ = asked_tx.send(());
        None
    });
    let p = Prefetcher::new(source, 2, H2dOptions::default()).unwrap();
    asked
        .recv_timeout(Duration::from_secs(10))
        .expect("the worker moved the batch");
    let dropped = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(p)));
    assert!(dropped.is_ok(), "the batch's panic unwound out of the drop");
    let t = common::tensor(DType::F32, &[16], 22);
    match transfer_tensor_h2d(&t) {
        Err(Error::Deferred(e)) => match *e {
            Error::Panicked {
                thread, message, ..
            } => {
                assert_eq!(thread, "prefetch");
                assert!(message.contains("on purpose"), "{message}");
            }
            other => panic!("deferred {other:?}, not the panic"),
        },
        other => panic!("the panic was not kept: {other:?}"),
    }
}

/// An owner whose `Drop` panics with a payload whose own drop panics (`panic_any`; rust-
/// lang/rust#86027): dropping that payload after the catch unwound out of it and stopped
/// the completion thread, its handles woken with `Error::Worker`. The payload's panic is
/// caught too now, and the owner's is kept as any other (session 86).
#[test]
fn an_owner_panicking_with_a_payload_that_panics_when_dropped_is_kept_too() {
    common::sim();
    let _turn = serial();
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's drop panicked on purpose");
        }
    }
    struct BombOwner(#[allow(dead_code)] Tensor);
    impl Drop for BombOwner {
        fn drop(&mut self) {
            std::panic::panic_any(Bomb);
        }
    }
    let t = common::tensor(DType::F32, &[1000], 6);
    panic_on_the_completion_thread_with(&t, BombOwner);
    let seen = std::thread::spawn(move || transfer_tensor_h2d(&t))
        .join()
        .unwrap();
    match seen {
        Err(Error::Deferred(e)) => match *e {
            Error::Panicked { thread, .. } => assert_eq!(thread, "completion"),
            other => panic!("deferred {other:?}, not the panic"),
        },
        other => panic!("the panic was not reported: {other:?}"),
    }
}
