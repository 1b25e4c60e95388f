//! Bounded waits on a slow simulated device (issue 19): every operation the simulator
//! runs waits up to 400 ms, and the runtime allows 30 ms for a staging slot to come free
//! and 300 ms for a drop to wait. A call whose slots stay busy fails with a typed error
//! instead of spinning on event queries; a prefetcher whose source is stuck is dropped
//! within its limit.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::sim::SimConfig;
use pinlane::{
    memory_stats, transfer_tensor_d2h, transfer_tensor_h2d_into, transfer_tensor_h2d_with,
    D2hOptions, DType, Device, Error, H2dOptions, HostOutput, IntoOptions, Prefetcher, Stream,
    Tensor,
};
use std::time::{Duration, Instant};

fn sim() {
    common::sim_with(
        || {
            pinlane::Config::new()
                .slot_bytes(64 << 10)
                .arena_bytes(128 << 10)
                .pipeline_slots(2)
                .slot_wait(Duration::from_millis(30))
                .drop_sync_wait(Duration::from_millis(300))
        },
        || SimConfig::seeded(0x51_0E).max_delay(Duration::from_millis(400)),
    );
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_call_whose_slots_stay_busy_fails_within_its_limit() {
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // 1 MiB through two 64 KiB slots: the pump waits for each slot's copy to finish
    // before filling it again, and each copy takes up to 400 ms here.
    let big = vec![common::tensor(DType::U8, &[1 << 20], 9)];
    let opts = H2dOptions::default().num_caches(0);
    let t0 = Instant::now();
    let r = transfer_tensor_h2d_with(&big, &opts);
    let took = t0.elapsed();
    assert!(
        matches!(r, Err(Error::StagingExhausted { waited_ms, .. }) if waited_ms >= 30),
        "{r:?}"
    );
    // The limit, then the drain of the copies already queued (two slots' worth).
    assert!(took < Duration::from_secs(5), "{took:?}");
    assert_eq!(
        memory_stats().retained_bytes,
        0,
        "drained, nothing retained"
    );
    // The same from a non-blocking call: its handle holds the error, and dropped unwaited
    // it records nothing for the next call (contention, not a failure of the device's).
    let h = pinlane::transfer_tensor_h2d_async(&big, &opts).unwrap();
    assert!(matches!(h.wait(), Err(Error::StagingExhausted { .. })));
    drop(pinlane::transfer_tensor_h2d_async(&big, &opts).unwrap());
    // One slot's worth still moves, exactly.
    let small = vec![common::tensor(DType::F32, &[1000], 10)];
    let on = transfer_tensor_h2d_with(&small, &opts).unwrap();
    let back = pinlane::transfer_tensor_d2h(&on, &pinlane::D2hOptions::default()).unwrap();
    assert_eq!(back, small);
}

#[test]
fn a_prefetcher_whose_source_is_stuck_drops_within_its_limit() {
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let source = (0..).map(move |i: usize| {
        if i == 1 {
            let _ = entered_tx.send(());
            std::thread::sleep(Duration::from_secs(20)); // stuck in the user's iterator
        }
        vec![Tensor::scalar(i as u32)]
    });
    let mut p = Prefetcher::new(source, 1, H2dOptions::default()).unwrap();
    assert!(p.next().unwrap().is_ok());
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the worker asks for the second batch");
    let t0 = Instant::now();
    drop(p);
    let took = t0.elapsed();
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_secs(3),
        "dropped after {took:?}, the limit is 300 ms"
    );
}

