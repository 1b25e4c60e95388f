//! A simulated device that does not map page-locked host memory for kernels (no unified
//! addressing): many small page-locked sources are then copied, never read by the gather
//! kernel (the simulator fails a kernel that reads host memory on such a device).
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, Tensor};

/// This binary's simulated devices do not map host memory.
fn unmapped_sim() {
    common::sim_with(common::sim_runtime, || {
        common::sim_device().host_mapped(false)
    });
}

#[test]
fn small_page_locked_sources_are_staged_without_a_device_mapping() {
    unmapped_sim();
    let b: Vec<Tensor> = (0..100)
        .map(|i| common::tensor(DType::F32, &[256], i).to_pinned().unwrap())
        .collect();
    let on = transfer_tensor_h2d(&b).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!((s.mapped_bytes, s.staged_bytes), (0, 100 * 1024), "{s:?}");
    // D2H's gather reads device memory only: still used, its descriptors passed in the
    // launch (the kernel cannot read them in the slot here), or for more than fit there
    // uploaded to the device first.
    let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert!(s.direct_bytes >= 100 * 1024, "{s:?}");
    assert_eq!(s.copies, 2, "launch, one copy: {s:?}");
    assert_eq!(back, b);
    // On both sides of the most the launch takes (127).
    for (n, copies) in [(127, 2), (128, 3), (300, 3)] {
        let many: Vec<Tensor> = (0..n)
            .map(|i| common::tensor(DType::F32, &[256], i))
            .collect();
        let on = transfer_tensor_h2d(&many).unwrap();
        let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
        let s = pinlane::observe::last_transfer_stats().unwrap();
        assert_eq!(
            s.copies, copies,
            "{n} tensors: (upload,) launch, one copy: {s:?}"
        );
        assert_eq!(back, many);
    }
}

#[test]
fn empty_page_locked_views_do_not_start_a_kernel_without_a_device_mapping() {
    unmapped_sim();
    // D2H outputs of a batch with empty tensors: the empty ones are views of the same
    // page-locked block as the non-empty one. Sent back, none may go to the kernel here.
    let b: Vec<Tensor> = (0..6)
        .map(|i| common::tensor(DType::U8, &[if i == 0 { 100 } else { 0 }], i))
        .collect();
    let on = transfer_tensor_h2d(&b).unwrap();
    let pinned = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
    let again = transfer_tensor_h2d(&pinned).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!((s.mapped_bytes, s.staged_bytes), (0, 100), "{s:?}");
    assert_eq!(
        transfer_tensor_d2h(&again, &D2hOptions::default()).unwrap(),
        b
    );
}
