//! Simulated device with 16 MiB of memory: an H2D output that finds the device full
//! while small outputs' blocks are kept (`Config::small_device_blocks`) gets them freed
//! and is allocated on a second try, instead of failing with out-of-memory while pinlane
//! itself holds the memory it needs.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

use pinlane::driver::sim::{enable, SimConfig};
use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d_with};
use pinlane::{D2hOptions, DType, Device, H2dOptions, Tensor};

fn tensor(nbytes: usize, seed: u8) -> Tensor {
    let bytes: Vec<u8> = (0..nbytes)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect();
    Tensor::from_bytes(DType::U8, [nbytes], &bytes).unwrap()
}

fn h2d(src: Vec<Tensor>) -> pinlane::Result<Vec<Tensor>> {
    transfer_tensor_h2d_with(&src, &H2dOptions::default().num_caches(0))
}

fn free_bytes() -> usize {
    pinlane::driver::device_memory_info(Device::cuda(0))
        .unwrap()
        .0
}

#[test]
fn a_full_device_frees_kept_blocks_and_the_output_is_allocated() {
    std::env::remove_var("LOCAL_RANK");
    enable(SimConfig::seeded(5).memory_per_device(16 << 20)).unwrap();
    // Eight 1 MiB outputs alive at once, then dropped: their blocks are kept (8 MiB).
    let small: Vec<Tensor> = (0..8).map(|k| tensor(1 << 20, k)).collect();
    let outs: Vec<Vec<Tensor>> = small
        .iter()
        .map(|t| h2d(vec![t.clone()]).unwrap())
        .collect();
    drop(outs);
    let kept = pinlane::memory_stats().kept_device_block_bytes;
    assert_eq!(kept, 8 << 20, "kept blocks");
    // Fill the device but for 1 MiB.
    let filler = h2d(vec![tensor(free_bytes() - (1 << 20), 9)]).unwrap();
    assert!(free_bytes() < 2 << 20);
    // 3 MiB does not fit what is free, but does once the kept blocks are freed.
    let big = tensor(3 << 20, 10);
    let out = h2d(vec![big.clone()]).expect("allocated after the kept blocks were freed");
    assert_eq!(pinlane::memory_stats().kept_device_block_bytes, 0);
    let back = transfer_tensor_d2h(&out, &D2hOptions::default()).unwrap();
    assert_eq!(back[0].as_bytes().unwrap(), big.as_bytes().unwrap());
    // With nothing kept, a batch that does not fit still fails with out-of-memory...
    let too_big = tensor(free_bytes() + (1 << 20), 11);
    let err = h2d(vec![too_big]).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    // ...and leaves nothing behind: the next calls work, and the bytes are right.
    drop((out, filler));
    let again = tensor(3 << 20, 12);
    let out = h2d(vec![again.clone()]).unwrap();
    let back = transfer_tensor_d2h(&out, &D2hOptions::default()).unwrap();
    assert_eq!(back[0].as_bytes().unwrap(), again.as_bytes().unwrap());
}