/// A source stuck past the drop's limit that then panics: the worker, detached by the
/// drop, finds nobody to send the panic to, and records it for the device's next call on
/// any thread (session 86: before, it was dropped unseen).
#[test]
fn a_prefetchers_source_that_panics_after_the_drop_gave_up_is_not_lost() {
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (entered_tx, entered) = std::sync::mpsc::channel();
    let (release, released) = std::sync::mpsc::channel::<()>();
    let source = (0..).map(move |i: usize| {
        if i == 1 {
            let _ = entered_tx.send(());
            // Stuck until the drop has given up on the worker (its wait is 300 ms).
            let _ = released.recv_timeout(Duration::from_secs(20));
            panic!("the decoder gave up late");
        }
        vec![Tensor::scalar(i as u32)]
    });
    // An error another test left for the device would be taken first below, and the
    // one-per-device record would then drop the source's.
    while pinlane::driver::deferred::take(Device::cuda(0)).is_some() {}
    let mut p = Prefetcher::new(source, 1, H2dOptions::default()).unwrap();
    assert!(p.next().unwrap().is_ok());
    entered
        .recv_timeout(Duration::from_secs(10))
        .expect("the worker asks for the second batch");
    let t0 = Instant::now();
    drop(p);
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "the drop gave up on the worker"
    );
    release.send(()).unwrap(); // now the source panics, with nobody to send it to
    let t0 = Instant::now();
    let seen = loop {
        if let Some(e) = pinlane::driver::deferred::take(Device::cuda(0)) {
            break Some(e);
        }
        if t0.elapsed() > Duration::from_secs(5) {
            break None;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    match seen {
        Some(Error::Worker { reason }) => assert!(reason.contains("gave up late"), "{reason}"),
        other => panic!("the source's panic was not kept for the device: {other:?}"),
    }
}

/// Counts its drops.
struct Owner(
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    #[allow(dead_code)] Vec<Tensor>,
);

impl Drop for Owner {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

#[test]
fn external_memory_lent_to_a_busy_stream_drops_within_its_limit() {
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d0 = pinlane::Device::cuda(0);
    let t = common::tensor(DType::F32, &[256], 11);
    let theirs = pinlane::transfer_tensor_h2d(&vec![t]).unwrap(); // "another library's" memory
    let legacy = pinlane::Stream::legacy(d0).unwrap();
    let g = theirs[0].device_ptr(&legacy).unwrap();
    let (ptr, nbytes) = (g.ptr(), g.nbytes());
    drop(g);
    let drops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let owner = Owner(drops.clone(), theirs);
    // SAFETY: `ptr` is `nbytes` of cuda:0 memory that `owner` keeps alive (it holds the
    // tensor), and nothing writes it.
    let ext = unsafe { Tensor::from_device_ptr(ptr, d0, DType::F32, [nbytes / 4], owner) }.unwrap();
    // Lent to a stream that stays busy for 2 s.
    let busy = pinlane::Stream::new(d0).unwrap();
    busy.delay_async(Duration::from_secs(2)).unwrap();
    drop(ext.device_ptr(&busy).unwrap());
    let before = memory_stats().retained_bytes;
    let t0 = Instant::now();
    drop(ext);
    let took = t0.elapsed();
    // Before: the drop waited on the host for the whole 2 s.
    assert!(
        took >= Duration::from_millis(250) && took < Duration::from_millis(1500),
        "dropped after {took:?}, the limit is 300 ms"
    );
    assert_eq!(
        drops.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "not released early"
    );
    assert_eq!(
        memory_stats().retained_bytes,
        before + nbytes,
        "held and counted"
    );
    // Once the use has run, a release check lets the owner go, exactly once.
    busy.synchronize().unwrap();
    pinlane::memory::retained::try_release();
    assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert_eq!(memory_stats().retained_bytes, before);
}

#[test]
fn by_default_the_last_drop_of_a_to_pinned_buffer_waits_for_the_device() {
    // The documented default (no `Config::sync_wait` here): `cuMemFreeHost` waits for all
    // work queued on the device, as the simulator's does too (tests/sim_sync_wait.rs
    // shows the bounded policy, which would pass vacuously if the simulator did not wait).
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d0 = pinlane::Device::cuda(0);
    let t = common::tensor(DType::F32, &[4096], 12)
        .to_pinned_on(d0)
        .unwrap();
    let busy = pinlane::Stream::new(d0).unwrap();
    busy.delay_async(Duration::from_millis(600)).unwrap();
    let t0 = Instant::now();
    drop(t);
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(500), "dropped after {took:?}");
    busy.synchronize().unwrap();
}

#[test]
fn a_copy_into_that_finds_no_slot_does_not_wait_for_the_callers_stream() {
    // Session 79 (a helper's review): a copy into existing tensors that could not lease
    // its first staging slot, having queued nothing, drained the caller's stream before
    // it returned the error: a wait for all the caller's earlier work there, unbounded
    // by default.
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d0 = Device::cuda(0);
    let src = |seed| vec![common::tensor(DType::F32, &[1000], seed)];
    let back = |t: &Vec<Tensor>| transfer_tensor_d2h(t, &D2hOptions::default()).unwrap();
    let dst = |seed| transfer_tensor_h2d_with(&src(seed), &H2dOptions::default().num_caches(0));
    let (d1, d2, d3) = (dst(1).unwrap(), dst(2).unwrap(), dst(3).unwrap());
    // Both staging slots held by copies queued behind 1.5 s of another stream's work.
    let held = Stream::new(d0).unwrap();
    held.delay_async(Duration::from_millis(1500)).unwrap();
    let on_held = IntoOptions::default().stream(held.clone());
    let h1 = transfer_tensor_h2d_into(&src(4), &d1, &on_held).unwrap();
    let h2 = transfer_tensor_h2d_into(&src(5), &d2, &on_held).unwrap();
    // The caller's own stream, busy for 3 s with its earlier work.
    let mine = Stream::new(d0).unwrap();
    mine.delay_async(Duration::from_secs(3)).unwrap();
    let t0 = Instant::now();
    let r = transfer_tensor_h2d_into(&src(6), &d3, &IntoOptions::default().stream(mine.clone()));
    let took = t0.elapsed();
    assert!(
        matches!(r, Err(Error::StagingExhausted { .. })),
        "{:?}",
        r.err()
    );
    // Before: it returned after the 3 s of `mine`.
    assert!(took < Duration::from_millis(1500), "failed after {took:?}");
    h1.wait().unwrap();
    h2.wait().unwrap();
    // With a page-locked source large enough for a direct copy beside the staged one:
    // refused the same way, with nothing written (before: the direct copy went first,
    // and its destination was written).
    let big = |seed| vec![common::tensor(DType::U8, &[5 << 20], seed)];
    // (From page-locked memory: copied directly, no slot, which this runtime's slow
    // slots would not give 5 MiB in time.)
    let d4 = vec![big(7)[0].to_pinned_on(d0).unwrap()];
    let d4 = transfer_tensor_h2d_with(&d4, &H2dOptions::default().num_caches(0)).unwrap();
    let pinned = big(8)[0].to_pinned_on(d0).unwrap();
    let held2 = Stream::new(d0).unwrap();
    held2.delay_async(Duration::from_millis(1500)).unwrap();
    let on_held2 = IntoOptions::default().stream(held2.clone());
    let h1 = transfer_tensor_h2d_into(&src(4), &d1, &on_held2).unwrap();
    let h2 = transfer_tensor_h2d_into(&src(5), &d2, &on_held2).unwrap();
    let both_src = vec![pinned, src(6).remove(0)];
    let both_dst = vec![d4[0].clone(), d3[0].clone()];
    let r = transfer_tensor_h2d_into(
        &both_src,
        &both_dst,
        &IntoOptions::default().stream(mine.clone()),
    );
    assert!(
        matches!(r, Err(Error::StagingExhausted { .. })),
        "{:?}",
        r.err()
    );
    h1.wait().unwrap();
    h2.wait().unwrap();
    mine.synchronize().unwrap();
    assert_eq!(back(&d4), big(7), "the direct copy's destination written");
    assert_eq!(back(&d3), src(3));
}

#[test]
fn a_d2h_that_finds_no_slot_does_not_wait_for_the_callers_stream() {
    // Session 79 (a helper's review): a D2H whose staging slot could not be leased, having
    // queued nothing, drained its copy stream, which waits for the caller's current
    // stream: a wait for all the caller's earlier work there. Pageable outputs (staged)
    // and page-locked ones of several small tensors (gathered through a slot).
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let d0 = Device::cuda(0);
    let small = |seed| common::tensor(DType::F32, &[1000], seed);
    let on = |b: &Vec<Tensor>| {
        transfer_tensor_h2d_with(b, &H2dOptions::default().num_caches(0)).unwrap()
    };
    let (d1, d2) = (on(&vec![small(1)]), on(&vec![small(2)]));
    let host: Vec<Tensor> = (10..14).map(small).collect();
    let dev = on(&host);
    for output in [HostOutput::Pageable, HostOutput::Pinned] {
        // Both staging slots held by copies queued behind 1.5 s of another stream's work.
        let held = Stream::new(d0).unwrap();
        held.delay_async(Duration::from_millis(1500)).unwrap();
        let on_held = IntoOptions::default().stream(held.clone());
        let h1 = transfer_tensor_h2d_into(&vec![small(3)], &d1, &on_held).unwrap();
        let h2 = transfer_tensor_h2d_into(&vec![small(4)], &d2, &on_held).unwrap();
        // The caller's current stream, busy for 3 s with its earlier work.
        let mine = Stream::new(d0).unwrap();
        mine.delay_async(Duration::from_secs(3)).unwrap();
        let t0 = Instant::now();
        let r = {
            let _current = pinlane::set_current_stream(&mine);
            transfer_tensor_d2h(&dev, &D2hOptions::default().output(output))
        };
        let took = t0.elapsed();
        assert!(
            matches!(r, Err(Error::StagingExhausted { .. })),
            "{output:?}: {r:?}"
        );
        // Before: it returned after the 3 s of `mine`.
        assert!(
            took < Duration::from_millis(1500),
            "{output:?}: failed after {took:?}"
        );
        h1.wait().unwrap();
        h2.wait().unwrap();
        mine.synchronize().unwrap();
        let back = transfer_tensor_d2h(&dev, &D2hOptions::default().output(output)).unwrap();
        assert_eq!(back, host, "{output:?}");
    }
}

/// A batch whose `Batch::rebuild` panics (the test's): a caller's code that runs while a
/// call's copies may.
struct PanicsOnRebuild(Vec<Tensor>);

impl pinlane::Batch for PanicsOnRebuild {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        self.0.iter().for_each(f);
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        self.0.iter().for_each(|t| drop(f(t)));
        panic!("a panic in Batch::rebuild (expected by the test)")
    }
}

