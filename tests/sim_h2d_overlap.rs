//! `transfer_tensor_h2d_overlapping` on the simulated device: `while_copying` runs once,
//! after every copy is queued and before the wait; what it made comes back beside the
//! batch, or is dropped inside a failed call; a panic in it unwinds without freeing what
//! the copies still write.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::fault::{self, FaultKind};
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_overlapping, D2hOptions, DType,
    Error, H2dOptions, Leaf, Tensor, Value,
};
use proptest::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

/// Capsules of the outputs, made inside `while_copying` as a binding makes them: the safe
/// export is refused there (the copies may still write the bytes), the unsafe one is not.
fn hand_over(outs: &[Tensor], drops: &Arc<AtomicUsize>) -> common::HandedOver {
    common::hand_over(outs, drops, |t| {
        assert!(t.is_cuda(), "{:?}", t.location());
        if t.nbytes() > 0 {
            assert!(
                matches!(t.to_dlpack(), Err(Error::BytesInFlight { op: "to_dlpack" })),
                "a safe export inside while_copying"
            );
        }
    })
}

/// The labels of the calling thread's last traced call.
fn marks() -> Vec<&'static str> {
    pinlane::observe::last_trace()
        .unwrap()
        .into_iter()
        .map(|(l, _)| l)
        .collect()
}

fn at(marks: &[&str], label: &str) -> usize {
    marks
        .iter()
        .position(|m| *m == label)
        .unwrap_or_else(|| panic!("no {label:?} in {marks:?}"))
}

/// Pageable sources (staged through several 64-KiB windows), and page-locked ones
/// copied directly.
fn batch() -> Vec<Tensor> {
    vec![
        common::tensor(DType::F32, &[300], 1),
        common::tensor(DType::U8, &[5], 2),
        common::tensor(DType::F64, &[20_000], 3),
        common::tensor(DType::I32, &[100_000], 4)
            .to_pinned()
            .unwrap(),
        common::tensor(DType::U8, &[0], 5),
    ]
}

#[test]
fn while_copying_runs_once_between_the_queued_copies_and_the_wait() {
    common::sim();
    let b = batch();
    let drops = Arc::new(AtomicUsize::new(0));
    for _ in 0..10 {
        let mut runs = 0;
        pinlane::observe::trace_next_call();
        let (on, handed) = transfer_tensor_h2d_overlapping(&b, &H2dOptions::default(), |o| {
            runs += 1;
            hand_over(o, &drops)
        })
        .unwrap();
        let m = marks();
        assert_eq!(runs, 1);
        assert!(at(&m, "submitted") < at(&m, "handed over"), "{m:?}");
        assert!(at(&m, "handed over") < at(&m, "synced"), "{m:?}");
        // The batch and what was handed over hold the sources' bytes once it returns.
        assert_eq!(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(), b);
        let back: Vec<Tensor> = handed
            .capsules
            .into_iter()
            .map(|c| Tensor::from_dlpack(c).unwrap())
            .collect();
        assert_eq!(
            transfer_tensor_d2h(&back, &D2hOptions::default()).unwrap(),
            b
        );
    }
    assert_eq!(drops.load(Ordering::SeqCst), 10);
}

#[test]
fn where_nothing_moves_while_copying_runs_on_the_finished_batch() {
    common::sim();
    let on = transfer_tensor_h2d(&batch()).unwrap();
    // Already on the device, and no tensor at all: the batch passes through, and
    // `while_copying` runs once on it, after the call.
    pinlane::observe::trace_next_call();
    let (same, n) =
        transfer_tensor_h2d_overlapping(&on, &H2dOptions::default(), |o| o.len()).unwrap();
    assert_eq!((&same, n), (&on, 5));
    assert!(!marks().contains(&"handed over"), "{:?}", marks());
    let none = Value::List(vec![Value::Leaf(Leaf::Int(7))]);
    let (same, n) = transfer_tensor_h2d_overlapping(&none, &H2dOptions::default(), |o| {
        pinlane::batch::tensors(o).len()
    })
    .unwrap();
    assert_eq!((same, n), (none, 0));
    // Bad options fail before any copy, without running it.
    let mut runs = 0;
    let bad = H2dOptions::default().device("cpu");
    let r = transfer_tensor_h2d_overlapping(&batch(), &bad, |_| runs += 1);
    assert!(matches!(r, Err(Error::InvalidDevice { .. })), "{r:?}");
    assert_eq!(runs, 0);
}

