//! Loading a checkpoint's tensors onto a device: in groups of about
//! [`LoadOptions::group_bytes`], each one `transfer_tensor_h2d_async` of host tensors over
//! the mapped files, the next group staged while the previous one's last copies run.

use super::checkpoint::{dtype_of, fault, Checkpoint, Shard};
use crate::device::DeviceSpec;
use crate::driver::Stream;
use crate::dtype::DType;
use crate::engine::{transfer_tensor_h2d_async, H2dOptions, Transfer};
use crate::error::{CheckpointFault, Error, Result};
use crate::layout::Shape;
use crate::memory::MappedRange;
use crate::tensor::Tensor;
use std::collections::{BTreeMap, VecDeque};

/// Options of a load ([`Checkpoint::load`], [`Checkpoint::stream`], [`load_safetensors`](super::load_safetensors)).
///
/// ```
/// use pinlane::weights::LoadOptions;
/// use pinlane::Device;
/// let opts = LoadOptions::default()
///     .device(Device::cuda(0))
///     .names(["embed.weight", "lm_head.weight"]);
/// assert_eq!(opts.group_bytes, 512 << 20);
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct LoadOptions {
    /// The device to load onto (default `cuda:{LOCAL_RANK}`).
    pub device: DeviceSpec,
    /// Only these tensors (each must be in the checkpoint); `None`: every tensor.
    pub names: Option<Vec<String>>,
    /// The stream on which the loaded tensors' memory is freed when their last owner
    /// drops, as [`H2dOptions::consumer_stream`]; `None`: the legacy default stream.
    pub consumer_stream: Option<Stream>,
    /// [`Checkpoint::stream`] copies tensors in groups of about this many bytes (default
    /// 512 MiB; a larger tensor is a group of its own): each group is one device
    /// allocation, handed out as soon as it is on the device. ([`Checkpoint::load`]
    /// copies everything as one group.)
    pub group_bytes: usize,
}

impl Default for LoadOptions {
    fn default() -> Self {
        LoadOptions {
            device: DeviceSpec::LocalRank,
            names: None,
            consumer_stream: None,
            group_bytes: 512 << 20,
        }
    }
}

impl LoadOptions {
    /// Sets [`LoadOptions::device`].
    pub fn device(mut self, d: impl Into<DeviceSpec>) -> Self {
        self.device = d.into();
        self
    }

    /// Sets [`LoadOptions::names`].
    pub fn names<S: Into<String>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.names = Some(names.into_iter().map(Into::into).collect());
        self
    }

    /// Sets [`LoadOptions::consumer_stream`].
    pub fn consumer_stream(mut self, s: Stream) -> Self {
        self.consumer_stream = Some(s);
        self
    }

    /// Sets [`LoadOptions::group_bytes`].
    pub fn group_bytes(mut self, n: usize) -> Self {
        self.group_bytes = n;
        self
    }

    fn h2d(&self) -> H2dOptions {
        // num_caches 0: the weights belong to the caller alone; the thread's cache ring
        // must not keep gigabytes alive after the caller lets them go.
        let o = H2dOptions::default()
            .device(self.device.clone())
            .num_caches(0);
        match &self.consumer_stream {
            Some(s) => o.consumer_stream(s.clone()),
            None => o,
        }
    }
}

/// One group: its tensors as they are in the mapped files, and their names.
#[derive(Default)]
struct Group {
    names: Vec<String>,
    parts: Vec<Part>,
    bytes: usize,
}

/// A tensor of a group: a host tensor over the mapped file or, where the file does not
/// align it for its dtype (rare: the safetensors writers align every tensor), its range
/// of the file, copied into a host tensor only when its group is queued. (Copied when the
/// load started, every unaligned tensor of the checkpoint was held in memory from the
/// first group to its own: a stream holds no more than the groups in flight now.)
enum Part {
    Mapped(Tensor),
    Unaligned {
        range: MappedRange,
        dtype: DType,
        shape: Shape,
    },
}

impl Part {
    /// The host tensor to copy from: the mapped one, or a copy of the unaligned range.
    /// The copy cannot fail in practice: its shape was checked against the same range
    /// when the part was made, and a dtype of one byte (bool, whose values `from_bytes`
    /// checks) is never unaligned.
    fn tensor(self) -> Result<Tensor> {
        match self {
            Part::Mapped(t) => Ok(t),
            Part::Unaligned {
                range,
                dtype,
                shape,
            } => Tensor::from_bytes(dtype, shape, range.as_ref()),
        }
    }
}

/// A group whose copies are queued: its names, its bytes, and the transfer's handle.
struct Moving {
    names: Vec<String>,
    bytes: usize,
    transfer: Transfer<Vec<Tensor>>,
}

