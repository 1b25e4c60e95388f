//! Safetensors files written byte by byte (the format's spec: an 8-byte length, the JSON
//! header padded with spaces, the tensors back to back), so tests can corrupt any part.

use pinlane::DType;
use std::path::{Path, PathBuf};

/// One tensor to write: name, the file's dtype name, shape, bytes.
#[derive(Clone, Debug)]
pub struct Spec {
    pub name: String,
    pub dtype: &'static str,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

pub const DTYPES: [(&str, usize); 13] = [
    ("BOOL", 1),
    ("U8", 1),
    ("I8", 1),
    ("I16", 2),
    ("U16", 2),
    ("F16", 2),
    ("BF16", 2),
    ("I32", 4),
    ("U32", 4),
    ("F32", 4),
    ("F64", 8),
    ("I64", 8),
    ("U64", 8),
];

pub fn pinlane_dtype(name: &str) -> DType {
    match name {
        "BOOL" => DType::Bool,
        "U8" => DType::U8,
        "I8" => DType::I8,
        "I16" => DType::I16,
        "U16" => DType::U16,
        "F16" => DType::F16,
        "BF16" => DType::Bf16,
        "I32" => DType::I32,
        "U32" => DType::U32,
        "F32" => DType::F32,
        "F64" => DType::F64,
        "I64" => DType::I64,
        "U64" => DType::U64,
        _ => panic!("{name}"),
    }
}

/// The header JSON of `specs`, written back to back in order, with `extra` fields.
pub fn header(specs: &[Spec]) -> String {
    let mut at = 0;
    let mut fields = vec![r#""__metadata__":{"format":"pt"}"#.to_string()];
    for s in specs {
        let end = at + s.bytes.len();
        fields.push(format!(
            r#""{}":{{"dtype":"{}","shape":{:?},"data_offsets":[{at},{end}]}}"#,
            s.name, s.dtype, s.shape
        ));
        at = end;
    }
    format!("{{{}}}", fields.join(","))
}

/// A safetensors file: the 8-byte length, `header` (padded with spaces to a multiple of
/// 8, as the writers do), the data.
pub fn file_bytes(header: &str, specs: &[Spec]) -> Vec<u8> {
    let mut h = header.as_bytes().to_vec();
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    specs.iter().for_each(|s| out.extend_from_slice(&s.bytes));
    out
}

pub fn tmpdir(tag: &str) -> PathBuf {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    let d = std::env::temp_dir().join(format!(
        "pinlane-weights-{}-{tag}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn write(path: &Path, specs: &[Spec]) {
    std::fs::write(path, file_bytes(&header(specs), specs)).unwrap();
}

/// Writes `specs` as `shards` shards with an index; returns the index's path.
pub fn write_sharded(dir: &Path, specs: &[Spec], shards: usize) -> PathBuf {
    let per = specs.len().div_ceil(shards).max(1);
    let mut map = Vec::new();
    for (k, part) in specs.chunks(per).enumerate() {
        let file = format!("model-{:05}-of-{shards:05}.safetensors", k + 1);
        write(&dir.join(&file), part);
        map.extend(part.iter().map(|s| format!(r#""{}":"{file}""#, s.name)));
    }
    let index = dir.join("model.safetensors.index.json");
    std::fs::write(
        &index,
        format!(
            r#"{{"metadata":{{"total_size":0}},"weight_map":{{{}}}}}"#,
            map.join(",")
        ),
    )
    .unwrap();
    index
}

/// `n` tensors `t0`, `t1`, ... of `dtype` (`size` bytes an element), `count` elements
/// each, whose bytes differ from tensor to tensor.
pub fn uniform(n: usize, dtype: &'static str, size: usize, count: usize) -> Vec<Spec> {
    (0..n)
        .map(|i| Spec {
            name: format!("t{i}"),
            dtype,
            shape: vec![count],
            bytes: (0..count * size)
                .map(|k| (k * 7 + i * 13 + k / 251) as u8)
                .collect(),
        })
        .collect()
}

/// `specs` written as one file in a new directory: `(directory, file)`.
pub fn written(tag: &str, specs: &[Spec]) -> (PathBuf, PathBuf) {
    let dir = tmpdir(tag);
    let p = dir.join("m.safetensors");
    write(&p, specs);
    (dir, p)
}
