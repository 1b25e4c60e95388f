//! Structure-preserving traversal: the [`Batch`] trait.
//!
//! A batch is any value that holds tensors somewhere inside: a tensor, a `Vec` of them, a
//! map of names to tuples of them, a struct with `#[derive(Batch)]`, a dynamic [`Value`].
//! [`Batch::visit`] calls a function on every tensor in a fixed order; [`Batch::rebuild`]
//! builds the same value again with every tensor replaced, in that same order. Non-tensor
//! leaves (numbers, strings, skipped fields) are cloned unchanged. The engine gathers
//! tensors with one, moves them, and puts the results back with the other.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | the trait, [`tensors`], [`replace_tensors`] |
//! | `std_impls.rs` | `Tensor`, `Vec`, arrays, tuples up to 12, `Option`, `Box`, `Arc`, `HashMap`, `BTreeMap`, leaves, [`impl_leaf!`](crate::impl_leaf) |
//! | `value.rs` | [`Value`], a tree for batches whose shape is known only at run time |
//! | `path.rs` | [`Path`], where a tensor sits in a batch ([`Batch::visit_paths`]) |

mod path;
mod std_impls;
mod value;

pub use path::{Path, Step};
pub use value::{Leaf, Value};

use crate::tensor::Tensor;

/// A value whose tensors can be visited and replaced, structure preserved.
///
/// Implemented for [`Tensor`], the std containers, non-tensor leaves, and anything with
/// `#[derive(Batch)]`:
///
/// ```
/// use pinlane::{Batch, Tensor};
///
/// #[derive(Batch, Clone, Debug, PartialEq)]
/// struct Sample {
///     image: Tensor,
///     labels: Vec<Tensor>,
///     #[batch(skip)]
///     id: String,
/// }
///
/// let s = Sample {
///     image: Tensor::from_vec(vec![0u8; 12], [3, 2, 2]).unwrap(),
///     labels: vec![Tensor::scalar(1i64), Tensor::scalar(2i64)],
///     id: "a".into(),
/// };
/// assert_eq!(pinlane::batch::tensors(&s).len(), 3);
/// let mut n = 0;
/// let doubled = s.rebuild(&mut |t| {
///     n += 1;
///     t.clone()
/// });
/// assert_eq!(n, 3);
/// assert_eq!(doubled, s);
/// ```
///
/// Implementations must visit and rebuild the same tensors in the same order: `rebuild`
/// calls its function once on each tensor `visit` gives, in visit order. The transfer
/// calls check this and return [`Error::BatchMismatch`](crate::error::Error::BatchMismatch)
/// for an implementation that skips, adds or reorders a tensor.
///
/// `rebuild` must place the tensors its function returns without reading their bytes:
/// a device-to-host transfer rebuilds the batch while the copies that write those bytes
/// still run, and hands the batch out only once they have finished. (The std containers,
/// [`Value`] and `#[derive(Batch)]` only move them.)
pub trait Batch {
    /// Calls `f` on every tensor, in order.
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor));

    /// The same value with each tensor replaced by `f(tensor)`, called in visit order.
    ///
    /// The transfers run this while their copies into the tensors `f` returns may still
    /// run: build the value, and use the tensors once the call has returned (a
    /// non-blocking call's: once its handle's wait has, or on a stream its `batch_for`
    /// ordered). A D2H call's
    /// page-locked outputs refuse reads meanwhile (here, or through a clone kept from
    /// here): [`Error::BytesInFlight`](crate::Error::BytesInFlight). So do an H2D call's
    /// device outputs, whose uses here (a lent pointer, an export, a transfer from or into
    /// them) would not be ordered after the copies into them.
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self
    where
        Self: Sized;

    /// Calls `f` on every tensor, in visit order, with where it sits: `path` (what leads
    /// to `self`) followed by the steps inside `self`. For reports that name a tensor
    /// ([`verify::round_trip`](crate::verify::round_trip)), and for the copies into
    /// existing tensors ([`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into),
    /// [`transfer_tensor_d2h_into`](crate::transfer_tensor_d2h_into),
    /// [`H2dPairs`](crate::H2dPairs)), which pair each source with the destination at the
    /// same path; the transfers do not use it.
    ///
    /// The std containers, [`Value`] and `#[derive(Batch)]` name their fields, positions
    /// and keys (a `BTreeMap` numbers its entries, since its keys may have no text form,
    /// and a `HashMap` names each by its key's hash, [`Step::Unordered`]). The default,
    /// for implementations that do not override it, numbers the tensors `visit` gives
    /// ([`Step::Nth`]): a hand-written implementation whose tensors are not always there
    /// (an `Option` field) should override it to name its fields, as the derive does, or a
    /// source and a destination with their tensors in different fields pair by position,
    /// one field's tensor copied into the other's. So should one that holds a map (forward
    /// to it): a `HashMap` lists the same keys in an order of its own (a map built with
    /// more room, say), so numbered positions would pair one key's tensor with another's,
    /// and [`keys_differ`](Batch::keys_differ) cannot see it (the keys are the same).
    ///
    /// ```
    /// use pinlane::batch::Path;
    /// use pinlane::{Batch, Tensor};
    ///
    /// let b = (Tensor::scalar(1u8), vec![Tensor::scalar(2u8), Tensor::scalar(3u8)]);
    /// let mut seen = Vec::new();
    /// b.visit_paths(&mut Path::default(), &mut |p, _| seen.push(p.to_string()));
    /// assert_eq!(seen, ["0", "1[0]", "1[1]"]);
    /// ```
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        let mut n = 0;
        self.visit(&mut |t| {
            path.with(Step::Nth(n), |p| f(p, t));
            n += 1;
        });
    }

    /// Where `self` and `other` first hold maps with different keys: the path of the first
    /// `BTreeMap` or `HashMap` (from `path` down, in visit order) whose keys are not the
    /// same set as `other`'s there, or of a `HashMap` two of whose keys have the same hash;
    /// `None` when every such map matches. Paths number a `BTreeMap`'s entries rather than
    /// name its keys (which may have no text form), so this is how
    /// [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into) and the other copies
    /// into existing tensors, and [`verify::round_trip`](crate::verify::round_trip), tell a
    /// source `{"a", "b"}` from a destination `{"b", "c"}`: the same paths, other keys.
    /// Where the two differ otherwise (other variants, lengths), it looks no further down
    /// there: their paths differ.
    ///
    /// The default answers `None`, right for a type that holds no map. The std containers,
    /// [`Value`] and `#[derive(Batch)]` look into every field; a hand-written implementation
    /// holding a map should forward to it (and `visit_paths` too: see there).
    ///
    /// ```
    /// use pinlane::batch::Path;
    /// use pinlane::{Batch, Tensor};
    /// use std::collections::BTreeMap;
    ///
    /// let map = |keys: [&str; 2]| -> BTreeMap<String, Tensor> {
    ///     keys.iter().map(|k| (k.to_string(), Tensor::scalar(0u8))).collect()
    /// };
    /// let a = (Tensor::scalar(1u8), map(["a", "b"]));
    /// let b = (Tensor::scalar(1u8), map(["b", "c"]));
    /// assert_eq!(a.keys_differ(&a.clone(), &mut Path::default()), None);
    /// let at = a.keys_differ(&b, &mut Path::default()).unwrap();
    /// assert_eq!(at.to_string(), "1");
    /// ```
    fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path>
    where
        Self: Sized,
    {
        let _ = (other, path);
        None
    }
}

