//! A child forked after pinlane set up the (simulated) device: every call that would use
//! the parent's CUDA state fails with `Error::ForkedChild` before it takes a lock or
//! calls the driver; the parent goes on as before. `tests/gpu_semantics.rs` checks the
//! same on the real driver.
// The simulated device: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_d2h_async, transfer_tensor_h2d, DType, Device, Error,
    H2dOptions, Prefetcher, Tensor,
};

#[test]
fn a_forked_child_is_refused_and_the_parent_goes_on() {
    common::sim();
    let host: Vec<Tensor> = vec![
        common::tensor(DType::F32, &[256], 1),
        common::tensor(DType::U8, &[100_000], 2),
    ];
    let on_device = transfer_tensor_h2d(&host).unwrap();
    let targets: Vec<Tensor> = host
        .iter()
        .map(|t| t.to_pinned_on(Device::cuda(0)).unwrap())
        .collect();
    let stream = pinlane::Stream::new(Device::cuda(0)).unwrap();
    let status = common::in_forked_child(|| {
        common::refusals_in_forked_child(&host, &on_device, &targets, Device::cuda(0), &stream)
    });
    assert_eq!(status, 0, "the child's wrong answers, as a bit mask");

    // The parent is unaffected: a round trip, and the error's text says what to do.
    let back =
        transfer_tensor_d2h(&transfer_tensor_h2d(&host).unwrap(), &Default::default()).unwrap();
    assert_eq!(common::fingerprint(&back), common::fingerprint(&host));
    let text = Error::ForkedChild { op: "x" }.to_string();
    assert!(text.contains("forked") && text.contains("spawn"), "{text}");
}

#[test]
fn a_forked_child_waiting_on_its_parents_work_is_told_at_once() {
    common::sim();
    let host: Vec<Tensor> = vec![common::tensor(DType::F32, &[1024], 3)];
    let on_device = transfer_tensor_h2d(&host).unwrap();
    let pending = transfer_tensor_d2h_async(&on_device, &Default::default()).unwrap();
    let batches = vec![host.clone(); 3];
    let prefetcher = Prefetcher::new(batches, 1, H2dOptions::default()).unwrap();
    assert!(
        !pinlane::memory_stats().devices.is_empty(),
        "the parent's device pool is listed (else the child's check below proves nothing)"
    );
    // The child gets the parent's handle and prefetcher (the parent keeps its own: a
    // fork copies the process).
    let status =
        common::in_forked_child(move || common::waits_in_forked_child(pending, prefetcher));
    assert_eq!(status, 0, "the child's wrong answers, as a bit mask");
}

/// Drops of the batches a child's handles hold, counted (the child's own copy of it).
static DROPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A batch whose drop is counted.
struct Counted(Vec<Tensor>);

impl pinlane::Batch for Counted {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        self.0.visit(f);
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        Counted(self.0.rebuild(f))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        DROPS.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// A parent's handle in a child, told `Error::ForkedChild` by `wait_timeout` or `.await`,
/// is then forgotten when dropped, as `wait` forgets it: its batch and completion state
/// are the parent's, and their drops could wait for a lock a parent's thread held at the
/// fork (session 64, a review's finding). Shown to fail without `Transfer`'s drop: the
/// child counted both batches dropped.
#[test]
fn a_parents_handle_dropped_in_a_forked_child_is_forgotten() {
    use std::future::Future;
    common::sim();
    let host = vec![common::tensor(DType::F32, &[1024], 5)];
    let on_device = Counted(transfer_tensor_h2d(&host).unwrap());
    let mut timed = transfer_tensor_d2h_async(&on_device, &Default::default()).unwrap();
    let mut awaited = transfer_tensor_d2h_async(&on_device, &Default::default()).unwrap();
    assert_eq!(on_device.0.len(), 1);
    let status = common::in_forked_child(move || {
        let before = DROPS.load(std::sync::atomic::Ordering::SeqCst);
        let forked =
            |r: Option<pinlane::Result<Counted>>| matches!(r, Some(Err(Error::ForkedChild { .. })));
        let told = forked(timed.wait_timeout(std::time::Duration::from_secs(30)));
        drop(timed);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let polled = match std::pin::Pin::new(&mut awaited).poll(&mut cx) {
            std::task::Poll::Ready(r) => forked(Some(r)),
            std::task::Poll::Pending => false,
        };
        drop(awaited);
        let dropped = DROPS.load(std::sync::atomic::Ordering::SeqCst) - before;
        i32::from(!told) | i32::from(!polled) << 1 | i32::from(dropped != 0) << 2
    });
    assert_eq!(status, 0, "the child's wrong answers, as a bit mask");
}
