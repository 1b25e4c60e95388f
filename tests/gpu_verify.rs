//! GPU: `verify::round_trip` on the real device (issue 24): random nested batches along
//! all eight routes, and a chosen device and D2H stream.
// The strategies are pinlane's: feature `proptest` (tests/pack-shipped turns it on).
#![cfg(feature = "proptest")]

mod common;

use pinlane::verify::strategy::value;
use pinlane::verify::{round_trip, RoundTrip};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn random_batches_come_back_exact_every_way(v in value()) {
        if !common::gpu() {
            return Ok(());
        }
        round_trip(&v, &RoundTrip::default()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

#[test]
fn a_chosen_device_and_stream() {
    require_gpu!();
    let dev = common::dev();
    let stream = pinlane::Stream::new(dev).unwrap();
    let batch = (
        common::tensor(pinlane::DType::Bf16, &[3, 1000], 1),
        vec![common::tensor(pinlane::DType::U8, &[5 << 20], 2)], // large: direct copies
    );
    round_trip(&batch, &RoundTrip::default().device(dev).stream(stream)).unwrap();
}