#[test]
fn a_failed_wait_drops_what_was_handed_over_in_the_call() {
    common::sim();
    let b = batch();
    let drops = Arc::new(AtomicUsize::new(0));
    fault::inject(FaultKind::StreamSync, 1);
    let mut runs = 0;
    let r = transfer_tensor_h2d_overlapping(&b, &H2dOptions::default(), |o| {
        runs += 1;
        hand_over(o, &drops)
    });
    fault::clear();
    assert!(
        matches!(&r, Err(e) if e.to_string().contains("INJECTED_FAULT")),
        "{:?}",
        r.as_ref().map(|_| ())
    );
    assert_eq!(runs, 1);
    assert_eq!(
        drops.load(Ordering::SeqCst),
        1,
        "dropped unread, in the call"
    );
    // A copy that fails while queueing fails the call before `while_copying`.
    fault::inject(FaultKind::Copy, 1);
    let r = transfer_tensor_h2d_overlapping(&b, &H2dOptions::default(), |o| {
        runs += 1;
        hand_over(o, &drops)
    });
    fault::clear();
    assert!(r.is_err());
    assert_eq!((runs, drops.load(Ordering::SeqCst)), (1, 1));
    // The next calls are right.
    for _ in 0..3 {
        let on = transfer_tensor_h2d(&b).unwrap();
        assert_eq!(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(), b);
    }
}

#[test]
fn a_panic_in_while_copying_unwinds_and_frees_nothing_the_copies_still_write() {
    common::sim();
    let b = batch();
    let other = vec![common::tensor(DType::F32, &[60_000], 9)];
    for _ in 0..5 {
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            transfer_tensor_h2d_overlapping(&b, &H2dOptions::default(), |_| {
                panic!("a panic in while_copying (expected by the test)")
            })
        }));
        assert!(r.is_err(), "the panic unwinds out of the call");
        // The calls after it are right: the simulator poisons freed device memory, so a
        // buffer given back while the unwound call's copies still wrote it, and reused
        // here, would show wrong bytes.
        for _ in 0..3 {
            let on = transfer_tensor_h2d(&other).unwrap();
            assert_eq!(
                transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
                other
            );
        }
    }
}

/// A batch of one host tensor whose rebuild tries what safe code may do with the device
/// output it is handed, while the H2D copies that write it may still run: lend its
/// pointer, export it, copy it to the host, copy into it. `earlier` is a device tensor of
/// another call (not visited): it stays usable.
struct Uses {
    src: Tensor,
    earlier: Tensor,
    /// Filled by `rebuild`: what each use of the output gave, then whether `earlier`
    /// could be lent.
    seen: Vec<Result<(), Error>>,
}

impl pinlane::Batch for Uses {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        f(&self.src);
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        let out = f(&self.src);
        Uses {
            src: out.clone(),
            earlier: self.earlier.clone(),
            seen: uses(&out, &self.earlier),
        }
    }
}

/// Each use of `out` (an H2D output), then lending `earlier`.
fn uses(out: &Tensor, earlier: &Tensor) -> Vec<Result<(), Error>> {
    let s = pinlane::Stream::legacy(pinlane::Device::cuda(0)).unwrap();
    let one = vec![out.clone()];
    let zeros = vec![0u8; out.nbytes()];
    let host = vec![Tensor::from_bytes(out.dtype(), out.dims(), &zeros)
        .unwrap()
        .to_pinned()
        .unwrap()];
    let opts = pinlane::IntoOptions::default();
    vec![
        out.device_ptr(&s).map(drop),
        out.to_dlpack().map(drop),
        out.to_dlpack_on(&s).map(drop),
        transfer_tensor_d2h(&one, &D2hOptions::default()).map(drop),
        // SAFETY: nothing else touches `host` during the call; the call is refused before
        // anything is queued (what is tested), and were it not, it would wait for its copy.
        unsafe { pinlane::transfer_tensor_d2h_into(&one, &host, &opts) },
        pinlane::transfer_tensor_h2d_into(&host, &one, &opts).map(drop),
        pinlane::H2dPairs::new(&host, &one).and_then(|p| p.copy(&opts).map(drop)),
        earlier.device_ptr(&s).map(drop),
    ]
}

