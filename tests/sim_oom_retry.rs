//! Simulated device with 16 MiB of memory: an H2D output that finds the device full
//! while small outputs' blocks are kept (`Config::small_device_blocks`) gets them freed,
//! in order on their consumer stream, and is allocated on a second try, instead of
//! failing with out-of-memory while pinlane's kept blocks hold the memory it needs. The
//! wait for those frees is bounded by `Config::slot_wait` (500 ms here).
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::fault::{self, FaultKind};
use pinlane::driver::sim::{enable, SimConfig};
use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d_with, Config};
use pinlane::{D2hOptions, DType, Device, H2dOptions, Stream, Tensor};
use std::time::{Duration, Instant};

/// `nbytes` patterned bytes (the tests' shared `common::tensor`).
fn tensor(nbytes: usize, seed: u64) -> Tensor {
    common::tensor(DType::U8, &[nbytes], seed)
}

fn h2d(src: Vec<Tensor>) -> pinlane::Result<Vec<Tensor>> {
    transfer_tensor_h2d_with(&src, &H2dOptions::default().num_caches(0))
}

fn free_bytes() -> usize {
    pinlane::driver::device_memory_info(Device::cuda(0))
        .unwrap()
        .0
}

/// Eight 1 MiB outputs alive at once, then dropped: their blocks are kept (8 MiB), given
/// back on the default consumer stream (the legacy one).
fn keep_eight_blocks() {
    let small: Vec<Tensor> = (0..8).map(|k| tensor(1 << 20, k)).collect();
    let outs: Vec<Vec<Tensor>> = small
        .iter()
        .map(|t| h2d(vec![t.clone()]).unwrap())
        .collect();
    drop(outs);
    assert_eq!(pinlane::memory_stats().kept_device_block_bytes, 8 << 20);
}

