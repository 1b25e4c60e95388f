//! Safetensors checkpoints loaded onto the simulated device (every machine, CI included):
//! generated checkpoints (one file and sharded, tensors of every dtype and size, some
//! not aligned in the file, groups smaller and larger than the arena) with every byte of
//! every loaded tensor checked against the file; every kind of bad file a typed error
//! before anything is copied; a copy that fails mid-load returns no tensor.
#![cfg(all(feature = "test-util", feature = "weights"))]

mod common;

use common::weights::{
    file_bytes, header, pinlane_dtype, tmpdir, uniform, write, write_sharded, written, Spec, DTYPES,
};

use pinlane::driver::fault::{self, FaultKind};
use pinlane::weights::{load_safetensors, Checkpoint, LoadOptions};
use pinlane::{transfer_tensor_d2h, CheckpointFault, D2hOptions, Error, Tensor};
use proptest::prelude::*;
use std::collections::BTreeMap;

/// One test at a time: `page_locked_memory_stays_the_arenas` reads process-wide pool
/// figures that another test's transfers would move.
fn serial() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// Tensors of every dtype and size (empty, small, larger than the 1 MiB arena), in an
/// order that leaves some unaligned in the file (a 3-byte u8 before an f32).
fn specs() -> impl Strategy<Value = Vec<Spec>> {
    let one = (0..DTYPES.len(), 0usize..5, 0usize..40_000, any::<u64>());
    proptest::collection::vec(one, 1..12).prop_map(|v| {
        v.into_iter()
            .enumerate()
            .map(|(i, (d, rank, n, seed))| {
                let (dtype, size) = DTYPES[d];
                // Mostly small; one in five up to 40_000 elements x 8 bytes.
                let n = if seed % 5 == 0 { n * 9 } else { n % 700 };
                let shape: Vec<usize> = match rank {
                    0 => vec![],
                    1 => vec![n],
                    2 => vec![2, n / 2],
                    3 => vec![n % 3, 5, 1],
                    _ => vec![0, n],
                };
                let count: usize = shape.iter().product();
                let mut bytes: Vec<u8> = (0..count * size)
                    .map(|k| {
                        (seed as usize)
                            .wrapping_mul(31)
                            .wrapping_add(k * 7 + k / 251) as u8
                    })
                    .collect();
                if dtype == "BOOL" {
                    bytes.iter_mut().for_each(|b| *b &= 1);
                }
                Spec {
                    name: format!("layers.{i}.w{}", seed % 97),
                    dtype,
                    shape,
                    bytes,
                }
            })
            .collect()
    })
}

/// The loaded tensors are the specs': names, dtypes, shapes, every byte (read back).
fn check(loaded: &BTreeMap<String, Tensor>, specs: &[Spec]) -> Result<(), TestCaseError> {
    prop_assert_eq!(loaded.len(), specs.len());
    let names: Vec<&String> = loaded.keys().collect();
    let on_host = transfer_tensor_d2h(
        &loaded.values().cloned().collect::<Vec<_>>(),
        &D2hOptions::default(),
    )
    .unwrap();
    for (t, name) in on_host.iter().zip(names) {
        let s = specs.iter().find(|s| &s.name == name).unwrap();
        prop_assert!(
            loaded[name].is_cuda() || s.bytes.is_empty(),
            "{} on the device",
            name
        );
        prop_assert_eq!(t.dtype(), pinlane_dtype(s.dtype));
        prop_assert_eq!(t.dims(), &s.shape[..]);
        prop_assert!(
            t.as_bytes().unwrap() == &s.bytes[..],
            "{}: bytes differ",
            name
        );
    }
    Ok(())
}

