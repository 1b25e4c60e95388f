//! Copies into tensors the caller already owns: what
//! [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into) and
//! [`transfer_tensor_d2h_into`](crate::transfer_tensor_d2h_into) share: their options and
//! the checks that come before any copy (pairing sources with destinations, overlap). Each
//! direction's call and work are in `h2d_into.rs` and `d2h_into.rs`.

use crate::batch::{self, Batch, Path, Step};
use crate::driver::Stream;
use crate::error::{Error, Result};
use crate::location::Location;
use crate::tensor::Tensor;

/// Options of [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into) and
/// [`transfer_tensor_d2h_into`](crate::transfer_tensor_d2h_into).
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
    /// H2D, the sources' for D2H). Default: H2D's copies go on the calling thread's
    /// [`current_stream`](crate::current_stream) of that device (the legacy default
    /// stream unless one was set); D2H's go on pinlane's own stream of the thread, ordered
    /// after that current stream, and the call returns once the bytes are on the host.
    pub fn stream(mut self, s: Stream) -> Self {
        self.stream = Some(s);
        self
    }
}

/// Which way a copy into existing tensors goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Way {
    H2d,
    D2h,
}

/// A source and its destination.
type Pair<'a> = (&'a Tensor, &'a Tensor);

/// The checked pairs of a call: `(source, destination)` in visit order (in the order of
/// the paths' hashes when the batches hold a `HashMap`: entries pair by key), empty pairs
/// left out; and the device of the device side (`None` when every pair is empty).
pub(super) struct Pairs<'a> {
    pub pairs: Vec<Pair<'a>>,
    pub device: Option<usize>,
}

/// A path's hash under one call's `keys`, the same in both walks of the call. Each step
/// is one word of a multiply-rotate chain (the scheme of rustc's `FxHasher`), which is
/// cheap for the words the batch's shape gives (positions, a `HashMap` entry's name); a
/// step that names its place with a string (a `Value` map's key, a field) is first
/// hashed by SipHash under the call's secret keys ([`PathKeys`]). The chain alone could
/// be steered: strings that differ in bit 6 of one byte and bit 3 of the next collided
/// in half the calls, whatever the seed (`crafted_keys_do_not_collide` below). Keyed,
/// two paths of a call collide by chance only, with a probability of about n^2 / 2^64;
/// a collision would hide a difference of structure (each pair's dtype and size are
/// still checked). A `HashMap` entry's name is a hash anyone can compute, but a fixed tag
/// word follows it, so a difference in it reaches any later word scrambled by the seed.
fn path_hash(p: &Path, keys: &PathKeys) -> u64 {
    use std::hash::BuildHasher;
    let mut h = PathHasher(keys.seed);
    h.add(p.steps().len() as u64);
    for step in p.steps() {
        let (tag, word) = match step {
            Step::Field(name) => (1, keys.strings.hash_one(&**name)),
            Step::Key(k) => (2, keys.strings.hash_one(k.as_str())),
            Step::Index(i) => (3, *i as u64),
            Step::Nth(n) => (4, *n as u64),
            Step::Unordered(x) => (5, *x),
        };
        h.add(tag);
        h.add(word);
    }
    h.0
}

/// One call's keys for its [`path_hash`]es, unknown outside the process: std's
/// `RandomState` (SipHash keys that differ per thread and per call) for the strings, and
/// a seed it derives for the chain.
struct PathKeys {
    seed: u64,
    strings: std::collections::hash_map::RandomState,
}

impl PathKeys {
    fn new() -> PathKeys {
        use std::hash::BuildHasher;
        let strings = std::collections::hash_map::RandomState::new();
        PathKeys {
            seed: strings.hash_one(0x5eed_u64),
            strings,
        }
    }
}

/// The multiply-rotate chain of [`path_hash`].
struct PathHasher(u64);

impl PathHasher {
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
}

/// The path of `batch`'s `k`-th tensor (in visit order), for an error message.
fn path_of<B: Batch>(batch: &B, k: usize) -> String {
    batch::tensors_with_paths(batch)
        .into_iter()
        .nth(k)
        .map_or_else(|| format!("tensor {k}"), |(p, _)| p.to_string())
}

