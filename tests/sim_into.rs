//! Copies into existing tensors on the simulated device (every machine, CI included):
//! random nested batches copied into views of one static device buffer, at aligned and
//! unaligned places, small (one slot, one kernel launch) and larger than the arena (the
//! staging ring); every byte checked, and every byte between the destinations checked
//! untouched. Then D2H into page-locked destinations, and every error before any copy
//! leaves the destinations as they were.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_d2h_into, transfer_tensor_h2d, transfer_tensor_h2d_into,
    transfer_tensor_h2d_with, D2hOptions, DType, Error, H2dOptions, IntoOptions, Location, Stream,
    Tensor, Value,
};
use proptest::prelude::*;

use common::into::{check_buffer, destinations, static_buffer, view};

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    /// Small batches: one slot, one launch (page-locked ones read in place, unaligned
    /// destinations by DMA), direct copies for the larger page-locked ones.
    #[test]
    fn copies_into_views_of_a_static_buffer(
        v in common::value(),
        pin_every in 0usize..4,
        skew in 0usize..3,
        drop_early in any::<bool>(),
    ) {
        common::sim();
        let src = common::mix(&v, pin_every, 0);
        let (dst, buf, ranges) = destinations(&src, skew);
        let done = transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default()).unwrap();
        if drop_early {
            // The sources may go at once: pinlane keeps the page-locked ones until the
            // copies have run, and has staged the others.
            drop(src);
            drop(dst);
            prop_assert!(done.wait().is_ok());
            prop_assert_eq!(check_buffer(&buf, &v, &ranges), Ok(()));
        } else {
            prop_assert!(done.wait().is_ok());
            prop_assert_eq!(check_buffer(&buf, &v, &ranges), Ok(()));
            let back = transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap();
            prop_assert_eq!(&back, &v);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Batches larger than the whole arena (1 MiB): the staging ring, one copy a piece.
    #[test]
    fn copies_batches_larger_than_the_arena(
        v in common::value(),
        big in proptest::collection::vec((common::dtype(), 20_000usize..200_000, any::<u64>()), 1..3),
        pin_every in 0usize..3,
        skew in 0usize..2,
    ) {
        common::sim();
        let mut items = vec![v];
        items.extend(big.into_iter().map(|(d, n, s)| Value::Tensor(common::tensor(d, &[n], s))));
        let v = Value::List(items);
        let src = common::mix(&v, pin_every, 0);
        let (dst, buf, ranges) = destinations(&src, skew);
        transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default()).unwrap().wait().unwrap();
        prop_assert_eq!(check_buffer(&buf, &v, &ranges), Ok(()));
    }
}

/// Step after step into the same buffers, on a stream of the caller's that a slow
/// reader also uses: each step's reader sees that step's bytes (the copies are ordered
/// on the stream, after the reader before them).
#[test]
fn steps_on_the_callers_stream_are_ordered() {
    common::sim();
    let stream = Stream::new(common::dev()).unwrap();
    let first = vec![
        common::tensor(DType::I64, &[300], 1),
        common::tensor(DType::F32, &[17], 2),
    ];
    let (dst, _buf, _) = destinations(&first, 1);
    let _current = pinlane::set_current_stream(&stream);
    for step in 0..20u64 {
        let src = vec![
            common::tensor(DType::I64, &[300], step * 2),
            common::tensor(DType::F32, &[17], step * 2 + 1),
        ];
        // Queued behind a slow operation on the stream: nothing may run early.
        stream
            .delay_async(std::time::Duration::from_millis(2))
            .unwrap();
        let opts = IntoOptions::default().stream(stream.clone());
        let done = transfer_tensor_h2d_into(&src, &dst, &opts).unwrap();
        // D2H waits for the current stream (this one): it reads after the copies.
        let back = transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap();
        assert_eq!(back, src, "step {step}");
        done.wait().unwrap();
    }
}

