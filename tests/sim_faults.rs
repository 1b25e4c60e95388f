//! Failures on the simulated device, at every kind and position: a typed error, the input
//! unchanged, queued copies drained before the call returns (nothing freed or reused
//! early: the next calls' bytes, read through poisoned memory, stay exact), owners
//! retained and counted when the drain fails and released by the next synchronisation,
//! and the next call on the thread working.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::fault::{self, FaultKind};
use pinlane::memory::retained::retained_bytes;
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, Error, HostOutput, Tensor,
};

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Pageable tensors over several slots, small ones (gathered on the way back), and a
/// page-locked one.
fn batch() -> Vec<Tensor> {
    let mut b: Vec<Tensor> = (0..3)
        .map(|i| common::tensor(DType::F32, &[40_000 + i], i as u64))
        .collect();
    b.extend((0..6).map(|i| common::tensor(DType::I16, &[17 + i], 100 + i as u64)));
    b.push(common::tensor(DType::U8, &[5000], 7).to_pinned().unwrap());
    b
}

fn injected(e: &Error) -> bool {
    matches!(e, Error::Driver { error, .. } if error.name() == "INJECTED_FAULT")
}

const KINDS: [FaultKind; 4] = [
    FaultKind::Alloc,
    FaultKind::Copy,
    FaultKind::EventRecord,
    FaultKind::StreamSync,
];

/// Injects `kind` at positions 1, 2, ... into `call` until a position no longer fires;
/// checks the rules at each; returns how many faults fired.
fn sweep(
    kind: FaultKind,
    input: &[Tensor],
    call: &dyn Fn() -> pinlane::Result<Vec<Tensor>>,
    expect: &[Tensor],
) -> usize {
    let before = common::fingerprint(&input.to_vec());
    let mut fired = 0;
    for nth in 1..10_000 {
        fault::inject(kind, nth);
        let r = call();
        if fault::armed() {
            // Position past the last call of this kind: nothing fired, the call worked.
            fault::clear();
            assert_eq!(r.unwrap(), expect, "{kind:?}: a call without a fault");
            break;
        }
        fired += 1;
        let e = r.unwrap_err();
        assert!(injected(&e), "{kind:?} #{nth}: {e}");
        assert_eq!(
            common::fingerprint(&input.to_vec()),
            before,
            "{kind:?} #{nth}: input unchanged"
        );
        if kind == FaultKind::StreamSync {
            // The drain (or the final synchronisation) failed: owners retained, counted.
            assert!(retained_bytes() > 0, "{kind:?} #{nth}: owners retained");
        } else {
            assert_eq!(
                retained_bytes(),
                0,
                "{kind:?} #{nth}: the drain proved completion"
            );
        }
        // The next call works, byte-exact, and releases what was retained.
        assert_eq!(call().unwrap(), expect, "{kind:?} #{nth}: the next call");
        assert_eq!(
            retained_bytes(),
            0,
            "{kind:?} #{nth}: released by the next sync"
        );
    }
    fired
}

/// Every kind of fault at every position of an H2D then D2H round trip of `b`; returns
/// how many fired (each kind at least once).
fn sweep_round_trip(b: &[Tensor]) -> usize {
    let mut total = 0;
    for kind in KINDS {
        let call = || {
            transfer_tensor_h2d(&b.to_vec())
                .and_then(|on| transfer_tensor_d2h(&on, &D2hOptions::default()))
        };
        let n = sweep(kind, b, &call, b);
        assert!(n > 0, "{kind:?} never fired");
        total += n;
    }
    total
}

#[test]
fn h2d_fault_sweep() {
    common::sim();
    let _turn = serial();
    std::thread::spawn(|| {
        let total = sweep_round_trip(&batch());
        eprintln!("h2d+d2h fault sweep: {total} faults injected");
    })
    .join()
    .unwrap();
}

/// 100 small pageable tensors: two staging windows of `common::sim`'s 64 KiB slots, whose
/// copies the rebuild's ticks queue (every 32 tensors placed), so that the faults of the
/// copies and of their events fire inside a tick.
fn many_small() -> Vec<Tensor> {
    (0..100)
        .map(|i| common::tensor(DType::F32, &[256], 1000 + i as u64))
        .collect()
}

