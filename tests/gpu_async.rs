//! GPU: the non-blocking calls and the prefetcher on the device. Round trips through the
//! async calls; hundreds of handles in flight; handles dropped and forgotten while their
//! copies wait behind a busy stream; faults at every kind and position; the prefetcher's
//! order; and overlap proven with timing events: a D2H of batch k+1 on its own stream
//! runs while a kernel works on batch k on another.
// Some tests need the test hooks; without them, their imports go unused.
#![cfg_attr(not(feature = "test-util"), allow(unused_imports))]

mod common;

use cudarc::driver::{result, sys, CudaContext, DevicePtr};
#[cfg(feature = "test-util")]
use pinlane::driver::fault::{self, FaultKind};
use pinlane::memory::retained::retained_bytes;
use pinlane::{
    set_current_stream, transfer_tensor_d2h, transfer_tensor_d2h_async, transfer_tensor_h2d,
    transfer_tensor_h2d_async, D2hOptions, DType, Device, Error, H2dOptions, Prefetcher, Stream,
    Tensor,
};
use std::time::Duration;

/// The tests of this binary run one at a time: the overlap test measures when its copy
/// starts, and another test's page-locked frees (`cuMemFreeHost`, which waits for every
/// stream of the context) would hold its driver calls until the kernel ends (seen once
/// on the H200: the copy started 0.2 ms after the 61 ms kernel).
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

fn device() -> Device {
    Device::from_local_rank().unwrap()
}

fn batch(seed: u64) -> Vec<Tensor> {
    vec![
        common::tensor(DType::F32, &[3 << 20], seed), // 12 MiB: several staging windows
        common::tensor(DType::U8, &[3, 224, 224], seed + 1),
        common::tensor(DType::I64, &[129], seed + 2)
            .to_pinned_on(device())
            .unwrap(),
    ]
}

#[test]
fn async_round_trips_with_hundreds_of_handles_in_flight() {
    require_gpu!();
    let _turn = serial();
    let inputs: Vec<_> = (0..24).map(batch).collect();
    let moving: Vec<_> = (0..300)
        .map(|i| {
            transfer_tensor_h2d_async(&inputs[i % 24], &H2dOptions::default().device(device()))
                .unwrap()
        })
        .collect();
    let on: Vec<_> = moving.into_iter().map(|t| t.wait().unwrap()).collect();
    let opts = D2hOptions::default().device(device());
    let back: Vec<_> = on
        .iter()
        .map(|b| transfer_tensor_d2h_async(b, &opts).unwrap())
        .collect();
    for (i, b) in back.into_iter().enumerate().rev() {
        assert_eq!(b.wait().unwrap(), inputs[i % 24], "batch {i}");
    }
}

#[test]
#[cfg(feature = "test-util")] // stream delays or fault injection
fn handles_dropped_or_forgotten_while_copies_wait_free_nothing_early() {
    require_gpu!();
    let _turn = serial();
    let b = batch(50);
    let on = transfer_tensor_h2d(&b).unwrap();
    let slow = Stream::new(device()).unwrap();
    for forget in [false, true] {
        {
            let _current = set_current_stream(&slow);
            slow.delay_async(Duration::from_millis(100)).unwrap();
            let opts = D2hOptions::default().device(device());
            let t = transfer_tensor_d2h_async(&on, &opts).unwrap();
            assert!(!t.is_ready(), "the copy waits behind the busy stream");
            if forget {
                std::mem::forget(t);
            } else {
                drop(t);
            }
        }
        for i in 0..10 {
            let x = batch(60 + i);
            let back =
                transfer_tensor_d2h(&transfer_tensor_h2d(&x).unwrap(), &D2hOptions::default());
            assert_eq!(back.unwrap(), x);
        }
        slow.synchronize().unwrap();
    }
    assert_eq!(retained_bytes(), 0);
}