/// Every bad pair is an error before anything is queued: the destinations keep their
/// bytes.
#[test]
fn bad_pairs_are_refused_and_nothing_is_written() {
    common::sim();
    let src = vec![
        common::tensor(DType::F32, &[64], 7),
        common::tensor(DType::U8, &[10], 8),
    ];
    let (dst, buf, ranges) = destinations(&src, 0);
    let untouched = || check_buffer(&buf, &Vec::<Tensor>::new(), &[]);
    let opts = IntoOptions::default();
    let refuse = |s: &Vec<Tensor>, d: &Vec<Tensor>| transfer_tensor_h2d_into(s, d, &opts).err();

    // Another dtype, the same byte size.
    let wrong_dtype = vec![common::tensor(DType::I32, &[64], 7), src[1].clone()];
    let e = refuse(&wrong_dtype, &dst).unwrap();
    assert!(
        matches!(&e, Error::IntoMismatch { at, .. } if at == "[0]"),
        "{e}"
    );
    // Another size.
    let wrong_size = vec![src[0].clone(), common::tensor(DType::U8, &[11], 8)];
    let e = refuse(&wrong_size, &dst).unwrap();
    assert!(e.to_string().contains("11 bytes"), "{e}");
    // Fewer tensors.
    let e = refuse(&vec![src[0].clone()], &dst).unwrap();
    assert!(
        matches!(&e, Error::IntoMismatch { at, .. } if at == "batch"),
        "{e}"
    );
    // A host destination.
    let e = refuse(&src, &src).unwrap();
    assert!(e.to_string().contains("not on a CUDA device"), "{e}");
    // A device source.
    let e = refuse(&vec![dst[0].clone(), src[1].clone()], &dst).unwrap();
    assert!(e.to_string().contains("not on the host"), "{e}");
    // Overlapping destinations: the second view starts inside the first.
    let whole = static_buffer(1024);
    let a = view(&whole, 0, &src[0]);
    let b = view(&whole, 128, &src[0]);
    let e = refuse(&vec![src[0].clone(), src[0].clone()], &vec![a, b]).unwrap();
    assert!(
        matches!(&e, Error::OverlappingDestinations { first, second } if first == "[0]" && second == "[1]"),
        "{e}"
    );
    // A read-only DLPack import of a destination (its producer said nobody writes it),
    // through both calls that write device tensors.
    let read_only = vec![
        dst[0].clone(),
        Tensor::from_dlpack(dst[1].to_dlpack().unwrap()).unwrap(),
    ];
    let e = refuse(&src, &read_only).unwrap();
    assert!(
        matches!(&e, Error::IntoMismatch { at, reason } if at == "[1]" && reason.contains("may not write")),
        "{e}"
    );
    let e = pinlane::H2dPairs::new(&src, &read_only).err().unwrap();
    assert!(e.to_string().contains("may not write"), "{e}");
    assert_eq!(untouched(), Ok(()));
    // A pair with bytes on another device than the first is refused; an empty pair
    // there writes nothing and binds nothing (session 79: it was refused too).
    let other = |dims: &[usize], seed| {
        let t = common::tensor(DType::U8, dims, seed);
        let on1 = H2dOptions::default().device("cuda:1");
        transfer_tensor_h2d_with(&vec![t], &on1).unwrap().remove(0)
    };
    let e = refuse(&src, &vec![dst[0].clone(), other(&[10], 9)]).unwrap();
    assert!(e.to_string().contains("another pair's on cuda:0"), "{e}");
    let empty = common::tensor(DType::U8, &[0], 1);
    let with_empty = vec![empty.clone(), src[0].clone(), src[1].clone()];
    let first_empty_on_1 = vec![other(&[0], 2), dst[0].clone(), dst[1].clone()];
    transfer_tensor_h2d_into(&with_empty, &first_empty_on_1, &opts)
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(check_buffer(&buf, &src, &ranges), Ok(()));
}

