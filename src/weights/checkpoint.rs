//! Opening a checkpoint: its files mapped, every header parsed and checked (by the
//! `safetensors` crate) before anything is copied, and its tensors listed in file order.

use crate::dtype::DType;
use crate::error::{CheckpointFault, Error, Result};
use crate::memory::MappedFile;
use safetensors::{Dtype, SafeTensorError, SafeTensors};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The index file of a sharded checkpoint, looked for in a directory first.
const INDEX: &str = "model.safetensors.index.json";
/// The single file of an unsharded checkpoint, looked for in a directory next.
const SINGLE: &str = "model.safetensors";

/// A safetensors checkpoint, one file or several shards, opened and checked: every
/// header parsed, every tensor's offsets and shape validated, before anything is copied.
/// Opening reads only the headers; the tensors' bytes are read when they are loaded
/// ([`Checkpoint::load`], [`Checkpoint::stream`]).
///
/// ```no_run
/// use pinlane::weights::{Checkpoint, LoadOptions};
/// # fn main() -> pinlane::Result<()> {
/// let ckpt = Checkpoint::open("model/")?; // model.safetensors(.index.json) inside
/// for t in ckpt.tensors().take(3) {
///     println!("{} {:?} {:?}", t.name, t.dtype, t.shape);
/// }
/// let weights = ckpt.load(&LoadOptions::default())?; // name -> device tensor
/// # Ok(()) }
/// ```
pub struct Checkpoint {
    /// What was opened (the file, the index, or the directory), for errors about the
    /// whole checkpoint.
    source: PathBuf,
    pub(super) shards: Vec<Shard>,
    /// Every tensor, by shard, then by offset in it (the order loads read them).
    pub(super) entries: Vec<Entry>,
    by_name: HashMap<String, usize>,
}

/// One file of a checkpoint, mapped.
#[derive(Clone)]
pub(super) struct Shard {
    pub(super) path: PathBuf,
    pub(super) map: Arc<MappedFile>,
}

/// One tensor of a checkpoint.
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) shard: usize,
    /// The tensor's first byte, from the start of its file.
    pub(super) at: usize,
    pub(super) nbytes: usize,
    pub(super) dtype: Dtype,
    pub(super) shape: Vec<usize>,
}

/// What a checkpoint holds under one name ([`Checkpoint::tensors`], [`Checkpoint::info`]).
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct TensorInfo<'a> {
    /// The tensor's name.
    pub name: &'a str,
    /// Its dtype, `None` where pinlane has none for the file's (float8, float4, complex);
    /// loading such a tensor is an [`Error::Checkpoint`] naming it.
    pub dtype: Option<DType>,
    /// The dtype as the file names it (`"BF16"`, `"F8_E4M3"`, ...).
    pub file_dtype: String,
    /// Its shape.
    pub shape: &'a [usize],
    /// Its size in bytes.
    pub nbytes: usize,
    /// The file that holds it.
    pub file: &'a Path,
}

impl Checkpoint {
    /// Opens a checkpoint: a `.safetensors` file; the index of a sharded one (a `.json`
    /// file such as `model.safetensors.index.json`, whose `weight_map` names the shards,
    /// relative to its directory); or a directory holding `model.safetensors.index.json`
    /// or `model.safetensors`. Every tensor of every shard the index names is the
    /// checkpoint's, as when transformers loads the shards (a shard may hold tensors the
    /// `weight_map` does not list).
    ///
    /// Every shard is mapped (read-only) and its header checked here, so that a bad file
    /// fails before anything is copied. The files must not be truncated while a load
    /// reads them: as for every loader that maps files, that makes the read fault.
    ///
    /// # Errors
    /// [`Error::Checkpoint`], with the file, the tensor where one is at fault, and a
    /// [`CheckpointFault`]: a missing or unreadable file, or one that is not a regular
    /// file (a directory, FIFO or device in its place); a truncated file or a header
    /// length past its end; a header that is not the JSON safetensors writes (an unknown
    /// dtype, too); offsets out of range, overlapping, out of order or not covering the
    /// file; a shape that does not match its bytes; an index that is malformed, larger
    /// than 64 MiB, names a missing shard or a tensor its shard lacks; a name in two
    /// shards.
    pub fn open(path: impl AsRef<Path>) -> Result<Checkpoint> {
        let path = path.as_ref();
        if path.is_dir() {
            let index = path.join(INDEX);
            if index.exists() {
                Checkpoint::open_index(path, &index)
            } else {
                Checkpoint::from_files(path, vec![path.join(SINGLE)])
            }
        } else if path.extension().is_some_and(|e| e == "json") {
            Checkpoint::open_index(path, path)
        } else {
            Checkpoint::from_files(path, vec![path.to_path_buf()])
        }
    }

