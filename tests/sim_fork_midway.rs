//! A child forked while another thread of its parent is setting the (simulated) driver up:
//! the set-up's lock is held by a thread the child does not have, so a call there that
//! waited for it would wait for ever. The child is marked at the fork (the handler is
//! armed as the set-up starts) and refused at once instead. Its own process: the driver
//! must not have been set up before the test.
// The simulated device: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::sim::SimConfig;
use pinlane::{DType, Error, Tensor};
use std::time::Duration;

#[test]
fn a_child_forked_during_the_drivers_set_up_is_refused_not_stuck() {
    common::sim_with(common::sim_runtime, || {
        SimConfig::seeded(5).set_up_delay(Duration::from_millis(600))
    });
    let setting_up = std::thread::spawn(|| pinlane::driver::available().is_some());
    // The other thread is inside the set-up (600 ms long) when the fork comes.
    std::thread::sleep(Duration::from_millis(150));
    let status = common::in_forked_child(|| {
        let host: Vec<Tensor> = vec![common::tensor(DType::F32, &[64], 1)];
        let refused = matches!(
            pinlane::transfer_tensor_h2d(&host),
            Err(Error::ForkedChild {
                op: "transfer_tensor_h2d"
            })
        );
        let no_driver = pinlane::driver::available().is_none();
        i32::from(!refused) | i32::from(!no_driver) << 1
    });
    assert_eq!(status, 0, "the child's wrong answers, as a bit mask");
    assert!(
        setting_up.join().unwrap(),
        "the parent's set-up ends as usual"
    );
    let host: Vec<Tensor> = vec![common::tensor(DType::U8, &[1000], 2)];
    let back = pinlane::transfer_tensor_d2h(
        &pinlane::transfer_tensor_h2d(&host).unwrap(),
        &Default::default(),
    )
    .unwrap();
    assert_eq!(back, host);
}
