//! GPU: `d2h(h2d(x)) == x` over random nested batches of every dtype and shape, with
//! pageable and pinned sources, through a deliberately small staging arena so that
//! tensors span several slots and slots are reused within one call.
// The strategies are pinlane's: feature `proptest` (tests/pack-shipped turns it on).
#![cfg(feature = "proptest")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, HostOutput, Location, Tensor, Value,
};
use proptest::prelude::*;

/// 4 KiB slots, 3 of them: a 12x12x12 f64 tensor (13.8 KB) spans 4 slots.
fn small_arena() {
    let _ = pinlane::Config::new()
        .slot_bytes(4096)
        .arena_bytes(3 * 4096)
        .install();
}

fn big_value() -> impl Strategy<Value = Value> {
    // Add a few larger tensors (up to ~40 KB) beside the random tree.
    (
        common::value(),
        proptest::collection::vec((common::dtype(), 1000usize..5000, any::<u64>()), 0..3),
    )
        .prop_map(|(v, big)| {
            let mut items = vec![v];
            items.extend(
                big.into_iter()
                    .map(|(d, n, s)| Value::Tensor(common::tensor(d, &[n], s))),
            );
            Value::List(items)
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn round_trip_preserves_structure_and_bytes(v in big_value(), pin_every in 0usize..4, pageable in any::<bool>()) {
        if !common::gpu() { return Ok(()); }
        small_arena();
        let src = common::mix(&v, pin_every, 0);
        let on_gpu = transfer_tensor_h2d(&src).unwrap();
        for t in pinlane::batch::tensors(&on_gpu) {
            prop_assert_eq!(t.location(), Location::Cuda(common::dev()));
        }
        let (mode, loc) = if pageable { (HostOutput::Pageable, Location::Host) } else { (HostOutput::Pinned, Location::Pinned) };
        let back = transfer_tensor_d2h(&on_gpu, &D2hOptions::default().output(mode)).unwrap();
        for t in pinlane::batch::tensors(&back) {
            prop_assert_eq!(t.location(), loc);
        }
        prop_assert_eq!(common::fingerprint(&back), common::fingerprint(&v));
        prop_assert_eq!(&back, &v);
        prop_assert!(pinlane::memory_stats().staging.held_bytes <= 3 * 4096);
    }
}

#[test]
fn arena_in_this_binary_is_small() {
    require_gpu!();
    small_arena();
    assert_eq!(pinlane::runtime().config().slot_bytes, 4096);
    // One tensor of 10 slots and one of 1 byte.
    let b = vec![
        common::tensor(pinlane::DType::U8, &[40_000], 5),
        Tensor::scalar(3u8),
    ];
    let on = transfer_tensor_h2d(&b).unwrap();
    assert!(pinlane::observe::last_transfer_stats().unwrap().windows >= 10);
    let pageable = D2hOptions::default().output(HostOutput::Pageable);
    let back = transfer_tensor_d2h(&on, &pageable).unwrap();
    assert_eq!(back, b);
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert!(s.windows >= 10, "{s:?}");
}
