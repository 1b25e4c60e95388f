//! Stream ordering on the simulated device: a producer still running when d2h is called.
//! With the producer's event the copy waits and sees the final values; without any wait
//! the simulator's delays make the copy see the old ones, which shows these tests can
//! catch a missing wait.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    set_current_stream, transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, Event, Stream,
};
use std::time::Duration;

fn setup(seed: u64) -> (pinlane::Tensor, pinlane::Tensor, pinlane::Tensor, Stream) {
    let initial = common::tensor(DType::F32, &[4096], seed);
    let fin = common::tensor(DType::F32, &[4096], seed + 1)
        .to_pinned()
        .unwrap();
    let on = transfer_tensor_h2d(&initial).unwrap();
    let producer = Stream::new(pinlane::Device::cuda(0)).unwrap();
    producer.delay_async(Duration::from_millis(50)).unwrap();
    // SAFETY: `fin` and `on` live until the producer is synchronised at the end of each test.
    unsafe { on.overwrite_async(&fin, &producer) }.unwrap();
    (initial, fin, on, producer)
}

#[test]
fn producer_event_orders_the_copy() {
    common::sim();
    let (_initial, fin, on, producer) = setup(10);
    let done = Event::new(pinlane::Device::cuda(0)).unwrap();
    done.record(&producer).unwrap();
    let back = transfer_tensor_d2h(&on, &D2hOptions::default().producer_event(done)).unwrap();
    assert_eq!(back, fin);
    producer.synchronize().unwrap();
}

#[test]
fn current_stream_orders_the_copy() {
    common::sim();
    let (_initial, fin, on, producer) = setup(20);
    let back = {
        let _cur = set_current_stream(&producer);
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap()
    };
    assert_eq!(back, fin);
    producer.synchronize().unwrap();
}

#[test]
fn without_a_wait_the_copy_sees_old_values() {
    common::sim();
    let (initial, fin, on, producer) = setup(30);
    // The current stream is the legacy stream, which the producer is not: nothing orders
    // the copy after the overwrite.
    let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
    assert_eq!(back, initial, "the simulator exposes the missing wait");
    assert_ne!(back, fin);
    producer.synchronize().unwrap();
}

/// H2D of many small pageable tensors: the staging window's copy is queued as soon as its
/// fill ends, while the outputs are made and the batch rebuilt (a look every few tensors),
/// not after; the bytes arrive all the same.
#[test]
fn a_filled_window_is_queued_while_the_batch_is_rebuilt() {
    common::sim();
    // 48 x 1 KiB: one window of the 64 KiB slots `common::sim` sets, filled on the
    // calling thread (under `parallel_min`), so its fill has ended by the rebuild's first
    // look.
    let b: Vec<pinlane::Tensor> = (0..48)
        .map(|i| common::tensor(DType::F32, &[256], 300 + i))
        .collect();
    pinlane::observe::trace_next_call();
    let on = transfer_tensor_h2d(&b).unwrap();
    let labels: Vec<&str> = pinlane::observe::last_trace()
        .unwrap()
        .iter()
        .map(|m| m.0)
        .collect();
    let at = |l: &str| labels.iter().position(|x| *x == l);
    let (queued, rebuilt) = (at("window queued"), at("rebuilt"));
    assert!(
        queued.is_some() && rebuilt.is_some() && queued < rebuilt,
        "{labels:?}"
    );
    assert_eq!(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(), b);
}

/// A stream a CUDA graph capture is running on is refused by every call that would queue
/// work on it or record an event on it, before anything is queued there and before any
/// destination is written; once the capture has ended, the same calls run. (Without the
/// check, each call queues on the stream: `captured_ops` counts it.)
#[test]
fn a_capturing_stream_is_refused_before_anything_is_queued() {
    use pinlane::driver::sim::{captured_ops, set_capturing};
    use pinlane::{
        transfer_tensor_d2h_into, transfer_tensor_h2d_into, transfer_tensor_h2d_with, Error,
        H2dOptions, H2dPairs, IntoOptions,
    };
    common::sim();
    let dev = common::dev();
    let s = Stream::new(dev).unwrap();
    let host = common::tensor(DType::F32, &[4096], 30);
    let pinned = host.to_pinned().unwrap();
    let before = common::tensor(DType::F32, &[4096], 31);
    let dst = transfer_tensor_h2d(&before).unwrap();
    let out = common::tensor(DType::F32, &[4096], 32).to_pinned().unwrap();
    let on_s = IntoOptions::default().stream(s.clone());
    assert!(set_capturing(&s, true));
    let refused = |what: &str, r: pinlane::Result<()>| match r {
        Err(Error::StreamCapturing { device, .. }) => assert_eq!(device, dev, "{what}"),
        other => panic!("{what}: {other:?}"),
    };
    for (what, src) in [("pageable", &host), ("page-locked", &pinned)] {
        let r = transfer_tensor_h2d_into(src, &dst, &on_s).map(drop);
        refused(what, r);
    }
    let pairs = H2dPairs::new(&pinned, &dst).unwrap();
    refused("pairs", pairs.copy(&on_s).map(drop));
    let consumer = H2dOptions::default().consumer_stream(s.clone());
    refused("h2d", transfer_tensor_h2d_with(&host, &consumer).map(drop));
    let on_stream = D2hOptions::default().device(dev).stream(s.clone());
    refused("d2h on it", transfer_tensor_d2h(&dst, &on_stream).map(drop));
    {
        let _current = set_current_stream(&s);
        refused(
            "d2h after it",
            transfer_tensor_d2h(&dst, &D2hOptions::default()).map(drop),
        );
        // SAFETY: nothing else reads or writes `out` during the call.
        let r = unsafe { transfer_tensor_d2h_into(&dst, &out, &IntoOptions::default()) };
        refused("d2h into, after it", r.map(drop));
        refused(
            "h2d into, on it",
            transfer_tensor_h2d_into(&pinned, &dst, &IntoOptions::default()).map(drop),
        );
    }
    assert_eq!(
        captured_ops(&s),
        Some(0),
        "something was queued on the capturing stream"
    );
    // Nothing was written: the destination still holds its bytes.
    assert_eq!(
        transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap(),
        before
    );
    // The capture over, the same calls run, in the stream's order.
    assert!(set_capturing(&s, false));
    transfer_tensor_h2d_into(&pinned, &dst, &on_s)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(transfer_tensor_d2h(&dst, &on_stream).unwrap(), host);
    let _current = set_current_stream(&s);
    assert_eq!(
        transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap(),
        host
    );
    // The legacy stream is never captured, so it is never asked.
    assert!(!set_capturing(&Stream::legacy(dev).unwrap(), true));
}
