//! The non-blocking calls on the simulated device: many handles in flight per thread and
//! across threads, handles dropped, forgotten and awaited on other threads, the Future,
//! faults at every kind and position, and random round trips. The simulator delays every
//! queued operation at random and poisons freed memory, so waiting too little or freeing
//! too early shows up as wrong bytes.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::fault::{self, FaultKind};
use pinlane::memory::retained::retained_bytes;
use pinlane::{
    memory_stats, set_current_stream, transfer_tensor_d2h, transfer_tensor_d2h_async,
    transfer_tensor_h2d, transfer_tensor_h2d_async, transfer_tensor_h2d_into, D2hOptions, DType,
    Device, Error, H2dOptions, H2dPairs, HostOutput, IntoOptions, Stream, Tensor, Transfer, Value,
};
use proptest::prelude::*;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

/// The tests of this binary take turns: some assert on process-wide memory statistics,
/// which another test's live batches would change.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn batch(seed: u64) -> Vec<Tensor> {
    vec![
        common::tensor(DType::F32, &[30_000 + seed as usize % 7], seed),
        common::tensor(DType::I16, &[17], seed + 1),
        common::tensor(DType::U8, &[5000], seed + 2)
            .to_pinned()
            .unwrap(),
    ]
}

fn h2d(b: &[Tensor]) -> Transfer<Vec<Tensor>> {
    transfer_tensor_h2d_async(&b.to_vec(), &H2dOptions::default()).unwrap()
}

fn d2h(b: &[Tensor]) -> Transfer<Vec<Tensor>> {
    transfer_tensor_d2h_async(&b.to_vec(), &D2hOptions::default()).unwrap()
}

/// A minimal executor: polls `f` on this thread, parking between wake-ups, and counts
/// the polls (a future that never wakes its waker would hang here).
fn block_on<F: Future>(f: F) -> (F::Output, usize) {
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    let mut polls = 0;
    loop {
        polls += 1;
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return (v, polls);
        }
        std::thread::park_timeout(Duration::from_secs(10));
    }
}

#[test]
fn many_handles_in_flight_on_one_thread_complete_in_order() {
    common::sim();
    let _turn = serial();
    let inputs: Vec<Vec<Tensor>> = (0..200).map(batch).collect();
    let moving: Vec<_> = inputs.iter().map(|b| h2d(b)).collect();
    // Later calls on the thread's stream never complete before earlier ones (asked in
    // that order: once the later is ready, the earlier must be).
    for _ in 0..50 {
        for w in moving.windows(2) {
            if w[1].is_ready() {
                assert!(w[0].is_ready(), "completed out of order");
            }
        }
    }
    let on: Vec<_> = moving
        .into_iter()
        .rev()
        .map(|t| t.wait().unwrap())
        .collect();
    let back: Vec<_> = on.iter().map(|b| d2h(b)).collect();
    for (b, i) in back.into_iter().zip((0..200).rev()) {
        assert_eq!(b.wait().unwrap(), inputs[i], "batch {i}");
    }
}

#[test]
fn thousands_of_handles_across_threads() {
    common::sim();
    let _turn = serial();
    std::thread::scope(|s| {
        for t in 0..8u64 {
            s.spawn(move || {
                let inputs: Vec<_> = (0..150).map(|i| batch(t * 1000 + i)).collect();
                let moving: Vec<_> = inputs.iter().map(|b| h2d(b)).collect();
                let back: Vec<_> = moving
                    .into_iter()
                    .map(|m| d2h(&m.wait().unwrap()))
                    .collect();
                for (b, want) in back.into_iter().zip(&inputs) {
                    assert_eq!(&b.wait().unwrap(), want);
                }
            });
        }
    });
}