/// Device destinations pinlane may write: its own memory, and another owner's taken as
/// writable (`from_device_ptr`, a capsule not flagged read-only imported with the unsafe
/// `from_dlpack_writable`); the bytes arrive.
#[test]
fn h2d_into_writable_imports() {
    use pinlane::dlpark::versioned::Dlpack;
    use pinlane::dlpark::DlpackFlags;
    common::sim();
    let src = vec![common::tensor(DType::F32, &[64], 21)];
    let (dst, buf, ranges) = destinations(&src, 0);
    let raw = dst[0].to_dlpack().unwrap().into_raw();
    // SAFETY: `raw` is the capsule just made, owned here alone: its flags made writable,
    // as a producer that lets consumers write hands it.
    unsafe { (*raw).flags = DlpackFlags::empty() };
    // SAFETY: a valid capsule, ownership taken back; nothing but this test's copies
    // writes the memory while the import lives.
    let writable = unsafe { Tensor::from_dlpack_writable(Dlpack::from_raw(raw).unwrap()) }.unwrap();
    transfer_tensor_h2d_into(&src, &vec![writable], &IntoOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(check_buffer(&buf, &src, &ranges), Ok(()));
}

/// D2H into page-locked destinations: the bytes arrive, and memory a Rust value owns is
/// refused (pinlane tensors over it are immutable).
#[test]
fn d2h_into_page_locked_destinations() {
    common::sim();
    let host = vec![
        common::tensor(DType::F64, &[3, 5], 11),
        common::tensor(DType::U8, &[0], 12),
        common::tensor(DType::I16, &[4000], 13),
        common::tensor(DType::Bf16, &[200_000], 14),
    ];
    let on = transfer_tensor_h2d(&host).unwrap();
    let zeros: Vec<Tensor> = host
        .iter()
        .map(|t| Tensor::from_bytes(t.dtype(), t.dims(), &vec![0; t.nbytes()]).unwrap())
        .collect();
    let dst: Vec<Tensor> = zeros.iter().map(|t| t.to_pinned().unwrap()).collect();
    // SAFETY: nothing else reads or writes `dst`'s memory during the call.
    unsafe { transfer_tensor_d2h_into(&on, &dst, &IntoOptions::default()) }.unwrap();
    assert_eq!(dst, host);
    // SAFETY: as above (the call is refused before writing anything).
    let e = unsafe { transfer_tensor_d2h_into(&on, &zeros, &IntoOptions::default()) }.unwrap_err();
    assert!(e.to_string().contains("may not write"), "{e}");
    assert!(zeros
        .iter()
        .all(|t| t.as_bytes().unwrap().iter().all(|&b| b == 0)));
    // Memory a Rust value owns, page-locked in place, and a read-only re-import of it.
    let registered = zeros[2].register_pinned(common::dev()).unwrap();
    let reimported = Tensor::from_dlpack(zeros[2].to_dlpack().unwrap()).unwrap();
    for refused in [registered, reimported] {
        let one = vec![on[2].clone()];
        // SAFETY: as above.
        let e = unsafe { transfer_tensor_d2h_into(&one, &vec![refused], &IntoOptions::default()) }
            .unwrap_err();
        assert!(e.to_string().contains("may not write"), "{e}");
    }
    assert!(zeros[2].as_bytes().unwrap().iter().all(|&b| b == 0));
    // Two destinations over the same page-locked bytes.
    let same = dst[2].clone();
    let pair = vec![on[2].clone(), on[2].clone()];
    // SAFETY: as above.
    let e = unsafe {
        transfer_tensor_d2h_into(&pair, &vec![same.clone(), same], &IntoOptions::default())
    }
    .unwrap_err();
    assert!(matches!(e, Error::OverlappingDestinations { .. }), "{e}");
}

/// `HashMap` batches pair by key, both ways: a destination map made with room for 4096
/// entries lists its keys in another order than the source's, and each key's bytes
/// arrive at that key (paired by position they would land under other keys).
#[test]
fn hash_maps_copy_into_their_own_keys() {
    use std::collections::HashMap;
    common::sim();
    let host: HashMap<String, Tensor> = (0..40u64)
        .map(|k| (format!("k{k}"), common::tensor(DType::F32, &[16], k)))
        .collect();
    let zeros = |t: &Tensor| Tensor::from_bytes(t.dtype(), t.dims(), &vec![0; t.nbytes()]).unwrap();
    let mut dst = HashMap::with_capacity(4096);
    for (k, t) in &host {
        dst.insert(k.clone(), transfer_tensor_h2d(&zeros(t)).unwrap());
    }
    let order = |m: &HashMap<String, Tensor>| m.keys().cloned().collect::<Vec<_>>();
    assert_ne!(order(&host), order(&dst), "the maps list their keys alike");
    transfer_tensor_h2d_into(&host, &dst, &IntoOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    for (k, t) in &dst {
        assert_eq!(
            &transfer_tensor_d2h(t, &D2hOptions::default()).unwrap(),
            &host[k],
            "{k}"
        );
    }
    // Back into page-locked destinations, again listed in their own order.
    let mut back = HashMap::with_capacity(4096);
    for (k, t) in &host {
        back.insert(k.clone(), zeros(t).to_pinned().unwrap());
    }
    // SAFETY: nothing else reads or writes `back`'s memory during the call.
    unsafe { transfer_tensor_d2h_into(&dst, &back, &IntoOptions::default()) }.unwrap();
    assert_eq!(back, host);
    // A destination with another key is refused before anything is written.
    let mut other = dst.clone();
    let moved = other.remove("k3").unwrap();
    other.insert("k3x".into(), moved);
    let e = transfer_tensor_h2d_into(&host, &other, &IntoOptions::default()).unwrap_err();
    assert!(e.to_string().contains("other keys"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(60))]

    /// Nested `HashMap`s pair by key at every level: a list of maps whose entries are
    /// maps of lists of tensors, copied into device tensors held by maps (both levels)
    /// made with room for 1024 entries and filled in reverse, so each lists its keys in
    /// another order than its source; then back into page-locked ones the same way. Every
    /// key's tensors come back to that key.
    #[test]
    fn nested_hash_maps_copy_into_their_own_keys(
        maps in proptest::collection::vec(
            proptest::collection::btree_map(
                any::<u16>(),
                proptest::collection::btree_map(
                    any::<u8>(),
                    proptest::collection::vec((common::dtype(), 1usize..64, any::<u64>()), 0..3),
                    0..4,
                ),
                0..6,
            ),
            1..3,
        ),
    ) {
        use std::collections::{BTreeMap, HashMap};
        type Inner = HashMap<u8, Vec<Tensor>>;
        type Batch = Vec<HashMap<u16, Inner>>;
        common::sim();
        /// A map with room for 1024 entries, filled in reverse key order.
        fn reversed<K: Copy + Ord + std::hash::Hash, V>(
            m: impl IntoIterator<Item = (K, V)>,
        ) -> HashMap<K, V> {
            let mut entries: Vec<(K, V)> = m.into_iter().collect();
            entries.sort_unstable_by_key(|e| std::cmp::Reverse(e.0));
            let mut out = HashMap::with_capacity(1024);
            out.extend(entries);
            out
        }
        let src: Batch = maps
            .iter()
            .map(|m| {
                m.iter()
                    .map(|(k, inner)| {
                        let inner = inner.iter().map(|(j, ts)| {
                            let ts = ts.iter().map(|&(d, n, seed)| common::tensor(d, &[n], seed));
                            (*j, ts.collect())
                        });
                        (*k, inner.collect())
                    })
                    .collect()
            })
            .collect();
        let zeros = |t: &Tensor| Tensor::from_bytes(t.dtype(), t.dims(), &vec![0; t.nbytes()]).unwrap();
        let like = |make: &dyn Fn(&Tensor) -> Tensor| -> Batch {
            src.iter()
                .map(|m| {
                    reversed(m.iter().map(|(k, inner)| {
                        let inner: BTreeMap<u8, Vec<Tensor>> =
                            inner.iter().map(|(j, ts)| (*j, ts.iter().map(make).collect())).collect();
                        (*k, reversed(inner))
                    }))
                })
                .collect()
        };
        let dst = like(&|t| transfer_tensor_h2d(&zeros(t)).unwrap());
        transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default()).unwrap().wait().unwrap();
        prop_assert_eq!(&transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap(), &src);
        let back = like(&|t| zeros(t).to_pinned().unwrap());
        // SAFETY: nothing else reads or writes `back`'s memory during the call.
        unsafe { transfer_tensor_d2h_into(&dst, &back, &IntoOptions::default()) }.unwrap();
        prop_assert_eq!(&back, &src);
    }
}

/// The serving step: a dozen small tensors, pageable and page-locked, into slices of one
/// buffer, take one kernel launch (the page-locked ones read in place) and one slot.
#[test]
fn a_serving_step_is_one_launch() {
    common::sim();
    let mut src: Vec<Tensor> = (0..12u64)
        .map(|k| common::tensor(DType::I32, &[64 + 16 * k as usize], 100 + k))
        .collect();
    for t in src.iter_mut().step_by(3) {
        *t = t.to_pinned().unwrap();
    }
    let (buf, ranges, stats) = into_statics(&src);
    assert_eq!(
        (stats.tensors, stats.copies, stats.windows),
        (12, 1, 1),
        "{stats:?}"
    );
    let pinned: usize = src.iter().step_by(3).map(Tensor::nbytes).sum();
    assert_eq!(stats.mapped_bytes, pinned, "{stats:?}");
    assert_eq!(
        stats.staged_bytes + stats.mapped_bytes,
        stats.bytes,
        "{stats:?}"
    );
    assert_eq!(check_buffer(&buf, &src, &ranges), Ok(()));
}

/// Page-locked memory of other owners (DLPack imports of `kDLCUDAHost`, as torch's
/// `pin_memory()` tensors arrive): read in place by the scatter kernel where the driver
/// maps it for the device, small and large sources alike; memory an import calls
/// page-locked that the device does not map is copied, never read by the kernel (the
/// simulator fails a kernel that reads it, and the bytes would be wrong).
#[test]
fn page_locked_imports_are_read_in_place_only_where_the_device_maps_them() {
    use pinlane::dlpark::ffi::DLDeviceType;
    use pinlane::dlpark::versioned::Dlpack;
    common::sim();
    // 1.2 KB, 40 KB and 20 B staged or read in place; 280 KB (over both direct
    // thresholds) copied directly or read in place.
    let host: Vec<Tensor> = [(300usize, 1u64), (10_000, 2), (70_000, 3), (5, 4)]
        .iter()
        .map(|&(n, seed)| common::tensor(DType::F32, &[n], seed))
        .collect();
    let large = 70_000 * 4;
    let total: usize = host.iter().map(Tensor::nbytes).sum();
    let reimported =
        |t: &Tensor| Tensor::from_dlpack(t.to_pinned().unwrap().to_dlpack().unwrap()).unwrap();
    // Ordinary memory, called page-locked by its capsule.
    let claimed = |t: &Tensor| {
        let raw = t.to_dlpack().unwrap().into_raw();
        // SAFETY: `raw` is the capsule just made, owned here alone.
        unsafe { (*raw).dl_tensor.device.device_type = DLDeviceType::CUDAHOST };
        // SAFETY: a valid capsule, ownership taken back.
        Tensor::from_dlpack(unsafe { Dlpack::from_raw(raw) }.unwrap()).unwrap()
    };
    for mapped in [true, false] {
        let src: Vec<Tensor> = host
            .iter()
            .map(|t| if mapped { reimported(t) } else { claimed(t) })
            .collect();
        assert!(src.iter().all(|t| t.location() == Location::Pinned));
        // Twice: the second call finds the driver's answer remembered.
        for _ in 0..2 {
            let (buf, ranges, s) = into_statics(&src);
            if mapped {
                assert_eq!(
                    (s.mapped_bytes, s.staged_bytes, s.direct_bytes, s.copies),
                    (total, 0, 0, 1),
                    "one launch reads them all: {s:?}"
                );
            } else {
                assert_eq!(
                    (s.mapped_bytes, s.staged_bytes, s.direct_bytes),
                    (0, total - large, large),
                    "{s:?}"
                );
            }
            assert_eq!(check_buffer(&buf, &host, &ranges), Ok(()));
        }
    }
}

/// Page-locked sources from the direct threshold on that the kernel could read join its
/// launch when there is one anyway (a small source beside them), or when four or more
/// share it; one to three alone are copied directly.
#[test]
fn large_page_locked_sources_join_the_launch_when_it_pays() {
    common::sim();
    for (n_large, with_small, in_place) in [
        (1, false, false),
        (3, false, false),
        (4, false, true),
        (1, true, true),
    ] {
        let mut host: Vec<Tensor> = (0..n_large)
            .map(|k| common::tensor(DType::I64, &[40_000], 300 + k as u64))
            .collect();
        if with_small {
            host.push(common::tensor(DType::U8, &[100], 399));
        }
        let src: Vec<Tensor> = host.iter().map(|t| t.to_pinned().unwrap()).collect();
        let (buf, ranges, s) = into_statics(&src);
        let (large, small) = (n_large * 320_000, if with_small { 100 } else { 0 });
        let expect = if in_place {
            (large + small, 0)
        } else {
            (small, large)
        };
        assert_eq!(
            (s.mapped_bytes, s.direct_bytes),
            expect,
            "{n_large} large, small beside: {with_small}: {s:?}"
        );
        assert_eq!(check_buffer(&buf, &host, &ranges), Ok(()));
    }
}

/// Copies `src` into views of a fresh static buffer (aligned), waits, and returns the
/// buffer, the views' ranges and the call's stats.
fn into_statics(
    src: &Vec<Tensor>,
) -> (Tensor, Vec<(usize, usize)>, pinlane::observe::TransferStats) {
    let (dst, buf, ranges) = destinations(src, 0);
    transfer_tensor_h2d_into(src, &dst, &IntoOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    let stats = pinlane::observe::last_transfer_stats().unwrap();
    (buf, ranges, stats)
}
