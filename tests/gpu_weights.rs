//! GPU: safetensors checkpoints (issue 22) loaded onto the real device: one file and
//! sharded, tensors of every dtype (some not aligned in the file, one larger than a
//! staging slot), eager and streamed in small groups, every byte read back and compared
//! with the file.
#![cfg(feature = "weights")]

mod common;

use common::weights::{pinlane_dtype, tmpdir, write, write_sharded, Spec, DTYPES};
use pinlane::weights::{load_safetensors, Checkpoint, LoadOptions};
use pinlane::{transfer_tensor_d2h, D2hOptions, Tensor};

fn specs() -> Vec<Spec> {
    let mut v: Vec<Spec> = DTYPES
        .iter()
        .enumerate()
        .map(|(i, &(dtype, size))| {
            // Odd counts: the next tensor starts unaligned for its dtype in the file.
            let n = 1 + i * 37;
            Spec {
                name: format!("t{i}.{dtype}"),
                dtype,
                shape: vec![n],
                bytes: (0..n * size)
                    .map(|k| (k * 13 + i) as u8 & if dtype == "BOOL" { 1 } else { 255 })
                    .collect(),
            }
        })
        .collect();
    v.push(Spec {
        name: "big".into(),
        dtype: "F32",
        shape: vec![6 << 20],
        bytes: (0..24usize << 20).map(|k| (k ^ k >> 11) as u8).collect(),
    });
    v
}

fn check(loaded: &[(String, Tensor)], specs: &[Spec]) {
    assert_eq!(loaded.len(), specs.len());
    let ts: Vec<Tensor> = loaded.iter().map(|(_, t)| t.clone()).collect();
    assert!(ts.iter().all(Tensor::is_cuda));
    let back = transfer_tensor_d2h(&ts, &D2hOptions::default()).unwrap();
    for ((name, _), t) in loaded.iter().zip(&back) {
        let s = specs.iter().find(|s| &s.name == name).unwrap();
        assert_eq!(t.dtype(), pinlane_dtype(s.dtype), "{name}");
        assert_eq!(t.dims(), &s.shape[..], "{name}");
        assert!(
            t.as_bytes().unwrap() == &s.bytes[..],
            "{name}: bytes differ"
        );
    }
}

#[test]
fn checkpoints_load_byte_exact_on_the_device() {
    require_gpu!();
    let specs = specs();
    let dir = tmpdir("gpu");
    let one = dir.join("model.safetensors");
    write(&one, &specs);
    let sharded = tmpdir("gpu-sharded");
    write_sharded(&sharded, &specs, 3);
    for path in [one.clone(), sharded.clone()] {
        for group in [1usize, 3 << 20, 512 << 20] {
            let opts = LoadOptions::default().group_bytes(group);
            let ckpt = Checkpoint::open(&path).unwrap();
            let streamed: Vec<(String, Tensor)> = ckpt
                .stream(&opts)
                .unwrap()
                .collect::<pinlane::Result<_>>()
                .unwrap();
            check(&streamed, &specs);
            let eager: Vec<(String, Tensor)> = load_safetensors(&path, &opts)
                .unwrap()
                .into_iter()
                .collect();
            check(&eager, &specs);
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&sharded).unwrap();
}
