//! The Batch trait on every container, the derive, and the dynamic Value: order, keys,
//! skipped fields, enums, and flatten-then-rebuild round trips (proptest). No GPU needed.

mod common;

use pinlane::batch::{replace_tensors, tensors, tensors_with_paths, Path};
use pinlane::{Batch, Leaf, Tensor, Value};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

fn t(v: u8) -> Tensor {
    Tensor::scalar(v)
}

/// The scalar u8 values of a batch's tensors, in visit order.
fn order<B: Batch>(b: &B) -> Vec<u8> {
    tensors(b)
        .iter()
        .map(|t| t.to_vec::<u8>().unwrap()[0])
        .collect()
}

/// Rebuild replacing every u8 scalar `v` with `v + 100`.
fn bump<B: Batch>(b: &B) -> B {
    b.rebuild(&mut |x| Tensor::scalar(x.to_vec::<u8>().unwrap()[0] + 100))
}

#[test]
fn containers_visit_in_declaration_order() {
    let b = (
        t(1),
        vec![t(2), t(3)],
        [t(4), t(5)],
        Some(t(6)),
        None::<Tensor>,
        Box::new(t(7)),
        Arc::new(t(8)),
    );
    assert_eq!(order(&b), vec![1, 2, 3, 4, 5, 6, 7, 8]);
    assert_eq!(
        order(&bump(&b)),
        vec![101, 102, 103, 104, 105, 106, 107, 108]
    );
    assert!(bump(&b).4.is_none());
}

#[test]
fn btreemap_keeps_keys_and_visits_sorted() {
    let mut m = BTreeMap::new();
    m.insert("b".to_string(), t(2));
    m.insert("a".to_string(), t(1));
    assert_eq!(order(&m), vec![1, 2]);
    let r = bump(&m);
    assert_eq!(r.keys().collect::<Vec<_>>(), vec!["a", "b"]);
    assert_eq!(r["b"], t(102));
}

#[test]
fn hashmap_keeps_each_value_under_its_key() {
    let m: HashMap<u32, Tensor> = (0..50u8).map(|i| (u32::from(i) * 7, t(i))).collect();
    let r = bump(&m);
    assert_eq!(r.len(), 50);
    for i in 0..50u8 {
        assert_eq!(r[&(u32::from(i) * 7)], t(i + 100), "key {}", i);
    }
}

#[test]
fn twelve_tuple_and_nesting() {
    let b = (
        t(0),
        t(1),
        t(2),
        t(3),
        t(4),
        t(5),
        t(6),
        t(7),
        t(8),
        t(9),
        t(10),
        (t(11), vec![vec![t(12)]]),
    );
    assert_eq!(order(&b), (0..=12).collect::<Vec<u8>>());
}

#[test]
fn leaves_pass_through_unchanged() {
    let b = (1i32, 2.5f64, "s", String::from("x"), true, (), 'c', t(1));
    let r = bump(&b);
    assert_eq!(
        (r.0, r.1, r.2, r.3.as_str(), r.4, r.6),
        (1, 2.5, "s", "x", true, 'c')
    );
    assert_eq!(r.7, t(101));
}

#[derive(Clone, Debug, PartialEq)]
struct Meta(u64);
pinlane::impl_leaf!(Meta);

#[derive(Batch, Clone, Debug, PartialEq)]
struct Named {
    a: Tensor,
    #[batch(skip)]
    skipped: Tensor,
    meta: Meta,
    inner: Vec<Tensor>,
}

