//! What [`round_trip`](super::round_trip) reports, and the comparison that finds it.

use super::Route;
use crate::batch::{tensors_with_paths, Batch, Path, Step};
use crate::dtype::DType;
use crate::error::Error;
use crate::location::Location;
use crate::tensor::Tensor;
use std::fmt;

/// Why a round trip did not verify.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerifyError {
    /// The batch came back different along `route`.
    #[error("round trip ({route}): {mismatch}")]
    Mismatch {
        /// The route.
        route: Route,
        /// What differs, and where.
        mismatch: Mismatch,
    },
    /// A call failed along `route`.
    #[error("round trip ({route}): {error}")]
    Transfer {
        /// The route.
        route: Route,
        /// The call's error.
        #[source]
        error: Error,
    },
    /// A non-blocking call did not complete within [`RoundTrip::wait`](super::RoundTrip::wait).
    #[error("round trip ({route}): a non-blocking call did not complete within {waited_ms} ms")]
    Timeout {
        /// The route.
        route: Route,
        /// The bound, in milliseconds.
        waited_ms: u64,
    },
    /// The batch holds a tensor that is not on the host: the check starts from host
    /// batches.
    #[error(
        "round trip: {path} is on {location}, not on the host; the check starts from host batches"
    )]
    NotHost {
        /// The tensor.
        path: Path,
        /// Where it is.
        location: Location,
    },
    /// No route could start: no device (no CUDA driver and not the simulated one), a
    /// device that is not there, or no route chosen (an empty list of calls, sources or
    /// outputs).
    #[error("round trip: {0}")]
    Setup(#[source] Error),
}

/// Where a batch came back different, and how.
#[derive(Clone, Debug, PartialEq)]
pub struct Mismatch {
    /// The tensor, by its place in the batch (the root when the structure differs).
    pub path: Path,
    /// What differs.
    pub kind: MismatchKind,
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.path, self.kind)
    }
}

/// What differs about one tensor (or the batch's structure).
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum MismatchKind {
    /// A different number of tensors.
    Count {
        /// In the batch given.
        expected: usize,
        /// In the batch back.
        found: usize,
    },
    /// A map (a `BTreeMap` or `HashMap`) came back with other keys, or is a `HashMap` two
    /// of whose keys have the same hash (its entries, named by their keys' hashes, cannot
    /// be compared by key); the path is the map's.
    Keys,
    /// The tensor at this position of the visit order sits elsewhere.
    Place {
        /// Where it came back.
        found: Path,
    },
    /// Not on the device after the H2D.
    NotMoved {
        /// Where it is.
        location: Location,
    },
    /// Back in other memory than the route's outputs (a page-locked output pool with no
    /// room gives ordinary memory instead: the route's own path did not run).
    NotInOutputs {
        /// The route's outputs' memory.
        expected: Location,
        /// Where it came back.
        found: Location,
    },
    /// Another dtype.
    DType {
        /// Given.
        expected: DType,
        /// Back.
        found: DType,
    },
    /// Another shape.
    Shape {
        /// Given.
        expected: Vec<usize>,
        /// Back.
        found: Vec<usize>,
    },
    /// Other bytes: the first that differs.
    Bytes {
        /// Its offset in the tensor's bytes.
        offset: usize,
        /// The element it belongs to (row-major index).
        element: usize,
        /// The tensor's dtype.
        dtype: DType,
        /// That element's bytes, given.
        expected: Vec<u8>,
        /// That element's bytes, back.
        found: Vec<u8>,
    },
}

impl fmt::Display for MismatchKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MismatchKind::Count { expected, found } => {
                write!(f, "{found} tensors came back, {expected} were sent")
            }
            MismatchKind::Keys => write!(
                f,
                "the map there came back with other keys (or holds two keys of one hash)"
            ),
            MismatchKind::Place { found } => write!(f, "came back at {found}"),
            MismatchKind::NotMoved { location } => {
                write!(f, "on {location} after the H2D, not on the device")
            }
            MismatchKind::NotInOutputs { expected, found } => write!(
                f,
                "came back in {found} memory, not in the route's {expected} outputs (the \
                 route's own path did not run: raise the page-locked output pool's cap, \
                 Config::pinned_output_bytes, or verify a smaller batch)"
            ),
            MismatchKind::DType { expected, found } => {
                write!(f, "dtype {found}, sent as {expected}")
            }
            MismatchKind::Shape { expected, found } => {
                write!(f, "shape {found:?}, sent as {expected:?}")
            }
            MismatchKind::Bytes {
                offset,
                element,
                dtype,
                expected,
                found,
            } => write!(
                f,
                "byte {offset} differs: element {element} ({dtype}) is {} [{}], sent as {} [{}]",
                value(*dtype, found),
                hex(found),
                value(*dtype, expected),
                hex(expected)
            ),
        }
    }
}

