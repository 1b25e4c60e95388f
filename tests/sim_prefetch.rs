//! The prefetcher on the simulated device (32 MiB of device memory, so one batch can be
//! made too large to fit): order, the depth bound, errors in place, a panicking source,
//! early drop, and random round trips.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::sim::SimConfig;
use pinlane::{
    transfer_tensor_d2h, D2hOptions, DType, Error, H2dOptions, Prefetcher, Tensor, Value,
};
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEVICE_BYTES: usize = 32 << 20;

fn sim() {
    common::sim_with(common::sim_runtime, || {
        SimConfig::seeded(0xFE7C)
            .max_delay(Duration::from_micros(40))
            .memory_per_device(DEVICE_BYTES)
    });
}

fn batch(i: usize) -> Vec<Tensor> {
    vec![
        common::tensor(DType::F32, &[1000 + i], i as u64),
        common::tensor(DType::U8, &[7, 3], 1000 + i as u64),
    ]
}

fn back(b: &[Tensor]) -> Vec<Tensor> {
    transfer_tensor_d2h(&b.to_vec(), &D2hOptions::default()).unwrap()
}

/// A source that never ends and counts the batches taken from it.
fn counting() -> (impl Iterator<Item = Vec<Tensor>> + Send, Arc<AtomicUsize>) {
    let taken = Arc::new(AtomicUsize::new(0));
    let t = taken.clone();
    let it = (0..).map(move |i| {
        t.fetch_add(1, Ordering::SeqCst);
        batch(i)
    });
    (it, taken)
}

/// Waits (up to 5 s) for `cond`.
fn eventually(cond: impl Fn() -> bool) -> bool {
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    cond()
}

#[test]
fn batches_come_out_in_order_on_the_device() {
    sim();
    let p = Prefetcher::new((0..50).map(batch), 3, H2dOptions::default()).unwrap();
    let mut n = 0;
    for (i, on) in p.enumerate() {
        let on = on.unwrap();
        assert!(on.iter().all(Tensor::is_cuda));
        assert_eq!(back(&on), batch(i), "batch {i}");
        n += 1;
    }
    assert_eq!(n, 50);
    let empty = Prefetcher::new(std::iter::empty::<Vec<Tensor>>(), 1, H2dOptions::default());
    assert_eq!(empty.unwrap().count(), 0);
}

#[test]
fn the_worker_runs_at_most_depth_batches_ahead() {
    sim();
    for depth in [1, 2, 5] {
        let (src, taken) = counting();
        let mut p = Prefetcher::new(src, depth, H2dOptions::default()).unwrap();
        for consumed in 0..4 {
            // Filled up to the bound, and never past it.
            assert!(
                eventually(|| taken.load(Ordering::SeqCst) == consumed + depth),
                "depth {depth}: {} taken with {consumed} consumed",
                taken.load(Ordering::SeqCst)
            );
            std::thread::sleep(Duration::from_millis(20));
            assert_eq!(
                taken.load(Ordering::SeqCst),
                consumed + depth,
                "depth {depth}"
            );
            assert_eq!(back(&p.next().unwrap().unwrap()), batch(consumed));
        }
    }
}

#[test]
fn a_failed_batch_is_an_error_in_its_place_and_the_next_ones_still_come() {
    sim();
    let too_big = vec![Tensor::from_vec(
        vec![1u8; DEVICE_BYTES + (1 << 20)],
        [DEVICE_BYTES + (1 << 20)],
    )
    .unwrap()];
    let src = vec![batch(0), batch(1), too_big.clone(), batch(3)];
    let out: Vec<_> = Prefetcher::new(src, 2, H2dOptions::default())
        .unwrap()
        .collect();
    assert_eq!(out.len(), 4);
    assert_eq!(back(out[0].as_ref().unwrap()), batch(0));
    assert_eq!(back(out[1].as_ref().unwrap()), batch(1));
    match &out[2] {
        Err(Error::Driver { error, .. }) => assert!(error.is_out_of_memory(), "{error:?}"),
        other => panic!("expected out of memory, got {other:?}"),
    }
    assert_eq!(back(out[3].as_ref().unwrap()), batch(3));
}

#[test]
fn a_panicking_source_ends_the_stream_with_an_error() {
    sim();
    let src = (0..5).map(|i| {
        if i == 2 {
            panic!("decoder broke")
        } else {
            batch(i)
        }
    });
    let out: Vec<_> = Prefetcher::new(src, 4, H2dOptions::default())
        .unwrap()
        .collect();
    assert_eq!(out.len(), 3);
    assert!(out[0].is_ok() && out[1].is_ok());
    match &out[2] {
        Err(Error::Worker { reason }) => assert!(reason.contains("decoder broke")),
        other => panic!("expected the source's panic, got {other:?}"),
    }
}

