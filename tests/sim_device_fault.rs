//! A fault the device meets while it runs a transfer's copies (an address no allocation
//! covers: `CUDA_ERROR_ILLEGAL_ADDRESS`), on the simulated device, which now behaves as a
//! real one there (session 87): no copy, kernel, flag write or host function runs on the
//! stream after the fault, every synchronisation of it returns the error, and an event
//! recorded after it completes with the error, which `cuEventQuery` and
//! `cuEventSynchronize` return. Before, the simulated event reported success and host
//! functions still ran, so no path that learns completion from an event or a host
//! function saw a fault. Each test runs on a thread of its own: its stream stays faulted,
//! as a real context stays broken.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{transfer_tensor_d2h, transfer_tensor_d2h_async, D2hOptions, DType, Device, Error};
use std::time::{Duration, Instant};

/// A device tensor at an address no simulated allocation covers: its copy faults on the
/// device, when the copy runs (the call's checks cannot tell).
fn unbacked(elems: usize) -> pinlane::Tensor {
    // SAFETY: on the simulated device, which checks every device address a copy touches
    // before it touches it, and fails the copy instead; nothing owns the address.
    unsafe {
        pinlane::Tensor::from_device_ptr(0x7f00_0000_0000, Device::cuda(0), DType::F32, [elems], ())
    }
    .expect("a foreign device tensor")
}

fn is_illegal_address(e: &Error) -> bool {
    format!("{e:?}").contains("ILLEGAL_ADDRESS")
}

/// Runs `f` on a thread of its own (a fresh per-thread stream), with a bound.
fn on_own_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(20))
        .expect("the call did not return within 20 s")
}

#[test]
fn a_blocking_d2h_whose_copy_faults_fails_with_the_devices_error() {
    common::sim();
    let r = on_own_thread(|| {
        let t0 = Instant::now();
        let r = transfer_tensor_d2h(&vec![unbacked(1024)], &D2hOptions::default());
        (r.map(|_| ()), t0.elapsed())
    });
    match r {
        (Err(e), took) => {
            assert!(is_illegal_address(&e), "{e:?}");
            assert!(took < Duration::from_secs(10), "{took:?}");
        }
        (Ok(()), _) => panic!("a copy that faulted returned a batch"),
    }
}

#[test]
fn a_non_blocking_d2h_whose_copy_faults_wakes_its_handle_with_the_error() {
    common::sim();
    let r = on_own_thread(|| {
        let mut h = transfer_tensor_d2h_async(&vec![unbacked(1024)], &D2hOptions::default())?;
        match h.wait_timeout(Duration::from_secs(10)) {
            Some(r) => r.map(|_| ()),
            None => Err(Error::Worker {
                reason: "not done within 10 s".into(),
            }),
        }
    });
    match r {
        Err(e) => assert!(is_illegal_address(&e), "{e:?}"),
        Ok(()) => panic!("a copy that faulted returned a batch"),
    }
}
