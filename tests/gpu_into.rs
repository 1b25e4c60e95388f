//! GPU: copies into existing tensors (issue 23) on the real device: random nested batches
//! into views of one static buffer, at aligned and unaligned places (every byte checked,
//! and every byte between them unchanged), the serving step as one kernel launch, a
//! batch larger than the arena through the ring, page-locked sources read in place by the
//! kernel (re-imported through DLPack, and registered in place with pages shared), and D2H
//! into page-locked memory.
// The strategies are pinlane's: feature `proptest` (tests/pack-shipped turns it on).
#![cfg(feature = "proptest")]

mod common;

use common::into::{check_buffer, destinations};
use pinlane::{
    transfer_tensor_d2h_into, transfer_tensor_h2d, transfer_tensor_h2d_into, DType, IntoOptions,
    Tensor, Value,
};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_batches_land_in_place(
        v in pinlane::verify::strategy::value(),
        pin_every in 0usize..4,
        skew in 0usize..3,
    ) {
        if !common::gpu() {
            return Ok(());
        }
        let src = common::mix(&v, pin_every, 0);
        let (dst, buf, ranges) = destinations(&src, skew);
        transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default()).unwrap().wait().unwrap();
        prop_assert_eq!(check_buffer(&buf, &v, &ranges), Ok(()));
    }
}

#[test]
fn a_serving_step_is_one_launch_and_a_large_batch_uses_the_ring() {
    require_gpu!();
    let mut step: Vec<Tensor> = (0..12u64)
        .map(|k| common::tensor(DType::I64, &[32 + 100 * k as usize], 40 + k))
        .collect();
    for t in step.iter_mut().step_by(4) {
        *t = t.to_pinned().unwrap();
    }
    let (dst, buf, ranges) = destinations(&step, 0);
    for _ in 0..3 {
        transfer_tensor_h2d_into(&step, &dst, &IntoOptions::default())
            .unwrap()
            .wait()
            .unwrap();
    }
    let stats = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!((stats.tensors, stats.copies), (12, 1), "{stats:?}");
    assert_eq!(check_buffer(&buf, &step, &ranges), Ok(()));

    // 48 MiB of pageable tensors, larger than the default arena's slots: the ring.
    let big = Value::List(
        (0..6u64)
            .map(|k| Value::Tensor(common::tensor(DType::F32, &[(2 << 20) + 7 * k as usize], k)))
            .collect(),
    );
    let (dst, buf, ranges) = destinations(&big, 1);
    transfer_tensor_h2d_into(&big, &dst, &IntoOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    assert!(pinlane::observe::last_transfer_stats().unwrap().windows > 1);
    assert_eq!(check_buffer(&buf, &big, &ranges), Ok(()));
}

#[test]
fn d2h_into_page_locked_memory() {
    require_gpu!();
    let host = vec![
        common::tensor(DType::Bf16, &[3, 333], 5),
        common::tensor(DType::U8, &[9 << 20], 6),
        common::tensor(DType::F64, &[17], 7),
    ];
    let on = transfer_tensor_h2d(&host).unwrap();
    let dst: Vec<Tensor> = host
        .iter()
        .map(|t| {
            let zeros = Tensor::from_bytes(t.dtype(), t.dims(), &vec![0; t.nbytes()]).unwrap();
            zeros.to_pinned().unwrap()
        })
        .collect();
    // SAFETY: nothing else reads or writes `dst`'s memory during the call.
    unsafe { transfer_tensor_d2h_into(&on, &dst, &IntoOptions::default()) }.unwrap();
    assert_eq!(dst, host);
}

#[test]
fn page_locked_sources_are_read_in_place_as_the_driver_maps_them() {
    require_gpu!();
    // Small and large, side by side in the heap (so some share pages).
    let host: Vec<Tensor> = [300usize, 20, 10_000, 70_000, 5, 1000]
        .iter()
        .enumerate()
        .map(|(k, &n)| common::tensor(DType::F32, &[n], 90 + k as u64))
        .collect();
    let total: usize = host.iter().map(Tensor::nbytes).sum();
    // pinlane's page-locked memory imported back through DLPack (another owner's, as
    // torch's pin_memory() arrives): the driver says the device maps it.
    let reimported: Vec<Tensor> = host
        .iter()
        .map(|t| Tensor::from_dlpack(t.to_pinned().unwrap().to_dlpack().unwrap()).unwrap())
        .collect();
    // The heap memory itself, page-locked in place (ranges of shared pages).
    let registered = Tensor::register_pinned_many(&host, common::dev()).unwrap();
    for src in [reimported, registered] {
        let (dst, buf, ranges) = destinations(&src, 0);
        for _ in 0..2 {
            transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let s = pinlane::observe::last_transfer_stats().unwrap();
            assert_eq!(
                (s.mapped_bytes, s.staged_bytes, s.direct_bytes, s.copies),
                (total, 0, 0, 1),
                "one launch reads them all: {s:?}"
            );
            assert_eq!(check_buffer(&buf, &host, &ranges), Ok(()));
        }
    }
}
