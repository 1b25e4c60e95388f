//! End flags on the simulated device: a blocking D2H into page-locked outputs has its
//! stream set a word after the copies and spins on it instead of waiting in
//! `cuStreamSynchronize`; when the flag cannot be queued, or does not come within
//! `Config::spin`, the call waits in the driver and still returns the right bytes.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::fault::{self, FaultKind};
use pinlane::driver::sim::{activity, Activity};
use pinlane::memory::retained::retained_bytes;
use pinlane::{
    set_current_stream, transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, HostOutput,
    Stream, Tensor,
};
use std::sync::Mutex;
use std::time::Duration;

/// The counters are the process's: the tests take turns.
static TURN: Mutex<()> = Mutex::new(());

/// A spin long enough for the simulator's delays (each operation up to 5 us here), with
/// room for a loaded build machine.
const SPIN: Duration = Duration::from_millis(200);

fn setup() -> std::sync::MutexGuard<'static, ()> {
    common::sim_with(
        || common::sim_runtime().spin(SPIN),
        || common::sim_device().max_delay(Duration::from_micros(5)),
    );
    TURN.lock().unwrap_or_else(|p| p.into_inner())
}

/// A 1 KiB host tensor from `seed`, and its copy on the device.
fn one_on_device(seed: u64) -> (Tensor, Tensor) {
    let host = common::tensor(DType::F32, &[256], seed);
    let on = transfer_tensor_h2d(&host).unwrap();
    (host, on)
}

/// (flag writes queued, stream synchronisations) since `before`.
fn since(before: &Activity) -> (usize, usize) {
    let now = activity().unwrap();
    (
        now.flag_writes - before.flag_writes,
        now.stream_syncs - before.stream_syncs,
    )
}

#[test]
fn a_small_blocking_d2h_ends_on_its_flag() {
    let _turn = setup();
    let (host, on) = one_on_device(1);
    for _ in 0..20 {
        let before = activity().unwrap();
        let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
        assert_eq!(since(&before), (1, 0), "one flag, no driver wait");
        assert_eq!(back, host);
    }
    // Several tensors, one of them empty: one flag after all of them.
    let b = vec![
        common::tensor(DType::U8, &[3], 2),
        common::tensor(DType::F64, &[0], 3),
        common::tensor(DType::I32, &[1000], 4),
    ];
    let on = transfer_tensor_h2d(&b).unwrap();
    let before = activity().unwrap();
    let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
    assert_eq!(since(&before), (1, 0));
    assert_eq!(back, b);
}

#[test]
fn a_blocking_h2d_waits_in_the_driver() {
    // End flags are for D2H into page-locked outputs only (on H2D's stream they made the
    // next call's device allocation slower on the H200).
    let _turn = setup();
    for (i, n) in [1usize, 256, 100_000].into_iter().enumerate() {
        let host = common::tensor(DType::F32, &[n], 20 + i as u64);
        let before = activity().unwrap();
        let on = transfer_tensor_h2d(&host).unwrap();
        let (flags, syncs) = since(&before);
        assert_eq!(flags, 0, "{n} elements");
        assert!(syncs >= 1, "{n} elements");
        assert_eq!(
            transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
            host
        );
    }
}

#[test]
fn pageable_outputs_wait_in_the_driver() {
    let _turn = setup();
    let (host, on) = one_on_device(5);
    let before = activity().unwrap();
    let opts = D2hOptions::default().output(HostOutput::Pageable);
    let back = transfer_tensor_d2h(&on, &opts).unwrap();
    let (flags, syncs) = since(&before);
    assert_eq!(flags, 0);
    assert!(syncs >= 1);
    assert_eq!(back, host);
}

#[test]
fn a_flag_that_cannot_be_queued_leaves_the_wait_to_the_driver() {
    let _turn = setup();
    let (host, on) = one_on_device(6);
    fault::inject(FaultKind::FlagWrite, 1);
    let before = activity().unwrap();
    let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
    assert!(!fault::armed(), "the fault fired");
    assert_eq!(since(&before), (0, 1), "no flag queued; the driver's wait");
    assert_eq!(back, host);
}

#[test]
fn a_wait_longer_than_the_spin_goes_to_the_driver_and_keeps_the_order() {
    let _turn = setup();
    let initial = common::tensor(DType::F32, &[4096], 7);
    let fin = common::tensor(DType::F32, &[4096], 8).to_pinned().unwrap();
    let on = transfer_tensor_h2d(&initial).unwrap();
    let producer = Stream::new(common::dev()).unwrap();
    // The copy waits for the producer's stream (the current one) for 5 spins.
    producer.delay_async(SPIN * 5).unwrap();
    // SAFETY: `fin` and `on` live until the producer is synchronised below.
    unsafe { on.overwrite_async(&fin, &producer) }.unwrap();
    let before = activity().unwrap();
    let back = {
        let _cur = set_current_stream(&producer);
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap()
    };
    assert_eq!(back, fin, "the copy came after the producer's overwrite");
    assert_eq!(
        since(&before),
        (1, 1),
        "the flag queued, then the driver's wait"
    );
    producer.synchronize().unwrap();
    // The next call ends on its flag again.
    let before = activity().unwrap();
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        fin
    );
    assert_eq!(since(&before), (1, 0));
}

#[test]
fn an_armed_wait_fault_fires_in_the_driver() {
    let _turn = setup();
    let (host, on) = one_on_device(9);
    fault::inject(FaultKind::StreamSync, 1);
    let before = activity().unwrap();
    let r = transfer_tensor_d2h(&on, &D2hOptions::default());
    assert!(
        matches!(&r, Err(e) if e.to_string().contains("INJECTED_FAULT")),
        "{r:?}"
    );
    // The flag was queued; the wait went to the driver's call, where the injected fault
    // fired instead of calling it.
    assert_eq!(since(&before), (1, 0));
    fault::clear();
    // What the failed call held is retained (the driver's wait was not proven), and a
    // flag-ended call does not release it: its flag covers its own copies, not the
    // stream. A check of the stream without blocking (`trim`) does.
    assert!(retained_bytes() > 0);
    let before = activity().unwrap();
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        host
    );
    assert_eq!(since(&before), (1, 0));
    assert!(retained_bytes() > 0, "not released by a flag");
    pinlane::trim().unwrap();
    assert_eq!(retained_bytes(), 0);
}
