//! Copies into tensors the caller already owns: [`transfer_tensor_h2d_into`] and
//! [`transfer_tensor_d2h_into`]. This file holds the calls, their options and the checks
//! that come before any copy (pairing sources with destinations, overlap); the two
//! directions' work is in `h2d_into.rs` and `d2h_into.rs`.

use super::{d2h_into, h2d_into, Transfer};
use crate::batch::{self, Batch, Path, Step};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::location::Location;
use crate::tensor::Tensor;

/// Options of [`transfer_tensor_h2d_into`] and [`transfer_tensor_d2h_into`].
///
/// ```
/// let opts = pinlane::IntoOptions::default(); // the calling thread's current stream
/// # let _ = opts;
/// ```
#[derive(Clone, Debug, Default)]
pub struct IntoOptions {
    pub(crate) stream: Option<Stream>,
}

impl IntoOptions {
    /// The stream the copies are ordered on (its device must be the destinations' for
    /// H2D, the sources' for D2H). Default: the calling thread's
    /// [`current_stream`](crate::current_stream) of that device (the legacy default
    /// stream unless one was set).
    pub fn stream(mut self, s: Stream) -> Self {
        self.stream = Some(s);
        self
    }
}

/// Copies every host tensor of `src` into the device tensor at the same place in `dst`,
/// overwriting its memory: buffers a server keeps (a captured CUDA graph's inputs,
/// slices of one static buffer, a KV-cache index) fed every step without a device
/// allocation.
///
/// * Pairs: `src` and `dst` are visited in the same order and must have the same
///   structure ([`Batch::visit_paths`] gives the same paths); each pair has the same dtype
///   and byte size (shapes may differ). Sources are host tensors (pageable or
///   page-locked); destinations are device tensors of one device: pinlane's own
///   outputs, [`Tensor::from_device_ptr`] memory, DLPack imports, views into a larger
///   buffer. Destinations must not overlap.
/// * Order: the copies are queued on [`IntoOptions::stream`], else the thread's
///   [`current_stream`](crate::current_stream) of the destinations' device: they run
///   after the work queued there before the call, and work queued there after it sees
///   the new bytes. The returned [`Transfer`] completes when they have run
///   ([`Transfer::wait`], [`Transfer::ready_event`] to order another stream); dropping
///   it is fine (pinlane keeps what the copies use until they finish).
/// * How: page-locked sources from 64 KiB on (256 KiB where the driver lacks
///   `cuMemcpyBatchAsync`) are copied straight from their memory, in one batched
///   submission; the others are copied into one page-locked staging slot and scattered
///   to their destinations by one kernel launch that reads the slot through the
///   device's mapping (small page-locked sources pinlane allocated are read in place by
///   the same launch); a batch too large for one slot goes through the staging ring,
///   one copy per piece.
/// * When the call returns, the sources are no longer read except page-locked ones,
///   which pinlane keeps alive until the copies have run (clones); pageable sources may
///   change at once.
/// * `HashMap` batches are refused ([`Error::IntoMismatch`]): two maps holding the same
///   keys iterate in orders of their own. A `BTreeMap` pairs by key order, so both must
///   hold the same keys (its keys are not compared: use [`Value::Map`](crate::Value::Map),
///   whose keys are, when they may differ).
///
/// The rules for the destinations' memory while the copies run, and on failure, are in
/// `docs/semantics.md` ("Copies into existing tensors").
///
/// ```no_run
/// use pinlane::{transfer_tensor_h2d, transfer_tensor_h2d_into, IntoOptions, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// // Static device buffers, allocated once.
/// let statics = transfer_tensor_h2d(&vec![
///     Tensor::from_vec(vec![0i64; 256], [256])?,
///     Tensor::from_vec(vec![0i32; 256], [256])?,
/// ])?;
/// for step in 0..3i64 {
///     let inputs = vec![
///         Tensor::from_vec(vec![step; 256], [256])?,
///         Tensor::from_vec(vec![step as i32; 256], [256])?,
///     ];
///     transfer_tensor_h2d_into(&inputs, &statics, &IntoOptions::default())?.wait()?;
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// Before anything is queued, with no destination written: [`Error::IntoMismatch`]
/// (structure, placement, dtype or size), [`Error::OverlappingDestinations`],
/// [`Error::StreamDeviceMismatch`], [`Error::Deferred`]. While queueing, the driver's
/// error or [`Error::StagingExhausted`] is the call's (what was queued is drained first);
/// once queued, a failure of the copies comes from [`Transfer::wait`], or, if the handle
/// was dropped, from a later call on the device ([`Error::Deferred`]: the next one of the
/// thread that dropped it, if the failure was known by then, else the next one on any
/// thread). Destinations may then be partly written; the copy did not succeed.
pub fn transfer_tensor_h2d_into<B: Batch>(
    src: &B,
    dst: &B,
    opts: &IntoOptions,
) -> Result<Transfer<()>> {
    super::trace::start("h2d_into");
    let r = h2d_into::transfer(src, dst, opts);
    super::trace::end();
    r
}