#[test]
fn handles_dropped_or_forgotten_before_completion_free_nothing_early() {
    common::sim();
    let _turn = serial();
    let b = batch(7);
    let on = transfer_tensor_h2d(&b).unwrap();
    let slow = Stream::new(Device::cuda(0)).unwrap();
    for forget in [false, true] {
        let in_use = memory_stats().pinned_outputs.in_use_bytes;
        {
            // The D2H waits for the current stream, which is busy for 30 ms: the handle
            // is surely pending when it goes.
            let _current = set_current_stream(&slow);
            slow.delay_async(Duration::from_millis(30)).unwrap();
            let t = d2h(&on);
            assert!(!t.is_ready());
            if forget {
                std::mem::forget(t);
            } else {
                drop(t);
            }
        }
        // Busy memory is reused only once free: these transfers' bytes stay exact.
        for i in 0..20 {
            let x = batch(100 + i);
            let back =
                transfer_tensor_d2h(&transfer_tensor_h2d(&x).unwrap(), &D2hOptions::default());
            assert_eq!(back.unwrap(), x);
        }
        slow.synchronize().unwrap();
        assert_eq!(retained_bytes(), 0);
        if !forget {
            // A dropped handle's output block goes back once its copies are done.
            let t0 = std::time::Instant::now();
            while memory_stats().pinned_outputs.in_use_bytes != in_use
                && t0.elapsed() < Duration::from_secs(5)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            assert_eq!(memory_stats().pinned_outputs.in_use_bytes, in_use);
        }
    }
}

#[test]
fn handles_are_awaited_and_waited_on_other_threads() {
    common::sim();
    let _turn = serial();
    let b = batch(11);
    let slow = Stream::new(Device::cuda(0)).unwrap();
    let on = transfer_tensor_h2d(&b).unwrap();
    let _current = set_current_stream(&slow);
    slow.delay_async(Duration::from_millis(20)).unwrap();
    let pending = d2h(&on);
    assert!(!pending.is_ready() && pending.ready_event().is_some());
    // `.await` on another thread: woken by the completion, not by polling.
    let (got, polls) = std::thread::spawn(move || block_on(pending))
        .join()
        .unwrap();
    assert_eq!(got.unwrap(), b);
    assert!(polls <= 3, "{polls} polls");
    // wait() on another thread.
    slow.delay_async(Duration::from_millis(10)).unwrap();
    let pending = d2h(&on);
    assert_eq!(
        std::thread::spawn(move || pending.wait())
            .join()
            .unwrap()
            .unwrap(),
        b
    );
}

#[test]
fn the_ready_event_orders_a_consumer_stream_without_the_host() {
    common::sim();
    let _turn = serial();
    let b = batch(21);
    let consumer = Stream::new(Device::cuda(0)).unwrap();
    let moving = h2d(&b);
    let on = moving.batch_for(&consumer).unwrap().clone();
    // A D2H queued on the consumer stream after the ready event reads the final bytes.
    let back = transfer_tensor_d2h(
        &on,
        &D2hOptions::default()
            .device(Device::cuda(0))
            .stream(consumer.clone()),
    )
    .unwrap();
    assert_eq!(back, b);
    assert_eq!(moving.wait().unwrap(), on);
    // A pending D2H's host outputs are not lent before they are written.
    let slow = Stream::new(Device::cuda(0)).unwrap();
    let _current = set_current_stream(&slow);
    slow.delay_async(Duration::from_millis(20)).unwrap();
    let t = d2h(&on);
    assert!(matches!(
        t.batch_for(&consumer),
        Err(Error::NotOnDevice { .. })
    ));
    assert_eq!(t.wait().unwrap(), b);
}

/// A transfer's ready event is pinlane's: a caller's record (of it or of a clone) would
/// move the point pinlane waits for before it lets go of the copies' buffers, so it is
/// refused; waiting on it works. Once nobody else holds it, the event serves later calls,
/// which record it again.
#[test]
fn a_transfers_ready_event_is_not_recorded_by_the_caller() {
    common::sim();
    let _turn = serial();
    let b = batch(41);
    let on = transfer_tensor_h2d(&b).unwrap();
    let other = Stream::new(Device::cuda(0)).unwrap();
    let slow = Stream::new(Device::cuda(0)).unwrap();
    let _current = set_current_stream(&slow);
    slow.delay_async(Duration::from_millis(20)).unwrap();
    let up = h2d(&b);
    let down = d2h(&on);
    for t in [&up, &down] {
        let ev = t.ready_event().expect("copies in flight");
        assert!(matches!(ev.record(&other), Err(Error::SealedEvent { .. })));
        assert!(matches!(
            ev.clone().record(&other),
            Err(Error::SealedEvent { .. })
        ));
        ev.wait_on(&other).unwrap();
    }
    let kept = down.ready_event().unwrap().clone();
    up.wait().unwrap();
    assert_eq!(down.wait().unwrap(), b);
    // Still pinlane's while a clone of it lives, after its handle is gone.
    assert!(matches!(
        kept.record(&other),
        Err(Error::SealedEvent { .. })
    ));
    drop(kept);
    // Each of these calls records a spare event (the one before's, recycled once done).
    for _ in 0..4 {
        assert_eq!(d2h(&on).wait().unwrap(), b);
    }
    // An event of the caller's own records as before.
    pinlane::Event::new(Device::cuda(0))
        .unwrap()
        .record(&other)
        .unwrap();
}

