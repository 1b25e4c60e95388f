//! Many threads on the simulated device: 8 threads x 500 batches mixing h2d and d2h, each
//! checking its own bytes (no data crosses between threads), with different cache-ring
//! sizes contending for the same staging arena and pools.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d_with, D2hOptions, DType, H2dOptions, HostOutput,
    Tensor,
};

#[test]
fn eight_threads_x_500_batches() {
    common::sim();
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            std::thread::spawn(move || {
                let opts = H2dOptions::default().num_caches(t as usize % 5);
                for b in 0..500u64 {
                    let seed = t * 1_000_000 + b * 10;
                    let batch: Vec<Tensor> = (0..(1 + b % 4))
                        .map(|k| {
                            common::tensor(
                                DType::ALL[((t + b + k) % 13) as usize],
                                &[1 + ((b * 37 + k * 101) % 3000) as usize],
                                seed + k,
                            )
                        })
                        .collect();
                    let on = transfer_tensor_h2d_with(&batch, &opts).unwrap();
                    let mode = if (t + b) % 2 == 0 {
                        HostOutput::Pinned
                    } else {
                        HostOutput::Pageable
                    };
                    let back =
                        transfer_tensor_d2h(&on, &D2hOptions::default().output(mode)).unwrap();
                    assert_eq!(back, batch, "thread {t} batch {b}");
                }
                assert_eq!(
                    pinlane::cached_batches(pinlane::Device::cuda(0)),
                    t as usize % 5,
                    "thread {t}'s ring"
                );
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
}