/// A load in progress ([`Checkpoint::stream`]): yields each tensor, with its name, once
/// its bytes are on the device, in file order. After an error it yields nothing more;
/// tensors yielded before it are complete and correct. Dropping it early is safe (copies
/// in flight finish on their own; pinlane keeps what they use until then).
#[must_use = "a load copies only as it is iterated"]
pub struct Loading {
    groups: VecDeque<Group>,
    /// The group whose copies were last queued.
    moving: Option<Moving>,
    ready: VecDeque<(String, Tensor)>,
    opts: H2dOptions,
    done: bool,
    /// The files the load reads: each checked unchanged after a group lands, before its
    /// tensors are handed out.
    files: Vec<Shard>,
}

impl Iterator for Loading {
    type Item = Result<(String, Tensor)>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(t) = self.ready.pop_front() {
                return Some(Ok(t));
            }
            if self.done {
                return None;
            }
            // A group already done (or failed while its copies were queued) is taken
            // first: a failure then stops the load before another group is queued.
            if self.moving.as_ref().is_some_and(|m| m.transfer.is_ready()) {
                if let Err(e) = self.land() {
                    return self.fail(e);
                }
                continue;
            }
            // Queue the next group before waiting for the last one: its staging (host
            // copies) runs while the device finishes the last one's copies.
            let Some(g) = self.groups.pop_front() else {
                if self.moving.is_none() {
                    self.done = true;
                } else if let Err(e) = self.land() {
                    return self.fail(e);
                }
                continue;
            };
            let tensors = match g.parts.into_iter().map(Part::tensor).collect() {
                Ok(ts) => ts,
                Err(e) => return self.fail(e),
            };
            let queued = match transfer_tensor_h2d_async(&tensors, &self.opts) {
                Ok(transfer) => Moving {
                    names: g.names,
                    bytes: g.bytes,
                    transfer,
                },
                Err(e) => return self.fail(e),
            };
            let landed = self.land();
            self.moving = Some(queued);
            if let Err(e) = landed {
                return self.fail(e);
            }
        }
    }
}

/// Waits for a group's copies as a blocking transfer waits for its own: up to
/// [`Config::sync_wait`](crate::Config::sync_wait) when it is set (then
/// [`Error::SyncTimeout`], the group's memory kept until its copies finish), else for as
/// long as the device takes.
fn wait(mut t: Transfer<Vec<Tensor>>) -> Result<Vec<Tensor>> {
    match crate::memory::waits::sync_wait() {
        None => t.wait(),
        Some(limit) => t.wait_timeout(limit).unwrap_or(Err(Error::SyncTimeout {
            waited_ms: u64::try_from(limit.as_millis()).unwrap_or(u64::MAX),
        })),
    }
}

impl Loading {
    /// Waits for the queued group, if any, and makes its tensors ready to hand out.
    fn land(&mut self) -> Result<()> {
        if let Some(m) = self.moving.take() {
            let ts = wait(m.transfer)?;
            // A file written since the load began: these bytes may be the new ones, read
            // as the old header said (session 64: handed out as they were).
            self.files.iter().try_for_each(Shard::unchanged)?;
            self.ready.extend(m.names.into_iter().zip(ts));
        }
        Ok(())
    }

    fn fail(&mut self, e: Error) -> Option<Result<(String, Tensor)>> {
        self.done = true;
        self.groups.clear();
        self.moving = None;
        self.ready.clear();
        Some(Err(e))
    }

    /// Bytes still to be handed out (queued or not yet read).
    pub fn remaining_bytes(&self) -> usize {
        self.groups.iter().map(|g| g.bytes).sum::<usize>()
            + self.moving.as_ref().map_or(0, |m| m.bytes)
            + self.ready.iter().map(|(_, t)| t.nbytes()).sum::<usize>()
    }
}

impl Checkpoint {
    /// Loads the tensors onto the device and returns them by name, each a device tensor
    /// whose bytes are there when this returns (the host has waited: usable from any
    /// stream). Reads the files through the staging ring, whose page-locked memory
    /// bounds what the load holds (as for any transfer), in file order. The tensors are
    /// copied as one group (one transfer, one device allocation; `group_bytes` is for
    /// [`Checkpoint::stream`]): a process's first load then grows the device pool once,
    /// not once a group (measured on the H200: 10 to 12 ms each time).
    /// Without CUDA the tensors are host tensors over the mapped files (the transfer
    /// calls' pass-through).
    ///
    /// # Errors
    /// As [`Checkpoint::stream`], and any failure while copying (a driver error,
    /// [`Error::StagingExhausted`], [`Error::SyncTimeout`] when
    /// [`Config::sync_wait`](crate::Config::sync_wait) is set and a group's copies outlast
    /// it): no tensor is returned.
    pub fn load(&self, opts: &LoadOptions) -> Result<BTreeMap<String, Tensor>> {
        self.stream(&opts.clone().group_bytes(usize::MAX))?
            .collect()
    }