fn refused_then_usable(seen: &[Result<(), Error>], during: &str) {
    let ops = [
        "device_ptr",
        "to_dlpack",
        "to_dlpack",
        "transfer_tensor_d2h",
        "transfer_tensor_d2h_into",
        "transfer_tensor_h2d_into",
        "transfer_tensor_h2d_into",
    ];
    assert_eq!(seen.len(), ops.len() + 1);
    for (r, op) in seen.iter().zip(ops) {
        assert!(
            matches!(r, Err(Error::BytesInFlight { op: o }) if *o == op),
            "{op} {during}: {r:?}"
        );
    }
    assert!(
        seen[ops.len()].is_ok(),
        "another call's output {during}: {:?}",
        seen[ops.len()]
    );
}

#[test]
fn an_h2d_s_outputs_refuse_uses_not_ordered_after_their_copies_until_it_returns() {
    // Regression (session 55): an H2D call's device outputs exist while the copies into
    // them run (its batch's rebuild, `while_copying`); a lent pointer, an export, or a
    // copy from or into them there was not ordered after those copies, and could read
    // stale bytes. Each is now refused with BytesInFlight, nothing queued, and works
    // once the call has returned.
    common::sim();
    let src = common::tensor(DType::F32, &[20_000], 11);
    let earlier = transfer_tensor_h2d(&vec![common::tensor(DType::F32, &[10], 12)])
        .unwrap()
        .remove(0);
    let b = Uses {
        src: src.clone(),
        earlier: earlier.clone(),
        seen: Vec::new(),
    };
    let out = transfer_tensor_h2d(&b).unwrap();
    refused_then_usable(&out.seen, "in the rebuild");
    assert!(out.src.is_cuda());
    // The call has returned: every use works, and the bytes are the source's.
    assert!(uses(&out.src, &earlier).iter().all(Result::is_ok));
    let back = transfer_tensor_d2h(&vec![out.src.clone()], &D2hOptions::default()).unwrap();
    assert_eq!(back[0], src);
    // The same inside `while_copying`, and after that call.
    let one = vec![src.clone()];
    let (on, seen) =
        transfer_tensor_h2d_overlapping(&one, &H2dOptions::default(), |o| uses(&o[0], &earlier))
            .unwrap();
    refused_then_usable(&seen, "in while_copying");
    assert!(uses(&on[0], &earlier).iter().all(Result::is_ok));
    // A non-blocking call's rebuild is gated too. Once it has returned, its outputs are
    // its handle's: usable on a stream made to wait for the copies (`batch_for`), before
    // the host knows they are done, and after the wait.
    let moving = pinlane::transfer_tensor_h2d_async(&b, &H2dOptions::default()).unwrap();
    let consumer = pinlane::Stream::new(pinlane::Device::cuda(0)).unwrap();
    let ordered = moving.batch_for(&consumer).unwrap().src.clone();
    drop(ordered.device_ptr(&consumer).unwrap());
    let back = transfer_tensor_d2h(
        &vec![ordered],
        &D2hOptions::default()
            .device(pinlane::Device::cuda(0))
            .stream(consumer),
    )
    .unwrap();
    assert_eq!(back[0], src);
    let out = moving.wait().unwrap();
    refused_then_usable(&out.seen, "in a non-blocking call's rebuild");
    assert!(uses(&out.src, &earlier).iter().all(Result::is_ok));
}

