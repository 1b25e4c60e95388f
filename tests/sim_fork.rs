//! A child forked after pinlane set up the (simulated) device: every call that would use
//! the parent's CUDA state fails with `Error::ForkedChild` before it takes a lock or
//! calls the driver; the parent goes on as before. `tests/gpu_semantics.rs` checks the
//! same on the real driver.
// The simulated device: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, DType, Device, Error, Tensor};

#[test]
fn a_forked_child_is_refused_and_the_parent_goes_on() {
    common::sim();
    let host: Vec<Tensor> = vec![
        common::tensor(DType::F32, &[256], 1),
        common::tensor(DType::U8, &[100_000], 2),
    ];
    let on_device = transfer_tensor_h2d(&host).unwrap();
    let status = common::in_forked_child(|| {
        common::refusals_in_forked_child(&host, &on_device, Device::cuda(0))
    });
    assert_eq!(status, 0, "the child's wrong answers, as a bit mask");

    // The parent is unaffected: a round trip, and the error's text says what to do.
    let back =
        transfer_tensor_d2h(&transfer_tensor_h2d(&host).unwrap(), &Default::default()).unwrap();
    assert_eq!(common::fingerprint(&back), common::fingerprint(&host));
    let text = Error::ForkedChild { op: "x" }.to_string();
    assert!(text.contains("forked") && text.contains("spawn"), "{text}");
}