    /// Every tensor, in the order loads read them (by shard, then by place in the file).
    pub fn tensors(&self) -> impl ExactSizeIterator<Item = TensorInfo<'_>> + '_ {
        self.entries.iter().map(|e| self.describe(e))
    }

    /// The tensor named `name`, if the checkpoint holds one.
    pub fn info(&self, name: &str) -> Option<TensorInfo<'_>> {
        self.by_name
            .get(name)
            .map(|&k| self.describe(&self.entries[k]))
    }

    /// How many tensors the checkpoint holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The bytes of all its tensors.
    pub fn nbytes(&self) -> usize {
        self.entries.iter().map(|e| e.nbytes).sum()
    }

    /// The files it reads, in order.
    pub fn files(&self) -> impl ExactSizeIterator<Item = &Path> + '_ {
        self.shards.iter().map(|s| s.path.as_path())
    }

    fn describe<'a>(&'a self, e: &'a Entry) -> TensorInfo<'a> {
        TensorInfo {
            name: &e.name,
            dtype: dtype_of(e.dtype),
            file_dtype: e.dtype.to_string(),
            shape: &e.shape,
            nbytes: e.nbytes,
            file: &self.shards[e.shard].path,
        }
    }

    pub(super) fn index_of(&self, name: &str) -> Option<usize> {
        self.by_name.get(name).copied()
    }

    /// The error for a name the checkpoint does not hold.
    pub(super) fn missing(&self, name: &str) -> Error {
        fault(
            &self.source,
            Some(name),
            CheckpointFault::Tensor,
            "the checkpoint holds no tensor of this name".into(),
        )
    }

    /// A sharded checkpoint: the shards its index names (each once, in name order), every
    /// name in the index checked to be in the shard it names. `source`: what was opened.
    fn open_index(source: &Path, index: &Path) -> Result<Checkpoint> {
        let fail = |reason: String| fault(index, None, CheckpointFault::Index, reason);
        let text = read_index(index)?;
        let json: serde_json::Value =
            serde_json::from_slice(&text).map_err(|e| fail(format!("not JSON: {e}")))?;
        let map = json
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| fail("no \"weight_map\" object".into()))?;
        if map.is_empty() {
            // A broken or half-written index, not a model without weights (session 64:
            // it loaded as an empty checkpoint).
            return Err(fail("its \"weight_map\" names no tensor".into()));
        }
        let dir = index.parent().unwrap_or(Path::new("."));
        let mut wanted: Vec<(&str, &str)> = Vec::with_capacity(map.len());
        for (name, file) in map {
            let file = file
                .as_str()
                .ok_or_else(|| fail(format!("tensor {name:?} maps to {file}, not a file name")))?;
            // Shards are files beside the index (or below it): never an absolute path or
            // one that climbs out (no `..`, and no leading `.`; a `.` or `//` inside is
            // normalised away by `components`, and the shards are deduplicated as paths).
            let plain = Path::new(file)
                .components()
                .all(|c| matches!(c, std::path::Component::Normal(_)));
            if !plain || file.is_empty() {
                return Err(fail(format!(
                    "tensor {name:?} maps to {file:?}, not a path relative to the index's directory"
                )));
            }
            wanted.push((name, file));
        }
        // One shard per file, however the index spells it (`sub/x`, `sub//x` and `sub/./x`
        // are one path: paths compare and order by their components).
        let mut paths: Vec<PathBuf> = wanted.iter().map(|&(_, f)| dir.join(f)).collect();
        paths.sort_unstable();
        paths.dedup();
        for p in &paths {
            if !p.is_file() {
                return Err(fail(format!("its shard {} is missing", p.display())));
            }
        }
        let ckpt = Checkpoint::from_files(source, paths)?;
        for (name, file) in wanted {
            let held = ckpt
                .by_name
                .get(name)
                .map(|&k| &ckpt.shards[ckpt.entries[k].shard].path);
            if held.is_none_or(|p| p != &dir.join(file)) {
                return Err(fault(
                    index,
                    Some(name),
                    CheckpointFault::Tensor,
                    format!("the index puts it in {file}, which does not hold it"),
                ));
            }
        }
        Ok(ckpt)
    }

    /// The checkpoint of `paths` (every header checked); `source`: what was opened.
    fn from_files(source: &Path, paths: Vec<PathBuf>) -> Result<Checkpoint> {
        let mut shards = Vec::with_capacity(paths.len());
        let mut entries = Vec::new();
        for path in paths {
            let map = MappedFile::open(&path)
                .map_err(|e| fault(&path, None, CheckpointFault::Io, e.to_string()))?;
            // The parser is the `safetensors` crate's; a header crafted to overflow its
            // arithmetic panics there in debug builds (release wraps, and reports the file
            // as not covered): a panic is this file's fault, not the caller's.
            let parsed = std::panic::catch_unwind(|| SafeTensors::read_metadata(map.bytes()))
                .map_err(|_| {
                    fault(
                        &path,
                        None,
                        CheckpointFault::Header,
                        "the header's shapes or offsets overflow".into(),
                    )
                })?;
            let (n, meta) = parsed.map_err(|e| from_st(&path, e))?;
            // Header length and 8 (its own size): read_metadata checked that this, plus
            // the data, is the file's size.
            let base = n + 8;
            let shard = shards.len();
            let mut these: Vec<Entry> = meta
                .tensors()
                .into_iter()
                .map(|(name, info)| Entry {
                    name,
                    shard,
                    at: base + info.data_offsets.0,
                    nbytes: info.data_offsets.1 - info.data_offsets.0,
                    dtype: info.dtype,
                    shape: info.shape.clone(),
                })
                .collect();
            // File order; an empty tensor shares its offset with the next one, and comes
            // first (names break ties, so the order is the same every time).
            these
                .sort_unstable_by(|a, b| (a.at, a.nbytes, &a.name).cmp(&(b.at, b.nbytes, &b.name)));
            entries.extend(these);
            shards.push(Shard { path, map });
        }
        let mut by_name = HashMap::with_capacity(entries.len());
        for (k, e) in entries.iter().enumerate() {
            if let Some(first) = by_name.insert(e.name.clone(), k) {
                let other = &shards[entries[first].shard].path;
                return Err(fault(
                    &shards[e.shard].path,
                    Some(&e.name),
                    CheckpointFault::Tensor,
                    format!("also held by {}", other.display()),
                ));
            }
        }
        Ok(Checkpoint {
            source: source.to_path_buf(),
            shards,
            entries,
            by_name,
        })
    }
}

