//! Simulated device: the runtime (configuration, statistics, trim) and regression tests
//! for the holes issue 8's review found that the public API can show.
//!
//! The tests share the staging arena and measure it, so they run one at a time.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::fault::{self, FaultKind};
use pinlane::{
    cached_batches, memory_stats, set_current_stream, transfer_tensor_d2h, transfer_tensor_h2d,
    transfer_tensor_h2d_with, Config, D2hOptions, DType, Device, Error, H2dOptions, HostOutput,
    Location, Stream, Tensor,
};
use std::time::Duration;

fn serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let g = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    common::sim();
    g
}

fn d2h(b: &[Tensor]) -> Vec<Tensor> {
    transfer_tensor_d2h(&b.to_vec(), &D2hOptions::default()).unwrap()
}

/// Runs `f` on another thread and fails if it has not finished after `limit` (a hang).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not finish within {limit:?}: hung"))
}

#[test]
fn failed_final_syncs_that_hold_every_slot_do_not_hang_other_threads() {
    let _s = serial();
    // 16 slots of 64 KiB; a call of 8 MiB leases 8 of them. Two calls whose final
    // synchronisation fails leave their slots retained, so every slot is held.
    let big = vec![common::tensor(DType::U8, &[8 << 20], 1)];
    for _ in 0..2 {
        let b = big.clone();
        let r = std::thread::spawn(move || {
            fault::inject(FaultKind::StreamSync, 1);
            let r = transfer_tensor_h2d(&b);
            fault::clear();
            r
        })
        .join()
        .unwrap();
        assert!(r.is_err());
    }
    let s = memory_stats();
    assert_eq!(s.staging.in_use_bytes, s.staging.held_bytes, "{s:?}");
    assert!(s.retained_owners >= 2, "{s:?}");
    // Before the fix these waited forever for a slot (until someone called
    // retained::try_release by hand).
    let b = vec![common::tensor(DType::F32, &[300_000], 2)];
    let (on_ok, back) = within(Duration::from_secs(30), move || {
        let on = transfer_tensor_h2d(&b).unwrap();
        let back =
            transfer_tensor_d2h(&on, &D2hOptions::default().output(HostOutput::Pageable)).unwrap();
        (back == b, back)
    });
    assert!(on_ok, "{back:?}");
    let s = memory_stats();
    // The waiting call released what it needed: at least one of the two groups (the other
    // may still have been copying when it looked, and slots were free by then).
    assert!(s.retained_owners < 2, "{s:?}");
    assert!(s.slot_waits >= 1, "{s:?}");
    // The rest goes at a later check, once its stream is idle (trim checks without
    // blocking).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while memory_stats().retained_owners > 0 && std::time::Instant::now() < deadline {
        pinlane::trim().unwrap();
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(memory_stats().retained_owners, 0, "{:?}", memory_stats());
}

#[test]
fn current_stream_guards_dropped_out_of_order_keep_the_live_one() {
    let _s = serial();
    let dev = Device::cuda(0);
    let a = Stream::new(dev).unwrap();
    let b = Stream::new(dev).unwrap();
    let ga = set_current_stream(&a);
    let gb = set_current_stream(&b);
    drop(ga); // out of order: b's guard is still alive
    assert!(pinlane::current_stream(dev).unwrap().same_as(&b));
    drop(gb);
    assert!(pinlane::current_stream(dev).unwrap().is_legacy());
}

#[test]
fn empty_page_locked_tensors_give_empty_typed_slices() {
    let _s = serial();
    let empty = Tensor::from_vec(Vec::<f64>::new(), [0, 3]).unwrap();
    let pinned = empty.to_pinned_on(Device::cuda(0)).unwrap();
    assert_eq!(pinned.location(), Location::Pinned);
    assert_eq!(pinned.as_slice::<f64>().unwrap(), &[] as &[f64]);
    let on = transfer_tensor_h2d(&vec![empty.clone()]).unwrap();
    let back = d2h(&on);
    assert_eq!(back[0].location(), Location::Pinned);
    assert_eq!(back[0].as_slice::<f64>().unwrap(), &[] as &[f64]);
    // An empty external owner whose pointer is only 1-aligned.
    let t = Tensor::from_owner(Vec::<u8>::new(), DType::F32, [0]).unwrap();
    assert_eq!(t.as_slice::<f32>().unwrap(), &[] as &[f32]);
}