#[test]
fn h2d_fault_sweep_with_windows_queued_during_the_rebuild() {
    common::sim();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = many_small();
        // Without a fault, both windows are queued before the batch is rebuilt: the path
        // the sweep below breaks.
        pinlane::observe::trace_next_call();
        let on = transfer_tensor_h2d(&b).unwrap();
        let marks = pinlane::observe::last_trace().unwrap();
        let labels: Vec<&str> = marks.iter().map(|m| m.0).collect();
        let queued: Vec<usize> = (0..labels.len())
            .filter(|&k| labels[k] == "window queued")
            .collect();
        let rebuilt = labels.iter().position(|l| *l == "rebuilt");
        assert!(
            queued.len() == 2 && rebuilt.is_some_and(|r| queued.iter().all(|&q| q < r)),
            "{labels:?}"
        );
        assert_eq!(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(), b);
        let total = sweep_round_trip(&b);
        eprintln!("h2d+d2h fault sweep, windows queued by ticks: {total} faults injected");
    })
    .join()
    .unwrap();
}

#[test]
fn d2h_fault_sweep_both_output_modes() {
    common::sim();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = batch();
        let on = transfer_tensor_h2d(&b).unwrap();
        let mut total = 0;
        for mode in [HostOutput::Pinned, HostOutput::Pageable] {
            for kind in KINDS {
                let call = || transfer_tensor_d2h(&on, &D2hOptions::default().output(mode));
                let n = sweep(kind, &on, &call, &b);
                assert!(n > 0, "{mode:?} {kind:?} never fired");
                total += n;
            }
        }
        eprintln!("d2h fault sweep: {total} faults injected");
    })
    .join()
    .unwrap();
}

/// Copies into existing tensors under every fault: the call's error (none is lost in a
/// dropped handle), the input unchanged, and the next call exact.
#[test]
fn h2d_into_fault_sweep() {
    common::sim();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = batch();
        let (dst, _buf, _) = common::into::destinations(&b, 1);
        let opts = pinlane::IntoOptions::default();
        let mut total = 0;
        for kind in KINDS {
            let call = || {
                pinlane::transfer_tensor_h2d_into(&b, &dst, &opts)?.wait()?;
                transfer_tensor_d2h(&dst, &D2hOptions::default())
            };
            let n = sweep(kind, &b, &call, &b);
            assert!(n > 0, "{kind:?} never fired");
            total += n;
        }
        eprintln!("h2d_into + d2h fault sweep: {total} faults injected");
    })
    .join()
    .unwrap();
}

/// The owner of a destination's device memory whose drop panics (user code pinlane runs
/// when it releases retained owners), counting its drops; it keeps the static buffer the
/// memory belongs to.
struct PanicsOnDrop(
    #[allow(dead_code)] // held: it keeps the memory allocated
    Tensor,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
);

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        panic!("the owner's drop panicked");
    }
}

/// Makes a copy into existing tensors of `src` fail with its drain failing too (the
/// done event's record, then the drain's synchronisation), so that what it keeps is
/// retained; returns the call's error.
fn into_call_retained(src: &Vec<Tensor>, dst: &Vec<Tensor>) -> Error {
    fault::inject(FaultKind::EventRecord, 1);
    fault::inject(FaultKind::StreamSync, 1);
    let r = pinlane::transfer_tensor_h2d_into(src, dst, &pinlane::IntoOptions::default())
        .and_then(|t| t.wait());
    assert!(!fault::armed(), "both faults fired");
    fault::clear();
    r.unwrap_err()
}

