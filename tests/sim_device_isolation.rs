//! On the simulated device (2 devices): a process that works only with `cuda:1` creates
//! no context and no memory on `cuda:0`, whatever it does (h2d, d2h in both output modes,
//! page-locked copies, streams, events, lent pointers, DLPack). Its own binary, so no
//! other test touches `cuda:0` meanwhile.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::sim::activity;
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_with, D2hOptions, DType, Device,
    Event, H2dOptions, HostOutput, Stream, Tensor,
};

#[test]
fn work_on_cuda1_leaves_cuda0_untouched() {
    common::sim();
    let d1 = Device::cuda(1);
    let b: Vec<Tensor> = (0..40)
        .map(|i| common::tensor(DType::F32, &[1 + i * 300], i as u64))
        .chain([common::tensor(DType::U8, &[3 << 20], 99)]) // larger than the arena
        .collect();
    let pinned = b[1].to_pinned_on(d1).unwrap();
    let mut batch = b.clone();
    batch.push(pinned.clone());
    let on = transfer_tensor_h2d_with(&batch, &H2dOptions::default().device(d1)).unwrap();
    for mode in [HostOutput::Pinned, HostOutput::Pageable] {
        let back =
            transfer_tensor_d2h(&on, &D2hOptions::default().device(d1).output(mode)).unwrap();
        assert_eq!(&back[..b.len()], &b[..], "{mode:?}");
    }
    let s = Stream::new(d1).unwrap();
    let e = Event::new(d1).unwrap();
    e.record(&s).unwrap();
    drop(on[0].device_ptr(&s).unwrap());
    let dl = Tensor::from_dlpack(on[0].to_dlpack_on(&s).unwrap()).unwrap();
    drop((dl, on));

    // LOCAL_RANK=1 as the default device works the same way (on a new thread: a thread
    // reads LOCAL_RANK once, at its first call that needs it).
    std::env::set_var("LOCAL_RANK", "1");
    std::thread::scope(|s| {
        s.spawn(|| {
            let on = transfer_tensor_h2d(&b).unwrap();
            assert_eq!(on[0].device(), Some(d1));
            assert_eq!(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(), b);
            let _ = b[0].to_pinned().unwrap();
        })
        .join()
        .unwrap();
    });

    let seen = activity().unwrap();
    assert!(
        seen.context_used[1],
        "the counters see cuda:1's work: {seen:?}"
    );
    assert!(
        seen.host_allocs[1] > 0 && seen.device_allocs[1] > 0,
        "{seen:?}"
    );
    assert!(!seen.context_used[0], "no context on cuda:0: {seen:?}");
    assert_eq!(
        (seen.host_allocs[0], seen.device_allocs[0]),
        (0, 0),
        "{seen:?}"
    );
}
