//! [`Batch`] for `Tensor`, the std containers and the std leaf types.

use super::{Batch, Path, Step};
use crate::tensor::Tensor;
use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::Arc;

impl Batch for Tensor {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        f(self)
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        f(self)
    }
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        f(path, self)
    }
}

/// `visit_paths` of the items of a container, the `i`-th under `step(i)`: positions
/// ([`Step::Index`]) for sequences, entry numbers ([`Step::Nth`]) for maps whose keys may
/// have no text form.
pub(super) fn visit_items<'a, T: Batch + 'a>(
    items: impl Iterator<Item = &'a T>,
    step: fn(usize) -> Step,
    path: &mut Path,
    f: &mut dyn FnMut(&Path, &'a Tensor),
) {
    for (i, x) in items.enumerate() {
        path.with(step(i), |p| x.visit_paths(p, f));
    }
}

/// [`Batch::keys_differ`] of paired items, the `i`-th under `step(i)`.
pub(super) fn items_keys_differ<'a, T: Batch + 'a>(
    pairs: impl Iterator<Item = (&'a T, &'a T)>,
    step: fn(usize) -> Step,
    path: &mut Path,
) -> Option<Path> {
    pairs
        .enumerate()
        .find_map(|(i, (x, y))| path.with(step(i), |p| x.keys_differ(y, p)))
}

crate::impl_leaf!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    half::f16,
    half::bf16,
    String,
    &'static str,
    std::time::Duration,
    crate::dtype::DType,
    crate::layout::Shape,
);

impl<T: Batch> Batch for Vec<T> {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        self.iter().for_each(|x| x.visit(f))
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        self.iter().map(|x| x.rebuild(f)).collect()
    }
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        visit_items(self.iter(), Step::Index, path, f)
    }
    fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
        items_keys_differ(self.iter().zip(other), Step::Index, path)
    }
}

impl<T: Batch, const N: usize> Batch for [T; N] {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        self.iter().for_each(|x| x.visit(f))
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        // from_fn calls the closure for indices 0..N in order.
        std::array::from_fn(|i| self[i].rebuild(f))
    }
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        visit_items(self.iter(), Step::Index, path, f)
    }
    fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
        items_keys_differ(self.iter().zip(other), Step::Index, path)
    }
}

impl<T: Batch> Batch for Option<T> {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        if let Some(x) = self {
            x.visit(f)
        }
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        self.as_ref().map(|x| x.rebuild(f))
    }
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        if let Some(x) = self {
            x.visit_paths(path, f)
        }
    }
    fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
        match (self, other) {
            (Some(x), Some(y)) => x.keys_differ(y, path),
            _ => None,
        }
    }
}

impl<T: Batch> Batch for Box<T> {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        (**self).visit(f)
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        Box::new((**self).rebuild(f))
    }
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        (**self).visit_paths(path, f)
    }
    fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
        (**self).keys_differ(other, path)
    }
}

impl<T: Batch> Batch for Arc<T> {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        (**self).visit(f)
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        Arc::new((**self).rebuild(f))
    }
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        (**self).visit_paths(path, f)
    }
    fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
        (**self).keys_differ(other, path)
    }
}

/// Keys are kept (cloned), and the hasher (cloned). Visit and rebuild both iterate `self`,
/// which is unchanged in between, so they see the entries in the same order even though
/// a `HashMap`'s order is unspecified; the rebuilt map may list them in another order
/// (it is sized for what it holds), which is why paths name its entries by their keys'
/// hashes ([`Step::Unordered`], under a hasher with fixed keys).
impl<K: Clone + Eq + Hash, V: Batch, S: BuildHasher + Clone> Batch for HashMap<K, V, S> {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        self.values().for_each(|v| v.visit(f))
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        let mut out = HashMap::with_capacity_and_hasher(self.len(), self.hasher().clone());
        for (k, v) in self {
            out.insert(k.clone(), v.rebuild(f));
        }
        out
    }
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        for (k, v) in self {
            path.with(Step::Unordered(key_hash(k)), |p| v.visit_paths(p, f));
        }
    }
    /// Also names a map two of whose keys have the same hash (a key type may hash part of
    /// itself only): their entries share a name in paths, so nothing that pairs by path can
    /// tell them apart, whatever lies below them.
    fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
        if self.len() != other.len() {
            return Some(path.clone());
        }
        // Each key looked up in `other` once and named once: for the check of one name
        // per key, then the walk below.
        let mut named: Vec<(u64, &V, &V)> = Vec::with_capacity(self.len());
        for (k, v) in self {
            let Some(w) = other.get(k) else {
                return Some(path.clone());
            };
            named.push((key_hash(k), v, w));
        }
        let mut hashes: Vec<u64> = named.iter().map(|e| e.0).collect();
        hashes.sort_unstable();
        if hashes.windows(2).any(|w| w[0] == w[1]) {
            return Some(path.clone());
        }
        named
            .into_iter()
            .find_map(|(h, v, w)| path.with(Step::Unordered(h), |p| v.keys_differ(w, p)))
    }
}

/// A `HashMap` key's name in paths ([`Step::Unordered`]): its hash under a hasher with
/// fixed keys, so the same key gets the same name in every map, whatever that map's own
/// hasher (two `RandomState` maps built apart hash it differently).
fn key_hash<K: Hash>(k: &K) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    k.hash(&mut h);
    h.finish()
}

impl<K: Clone + Ord, V: Batch> Batch for BTreeMap<K, V> {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        self.values().for_each(|v| v.visit(f))
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        self.iter()
            .map(|(k, v)| (k.clone(), v.rebuild(f)))
            .collect()
    }
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        visit_items(self.values(), Step::Nth, path, f)
    }
    fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
        if !self.keys().eq(other.keys()) {
            return Some(path.clone());
        }
        items_keys_differ(self.values().zip(other.values()), Step::Nth, path)
    }
}

macro_rules! tuple_batch {
    ($($name:ident $idx:tt),+) => {
        impl<$($name: Batch),+> Batch for ($($name,)+) {
            fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
                $(self.$idx.visit(f);)+
            }
            fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
                // Tuple expressions evaluate left to right, so rebuild order = visit order.
                ($(self.$idx.rebuild(f),)+)
            }
            fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
                $(path.with(Step::Field(stringify!($idx).into()), |p| self.$idx.visit_paths(p, f));)+
            }
            fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
                None$(.or_else(|| {
                    path.with(Step::Field(stringify!($idx).into()), |p| self.$idx.keys_differ(&other.$idx, p))
                }))+
            }
        }
    };
}

tuple_batch!(A 0);
tuple_batch!(A 0, B 1);
tuple_batch!(A 0, B 1, C 2);
tuple_batch!(A 0, B 1, C 2, D 3);
tuple_batch!(A 0, B 1, C 2, D 3, E 4);
tuple_batch!(A 0, B 1, C 2, D 3, E 4, F 5);
tuple_batch!(A 0, B 1, C 2, D 3, E 4, F 5, G 6);
tuple_batch!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7);
tuple_batch!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8);
tuple_batch!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9);
tuple_batch!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10);
tuple_batch!(A 0, B 1, C 2, D 3, E 4, F 5, G 6, H 7, I 8, J 9, K 10, L 11);
