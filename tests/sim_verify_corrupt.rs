//! The checker finds a silent corruption (issue 24): the simulated device flips one byte
//! of its third copy, and `verify::round_trip` names the route, the tensor, the byte and
//! both values. Its own binary: the corruption is the simulator's configuration.
// The simulated device: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::sim::SimConfig;
use pinlane::verify::{round_trip, Calls, MismatchKind, RoundTrip, VerifyError};
use pinlane::{DType, HostOutput};

#[test]
fn a_flipped_byte_is_named_with_its_place() {
    // The first route (sources as given) makes one copy each way; the third copy is the
    // second route's (page-locked sources).
    common::sim_with(common::sim_runtime, || SimConfig::seeded(3).corrupt_copy(3));
    // One tensor of 32 KiB: one staging window and one copy each way.
    let batch = vec![common::tensor(DType::U32, &[8192], 5)];
    let how = RoundTrip::default()
        .calls(&[Calls::Blocking])
        .outputs(&[HostOutput::Pinned]);
    let err = round_trip(&batch, &how).expect_err("the corruption is found");
    let shown = err.to_string();
    let VerifyError::Mismatch { mismatch, route } = err else {
        panic!("{shown}");
    };
    assert_eq!(route.source, pinlane::verify::Source::PageLocked, "{shown}");
    assert_eq!(mismatch.path.to_string(), "[0]");
    match mismatch.kind {
        MismatchKind::Bytes {
            offset,
            element,
            ref expected,
            ref found,
            ..
        } => {
            assert_eq!((offset, element), (16384, 4096), "{shown}");
            assert_eq!(expected[0] ^ 0xFF, found[0]);
        }
        k => panic!("{k:?}"),
    }
    assert!(
        shown.contains("[0]: byte 16384 differs: element 4096 (u32)"),
        "{shown}"
    );
}