impl Shard {
    /// `Ok` if the file is as it was when the checkpoint was opened (its header was
    /// checked then): else [`CheckpointFault::Io`], since a file written in place since
    /// would be read at the old offsets, as the old dtypes and shapes.
    pub(super) fn unchanged(&self) -> Result<()> {
        if self.map.changed() {
            return Err(fault(
                &self.path,
                None,
                CheckpointFault::Io,
                "the file changed since the checkpoint was opened (its header was checked \
                 then): open it again"
                    .into(),
            ));
        }
        Ok(())
    }
}

/// The most bytes an index file may hold: the largest models' indexes are a few MiB (a
/// name and a shard's name per tensor).
const INDEX_MAX_BYTES: u64 = 64 << 20;

/// The bytes of the index file `index`: a regular file of at most [`INDEX_MAX_BYTES`]
/// (a link to `/dev/zero` in a cloned repository would otherwise be read until memory
/// ran out).
fn read_index(index: &Path) -> Result<Vec<u8>> {
    use std::io::Read;
    let io = |e: std::io::Error| fault(index, None, CheckpointFault::Io, e.to_string());
    let file = crate::memory::open_regular(index).map_err(io)?;
    let mut text = Vec::new();
    file.take(INDEX_MAX_BYTES + 1)
        .read_to_end(&mut text)
        .map_err(io)?;
    if text.len() as u64 > INDEX_MAX_BYTES {
        return Err(fault(
            index,
            None,
            CheckpointFault::Index,
            format!(
                "larger than {} MiB: not an index of tensor names",
                INDEX_MAX_BYTES >> 20
            ),
        ));
    }
    Ok(text)
}

