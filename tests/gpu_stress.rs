//! GPU: load, soak and size. Many threads moving mixed batches both ways at once with every
//! byte checked; 20,000 transfers with device and page-locked memory held flat; one tensor
//! over 4 GiB both ways.

mod common;

use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, HostOutput, Tensor};

/// These tests each use much of the machine; they take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// A fast fill for large tensors: 8-byte words from a per-tensor seed.
fn big_tensor(n: usize, seed: u64) -> Tensor {
    let mut words = vec![0u64; n.div_ceil(8)];
    let mut x = seed | 1;
    for w in &mut words {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        *w = x;
    }
    let bytes: &[u8] = bytemuck::cast_slice(&words);
    Tensor::from_bytes(DType::U8, [n], &bytes[..n]).unwrap()
}

#[test]
fn stress_8_threads_x_200_mixed_batches_both_ways() {
    require_gpu!();
    let _turn = serial();
    let sizes = [
        1 << 10,
        3 << 10,
        100 << 10,
        1 << 20,
        5 << 20,
        16 << 20,
        64 << 20,
    ];
    let workers: Vec<_> = (0..8u64)
        .map(|t| {
            std::thread::spawn(move || {
                // Each thread's sources: one tensor of each size, its own bytes.
                let pool: Vec<Tensor> = sizes
                    .iter()
                    .enumerate()
                    .map(|(i, &n)| big_tensor(n, t * 100 + i as u64))
                    .collect();
                let dev_pool = transfer_tensor_h2d(&pool).unwrap();
                let mut checked = 0usize;
                for b in 0..200u64 {
                    // A batch of 1 to 5 tensors picked by a per-thread sequence; 64 MiB at
                    // most every few batches.
                    let pick: Vec<usize> = (0..1 + (b as usize * 7 + t as usize) % 5)
                        .map(|k| {
                            (b as usize * 31 + k * 17 + t as usize * 3)
                                % if b % 4 == 0 { 7 } else { 6 }
                        })
                        .collect();
                    let host: Vec<Tensor> = pick.iter().map(|&i| pool[i].clone()).collect();
                    let dev: Vec<Tensor> = pick.iter().map(|&i| dev_pool[i].clone()).collect();
                    // h2d of fresh host data and d2h of device data, every byte checked.
                    let up = transfer_tensor_h2d(&host).unwrap();
                    let mode = if b % 2 == 0 {
                        HostOutput::Pinned
                    } else {
                        HostOutput::Pageable
                    };
                    let down =
                        transfer_tensor_d2h(&dev, &D2hOptions::default().output(mode)).unwrap();
                    assert!(down == host, "thread {t} batch {b}: d2h bytes");
                    let back =
                        transfer_tensor_d2h(&up, &D2hOptions::default().output(mode)).unwrap();
                    assert!(back == host, "thread {t} batch {b}: round-trip bytes");
                    checked += 2 * host.iter().map(Tensor::nbytes).sum::<usize>();
                }
                checked
            })
        })
        .collect();
    let total: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    eprintln!(
        "stress: 8 threads x 200 batches, {:.1} GB moved and checked each way",
        total as f64 / 2e9
    );
    assert!(total > 8 * 200 * 1024);
}

#[test]
fn soak_20000_transfers_hold_memory_flat() {
    require_gpu!();
    let _turn = serial();
    std::thread::spawn(|| {
        let mut batch: Vec<Tensor> = (0..64).map(|i| common::tensor(DType::F32, &[256 + i], i as u64)).collect();
        batch.push(big_tensor(3 << 20, 77));
        batch.push(Tensor::scalar(1i64));
        let round = |i: usize| {
            let up = transfer_tensor_h2d(&batch).unwrap();
            let mode = if i.is_multiple_of(2) { HostOutput::Pinned } else { HostOutput::Pageable };
            let back = transfer_tensor_d2h(&up, &D2hOptions::default().output(mode)).unwrap();
            if i.is_multiple_of(1000) {
                assert!(back == batch, "round {i}");
            }
        };
        // Device memory in use: the device's, or under compute-sanitizer (whose own memory
        // shows in cuMemGetInfo) pinlane's pool's reservation.
        let held = || {
            let s = pinlane::memory_stats();
            let dev = if common::under_sanitizer() {
                let pool = s.devices.iter().find(|d| d.device == common::dev());
                pool.map_or(0, |d| d.reserved_bytes) as usize
            } else {
                let (free, total) = pinlane::driver::device_memory_info(common::dev()).unwrap();
                total - free
            };
            (dev, s.staging.held_bytes + s.pinned_outputs.held_bytes)
        };
        for i in 0..1000 {
            round(i);
        }
        let (dev0, pin0) = held();
        for i in 1000..10_000 {
            round(i);
        }
        let (dev1, pin1) = held();
        eprintln!(
            "soak: 20,000 transfers; device memory in use {:.1} MiB after 2,000, {:.1} MiB after 20,000; page-locked held {} MiB then {} MiB",
            dev0 as f64 / 1048576.0,
            dev1 as f64 / 1048576.0,
            pin0 >> 20,
            pin1 >> 20
        );
        assert!(dev1 <= dev0 + (64 << 20), "device memory grew: {dev0} -> {dev1}");
        assert_eq!(pin1, pin0, "page-locked memory grew");
    })
    .join()
    .unwrap();
}

#[test]
fn one_tensor_over_4_gib_both_ways() {
    require_gpu!();
    let _turn = serial();
    let n = (4usize << 30) + 4099;
    let t = big_tensor(n, 4242);
    let on = transfer_tensor_h2d(&t).unwrap();
    assert!(on.is_cuda());
    for mode in [HostOutput::Pageable, HostOutput::Pinned] {
        let back = transfer_tensor_d2h(&on, &D2hOptions::default().output(mode)).unwrap();
        assert_eq!(back.nbytes(), n);
        assert!(
            back.as_bytes().unwrap() == t.as_bytes().unwrap(),
            "{mode:?}: bytes differ"
        );
    }
}