/// Copies every device tensor of `src` into the host tensor at the same place in `dst`,
/// overwriting its memory, and returns once the bytes are there.
///
/// * Pairs as for [`transfer_tensor_h2d_into`]: same structure, each pair the same dtype
///   and byte size; sources are device tensors of one device, destinations host tensors
///   that pinlane may write: page-locked memory, or memory imported from another
///   framework (DLPack; a torch CPU tensor, say). Host tensors over memory a Rust value
///   owns (`Tensor::from_vec`, `from_owner`) are immutable and refused.
/// * Order: the copies run after the work queued before the call on the thread's
///   [`current_stream`](crate::current_stream) of the sources' device, on
///   [`IntoOptions::stream`] if given (else the thread's own copy stream).
/// * How: as [`transfer_tensor_d2h`](crate::transfer_tensor_d2h) into page-locked memory
///   (small tensors gathered by a kernel and moved by one copy), then one host copy into
///   each destination (by the copy threads for large ones).
///
/// ```no_run
/// use pinlane::{transfer_tensor_d2h_into, transfer_tensor_h2d, IntoOptions, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let on_gpu = transfer_tensor_h2d(&vec![Tensor::from_vec(vec![1.5f32; 64], [64])?])?;
/// let mut out = pinlane::memory::PinnedBufferMut::<f32>::new(64, pinlane::Device::cuda(0))?;
/// out.copy_from_slice(&[0.0; 64])?;
/// let host = vec![out.freeze([64])?];
/// // SAFETY: nothing else reads or writes `host`'s memory during the call.
/// unsafe { transfer_tensor_d2h_into(&on_gpu, &host, &IntoOptions::default()) }?;
/// assert_eq!(host[0].as_slice::<f32>()?, &[1.5; 64]);
/// # Ok(()) }
/// ```
///
/// # Safety
/// Nothing reads or writes the destinations' host memory during the call: no borrow of
/// it (from [`Tensor::as_bytes`] or [`Tensor::as_slice`] on any clone, on any thread, the
/// calling one included) is alive across the call, and no earlier pinlane copy still
/// reads it (an unfinished `transfer_tensor_h2d_async` or `transfer_tensor_h2d_into`
/// with it as a source). pinlane tensors are otherwise immutable, and this call writes
/// them.
///
/// # Errors
/// As [`transfer_tensor_h2d_into`] before any copy (a destination pinlane may not write
/// is an [`Error::IntoMismatch`]); then as [`transfer_tensor_d2h`](crate::transfer_tensor_d2h).
pub unsafe fn transfer_tensor_d2h_into<B: Batch>(
    src: &B,
    dst: &B,
    opts: &IntoOptions,
) -> Result<()> {
    super::trace::start("d2h_into");
    // SAFETY: the caller's contract, passed on.
    let r = unsafe { d2h_into::transfer(src, dst, opts) };
    super::trace::end();
    r
}

/// Which way a copy into existing tensors goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Way {
    H2d,
    D2h,
}

/// The checked pairs of a call: `(source, destination)` in visit order, empty pairs left
/// out; and the device of the device side (`None` when every pair is empty).
pub(super) struct Pairs<'a> {
    pub pairs: Vec<(&'a Tensor, &'a Tensor)>,
    pub device: Option<usize>,
}

/// A path's hash (SipHash with fixed keys: the same in both walks).
fn path_hash(p: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.hash(&mut h);
    h.finish()
}

/// The path of `dst`'s `k`-th tensor, for an error message.
fn path_of<B: Batch>(dst: &B, k: usize) -> String {
    batch::tensors_with_paths(dst)
        .into_iter()
        .nth(k)
        .map_or_else(|| format!("tensor {k}"), |(p, _)| p.to_string())
}