#[derive(Batch, Clone, Debug, PartialEq)]
struct TupleStruct(Tensor, #[batch(skip)] Tensor, Option<Tensor>);

#[derive(Batch, Clone, Debug, PartialEq)]
struct Unit;

#[derive(Batch, Clone, Debug, PartialEq)]
enum Either {
    Left(Tensor, #[batch(skip)] String),
    Right { x: Tensor, y: Vec<Tensor> },
    Nothing,
}

#[derive(Batch, Clone, Debug, PartialEq)]
struct Generic<T> {
    items: Vec<T>,
    #[batch(skip)]
    tag: T,
}

#[test]
fn derive_named_struct_skips_and_keeps_order() {
    let s = Named {
        a: t(1),
        skipped: t(9),
        meta: Meta(7),
        inner: vec![t(2), t(3)],
    };
    assert_eq!(order(&s), vec![1, 2, 3]);
    let r = bump(&s);
    assert_eq!(r.a, t(101));
    assert_eq!(r.skipped, t(9));
    assert!(
        r.skipped.same_storage(&s.skipped),
        "skipped fields are cloned, not rebuilt"
    );
    assert_eq!(r.meta, Meta(7));
    assert_eq!(order(&r.inner), vec![102, 103]);
}

#[test]
fn derive_tuple_unit_and_generic_structs() {
    let s = TupleStruct(t(1), t(2), Some(t(3)));
    assert_eq!(order(&s), vec![1, 3]);
    assert_eq!(bump(&s), TupleStruct(t(101), t(2), Some(t(103))));
    assert_eq!(tensors(&Unit).len(), 0);
    assert_eq!(bump(&Unit), Unit);
    let g = Generic {
        items: vec![t(1), t(2)],
        tag: t(5),
    };
    assert_eq!(order(&g), vec![1, 2]);
    assert_eq!(bump(&g).tag, t(5));
}

#[test]
fn derive_enum_variants() {
    let l = Either::Left(t(1), "keep".into());
    assert_eq!(bump(&l), Either::Left(t(101), "keep".into()));
    let r = Either::Right {
        x: t(1),
        y: vec![t(2)],
    };
    assert_eq!(order(&r), vec![1, 2]);
    assert_eq!(
        bump(&r),
        Either::Right {
            x: t(101),
            y: vec![t(102)]
        }
    );
    assert_eq!(bump(&Either::Nothing), Either::Nothing);
}

/// A variant whose fields carry the names the derive's own code uses: bound by name in
/// the variant's pattern, they do not shadow them (before session 67 this failed to
/// compile: `__f` and `__path` were call-site names).
#[derive(Batch, Clone, Debug, PartialEq)]
enum OwnNames {
    V {
        __f: Tensor,
        __path: Vec<Tensor>,
        __p: Option<Tensor>,
        __other: Tensor,
    },
}

#[test]
fn derive_fields_named_as_its_own_code_keep_their_meaning() {
    let v = OwnNames::V {
        __f: t(1),
        __path: vec![t(2)],
        __p: Some(t(3)),
        __other: t(4),
    };
    assert_eq!(order(&v), vec![1, 2, 3, 4]);
    assert_eq!(
        bump(&v),
        OwnNames::V {
            __f: t(101),
            __path: vec![t(102)],
            __p: Some(t(103)),
            __other: t(104),
        }
    );
    let paths: Vec<String> = pinlane::batch::tensors_with_paths(&v)
        .into_iter()
        .map(|(p, _)| p.to_string())
        .collect();
    assert_eq!(paths, ["V.__f", "V.__path[0]", "V.__p", "V.__other"]);
    assert_eq!(v.keys_differ(&v.clone(), &mut Default::default()), None);
}

#[test]
fn replace_tensors_keeps_the_rest_when_short() {
    let b = vec![t(1), t(2), t(3)];
    assert_eq!(order(&replace_tensors(&b, vec![t(50)])), vec![50, 2, 3]);
}

#[test]
fn value_tree_traversal() {
    let v = Value::map([
        ("z", Value::Tensor(t(3))),
        (
            "a",
            Value::List(vec![
                Value::Tensor(t(1)),
                Value::from(5i64),
                Value::Tuple(vec![Value::Tensor(t(2))]),
            ]),
        ),
        ("m", Value::Leaf(Leaf::Str("s".into()))),
    ]);
    assert_eq!(order(&v), vec![1, 2, 3]);
    let r = bump(&v);
    assert_eq!(r.get("m"), Some(&Value::Leaf(Leaf::Str("s".into()))));
    assert_eq!(r.get("z").and_then(Value::as_tensor), Some(&t(103)));
}

/// Each tensor's path, shown, in visit order.
fn paths<B: Batch>(b: &B) -> Vec<String> {
    tensors_with_paths(b)
        .into_iter()
        .map(|(p, _)| p.to_string())
        .collect()
}

/// A hand-written `Batch` that gives no paths of its own: the default numbers its tensors.
struct Pair(Tensor, Tensor);
impl Batch for Pair {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        f(&self.0);
        f(&self.1);
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        Pair(f(&self.0), f(&self.1))
    }
}

/// A field with a raw identifier: its path is its name.
#[derive(Batch, Clone, Debug, PartialEq)]
struct Raw {
    r#type: Tensor,
}

#[test]
fn paths_name_fields_positions_and_keys() {
    assert_eq!(paths(&Raw { r#type: t(1) }), ["type"]);
    let named = Named {
        a: t(1),
        skipped: t(0),
        meta: Meta(3),
        inner: vec![t(2), t(3)],
    };
    assert_eq!(paths(&named), ["a", "inner[0]", "inner[1]"]);
    assert_eq!(paths(&TupleStruct(t(1), t(0), Some(t(2)))), ["0", "2"]);
    let right = Either::Right {
        x: t(1),
        y: vec![t(2)],
    };
    assert_eq!(paths(&right), ["Right.x", "Right.y[0]"]);
    assert_eq!(paths(&Either::Left(t(1), "s".into())), ["Left.0"]);
    assert_eq!(paths(&t(1)), ["(the batch itself)"]);
    let mut m = BTreeMap::new();
    m.insert("b".to_string(), vec![t(1)]);
    m.insert("a".to_string(), vec![t(2), t(3)]);
    assert_eq!(
        paths(&m),
        ["#0[0]", "#0[1]", "#1[0]"],
        "maps number their entries"
    );
    let v = Value::Map(
        [
            (
                "img".to_string(),
                Value::List(vec![t(1).into(), t(2).into()]),
            ),
            (
                "x".to_string(),
                Value::Tuple(vec![Value::Leaf(Leaf::Int(1)), t(3).into()]),
            ),
        ]
        .into_iter()
        .collect(),
    );
    assert_eq!(paths(&v), [r#"["img"][0]"#, r#"["img"][1]"#, r#"["x"][1]"#]);
    assert_eq!(paths(&vec![Pair(t(1), t(2))]), ["[0]#0", "[0]#1"]);
    let mut under = Path::default();
    under.push(pinlane::batch::Step::Field("batch".into()));
    let mut seen = Vec::new();
    (t(1), [t(2)]).visit_paths(&mut under, &mut |p, _| seen.push(p.to_string()));
    assert_eq!(seen, ["batch.0", "batch.1[0]"]);
    assert_eq!(under.steps().len(), 1, "the path given is left as it was");
}

/// The property tests: the strategies are pinlane's (feature `proptest`, on with
/// `test-util`).
#[cfg(feature = "proptest")]
mod props {
    use super::*;
    use pinlane::DType;
    use proptest::prelude::*;

    type Nested = (
        Vec<Option<Tensor>>,
        BTreeMap<String, (Tensor, i32)>,
        [Tensor; 2],
    );

    fn nested() -> impl Strategy<Value = Nested> {
        (
            proptest::collection::vec(proptest::option::of(common::host_tensor()), 0..6),
            proptest::collection::btree_map(
                "[a-z]{1,3}",
                (common::host_tensor(), any::<i32>()),
                0..5,
            ),
            [common::host_tensor(), common::host_tensor()],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(256))]

        /// `visit_paths` gives the tensors `visit` gives, in the same order, and no two the
        /// same path.
        #[test]
        fn paths_follow_visit_order(v in common::value(), b in nested()) {
            let by_visit: Vec<*const Tensor> = tensors(&v).into_iter().map(|t| t as *const _).collect();
            let with_paths = tensors_with_paths(&v);
            let by_path: Vec<*const Tensor> = with_paths.iter().map(|(_, t)| *t as *const _).collect();
            prop_assert_eq!(by_visit, by_path);
            let distinct: std::collections::HashSet<_> = with_paths.iter().map(|(p, _)| p.clone()).collect();
            prop_assert_eq!(distinct.len(), with_paths.len());
            prop_assert_eq!(tensors(&b).len(), tensors_with_paths(&b).len());
        }

        /// Flatten, then rebuild from copies of the flattened tensors: an equal value, with
        /// the same structure, dtypes, shapes and bytes, and fresh storage.
        #[test]
        fn value_flatten_rebuild_round_trip(v in common::value()) {
            let flat: Vec<Tensor> = tensors(&v)
                .iter()
                .map(|t| Tensor::from_bytes(t.dtype(), t.dims().to_vec(), t.as_bytes().unwrap()).unwrap())
                .collect();
            let n = flat.len();
            let r = replace_tensors(&v, flat);
            prop_assert_eq!(&r, &v);
            prop_assert_eq!(common::fingerprint(&r), common::fingerprint(&v));
            let shared = tensors(&r).iter().zip(tensors(&v)).filter(|(a, b)| a.same_storage(b)).count();
            prop_assert!(n == 0 || shared == 0, "rebuilt tensors must be the replacements");
        }

        #[test]
        fn typed_nesting_flatten_rebuild_round_trip(b in nested()) {
            let flat: Vec<Tensor> = tensors(&b).iter().map(|t| Tensor::from_bytes(t.dtype(), t.dims().to_vec(), t.as_bytes().unwrap()).unwrap()).collect();
            let r = replace_tensors(&b, flat);
            prop_assert_eq!(&r, &b);
            prop_assert_eq!(r.1.keys().collect::<Vec<_>>(), b.1.keys().collect::<Vec<_>>());
        }

        /// A rebuild that changes one byte of one tensor is seen: the round-trip check can fail.
        #[test]
        fn a_changed_byte_is_detected(v in common::value(), pick in any::<prop::sample::Index>()) {
            let ts = tensors(&v);
            let with_bytes: Vec<usize> = (0..ts.len()).filter(|&i| ts[i].nbytes() > 0 && ts[i].dtype() != DType::Bool).collect();
            prop_assume!(!with_bytes.is_empty());
            let target = with_bytes[pick.index(with_bytes.len())];
            let flat: Vec<Tensor> = ts.iter().enumerate().map(|(i, t)| {
                let mut bytes = t.as_bytes().unwrap().to_vec();
                if i == target { bytes[0] ^= 0x80; }
                Tensor::from_bytes(t.dtype(), t.dims().to_vec(), &bytes).unwrap()
            }).collect();
            prop_assert_ne!(replace_tensors(&v, flat), v);
        }
    }
}

/// Maps inside derived types, for `keys_differ`: a struct field, a tuple struct's
/// field, an enum variant's field, under a Vec.
#[derive(Batch, Clone, Debug)]
struct Keyed {
    first: Tensor,
    maps: Vec<BTreeMap<String, Tensor>>,
    by_id: HashMap<u32, Tensor>,
    #[batch(skip)]
    note: String,
}

#[derive(Batch, Clone, Debug)]
struct Wrapped(Tensor, BTreeMap<u8, Tensor>);

#[derive(Batch, Clone, Debug)]
enum PlainOrMapped {
    Plain(Tensor),
    Mapped { inner: Wrapped },
}

fn btree(keys: &[&str]) -> BTreeMap<String, Tensor> {
    keys.iter().map(|k| (k.to_string(), t(1))).collect()
}

#[test]
fn keys_differ_names_the_first_map_with_other_keys() {
    let at = |a: &dyn Fn() -> Option<Path>| a().map(|p| p.to_string());
    let base = Keyed {
        first: t(0),
        maps: vec![btree(&["a", "b"]), btree(&["x"])],
        by_id: (0..4u32).map(|k| (k, t(2))).collect(),
        note: "n".into(),
    };
    // The same keys everywhere (a skipped field may differ: it is not structure).
    let mut same = base.clone();
    same.note = "other".into();
    assert_eq!(at(&|| base.keys_differ(&same, &mut Path::default())), None);
    // A BTreeMap with as many entries and another key: the same paths, so only the keys
    // tell them apart.
    let mut other = base.clone();
    other.maps[1] = btree(&["y"]);
    assert_eq!(
        tensors_with_paths(&base)
            .iter()
            .map(|(p, _)| p.to_string())
            .collect::<Vec<_>>(),
        tensors_with_paths(&other)
            .iter()
            .map(|(p, _)| p.to_string())
            .collect::<Vec<_>>(),
    );
    assert_eq!(
        at(&|| base.keys_differ(&other, &mut Path::default())),
        Some("maps[1]".into())
    );
    // A HashMap with a key swapped for another.
    let mut other = base.clone();
    other.by_id.remove(&3);
    other.by_id.insert(9, t(2));
    assert_eq!(
        at(&|| base.keys_differ(&other, &mut Path::default())),
        Some("by_id".into())
    );
    // Tuple structs and enum variants, named as their paths name them.
    let w = |k: u8| Wrapped(t(0), [(k, t(1))].into_iter().collect());
    assert_eq!(
        at(&|| w(1).keys_differ(&w(2), &mut Path::default())),
        Some("1".into())
    );
    let e = |k: u8| PlainOrMapped::Mapped { inner: w(k) };
    assert_eq!(
        at(&|| e(1).keys_differ(&e(2), &mut Path::default())),
        Some("Mapped.inner.1".into())
    );
    assert_eq!(at(&|| e(1).keys_differ(&e(1), &mut Path::default())), None);
    // Other variants: their paths differ already; nothing to pair below.
    assert_eq!(
        at(&|| e(1).keys_differ(&PlainOrMapped::Plain(t(0)), &mut Path::default())),
        None
    );
}

/// A HashMap's entries are named by their keys' hashes: the map a rebuild makes (sized
/// for what it holds) lists them in another order than one made with room for more, and
/// the same key keeps its path.
#[test]
fn hash_map_paths_follow_keys_not_positions() {
    let mut m = HashMap::with_capacity(4096);
    for k in 0..64u32 {
        m.insert(k * 7919, Tensor::scalar(k));
    }
    let r = m.rebuild(&mut |x| x.clone());
    let keys = |m: &HashMap<u32, Tensor>| m.keys().copied().collect::<Vec<_>>();
    assert_ne!(keys(&m), keys(&r), "the premise: another order");
    let by_path = |m: &HashMap<u32, Tensor>| {
        let mut v: Vec<(Path, u32)> = tensors_with_paths(m)
            .into_iter()
            .map(|(p, t)| (p, t.to_vec::<u32>().unwrap()[0]))
            .collect();
        v.sort();
        v
    };
    assert_eq!(by_path(&m), by_path(&r));
    assert_eq!(pinlane::verify::first_difference(&m, &r), None);
}

/// Two HashMaps built apart (each with a `RandomState` of its own) holding the same
/// entries: the same paths, whatever each map's hasher and order, so the checker finds
/// no difference; another value under one key is found at that key.
#[test]
fn hash_maps_built_apart_compare_by_key() {
    let a: HashMap<String, Tensor> = (0..32u8).map(|k| (format!("k{k}"), t(k))).collect();
    let mut b: HashMap<String, Tensor> = HashMap::with_capacity(1024);
    for k in (0..32u8).rev() {
        b.insert(format!("k{k}"), t(k));
    }
    assert_eq!(pinlane::verify::first_difference(&a, &b), None);
    b.insert("k7".into(), t(70));
    let m = pinlane::verify::first_difference(&a, &b).expect("k7 differs");
    let (at, _) = tensors_with_paths(&a)
        .into_iter()
        .find(|(_, x)| x.to_vec::<u8>().unwrap()[0] == 7)
        .unwrap();
    assert_eq!(m.path, at);
}

/// Keys of a type that hashes part of itself share one name in paths: a map that came
/// back with one key's tensor under the other key compared equal by path. Now the map is
/// reported (`MismatchKind::Keys`), never passed.
#[test]
fn hash_map_keys_of_one_hash_are_reported_not_paired() {
    #[derive(Clone, Debug, PartialEq, Eq)]
    struct K(u8);
    impl std::hash::Hash for K {
        fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
            0u8.hash(h)
        }
    }
    let sent: HashMap<K, Option<Tensor>> = [(K(1), Some(t(1))), (K(2), None)].into();
    let back: HashMap<K, Option<Tensor>> = [(K(1), None), (K(2), Some(t(1)))].into();
    let m = pinlane::verify::first_difference(&sent, &back).expect("not the same batch");
    assert!(
        matches!(m.kind, pinlane::verify::MismatchKind::Keys),
        "{m:?}"
    );
}
