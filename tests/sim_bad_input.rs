//! Bad input on the simulated device (2 devices), a test each: a clear typed error, no
//! panic, nothing moved.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, Error, Event, Stream, Tensor,
};

/// LOCAL_RANK is process-wide: these tests take turns.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn on_device() -> Vec<Tensor> {
    transfer_tensor_h2d(&vec![common::tensor(DType::F32, &[10], 1)]).unwrap()
}

/// Runs `f` on a new thread with `LOCAL_RANK` set to `value` (`None`: unset): a thread
/// reads `LOCAL_RANK` once, at its first call that needs the default device.
fn with_local_rank<T: Send>(value: Option<&str>, f: impl FnOnce() -> T + Send) -> T {
    match value {
        Some(v) => std::env::set_var("LOCAL_RANK", v),
        None => std::env::remove_var("LOCAL_RANK"),
    }
    let r = std::thread::scope(|s| s.spawn(f).join().unwrap());
    std::env::remove_var("LOCAL_RANK");
    r
}

#[test]
fn local_rank_values() {
    common::sim();
    let _turn = serial();
    let b = vec![Tensor::scalar(1u8)];
    let on = with_local_rank(None, on_device);
    for bad in ["abc", "-1", "99", "2", ""] {
        let expected = Error::InvalidLocalRank {
            value: bad.into(),
            device_count: 2,
        };
        let (h2d, d2h) = with_local_rank(Some(bad), || {
            (
                transfer_tensor_h2d(&b).unwrap_err(),
                transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap_err(),
            )
        });
        assert_eq!(h2d, expected, "h2d LOCAL_RANK={bad:?}");
        assert_eq!(d2h, expected, "d2h LOCAL_RANK={bad:?}");
    }
    let on1 = with_local_rank(Some("1"), || transfer_tensor_h2d(&b).unwrap());
    assert_eq!(
        on1[0].location(),
        pinlane::Location::Cuda(pinlane::Device::cuda(1))
    );
    // cuda:1's tensors are on another device for a cuda:0 transfer: they pass through.
    let r = transfer_tensor_d2h(&on1, &D2hOptions::default().device("cuda:0")).unwrap();
    assert!(r[0].same_storage(&on1[0]));
    assert_eq!(
        transfer_tensor_d2h(&on1, &D2hOptions::default().device("cuda:1")).unwrap(),
        b
    );
}

#[test]
fn local_rank_is_read_once_per_thread() {
    common::sim();
    let _turn = serial();
    let b = vec![Tensor::scalar(7u8)];
    let (first, later) = with_local_rank(Some("1"), || {
        let first = transfer_tensor_h2d(&b).unwrap();
        // Changed after this thread's first call: this thread keeps the value it read.
        std::env::set_var("LOCAL_RANK", "0");
        let later = transfer_tensor_h2d(&b).unwrap();
        (first, later)
    });
    let d1 = Some(pinlane::Device::cuda(1));
    assert_eq!((first[0].device(), later[0].device()), (d1, d1));
    // A new thread reads it afresh.
    let fresh = with_local_rank(Some("0"), || transfer_tensor_h2d(&b).unwrap());
    assert_eq!(fresh[0].device(), Some(pinlane::Device::cuda(0)));
}

#[test]
fn device_strings() {
    common::sim();
    let _turn = serial();
    let on = on_device();
    for bad in ["cpu", "cuda:x", "gpu", "", "cuda:", "cuda:-1"] {
        assert_eq!(
            transfer_tensor_d2h(&on, &D2hOptions::default().device(bad)).unwrap_err(),
            Error::InvalidDevice { value: bad.into() },
            "{bad:?}"
        );
    }
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default().device("cuda:99")).unwrap_err(),
        Error::DeviceUnavailable {
            device: pinlane::Device::cuda(99),
            device_count: 2
        }
    );
}