#[test]
fn a_full_device_frees_kept_blocks_and_the_output_is_allocated() {
    std::env::remove_var("LOCAL_RANK");
    Config::new()
        .slot_wait(Duration::from_millis(500))
        .install()
        .unwrap();
    enable(SimConfig::seeded(5).memory_per_device(16 << 20)).unwrap();
    let legacy = Stream::legacy(Device::cuda(0)).unwrap();
    keep_eight_blocks();
    // Fill the device but for 1 MiB.
    let filler = h2d(vec![tensor(free_bytes() - (1 << 20), 9)]).unwrap();
    assert!(free_bytes() < 2 << 20);
    // 3 MiB does not fit what is free, but does once the kept blocks are freed: in order
    // on the consumer stream, so after the 200 ms of work queued there first.
    let big = tensor(3 << 20, 10);
    legacy.delay_async(Duration::from_millis(200)).unwrap();
    let t0 = Instant::now();
    let out = h2d(vec![big.clone()]).expect("allocated after the kept blocks were freed");
    // (The hold may have started a moment before `t0`.)
    let took = t0.elapsed();
    assert!(took >= Duration::from_millis(180), "{took:?}");
    assert_eq!(pinlane::memory_stats().kept_device_block_bytes, 0);
    let back = transfer_tensor_d2h(&out, &D2hOptions::default()).unwrap();
    assert_eq!(back[0].as_bytes().unwrap(), big.as_bytes().unwrap());
    drop(out);
    legacy.synchronize().unwrap();

    // The consumer stream busy for longer than `slot_wait`: the call does not wait for it
    // past the bound, and fails with out-of-memory; the frees still run after the work.
    keep_eight_blocks();
    legacy.delay_async(Duration::from_millis(1500)).unwrap();
    let t0 = Instant::now();
    let err = h2d(vec![big.clone()]).unwrap_err();
    let took = t0.elapsed();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(took < Duration::from_millis(1200), "{took:?}");
    legacy.synchronize().unwrap();
    assert_eq!(pinlane::memory_stats().kept_device_block_bytes, 0);
    let out = h2d(vec![big.clone()]).unwrap();
    drop(out);
    legacy.synchronize().unwrap();

    // Two threads that find the device full at once, while the kept blocks' frees wait
    // behind 200 ms of work on their stream: the first to make room frees them all; the
    // other, finding nothing left to free, waits for that round and tries again rather
    // than failing with out-of-memory. Both fit in what the frees give back.
    keep_eight_blocks();
    legacy.delay_async(Duration::from_millis(200)).unwrap();
    let start = std::sync::Arc::new(std::sync::Barrier::new(2));
    let threads: Vec<_> = (0..2)
        .map(|k| {
            let start = start.clone();
            let src = tensor(3 << 20, 20 + k);
            std::thread::spawn(move || {
                start.wait();
                let out = h2d(vec![src.clone()]);
                (
                    src,
                    out.map(|o| transfer_tensor_d2h(&o, &D2hOptions::default())),
                )
            })
        })
        .collect();
    for t in threads {
        let (src, back) = t.join().unwrap();
        let back = back
            .expect("both threads allocated")
            .expect("and read back");
        assert_eq!(back[0].as_bytes().unwrap(), src.as_bytes().unwrap());
    }
    assert_eq!(pinlane::memory_stats().kept_device_block_bytes, 0);
    legacy.synchronize().unwrap();

    // A driver error while the room is made (here the event that proves the kept blocks'
    // stream past their frees) is the call's error, not the out-of-memory it would hide.
    keep_eight_blocks();
    fault::inject(FaultKind::EventRecord, 1);
    let err = h2d(vec![big.clone()]).unwrap_err();
    assert!(!fault::armed(), "the event was made to fail");
    assert!(!err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("cuEventRecord"), "{err}");
    legacy.synchronize().unwrap();
    assert_eq!(pinlane::memory_stats().kept_device_block_bytes, 0);
    let out = h2d(vec![big.clone()]).expect("the frees ran: room for 3 MiB");
    drop(out);
    legacy.synchronize().unwrap();

    // A kept block whose free fails (made to fail here, as `cuMemFreeAsync` can) stays
    // allocated, never freed early; the allocation goes on with the room the other seven
    // frees made, and the failed free is not lost: the thread's next call returns it, once.
    let base = free_bytes();
    keep_eight_blocks();
    fault::inject(FaultKind::Free, 1);
    let out = h2d(vec![big.clone()]).expect("seven freed blocks make room for 3 MiB");
    assert!(
        !fault::armed(),
        "the first kept block's free was made to fail"
    );
    assert_eq!(pinlane::memory_stats().kept_device_block_bytes, 0);
    let back = transfer_tensor_d2h(&out, &D2hOptions::default());
    match back {
        Err(pinlane::Error::Deferred(e)) => {
            assert!(e.to_string().contains("cuMemFreeAsync"), "{e}")
        }
        other => panic!("the failed free was not returned: {other:?}"),
    }
    let back = transfer_tensor_d2h(&out, &D2hOptions::default()).expect("returned once");
    assert_eq!(back[0].as_bytes().unwrap(), big.as_bytes().unwrap());
    drop(out);
    legacy.synchronize().unwrap();
    assert_eq!(
        free_bytes(),
        base - (1 << 20),
        "the block whose free failed stays allocated"
    );

    // With nothing kept, a batch larger than all that is free fails with out-of-memory at
    // once (no room to make)...
    let too_big = tensor(free_bytes() + (1 << 20), 11);
    let err = h2d(vec![too_big]).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    // ...and leaves nothing behind: the next calls work, and the bytes are right.
    drop(filler);
    let again = tensor(3 << 20, 12);
    let out = h2d(vec![again.clone()]).unwrap();
    let back = transfer_tensor_d2h(&out, &D2hOptions::default()).unwrap();
    assert_eq!(back[0].as_bytes().unwrap(), again.as_bytes().unwrap());
}
