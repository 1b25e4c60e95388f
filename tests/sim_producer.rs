//! Page-locked buffers a producer writes into (`PinnedBufferMut`), on the simulated device
//! with an 8 MiB page-locked pool: frozen without a copy, moved by one direct copy (large)
//! or read by the gather kernel (many small ones), back to the pool when the last tensor
//! drops, bounded by the cap.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::sim::SimConfig;
use pinlane::memory::PinnedBufferMut;
use pinlane::{
    memory_stats, transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, Device, Error, Location,
    Tensor,
};

const D0: Device = Device::cuda(0);

fn sim() {
    common::sim_with(
        || pinlane::Config::new().pinned_output_bytes(8 << 20),
        || SimConfig::seeded(0x9A0D),
    );
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_filled_buffer_is_a_page_locked_tensor_moved_without_staging() {
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    pinlane::trim().unwrap();
    let in_use = memory_stats().pinned_outputs.in_use_bytes;
    let want: Vec<u32> = (0..300_000u32)
        .map(|i| i.wrapping_mul(2_654_435_761))
        .collect();
    let mut buf = PinnedBufferMut::<u32>::new(want.len(), D0).unwrap();
    assert_eq!(buf.len(), want.len());
    buf.as_mut_slice().copy_from_slice(&want);
    assert!(memory_stats().pinned_outputs.in_use_bytes >= in_use + 1_200_000);
    let t = buf.freeze([600, 500]).unwrap();
    assert_eq!(t.location(), Location::Pinned);
    assert_eq!(t.to_vec::<u32>().unwrap(), want);
    let on = transfer_tensor_h2d(&vec![t.clone()]).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!(
        (s.direct_bytes, s.staged_bytes),
        (1_200_000, 0),
        "one direct copy: {s:?}"
    );
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        vec![t.clone()]
    );
    drop((t, on));
    pinlane::trim().unwrap();
    assert_eq!(
        memory_stats().pinned_outputs.in_use_bytes,
        in_use,
        "back to the pool"
    );
}

#[test]
fn small_buffers_are_independent_and_read_by_the_kernel() {
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let tensors: Vec<Tensor> = (0..64u16)
        .map(|k| {
            let mut b = PinnedBufferMut::<u16>::new(500, D0).unwrap();
            for (i, x) in b.as_mut_slice().iter_mut().enumerate() {
                *x = k * 1000 + i as u16;
            }
            b.freeze([500]).unwrap()
        })
        .collect();
    for (k, t) in tensors.iter().enumerate() {
        assert_eq!(
            t.to_vec::<u16>().unwrap()[499],
            k as u16 * 1000 + 499,
            "no overlap"
        );
    }
    let on = transfer_tensor_h2d(&tensors).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!(
        (s.mapped_bytes, s.direct_bytes, s.staged_bytes),
        (64 * 1000, 0, 0),
        "many small page-locked sources are read by one kernel: {s:?}"
    );
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        tensors
    );
}

#[test]
fn the_pool_is_bounded_and_bad_shapes_are_errors() {
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    // The pool keeps its current shared block for the next small range: trimmed here and
    // below, so the comparison does not depend on which test took a small range first.
    pinlane::trim().unwrap();
    let in_use = memory_stats().pinned_outputs.in_use_bytes;
    match PinnedBufferMut::<f64>::new(2 << 20, D0) {
        Err(Error::PinnedPoolFull { requested, cap }) => {
            assert_eq!((requested, cap), (16 << 20, 8 << 20));
        }
        other => panic!("expected PinnedPoolFull, got {other:?}"),
    }
    let b = PinnedBufferMut::<f32>::new(1000, D0).unwrap();
    // A size whose block rounds up past `usize`, while the pool holds bytes (`b`'s): the
    // pool is full for it, not an overflow (session 64: a panic in debug builds).
    match PinnedBufferMut::<f32>::new(usize::MAX / 4, D0) {
        Err(Error::PinnedPoolFull { requested, .. }) => assert_eq!(requested, usize::MAX / 4 * 4),
        other => panic!("expected PinnedPoolFull, got {other:?}"),
    }
    assert!(matches!(
        b.freeze([7, 7]),
        Err(Error::ShapeMismatch {
            expected: 49,
            got: 1000,
            ..
        })
    ));
    let empty = PinnedBufferMut::<i8>::new(0, D0).unwrap();
    assert!(empty.is_empty());
    assert_eq!(empty.freeze([0, 3]).unwrap().dims(), &[0, 3]);
    assert!(matches!(
        PinnedBufferMut::<u8>::new(1, Device::cuda(9)),
        Err(Error::DeviceUnavailable { .. })
    ));
    pinlane::trim().unwrap();
    assert_eq!(
        memory_stats().pinned_outputs.in_use_bytes,
        in_use,
        "nothing kept"
    );
}

#[test]
fn recycled_memory_is_never_read_before_it_is_written() {
    // Regression (issue 19): a new buffer's as_mut_slice() handed out the previous
    // buffer's bytes (recycled page-locked memory never written by this buffer).
    sim();
    let _turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let n = 1 << 18;
    for _ in 0..2 {
        let mut old = PinnedBufferMut::<u32>::new(n, D0).unwrap();
        old.copy_from_slice(&vec![0xABAB_ABAB; n]).unwrap();
        drop(old.freeze([n]).unwrap()); // back to the pool, bytes and all
    }
    let mut fresh = PinnedBufferMut::<u32>::new(n, D0).unwrap();
    assert!(
        fresh.as_mut_slice().iter().all(|&x| x == 0),
        "saw another buffer's bytes"
    );
    // Frozen without a write: zeros too.
    let never_written = PinnedBufferMut::<u32>::new(n, D0).unwrap();
    assert!(never_written
        .freeze([n])
        .unwrap()
        .to_vec::<u32>()
        .unwrap()
        .iter()
        .all(|&x| x == 0));
    // Filled through the uninitialised view: exactly what was written, no zeroing pass.
    let mut decoded = PinnedBufferMut::<u16>::new(1000, D0).unwrap();
    for (i, v) in decoded.as_uninit_mut().iter_mut().enumerate() {
        v.write(i as u16);
    }
    // SAFETY: the loop above wrote every one of the 1000 values.
    unsafe { decoded.assume_init() };
    let want: Vec<u16> = (0..1000).collect();
    assert_eq!(decoded.as_mut_slice(), &want[..]);
    assert_eq!(
        decoded.freeze([1000]).unwrap().to_vec::<u16>().unwrap(),
        want
    );
    // Handing out the uninitialised view again forgets that the values were written
    // (safe code could have stored uninitialised ones): without assume_init, zeros.
    let mut again = PinnedBufferMut::<u32>::new(16, D0).unwrap();
    again.copy_from_slice(&[7; 16]).unwrap();
    let _ = again.as_uninit_mut();
    assert!(again.as_mut_slice().iter().all(|&x| x == 0));
    // copy_from_slice takes exactly len values.
    let mut b = PinnedBufferMut::<u8>::new(10, D0).unwrap();
    assert!(matches!(
        b.copy_from_slice(&[1; 9]),
        Err(Error::ShapeMismatch {
            expected: 10,
            got: 9,
            ..
        })
    ));
}
