//! GPU: the committed PTX matches a rebuild from kernels/*.cu with the machine's nvcc, it
//! loads, and the gather path moves many small tensors with few copies, byte-exact.

mod common;

use pinlane::observe::last_transfer_stats;
use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, HostOutput, Tensor};

#[test]
#[cfg(feature = "test-util")] // stream delays or fault injection
fn committed_ptx_matches_a_rebuild() {
    require_gpu!();
    let have_nvcc = std::process::Command::new("nvcc")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_nvcc {
        assert!(
            std::env::var("PINLANE_REQUIRE_GPU").as_deref() != Ok("1"),
            "PINLANE_REQUIRE_GPU=1 but nvcc is missing: cannot check the committed PTX"
        );
        eprintln!("skipping: no nvcc here");
        return;
    }
    let out = std::env::temp_dir().join(format!("pinlane-ptx-{}", std::process::id()));
    let status = std::process::Command::new("bash")
        .arg("kernels/build.sh")
        .arg(&out)
        .status()
        .expect("run build.sh");
    assert!(status.success(), "kernels/build.sh failed");
    for name in ["gather", "normalize"] {
        let rebuilt = std::fs::read_to_string(out.join(format!("{name}.ptx"))).unwrap();
        let committed = std::fs::read_to_string(format!("kernels/{name}.ptx")).unwrap();
        assert_eq!(
            rebuilt, committed,
            "kernels/{name}.ptx is stale: rebuild it with kernels/build.sh"
        );
    }
    let committed = std::fs::read_to_string("kernels/gather.ptx").unwrap();
    assert_eq!(
        pinlane::driver::GATHER_PTX,
        committed,
        "the binary embeds the committed PTX"
    );
}

#[test]
fn many_small_tensors_are_gathered_into_one_copy() {
    require_gpu!();
    // Odd sizes (1 to 1000 bytes): the kernel's byte path; 1 KiB f32: its 16-byte path.
    let mut b: Vec<Tensor> = (0..500)
        .map(|i| common::tensor(DType::U8, &[1 + (i * 7) % 1000], i as u64))
        .collect();
    b.extend((0..500).map(|i| common::tensor(DType::F32, &[256], 10_000 + i)));
    let on = transfer_tensor_h2d(&b).unwrap();
    for mode in [HostOutput::Pinned, HostOutput::Pageable] {
        let back = transfer_tensor_d2h(&on, &D2hOptions::default().output(mode)).unwrap();
        let s = last_transfer_stats().unwrap();
        assert!(pinlane::driver::gather_unavailable_reason(common::dev()).is_none());
        assert!(
            s.copies <= 4,
            "{mode:?}: upload, kernel and one copy, not one per tensor: {s:?}"
        );
        assert_eq!(back, b, "{mode:?}");
    }
}

#[test]
fn small_and_large_tensors_mixed_keep_their_places() {
    require_gpu!();
    let b = (
        common::tensor(DType::F64, &[3 << 20], 1), // 24 MiB: copied on its own
        vec![
            common::tensor(DType::I16, &[5], 2),
            common::tensor(DType::U8, &[0], 3),
        ],
        common::tensor(DType::Bf16, &[700, 3], 4),
        Tensor::scalar(9u64),
        common::tensor(DType::U8, &[(1 << 20) + 1], 5), // just over the gather limit
        common::tensor(DType::Bool, &[33], 6),
    );
    let on = transfer_tensor_h2d(&b).unwrap();
    for mode in [HostOutput::Pinned, HostOutput::Pageable] {
        assert_eq!(
            transfer_tensor_d2h(&on, &D2hOptions::default().output(mode)).unwrap(),
            b,
            "{mode:?}"
        );
    }
}

#[test]
fn pieces_on_both_sides_of_each_inline_launch_size_land() {
    require_gpu!();
    // Up to 127 pieces the descriptors go in the launch's parameters (variants of 15, 63
    // and 127), more are read from the staging slot. Page-locked 4 KiB sources are one
    // piece each; odd-sized ones take the kernel's byte path. Every path that launches
    // the kernel: copies into existing tensors, H2D's gather, D2H's gather.
    for n in [4usize, 15, 16, 63, 64, 127, 128, 300] {
        for odd in [0usize, 3] {
            let src: Vec<Tensor> = (0..n)
                .map(|i| {
                    let len = 4096 - odd * (i % 2);
                    common::tensor(DType::U8, &[len], (n * 10 + odd + i) as u64)
                        .to_pinned()
                        .unwrap()
                })
                .collect();
            let (dst, buf, ranges) = common::into::destinations(&src, 0);
            pinlane::transfer_tensor_h2d_into(&src, &dst, &pinlane::IntoOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let s = last_transfer_stats().unwrap();
            assert_eq!(s.copies, 1, "{n} sources, one launch: {s:?}");
            assert_eq!(
                common::into::check_buffer(&buf, &src, &ranges),
                Ok(()),
                "{n} sources into place, odd {odd}"
            );
            let on = transfer_tensor_h2d(&src).unwrap();
            let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
            assert_eq!(back, src, "{n} sources there and back, odd {odd}");
        }
    }
}

#[test]
fn large_sources_cut_into_larger_pieces_for_the_launch_land() {
    require_gpu!();
    // Page-locked sources read in place whose 4 KiB pieces are too many for the launch are
    // cut into 8 or 16 KiB pieces (a block loops over its piece), up to 127 of them; past
    // that, 4 KiB pieces from the slot. Odd sizes end on the kernel's byte path. The first
    // batch is copy_into.py's "8 tensors, 492 KiB" (128 pieces of 4 KiB, 67 of 8).
    let batches: [&[usize]; 4] = [
        &[9392, 196472, 2704, 34680, 156104, 360, 25056, 79080],
        &[(128 << 10) + 3, 128 << 10, (128 << 10) - 5, 128 << 10],
        &[256 << 10, (256 << 10) + 7, 256 << 10, 256 << 10],
        &[1 << 20, (1 << 20) + 1, 1 << 20, 1 << 20],
    ];
    for (b, sizes) in batches.iter().enumerate() {
        let src: Vec<Tensor> = sizes
            .iter()
            .enumerate()
            .map(|(i, &len)| {
                common::tensor(DType::U8, &[len], (b * 100 + i) as u64)
                    .to_pinned()
                    .unwrap()
            })
            .collect();
        let (dst, buf, ranges) = common::into::destinations(&src, 0);
        pinlane::transfer_tensor_h2d_into(&src, &dst, &pinlane::IntoOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        let s = last_transfer_stats().unwrap();
        assert_eq!(
            s.mapped_bytes,
            sizes.iter().sum::<usize>(),
            "batch {b} read in place: {s:?}"
        );
        assert_eq!(
            common::into::check_buffer(&buf, &src, &ranges),
            Ok(()),
            "batch {b} into place"
        );
    }
}