/// A batch whose own `Batch` code panics on the worker (here its `rebuild`, which the
/// transfer runs) is an error in its place, and the next batches still come (before,
/// the worker died and the stream ended as if the source had).
#[test]
fn a_batch_that_panics_while_moved_is_an_error_in_its_place() {
    sim();
    struct Fragile(Vec<Tensor>, bool);
    impl pinlane::Batch for Fragile {
        fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
            self.0.visit(f)
        }
        fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
            assert!(!self.1, "a broken batch");
            Fragile(self.0.rebuild(f), false)
        }
    }
    let src = (0..4).map(|i| Fragile(batch(i), i == 1));
    let out: Vec<_> = Prefetcher::new(src, 2, H2dOptions::default())
        .unwrap()
        .collect();
    assert_eq!(out.len(), 4);
    match &out[1] {
        Err(Error::Panicked {
            thread, message, ..
        }) => {
            assert_eq!(*thread, "prefetch");
            assert!(message.contains("a broken batch"), "{message}");
        }
        Err(e) => panic!("expected the batch's panic, got {e:?}"),
        Ok(_) => panic!("expected the batch's panic, got a batch"),
    }
    for i in [0, 2, 3] {
        assert_eq!(back(&out[i].as_ref().unwrap().0), batch(i), "batch {i}");
    }
}

/// A source whose drop panics (on the worker, once the source has ended): an error after
/// the batches, not the silent end of the stream it was before (session 64, a review's
/// finding; shown to fail without the worker's outer catch: 3 items, no error).
#[test]
fn a_source_that_panics_when_dropped_ends_the_stream_with_an_error() {
    sim();
    struct Brittle(std::ops::Range<usize>);
    impl Iterator for Brittle {
        type Item = Vec<Tensor>;
        fn next(&mut self) -> Option<Vec<Tensor>> {
            self.0.next().map(batch)
        }
    }
    impl Drop for Brittle {
        fn drop(&mut self) {
            panic!("the decoder's pool broke on close");
        }
    }
    let out: Vec<_> = Prefetcher::new(Brittle(0..3), 2, H2dOptions::default())
        .unwrap()
        .collect();
    assert_eq!(out.len(), 4, "three batches and the error");
    for (i, b) in out[..3].iter().enumerate() {
        assert_eq!(back(b.as_ref().unwrap()), batch(i), "batch {i}");
    }
    match &out[3] {
        Err(Error::Panicked {
            thread, message, ..
        }) => {
            assert_eq!(*thread, "prefetch");
            assert!(message.contains("broke on close"), "{message}");
        }
        other => panic!("expected the drop's panic, got {other:?}"),
    }
}

#[test]
fn dropping_it_early_stops_the_worker() {
    sim();
    let (src, taken) = counting();
    let mut p = Prefetcher::new(src, 3, H2dOptions::default()).unwrap();
    for i in 0..3 {
        assert_eq!(back(&p.next().unwrap().unwrap()), batch(i));
    }
    let t0 = Instant::now();
    drop(p);
    assert!(t0.elapsed() < Duration::from_secs(5));
    let after = taken.load(Ordering::SeqCst);
    assert!(after <= 3 + 3 + 1, "{after} taken");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(taken.load(Ordering::SeqCst), after, "the worker still runs");
}

#[test]
fn bad_options_are_refused_before_the_worker_starts() {
    sim();
    let taken = Arc::new(AtomicUsize::new(0));
    let t = taken.clone();
    let src = move || {
        let t = t.clone();
        (0..3).map(move |i| {
            t.fetch_add(1, Ordering::SeqCst);
            batch(i)
        })
    };
    for depth in [0, Prefetcher::<Vec<Tensor>>::MAX_DEPTH + 1, usize::MAX] {
        // Above the bound the queue's places alone could exhaust memory (a panic at
        // usize::MAX, before the bound).
        assert!(matches!(
            Prefetcher::new(src(), depth, H2dOptions::default()),
            Err(Error::InvalidOption { name: "depth", .. })
        ));
    }
    assert!(matches!(
        Prefetcher::new(src(), 2, H2dOptions::default().num_caches(usize::MAX)),
        Err(Error::InvalidOption { .. })
    ));
    assert!(matches!(
        Prefetcher::new(src(), 2, H2dOptions::default().device("cpu")),
        Err(Error::InvalidDevice { .. })
    ));
    assert_eq!(taken.load(Ordering::SeqCst), 0);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn random_batches_round_trip_through_the_prefetcher(
        batches in proptest::collection::vec(common::value(), 0..6),
        depth in 1usize..4,
    ) {
        sim();
        let expected: Vec<_> = batches.iter().map(common::fingerprint).collect();
        let p = Prefetcher::new(batches, depth, H2dOptions::default()).unwrap();
        let got: Vec<_> = p
            .map(|on: pinlane::Result<Value>| {
                let on = on.unwrap();
                common::fingerprint(&transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap())
            })
            .collect();
        prop_assert_eq!(got, expected);
    }
}
