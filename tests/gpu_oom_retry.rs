//! GPU: an H2D output that finds the device full while small outputs' blocks are kept
//! (`Config::small_device_blocks`) gets them freed, the pool's unused memory given back,
//! and is allocated on a second try. The test fills the device's memory, so it has a
//! binary of its own (`.gpu/run-tests` runs binaries one after another).

mod common;

use cudarc::driver::{result, sys, CudaContext};
use pinlane::{memory_stats, transfer_tensor_d2h, transfer_tensor_h2d_with};
use pinlane::{D2hOptions, DType, H2dOptions, Stream, Tensor};

fn h2d(src: Vec<Tensor>) -> pinlane::Result<Vec<Tensor>> {
    transfer_tensor_h2d_with(&src, &H2dOptions::default().num_caches(0))
}

/// Device memory allocated outside pinlane (`cuMemAlloc`) until none is left, freed when
/// dropped.
struct Filler(Vec<sys::CUdeviceptr>);

impl Filler {
    fn fill() -> Filler {
        let mut held = Vec::new();
        for chunk in [1usize << 30, 64 << 20, 2 << 20] {
            // SAFETY: a plain allocation in the current (primary) context; freed in drop.
            while let Ok(p) = unsafe { result::malloc_sync(chunk) } {
                held.push(p);
            }
        }
        Filler(held)
    }
}

impl Drop for Filler {
    fn drop(&mut self) {
        for p in self.0.drain(..) {
            // SAFETY: allocated by `fill` and not freed since.
            let _ = unsafe { result::free_sync(p) };
        }
    }
}

#[test]
fn a_full_device_frees_kept_blocks_and_the_output_is_allocated() {
    require_gpu!();
    if common::under_sanitizer() {
        return; // the sanitizer's own device memory would be filled too
    }
    let dev = common::dev();
    let ctx = CudaContext::new(dev.ordinal()).unwrap();
    ctx.bind_to_thread().unwrap();
    pinlane::trim().unwrap();
    // Eight 1 MiB outputs alive at once, then dropped: their blocks are kept (8 MiB).
    let small: Vec<Tensor> = (0..8u64)
        .map(|k| common::tensor(DType::U8, &[1 << 20], k))
        .collect();
    let outs: Vec<Vec<Tensor>> = small
        .iter()
        .map(|t| h2d(vec![t.clone()]).unwrap())
        .collect();
    drop(outs);
    Stream::legacy(dev).unwrap().synchronize().unwrap();
    assert_eq!(memory_stats().kept_device_block_bytes, 8 << 20);
    let pool = memory_stats()
        .devices
        .into_iter()
        .find(|d| d.device == dev)
        .unwrap();
    let pool_free = (pool.reserved_bytes - pool.used_bytes) as usize;

    let filler = Filler::fill();
    let (free, _) = pinlane::driver::device_memory_info(dev).unwrap();
    // More than the device and the pool have free, but 4 MiB less than they have once
    // the kept blocks are freed.
    let n = free + pool_free + (4 << 20);
    eprintln!(
        "filled {} allocations; free {free}, pool reserved {} used {}; asking {n}",
        filler.0.len(),
        pool.reserved_bytes,
        pool.used_bytes
    );
    let big = common::tensor(DType::U8, &[n], 99);
    let out = h2d(vec![big.clone()]).expect("allocated once the kept blocks were freed");
    assert_eq!(memory_stats().kept_device_block_bytes, 0);
    drop(filler);
    let back = transfer_tensor_d2h(&out, &D2hOptions::default()).unwrap();
    assert_eq!(back[0].as_bytes().unwrap(), big.as_bytes().unwrap());
}
