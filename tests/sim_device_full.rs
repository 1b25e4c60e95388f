//! Simulated device with 16 MiB of memory: when the device is full, a D2H of many small
//! tensors (which the gather kernel would collect in a device buffer) falls back to one
//! copy per tensor, which needs no device memory, and succeeds.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

use pinlane::driver::sim::{enable, SimConfig};
use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, Device, Tensor};

#[test]
fn a_full_device_does_not_fail_the_gather_path() {
    std::env::remove_var("LOCAL_RANK");
    enable(SimConfig::seeded(3).memory_per_device(16 << 20)).unwrap();
    let small: Vec<Tensor> = (0..64)
        .map(|i| {
            let v: Vec<f32> = (0..1024).map(|k| (i * 1024 + k) as f32).collect();
            Tensor::from_vec(v, [1024]).unwrap()
        })
        .collect();
    let on_small = transfer_tensor_h2d(&small).unwrap();
    // Fill the device but for 64 KiB: the gather's 256 KiB buffer no longer fits.
    let (free, _) = pinlane::driver::device_memory_info(Device::cuda(0)).unwrap();
    let filler = vec![Tensor::from_bytes(
        DType::U8,
        vec![free - (64 << 10)],
        &vec![1u8; free - (64 << 10)],
    )
    .unwrap()];
    let _on_filler = transfer_tensor_h2d(&filler).unwrap();

    let back = transfer_tensor_d2h(&on_small, &D2hOptions::default()).unwrap();
    assert_eq!(back, small);
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!(
        s.copies, 64,
        "one copy per tensor after the gather ran out of memory: {s:?}"
    );
}
