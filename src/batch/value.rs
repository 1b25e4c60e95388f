//! [`Value`]: a batch whose structure is known only at run time.

use super::{Batch, Path, Step};
use crate::tensor::Tensor;
use std::collections::BTreeMap;

/// A dynamic batch tree: lists, tuples, string-keyed maps, tensors and plain leaves,
/// nested freely (what a Python batch of dicts and lists looks like).
///
/// ```
/// use pinlane::{Leaf, Tensor, Value};
/// let v = Value::map([
///     ("pixels", Value::from(Tensor::from_vec(vec![0u8; 6], [2, 3]).unwrap())),
///     ("ids", Value::List(vec![Value::from(3i64), Value::from("x")])),
/// ]);
/// assert_eq!(pinlane::batch::tensors(&v).len(), 1);
/// assert_eq!(v.get("ids").unwrap(), &Value::List(vec![Leaf::Int(3).into(), Leaf::Str("x".into()).into()]));
/// ```
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// A tensor: moved by the transfers.
    Tensor(Tensor),
    /// A list, visited in order.
    List(Vec<Value>),
    /// A tuple, visited in order (kept apart from a list so that a round trip keeps it).
    Tuple(Vec<Value>),
    /// Keys are kept, in sorted order.
    Map(BTreeMap<String, Value>),
    /// Anything else, passed through unchanged.
    Leaf(Leaf),
}

/// A non-tensor leaf of a [`Value`], passed through transfers unchanged.
#[derive(Clone, Debug, PartialEq)]
pub enum Leaf {
    /// No value (Python's `None`).
    None,
    /// A boolean.
    Bool(bool),
    /// An integer.
    Int(i64),
    /// A float.
    Float(f64),
    /// A string.
    Str(String),
    /// Bytes.
    Bytes(Vec<u8>),
}

impl Value {
    /// A map from `(key, value)` pairs.
    pub fn map<K: Into<String>>(entries: impl IntoIterator<Item = (K, Value)>) -> Value {
        Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
    }

    /// The entry `key` of a map; `None` for other variants or a missing key.
    pub fn get(&self, key: &str) -> Option<&Value> {
        match self {
            Value::Map(m) => m.get(key),
            _ => None,
        }
    }

    /// The tensor, if this is a tensor.
    pub fn as_tensor(&self) -> Option<&Tensor> {
        match self {
            Value::Tensor(t) => Some(t),
            _ => None,
        }
    }
}

impl Batch for Value {
    fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
        match self {
            Value::Tensor(t) => f(t),
            Value::List(v) | Value::Tuple(v) => v.iter().for_each(|x| visit_item(x, f)),
            Value::Map(m) => m.values().for_each(|x| visit_item(x, f)),
            Value::Leaf(_) => {}
        }
    }
    fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
        match self {
            Value::Tensor(t) => Value::Tensor(f(t)),
            Value::List(v) => Value::List(v.iter().map(|x| x.rebuild(f)).collect()),
            Value::Tuple(v) => Value::Tuple(v.iter().map(|x| x.rebuild(f)).collect()),
            Value::Map(m) => Value::Map(m.iter().map(|(k, x)| (k.clone(), x.rebuild(f))).collect()),
            Value::Leaf(l) => Value::Leaf(l.clone()),
        }
    }
    fn visit_paths<'a>(&'a self, path: &mut Path, f: &mut dyn FnMut(&Path, &'a Tensor)) {
        match self {
            Value::Tensor(t) => f(path, t),
            Value::List(v) | Value::Tuple(v) => {
                super::std_impls::visit_items(v.iter(), Step::Index, path, f)
            }
            Value::Map(m) => {
                for (k, x) in m {
                    path.with(Step::Key(k.clone()), |p| x.visit_paths(p, f));
                }
            }
            Value::Leaf(_) => {}
        }
    }
    /// A map's keys are named in its paths already; this answers too, for a hand-written
    /// batch that holds a `Value` and numbers its tensors (the default `visit_paths`)
    /// while forwarding `keys_differ`, as the trait asks: its paths alone would not tell
    /// `{"a", "b"}` from `{"b", "c"}`.
    fn keys_differ(&self, other: &Self, path: &mut Path) -> Option<Path> {
        match (self, other) {
            (Value::Map(a), Value::Map(b)) => {
                if !a.keys().eq(b.keys()) {
                    return Some(path.clone());
                }
                a.iter().zip(b.values()).find_map(|((k, x), y)| {
                    path.with(Step::Key(k.clone()), |p| x.keys_differ(y, p))
                })
            }
            (Value::List(a), Value::List(b)) | (Value::Tuple(a), Value::Tuple(b)) => {
                super::std_impls::items_keys_differ(a.iter().zip(b), Step::Index, path)
            }
            // Other variants: their paths differ, or they hold no map.
            _ => None,
        }
    }
}

/// A container's item visited: a tensor here, not through a call per item (a batch of
/// many small tensors is mostly such items: 1000 of them walked in 2.8 us instead of 4.7 on
/// the CI machine, docs/performance-log.md, session 60).
fn visit_item<'a>(x: &'a Value, f: &mut dyn FnMut(&'a Tensor)) {
    match x {
        Value::Tensor(t) => f(t),
        x => x.visit(f),
    }
}

impl From<Tensor> for Value {
    fn from(t: Tensor) -> Self {
        Value::Tensor(t)
    }
}

impl From<Leaf> for Value {
    fn from(l: Leaf) -> Self {
        Value::Leaf(l)
    }
}

impl From<i64> for Value {
    fn from(v: i64) -> Self {
        Value::Leaf(Leaf::Int(v))
    }
}

impl From<f64> for Value {
    fn from(v: f64) -> Self {
        Value::Leaf(Leaf::Float(v))
    }
}

impl From<bool> for Value {
    fn from(v: bool) -> Self {
        Value::Leaf(Leaf::Bool(v))
    }
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Leaf(Leaf::Str(v.to_string()))
    }
}

impl From<String> for Value {
    fn from(v: String) -> Self {
        Value::Leaf(Leaf::Str(v))
    }
}

impl From<Vec<Value>> for Value {
    fn from(v: Vec<Value>) -> Self {
        Value::List(v)
    }
}