/// A copy into existing tensors queued on another stream while a non-blocking D2H still
/// reads its destination is written after those reads (its stream waits for the D2H's
/// event): the D2H returns the bytes from before, by both calls that write device
/// tensors. The D2H waits behind 20 ms of work on the current stream; the copy's stream
/// is idle.
#[test]
fn a_copy_into_a_pending_d2h_s_source_waits_for_its_reads() {
    common::sim();
    let _turn = serial();
    let dev = Device::cuda(0);
    let old = vec![common::tensor(DType::U8, &[4 << 20], 51)];
    let new = vec![common::tensor(DType::U8, &[4 << 20], 52)];
    let other = Stream::new(dev).unwrap();
    let opts = IntoOptions::default().stream(other.clone());
    for pairs in [false, true] {
        let on = transfer_tensor_h2d(&old).unwrap();
        let slow = Stream::new(dev).unwrap();
        let _current = set_current_stream(&slow);
        slow.delay_async(Duration::from_millis(20)).unwrap();
        let pending = d2h(&on);
        if pairs {
            H2dPairs::new(&new, &on)
                .unwrap()
                .copy(&opts)
                .unwrap()
                .wait()
                .unwrap();
        } else {
            transfer_tensor_h2d_into(&new, &on, &opts)
                .unwrap()
                .wait()
                .unwrap();
        }
        assert!(
            pending.wait().unwrap() == old,
            "pairs {pairs}: the D2H read the new bytes"
        );
        // And the copy arrived.
        assert_eq!(
            transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
            new
        );
    }
}

#[test]
fn pass_throughs_and_pageable_outputs_are_ready_at_once() {
    common::sim();
    let _turn = serial();
    let b = batch(31);
    let host_only = transfer_tensor_d2h_async(&b, &D2hOptions::default()).unwrap();
    assert!(host_only.is_ready() && host_only.ready_event().is_none());
    assert_eq!(host_only.wait().unwrap(), b);
    let on = transfer_tensor_h2d(&b).unwrap();
    let pageable = D2hOptions::default().output(HostOutput::Pageable);
    let t = transfer_tensor_d2h_async(&on, &pageable).unwrap();
    assert!(t.is_ready());
    assert_eq!(t.wait().unwrap(), b);
}

fn injected(e: &Error) -> bool {
    matches!(e, Error::Driver { error, .. } if error.name() == "INJECTED_FAULT")
}

#[test]
fn faults_at_every_kind_and_position_under_the_async_calls() {
    common::sim();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = batch(41);
        let before = common::fingerprint(&b);
        let round = |b: &Vec<Tensor>| -> pinlane::Result<Vec<Tensor>> {
            // Driver failures, while queueing or while copying, come from wait().
            let up = transfer_tensor_h2d_async(b, &H2dOptions::default());
            let on = up.expect("only bad input fails the call").wait()?;
            let down = transfer_tensor_d2h_async(&on, &D2hOptions::default());
            down.expect("only bad input fails the call").wait()
        };
        // Device blocks kept by an earlier test (`Config::small_device_blocks`) would serve
        // the first calls without an allocation, and `Alloc` would never fire.
        pinlane::trim().unwrap();
        assert_eq!(memory_stats().kept_device_block_bytes, 0);
        let mut total = 0;
        for kind in [
            FaultKind::Alloc,
            FaultKind::Copy,
            FaultKind::EventRecord,
            FaultKind::StreamSync,
        ] {
            let mut fired = 0;
            for nth in 1..10_000 {
                fault::inject(kind, nth);
                let r = round(&b);
                if fault::armed() {
                    fault::clear();
                    assert_eq!(r.unwrap(), b, "{kind:?}: without a fault");
                    break;
                }
                fired += 1;
                let e = r.unwrap_err();
                assert!(injected(&e), "{kind:?} #{nth}: {e}");
                assert_eq!(
                    common::fingerprint(&b),
                    before,
                    "{kind:?} #{nth}: input unchanged"
                );
                if kind != FaultKind::StreamSync {
                    assert_eq!(retained_bytes(), 0, "{kind:?} #{nth}: drained");
                }
                // The next calls are exact (nothing was freed under a copy), and a blocking
                // one releases whatever a failed drain retained.
                assert_eq!(round(&b).unwrap(), b, "{kind:?} #{nth}: next async call");
                let on = transfer_tensor_h2d(&b).unwrap();
                assert_eq!(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(), b);
                assert_eq!(retained_bytes(), 0, "{kind:?} #{nth}: released");
            }
            // Async calls synchronise only to drain after another failure: StreamSync
            // never fires on its own.
            assert!(
                fired > 0 || kind == FaultKind::StreamSync,
                "{kind:?} never fired"
            );
            total += fired;
        }
        eprintln!("async fault sweep: {total} faults injected");
    })
    .join()
    .unwrap();
}

