//! The lead of an H2D batch on the simulated device: a batch's leading pageable tensors are
//! handed to the copy threads while the batch is still walked, and the call fills the rest
//! of the first window after them. Every byte must land where the layout puts it, whatever
//! follows the lead (page-locked tensors read by the gather kernel, direct copies, device
//! tensors, more windows), and a batch with too short a lead must not start one.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::observe::TransferStats;
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, HostOutput, Location, Tensor,
};
use proptest::prelude::*;

/// The simulated device with four copy threads (the machine's share may be one, which
/// copies a lead on the calling thread) and 64 KiB slots, whose first 64 KiB a lead may
/// fill; windows from 16 KiB are filled in parallel too.
fn sim() {
    common::sim_with(
        || common::sim_runtime().copy_threads(4).parallel_min(16 << 10),
        common::sim_device,
    );
}

/// Held by the tests that change or rely on the arena's size, one at a time.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

/// The labels of the calling thread's last traced call.
fn marks() -> Vec<&'static str> {
    pinlane::observe::last_trace()
        .unwrap()
        .into_iter()
        .map(|(l, _)| l)
        .collect()
}

/// `n` pageable u8 tensors of `len` bytes, seeded from `seed`.
fn small(n: usize, len: usize, seed: u64) -> Vec<Tensor> {
    (0..n)
        .map(|i| common::tensor(DType::U8, &[len], seed + i as u64))
        .collect()
}

/// The first tensor where `a` and `b` differ, if any.
fn first_difference(a: &[Tensor], b: &[Tensor]) -> Option<usize> {
    (a.len() != b.len())
        .then_some(a.len().min(b.len()))
        .or_else(|| a.iter().zip(b).position(|(x, y)| x != y))
}

/// `b` to the device and back (pageable outputs), checked tensor by tensor against `b` on
/// the host; returns the H2D call's trace and stats.
fn round_trip(b: &Vec<Tensor>) -> (Vec<&'static str>, TransferStats) {
    let expected =
        transfer_tensor_d2h(b, &D2hOptions::default().output(HostOutput::Pageable)).unwrap();
    pinlane::observe::trace_next_call();
    let on = transfer_tensor_h2d(b).unwrap();
    let m = marks();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    for t in &on {
        assert_eq!(t.location(), Location::Cuda(pinlane::Device::cuda(0)));
    }
    let back =
        transfer_tensor_d2h(&on, &D2hOptions::default().output(HostOutput::Pageable)).unwrap();
    assert_eq!(first_difference(&back, &expected), None);
    (m, s)
}

#[test]
fn a_long_run_of_small_pageable_tensors_is_filled_while_walked() {
    sim();
    // 300 x 100 bytes at 256-byte places: the 64 KiB slot's first window holds 256 of
    // them, handed out in two chunks of 128; the rest go in the call's windows.
    for round in 0..20 {
        let b = small(300, 100, round * 1000);
        let (m, s) = round_trip(&b);
        let lead = m.iter().position(|l| *l == "lead fill started");
        let gathered = m.iter().position(|l| *l == "gathered");
        assert!(lead.is_some() && lead < gathered, "{m:?}");
        assert_eq!(s.staged_bytes, 300 * 100, "{s:?}");
    }
}

#[test]
fn a_short_run_starts_no_lead() {
    sim();
    // 127 leading tensors: under one hand-out, though 600 pageable ones follow a
    // page-locked one (which ends the lead).
    let mut b = small(127, 100, 7);
    b.push(common::tensor(DType::U8, &[100], 9).to_pinned().unwrap());
    b.extend(small(600, 100, 11));
    let (m, _) = round_trip(&b);
    assert!(!m.contains(&"lead fill started"), "{m:?}");
    // One tensor more, and the lead starts.
    let mut b = small(128, 100, 7);
    b.extend(small(600, 100, 11));
    let (m, _) = round_trip(&b);
    assert!(m.contains(&"lead fill started"), "{m:?}");
}

/// A lead, then 200 page-locked 1 KiB tensors (read by the gather kernel, whose 200
/// descriptors take a slot of their own: more than a launch's parameters hold), then
/// more pageable ones, a page-locked tensor too large for the kernel (copied directly) and
/// one already on the device.
fn before_the_kernel() -> Vec<Tensor> {
    let mut b = small(200, 100, 21);
    b.extend((0..200).map(|i| {
        common::tensor(DType::F32, &[256], 400 + i)
            .to_pinned()
            .unwrap()
    }));
    b.extend(small(50, 3000, 61));
    b.push(
        common::tensor(DType::U8, &[4_500_000], 70)
            .to_pinned()
            .unwrap(),
    );
    b.push(transfer_tensor_h2d(&common::tensor(DType::I64, &[33], 71)).unwrap());
    b
}

#[test]
fn a_lead_before_the_gather_kernels_slot() {
    sim();
    let _turn = serial();
    // The descriptors' slot is the first, the lead's the second.
    let b = before_the_kernel();
    for _ in 0..10 {
        let (m, s) = round_trip(&b);
        assert!(m.contains(&"lead fill started"), "{m:?}");
        assert_eq!(
            s.mapped_bytes,
            200 * 1024,
            "the kernel read the page-locked ones: {s:?}"
        );
        assert_eq!(s.direct_bytes, 4_500_000, "{s:?}");
    }
}

#[test]
fn a_lead_in_the_only_slot_gives_way_to_the_kernels_descriptors() {
    sim();
    let _turn = serial();
    // One slot: the lead's takes the descriptors, and its window is filled again.
    let rt = pinlane::runtime();
    rt.set_arena_bytes(64 << 10).unwrap();
    pinlane::trim().unwrap();
    let b = before_the_kernel();
    for _ in 0..10 {
        let (m, s) = round_trip(&b);
        assert!(m.contains(&"lead fill started"), "{m:?}");
        assert_eq!(s.mapped_bytes, 200 * 1024, "{s:?}");
    }
    assert!(pinlane::memory_stats().staging.held_bytes <= 64 << 10);
    rt.set_arena_bytes(1 << 20).unwrap();
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// A lead of random sizes (empty tensors too), then anything: every byte comes back.
    #[test]
    fn batches_with_a_lead_round_trip(
        lead in proptest::collection::vec(0usize..700, 120..400),
        tail in proptest::collection::vec(0usize..40_000, 0..20),
        pin_every in 0usize..4,
        dev_every in 0usize..5,
        seed in any::<u64>(),
    ) {
        sim();
        let host: Vec<Tensor> = lead
            .iter()
            .chain(&tail)
            .enumerate()
            .map(|(i, &n)| common::tensor(DType::U8, &[n], seed ^ i as u64))
            .collect();
        let mut b = host[..lead.len()].to_vec();
        b.extend(common::mix(&host[lead.len()..].to_vec(), pin_every, dev_every));
        let on = transfer_tensor_h2d(&b).unwrap();
        let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
        prop_assert_eq!(first_difference(&back, &host), None);
    }
}