#[test]
fn an_absurd_num_caches_is_refused_before_any_copy() {
    let _s = serial();
    let dev = Device::cuda(0);
    let b = vec![Tensor::scalar(1u32)];
    let kept = std::thread::spawn(move || {
        transfer_tensor_h2d(&b).unwrap();
        let before = cached_batches(dev);
        let r = transfer_tensor_h2d_with(&b, &H2dOptions::default().num_caches(usize::MAX));
        (before, r.err(), cached_batches(dev))
    })
    .join()
    .unwrap();
    assert!(matches!(
        kept.1,
        Some(Error::InvalidOption {
            name: "num_caches",
            ..
        })
    ));
    assert_eq!((kept.0, kept.2), (1, 1), "the ring is untouched");
}

#[test]
fn many_small_output_batches_stay_page_locked() {
    let _s = serial();
    let on = transfer_tensor_h2d(&vec![Tensor::scalar(4i32)]).unwrap();
    let before = memory_stats();
    let kept: Vec<Vec<Tensor>> = (0..1100).map(|_| d2h(&on)).collect();
    assert!(kept.iter().all(|b| b[0].location() == Location::Pinned));
    let after = memory_stats();
    assert_eq!(after.pageable_fallbacks, before.pageable_fallbacks);
    assert!(
        after.pinned_outputs.held_bytes - before.pinned_outputs.held_bytes <= 2 << 20,
        "{after:?}"
    );
}

#[test]
fn the_runtime_is_configured_once_and_trims_what_is_unused() {
    let _s = serial();
    // common::sim() installed 64 KiB slots and a 1 MiB arena.
    let rt = pinlane::runtime();
    assert_eq!(rt.config().slot_bytes, 64 << 10);
    assert!(matches!(
        Config::new().install(),
        Err(Error::AlreadyRunning { .. })
    ));
    assert!(Config::new()
        .slot_bytes(64 << 10)
        .arena_bytes(1 << 20)
        .install()
        .is_ok());

    let b = vec![common::tensor(DType::U8, &[700_000], 3)];
    let on = transfer_tensor_h2d(&b).unwrap();
    let back =
        transfer_tensor_d2h(&on, &D2hOptions::default().output(HostOutput::Pageable)).unwrap();
    assert_eq!(back, b);
    drop(back);
    let s = memory_stats();
    assert!(
        s.staging.held_bytes > 0 && s.staging.in_use_bytes == 0,
        "{s:?}"
    );
    assert!(s.pageable_outputs.held_bytes > 0, "{s:?}");
    assert!(!s.devices.is_empty(), "{s:?}");
    pinlane::trim().unwrap();
    let s = memory_stats();
    assert_eq!(s.staging.held_bytes, 0, "{s:?}");
    assert_eq!(s.pageable_outputs.held_bytes, 0, "{s:?}");
    assert_eq!(s.pinned_outputs.in_use_bytes, s.pinned_outputs.held_bytes);

    // Caps change at run time.
    rt.set_host_pool_bytes(123);
    assert_eq!(rt.config().host_pool_bytes, 123);
    rt.set_host_pool_bytes(2 << 30);
    rt.set_arena_bytes(256 << 10).unwrap();
    assert_eq!(rt.config().arena_bytes, 256 << 10);
    let back =
        transfer_tensor_d2h(&on, &D2hOptions::default().output(HostOutput::Pageable)).unwrap();
    assert_eq!(back, b);
    assert!(memory_stats().staging.held_bytes <= 256 << 10);
    rt.set_arena_bytes(1 << 20).unwrap();
}

#[test]
fn the_device_pools_peak_never_goes_down() {
    // Regression (issue 19): the simulator answered every pool attribute with the bytes
    // in use, so `peak_reserved_bytes` fell when memory was freed.
    let _turn = serial();
    let peak = || {
        memory_stats()
            .devices
            .iter()
            .find(|d| d.device == Device::cuda(0))
            .map(|d| (d.peak_reserved_bytes, d.reserved_bytes, d.used_bytes))
            .unwrap_or_default()
    };
    let big = common::tensor(DType::U8, &[16 << 20], 3);
    // Not kept in the thread's cache ring: dropped, its memory is freed.
    let on = transfer_tensor_h2d_with(&vec![big], &H2dOptions::default().num_caches(0)).unwrap();
    let (during, reserved, used) = peak();
    assert!(
        during >= 16 << 20 && during >= reserved && reserved >= used,
        "{:?}",
        peak()
    );
    drop(on);
    Stream::legacy(Device::cuda(0))
        .unwrap()
        .synchronize()
        .unwrap();
    pinlane::trim().unwrap();
    let (after, _, _) = peak();
    assert!(after >= during, "the peak went down: {during} -> {after}");
}