/// Pairs `src` with `dst` and checks every pair (see [`transfer_tensor_h2d_into`]).
pub(super) fn pair_up<'a, B: Batch>(src: &'a B, dst: &'a B, way: Way) -> Result<Pairs<'a>> {
    // One walk of each batch: its tensors, and the same structure, the same paths (a
    // `Value` map's keys, the lengths of nested lists), compared by hash (no allocation per
    // tensor); the paths are written out on a difference only.
    let (mut s, mut src_paths) = (Vec::new(), Vec::new());
    src.visit_paths(&mut Path::default(), &mut |p, t| {
        s.push(t);
        src_paths.push(path_hash(p));
    });
    let mut d = Vec::with_capacity(s.len());
    let (mut differs, mut unordered) = (None, None);
    dst.visit_paths(&mut Path::default(), &mut |p, t| {
        let k = d.len();
        if differs.is_none() && src_paths.get(k) != Some(&path_hash(p)) {
            differs = Some(k);
        }
        if unordered.is_none() && p.steps().iter().any(|s| matches!(s, Step::Unordered(_))) {
            unordered = Some(k);
        }
        d.push(t);
    });
    if s.len() != d.len() {
        return Err(Error::IntoMismatch {
            at: "batch".into(),
            reason: format!("{} source tensors for {} destinations", s.len(), d.len()),
        });
    }
    if let Some(k) = unordered {
        return Err(Error::IntoMismatch {
            at: path_of(dst, k),
            reason: "a HashMap's entries cannot be paired: two maps holding the same keys \
                     list them in orders of their own; use a BTreeMap, a Vec or a Value::Map"
                .into(),
        });
    }
    if let Some(k) = differs {
        let src_at = batch::tensors_with_paths(src)
            .into_iter()
            .nth(k)
            .map_or_else(|| "nothing".into(), |(p, _)| p.to_string());
        return Err(Error::IntoMismatch {
            at: path_of(dst, k),
            reason: format!("the source there is at {src_at}: the structures differ"),
        });
    }
    let mut pairs = Vec::with_capacity(s.len());
    let mut device = None;
    for (k, (&a, &b)) in s.iter().zip(&d).enumerate() {
        let mismatch = |reason: String| Error::IntoMismatch {
            at: path_of(dst, k),
            reason,
        };
        if let Some(reason) = check_pair(a, b, way, &mut device) {
            return Err(mismatch(reason));
        }
        if b.nbytes() > 0 {
            pairs.push((a, b));
        }
    }
    Ok(Pairs { pairs, device })
}

/// What is wrong with one pair, if anything; the device side's device goes to `device`
/// (the first pair's), which every other pair must share.
fn check_pair(src: &Tensor, dst: &Tensor, way: Way, device: &mut Option<usize>) -> Option<String> {
    let (dev_side, host_side, host_name) = match way {
        Way::H2d => (dst, src, "source"),
        Way::D2h => (src, dst, "destination"),
    };
    let dev_name = if way == Way::H2d {
        "destination"
    } else {
        "source"
    };
    let Location::Cuda(d) = dev_side.location() else {
        return Some(format!(
            "the {dev_name} is on {}, not on a CUDA device",
            dev_side.location()
        ));
    };
    if *device.get_or_insert(d.ordinal()) != d.ordinal() {
        return Some(format!(
            "the {dev_name} is on {d}, another pair's on cuda:{}",
            device.unwrap_or_default()
        ));
    }
    if host_side.is_cuda() {
        return Some(format!(
            "the {host_name} is on {}, not on the host",
            host_side.location()
        ));
    }
    if src.dtype() != dst.dtype() {
        return Some(format!(
            "the source holds {}, the destination {}",
            src.dtype(),
            dst.dtype()
        ));
    }
    if src.nbytes() != dst.nbytes() {
        return Some(format!(
            "the source has {} bytes, the destination {}",
            src.nbytes(),
            dst.nbytes()
        ));
    }
    if way == Way::D2h && dst.nbytes() > 0 && dst.storage().host_write_ptr().is_none() {
        return Some(
            "pinlane may not write the destination's memory: memory a Rust value owns \
             (Tensor::from_vec, from_owner, the same page-locked in place by \
             register_pinned, a D2H output in pageable memory) or a read-only import; copy \
             into page-locked memory pinlane allocated, or memory imported writable \
             through DLPack"
                .into(),
        );
    }
    None
}

/// The first two of `ranges` (`(start, len)`; empty ones never overlap) that overlap,
/// as indices, the lower first.
pub(super) fn first_overlap(ranges: &[(u64, usize)]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..ranges.len()).filter(|&i| ranges[i].1 > 0).collect();
    order.sort_unstable_by_key(|&i| ranges[i].0);
    // The range reaching furthest so far: a later start below its end overlaps it.
    let mut furthest: Option<(usize, u128)> = None;
    for &i in &order {
        let (start, len) = ranges[i];
        if let Some((j, end)) = furthest {
            if u128::from(start) < end {
                return Some((i.min(j), i.max(j)));
            }
        }
        let end = u128::from(start) + len as u128;
        if furthest.is_none_or(|(_, e)| end > e) {
            furthest = Some((i, end));
        }
    }
    None
}