/// pinlane's dtype for a file's, if it has one.
pub(super) fn dtype_of(d: Dtype) -> Option<DType> {
    Some(match d {
        Dtype::BOOL => DType::Bool,
        Dtype::U8 => DType::U8,
        Dtype::I8 => DType::I8,
        Dtype::I16 => DType::I16,
        Dtype::U16 => DType::U16,
        Dtype::F16 => DType::F16,
        Dtype::BF16 => DType::Bf16,
        Dtype::I32 => DType::I32,
        Dtype::U32 => DType::U32,
        Dtype::F32 => DType::F32,
        Dtype::F64 => DType::F64,
        Dtype::I64 => DType::I64,
        Dtype::U64 => DType::U64,
        _ => return None,
    })
}

pub(super) fn fault(
    path: &Path,
    tensor: Option<&str>,
    fault: CheckpointFault,
    reason: String,
) -> Error {
    Error::Checkpoint {
        path: path.display().to_string(),
        tensor: tensor.map(str::to_string),
        fault,
        reason,
    }
}

/// A `safetensors` error as pinlane's.
fn from_st(path: &Path, e: SafeTensorError) -> Error {
    use CheckpointFault as F;
    let (kind, tensor) = match &e {
        SafeTensorError::InvalidOffset(name) => (F::Offsets, Some(name.as_str())),
        SafeTensorError::MetadataIncompleteBuffer => (F::Offsets, None),
        SafeTensorError::TensorInvalidInfo
        | SafeTensorError::ValidationOverflow
        | SafeTensorError::MisalignedSlice
        | SafeTensorError::InvalidTensorView(..) => (F::Shape, None),
        SafeTensorError::TensorNotFound(name) => (F::Tensor, Some(name.as_str())),
        SafeTensorError::IoError(_) => (F::Io, None),
        _ => (F::Header, None),
    };
    let reason = match &e {
        SafeTensorError::MetadataIncompleteBuffer => {
            "the tensors' offsets do not cover the file's data exactly (truncated, or bytes \
             past the last tensor)"
                .to_string()
        }
        SafeTensorError::InvalidHeaderLength => {
            "the header's length runs past the end of the file".to_string()
        }
        SafeTensorError::HeaderTooSmall => "shorter than the 8-byte header length".to_string(),
        SafeTensorError::InvalidOffset(_) => {
            "its offsets overlap another tensor's, leave a gap, or are out of order".to_string()
        }
        SafeTensorError::TensorInvalidInfo => {
            "a tensor's shape and dtype do not match its byte range".to_string()
        }
        _ => e.to_string(),
    };
    fault(path, tensor, kind, reason)
}
