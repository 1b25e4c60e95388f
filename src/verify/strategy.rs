//! proptest strategies for batches (feature `proptest`): dtypes, shapes, tensors whose
//! bytes reveal misplaced data ([`pattern`](super::pattern)), and nested [`Value`] batches.
//!
//! A strategy for your own `#[derive(Batch)]` type is a tuple of its fields' strategies,
//! mapped into the type:
//!
//! ```
//! use pinlane::verify::strategy::{shape, tensor_of, tensors};
//! use pinlane::{Batch, DType, Tensor};
//! use proptest::prelude::*;
//!
//! #[derive(Batch, Clone, Debug)]
//! struct Request {
//!     tokens: Tensor,
//!     images: Vec<Tensor>,
//! }
//!
//! fn request() -> impl Strategy<Value = Request> {
//!     (
//!         shape(1, 512).prop_flat_map(|s| tensor_of(DType::I64, s)),
//!         tensors(0..4, 3, 4096),
//!     )
//!         .prop_map(|(tokens, images)| Request { tokens, images })
//! }
//! # let _ = request();
//! ```

use super::patterned;
use crate::batch::{Leaf, Value};
use crate::dtype::DType;
use crate::tensor::Tensor;
use proptest::prelude::*;

/// Every dtype pinlane moves.
pub fn dtype() -> impl Strategy<Value = DType> {
    proptest::sample::select(DType::ALL.to_vec())
}

/// Shapes of rank 0 to `max_rank` (0-dim and zero-size ones included) with at most
/// `max_elems` elements. A 0-dim shape holds one element, so with `max_elems` 0 the
/// shapes are zero-size ones of rank 1 or more (`max_rank` 0 as well: `[]`, the only
/// shape of rank 0).
pub fn shape(max_rank: usize, max_elems: usize) -> impl Strategy<Value = Vec<usize>> {
    let side = (max_elems.max(1) as f64)
        .powf(1.0 / max_rank.max(1) as f64)
        .ceil() as usize;
    proptest::collection::vec(0..=side.max(1), 0..=max_rank).prop_map(move |mut dims| {
        // Shrink the largest dimension until the shape fits the element budget (a product
        // past `usize` does not).
        let over = |dims: &[usize]| {
            dims.iter()
                .try_fold(1usize, |n, &d| n.checked_mul(d))
                .is_none_or(|n| n > max_elems)
        };
        while over(&dims) {
            match dims.iter_mut().max() {
                Some(d) => *d -= 1,
                // 0-dim, one element over a budget of 0: zero-size instead, where it may be.
                None if max_rank > 0 => dims.push(0),
                None => break,
            }
        }
        dims
    })
}

/// Host tensors of `dtype` and `dims`, with [`pattern`](super::pattern) bytes (the seed
/// drawn). Dims whose byte size overflows `usize` make no value (the strategy rejects
/// them, and proptest reports too many rejections).
pub fn tensor_of(dtype: DType, dims: Vec<usize>) -> impl Strategy<Value = Tensor> {
    any::<u64>().prop_filter_map("the shape's byte size overflows usize", move |seed| {
        patterned(dtype, &dims, seed).ok()
    })
}

/// Host tensors of any dtype, rank 0 to `max_rank`, at most `max_elems` elements.
pub fn tensor(max_rank: usize, max_elems: usize) -> impl Strategy<Value = Tensor> {
    (dtype(), shape(max_rank, max_elems), any::<u64>())
        .prop_filter_map("the shape's byte size overflows usize", |(d, s, seed)| {
            patterned(d, &s, seed).ok()
        })
}

/// `Vec`s of [`tensor`]s, their length in `len`.
pub fn tensors(
    len: std::ops::Range<usize>,
    max_rank: usize,
    max_elems: usize,
) -> impl Strategy<Value = Vec<Tensor>> {
    proptest::collection::vec(tensor(max_rank, max_elems), len)
}

/// Non-tensor leaves of a [`Value`].
pub fn leaf() -> impl Strategy<Value = Leaf> {
    prop_oneof![
        Just(Leaf::None),
        any::<bool>().prop_map(Leaf::Bool),
        any::<i64>().prop_map(Leaf::Int),
        (-1e6f64..1e6).prop_map(Leaf::Float),
        "[a-z]{0,6}".prop_map(Leaf::Str),
        proptest::collection::vec(any::<u8>(), 0..4).prop_map(Leaf::Bytes),
    ]
}

/// Nested [`Value`] batches: lists, tuples and string-keyed maps, up to `depth` levels and
/// `width` items per container, of `tensors` (three in four leaves) and other leaves.
pub fn value_of(
    tensors: impl Strategy<Value = Tensor> + 'static,
    depth: u32,
    width: usize,
) -> impl Strategy<Value = Value> {
    let leafs = prop_oneof![
        3 => tensors.prop_map(Value::Tensor),
        1 => leaf().prop_map(Value::Leaf),
    ];
    leafs.prop_recursive(depth, (width * 8) as u32, width as u32, move |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..=width).prop_map(Value::List),
            proptest::collection::vec(inner.clone(), 0..=width.min(4)).prop_map(Value::Tuple),
            proptest::collection::btree_map("[a-z]{1,4}", inner, 0..=width.min(5))
                .prop_map(Value::Map),
        ]
    })
}

/// [`value_of`] small tensors (rank up to 4, up to 4,096 elements), 4 levels, 6 wide.
pub fn value() -> impl Strategy<Value = Value> {
    value_of(tensor(4, 4096), 4, 6)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;

    #[test]
    fn shapes_keep_their_budget_and_reach_the_edges() {
        let mut runner = TestRunner::deterministic();
        let (mut zero_dim, mut empty) = (false, false);
        for _ in 0..500 {
            let s = shape(3, 100).new_tree(&mut runner).unwrap().current();
            assert!(s.len() <= 3 && s.iter().product::<usize>() <= 100, "{s:?}");
            zero_dim |= s.is_empty();
            empty |= s.contains(&0);
        }
        assert!(
            zero_dim && empty,
            "0-dim and zero-size shapes are generated"
        );
    }

    /// Session 88 (a helper's review): a budget of 0 looped for ever on a 0-dim draw. (A
    /// budget of `usize::MAX` could overflow the product, a panic in debug builds, but
    /// only on the draw of every side at its largest: checked, not provoked, here.)
    #[test]
    fn shapes_at_the_budgets_edges_end_and_fit() {
        // On a thread of its own, so that a loop that never ends fails the test instead of
        // hanging it.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut runner = TestRunner::deterministic();
            let mut drawn = Vec::new();
            for _ in 0..200 {
                drawn.push(shape(3, 0).new_tree(&mut runner).unwrap().current());
                drawn.push(shape(0, 0).new_tree(&mut runner).unwrap().current());
                drawn.push(
                    shape(2, usize::MAX)
                        .new_tree(&mut runner)
                        .unwrap()
                        .current(),
                );
            }
            let _ = tx.send(drawn);
        });
        let drawn = rx
            .recv_timeout(std::time::Duration::from_secs(60))
            .expect("600 shapes drawn within a minute");
        for three in drawn.chunks(3) {
            let s = &three[0];
            assert!(!s.is_empty() && s.len() <= 3 && s.contains(&0), "{s:?}");
            assert!(three[1].is_empty(), "{:?}", three[1]);
            let s = &three[2];
            let n = s.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            assert!(s.len() <= 2 && n.is_some(), "{s:?}");
        }
    }
}