/// A non-blocking call that fails while queueing returns a handle holding the error;
/// dropped unwaited, the handle records it for the device's next call on the thread, as
/// a handle whose copies failed does (session 86: it was lost). Taken by `wait()`, or
/// handed out by `batch_for`, it is not recorded again.
#[test]
fn a_call_that_failed_while_queueing_and_is_dropped_unwaited_loses_no_error() {
    common::sim();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = batch(43);
        let on = transfer_tensor_h2d(&b).unwrap();
        let seen_next = |what: &str| match transfer_tensor_h2d(&b) {
            Err(Error::Deferred(e)) => assert!(injected(&e), "{what}: {e}"),
            other => panic!("{what}: the dropped handle's error was lost: {other:?}"),
        };
        // H2D and D2H, each dropped unwaited: the next call on the device reports it, once.
        fault::inject(FaultKind::Copy, 1);
        drop(transfer_tensor_h2d_async(&b, &H2dOptions::default()).unwrap());
        assert!(!fault::armed(), "the fault fired inside the call");
        seen_next("h2d");
        assert_eq!(
            transfer_tensor_d2h(&transfer_tensor_h2d(&b).unwrap(), &D2hOptions::default()).unwrap(),
            b,
            "once"
        );
        fault::inject(FaultKind::Copy, 1);
        drop(transfer_tensor_d2h_async(&on, &D2hOptions::default()).unwrap());
        assert!(!fault::armed(), "the fault fired inside the call");
        seen_next("d2h");
        // Waited, or handed out by `batch_for`: reported there, not again.
        fault::inject(FaultKind::Copy, 1);
        let e = transfer_tensor_h2d_async(&b, &H2dOptions::default())
            .unwrap()
            .wait()
            .unwrap_err();
        assert!(injected(&e), "{e}");
        fault::inject(FaultKind::Copy, 1);
        let h = transfer_tensor_h2d_async(&b, &H2dOptions::default()).unwrap();
        let lent = Stream::new(Device::cuda(0)).unwrap();
        assert!(injected(&h.batch_for(&lent).unwrap_err()));
        drop(h);
        assert_eq!(
            transfer_tensor_d2h(&transfer_tensor_h2d(&b).unwrap(), &D2hOptions::default()).unwrap(),
            b,
            "nothing recorded twice"
        );
        assert_eq!(retained_bytes(), 0);
    })
    .join()
    .unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_batches_round_trip_through_the_async_calls(v in common::value()) {
        common::sim();
        let _turn = serial();
        let expected = common::fingerprint(&v);
        let on: Value = transfer_tensor_h2d_async(&v, &H2dOptions::default()).unwrap().wait().unwrap();
        let (back, _) = block_on(transfer_tensor_d2h_async(&on, &D2hOptions::default()).unwrap());
        prop_assert_eq!(common::fingerprint(&back.unwrap()), expected);
    }
}