/// `inner` as a batch whose rebuild keeps a clone of every output, in visit order (in
/// the batch it rebuilds: [`KeepsAll::take`] has them after the call's rebuild).
struct KeepsAll<B> {
    inner: B,
    kept: std::sync::Mutex<Vec<Tensor>>,
}

impl<B> KeepsAll<B> {
    fn new(inner: B) -> Self {
        KeepsAll {
            inner,
            kept: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The clones the rebuild kept (none if it did not run).
    fn take(&self) -> Vec<Tensor> {
        std::mem::take(&mut *self.kept.lock().unwrap())
    }
}

impl<B: pinlane::Batch> pinlane::Batch for KeepsAll<B> {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        self.inner.visit(f);
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        let mut kept = Vec::new();
        let inner = self.inner.rebuild(&mut |t| {
            let out = f(t);
            kept.push(out.clone());
            out
        });
        *self.kept.lock().unwrap() = kept;
        KeepsAll::new(inner)
    }
}

#[test]
fn a_clone_kept_from_a_rebuild_stays_refused_when_a_later_copy_fails() {
    // Review finding (session 55): H2D rebuilds while later windows' copies are still
    // being queued; a copy failing after the rebuild left the drained output unmarked,
    // though some of its bytes were never copied. It stays refused now.
    common::sim();
    let src = common::tensor(DType::F32, &[200_000], 31); // 800 KB: many windows, copies 13 on after the rebuild
    let s = pinlane::Stream::legacy(pinlane::Device::cuda(0)).unwrap();
    let mut after_rebuild = 0;
    for at in 1..40 {
        // One large pageable tensor: several staging windows.
        let b = KeepsAll::new(src.clone());
        fault::inject(FaultKind::Copy, at);
        let r = transfer_tensor_h2d(&b);
        fault::clear();
        let kept = b.take().pop();
        match (r, kept) {
            (Err(_), Some(k)) => {
                after_rebuild += 1;
                assert!(
                    matches!(k.device_ptr(&s), Err(Error::BytesInFlight { .. })),
                    "copy {at} failed after the rebuild: its output must stay refused"
                );
            }
            (Ok(out), _) => {
                // The fault fell past the call's copies: the bytes are the source's.
                let back = transfer_tensor_d2h(&vec![out.inner], &D2hOptions::default());
                assert_eq!(back.unwrap()[0], src);
            }
            (Err(_), None) => {} // failed before the rebuild
        }
    }
    assert!(after_rebuild > 0, "no copy failed after the rebuild");
    let on = transfer_tensor_h2d(&vec![src.clone()]).unwrap();
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap()[0],
        src
    );
}

