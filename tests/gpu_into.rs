//! GPU: copies into existing tensors (issue 23) on the real device: random nested batches
//! into views of one static buffer, at aligned and unaligned places (every byte checked,
//! and every byte between them unchanged), the serving step as one kernel launch, a
//! batch larger than the arena through the ring, page-locked sources read in place by the
//! kernel (re-imported through DLPack, and registered in place with pages shared), and D2H
//! into page-locked memory.
// The strategies are pinlane's: feature `proptest` (tests/pack-shipped turns it on).
#![cfg(feature = "proptest")]

mod common;

use common::into::{check_buffer, destinations};
use pinlane::{
    transfer_tensor_d2h_into, transfer_tensor_h2d, transfer_tensor_h2d_into, DType, IntoOptions,
    Tensor, Value,
};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn random_batches_land_in_place(
        v in pinlane::verify::strategy::value(),
        pin_every in 0usize..4,
        skew in 0usize..3,
    ) {
        if !common::gpu() {
            return Ok(());
        }
        let src = common::mix(&v, pin_every, 0);
        let (dst, buf, ranges) = destinations(&src, skew);
        transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default()).unwrap().wait().unwrap();
        prop_assert_eq!(check_buffer(&buf, &v, &ranges), Ok(()));
    }
}

#[test]
fn a_serving_step_is_one_launch_and_a_large_batch_uses_the_ring() {
    require_gpu!();
    let mut step: Vec<Tensor> = (0..12u64)
        .map(|k| common::tensor(DType::I64, &[32 + 100 * k as usize], 40 + k))
        .collect();
    for t in step.iter_mut().step_by(4) {
        *t = t.to_pinned().unwrap();
    }
    let (dst, buf, ranges) = destinations(&step, 0);
    for _ in 0..3 {
        transfer_tensor_h2d_into(&step, &dst, &IntoOptions::default())
            .unwrap()
            .wait()
            .unwrap();
    }
    let stats = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!((stats.tensors, stats.copies), (12, 1), "{stats:?}");
    assert_eq!(check_buffer(&buf, &step, &ranges), Ok(()));

    // 48 MiB of pageable tensors, larger than the default arena's slots: the ring.
    let big = Value::List(
        (0..6u64)
            .map(|k| Value::Tensor(common::tensor(DType::F32, &[(2 << 20) + 7 * k as usize], k)))
            .collect(),
    );
    let (dst, buf, ranges) = destinations(&big, 1);
    transfer_tensor_h2d_into(&big, &dst, &IntoOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    assert!(pinlane::observe::last_transfer_stats().unwrap().windows > 1);
    assert_eq!(check_buffer(&buf, &big, &ranges), Ok(()));
}

#[test]
fn d2h_into_page_locked_memory() {
    require_gpu!();
    let host = vec![
        common::tensor(DType::Bf16, &[3, 333], 5),
        common::tensor(DType::U8, &[9 << 20], 6),
        common::tensor(DType::F64, &[17], 7),
    ];
    let on = transfer_tensor_h2d(&host).unwrap();
    let dst: Vec<Tensor> = host
        .iter()
        .map(|t| {
            let zeros = Tensor::from_bytes(t.dtype(), t.dims(), &vec![0; t.nbytes()]).unwrap();
            zeros.to_pinned().unwrap()
        })
        .collect();
    // SAFETY: nothing else reads or writes `dst`'s memory during the call.
    unsafe { transfer_tensor_d2h_into(&on, &dst, &IntoOptions::default()) }.unwrap();
    assert_eq!(dst, host);
}

#[test]
fn page_locked_sources_are_read_in_place_as_the_driver_maps_them() {
    require_gpu!();
    // Small and large, side by side in the heap (so some share pages).
    let host: Vec<Tensor> = [300usize, 20, 10_000, 70_000, 5, 1000]
        .iter()
        .enumerate()
        .map(|(k, &n)| common::tensor(DType::F32, &[n], 90 + k as u64))
        .collect();
    let total: usize = host.iter().map(Tensor::nbytes).sum();
    // pinlane's page-locked memory imported back through DLPack (another owner's, as
    // torch's pin_memory() arrives): the driver says the device maps it.
    let reimported: Vec<Tensor> = host
        .iter()
        .map(|t| Tensor::from_dlpack(t.to_pinned().unwrap().to_dlpack().unwrap()).unwrap())
        .collect();
    // The heap memory itself, page-locked in place (ranges of shared pages).
    let registered = Tensor::register_pinned_many(&host, common::dev()).unwrap();
    for src in [reimported, registered] {
        let (dst, buf, ranges) = destinations(&src, 0);
        for _ in 0..2 {
            transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let s = pinlane::observe::last_transfer_stats().unwrap();
            assert_eq!(
                (s.mapped_bytes, s.staged_bytes, s.direct_bytes, s.copies),
                (total, 0, 0, 1),
                "one launch reads them all: {s:?}"
            );
            assert_eq!(check_buffer(&buf, &host, &ranges), Ok(()));
        }
    }
}

/// A stream a CUDA graph capture is running on is refused by the calls that would queue
/// work on it or record an event on it (a caller's copy stream, a current stream, a
/// consumer stream), and the capture ends with none of pinlane's work in its graph; after
/// it, the same calls run on that stream.
#[test]
fn a_capturing_stream_is_refused_and_its_graph_stays_empty() {
    require_gpu!();
    use cudarc::driver::sys;
    use pinlane::{
        set_current_stream, transfer_tensor_d2h, transfer_tensor_h2d_with, D2hOptions, Error,
        H2dOptions, Stream,
    };
    let dev = common::dev();
    let s = Stream::new(dev).unwrap();
    let host = common::tensor(DType::F32, &[1 << 14], 40);
    let pinned = host.to_pinned().unwrap();
    let dst = transfer_tensor_h2d(&common::tensor(DType::F32, &[1 << 14], 41)).unwrap();
    let on_s = IntoOptions::default().stream(s.clone());
    let on_stream = D2hOptions::default().device(dev).stream(s.clone());
    // SAFETY: a live stream pinlane made, of the device's primary context.
    let begun = unsafe {
        sys::cuStreamBeginCapture_v2(
            s.as_raw(),
            sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
        )
    };
    assert_eq!(begun, sys::CUresult::CUDA_SUCCESS);
    let answers = [
        (
            "h2d into, page-locked",
            transfer_tensor_h2d_into(&pinned, &dst, &on_s).map(drop),
        ),
        (
            "h2d into, pageable",
            transfer_tensor_h2d_into(&host, &dst, &on_s).map(drop),
        ),
        ("d2h on it", transfer_tensor_d2h(&dst, &on_stream).map(drop)),
        (
            "h2d, consumer",
            transfer_tensor_h2d_with(&host, &H2dOptions::default().consumer_stream(s.clone()))
                .map(drop),
        ),
        ("d2h after it", {
            let _current = set_current_stream(&s);
            transfer_tensor_d2h(&dst, &D2hOptions::default()).map(drop)
        }),
    ];
    let mut graph: sys::CUgraph = std::ptr::null_mut();
    let mut nodes = usize::MAX;
    // SAFETY: the capture begun above, on the same live stream; `graph` and `nodes` are
    // live out-pointers, and the graph is destroyed once counted.
    let (ended, counted) = unsafe {
        let ended = sys::cuStreamEndCapture(s.as_raw(), &mut graph);
        let counted = sys::cuGraphGetNodes(graph, std::ptr::null_mut(), &mut nodes);
        sys::cuGraphDestroy(graph);
        (ended, counted)
    };
    for (what, r) in answers {
        assert!(
            matches!(r, Err(Error::StreamCapturing { .. })),
            "{what}: {r:?}"
        );
    }
    assert_eq!(ended, sys::CUresult::CUDA_SUCCESS, "the capture was broken");
    assert_eq!(counted, sys::CUresult::CUDA_SUCCESS);
    assert_eq!(nodes, 0, "pinlane's work was captured");
    transfer_tensor_h2d_into(&pinned, &dst, &on_s)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(transfer_tensor_d2h(&dst, &on_stream).unwrap(), host);
}