/// Every tensor of `batch` with its [`Path`], in visit order.
pub fn tensors_with_paths<B: Batch + ?Sized>(batch: &B) -> Vec<(Path, &Tensor)> {
    let mut out = Vec::new();
    batch.visit_paths(&mut Path::default(), &mut |p, t| out.push((p.clone(), t)));
    out
}

/// Every tensor of `batch`, in visit order.
pub fn tensors<B: Batch + ?Sized>(batch: &B) -> Vec<&Tensor> {
    let mut out = Vec::new();
    batch.visit(&mut |t| out.push(t));
    out
}

/// Rebuilds `batch` with its tensors replaced, in visit order, by `replacements`. If
/// `replacements` runs short, the remaining tensors are kept as they are (clones).
///
/// ```
/// use pinlane::{batch::replace_tensors, Tensor};
/// let b = (Tensor::scalar(1u8), "keep", Tensor::scalar(2u8));
/// let r = replace_tensors(&b, vec![Tensor::scalar(9u8)]);
/// assert_eq!(r.0, Tensor::scalar(9u8));
/// assert_eq!(r.1, "keep");
/// assert_eq!(r.2, Tensor::scalar(2u8));
/// ```
pub fn replace_tensors<B: Batch>(batch: &B, replacements: Vec<Tensor>) -> B {
    let mut it = replacements.into_iter();
    batch.rebuild(&mut |t| it.next().unwrap_or_else(|| t.clone()))
}

/// Implements [`Batch`] for your own leaf types: values with no tensor inside, passed
/// through unchanged (cloned).
///
/// ```
/// #[derive(Clone, Debug, PartialEq)]
/// struct Meta { step: u32 }
/// pinlane::impl_leaf!(Meta);
///
/// let b = (Meta { step: 3 }, pinlane::Tensor::scalar(1.0f32));
/// assert_eq!(pinlane::batch::tensors(&b).len(), 1);
/// ```
#[macro_export]
macro_rules! impl_leaf {
    ($($t:ty),* $(,)?) => {$(
        impl $crate::Batch for $t {
            fn visit<'a>(&'a self, _f: &mut dyn FnMut(&'a $crate::Tensor)) {}
            fn rebuild(&self, _f: &mut dyn FnMut(&$crate::Tensor) -> $crate::Tensor) -> Self {
                ::core::clone::Clone::clone(self)
            }
        }
    )*};
}