#[test]
fn wait_timeout_bounds_the_wait_and_keeps_the_handle() {
    common::sim();
    let _turn = serial();
    let b = batch(21);
    let on = transfer_tensor_h2d(&b).unwrap();
    let slow = Stream::new(Device::cuda(0)).unwrap();
    let mut pending = {
        let _current = set_current_stream(&slow);
        slow.delay_async(Duration::from_millis(300)).unwrap();
        d2h(&on)
    };
    let t0 = std::time::Instant::now();
    assert!(pending.wait_timeout(Duration::from_millis(30)).is_none());
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(30) && waited < Duration::from_millis(250),
        "{waited:?}"
    );
    assert!(!pending.is_ready(), "still copying behind the busy stream");
    let got = pending
        .wait_timeout(Duration::from_secs(10))
        .expect("done within 10 s");
    assert_eq!(got.unwrap(), b);
    assert!(matches!(
        pending.wait_timeout(Duration::ZERO),
        Some(Err(Error::InvalidOption { .. }))
    ));
    // `Duration::MAX` as "no bound" (before, adding it to the clock panicked), here and
    // in `settle`.
    let mut pending = {
        let _current = set_current_stream(&slow);
        slow.delay_async(Duration::from_millis(20)).unwrap();
        d2h(&on)
    };
    let got = pending.wait_timeout(Duration::MAX).expect("no bound");
    assert_eq!(got.unwrap(), b);
    let _later = d2h(&on);
    pinlane::settle(Duration::MAX).unwrap();
}

