//! The gather kernel's descriptors passed in the launch's parameters: up to 127 pieces
//! they go by value (no read of the staging slot before the copy starts), more are read
//! from the slot. On the simulated device, every path that launches the kernel (copies
//! into existing tensors, H2D of small page-locked tensors, D2H's gather) at piece counts
//! on both sides of each variant's size: every byte lands, and the simulator refuses a
//! launch whose variant is too small for its pieces.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use common::into::{check_buffer, destinations};
use pinlane::driver::sim::activity;
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_into, D2hOptions, DType,
    IntoOptions, Tensor,
};

/// Kernel launches and, of those, inline ones per variant, so far in this process.
fn launches() -> (usize, [usize; 3]) {
    let a = activity().expect("the simulator is enabled");
    (a.kernel_launches, a.inline_launches)
}

/// Launches made by `f`, and which inline variant of 15, 63 and 127 descriptors (0, 1, 2)
/// each of those that were inline took.
fn counted<T>(f: impl FnOnce() -> T) -> (T, usize, Vec<usize>) {
    let (k0, i0) = launches();
    let out = f();
    let (k1, i1) = launches();
    let variants = (0..3)
        .flat_map(|v| std::iter::repeat_n(v, i1[v] - i0[v]))
        .collect();
    (out, k1 - k0, variants)
}

/// The inline variant `n` pieces take, none past 127.
fn variant(n: usize) -> Vec<usize> {
    match n {
        0..=15 => vec![0],
        16..=63 => vec![1],
        64..=127 => vec![2],
        _ => vec![],
    }
}

// One test in this binary: the launch counts are the process's.
#[test]
fn descriptors_go_in_the_launch_up_to_its_size_and_every_byte_lands() {
    common::sim();
    for n in [4usize, 15, 16, 63, 64, 127, 128, 300] {
        // Page-locked 4 KiB sources: one kernel piece each, read in place (H2D launches the
        // kernel from four on).
        let src: Vec<Tensor> = (0..n)
            .map(|i| {
                common::tensor(DType::U8, &[4096], (n * 1000 + i) as u64)
                    .to_pinned()
                    .unwrap()
            })
            .collect();
        let (dst, buf, ranges) = destinations(&src, 0);
        let (_, kernels, inline) = counted(|| {
            transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default())
                .unwrap()
                .wait()
                .unwrap()
        });
        let s = pinlane::observe::last_transfer_stats().unwrap();
        assert_eq!(s.mapped_bytes, n * 4096, "read in place: {s:?}");
        assert_eq!(check_buffer(&buf, &src, &ranges), Ok(()), "{n} sources");
        assert_eq!(kernels, 1, "{n} sources, one launch");
        assert_eq!(inline, variant(n), "{n} pieces");

        // The same tensors to new device memory (H2D's gather), and back (D2H's).
        let (on, kernels, inline) = counted(|| transfer_tensor_h2d(&src).unwrap());
        assert_eq!((kernels, inline), (1, variant(n)), "H2D of {n}");
        let (back, kernels, inline) =
            counted(|| transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap());
        assert_eq!((kernels, inline), (1, variant(n)), "D2H of {n}");
        assert_eq!(back, src);
    }

    // Large page-locked sources read in place: cut into 4 KiB pieces while those fit the
    // launch, else into 8 or 16 KiB pieces when those do, else 4 KiB ones from the slot.
    // (4 x 100 KiB: 100 pieces of 4 KiB, the 127 variant; 8 KiB ones would take the 63.)
    for (n, kib, pieces) in [
        (4usize, 100usize, Some(100)),
        (4, 128, Some(64)),
        (4, 256, Some(64)),
        (4, 1024, None),
    ] {
        let src: Vec<Tensor> = (0..n)
            .map(|i| {
                common::tensor(DType::U8, &[kib << 10], (kib * 100 + i) as u64)
                    .to_pinned()
                    .unwrap()
            })
            .collect();
        let (dst, buf, ranges) = destinations(&src, 0);
        let (_, kernels, inline) = counted(|| {
            transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default())
                .unwrap()
                .wait()
                .unwrap()
        });
        let s = pinlane::observe::last_transfer_stats().unwrap();
        assert_eq!(s.mapped_bytes, n * (kib << 10), "read in place: {s:?}");
        assert_eq!(check_buffer(&buf, &src, &ranges), Ok(()), "{n} x {kib} KiB");
        assert_eq!(kernels, 1, "{n} x {kib} KiB, one launch");
        let want = pieces.map_or(vec![], variant);
        assert_eq!(
            inline, want,
            "{n} x {kib} KiB: {pieces:?} pieces in the launch"
        );
    }
}