/// A panic in the caller's code that runs while a D2H's copies may (its batch's
/// `Batch::rebuild`, its `around_wait` in the wait for its copies or in the drain of a
/// call that failed after queueing one), with the copies held past the drop bound (300 ms)
/// behind 1 s of work on the caller's stream: the call keeps what they read, the source
/// tensor and so its owner, until the stream is proven idle. Before session 80 only the
/// memory the call held was kept: the unwinding caller's source, here the last view of
/// another library's memory, let that memory go while the copy could still read it.
#[test]
fn a_panic_while_a_held_d2h_copies_keeps_its_source_until_the_copy_is_done() {
    use pinlane::memory::retained::{retained_count, try_release};
    use std::sync::{Arc, Mutex};
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dev = Device::cuda(0);
    use pinlane::driver::fault::{self, FaultKind};
    for case in ["Batch::rebuild", "around_wait", "around_wait in a drain"] {
        let host = common::tensor(DType::U8, &[8000], 71);
        let producer = Stream::new(dev).unwrap();
        let theirs = pinlane::transfer_tensor_h2d(&host).unwrap(); // "another library's"
        let ptr = theirs.device_ptr(&producer).unwrap().ptr();
        let dropped_on = Arc::new(Mutex::new(Vec::new()));
        let owner = common::DropNames(dropped_on.clone(), theirs);
        // SAFETY: `ptr` is 8000 bytes of cuda:0 memory that `owner` keeps alive (it holds
        // the tensor), and nothing writes it.
        let ext = unsafe { Tensor::from_device_ptr(ptr, dev, DType::U8, [8000], owner) }.unwrap();
        let opts = D2hOptions::default().device(dev).stream(producer.clone());
        // Warm: the thread's copy stream and the output pool set up.
        assert_eq!(
            transfer_tensor_d2h(&vec![ext.clone()], &opts).unwrap(),
            vec![host.clone()]
        );
        producer.delay_async(Duration::from_millis(1000)).unwrap();
        let retained_before = retained_count();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            if case == "Batch::rebuild" {
                drop(transfer_tensor_d2h(
                    &PanicsOnRebuild(vec![ext.clone()]),
                    &opts,
                ));
            } else if case == "around_wait in a drain" {
                // The first copy queued, the second fails: the call drains the stream
                // inside `around_wait` (`abort_around`), which panics.
                let other = pinlane::transfer_tensor_h2d(&host).unwrap();
                fault::inject(FaultKind::Copy, 2);
                let r = pinlane::transfer_tensor_d2h_overlapping_around(
                    &vec![ext.clone(), other],
                    &opts,
                    |_| (),
                    |_| panic!("a panic in around_wait (expected by the test)"),
                );
                fault::clear();
                drop(r);
            } else {
                drop(pinlane::transfer_tensor_d2h_overlapping_around(
                    &vec![ext.clone()],
                    &opts,
                    |_| (),
                    |_| panic!("a panic in around_wait (expected by the test)"),
                ));
            }
        }));
        fault::clear();
        assert!(r.is_err(), "{case}: the panic unwinds out of the call");
        drop(ext);
        assert!(
            dropped_on.lock().unwrap().is_empty(),
            "{case}: the source was let go while its copy could still read it"
        );
        assert!(retained_count() > retained_before, "{case}: nothing kept");
        producer.synchronize().unwrap();
        // The copy runs after `producer`'s work, and each step of the simulator may take
        // up to 400 ms: a release check proves its stream idle within 300 ms.
        // Its last drop, once released, may wait on the free thread for its lent use on
        // `producer`: asked again until it ran.
        let t0 = Instant::now();
        while dropped_on.lock().unwrap().is_empty() && t0.elapsed() < Duration::from_secs(10) {
            try_release();
            std::thread::sleep(Duration::from_millis(10));
        }
        assert_eq!(
            dropped_on.lock().unwrap().len(),
            1,
            "{case}: let go once the stream was proven idle"
        );
        assert_eq!(retained_count(), retained_before, "{case}: all released");
    }
}