#[test]
fn a_clone_kept_from_a_non_blocking_h2d_is_used_after_its_copies() {
    // Left open in session 55: once a non-blocking H2D call had returned, a clone kept
    // from its rebuild was no longer gated, and a use of it on another stream before the
    // copies were done could read stale bytes. Now each use on a stream is queued after the
    // copies there, and an export without a stream is refused until they are done.
    common::sim();
    // 32 MiB from page-locked memory (one direct copy, which the simulated device runs
    // for milliseconds after the call has returned), then 64 KiB through a staging slot:
    // H2D queues the direct copy first, so the small output, whose clone is used, is
    // written last.
    let large = common::tensor(DType::U8, &[32 << 20], 41)
        .to_pinned()
        .unwrap();
    let small = common::tensor(DType::U8, &[64 << 10], 43);
    let other_bytes = common::tensor(DType::U8, &[64 << 10], 42);
    let dev = pinlane::Device::cuda(0);
    let mut refused = 0;
    // One call per use, each on a stream of its own: the first use that waits would
    // otherwise order the next ones.
    for way in [
        "device_ptr",
        "to_dlpack_on",
        "transfer_tensor_d2h",
        "h2d_into",
    ] {
        let b = KeepsAll::new((large.clone(), small.clone()));
        let moving = pinlane::transfer_tensor_h2d_async(&b, &H2dOptions::default()).unwrap();
        let done = moving.ready_event().expect("copies in flight").clone();
        let kept = b.take().pop().expect("rebuilt");
        match kept.to_dlpack() {
            Err(Error::BytesInFlight { op: "to_dlpack" }) => refused += 1,
            r => assert!(r.is_ok(), "{:?}", r.err()),
        }
        let s = pinlane::Stream::new(dev).unwrap();
        let after = pinlane::Event::new(dev).unwrap();
        match way {
            "device_ptr" => drop(kept.device_ptr(&s).unwrap()),
            "to_dlpack_on" => drop(kept.to_dlpack_on(&s).unwrap()),
            "transfer_tensor_d2h" => {
                // Unordered, it would read the output before the call's copy wrote it.
                let opts = D2hOptions::default().device(dev).stream(s.clone());
                let back = transfer_tensor_d2h(&vec![kept.clone()], &opts).unwrap();
                assert_eq!(back[0], small, "the D2H read before the call's copy");
            }
            _ => {
                // Unordered, the call's copy would land after it, over its bytes.
                let opts = pinlane::IntoOptions::default().stream(s.clone());
                let into = pinlane::transfer_tensor_h2d_into(
                    &vec![other_bytes.clone()],
                    &vec![kept.clone()],
                    &opts,
                );
                into.unwrap().wait().unwrap();
            }
        }
        // Work queued on `s` after the use ends only after the call's copies.
        after.record(&s).unwrap();
        after.synchronize().unwrap();
        assert!(
            done.query().unwrap(),
            "{way} was not ordered after the copies"
        );
        let out = moving.wait().unwrap();
        assert!(kept.to_dlpack().is_ok(), "{way}: once waited for");
        let last = if way == "h2d_into" {
            &other_bytes
        } else {
            &small
        };
        let back = transfer_tensor_d2h(&vec![kept, out.inner.0], &D2hOptions::default()).unwrap();
        assert_eq!(&back[0], last, "{way}");
        assert_eq!(back[1], large, "{way}");
    }
    assert!(refused > 0, "no export came while the copies ran");
}

#[test]
fn a_failed_h2d_s_outputs_stay_refused() {
    // Copies never proven done (the wait failed): what a clone kept from the call would
    // read may be partly written, so its uses stay refused; other calls are unaffected.
    common::sim();
    let src = vec![common::tensor(DType::F32, &[5_000], 13)];
    let mut kept = None;
    fault::inject(FaultKind::StreamSync, 1);
    let r = transfer_tensor_h2d_overlapping(&src, &H2dOptions::default(), |o| {
        kept = Some(o[0].clone());
    });
    fault::clear();
    assert!(r.is_err());
    let kept = kept.expect("while_copying ran");
    let s = pinlane::Stream::legacy(pinlane::Device::cuda(0)).unwrap();
    assert!(matches!(
        kept.device_ptr(&s),
        Err(Error::BytesInFlight { op: "device_ptr" })
    ));
    assert!(matches!(
        transfer_tensor_d2h(&vec![kept.clone()], &D2hOptions::default()),
        Err(Error::BytesInFlight { .. })
    ));
    let on = transfer_tensor_h2d(&src).unwrap();
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        src
    );
}