    /// Starts a load that hands each tensor out as soon as it is on the device, in file
    /// order (shard by shard), so that a server can place the first layers while the
    /// rest arrive. Tensors are copied in groups of about [`LoadOptions::group_bytes`];
    /// a group's tensors come out together, once the group's copies are done; the next
    /// group's copies are queued before then. Tensors are read in place from the mapped
    /// files; one the file does not align for its dtype (rare: the safetensors writers
    /// align every tensor) is copied into memory when its group is queued, not before.
    ///
    /// # Errors
    /// Before anything is copied: [`Error::Checkpoint`] for a file written since the
    /// checkpoint was opened ([`CheckpointFault::Io`]; also after a group's copies, for
    /// one written during the load), for a name in
    /// [`LoadOptions::names`] the checkpoint does not hold
    /// ([`CheckpointFault::Tensor`]), a chosen tensor of a dtype pinlane lacks
    /// ([`CheckpointFault::UnsupportedDtype`]) or of bytes its dtype forbids
    /// ([`CheckpointFault::Values`]); [`Error::InvalidOption`] for a `group_bytes` of 0.
    /// The device is resolved by the first group's transfer: a device that does not
    /// exist (or a `LOCAL_RANK` that names none) is the first `next()`'s error.
    pub fn stream(&self, opts: &LoadOptions) -> Result<Loading> {
        if opts.group_bytes == 0 {
            return Err(Error::InvalidOption {
                name: "group_bytes",
                reason: "0: a group holds at least one byte".into(),
            });
        }
        let chosen = self.chosen(opts.names.as_deref())?;
        let mut shards_used = vec![false; self.shards.len()];
        for &k in &chosen {
            shards_used[self.entries[k].shard] = true;
        }
        let files: Vec<Shard> = (self.shards.iter().zip(shards_used))
            .filter(|&(_, used)| used)
            .map(|(s, _)| s.clone())
            .collect();
        // Files written since they were opened are refused before anything is read.
        files.iter().try_for_each(Shard::unchanged)?;
        let mut groups = VecDeque::new();
        let mut g = Group::default();
        for k in chosen {
            let e = &self.entries[k];
            let part = self.part(k)?;
            if g.bytes > 0 && g.bytes + e.nbytes > opts.group_bytes {
                groups.push_back(std::mem::take(&mut g));
            }
            g.bytes += e.nbytes;
            g.names.push(e.name.clone());
            g.parts.push(part);
        }
        if !g.names.is_empty() {
            groups.push_back(g);
        }
        // Ask the kernel to read the files ahead (a file already in the page cache costs
        // a fraction of a millisecond here).
        for s in &files {
            s.map.will_need();
        }
        Ok(Loading {
            groups,
            moving: None,
            ready: VecDeque::new(),
            opts: opts.h2d(),
            done: false,
            files,
        })
    }

    /// A host tensor holding a copy of the tensor named `name`, read from the file: for
    /// looking at a weight on the host, or loading without a device.
    ///
    /// # Errors
    /// [`Error::Checkpoint`]: no tensor of this name ([`CheckpointFault::Tensor`]), a
    /// dtype pinlane lacks ([`CheckpointFault::UnsupportedDtype`]), bytes its dtype
    /// forbids ([`CheckpointFault::Values`]), its file written since the checkpoint was
    /// opened ([`CheckpointFault::Io`]).
    pub fn read(&self, name: &str) -> Result<Tensor> {
        let k = self.index_of(name).ok_or_else(|| self.missing(name))?;
        let shard = &self.shards[self.entries[k].shard];
        shard.unchanged()?;
        let (range, dtype, shape) = self.located(k)?;
        let t = Tensor::from_bytes(dtype, shape, range.as_ref())
            .map_err(|err| self.entry_fault(k, err))?;
        // Written while it was copied: the copy may mix old and new bytes.
        shard.unchanged()?;
        Ok(t)
    }