#[test]
fn streams_and_events_on_the_wrong_device() {
    common::sim();
    let _turn = serial();
    let on = on_device();
    let s1 = Stream::new(pinlane::Device::cuda(1)).unwrap();
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default().stream(s1.clone())).unwrap_err(),
        Error::StreamWithoutDevice
    );
    assert_eq!(
        transfer_tensor_d2h(
            &on,
            &D2hOptions::default().device("cuda:0").stream(s1.clone())
        )
        .unwrap_err(),
        Error::StreamDeviceMismatch {
            stream_device: pinlane::Device::cuda(1),
            device: pinlane::Device::cuda(0)
        }
    );
    let e1 = Event::new(pinlane::Device::cuda(1)).unwrap();
    assert_eq!(
        transfer_tensor_d2h(
            &on,
            &D2hOptions::default().device("cuda:0").producer_event(e1)
        )
        .unwrap_err(),
        Error::EventDeviceMismatch {
            event_device: pinlane::Device::cuda(1),
            device: pinlane::Device::cuda(0)
        }
    );
    let opts = pinlane::H2dOptions::default().consumer_stream(s1);
    assert_eq!(
        pinlane::transfer_tensor_h2d_with(&vec![Tensor::scalar(1u8)], &opts).unwrap_err(),
        Error::StreamDeviceMismatch {
            stream_device: pinlane::Device::cuda(1),
            device: pinlane::Device::cuda(0)
        }
    );
    assert!(Stream::new(pinlane::Device::cuda(5)).is_err(), "no cuda:5");
}

#[test]
fn constructors_and_typed_access() {
    common::sim();
    assert_eq!(
        Tensor::from_vec(vec![1.0f32; 5], [2, 3]).unwrap_err(),
        Error::ShapeMismatch {
            shape: vec![2, 3],
            expected: 6,
            got: 5
        }
    );
    let t = Tensor::from_vec(vec![1i32, 2], [2]).unwrap();
    assert_eq!(
        t.to_vec::<f32>().unwrap_err(),
        Error::DTypeMismatch {
            op: "to_vec",
            expected: DType::F32,
            got: DType::I32
        }
    );
    let _turn = serial();
    let on = on_device();
    assert!(matches!(
        on[0].to_vec::<f32>(),
        Err(Error::NotOnHost { .. })
    ));
}

/// A hand-written `Batch` that breaks the contract: `rebuild` hands over its tensors in
/// the other order (an image and its labels swapped), or `visit` skips one.
struct Mismatched {
    image: Tensor,
    labels: Tensor,
    visit_skips_labels: bool,
}

impl pinlane::Batch for Mismatched {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        f(&self.image);
        if !self.visit_skips_labels {
            f(&self.labels);
        }
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        let labels = f(&self.labels);
        let image = f(&self.image);
        Mismatched {
            image,
            labels,
            visit_skips_labels: self.visit_skips_labels,
        }
    }
}

#[test]
fn a_batch_whose_rebuild_disagrees_with_its_visit_is_a_typed_error() {
    // Regression (issue 19): a visit that skips a tensor gave back Ok with a host tensor
    // where a device tensor belongs; a rebuild in another order swapped the two.
    common::sim();
    let _turn = serial();
    let image = common::tensor(DType::U8, &[3, 8, 8], 5);
    let labels = common::tensor(DType::I64, &[4], 6);
    let on = transfer_tensor_h2d(&(image.clone(), labels.clone())).unwrap();
    for visit_skips_labels in [false, true] {
        let host = Mismatched {
            image: image.clone(),
            labels: labels.clone(),
            visit_skips_labels,
        };
        let dev = Mismatched {
            image: on.0.clone(),
            labels: on.1.clone(),
            visit_skips_labels,
        };
        let visited = if visit_skips_labels { 1 } else { 2 };
        let want = Error::BatchMismatch {
            visited,
            rebuilt: 2,
            first_mismatch: Some(0),
        };
        assert_eq!(transfer_tensor_h2d(&host).err(), Some(want.clone()));
        assert_eq!(
            transfer_tensor_d2h(&dev, &D2hOptions::default()).err(),
            Some(want)
        );
    }
    // Nothing was left behind: the next transfers are exact.
    let back = transfer_tensor_d2h(
        &transfer_tensor_h2d(&(image.clone(), labels.clone())).unwrap(),
        &D2hOptions::default(),
    );
    assert_eq!(back.unwrap(), (image, labels));
    assert_eq!(pinlane::memory_stats().retained_bytes, 0);
}