#[test]
#[cfg(feature = "test-util")] // stream delays or fault injection
fn faults_at_every_kind_and_position_under_the_async_calls() {
    require_gpu!();
    let _turn = serial();
    std::thread::spawn(|| {
        let b = batch(70);
        let before = common::fingerprint(&b);
        let round = |b: &Vec<Tensor>| -> pinlane::Result<Vec<Tensor>> {
            // Driver failures, while queueing or while copying, come from wait().
            let up = transfer_tensor_h2d_async(b, &H2dOptions::default());
            let on = up.expect("only bad input fails the call").wait()?;
            let down = transfer_tensor_d2h_async(&on, &D2hOptions::default());
            down.expect("only bad input fails the call").wait()
        };
        let mut total = 0;
        for kind in [FaultKind::Alloc, FaultKind::Copy, FaultKind::EventRecord] {
            let mut fired = 0;
            for nth in 1..1000 {
                fault::inject(kind, nth);
                let r = round(&b);
                if fault::armed() {
                    fault::clear();
                    assert_eq!(r.unwrap(), b);
                    break;
                }
                fired += 1;
                let e = r.unwrap_err();
                assert!(
                    matches!(&e, Error::Driver { error, .. } if error.name() == "INJECTED_FAULT"),
                    "{kind:?} #{nth}: {e}"
                );
                assert_eq!(common::fingerprint(&b), before);
                assert_eq!(retained_bytes(), 0, "{kind:?} #{nth}: drained");
                assert_eq!(round(&b).unwrap(), b, "{kind:?} #{nth}: the next call");
            }
            assert!(fired > 0, "{kind:?} never fired");
            total += fired;
        }
        eprintln!("async fault sweep on the GPU: {total} faults");
    })
    .join()
    .unwrap();
}

#[test]
fn the_prefetcher_yields_every_batch_in_order() {
    require_gpu!();
    let _turn = serial();
    let inputs: Vec<_> = (0..6).map(|i| batch(100 + i)).collect();
    let src = (0..30).map({
        let inputs = inputs.clone();
        move |i| inputs[i % 6].clone()
    });
    let p = Prefetcher::new(src, 3, H2dOptions::default().device(device())).unwrap();
    for (i, on) in p.enumerate() {
        let back = transfer_tensor_d2h(&on.unwrap(), &D2hOptions::default()).unwrap();
        assert_eq!(back, inputs[i % 6], "batch {i}");
    }
}

/// A stand-in for the consumer's kernel: `passes` memsets of `scratch` bytes.
fn kernel(ptr: sys::CUdeviceptr, bytes: usize, passes: usize, stream: sys::CUstream) {
    for p in 0..passes {
        // SAFETY: `ptr` is `bytes` of device memory that the caller keeps allocated.
        unsafe { result::memset_d8_async(ptr, p as u8, bytes, stream) }.unwrap();
    }
}

#[test]
fn a_copy_runs_while_a_kernel_works_on_the_previous_batch() {
    require_gpu!();
    let _turn = serial();
    let dev = device();
    let ctx = CudaContext::new(dev.ordinal()).unwrap();
    let compute = ctx.new_stream().unwrap();
    let copy = ctx.new_stream().unwrap();
    let scratch = compute.alloc_zeros::<u8>(1 << 30).unwrap();
    let (ptr, _keep) = scratch.device_ptr(&compute);
    let timing = || {
        ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap()
    };
    // SAFETY: cudarc's streams, of the device's primary context, alive for the test.
    let copy_pl = unsafe { Stream::from_raw(copy.cu_stream(), dev) }.unwrap();
    let big: Vec<Tensor> = vec![common::tensor(DType::U8, &[256 << 20], 9)];
    let on = [
        transfer_tensor_h2d(&big).unwrap(),
        transfer_tensor_h2d(&big).unwrap(),
    ];
    let opts = D2hOptions::default().device(dev).stream(copy_pl.clone());
    // Warm: the output pool holds a block of this size, so the call below only queues.
    drop(transfer_tensor_d2h(&on[0], &opts).unwrap());
    compute.synchronize().unwrap();

    // Kernel k on `compute`, and the copy of batch k+1 to the host on `copy`, queued at
    // the same time; each bracketed by timing events.
    let base = timing();
    base.record(&compute).unwrap();
    base.synchronize().unwrap();
    let (k0, k1) = (timing(), timing());
    k0.record(&compute).unwrap();
    kernel(ptr, 1 << 30, 24, compute.cu_stream()); // tens of ms: longer than the copy
    k1.record(&compute).unwrap();
    let (c0, c1) = (timing(), timing());
    c0.record(&copy).unwrap();
    let _current = set_current_stream(&copy_pl); // no wait on another stream
    let moving = transfer_tensor_d2h_async(&on[1], &opts).unwrap();
    c1.record(&copy).unwrap();
    let back = moving.wait().unwrap();
    compute.synchronize().unwrap();
    copy.synchronize().unwrap();
    assert_eq!(back, big);

    let at = |e: &cudarc::driver::CudaEvent| base.elapsed_ms(e).unwrap();
    let (ks, ke, cs, ce) = (at(&k0), at(&k1), at(&c0), at(&c1));
    eprintln!("kernel {ks:.3}..{ke:.3} ms, copy {cs:.3}..{ce:.3} ms (from the base event)");
    assert!(ke - ks > 0.5 && ce - cs > 0.5, "both long enough to see");
    assert!(cs < ke && ks < ce, "the intervals overlap");
}
