//! `H2dPairs` on the simulated device: pairs checked once, copied step after step. Every
//! byte of the static buffer is checked after each copy (the copies' and the untouched
//! gaps'); what `transfer_tensor_h2d_into` refuses for the batches alone is refused when
//! the pairs are made, what depends on the call (the stream's device) at the copy.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use common::into::{check_buffer, destinations, static_buffer, view};
use pinlane::{DType, Device, Error, H2dPairs, IntoOptions, Stream, Tensor};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(100))]

    /// Two sets of sources bound to the same destinations, copied in turn: each copy
    /// leaves exactly its own sources' bytes.
    #[test]
    fn bound_pairs_copy_step_after_step(
        v in common::value(),
        pin_every in 0usize..4,
        skew in 0usize..3,
        seed in any::<u64>(),
    ) {
        common::sim();
        let a = common::mix(&v, pin_every, 0);
        let (dst, buf, ranges) = destinations(&a, skew);
        // The same shapes, other bytes.
        let mut k = 0u64;
        let b = pinlane::Batch::rebuild(&a, &mut |t: &Tensor| {
            k += 1;
            common::tensor(t.dtype(), t.dims(), seed.wrapping_add(k))
        });
        let pa = H2dPairs::new(&a, &dst).unwrap();
        let pb = H2dPairs::new(&b, &dst).unwrap();
        prop_assert_eq!(pa.len(), pb.len());
        for (step, (p, expect)) in [(&pa, &a), (&pb, &b), (&pa, &a)].into_iter().enumerate() {
            p.copy(&IntoOptions::default()).unwrap().wait().unwrap();
            prop_assert_eq!(check_buffer(&buf, expect, &ranges), Ok(()), "step {}", step);
        }
    }
}

#[test]
fn bad_pairs_are_refused_when_bound_and_a_wrong_stream_at_the_copy() {
    common::sim();
    let src = vec![
        common::tensor(DType::F32, &[64], 7),
        common::tensor(DType::U8, &[10], 8),
    ];
    let (dst, buf, _) = destinations(&src, 0);
    let wrong_dtype = vec![common::tensor(DType::I32, &[64], 7), src[1].clone()];
    let e = H2dPairs::new(&wrong_dtype, &dst).err().unwrap();
    assert!(
        matches!(&e, Error::IntoMismatch { at, .. } if at == "[0]"),
        "{e}"
    );
    let e = H2dPairs::new(&vec![src[0].clone()], &dst).err().unwrap();
    assert!(
        matches!(&e, Error::IntoMismatch { at, .. } if at == "batch"),
        "{e}"
    );
    let whole = static_buffer(1024);
    let overlapping = vec![view(&whole, 0, &src[0]), view(&whole, 128, &src[0])];
    let e = H2dPairs::new(&vec![src[0].clone(), src[0].clone()], &overlapping)
        .err()
        .unwrap();
    assert!(
        matches!(&e, Error::OverlappingDestinations { first, second } if first == "[0]" && second == "[1]"),
        "{e}"
    );

    // The stream is the call's: one of another device is refused at the copy, nothing
    // written; the same pairs then copy on the right one.
    let pairs = H2dPairs::new(&src, &dst).unwrap();
    let other = Stream::new(Device::cuda(1)).unwrap();
    let e = pairs
        .copy(&IntoOptions::default().stream(other))
        .err()
        .unwrap();
    assert!(matches!(e, Error::StreamDeviceMismatch { .. }), "{e}");
    assert_eq!(check_buffer(&buf, &Vec::<Tensor>::new(), &[]), Ok(()));
    pairs.copy(&IntoOptions::default()).unwrap().wait().unwrap();
    let back = pinlane::transfer_tensor_d2h(&dst, &pinlane::D2hOptions::default()).unwrap();
    assert_eq!(back, src);

    // Nothing to copy: empty pairs are left out.
    let empty = vec![Tensor::from_vec(Vec::<u8>::new(), [0]).unwrap()];
    let none = H2dPairs::new(&empty, &vec![view(&whole, 0, &empty[0])]).unwrap();
    assert!(none.is_empty());
    none.copy(&IntoOptions::default()).unwrap().wait().unwrap();
}
