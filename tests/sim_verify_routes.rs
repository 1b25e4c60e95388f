//! Round-trip verification never passes a route it did not take (session 64, a review's
//! findings): a page-locked-outputs route whose batch the output pool has no room for (the
//! D2H then gives ordinary memory) fails naming it, and a selection with no route fails
//! instead of passing having moved nothing. A binary of its own: it lowers the
//! process's output-pool cap, which other tests' routes would see.
// The simulated device: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::verify::{round_trip, MismatchKind, RoundTrip, VerifyError};
use pinlane::{DType, Error, HostOutput, Location, Tensor};

#[test]
fn a_route_not_taken_fails_and_no_route_is_an_error() {
    common::sim();
    let batch: Vec<Tensor> = vec![
        common::tensor(DType::F32, &[1 << 18], 1),
        common::tensor(DType::U8, &[0], 2),
    ];
    let pinned_only = RoundTrip::default().outputs(&[HostOutput::Pinned]);
    round_trip(&batch, &pinned_only).expect("every route, with room in the pool");
    // A 1 MiB batch and a 64 KiB cap: the D2H falls back to ordinary memory.
    let rt = pinlane::runtime();
    let cap = rt.config().pinned_output_bytes;
    rt.set_pinned_output_bytes(64 << 10).unwrap();
    let r = round_trip(&batch, &pinned_only);
    rt.set_pinned_output_bytes(cap).unwrap();
    match r {
        Err(VerifyError::Mismatch { mismatch, .. }) => {
            assert_eq!(mismatch.path.to_string(), "[0]");
            assert_eq!(
                mismatch.kind,
                MismatchKind::NotInOutputs {
                    expected: Location::Pinned,
                    found: Location::Host
                }
            );
        }
        r => panic!("expected the route not taken, got {r:?}"),
    }
    round_trip(&batch, &pinned_only).expect("room again");
    // No route: an error, not a pass.
    for empty in [
        RoundTrip::default().calls(&[]),
        RoundTrip::default().sources(&[]),
        RoundTrip::default().outputs(&[]),
    ] {
        match round_trip(&batch, &empty) {
            Err(VerifyError::Setup(Error::InvalidOption { reason, .. })) => {
                assert!(reason.contains("no route"), "{reason}")
            }
            r => panic!("expected no route to be an error, got {r:?}"),
        }
    }
}