/// A batch whose rebuild reads what it is handed, as safe user code may: each new tensor's
/// bytes, its DLPack export, and an H2D of it, all while the D2H copies that write it may
/// still run. `kept` is a tensor the rebuild keeps as it is (not moved by the call).
struct Peeks {
    moved: Tensor,
    kept: Tensor,
    /// A device tensor of `moved`'s dtype and size, not visited (not moved): the other
    /// side of the copies into existing tensors the rebuild tries.
    dev: Tensor,
    /// Filled by `rebuild`: what each read of the moved tensor gave, then whether `kept`
    /// read.
    seen: Vec<Result<(), Error>>,
}

impl pinlane::Batch for Peeks {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        f(&self.moved);
        f(&self.kept);
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        let moved = f(&self.moved);
        let kept = f(&self.kept);
        let (one, dev) = (vec![moved.clone()], vec![self.dev.clone()]);
        let opts = pinlane::IntoOptions::default();
        let seen = vec![
            moved.as_bytes().map(drop),
            moved.to_vec::<f32>().map(drop),
            moved.to_dlpack().map(drop),
            transfer_tensor_h2d(&one).map(drop),
            pinlane::transfer_tensor_h2d_into(&one, &dev, &opts).map(drop),
            // SAFETY: nothing else reads or writes `moved` during the call (it is refused
            // before anything is queued, which is what is tested).
            unsafe { pinlane::transfer_tensor_d2h_into(&dev, &one, &opts) },
            // Bound pairs are checked at each copy for what may change between steps.
            pinlane::H2dPairs::new(&one, &dev).and_then(|p| p.copy(&opts).map(drop)),
            kept.as_bytes().map(drop),
        ];
        Peeks {
            moved,
            kept,
            dev: self.dev.clone(),
            seen,
        }
    }
}

#[test]
fn a_rebuild_cannot_read_outputs_the_copies_still_write() {
    // Regression (session 36): a D2H call rebuilds the batch around its page-locked
    // output views while the copies into them run; a safe rebuild that read them raced
    // the device's writes. Each read is now refused with BytesInFlight, nothing is
    // queued for it, and the same tensors read correctly once the call has returned.
    common::sim();
    let _turn = serial();
    let src = common::tensor(DType::F32, &[300], 7);
    // Small batches share page-locked blocks: `kept` is the output of an earlier call,
    // in the same block as this call's range (checked below), and must stay readable.
    let kept = transfer_tensor_d2h(&on_device(), &D2hOptions::default())
        .unwrap()
        .remove(0);
    assert_eq!(kept.location(), pinlane::Location::Pinned);
    let moved = transfer_tensor_h2d(&vec![src.clone()]).unwrap().remove(0);
    let dev = transfer_tensor_h2d(&vec![common::tensor(DType::F32, &[300], 9)])
        .unwrap()
        .remove(0);
    // Until this call's range is carved from the same shared block as `kept` (the shared
    // block moves on when full; these tests take turns).
    let out = (0..4)
        .find_map(|_| {
            let batch = Peeks {
                moved: moved.clone(),
                kept: kept.clone(),
                dev: dev.clone(),
                seen: Vec::new(),
            };
            let out = transfer_tensor_d2h(&batch, &D2hOptions::default()).unwrap();
            out.moved.same_allocation(&kept).then_some(out)
        })
        .expect("two small D2H batches in a row share a page-locked block");
    assert_eq!(out.moved.location(), pinlane::Location::Pinned);
    let refused = |r: &Result<(), Error>, op: &str| {
        assert!(
            matches!(r, Err(Error::BytesInFlight { op: o }) if *o == op),
            "{op} during the rebuild: {r:?}"
        );
    };
    refused(&out.seen[0], "as_bytes");
    refused(&out.seen[1], "to_vec");
    refused(&out.seen[2], "to_dlpack");
    refused(&out.seen[3], "transfer_tensor_h2d");
    refused(&out.seen[4], "transfer_tensor_h2d_into");
    refused(&out.seen[5], "transfer_tensor_d2h_into");
    refused(&out.seen[6], "transfer_tensor_h2d_into");
    assert!(
        out.seen[7].is_ok(),
        "an earlier call's output: {:?}",
        out.seen[7]
    );
    // The call has returned: the copies are proven done, and the bytes are the source's.
    assert_eq!(out.moved.as_bytes().unwrap(), src.as_bytes().unwrap());
    assert_eq!(out.kept.as_bytes().unwrap(), kept.as_bytes().unwrap());
    let back = transfer_tensor_h2d(&vec![out.moved.clone()]).unwrap();
    let again = transfer_tensor_d2h(&back, &D2hOptions::default()).unwrap();
    assert_eq!(again[0].as_bytes().unwrap(), src.as_bytes().unwrap());
}