/// [`Error::OverlappingDestinations`] if two of the `ranges` (the destinations of
/// `pairs`, in order) overlap.
pub(super) fn check_overlap<B: Batch>(
    dst: &B,
    pairs: &[(&Tensor, &Tensor)],
    ranges: &[(u64, usize)],
) -> Result<()> {
    let Some((a, b)) = first_overlap(ranges) else {
        return Ok(());
    };
    // Indices into `pairs`: find them in `dst`'s visit order for their paths.
    let all = batch::tensors(dst);
    let at = |k: usize| {
        all.iter()
            .position(|t| std::ptr::eq(*t, pairs[k].1))
            .map_or_else(|| format!("tensor {k}"), |i| path_of(dst, i))
    };
    Err(Error::OverlappingDestinations {
        first: at(a),
        second: at(b),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn overlaps_are_found_in_any_order() {
        assert_eq!(first_overlap(&[]), None);
        assert_eq!(
            first_overlap(&[(0, 10), (10, 10)]),
            None,
            "touching is fine"
        );
        assert_eq!(first_overlap(&[(10, 10), (0, 11)]), Some((0, 1)));
        assert_eq!(
            first_overlap(&[(5, 0), (0, 10)]),
            None,
            "empty ranges never overlap"
        );
        // Inside a long range that an earlier, shorter one follows.
        assert_eq!(first_overlap(&[(0, 100), (10, 5), (50, 5)]), Some((0, 1)));
        assert_eq!(first_overlap(&[(u64::MAX - 1, 2), (0, 1)]), None);
    }

    proptest! {
        /// Agrees with the pairwise check.
        #[test]
        fn first_overlap_agrees_with_brute_force(
            ranges in proptest::collection::vec((0u64..200, 0usize..40), 0..12)
        ) {
            let overlap = |a: (u64, usize), b: (u64, usize)| {
                a.1 > 0 && b.1 > 0 && a.0 < b.0 + b.1 as u64 && b.0 < a.0 + a.1 as u64
            };
            let any = (0..ranges.len())
                .any(|i| (i + 1..ranges.len()).any(|j| overlap(ranges[i], ranges[j])));
            let found = first_overlap(&ranges);
            prop_assert_eq!(found.is_some(), any);
            if let Some((i, j)) = found {
                prop_assert!(i < j && overlap(ranges[i], ranges[j]));
            }
        }
    }

    fn host(v: Vec<u8>) -> Tensor {
        let n = v.len();
        Tensor::from_vec(v, [n]).unwrap()
    }

    #[test]
    fn pairs_must_match_in_count_structure_dtype_and_place() {
        let a = vec![host(vec![1; 4])];
        let two = vec![host(vec![1; 4]), host(vec![2; 4])];
        let e = pair_up(&a, &two, Way::H2d).err().unwrap();
        assert!(
            matches!(e, Error::IntoMismatch { ref at, .. } if at == "batch"),
            "{e}"
        );
        // Same count, another structure.
        let nested_a = vec![vec![host(vec![1; 4]), host(vec![1; 4])], vec![]];
        let nested_b = vec![vec![host(vec![1; 4])], vec![host(vec![1; 4])]];
        let e = pair_up(&nested_a, &nested_b, Way::H2d).err().unwrap();
        assert!(
            matches!(e, Error::IntoMismatch { ref at, .. } if at == "[1][0]"),
            "{e}"
        );
        // Host to host is no H2D copy: the destination must be on a device.
        let e = pair_up(&a, &a, Way::H2d).err().unwrap();
        assert!(e.to_string().contains("not on a CUDA device"), "{e}");
        // A host source for D2H.
        let e = pair_up(&a, &a, Way::D2h).err().unwrap();
        assert!(e.to_string().contains("the source is on host"), "{e}");
    }

    #[test]
    fn hash_maps_are_refused_whatever_their_order() {
        let m: std::collections::HashMap<String, Tensor> = (0..4)
            .map(|k| (format!("k{k}"), host(vec![k; 8])))
            .collect();
        let e = pair_up(&m, &m.clone(), Way::H2d).err().unwrap();
        assert!(e.to_string().contains("HashMap"), "{e}");
        // A BTreeMap pairs by key order: the first mismatch is the placement.
        let b: std::collections::BTreeMap<String, Tensor> = m.into_iter().collect();
        let e = pair_up(&b, &b, Way::H2d).err().unwrap();
        assert!(e.to_string().contains("not on a CUDA device"), "{e}");
    }
}