    /// Entry `k` as a group's part: a host tensor over the mapped file, or its range when
    /// the file does not align it for its dtype (copied when its group is queued), its
    /// shape and values checked now either way.
    fn part(&self, k: usize) -> Result<Part> {
        let (range, dtype, shape) = self.located(k)?;
        // Unaligned is rare: the safetensors writers align every tensor.
        if range.is_aligned(dtype.size()) {
            Tensor::from_owner(range, dtype, shape).map(Part::Mapped)
        } else {
            // A dtype of one byte is always aligned: no bool byte is left unchecked here.
            crate::tensor::check_bytes(&shape, dtype, range.as_ref().len()).map(|_| {
                Part::Unaligned {
                    range,
                    dtype,
                    shape,
                }
            })
        }
        .map_err(|err| self.entry_fault(k, err))
    }

    /// Entry `k`'s bytes (its range of its mapped file), dtype and shape.
    fn located(&self, k: usize) -> Result<(MappedRange, DType, Shape)> {
        let e = &self.entries[k];
        let shard = &self.shards[e.shard];
        let dtype = dtype_of(e.dtype).ok_or_else(|| {
            fault(
                &shard.path,
                Some(&e.name),
                CheckpointFault::UnsupportedDtype,
                format!("dtype {} has no pinlane type", e.dtype),
            )
        })?;
        let range = shard
            .map
            .range(e.at, e.nbytes)
            .ok_or_else(|| Error::Internal {
                op: "weights::located",
                reason: format!("{} is outside its checked file", e.name),
            })?;
        Ok((range, dtype, Shape::from(e.shape.clone())))
    }

    /// A tensor's error for entry `k`, as a checkpoint fault of its file and name.
    fn entry_fault(&self, k: usize, err: Error) -> Error {
        let e = &self.entries[k];
        let (f, reason) = match err {
            Error::InvalidBytes { reason, .. } => (CheckpointFault::Values, reason),
            other => (CheckpointFault::Shape, other.to_string()),
        };
        fault(&self.shards[e.shard].path, Some(&e.name), f, reason)
    }

    /// The entries to load, in file order, each once.
    fn chosen(&self, names: Option<&[String]>) -> Result<Vec<usize>> {
        let Some(names) = names else {
            return Ok((0..self.entries.len()).collect());
        };
        let mut ks = Vec::with_capacity(names.len());
        for n in names {
            let k = self.index_of(n).ok_or_else(|| self.missing(n))?;
            ks.push(k);
        }
        ks.sort_unstable();
        ks.dedup();
        Ok(ks)
    }
}

#[cfg(all(test, feature = "test-util"))]
mod tests {
    use super::*;
    use crate::engine::{transfer_tensor_d2h, D2hOptions};

    /// A one-file checkpoint: `a`, 3 bytes of u8 at offset 0, then `b`, two f32 at
    /// offset 3 (not aligned for its dtype in the mapping, which starts on a page, since
    /// the data starts 8-aligned).
    fn unaligned_file() -> std::path::PathBuf {
        let mut header =
            r#"{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}}"#
                .to_string();
        while !header.len().is_multiple_of(8) {
            header.push(' ');
        }
        let mut bytes = (header.len() as u64).to_le_bytes().to_vec();
        bytes.extend_from_slice(header.as_bytes());
        bytes.extend_from_slice(&[7, 8, 9]);
        for v in [1.5f32, -2.25] {
            bytes.extend_from_slice(&v.to_le_bytes());
        }
        let dir = std::env::temp_dir().join(format!("pinlane-load-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.safetensors");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    /// A stream copies a tensor the file does not align only when its group is queued
    /// (before session 72, `stream` copied every such tensor of the checkpoint when it
    /// started, holding them all in memory from the first group on), and moves it exactly.
    #[test]
    fn an_unaligned_tensor_is_copied_only_when_its_group_is_queued() {
        crate::sim_tests::setup();
        let path = unaligned_file();
        let ck = Checkpoint::open(&path).unwrap();
        let loading = ck.stream(&LoadOptions::default().group_bytes(1)).unwrap();
        assert_eq!(loading.groups.len(), 2, "one group each");
        assert!(matches!(loading.groups[0].parts[..], [Part::Mapped(_)]));
        assert!(matches!(
            loading.groups[1].parts[..],
            [Part::Unaligned { .. }]
        ));
        let got: Vec<(String, Tensor)> = loading.map(Result::unwrap).collect();
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["a", "b"]);
        let back = transfer_tensor_d2h(
            &got.into_iter().map(|(_, t)| t).collect::<Vec<_>>(),
            &D2hOptions::default(),
        )
        .unwrap();
        assert_eq!(back[0].to_vec::<u8>().unwrap(), [7, 8, 9]);
        assert_eq!(back[1].to_vec::<f32>().unwrap(), [1.5, -2.25]);
        assert_eq!(ck.read("b").unwrap(), back[1]);
        drop(ck);
        if let Some(dir) = path.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}