#[test]
fn while_copying_may_call_pinlane_again_on_the_same_thread() {
    // What a binding's hook may run by itself (a garbage collection's finalizers): whole
    // transfers on the calling thread, inside either overlapping call. They use the
    // thread's streams and state while the outer call's copies are in flight; both the
    // inner and the outer results are the sources' bytes.
    common::sim();
    let outer = batch();
    let inner = vec![
        common::tensor(DType::F32, &[40_000], 21),
        common::tensor(DType::U8, &[7], 22),
    ];
    let earlier = transfer_tensor_h2d(&inner).unwrap();
    for _ in 0..5 {
        let (on, (up, down)) =
            transfer_tensor_h2d_overlapping(&outer, &H2dOptions::default(), |_| {
                let up = transfer_tensor_h2d(&inner).unwrap();
                let down = transfer_tensor_d2h(&earlier, &D2hOptions::default()).unwrap();
                (up, down)
            })
            .unwrap();
        assert_eq!(down, inner);
        assert_eq!(
            transfer_tensor_d2h(&up, &D2hOptions::default()).unwrap(),
            inner
        );
        assert_eq!(
            transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
            outer
        );
        let dev_outer = transfer_tensor_h2d(&outer).unwrap();
        let (back, (up, down)) =
            pinlane::transfer_tensor_d2h_overlapping(&dev_outer, &D2hOptions::default(), |_| {
                let up = transfer_tensor_h2d(&inner).unwrap();
                let down = transfer_tensor_d2h(&earlier, &D2hOptions::default()).unwrap();
                (up, down)
            })
            .unwrap();
        assert_eq!(back, outer);
        assert_eq!(down, inner);
        assert_eq!(
            transfer_tensor_d2h(&up, &D2hOptions::default()).unwrap(),
            inner
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// Any structure: the batch comes back as `transfer_tensor_h2d` gives it, and
    /// `while_copying` saw that same batch (the same device views, not the inputs), in
    /// which every tensor the call moved refuses an export while a tensor that passed
    /// through (already on the device) or holds no bytes does not.
    #[test]
    fn the_batch_and_what_while_copying_saw_keep_the_structure(
        v in common::value(),
        pin_every in 0usize..4,
        dev_every in 0usize..5,
    ) {
        common::sim();
        let v = common::mix(&v, pin_every, dev_every);
        let ins: Vec<bool> = pinlane::batch::tensors(&v).iter().map(|t| t.is_cuda()).collect();
        let (on, (seen, gated)) = transfer_tensor_h2d_overlapping(&v, &H2dOptions::default(), |o| {
            let gated: Vec<(bool, bool)> = pinlane::batch::tensors(o)
                .iter()
                .zip(&ins)
                .map(|(t, &was_on)| {
                    let want = !was_on && t.nbytes() > 0;
                    (want, matches!(t.to_dlpack(), Err(Error::BytesInFlight { .. })))
                })
                .collect();
            (o.clone(), gated)
        })
        .unwrap();
        prop_assert_eq!(&seen, &on);
        prop_assert_eq!(gated.len(), ins.len());
        for (want, refused) in gated {
            prop_assert_eq!(want, refused);
        }
        prop_assert!(pinlane::batch::tensors(&on).iter().all(|t| t.is_cuda()));
        // Back on the host, every tensor and leaf in its place.
        let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
        let want = transfer_tensor_d2h(&v, &D2hOptions::default()).unwrap();
        prop_assert_eq!(back, want);
    }

    /// Any structure through a non-blocking call, behind a large page-locked tensor (whose
    /// direct copy the call queues first, so the rest is written milliseconds after it
    /// returns): clones of every output kept from its rebuild, moved back by a D2H on
    /// another stream as soon as the call returns, hold the sources' bytes in visit order.
    #[test]
    fn clones_kept_from_a_non_blocking_call_read_the_sources_on_another_stream(
        v in common::value(),
        pin_every in 0usize..4,
        dev_every in 0usize..5,
    ) {
        common::sim();
        let v = common::mix(&v, pin_every, dev_every);
        let lead = common::tensor(DType::U8, &[8 << 20], 51).to_pinned().unwrap();
        let b = KeepsAll::new((lead, v));
        let moving = pinlane::transfer_tensor_h2d_async(&b, &H2dOptions::default()).unwrap();
        let kept = b.take();
        let dev = pinlane::Device::cuda(0);
        let opts = D2hOptions::default().device(dev).stream(pinlane::Stream::new(dev).unwrap());
        let back = transfer_tensor_d2h(&kept, &opts).unwrap();
        let sources: Vec<Tensor> = pinlane::batch::tensors(&b.inner).into_iter().cloned().collect();
        let want = transfer_tensor_d2h(&sources, &D2hOptions::default()).unwrap();
        prop_assert_eq!(back, want);
        moving.wait().unwrap();
    }
}