fn unique(mut v: Vec<Spec>) -> Vec<Spec> {
    let mut seen = std::collections::HashSet::new();
    v.retain(|s| seen.insert(s.name.clone()));
    v
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// One file and sharded, whole and a chosen subset, eager and streamed in small
    /// groups: every byte as in the file, streams in file order.
    #[test]
    fn checkpoints_load_byte_exact(
        specs in specs(),
        shards in 1usize..4,
        group in prop_oneof![Just(1usize), 1usize..300_000, Just(512usize << 20)],
        pick in any::<u64>(),
    ) {
        common::sim();
        let _serial = serial();
        let specs = unique(specs);
        let dir = tmpdir("ok");
        let path = if shards == 1 {
            let p = dir.join("model.safetensors");
            write(&p, &specs);
            p
        } else {
            write_sharded(&dir, &specs, shards)
        };
        let opts = LoadOptions::default().group_bytes(group);
        let ckpt = Checkpoint::open(&path).unwrap();
        prop_assert_eq!(ckpt.len(), specs.len());
        prop_assert_eq!(ckpt.nbytes(), specs.iter().map(|s| s.bytes.len()).sum::<usize>());
        check(&ckpt.load(&opts).unwrap(), &specs)?;

        // Streamed: in file order, which is the specs' order (shards are written in
        // order) up to empty tensors, which share their offset with the next one.
        let streamed: Vec<(String, Tensor)> =
            ckpt.stream(&opts).unwrap().collect::<pinlane::Result<_>>().unwrap();
        let order: Vec<&str> = streamed.iter().map(|(n, _)| n.as_str()).collect();
        let listed: Vec<&str> = ckpt.tensors().map(|t| t.name).collect();
        prop_assert_eq!(&order, &listed);
        let place = |n: &str| specs.iter().position(|s| s.name == n).unwrap();
        let non_empty: Vec<usize> = order
            .iter()
            .filter(|n| !specs[place(n)].bytes.is_empty())
            .map(|n| place(n))
            .collect();
        prop_assert!(non_empty.windows(2).all(|w| w[0] < w[1]), "not in file order: {:?}", order);
        check(&streamed.into_iter().collect(), &specs)?;

        // A subset, named in any order, some twice.
        let subset: Vec<Spec> = specs
            .iter()
            .enumerate()
            .filter(|(i, _)| pick >> (i % 64) & 1 == 1)
            .map(|(_, s)| s.clone())
            .collect();
        let mut names: Vec<String> = subset.iter().rev().map(|s| s.name.clone()).collect();
        names.extend(subset.first().map(|s| s.name.clone()));
        let loaded = load_safetensors(&path, &opts.clone().names(names)).unwrap();
        check(&loaded, &subset)?;
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

fn sample() -> Vec<Spec> {
    let t = |name: &str, dtype: &'static str, shape: Vec<usize>, size: usize| {
        let n: usize = shape.iter().product::<usize>() * size;
        Spec {
            name: name.into(),
            dtype,
            shape,
            bytes: (0..n)
                .map(|k| (k % 251) as u8 & if dtype == "BOOL" { 1 } else { 255 })
                .collect(),
        }
    };
    vec![
        t("a", "F32", vec![4, 300], 4),
        t("b", "BF16", vec![1000], 2),
        t("c", "BOOL", vec![10], 1),
        t("d", "I64", vec![3, 3], 8),
    ]
}

/// `open`'s error for a file of `bytes`, which must be a checkpoint error of `fault`.
fn open_fails(bytes: &[u8], fault: CheckpointFault) -> String {
    let dir = tmpdir("bad");
    let p = dir.join("bad.safetensors");
    std::fs::write(&p, bytes).unwrap();
    let e = Checkpoint::open(&p).err().expect("a bad file opened");
    std::fs::remove_dir_all(&dir).unwrap();
    match &e {
        Error::Checkpoint { fault: f, path, .. } => {
            assert_eq!(*f, fault, "{e}");
            assert!(path.ends_with("bad.safetensors"), "{e}");
        }
        other => panic!("not a checkpoint error: {other}"),
    }
    e.to_string()
}

#[test]
fn bad_files_are_typed_errors_before_any_copy() {
    common::sim();
    let _serial = serial();
    let specs = sample();
    let good = file_bytes(&header(&specs), &specs);
    let h = header(&specs);
    use CheckpointFault as F;

    // Truncated: in the data, and in the header; a header length past the end; no length.
    open_fails(&good[..good.len() - 1], F::Offsets);
    open_fails(&good[..40], F::Header);
    let mut long = good.clone();
    long[..8].copy_from_slice(&(good.len() as u64).to_le_bytes());
    assert!(open_fails(&long, F::Header).contains("past the end"));
    open_fails(&good[..5], F::Header);
    // Bytes past the last tensor.
    let mut extra = good.clone();
    extra.push(0);
    open_fails(&extra, F::Offsets);
    // Malformed JSON, and JSON that is not a header.
    open_fails(&file_bytes(&h.replace("}}", "}"), &specs), F::Header);
    open_fails(&file_bytes("[1,2]", &specs), F::Header);
    // A range one byte longer than its shape; the last tensor's range past the end of
    // the file (its shape grown to match); overlapping; with a gap.
    let bad_offsets = |from: &str, to: &str| file_bytes(&h.replacen(from, to, 1), &specs);
    open_fails(&bad_offsets("[0,4800]", "[0,4801]"), F::Shape);
    open_fails(
        &file_bytes(
            &h.replace("[3, 3]", "[3, 4]")
                .replace("[6810,6882]", "[6810,6906]"),
            &specs,
        ),
        F::Offsets,
    );
    let e = open_fails(&bad_offsets("[4800,6800]", "[4700,6700]"), F::Offsets);
    assert!(e.contains("tensor \"b\""), "{e}");
    open_fails(&bad_offsets("[4800,6800]", "[4900,6900]"), F::Offsets);
    // A shape that does not match its bytes; an unknown dtype (named).
    open_fails(&bad_offsets("[4, 300]", "[4, 301]"), F::Shape);
    assert!(open_fails(&bad_offsets("\"BF16\"", "\"F9\""), F::Header).contains("F9"));
    // A name given twice at different ranges (the parser's JSON map keeps the last one):
    // the first one's bytes are then a gap, refused, never one of the two picked.
    let twice = open_fails(&bad_offsets("\"b\":", "\"a\":"), F::Offsets);
    assert!(twice.contains("tensor \"a\""), "{twice}");
    // Shapes whose sizes overflow the parser's sums (8 tensors of 2^61 - 1 bytes, offsets
    // contiguous): an error, never a panic (the parser's debug build panics there).
    let huge = (1u64 << 61) - 1;
    let fields: Vec<String> = (0..8u64)
        .map(|i| {
            format!(
                r#""h{i}":{{"dtype":"U8","shape":[{huge}],"data_offsets":[{},{}]}}"#,
                i * huge,
                (i + 1) * huge
            )
        })
        .collect();
    let hostile = file_bytes(&format!("{{{}}}", fields.join(",")), &[]);
    let dir = tmpdir("hostile");
    let p = dir.join("bad.safetensors");
    std::fs::write(&p, &hostile).unwrap();
    let e = Checkpoint::open(&p).err().expect("opened");
    assert!(
        matches!(
            &e,
            Error::Checkpoint {
                fault: F::Header | F::Offsets,
                ..
            }
        ),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
    // A missing file.
    let dir = tmpdir("missing");
    let e = Checkpoint::open(dir.join("none.safetensors"))
        .err()
        .unwrap();
    assert!(matches!(e, Error::Checkpoint { fault: F::Io, .. }), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn dtypes_pinlane_lacks_and_bad_values_name_the_tensor() {
    common::sim();
    let _serial = serial();
    let mut specs = sample();
    specs.push(Spec {
        name: "scale".into(),
        dtype: "F8_E4M3",
        shape: vec![16],
        bytes: vec![7; 16],
    });
    let dir = tmpdir("dtypes");
    let p = dir.join("m.safetensors");
    write(&p, &specs);
    let ckpt = Checkpoint::open(&p).unwrap();
    let info = ckpt.info("scale").unwrap();
    assert_eq!((info.dtype, info.file_dtype.as_str()), (None, "F8_E4M3"));
    let e = ckpt.load(&LoadOptions::default()).unwrap_err();
    assert!(
        matches!(&e, Error::Checkpoint { fault: CheckpointFault::UnsupportedDtype, tensor: Some(t), .. } if t == "scale"),
        "{e}"
    );
    // Left out, the rest loads.
    let rest: Vec<&str> = ["a", "b", "c", "d"].into();
    let loaded = ckpt.load(&LoadOptions::default().names(rest)).unwrap();
    assert_eq!(loaded.len(), 4);
    // Read one tensor to the host (a copy); the float8 one cannot be.
    assert_eq!(
        ckpt.read("b").unwrap().as_bytes().unwrap(),
        &specs[1].bytes[..]
    );
    assert!(matches!(
        ckpt.read("scale"),
        Err(Error::Checkpoint {
            fault: CheckpointFault::UnsupportedDtype,
            ..
        })
    ));
    assert!(matches!(
        ckpt.read("zz"),
        Err(Error::Checkpoint {
            fault: CheckpointFault::Tensor,
            ..
        })
    ));
    // A name it does not hold.
    let e = ckpt
        .load(&LoadOptions::default().names(["a", "zz"]))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Checkpoint { fault: CheckpointFault::Tensor, tensor: Some(t), .. } if t == "zz"),
        "{e}"
    );
    assert!(matches!(
        ckpt.stream(&LoadOptions::default().group_bytes(0))
            .map(drop),
        Err(Error::InvalidOption {
            name: "group_bytes",
            ..
        })
    ));
    // A bool byte that is not 0 or 1.
    let mut specs = sample();
    specs[2].bytes[3] = 2;
    write(&p, &specs);
    let e = load_safetensors(&p, &LoadOptions::default()).unwrap_err();
    assert!(
        matches!(&e, Error::Checkpoint { fault: CheckpointFault::Values, tensor: Some(t), .. } if t == "c"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn bad_indexes_are_typed_errors() {
    common::sim();
    let _serial = serial();
    let specs = sample();
    let dir = tmpdir("index");
    let index = write_sharded(&dir, &specs, 2);
    let good = std::fs::read_to_string(&index).unwrap();
    let fails = |text: &str, fault: CheckpointFault| {
        std::fs::write(&index, text).unwrap();
        let e = Checkpoint::open(&index).err().expect("a bad index opened");
        assert!(
            matches!(&e, Error::Checkpoint { fault: f, .. } if *f == fault),
            "{e}"
        );
        e.to_string()
    };
    use CheckpointFault as F;
    fails("{", F::Index);
    fails(r#"{"metadata":{}}"#, F::Index);
    // An index that names no tensor: broken or half-written, not a model without weights
    // (session 64: it opened as an empty checkpoint).
    assert!(fails(r#"{"weight_map":{}}"#, F::Index).contains("names no tensor"));
    assert!(fails(&good.replace("00002-of", "00009-of"), F::Index).contains("missing"));
    fails(&good.replace(r#""a":"#, r#""zz":"#), F::Tensor);
    // Shards named by absolute paths, climbing out, or spelled with `.`.
    for bad in [
        "/etc/hostname",
        "../model-00001-of-00002.safetensors",
        "./model-00001-of-00002.safetensors",
    ] {
        let text = good.replace(
            r#""a":"model-00001-of-00002.safetensors""#,
            &format!(r#""a":"{bad}""#),
        );
        assert!(fails(&text, F::Index).contains("relative"));
    }
    // A tensor the index puts in the other shard.
    fails(
        &good.replace(r#""a":"model-00001"#, r#""a":"model-00002"#),
        F::Tensor,
    );
    // A name in both shards.
    std::fs::write(&index, &good).unwrap();
    write(&dir.join("model-00002-of-00002.safetensors"), &specs[1..]);
    let e = Checkpoint::open(&index).err().unwrap();
    assert!(
        matches!(
            &e,
            Error::Checkpoint {
                fault: F::Tensor,
                ..
            }
        ),
        "{e}"
    );
    // A name asked for that the checkpoint lacks is reported against the index.
    std::fs::write(&index, &good).unwrap();
    write(&dir.join("model-00002-of-00002.safetensors"), &specs[2..]);
    let e = Checkpoint::open(&index)
        .unwrap()
        .load(&LoadOptions::default().names(["zz"]))
        .unwrap_err();
    assert!(
        matches!(&e, Error::Checkpoint { path, fault: F::Tensor, .. } if path.ends_with("index.json")),
        "{e}"
    );
    // The directory form finds the index.
    write(&dir.join("model-00002-of-00002.safetensors"), &specs[2..]);
    std::fs::write(&index, &good).unwrap();
    let loaded = Checkpoint::open(&dir)
        .unwrap()
        .load(&LoadOptions::default())
        .unwrap();
    assert_eq!(loaded.len(), specs.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What stands in a checkpoint file's place must be a regular file of a sane size: a
/// FIFO (a link in a cloned repository can name one) would block the open for ever, and
/// `/dev/zero` never ends, so both are refused before any read, as is an index of more
/// than 64 MiB.
#[test]
fn files_that_are_not_regular_or_too_large_are_refused() {
    use CheckpointFault as F;
    // Opened on another thread: before the check, a FIFO's open blocked for ever.
    let open_within = |p: std::path::PathBuf| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(Checkpoint::open(&p).err().map(|e| e.to_string()));
        });
        rx.recv_timeout(std::time::Duration::from_secs(10))
            .expect("the open returned")
            .expect("refused")
    };
    let dir = tmpdir("irregular");
    // An index that is a directory, and one that is /dev/zero.
    let index = dir.join("model.safetensors.index.json");
    std::fs::create_dir(&index).unwrap();
    assert!(open_within(dir.clone()).contains("not a regular file"));
    std::fs::remove_dir(&index).unwrap();
    #[cfg(unix)]
    {
        std::os::unix::fs::symlink("/dev/zero", &index).unwrap();
        assert!(open_within(dir.clone()).contains("not a regular file"));
        std::fs::remove_file(&index).unwrap();
        // The single file as a FIFO, named directly and through its directory.
        let single = dir.join("model.safetensors");
        let made = std::process::Command::new("mkfifo").arg(&single).status();
        if made.is_ok_and(|s| s.success()) {
            assert!(open_within(single.clone()).contains("not a regular file"));
            assert!(open_within(dir.clone()).contains("not a regular file"));
            std::fs::remove_file(&single).unwrap();
        }
    }
    // An index of more than 64 MiB (a valid one, padded with spaces past the cap).
    let specs = sample();
    let index = write_sharded(&dir, &specs, 2);
    let mut padded = std::fs::read(&index).unwrap();
    padded.resize((64 << 20) + 1, b' ');
    std::fs::write(&index, &padded).unwrap();
    let e = Checkpoint::open(&index)
        .err()
        .expect("a 64 MiB index opened");
    assert!(
        matches!(
            &e,
            Error::Checkpoint {
                fault: F::Index,
                ..
            }
        ) && e.to_string().contains("64 MiB"),
        "{e}"
    );
    // At the cap exactly it is read (and parsed: trailing spaces are JSON whitespace).
    padded.truncate(64 << 20);
    std::fs::write(&index, &padded).unwrap();
    assert_eq!(Checkpoint::open(&index).unwrap().len(), specs.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An index may spell one shard two ways that name the same file (`sub/x` and `sub//x`,
/// or `sub/./x`): it is one shard, mapped once, not two files holding the same names.
#[test]
fn one_shard_spelled_two_ways_is_one_file() {
    let specs = sample();
    let dir = tmpdir("spelled");
    let index = write_sharded(&dir, &specs, 2);
    let sub = dir.join("sub");
    std::fs::create_dir(&sub).unwrap();
    for k in 1..=2 {
        let f = format!("model-{k:05}-of-00002.safetensors");
        std::fs::rename(dir.join(&f), sub.join(&f)).unwrap();
    }
    let good = std::fs::read_to_string(&index).unwrap();
    let moved = good.replace(r#":"model-"#, r#":"sub/model-"#);
    for other in ["sub//model-", "sub/./model-"] {
        let text = moved.replace(r#""a":"sub/model-"#, &format!(r#""a":"{other}"#));
        assert_ne!(text, moved);
        std::fs::write(&index, &text).unwrap();
        let ckpt = Checkpoint::open(&index).unwrap_or_else(|e| panic!("{other}: {e}"));
        assert_eq!(ckpt.files().len(), 2, "{other}");
        assert_eq!(ckpt.len(), specs.len());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A driver failure at any point of a load (allocation, copy, event) fails the whole
/// load, holds nothing afterwards, and the next load is byte-exact.
#[test]
fn a_failure_mid_load_returns_nothing_and_the_next_load_works() {
    common::sim();
    let _serial = serial();
    std::thread::spawn(|| {
        let specs = uniform(6, "F32", 4, 70_000);
        let (dir, p) = written("fault", &specs);
        let ckpt = Checkpoint::open(&p).unwrap();
        // Groups of two tensors: three transfers, each larger than the 1 MiB arena's slots.
        let opts = LoadOptions::default().group_bytes(600_000);
        let mut fired = 0;
        for kind in [FaultKind::Alloc, FaultKind::Copy, FaultKind::EventRecord] {
            for nth in 1..40 {
                fault::inject(kind, nth);
                let r = ckpt.load(&opts);
                if fault::armed() {
                    fault::clear();
                    break;
                }
                fired += 1;
                assert!(
                    r.is_err(),
                    "{kind:?} #{nth}: a fault, yet tensors came back"
                );
                let loaded = ckpt.load(&opts).unwrap();
                if let Err(e) = check(&loaded, &specs) {
                    panic!("{kind:?} #{nth}: the next load: {e}");
                }
            }
        }
        assert!(fired >= 3, "faults fired: {fired}");
        assert_eq!(pinlane::memory_stats().retained_bytes, 0);
        std::fs::remove_dir_all(&dir).unwrap();
    })
    .join()
    .unwrap();
}

/// The load holds no page-locked memory beyond the staging arena's: a checkpoint four
/// times the arena's size, streamed, registers no host memory at any point (the mapping
/// is never page-locked), allocates no page-locked memory beyond the arena's, and leaves
/// the page-locked output pool as it was.
#[test]
fn page_locked_memory_stays_the_arenas() {
    common::sim();
    let _serial = serial();
    let specs = uniform(4, "U8", 1, 1 << 20);
    let (dir, p) = written("pinned", &specs);
    let sim = pinlane::driver::sim::registered_bytes;
    let allocated = || pinlane::driver::sim::page_locked_bytes().unwrap();
    // The arena exists first (a plain transfer), so what follows is the load's alone.
    let _ = pinlane::transfer_tensor_h2d(&vec![
        Tensor::from_vec(vec![0u8; 3 << 20], [3 << 20]).unwrap()
    ])
    .unwrap();
    let (before, registered) = (pinlane::memory_stats(), sim().unwrap());
    let (allocated_before, mut most) = (allocated(), 0);
    let mut n = 0;
    for item in Checkpoint::open(&p)
        .unwrap()
        .stream(&LoadOptions::default().group_bytes(1))
        .unwrap()
    {
        item.unwrap();
        n += 1;
        assert_eq!(
            sim().unwrap(),
            registered,
            "host memory registered during the load"
        );
        most = most.max(allocated());
    }
    let after = pinlane::memory_stats();
    assert_eq!(n, 4);
    // The simulated runtime's arena is 1 MiB (tests/common), grown as slots are used.
    assert!(
        after.staging.held_bytes <= 1 << 20
            && after.staging.held_bytes >= before.staging.held_bytes,
        "{} then {}",
        before.staging.held_bytes,
        after.staging.held_bytes
    );
    // Page-locked bytes may grow only by the arena's growth up to its 1 MiB cap.
    let arena_room = (1usize << 20).saturating_sub(before.staging.held_bytes);
    assert!(
        most <= allocated_before + arena_room,
        "page-locked bytes {allocated_before} then up to {most} (arena room {arena_room})"
    );
    assert_eq!(
        after.pinned_outputs.held_bytes,
        before.pinned_outputs.held_bytes
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A stream that meets a failure part way: the tensors it yielded before are complete and
/// exact, then the error, then nothing; and a stream dropped part way leaves nothing
/// behind (the next load is exact).
#[test]
fn a_stream_stops_at_its_first_error_and_may_be_dropped_part_way() {
    common::sim();
    let _serial = serial();
    std::thread::spawn(|| {
        let specs = uniform(6, "I32", 4, 50_000);
        let (dir, p) = written("stream", &specs);
        let ckpt = Checkpoint::open(&p).unwrap();
        // One tensor a group: six transfers.
        let opts = LoadOptions::default().group_bytes(1);
        let mut saw_partial = false;
        for nth in 1..40 {
            fault::inject(FaultKind::Copy, nth);
            let mut good = BTreeMap::new();
            let mut stream = ckpt.stream(&opts).unwrap();
            let mut failed = false;
            for item in stream.by_ref() {
                match item {
                    Ok((n, t)) => {
                        assert!(!failed);
                        good.insert(n, t);
                    }
                    Err(e) => {
                        assert!(!failed, "two errors");
                        assert!(format!("{e}").to_lowercase().contains("inject"), "{e}");
                        failed = true;
                    }
                }
            }
            assert!(stream.next().is_none(), "after the end, nothing");
            let armed = fault::armed();
            fault::clear();
            if armed {
                assert!(!failed && good.len() == 6);
                break;
            }
            assert!(failed, "#{nth}: the fault fired, and no error came");
            saw_partial |= !good.is_empty();
            let want: Vec<Spec> = specs
                .iter()
                .filter(|s| good.contains_key(&s.name))
                .cloned()
                .collect();
            if let Err(e) = check(&good, &want) {
                panic!("#{nth}: what came before the error: {e}");
            }
        }
        assert!(saw_partial, "no fault fell after the first group");
        // Dropped after its first tensor.
        let mut s = ckpt.stream(&opts).unwrap();
        let first = s.next().unwrap().unwrap();
        assert_eq!(first.0, "t0");
        drop(s);
        let all = ckpt.load(&opts).unwrap();
        if let Err(e) = check(&all, &specs) {
            panic!("after a dropped stream: {e}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    })
    .join()
    .unwrap();
}

/// A file written in place after `open` (a re-save of the same model) is refused by the
/// next load and read, with nothing handed out, and loads right once opened again. Before
/// (session 64, a review's finding), the load returned the new bytes read as the old
/// header said, as `Ok`.
#[test]
fn a_file_written_since_it_was_opened_is_refused() {
    common::sim();
    let _serial = serial();
    std::thread::spawn(|| {
        let specs = sample();
        let (dir, p) = written("changed", &specs);
        let ckpt = Checkpoint::open(&p).unwrap();
        check(&ckpt.load(&LoadOptions::default()).unwrap(), &specs).unwrap();
        // The same layout, other values (bool bytes stay 0 or 1).
        let mut other = specs.clone();
        for s in &mut other {
            for b in &mut s.bytes {
                *b = if s.dtype == "BOOL" {
                    1 - *b
                } else {
                    b.wrapping_add(1)
                };
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20)); // a later modification time
        write(&p, &other);
        let changed = |e: Error| {
            matches!(&e, Error::Checkpoint { fault: CheckpointFault::Io, reason, .. }
                if reason.contains("changed since"))
                || panic!("expected the file changed, got {e}")
        };
        assert!(changed(ckpt.load(&LoadOptions::default()).unwrap_err()));
        assert!(changed(ckpt.read("a").unwrap_err()));
        let fresh = Checkpoint::open(&p).unwrap();
        check(&fresh.load(&LoadOptions::default()).unwrap(), &other).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    })
    .join()
    .unwrap();
}
