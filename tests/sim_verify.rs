//! Round-trip verification as a user writes it (issue 24; docs/verify.md shows this file
//! to copy): a `#[derive(Batch)]` request type, a proptest over it with pinlane's
//! strategies, and `verify::round_trip` along all eight routes, on the simulated device.
//! And the proof that the checker finds bugs: a hand-written `Batch` whose rebuild swaps
//! two fields is reported with the field's path.
// The simulated device and the strategies: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::verify::strategy::{shape, tensor_of, tensors, value};
use pinlane::verify::{round_trip, MismatchKind, RoundTrip, VerifyError};
use pinlane::{Batch, DType, Tensor};
use proptest::prelude::*;

/// A request of an inference server: token ids, a few images, and an id that stays on
/// the host (not a tensor).
#[derive(Batch, Clone, Debug, PartialEq)]
struct Request {
    tokens: Tensor,
    images: Vec<Tensor>,
    #[batch(skip)]
    id: String,
}

/// Requests with up to 512 tokens and up to three images of any dtype and shape.
fn request() -> impl Strategy<Value = Request> {
    (
        shape(1, 512).prop_flat_map(|s| tensor_of(DType::I64, s)),
        tensors(0..4, 3, 4096),
        "[a-z]{0,8}",
    )
        .prop_map(|(tokens, images, id)| Request { tokens, images, id })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn requests_come_back_exact_every_way(r in request()) {
        common::sim();
        round_trip(&r, &RoundTrip::default()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }

    #[test]
    fn nested_values_come_back_exact_every_way(v in value()) {
        common::sim();
        round_trip(&v, &RoundTrip::default()).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

/// A deliberately wrong `Batch`: visit gives `a` then `b`, rebuild puts them back the
/// other way round. The transfers cannot see it (each tensor is moved, in order); the
/// checker must.
#[derive(Clone, Debug)]
struct Swapped {
    a: Tensor,
    b: Tensor,
}

impl Batch for Swapped {
    fn visit<'x>(&'x self, f: &mut dyn FnMut(&'x Tensor)) {
        f(&self.a);
        f(&self.b);
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        let a = f(&self.a);
        let b = f(&self.b);
        Swapped { a: b, b: a } // the bug
    }
    fn visit_paths<'x>(
        &'x self,
        path: &mut pinlane::batch::Path,
        f: &mut dyn FnMut(&pinlane::batch::Path, &'x Tensor),
    ) {
        use pinlane::batch::Step;
        path.with(Step::Field("a".into()), |p| f(p, &self.a));
        path.with(Step::Field("b".into()), |p| f(p, &self.b));
    }
}

#[test]
fn a_rebuild_that_swaps_two_fields_is_named() {
    common::sim();
    let batch = Swapped {
        a: common::tensor(DType::F32, &[2, 3], 1),
        b: common::tensor(DType::F32, &[2, 3], 2),
    };
    let err = round_trip(&batch, &RoundTrip::default()).expect_err("the swap is found");
    let VerifyError::Mismatch { mismatch, route } = &err else {
        panic!("{err}");
    };
    assert_eq!(mismatch.path.to_string(), "a");
    assert!(
        matches!(
            mismatch.kind,
            MismatchKind::Bytes {
                offset: 0,
                element: 0,
                ..
            }
        ),
        "{err}"
    );
    let shown = err.to_string();
    assert!(
        shown.contains(&route.to_string()) && shown.contains("a: byte 0 differs"),
        "{shown}"
    );
}

#[test]
fn a_device_batch_is_refused_with_its_path() {
    common::sim();
    let on = pinlane::transfer_tensor_h2d(&vec![Tensor::scalar(1u8)]).unwrap();
    match round_trip(&on, &RoundTrip::default()) {
        Err(VerifyError::NotHost { path, .. }) => assert_eq!(path.to_string(), "[0]"),
        r => panic!("{r:?}"),
    }
}

/// A HashMap made with room for many entries lists them in another order than the maps
/// the transfers rebuild (sized for what they hold): the checker pairs entries by key,
/// and the round trip passes every way.
#[test]
fn a_hash_map_listed_in_another_order_comes_back_exact() {
    common::sim();
    let mut m = std::collections::HashMap::with_capacity(4096);
    for k in 0..48u32 {
        m.insert(k * 7919, common::tensor(DType::F32, &[16], u64::from(k)));
    }
    let rebuilt = m.rebuild(&mut |t| t.clone());
    assert_ne!(
        m.keys().collect::<Vec<_>>(),
        rebuilt.keys().collect::<Vec<_>>(),
        "the premise: the rebuilt map lists its keys in another order"
    );
    round_trip(&m, &RoundTrip::default()).unwrap();
}

/// A deliberately wrong `Batch` over a map: rebuild renames the key "b" to "c" (the
/// order, and so every path, unchanged). Paths number a map's entries; the checker must
/// compare the keys.
#[derive(Clone, Debug)]
struct Renamed(std::collections::BTreeMap<String, Tensor>);

impl Batch for Renamed {
    fn visit<'x>(&'x self, f: &mut dyn FnMut(&'x Tensor)) {
        self.0.visit(f)
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        let mut m = self.0.rebuild(f);
        if let Some(t) = m.remove("b") {
            m.insert("c".into(), t); // the bug
        }
        Renamed(m)
    }
    fn visit_paths<'x>(
        &'x self,
        path: &mut pinlane::batch::Path,
        f: &mut dyn FnMut(&pinlane::batch::Path, &'x Tensor),
    ) {
        self.0.visit_paths(path, f)
    }
    fn keys_differ(
        &self,
        other: &Self,
        path: &mut pinlane::batch::Path,
    ) -> Option<pinlane::batch::Path> {
        self.0.keys_differ(&other.0, path)
    }
}

#[test]
fn a_rebuild_that_renames_a_key_is_named() {
    common::sim();
    let map = ["a", "b"]
        .iter()
        .enumerate()
        .map(|(i, k)| (k.to_string(), common::tensor(DType::U8, &[8], i as u64)))
        .collect();
    let batch = (common::tensor(DType::F32, &[4], 9), Renamed(map));
    let err = round_trip(&batch, &RoundTrip::default()).expect_err("the renamed key is found");
    let VerifyError::Mismatch { mismatch, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(mismatch.path.to_string(), "1");
    assert_eq!(mismatch.kind, MismatchKind::Keys, "{err}");
    assert!(
        err.to_string()
            .contains("1: the map there came back with other keys"),
        "{err}"
    );
}
