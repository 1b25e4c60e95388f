//! The whole engine on the simulated device (every machine, CI included): `d2h(h2d(x)) ==
//! x` over 2,000+ random nested batches, with delayed completions and poisoned frees and
//! recycled slots, so a missing wait or an early reuse shows up as wrong bytes.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, Batch, D2hOptions, DType, HostOutput, Location,
    Tensor, Value,
};
use proptest::prelude::*;

/// A batch with a few tensors larger than the whole arena (1 MiB) beside the random tree.
fn with_big(v: Value, big: Vec<(DType, usize, u64)>) -> Value {
    let mut items = vec![v];
    items.extend(
        big.into_iter()
            .map(|(d, n, s)| Value::Tensor(common::tensor(d, &[n], s))),
    );
    Value::List(items)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1600))]

    #[test]
    fn round_trips_mixed_nested_batches(
        v in common::value(),
        pin_every in 0usize..4,
        dev_every in 0usize..5,
        pageable in any::<bool>(),
    ) {
        common::sim();
        let src = common::mix(&v, pin_every, dev_every);
        let on = transfer_tensor_h2d(&src).unwrap();
        for t in pinlane::batch::tensors(&on) {
            prop_assert_eq!(t.location(), Location::Cuda(pinlane::Device::cuda(0)));
        }
        let mode = if pageable { HostOutput::Pageable } else { HostOutput::Pinned };
        let back = transfer_tensor_d2h(&on, &D2hOptions::default().output(mode)).unwrap();
        prop_assert_eq!(common::fingerprint(&back), common::fingerprint(&v));
        prop_assert_eq!(&back, &v);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn round_trips_tensors_larger_than_the_arena(
        v in common::value(),
        big in proptest::collection::vec((common::dtype(), 20_000usize..200_000, any::<u64>()), 1..3),
    ) {
        common::sim();
        let b = with_big(v, big);
        let back = transfer_tensor_d2h(&transfer_tensor_h2d(&b).unwrap(), &D2hOptions::default().output(HostOutput::Pageable)).unwrap();
        prop_assert_eq!(&back, &b);
    }
}

#[derive(Batch, Clone, Debug, PartialEq)]
enum Sample {
    Image {
        pixels: Tensor,
        #[batch(skip)]
        id: String,
    },
    Pair(Tensor, Vec<Tensor>, u32),
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn round_trips_derived_types(a in common::host_tensor(), b in common::host_tensor(), c in proptest::collection::vec(common::host_tensor(), 0..5), id in "[a-z]{0,5}", n in any::<u32>()) {
        common::sim();
        let s = vec![Sample::Image { pixels: a, id }, Sample::Pair(b, c, n)];
        let back = transfer_tensor_d2h(&transfer_tensor_h2d(&s).unwrap(), &D2hOptions::default()).unwrap();
        prop_assert_eq!(back, s);
    }
}

#[test]
fn thousands_of_tiny_tensors() {
    common::sim();
    let b: Vec<Tensor> = (0..5000)
        .map(|i| common::tensor(DType::ALL[i % 13], &[1 + i % 7], i as u64))
        .collect();
    for mode in [HostOutput::Pinned, HostOutput::Pageable] {
        let back = transfer_tensor_d2h(
            &transfer_tensor_h2d(&b).unwrap(),
            &D2hOptions::default().output(mode),
        )
        .unwrap();
        assert_eq!(back, b, "{mode:?}");
    }
    let s = pinlane::observe::last_transfer_stats().unwrap();
    // 64 KiB slots carry 2,048 gather descriptors (32 bytes each): those tensors share
    // one copy, the other 2,952 are copied one by one.
    assert!(s.copies < 5000 - 2000, "small tensors share copies: {s:?}");
}

#[test]
fn small_pinned_sources_are_read_by_one_kernel_large_ones_go_direct() {
    common::sim();
    let mut b: Vec<Tensor> = (0..1000)
        .map(|i| {
            common::tensor(DType::F32, &[256], 7000 + i)
                .to_pinned()
                .unwrap()
        })
        .collect();
    // Under 4 MiB: read by the kernel too (in 64 KiB pieces). Over it: one direct copy.
    b.push(
        common::tensor(DType::U8, &[300_000], 1)
            .to_pinned()
            .unwrap(),
    );
    b.push(
        common::tensor(DType::U8, &[5_000_000], 2)
            .to_pinned()
            .unwrap(),
    );
    b.push(common::tensor(DType::U16, &[5_000], 3)); // pageable: staged
    let on = transfer_tensor_h2d(&b).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!(s.mapped_bytes, 1000 * 1024 + 300_000, "{s:?}");
    assert_eq!(s.direct_bytes, 5_000_000, "{s:?}");
    assert_eq!(s.staged_bytes, 10_000, "{s:?}");
    assert_eq!(
        s.copies, 3,
        "one launch, one direct copy, one window: {s:?}"
    );
    assert_eq!(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(), b);
    // Back: the small ones gathered by one launch that reads its descriptors in the
    // staging slot (no upload), then that range and the large tensor copied.
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!(s.copies, 3, "one launch, two copies: {s:?}");
}

#[test]
fn page_locked_sources_the_kernel_cannot_take_are_copied() {
    common::sim();
    // Three are too few for a launch: staged.
    let few: Vec<Tensor> = (0..3)
        .map(|i| common::tensor(DType::I32, &[100], i).to_pinned().unwrap())
        .collect();
    let on = transfer_tensor_h2d(&few).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!((s.mapped_bytes, s.staged_bytes), (0, 1200), "{s:?}");
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        few
    );
    // The 64 KiB slot holds 2,048 descriptors: the kernel reads the first 2,048 of these
    // 3,000 tensors, and the rest are staged.
    let many: Vec<Tensor> = (0..3000)
        .map(|i| common::tensor(DType::U8, &[16], i).to_pinned().unwrap())
        .collect();
    let on = transfer_tensor_h2d(&many).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!(
        (s.mapped_bytes, s.staged_bytes),
        (2048 * 16, 952 * 16),
        "{s:?}"
    );
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        many
    );
}

#[test]
fn many_batches_through_few_slots_keep_every_byte() {
    // The arena has 16 slots of 64 KiB; 300 batches of ~200 KiB reuse each slot many times.
    common::sim();
    for i in 0..300u64 {
        let b = vec![
            common::tensor(DType::U8, &[100_000 + i as usize], i),
            common::tensor(DType::F64, &[13_000], i + 7),
        ];
        let back =
            transfer_tensor_d2h(&transfer_tensor_h2d(&b).unwrap(), &D2hOptions::default()).unwrap();
        assert_eq!(back, b, "batch {i}");
    }
    assert!(pinlane::memory_stats().staging.held_bytes <= 1 << 20);
}
