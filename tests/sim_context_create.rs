//! A device whose set-up fails part way (its memory pool takes no release threshold):
//! what was made for it is given back, so the next call, which tries again from the
//! start, does not leave a pool and a retain of the primary context behind each time
//! (session 87, after a review of the driver layer: both leaked per failed try). Its own
//! binary: the device's handles must not have been made before.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::fault::{self, FaultKind};
use pinlane::driver::sim;
use pinlane::{transfer_tensor_h2d, DType, Device, Error};

fn made() -> (usize, usize) {
    let a = sim::activity().expect("the simulator");
    (a.pools_live, a.context_retains[0])
}

#[test]
fn a_failed_device_set_up_gives_back_what_it_made_and_the_next_try_makes_it_once() {
    common::sim();
    assert_eq!(made(), (0, 0), "nothing made before the first call");
    for _ in 0..3 {
        fault::inject(FaultKind::PoolAttribute, 1);
        let r = pinlane::warm_up(Device::cuda(0)); // the device's context, pool and kernel
        assert!(!fault::armed(), "the set-up reached the pool's attribute");
        assert!(
            matches!(&r, Err(Error::Driver { op, .. }) if *op == "cuMemPoolSetAttribute"),
            "{r:?}"
        );
        assert_eq!(
            made(),
            (0, 0),
            "a failed set-up left its pool or its retain"
        );
    }
    pinlane::warm_up(Device::cuda(0)).unwrap();
    assert_eq!(made(), (1, 1), "the device made once");
    let t = common::tensor(DType::F32, &[256], 1);
    let on = transfer_tensor_h2d(&t).unwrap();
    assert_eq!(on.dims(), t.dims());
    assert_eq!(made(), (1, 1), "and not again");
}
