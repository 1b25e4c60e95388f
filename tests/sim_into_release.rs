//! Copies into existing tensors with a staging arena of several slots (simulated device,
//! every machine): a serving loop's call releases its last step's slot after queueing its
//! own copies, so the loop alternates between two slots and never waits for one, and
//! what it used is all released in the end; a step whose sources are all read in place
//! takes no slot. Its own binary: it reads process-wide
//! counters (staging slots in use, their peak).
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{memory_stats, transfer_tensor_h2d, transfer_tensor_h2d_into, DType, IntoOptions};
use pinlane::{Stream, Tensor};
use std::time::{Duration, Instant};

/// A step's inputs: a few small tensors, their bytes set by `step`.
fn inputs(step: u64) -> Vec<Tensor> {
    vec![
        common::tensor(DType::I64, &[256], step * 3),
        common::tensor(DType::F32, &[1000], step * 3 + 1),
        common::tensor(DType::U8, &[77], step * 3 + 2),
    ]
}

#[test]
fn a_serving_loop_alternates_two_slots_and_never_waits() {
    // Eight slots of 64 KiB: room to take a new slot at every step, were the last
    // step's never given back.
    common::sim_with(
        || {
            common::sim_runtime()
                .slot_bytes(64 << 10)
                .arena_bytes(512 << 10)
        },
        common::sim_device,
    );
    let stream = Stream::new(common::dev()).unwrap();
    let dst = transfer_tensor_h2d(&inputs(0)).unwrap();
    let opts = IntoOptions::default().stream(stream.clone());
    let waits = memory_stats().slot_waits;
    const STEPS: u64 = 100;
    for step in 1..=STEPS {
        drop(transfer_tensor_h2d_into(&inputs(step), &dst, &opts).unwrap());
        let in_use = memory_stats().staging.in_use_count;
        assert!(in_use <= 2, "step {step}: {in_use} slots in use");
        stream.synchronize().unwrap();
    }
    let s = memory_stats();
    assert_eq!(s.slot_waits, waits, "a step waited for a slot");
    assert!(
        s.staging.peak_bytes <= 2 * (64 << 10),
        "peak {} bytes of staging",
        s.staging.peak_bytes
    );
    let back = pinlane::transfer_tensor_d2h(&dst, &pinlane::D2hOptions::default()).unwrap();
    assert_eq!(back, inputs(STEPS));
    let end = Instant::now() + Duration::from_secs(2);
    while memory_stats().staging.in_use_count > 0 && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(1));
    }
    assert_eq!(memory_stats().staging.in_use_count, 0);

    // Page-locked sources that the kernel reads in place, with few enough pieces for the
    // launch's parameters (an in-place step): one launch, and no slot leased at all.
    let pinned: Vec<Tensor> = inputs(7).iter().map(|t| t.to_pinned().unwrap()).collect();
    let total: usize = pinned.iter().map(|t| t.nbytes()).sum();
    for _ in 0..10 {
        let t = transfer_tensor_h2d_into(&pinned, &dst, &opts).unwrap();
        assert_eq!(
            memory_stats().staging.in_use_count,
            0,
            "an in-place step took a slot"
        );
        let s = pinlane::observe::last_transfer_stats().unwrap();
        assert_eq!(
            (s.mapped_bytes, s.copies),
            (total, 1),
            "read in place: {s:?}"
        );
        t.wait().unwrap();
    }
    assert_eq!(memory_stats().staging.peak_bytes, s.staging.peak_bytes);
    let back = pinlane::transfer_tensor_d2h(&dst, &pinlane::D2hOptions::default()).unwrap();
    assert_eq!(back, pinned);
}
