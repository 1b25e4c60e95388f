//! GPU: failures part way through a batch (injected into real driver calls): a typed
//! error, the input unchanged, queued copies drained, owners retained when the drain
//! fails and released by the next successful synchronisation, the next call working.
// Faults injected into real driver calls: `--features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::fault::{self, FaultKind};
use pinlane::memory::retained::{retained_bytes, try_release};
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, Error, HostOutput, Location,
    Tensor,
};

fn batch() -> Vec<Tensor> {
    // Pageable tensors over several 32 MiB slots, plus a pinned one: every kind of copy.
    let mut b: Vec<Tensor> = (0..3)
        .map(|i| common::tensor(DType::F32, &[10 << 20], i))
        .collect();
    b.push(common::tensor(DType::U8, &[4096], 7).to_pinned().unwrap());
    b
}

/// The retained registry is process-wide: these tests take turns so that one test's
/// retained bytes are not seen by another's "nothing retained" check.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn injected(e: &Error) -> bool {
    matches!(e, Error::Driver { error, .. } if error.name() == "INJECTED_FAULT")
}

#[test]
fn h2d_faults_at_every_kind_and_position() {
    require_gpu!();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = batch();
        let before = common::fingerprint(&b);
        let cases = [
            (FaultKind::Alloc, 1),
            (FaultKind::Copy, 1),
            (FaultKind::Copy, 2),
            (FaultKind::Copy, 3),
            (FaultKind::EventRecord, 1),
            (FaultKind::EventRecord, 2),
        ];
        for (kind, nth) in cases {
            fault::inject(kind, nth);
            let e = transfer_tensor_h2d(&b).unwrap_err();
            assert!(injected(&e), "{kind:?} #{nth}: {e}");
            assert!(!fault::armed(), "{kind:?} #{nth} fired");
            assert_eq!(retained_bytes(), 0, "the drain succeeded, nothing retained");
            assert_eq!(common::fingerprint(&b), before, "input unchanged");
            let ok = transfer_tensor_h2d(&b).unwrap();
            assert_eq!(
                transfer_tensor_d2h(&ok, &D2hOptions::default()).unwrap(),
                b,
                "next call works"
            );
        }
    })
    .join()
    .unwrap();
}

#[test]
fn d2h_faults_at_every_kind_and_position() {
    require_gpu!();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = batch();
        let on = transfer_tensor_h2d(&b).unwrap();
        let cases = [
            (HostOutput::Pinned, FaultKind::Copy, 1),
            (HostOutput::Pinned, FaultKind::Copy, 3),
            (HostOutput::Pinned, FaultKind::EventRecord, 1),
            (HostOutput::Pageable, FaultKind::Copy, 1),
            (HostOutput::Pageable, FaultKind::Copy, 5),
            (HostOutput::Pageable, FaultKind::EventRecord, 1),
            (HostOutput::Pageable, FaultKind::EventRecord, 3),
        ];
        for (mode, kind, nth) in cases {
            let opts = D2hOptions::default().output(mode);
            fault::inject(kind, nth);
            let e = transfer_tensor_d2h(&on, &opts).unwrap_err();
            assert!(injected(&e), "{mode:?} {kind:?} #{nth}: {e}");
            assert!(!fault::armed(), "{mode:?} {kind:?} #{nth} fired");
            assert_eq!(retained_bytes(), 0);
            assert!(on.iter().all(Tensor::is_cuda), "input unchanged");
            assert_eq!(
                transfer_tensor_d2h(&on, &opts).unwrap(),
                b,
                "next call works"
            );
        }
    })
    .join()
    .unwrap();
}

/// `cuMemHostAlloc` out of memory for a D2H batch's page-locked block (injected into the
/// real driver call): the batch gets pageable outputs with the right bytes, counted as a
/// fallback, and the next call gets its page-locked block.
#[test]
fn d2h_gets_pageable_outputs_when_its_page_locked_block_cannot_be_allocated() {
    require_gpu!();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = vec![common::tensor(DType::U8, &[(97 << 20) + 123], 11)];
        let on = transfer_tensor_h2d(&b).unwrap();
        // No block an earlier test left in the pool may serve it (`batch()`'s 120 MiB
        // block would), so that the call allocates one.
        pinlane::trim().unwrap();
        let before = pinlane::memory_stats().pageable_fallbacks;
        fault::inject(FaultKind::HostAlloc, 1);
        let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
        assert!(!fault::armed(), "the block's allocation was tried");
        assert_eq!(back[0].location(), Location::Host);
        assert_eq!(back, b);
        assert_eq!(pinlane::memory_stats().pageable_fallbacks, before + 1);
        let again = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
        assert_eq!(again[0].location(), Location::Pinned);
        assert_eq!(again, b);
        assert_eq!(retained_bytes(), 0);
    })
    .join()
    .unwrap();
}

#[test]
fn failed_drain_retains_owners_until_a_later_sync() {
    require_gpu!();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = batch();
        // A copy fails, then the drain (stream sync) fails too: nothing can be freed.
        fault::inject(FaultKind::Copy, 2);
        fault::inject(FaultKind::StreamSync, 1);
        let e = transfer_tensor_h2d(&b).unwrap_err();
        assert!(injected(&e), "{e}");
        let held = retained_bytes();
        assert!(
            held >= 30 << 20,
            "the device buffer and slots are retained: {held}"
        );
        // The next call on this thread synchronises the same stream: completion proven.
        let ok = transfer_tensor_h2d(&b).unwrap();
        assert_eq!(retained_bytes(), 0);
        assert_eq!(transfer_tensor_d2h(&ok, &D2hOptions::default()).unwrap(), b);

        // Success path with a failed final sync: error returned, owners retained,
        // released by try_release.
        let on = transfer_tensor_h2d(&b).unwrap();
        fault::inject(FaultKind::StreamSync, 1);
        let e = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap_err();
        assert!(injected(&e));
        assert!(retained_bytes() > 0);
        assert_eq!(try_release(), 0);
    })
    .join()
    .unwrap();
}
