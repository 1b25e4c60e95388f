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
