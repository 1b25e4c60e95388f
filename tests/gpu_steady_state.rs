//! GPU: after warm-up, repeated transfers of the same batch shapes allocate nothing that
//! grows a pool: the device pool's reserved memory, the staging arena and the page-locked
//! and pageable output pools all stay where the warm-up left them (issue 11, item 7).

mod common;

use pinlane::{
    memory_stats, transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, HostOutput, Tensor,
};

fn held() -> (u64, usize, usize, usize) {
    let s = memory_stats();
    let dev = common::dev();
    let reserved = s
        .devices
        .iter()
        .find(|d| d.device == dev)
        .map_or(0, |d| d.reserved_bytes);
    (
        reserved,
        s.staging.held_bytes,
        s.pinned_outputs.held_bytes,
        s.pageable_outputs.held_bytes,
    )
}

#[test]
fn repeated_batches_of_the_same_shapes_grow_no_pool() {
    require_gpu!();
    let batches: Vec<Vec<Tensor>> = vec![
        (0..4)
            .map(|i| common::tensor(DType::F32, &[2 << 20], i))
            .collect(), // 4 x 8 MiB
        (0..64)
            .map(|i| common::tensor(DType::U8, &[3, 224, 224], 10 + i))
            .collect(),
        (0..1000)
            .map(|i| common::tensor(DType::F32, &[256], 100 + i))
            .collect(),
        vec![common::tensor(DType::U8, &[300_000], 7)
            .to_pinned()
            .unwrap()],
    ];
    let round = || {
        for b in &batches {
            let on = transfer_tensor_h2d(b).unwrap();
            for mode in [HostOutput::Pinned, HostOutput::Pageable] {
                let back = transfer_tensor_d2h(&on, &D2hOptions::default().output(mode)).unwrap();
                assert_eq!(back.len(), b.len());
            }
        }
    };
    for _ in 0..5 {
        round(); // warm-up: pools grow to what these shapes need
    }
    let before = held();
    let mut grew = 0;
    let mut last = before;
    for _ in 0..100 {
        round();
        let now = held();
        if now.0 > last.0 || now.1 > last.1 || now.2 > last.2 || now.3 > last.3 {
            grew += 1;
        }
        last = now;
    }
    eprintln!("held (device reserved, staging, page-locked out, pageable out): {before:?} -> {last:?}; rounds that grew a pool: {grew}");
    assert_eq!(grew, 0, "{before:?} -> {last:?}");
    assert_eq!(last, before);
    let back = transfer_tensor_d2h(
        &transfer_tensor_h2d(&batches[1]).unwrap(),
        &D2hOptions::default(),
    );
    assert_eq!(back.unwrap(), batches[1]);
}