#[test]
fn a_non_blocking_d2h_s_outputs_read_once_waited() {
    // The non-blocking call rebuilds its batch in the call too; the handle gives it back
    // only once the copies are done, and then every read works (the rebuild's too, had
    // it been made after the wait).
    common::sim();
    let _turn = serial();
    let src = common::tensor(DType::F32, &[300], 8);
    let moved = transfer_tensor_h2d(&vec![src.clone()]).unwrap().remove(0);
    let batch = Peeks {
        moved,
        kept: Tensor::scalar(1u8),
        dev: on_device().remove(0),
        seen: Vec::new(),
    };
    let handle = pinlane::transfer_tensor_d2h_async(&batch, &D2hOptions::default()).unwrap();
    let out = handle.wait().unwrap();
    assert!(
        matches!(out.seen[0], Err(Error::BytesInFlight { .. })),
        "during the rebuild: {:?}",
        out.seen[0]
    );
    assert_eq!(out.moved.as_bytes().unwrap(), src.as_bytes().unwrap());
    assert!(out.moved.to_dlpack().is_ok());
}

/// A one-tensor batch whose rebuild keeps a clone of what it is handed in `keep`.
struct Keeps {
    t: Tensor,
    keep: std::sync::Arc<std::sync::Mutex<Option<Tensor>>>,
}

impl pinlane::Batch for Keeps {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        f(&self.t);
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        let t = f(&self.t);
        *self.keep.lock().unwrap() = Some(t.clone());
        Keeps {
            t,
            keep: self.keep.clone(),
        }
    }
}

#[test]
fn a_clone_kept_from_a_non_blocking_d2h_reads_only_once_its_copies_are_done() {
    // The mark outlives the call: a non-blocking D2H returns with its copies queued, and
    // a clone its rebuild kept is refused until the copies are proven done (the handle's
    // wait, here), not merely until the call returns.
    common::sim();
    let _turn = serial();
    let src = common::tensor(DType::F32, &[300], 10);
    let on = transfer_tensor_h2d(&vec![src.clone()]).unwrap().remove(0);
    let keep = std::sync::Arc::new(std::sync::Mutex::new(None));
    let batch = Keeps {
        t: on,
        keep: keep.clone(),
    };
    // The copies wait for the current stream, held for 300 ms.
    let busy = Stream::new(pinlane::Device::cuda(0)).unwrap();
    busy.delay_async(std::time::Duration::from_millis(300))
        .unwrap();
    let handle = {
        let _g = pinlane::set_current_stream(&busy);
        pinlane::transfer_tensor_d2h_async(&batch, &D2hOptions::default()).unwrap()
    };
    let kept = keep
        .lock()
        .unwrap()
        .take()
        .expect("the rebuild ran in the call");
    assert!(!handle.is_ready(), "the copies are behind the 300 ms pause");
    let r = kept.as_bytes().map(drop);
    assert!(
        matches!(r, Err(Error::BytesInFlight { op: "as_bytes" })),
        "{r:?}"
    );
    let out = handle.wait().unwrap();
    assert_eq!(kept.as_bytes().unwrap(), src.as_bytes().unwrap());
    assert_eq!(out.t.as_bytes().unwrap(), src.as_bytes().unwrap());
}

/// `measure_pinned_limits` with nothing to time is an error, not a panic (before, a
/// median of no copies indexed an empty list).
#[test]
fn measuring_no_copies_is_an_error() {
    common::sim();
    let dev = pinlane::Device::cuda(0);
    for (nbytes, reps) in [(1 << 20, 0), (0, 3)] {
        assert!(matches!(
            pinlane::memory::measure_pinned_limits(dev, nbytes, reps),
            Err(Error::InvalidOption { .. })
        ));
    }
    let ok = pinlane::memory::measure_pinned_limits(dev, 1 << 16, 1).unwrap();
    assert!(ok.h2d > 0.0 && ok.d2h > 0.0 && ok.both > 0.0);
}