/// A copy into existing tensors from page-locked sources only, copied straight from
/// them (no staging slot), keeps nothing pinlane counts in bytes: when its drain fails,
/// its destinations and sources are retained in a group of 0 bytes. Releasing must not
/// skip such a group: before session 66 every release looked at the retained bytes
/// alone, so with none counted it kept the group (and the caller's page-locked memory)
/// for ever.
#[test]
fn a_retained_group_holding_no_counted_bytes_is_released() {
    common::sim();
    let _turn = serial();
    std::thread::spawn(|| {
        use pinlane::memory::retained::{retained_count, try_release};
        let src = vec![common::tensor(DType::U8, &[1 << 20], 3)
            .to_pinned()
            .unwrap()];
        let (dst, _buf, _) = common::into::destinations(&src, 0);
        let (count, bytes) = (retained_count(), retained_bytes());
        let e = into_call_retained(&src, &dst);
        assert!(injected(&e), "{e}");
        assert_eq!(
            retained_count(),
            count + 1,
            "the call's owners are retained"
        );
        assert_eq!(retained_bytes(), bytes, "in a group of no counted bytes");
        try_release();
        assert_eq!(retained_count(), count, "and released once proven done");
        // The next copy lands.
        pinlane::transfer_tensor_h2d_into(&src, &dst, &pinlane::IntoOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        let back = transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap();
        assert_eq!(back, src);
    })
    .join()
    .unwrap();
}

/// Releasing retained owners runs other calls' owners' drops (user code) on the thread
/// that releases them: a panic there is caught, recorded for the next call on the
/// device, and the release goes on, instead of unwinding into the call that released
/// them.
#[test]
fn a_panicking_drop_among_retained_owners_is_caught_and_reported() {
    common::sim();
    let _turn = serial();
    std::thread::spawn(|| {
        use pinlane::memory::retained::{retained_count, try_release};
        use std::sync::atomic::Ordering::SeqCst;
        let src = vec![common::tensor(DType::U8, &[1 << 20], 3)
            .to_pinned()
            .unwrap()];
        let (views, buf, _) = common::into::destinations(&src, 0);
        // The destination again, over the same memory, owned by an owner that panics.
        let drops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let stream = pinlane::Stream::legacy(pinlane::Device::cuda(0)).unwrap();
        let guard = views[0].device_ptr(&stream).unwrap();
        let ptr = guard.ptr();
        guard.finish().unwrap();
        let owner = PanicsOnDrop(buf.clone(), drops.clone());
        // SAFETY: `ptr..+1 MiB` is `views[0]`'s memory inside `buf`, which the owner keeps
        // allocated; only this test's copies write it.
        let dst = vec![unsafe {
            Tensor::from_device_ptr(ptr, pinlane::Device::cuda(0), DType::U8, [1 << 20], owner)
        }
        .unwrap()];
        drop(views);
        let count = retained_count();
        let e = into_call_retained(&src, &dst);
        assert!(injected(&e), "{e}");
        assert_eq!(retained_count(), count + 1);
        drop(dst); // the retained group holds the last clone of the destination
        assert_eq!(drops.load(SeqCst), 0);
        let released = std::panic::catch_unwind(|| {
            try_release();
        });
        assert!(released.is_ok(), "the owner's panic escaped the release");
        assert_eq!(drops.load(SeqCst), 1, "the owner dropped");
        assert_eq!(retained_count(), count, "released");
        // Reported to the next call on the device, on this thread.
        let e = transfer_tensor_h2d(&vec![Tensor::scalar(1u8)]).unwrap_err();
        assert!(
            e.to_string().contains("the owner's drop panicked")
                && e.to_string().contains("the calling thread"),
            "{e}"
        );
        // And the call after it works.
        transfer_tensor_h2d(&vec![Tensor::scalar(1u8)]).unwrap();
    })
    .join()
    .unwrap();
}

/// `settle` releases the owners retained after failed calls whose streams have finished;
/// releasing is pinlane's own drop, so another library's device memory among them whose
/// lent use still runs goes to the free thread to wait for it. `settle` must wait for
/// that drop too: before session 72's last change it looked at the free thread first and
/// released after, so it returned `Ok` with the owner still waiting there.
#[test]
fn settle_waits_for_a_retained_foreign_owner_its_release_hands_to_the_free_thread() {
    common::sim();
    let _turn = serial();
    std::thread::spawn(|| {
        use pinlane::memory::retained::retained_count;
        use std::time::{Duration, Instant};
        let dev = pinlane::Device::cuda(0);
        let src = vec![common::tensor(DType::U8, &[1 << 16], 5)
            .to_pinned()
            .unwrap()];
        let (views, buf, _) = common::into::destinations(&src, 0);
        let ptr = {
            let g = views[0]
                .device_ptr(&pinlane::Stream::legacy(dev).unwrap())
                .unwrap();
            let p = g.ptr();
            g.finish().unwrap();
            p
        };
        drop(views);
        let dropped_on = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let owner = common::DropNames(dropped_on.clone(), buf);
        // SAFETY: `ptr..+64 KiB` is the first destination's memory inside `buf`, which the
        // owner keeps allocated; only this test's copies write it.
        let ext =
            unsafe { Tensor::from_device_ptr(ptr, dev, DType::U8, [1 << 16], owner) }.unwrap();
        // Lent to `busy`: the use ends 1.5 s from now.
        let busy = pinlane::Stream::new(dev).unwrap();
        let lent = ext.device_ptr(&busy).unwrap();
        busy.delay_async(Duration::from_millis(1500)).unwrap();
        drop(lent);
        let t0 = Instant::now();
        let dst = vec![ext];
        let count = retained_count();
        let e = into_call_retained(&src, &dst);
        assert!(injected(&e), "{e}");
        assert_eq!(retained_count(), count + 1);
        drop(dst); // the retained group holds the last view of the foreign memory
        assert!(dropped_on.lock().unwrap().is_empty());
        pinlane::settle(Duration::from_secs(10)).unwrap();
        assert_eq!(
            *dropped_on.lock().unwrap(),
            ["pinlane-free"],
            "settle returned before the owner was dropped, or it dropped elsewhere"
        );
        assert!(
            t0.elapsed() >= Duration::from_millis(1300),
            "before the use ended"
        );
        assert_eq!(retained_count(), count);
        busy.synchronize().unwrap();
    })
    .join()
    .unwrap();
}