fn hex(b: &[u8]) -> String {
    b.iter()
        .map(|x| format!("{x:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// An element's value, from its little-endian bytes.
fn value(dtype: DType, b: &[u8]) -> String {
    fn arr<const N: usize>(b: &[u8]) -> [u8; N] {
        let mut a = [0u8; N];
        let n = b.len().min(N);
        a[..n].copy_from_slice(&b[..n]);
        a
    }
    match dtype {
        DType::Bool => format!("{}", b.first().copied().unwrap_or(0)),
        DType::U8 => format!("{}", arr::<1>(b)[0]),
        DType::I8 => format!("{}", i8::from_le_bytes(arr(b))),
        DType::I16 => format!("{}", i16::from_le_bytes(arr(b))),
        DType::I32 => format!("{}", i32::from_le_bytes(arr(b))),
        DType::I64 => format!("{}", i64::from_le_bytes(arr(b))),
        DType::U16 => format!("{}", u16::from_le_bytes(arr(b))),
        DType::U32 => format!("{}", u32::from_le_bytes(arr(b))),
        DType::U64 => format!("{}", u64::from_le_bytes(arr(b))),
        DType::F16 => format!("{}", half::f16::from_le_bytes(arr(b))),
        DType::Bf16 => format!("{}", half::bf16::from_le_bytes(arr(b))),
        DType::F32 => format!("{}", f32::from_le_bytes(arr(b))),
        DType::F64 => format!("{}", f64::from_le_bytes(arr(b))),
    }
}

/// `Err(NotHost)` for the first tensor of `batch` that is not host memory.
pub(super) fn all_on_host<B: Batch>(batch: &B) -> Result<(), VerifyError> {
    match tensors_with_paths(batch)
        .into_iter()
        .find(|(_, t)| t.is_cuda())
    {
        Some((path, t)) => Err(VerifyError::NotHost {
            path,
            location: t.location(),
        }),
        None => Ok(()),
    }
}

/// `Err(Mismatch)` for the first tensor of `on` that is not on the route's device.
pub(super) fn all_on_device<B: Batch>(on: &B, route: Route) -> Result<(), VerifyError> {
    let want = Location::Cuda(route.device);
    match tensors_with_paths(on)
        .into_iter()
        .find(|(_, t)| t.location() != want)
    {
        Some((path, t)) => Err(VerifyError::Mismatch {
            route,
            mismatch: Mismatch {
                path,
                kind: MismatchKind::NotMoved {
                    location: t.location(),
                },
            },
        }),
        None => Ok(()),
    }
}

/// After the D2H: every tensor with bytes is in the memory `route.output` names, so the
/// route's own path ran (an error naming the first that is not).
pub(super) fn all_in_outputs<B: Batch>(back: &B, route: Route) -> Result<(), VerifyError> {
    let want = match route.output {
        crate::engine::HostOutput::Pinned => Location::Pinned,
        crate::engine::HostOutput::Pageable => Location::Host,
    };
    match tensors_with_paths(back)
        .into_iter()
        .find(|(_, t)| t.nbytes() > 0 && t.location() != want)
    {
        Some((path, t)) => Err(VerifyError::Mismatch {
            route,
            mismatch: Mismatch {
                path,
                kind: MismatchKind::NotInOutputs {
                    expected: want,
                    found: t.location(),
                },
            },
        }),
        None => Ok(()),
    }
}

/// The first difference between `sent` and `back` (both host batches), if any.
pub(super) fn compare<B: Batch>(sent: &B, back: &B, route: Route) -> Result<(), VerifyError> {
    match first_difference(sent, back) {
        Some(mismatch) => Err(VerifyError::Mismatch { route, mismatch }),
        None => Ok(()),
    }
}

/// The first difference between two host batches: structure (the number of tensors, a
/// map's keys), then each tensor in visit order (place, dtype, shape, bytes). A
/// `HashMap`'s entries are paired by key, not by position (a map rebuilt by a transfer may
/// list the same keys in another order): with one in the batch, the tensors are compared
/// in path order.
pub fn first_difference<B: Batch>(sent: &B, back: &B) -> Option<Mismatch> {
    let mut a = tensors_with_paths(sent);
    let mut b = tensors_with_paths(back);
    if a.len() != b.len() {
        return Some(Mismatch {
            path: Path::default(),
            kind: MismatchKind::Count {
                expected: a.len(),
                found: b.len(),
            },
        });
    }
    if let Some(path) = sent.keys_differ(back, &mut Path::default()) {
        return Some(Mismatch {
            path,
            kind: MismatchKind::Keys,
        });
    }
    let unordered =
        |(p, _): &(Path, &Tensor)| p.steps().iter().any(|s| matches!(s, Step::Unordered(_)));
    if a.iter().any(unordered) {
        // Entries named by their keys' hashes (Step::Unordered): both lists in path
        // order, so that the same key pairs whatever order each map lists its entries in.
        // Paths are unique (but for two keys of one map with the same 64-bit hash, which
        // the stable sort leaves in visit order).
        a.sort_by(|x, y| x.0.cmp(&y.0));
        b.sort_by(|x, y| x.0.cmp(&y.0));
    }
    a.into_iter()
        .zip(b)
        .find_map(|((pa, ta), (pb, tb))| tensor_difference(ta, tb, &pa, &pb))
}

fn tensor_difference(a: &Tensor, b: &Tensor, pa: &Path, pb: &Path) -> Option<Mismatch> {
    let at = |kind| {
        Some(Mismatch {
            path: pa.clone(),
            kind,
        })
    };
    if pa != pb {
        return at(MismatchKind::Place { found: pb.clone() });
    }
    if a.dtype() != b.dtype() {
        return at(MismatchKind::DType {
            expected: a.dtype(),
            found: b.dtype(),
        });
    }
    if a.dims() != b.dims() {
        return at(MismatchKind::Shape {
            expected: a.dims().to_vec(),
            found: b.dims().to_vec(),
        });
    }
    let (Ok(x), Ok(y)) = (a.as_bytes(), b.as_bytes()) else {
        let location = if a.as_bytes().is_err() {
            a.location()
        } else {
            b.location()
        };
        return at(MismatchKind::NotMoved { location });
    };
    let offset = x.iter().zip(y).position(|(p, q)| p != q)?;
    let size = a.dtype().size().max(1);
    let element = offset / size;
    let span = element * size..((element + 1) * size).min(x.len());
    at(MismatchKind::Bytes {
        offset,
        element,
        dtype: a.dtype(),
        expected: x[span.clone()].to_vec(),
        found: y[span].to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Value;

    fn t(v: Vec<f32>) -> Tensor {
        let n = v.len();
        Tensor::from_vec(v, [n]).unwrap()
    }

    #[test]
    fn names_the_tensor_the_byte_and_both_values() {
        let sent = Value::List(vec![t(vec![1.0, 2.0]).into(), t(vec![3.0, 4.0]).into()]);
        let back = Value::List(vec![t(vec![1.0, 2.0]).into(), t(vec![3.0, 5.0]).into()]);
        let m = first_difference(&sent, &back).expect("a difference");
        assert_eq!(m.path.to_string(), "[1]");
        match &m.kind {
            MismatchKind::Bytes {
                offset, element, ..
            } => assert_eq!((*offset, *element), (6, 1)), // 4.0 = 00 00 80 40, 5.0 = 00 00 a0 40
            k => panic!("{k:?}"),
        }
        assert_eq!(
            m.to_string(),
            "[1]: byte 6 differs: element 1 (f32) is 5 [00 00 a0 40], sent as 4 [00 00 80 40]"
        );
        assert_eq!(first_difference(&sent, &sent.clone()), None);
    }

    #[test]
    fn structure_dtype_and_shape_come_first() {
        let two = (t(vec![1.0]), t(vec![2.0]));
        let swapped = (Tensor::scalar(1u8), t(vec![2.0]));
        let m = first_difference(&two, &swapped).unwrap();
        assert_eq!(m.to_string(), "0: dtype u8, sent as f32");
        let longer = (t(vec![1.0]), t(vec![2.0, 0.0]));
        assert_eq!(
            first_difference(&two, &longer).unwrap().to_string(),
            "1: shape [2], sent as [1]"
        );
        let fewer = Value::List(vec![t(vec![1.0]).into()]);
        let more = Value::List(vec![t(vec![1.0]).into(), t(vec![1.0]).into()]);
        assert_eq!(
            first_difference(&fewer, &more).unwrap().to_string(),
            "(the batch itself): 2 tensors came back, 1 were sent"
        );
        let moved = Value::List(vec![Value::List(vec![t(vec![1.0]).into()])]);
        assert_eq!(
            first_difference(&more, &moved).map(|m| m.kind),
            Some(MismatchKind::Count {
                expected: 2,
                found: 1
            })
        );
        // A map whose keys changed is reported at the map, as a `BTreeMap`'s is (since
        // session 78, when `Value` began answering `keys_differ`; before, at its tensor:
        // `["a"]: came back at ["b"]`).
        let a = Value::Map([("a".to_string(), t(vec![1.0]).into())].into());
        let b = Value::Map([("b".to_string(), t(vec![1.0]).into())].into());
        let m = first_difference(&a, &b).unwrap();
        assert_eq!(m.kind, MismatchKind::Keys);
        assert_eq!(m.path, Path::default());
        let nested = |k: &str| {
            Value::List(vec![Value::Map(
                [(k.to_string(), t(vec![1.0]).into())].into(),
            )])
        };
        assert_eq!(
            first_difference(&nested("a"), &nested("b"))
                .unwrap()
                .to_string(),
            "[0]: the map there came back with other keys (or holds two keys of one hash)"
        );
    }
}