/// Pairs `src` with `dst` and checks every pair (see
/// [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into)).
pub(super) fn pair_up<'a, B: Batch>(src: &'a B, dst: &'a B, way: Way) -> Result<Pairs<'a>> {
    // One walk of each batch: its tensors, and the same structure, the same paths (a
    // `Value` map's keys, the lengths of nested lists), compared by hash (no allocation per
    // tensor); the paths are written out on a difference only.
    let keys = PathKeys::new();
    let (mut s, mut src_paths) = (Vec::new(), Vec::new());
    src.visit_paths(&mut Path::default(), &mut |p, t| {
        s.push(t);
        src_paths.push(path_hash(p, &keys));
    });
    let mut d = Vec::with_capacity(s.len());
    let mut dst_paths = Vec::with_capacity(s.len());
    let (mut differs, mut unordered, mut numbered) = (None, false, false);
    dst.visit_paths(&mut Path::default(), &mut |p, t| {
        let k = d.len();
        let h = path_hash(p, &keys);
        if differs.is_none() && src_paths.get(k) != Some(&h) {
            differs = Some(k);
        }
        dst_paths.push(h);
        for s in p.steps() {
            match s {
                Step::Unordered(_) => unordered = true,
                Step::Nth(_) => numbered = true,
                _ => {}
            }
        }
        d.push(t);
    });
    if s.len() != d.len() {
        return Err(Error::IntoMismatch {
            at: "batch".into(),
            reason: format!("{} source tensors for {} destinations", s.len(), d.len()),
        });
    }
    if unordered {
        let (pairs, at) = pair_by_key(src, dst, (&s, &src_paths), (&d, &dst_paths))?;
        return check_pairs(pairs.into_iter(), way, |k| path_of(dst, at[k]));
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
    // The same paths, but a map's entries are numbered (`Step::Nth`), not named: the
    // keys too, walked only where a tensor sits under such a step (a map above no tensor
    // pairs nothing).
    if let Some(at) = numbered
        .then(|| src.keys_differ(dst, &mut Path::default()))
        .flatten()
    {
        return Err(other_keys(&at));
    }
    check_pairs(s.into_iter().zip(d), way, |k| path_of(dst, k))
}

/// The pairs of two batches holding a `HashMap`, whose entries each map lists in an order
/// of its own: paired by path (a `HashMap` entry's step names its key, by hash), compared
/// by the paths' hashes (`src` and `dst`: each batch's tensors and their paths' hashes, in
/// visit order), in hash order; with each pair's destination index, for errors. No path
/// is built unless one is wrong. Refused: maps with other keys, two tensors of the
/// destination whose paths have the same hash (two keys of one map with the same hash:
/// 64 bits, they could not be told apart; or, by chance, two paths: see [`path_hash`]),
/// and structures that differ.
fn pair_by_key<'a, B: Batch>(
    src_batch: &'a B,
    dst_batch: &'a B,
    (s, src_paths): (&[&'a Tensor], &[u64]),
    (d, dst_paths): (&[&'a Tensor], &[u64]),
) -> Result<(Vec<Pair<'a>>, Vec<usize>)> {
    if let Some(at) = src_batch.keys_differ(dst_batch, &mut Path::default()) {
        return Err(other_keys(&at));
    }
    let by_hash = |paths: &[u64]| {
        let mut order: Vec<usize> = (0..paths.len()).collect();
        order.sort_unstable_by_key(|&k| paths[k]);
        order
    };
    let (a, b) = (by_hash(src_paths), by_hash(dst_paths));
    if let Some(w) = b.windows(2).find(|w| dst_paths[w[0]] == dst_paths[w[1]]) {
        return Err(Error::IntoMismatch {
            at: path_of(dst_batch, w[0]),
            reason: "two keys of a HashMap there have the same hash, so their entries \
                     cannot be paired by key; use a BTreeMap or a Value::Map"
                .into(),
        });
    }
    let mut pairs = Vec::with_capacity(b.len());
    for (&ka, &kb) in a.iter().zip(&b) {
        if src_paths[ka] != dst_paths[kb] {
            // The first mismatch in hash order: the smaller hash is a path the other side
            // lacks (or holds once fewer).
            let (at, lacks) = if src_paths[ka] < dst_paths[kb] {
                (path_of(src_batch, ka), "the destination")
            } else {
                (path_of(dst_batch, kb), "the source")
            };
            return Err(Error::IntoMismatch {
                at,
                reason: format!("{lacks} has no tensor there: the structures differ"),
            });
        }
        pairs.push((s[ka], d[kb]));
    }
    Ok((pairs, b))
}

/// The error of a source map whose keys are not its destination's, at the map `at`.
fn other_keys(at: &Path) -> Error {
    Error::IntoMismatch {
        at: at.to_string(),
        reason: "the source's map there holds other keys than the destination's (an \
                 entry is copied into the destination's entry of the same key only), or \
                 two of its keys have the same hash (a HashMap's entries are paired by their \
                 keys' hashes)"
            .into(),
    }
}

/// Checks every pair (`at(k)` names the `k`-th destination's place); the pairs of empty
/// tensors are left out of the result.
fn check_pairs<'a>(
    all: impl ExactSizeIterator<Item = Pair<'a>>,
    way: Way,
    at: impl Fn(usize) -> String,
) -> Result<Pairs<'a>> {
    let mut pairs = Vec::with_capacity(all.len());
    let mut device = None;
    for (k, (a, b)) in all.enumerate() {
        if let Some(reason) = check_pair(a, b, way, &mut device) {
            return Err(Error::IntoMismatch { at: at(k), reason });
        }
        if b.nbytes() > 0 {
            pairs.push((a, b));
        }
    }
    Ok(Pairs { pairs, device })
}

/// What is wrong with one pair, if anything; the device side's device goes to `device`
/// (the first pair's with bytes), which every other pair with bytes must share.
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
    // An empty pair writes nothing anywhere, so its device binds nothing: the first
    // pair with bytes names the call's device (session 79: an empty tensor on another
    // device refused the call).
    if dev_side.nbytes() > 0 && *device.get_or_insert(d.ordinal()) != d.ordinal() {
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
    if way == Way::H2d && dst.nbytes() > 0 && !dst.storage().device_writable() {
        return Some(
            "pinlane may not write the destination's memory: a read-only DLPack import \
             (Tensor::from_dlpack); copy into device memory pinlane allocated, or memory \
             imported writable (Tensor::from_device_ptr, Tensor::from_dlpack_writable)"
                .into(),
        );
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

/// [`Error::OverlappingDestinations`] if two of the `ranges` (the destinations of
/// `pairs`, in order) overlap.
pub(super) fn check_overlap<B: Batch>(
    dst: &B,
    pairs: &[(&Tensor, &Tensor)],
    ranges: &[(u64, usize)],
) -> Result<()> {
    let Some((a, b)) = crate::memory::first_overlap(ranges) else {
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

    #[test]
    fn path_hashes_tell_apart_paths_that_differ() {
        let path = |steps: Vec<Step>| {
            let mut p = Path::default();
            steps.into_iter().for_each(|s| p.push(s));
            p
        };
        let key = |k: &str| Step::Key(k.into());
        let paths = [
            path(vec![]),
            path(vec![Step::Index(1)]),
            path(vec![Step::Index(2)]),
            path(vec![Step::Nth(1)]),
            path(vec![Step::Index(1), Step::Index(0)]),
            path(vec![Step::Index(0), Step::Index(1)]),
            path(vec![key("ab")]),
            path(vec![key("a"), key("b")]),
            path(vec![key("a")]),
            path(vec![key("a\0")]),
            path(vec![key("abcdefgh")]),
            path(vec![key("abcdefgh\0")]),
            path(vec![Step::Field("a".into())]),
        ];
        for (i, a) in paths.iter().enumerate() {
            for b in &paths[i + 1..] {
                let keys = PathKeys::new();
                assert_ne!(path_hash(a, &keys), path_hash(b, &keys), "{a} and {b}");
            }
        }
    }

    fn host(v: Vec<u8>) -> Tensor {
        let n = v.len();
        Tensor::from_vec(v, [n]).unwrap()
    }

    /// Keys that differ in bit 6 of their eighth byte and bit 3 (or bits 3 and 4) of
    /// their ninth: under the multiply-rotate chain alone their paths collided in about
    /// half the calls, whatever the seed (500 of 1000 measured), so a source under one
    /// key could pair with a destination under the other. Keyed by SipHash, they differ
    /// in every call.
    #[test]
    fn crafted_keys_do_not_collide() {
        let key = |k: &str| {
            let mut p = Path::default();
            p.push(Step::Key(k.into()));
            p
        };
        let a = key("aaaaaaaAA");
        let others = [key("aaaaaaa\u{1}I"), key("aaaaaaa\u{1}Y")];
        for _ in 0..256 {
            let keys = PathKeys::new();
            for b in &others {
                assert_ne!(path_hash(&a, &keys), path_hash(b, &keys), "{a} and {b}");
            }
        }
        // A field's name hashes by its text, borrowed or owned.
        let field = |name: std::borrow::Cow<'static, str>| {
            let mut p = Path::default();
            p.push(Step::Field(name));
            p
        };
        let keys = PathKeys::new();
        assert_eq!(
            path_hash(&field("images".into()), &keys),
            path_hash(&field(String::from("images").into()), &keys)
        );
    }

    /// A hand-written batch holding a `Value`, numbering its tensors (the default
    /// `visit_paths`) and forwarding `keys_differ` as the trait asks: a source keyed
    /// `{"a", "b"}` and a destination keyed `{"b", "c"}` have the same paths (`#0`, `#1`),
    /// so only the `Value`'s own answer tells them apart (before session 78 it had none,
    /// and `a`'s tensor went to `b`).
    #[test]
    fn a_value_inside_a_numbered_batch_tells_its_keys_apart() {
        use crate::batch::Value;
        struct W(Value);
        impl Batch for W {
            fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
                self.0.visit(f)
            }
            fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
                W(self.0.rebuild(f))
            }
            fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
                self.0.keys_differ(&other.0, path)
            }
        }
        let map = |keys: [&str; 2]| {
            let entry = |k: &str| (k.to_string(), Value::Tensor(host(vec![1; 4])));
            W(Value::List(vec![Value::Map(keys.map(entry).into())]))
        };
        let e = pair_up(&map(["a", "b"]), &map(["b", "c"]), Way::H2d)
            .err()
            .unwrap();
        assert!(
            matches!(e, Error::IntoMismatch { ref at, ref reason } if at == "[0]" && reason.contains("other keys")),
            "{e}"
        );
        // The same keys pass on to the pairs' own checks (host destinations: no H2D).
        let e = pair_up(&map(["a", "b"]), &map(["a", "b"]), Way::H2d)
            .err()
            .unwrap();
        assert!(e.to_string().contains("not on a CUDA device"), "{e}");
    }

    /// A `Value` map keyed differently on each side is a structure that differs, in
    /// every call, even for keys crafted to collide in the chain (above).
    #[test]
    fn value_maps_with_crafted_keys_are_told_apart() {
        use crate::batch::Value;
        let map = |k: &str| Value::Map([(k.to_string(), Value::Tensor(host(vec![1; 4])))].into());
        let (src, dst) = (map("aaaaaaaAA"), map("aaaaaaa\u{1}I"));
        for _ in 0..64 {
            let e = pair_up(&src, &dst, Way::H2d).err().unwrap();
            assert!(
                matches!(e, Error::IntoMismatch { ref reason, .. } if reason.contains("structures differ")),
                "{e}"
            );
        }
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

    /// Two `HashMap`s with the same keys list them in orders of their own (one made with
    /// room for 4096 entries): each source pairs with its own key's destination.
    #[test]
    fn hash_maps_pair_by_key_whatever_their_order() {
        use std::collections::HashMap;
        let keys = 0..48u8;
        let src: HashMap<String, Tensor> = keys
            .clone()
            .map(|k| (format!("k{k}"), host(vec![k; 8])))
            .collect();
        let mut dst = HashMap::with_capacity(4096);
        dst.extend(keys.rev().map(|k| (format!("k{k}"), host(vec![k; 8]))));
        let listed = |m: &HashMap<String, Tensor>| -> Vec<u8> {
            batch::tensors(m)
                .iter()
                .map(|t| t.to_vec::<u8>().unwrap()[0])
                .collect()
        };
        assert_ne!(listed(&src), listed(&dst), "the maps list their keys alike");
        fn walk<'a>(b: &'a HashMap<String, Tensor>, k: &PathKeys) -> (Vec<&'a Tensor>, Vec<u64>) {
            let (mut ts, mut hashes) = (Vec::new(), Vec::new());
            b.visit_paths(&mut Path::default(), &mut |p, t| {
                ts.push(t);
                hashes.push(path_hash(p, k));
            });
            (ts, hashes)
        }
        let keys = PathKeys::new();
        let ((s, sh), (d, dh)) = (walk(&src, &keys), walk(&dst, &keys));
        let (pairs, at) = pair_by_key(&src, &dst, (&s, &sh), (&d, &dh)).unwrap();
        assert_eq!(pairs.len(), 48);
        for ((a, b), &k) in pairs.iter().zip(&at) {
            assert_eq!(
                a.to_vec::<u8>().unwrap(),
                b.to_vec::<u8>().unwrap(),
                "at {}",
                path_of(&dst, k)
            );
            assert!(std::ptr::eq(*b, d[k]), "the index names the destination");
            assert!(!std::ptr::eq(*a, *b));
        }
        // Then each pair's own checks: host destinations are no H2D copy.
        let e = pair_up(&src, &dst, Way::H2d).err().unwrap();
        assert!(e.to_string().contains("not on a CUDA device"), "{e}");
        // Another key is refused at the map, under a tuple's field too.
        let mut other = dst.clone();
        let moved = other.remove("k7").unwrap();
        other.insert("k77".into(), moved);
        let (a, b) = ((host(vec![0; 4]), src.clone()), (host(vec![0; 4]), other));
        let e = pair_up(&a, &b, Way::H2d).err().unwrap();
        assert!(
            matches!(&e, Error::IntoMismatch { at, reason }
                if at == "1" && reason.contains("other keys")),
            "{e}"
        );
        // The same keys, another structure below one of them.
        let src2: HashMap<String, Vec<Tensor>> = [
            ("a".into(), vec![host(vec![1; 4])]),
            ("b".into(), vec![host(vec![2; 4]), host(vec![3; 4])]),
        ]
        .into();
        let dst2: HashMap<String, Vec<Tensor>> = [
            ("a".into(), vec![host(vec![1; 4]), host(vec![1; 4])]),
            ("b".into(), vec![host(vec![2; 4])]),
        ]
        .into();
        // Named at a tensor one side lacks (the second under a key: the first ones pair),
        // whichever of the two comes first in this call's hash order.
        for _ in 0..8 {
            let e = pair_up(&src2, &dst2, Way::H2d).err().unwrap();
            assert!(
                matches!(&e, Error::IntoMismatch { at, reason } if at.ends_with("[1]")
                    && reason.ends_with("has no tensor there: the structures differ")),
                "{e}"
            );
        }
    }

    /// A hand-written batch whose two tensors have the same path (it names them so
    /// itself, with no `keys_differ` of its own to say so) cannot be paired by path:
    /// refused, not paired in some order.
    #[test]
    fn entries_of_one_hash_are_refused() {
        #[derive(Clone)]
        struct Colliding(Vec<Tensor>);
        impl Batch for Colliding {
            fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
                self.0.iter().for_each(f)
            }
            fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
                Colliding(self.0.iter().map(f).collect())
            }
            fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
                for t in &self.0 {
                    path.with(Step::Unordered(7), |p| f(p, t));
                }
            }
        }
        let m = Colliding(vec![host(vec![1; 4]), host(vec![2; 4])]);
        let e = pair_up(&m, &m.clone(), Way::H2d).err().unwrap();
        assert!(e.to_string().contains("same hash"), "{e}");
    }

    /// Keys whose type hashes part of itself only all share one name in paths. With
    /// `Option` values, the source's `Some` under one key and the destination's under the
    /// other gave one path each side, so they paired (one key's tensor into the other's
    /// destination): refused at the map instead.
    #[test]
    fn keys_of_one_hash_are_refused_at_the_map() {
        use std::collections::HashMap;
        #[derive(Clone, PartialEq, Eq)]
        struct K(u8);
        impl std::hash::Hash for K {
            fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
                0u8.hash(h) // legal: equal keys hash alike
            }
        }
        let src: HashMap<K, Option<Tensor>> = [(K(1), Some(host(vec![1; 4]))), (K(2), None)].into();
        let dst: HashMap<K, Option<Tensor>> = [(K(1), None), (K(2), Some(host(vec![2; 4])))].into();
        let e = pair_up(&src, &dst, Way::H2d).err().unwrap();
        assert!(
            matches!(&e, Error::IntoMismatch { at, reason }
                if *at == Path::default().to_string() && reason.contains("same hash")),
            "{e}"
        );
    }

    /// Two BTreeMaps with as many entries have the same paths (entries are numbered), so
    /// only their keys tell a source `{a, b}` from a destination `{b, c}`: refused at the
    /// map, before any pair is looked at (the first pair's is a host destination, which
    /// would be refused too, later).
    #[test]
    fn maps_with_other_keys_are_refused_at_the_map() {
        let map = |keys: &[&str]| -> std::collections::BTreeMap<String, Tensor> {
            keys.iter()
                .map(|k| (k.to_string(), host(vec![1; 8])))
                .collect()
        };
        let src = (host(vec![0; 4]), vec![map(&["a", "b"])]);
        let dst = (host(vec![0; 4]), vec![map(&["b", "c"])]);
        let e = pair_up(&src, &dst, Way::H2d).err().unwrap();
        assert!(
            matches!(&e, Error::IntoMismatch { at, reason } if at == "1[0]" && reason.contains("other keys")),
            "{e}"
        );
        // The same keys go on to the pairs' own checks.
        let e = pair_up(&src, &src.clone(), Way::H2d).err().unwrap();
        assert!(e.to_string().contains("not on a CUDA device"), "{e}");
    }
}