/// A page-locked source whose last owner is the call (the caller dropped it after the
/// call) is freed when the copies are done; `cuMemFreeHost` waits for all the device's
/// work, so freed on the completion thread, before it ends the handle, the handle's wait
/// waited for another stream's work too. Freed on the free thread (session 64, a review's
/// finding), the wait ends with the call's own copies. Shown to fail without the change:
/// the wait took the other stream's 600 ms.
#[test]
fn a_source_the_call_owns_last_is_freed_off_the_completion_thread() {
    common::sim();
    let _turn = serial();
    let dev = Device::cuda(0);
    let host = common::tensor(DType::U8, &[1 << 20], 64);
    let busy = Stream::new(dev).unwrap();
    // Warm: the thread's streams and the completion thread set up.
    let warm = vec![host.to_pinned().unwrap()];
    transfer_tensor_h2d_async(&warm, &H2dOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    drop(warm);
    let batch = vec![host.to_pinned().unwrap()];
    busy.delay_async(Duration::from_millis(600)).unwrap();
    let t0 = std::time::Instant::now();
    let handle = transfer_tensor_h2d_async(&batch, &H2dOptions::default()).unwrap();
    drop(batch); // the call's own clone of the source is its last owner now
    let out = handle.wait().unwrap();
    let waited = t0.elapsed();
    assert!(
        waited < Duration::from_millis(400),
        "the wait took {waited:?}: it waited for the other stream's work"
    );
    assert_eq!(
        transfer_tensor_d2h(&out, &D2hOptions::default()).unwrap(),
        vec![host]
    );
    busy.synchronize().unwrap();
}

/// The same for memory page-locked in place (`register_pinned`): ending a registration
/// waits for all the device's work as a free does (measured on an H100, session 66), so
/// the completion thread must not end it either. Before session 66 it did, and the wait
/// took the other stream's 600 ms. The copy runs on a stream with 50 ms of work queued
/// first, so the call's clone is the last view when the copy completes, whatever the
/// threads' timing. The same memory can be registered again at once after the wait: the
/// registration waits for the free thread to end the old one.
#[test]
fn a_registered_source_the_call_owns_last_is_unregistered_off_the_completion_thread() {
    common::sim();
    let _turn = serial();
    let dev = Device::cuda(0);
    let host = common::tensor(DType::U8, &[1 << 20], 65);
    let (busy, copies) = (Stream::new(dev).unwrap(), Stream::new(dev).unwrap());
    let (dst, _buf, _) = common::into::destinations(&vec![host.clone()], 0);
    let opts = IntoOptions::default().stream(copies.clone());
    let warm = vec![host.register_pinned(dev).unwrap()];
    transfer_tensor_h2d_into(&warm, &dst, &opts)
        .unwrap()
        .wait()
        .unwrap();
    drop(warm);
    let batch = vec![host.register_pinned(dev).unwrap()];
    busy.delay_async(Duration::from_millis(600)).unwrap();
    copies.delay_async(Duration::from_millis(50)).unwrap();
    let t0 = std::time::Instant::now();
    let handle = transfer_tensor_h2d_into(&batch, &dst, &opts).unwrap();
    drop(batch); // the call's clone holds the registration's last view now
    handle.wait().unwrap();
    let waited = t0.elapsed();
    assert!(
        waited < Duration::from_millis(400),
        "the wait took {waited:?}: it waited for the other stream's work"
    );
    // Registered again at once (the free thread is still waiting for `busy` to end the
    // old registration): the registration waits for it rather than failing.
    let again = host.register_pinned(dev).unwrap();
    assert_eq!(again.location(), pinlane::Location::Pinned);
    assert!(
        t0.elapsed() >= Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(
        transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap(),
        vec![again]
    );
    busy.synchronize().unwrap();
}

/// Another library's device memory (`Tensor::from_device_ptr`), lent to a stream whose
/// work is still running, is released only after that use: its owner's drop waits for it
/// (within `drop_sync_wait`). When a non-blocking call holds its last view, that wait
/// must not run on the completion thread, where it held the handle's wait (and every
/// other handle's) for the other stream's work; it runs on the free thread, and
/// `settle` waits for it there as it waits for the completion thread. Shown to fail
/// without the change (session 72): the wait took the other stream's 600 ms (the test's
/// delays were shorter then).
#[test]
fn a_foreign_tensor_the_call_owns_last_waits_for_its_lent_use_off_the_completion_thread() {
    common::sim();
    let _turn = serial();
    let dev = Device::cuda(0);
    let host = common::tensor(DType::U8, &[8000], 67);
    let (busy, producer) = (Stream::new(dev).unwrap(), Stream::new(dev).unwrap());
    let theirs = transfer_tensor_h2d(&host).unwrap(); // "another library's" device memory
    let (ptr, nbytes) = {
        let g = theirs.device_ptr(&producer).unwrap();
        (g.ptr(), g.nbytes())
    };
    assert_eq!(nbytes, 8000);
    let dropped_on = Arc::new(Mutex::new(Vec::new()));
    let owner = common::DropNames(dropped_on.clone(), theirs);
    // SAFETY: `ptr` is 8000 bytes of cuda:0 memory that `owner` keeps alive (it holds the
    // tensor), and nothing writes it.
    let ext = unsafe { Tensor::from_device_ptr(ptr, dev, DType::U8, [8000], owner) }.unwrap();
    // Warm: the thread's streams and the completion thread set up.
    let opts = D2hOptions::default().device(dev).stream(producer.clone());
    transfer_tensor_d2h_async(&ext, &opts)
        .unwrap()
        .wait()
        .unwrap();
    // Lent to `busy`: the use's event is recorded after 1.5 s of work there.
    let lent = ext.device_ptr(&busy).unwrap();
    busy.delay_async(Duration::from_millis(1500)).unwrap();
    drop(lent);
    // The copy starts after 250 ms, so the call's clone is the last view when it
    // completes (the caller drops its own long before, even on a loaded machine).
    producer.delay_async(Duration::from_millis(250)).unwrap();
    let t0 = std::time::Instant::now();
    let handle = transfer_tensor_d2h_async(&ext, &opts).unwrap();
    drop(ext);
    let back = handle.wait().unwrap();
    let waited = t0.elapsed();
    assert!(
        waited < Duration::from_millis(1200),
        "the wait took {waited:?}: it waited for the other stream's work"
    );
    assert_eq!(back, host);
    assert!(
        dropped_on.lock().unwrap().is_empty(),
        "dropped before its lent use ended"
    );
    // `settle` waits for the free thread's drop too: not done within 50 ms, then done.
    let early = pinlane::settle(Duration::from_millis(50));
    assert!(
        matches!(&early, Err(Error::ShutdownIncomplete { reason, .. }) if reason.contains("free thread")),
        "{early:?}"
    );
    assert!(dropped_on.lock().unwrap().is_empty());
    pinlane::settle(Duration::from_secs(10)).unwrap();
    assert_eq!(
        *dropped_on.lock().unwrap(),
        ["pinlane-free"],
        "the owner dropped once, on the free thread, after the use"
    );
    // The use ends 1.5 s after `busy`'s work was queued, just before `t0`.
    assert!(
        t0.elapsed() >= Duration::from_millis(1300),
        "settled after {:?}: before the use ended",
        t0.elapsed()
    );
    busy.synchronize().unwrap();
}

/// The same on the caller's own thread: a copy into existing tensors releases, right after
/// queuing its copies, what the thread's previous step on that stream used once it is
/// done (`reap`, before the completion thread's 5 ms grace ends: the second step comes
/// within 2 ms of the first, or both are made again). When that previous
/// step held the last view of a page-locked source (`to_pinned`, dropped by the caller
/// after its call), the free is pinlane's own, so it goes to the free thread: the second
/// call does not wait for another stream's 600 ms of work (it did, inline, without the
/// `releasing` guard around `reap`'s release).
#[test]
fn a_source_a_later_step_releases_is_freed_off_the_callers_thread() {
    common::sim();
    let _turn = serial();
    let dev = Device::cuda(0);
    let host = common::tensor(DType::U8, &[4096], 66);
    let (busy, copies) = (Stream::new(dev).unwrap(), Stream::new(dev).unwrap());
    let (dst, _buf, _) = common::into::destinations(&vec![host.clone()], 0);
    let opts = IntoOptions::default().stream(copies.clone());
    let step = |src: &Vec<Tensor>| transfer_tensor_h2d_into(src, &dst, &opts).unwrap();
    // Warm, first.
    step(&vec![host.to_pinned().unwrap()]).wait().unwrap();
    // The completion thread leaves the first step to this thread for 5 ms: the second
    // step must come sooner for its `reap` to be what releases it (a loaded machine may
    // take longer: tried again, until it does).
    let mut tries = 0;
    loop {
        tries += 1;
        assert!(
            tries <= 50,
            "never within 2 ms of the first step: nothing tested"
        );
        let first = vec![host.to_pinned().unwrap()];
        let t_first = std::time::Instant::now();
        drop(step(&first)); // handle dropped: left to this thread's next step on `copies`
        drop(first); // the call's clone is the block's last owner now
        copies.synchronize().unwrap(); // done
        if t_first.elapsed() < Duration::from_millis(2) {
            break;
        }
    }
    busy.delay_async(Duration::from_millis(600)).unwrap();
    let t0 = std::time::Instant::now();
    let second = step(&vec![host.clone()]); // reaps the first step
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(400),
        "the call took {took:?}: it freed the first step's source inline, waiting for the \
         other stream's work"
    );
    second.wait().unwrap();
    assert_eq!(
        transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap(),
        vec![host]
    );
    busy.synchronize().unwrap();
}

/// A waker that calls `wait` on another handle runs on the completion thread, the
/// thread that would end that wait: it is refused at once (before, the completion thread
/// waited on itself for ever, and every later non-blocking call with it), and both calls
/// still complete.
#[test]
fn a_wait_on_the_completion_thread_is_refused_not_a_deadlock() {
    common::sim();
    let _turn = serial();
    let dev = Device::cuda(0);
    let b = batch(21);
    let on = transfer_tensor_h2d(&b).unwrap();
    let (long, short) = (Stream::new(dev).unwrap(), Stream::new(dev).unwrap());
    long.delay_async(Duration::from_millis(1500)).unwrap();
    short.delay_async(Duration::from_millis(50)).unwrap();
    let on_stream = |s: &Stream| {
        transfer_tensor_d2h_async(&on, &D2hOptions::default().device(dev).stream(s.clone()))
            .unwrap()
    };
    let (slow, fast) = (on_stream(&long), on_stream(&short));
    // `fast`'s waker waits for `slow`, on whichever thread wakes it.
    struct WaitsForAnother {
        other: Mutex<Option<Transfer<Vec<Tensor>>>>,
        said: Mutex<std::sync::mpsc::Sender<(bool, Result<(), Error>)>>,
    }
    impl Wake for WaitsForAnother {
        fn wake(self: Arc<Self>) {
            let other = self.other.lock().unwrap().take();
            if let Some(other) = other {
                let on_ours = std::thread::current().name() == Some("pinlane-complete");
                let r = other.wait().map(drop);
                let _ = self.said.lock().unwrap().send((on_ours, r));
            }
        }
    }
    let (tx, rx) = std::sync::mpsc::channel();
    let waker = Waker::from(Arc::new(WaitsForAnother {
        other: Mutex::new(Some(slow)),
        said: Mutex::new(tx),
    }));
    let mut fast = std::pin::pin!(fast);
    assert!(fast
        .as_mut()
        .poll(&mut Context::from_waker(&waker))
        .is_pending());
    let (on_ours, r) = rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the waker's wait did not end: the completion thread waits on itself");
    assert!(on_ours, "the waker did not run on the completion thread");
    assert!(
        matches!(
            r,
            Err(Error::WaitOnCompletionThread {
                op: "Transfer::wait"
            })
        ),
        "{r:?}"
    );
    // The completion thread goes on: `fast` completes, and so does a later call.
    assert_eq!(block_on(fast).0.unwrap(), b);
    assert_eq!(d2h(&on).wait().unwrap(), b);
    long.synchronize().unwrap();
}
