//! `settle` (what the Python package runs as the interpreter exits): the pending
//! non-blocking calls complete and hand back what they hold, nothing is freed and the
//! runtime stays; a call still pending at the deadline is a typed error, with nothing
//! released under it.
//!
//! One test: settling acts on the whole process.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    memory_stats, transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_async,
    transfer_tensor_h2d_into, D2hOptions, DType, Device, Error, H2dOptions, IntoOptions, Stream,
};
use std::time::Duration;

#[test]
fn settle_hands_back_what_pending_calls_hold_and_frees_nothing() {
    common::sim();
    let host = vec![
        common::tensor(DType::U8, &[4096], 1),
        common::tensor(DType::F32, &[3, 100], 2),
        common::tensor(DType::I64, &[17], 3),
    ];
    let dst = transfer_tensor_h2d(&host).unwrap();
    let before: Vec<pinlane::Tensor> = host
        .iter()
        .map(|t| common::tensor(t.dtype(), t.dims(), 0))
        .collect();
    transfer_tensor_h2d_into(&before, &dst, &IntoOptions::default())
        .unwrap()
        .wait()
        .unwrap();

    // A copy into existing tensors, its handle dropped, behind a 400 ms pause: its slot
    // and its clones stay with the completion thread.
    let busy = Stream::new(Device::cuda(0)).unwrap();
    busy.delay_async(Duration::from_millis(400)).unwrap();
    {
        let _g = pinlane::set_current_stream(&busy);
        drop(transfer_tensor_h2d_into(&host, &dst, &IntoOptions::default()).unwrap());
    }
    let rt = pinlane::runtime();
    let held = memory_stats().staging.held_bytes;
    assert!(
        memory_stats().staging.in_use_bytes > 0,
        "the pending copy holds its staging slot"
    );

    // Too short: a typed error, and the slot stays with the copy still queued.
    let r = pinlane::settle(Duration::from_millis(30));
    assert!(matches!(r, Err(Error::ShutdownIncomplete { .. })), "{r:?}");
    assert!(
        memory_stats().staging.in_use_bytes > 0,
        "released under a pending copy"
    );

    // Long enough: everything handed back, nothing freed, the same runtime.
    pinlane::settle(Duration::from_secs(10)).unwrap();
    let s = memory_stats().staging;
    assert_eq!(s.in_use_bytes, 0, "{s:?}");
    assert_eq!(s.held_bytes, held, "settle freed staging slots");
    assert!(std::sync::Arc::ptr_eq(&rt, &pinlane::runtime()));
    assert!(!rt.is_shut_down());
    assert_eq!(
        transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap(),
        host,
        "the settled copy's bytes"
    );

    // Calls go on afterwards (the completion thread starts again).
    let again = transfer_tensor_h2d_async(&host, &H2dOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        transfer_tensor_d2h(&again, &D2hOptions::default()).unwrap(),
        host
    );
    pinlane::settle(Duration::from_secs(10)).unwrap();
}
