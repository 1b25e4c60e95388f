//! Flat batches (a `dict`, `list` or `tuple` of plain torch tensors: a training batch, a
//! request's inputs) walked and rebuilt here, in the call that moves them, instead of by
//! the Python half's walk (`flatten`, `any(map(Tensor.is_neg, ...))`, `rebuild`), which
//! costs microseconds of interpreter work a call.

use crate::split;
use crate::transfer::{d2h_plain, h2d_plain};
use pyo3::exceptions::PyRuntimeError;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyList, PyTuple};

/// A flat batch taken apart: its dict's keys (`None` for a list or tuple) and its tensors
/// (a clone of them goes to the call; these stay for `rebuilt`'s check that nothing
/// moved).
struct Parts<'py> {
    keys: Option<Vec<Bound<'py, PyAny>>>,
    tensors: Vec<Bound<'py, PyAny>>,
}

/// `builtins.any` and `builtins.map`, looked up once per process.
static ANY_MAP: PyOnceLock<(Py<PyAny>, Py<PyAny>)> = PyOnceLock::new();

/// `batch` taken apart if it is a non-empty `dict`, `list` or `tuple` (exactly those
/// types) whose values or items are all exactly `tensor_type` (no subclass) without the
/// negation bit; `None` otherwise. The keys and values are taken before the call lets go
/// of the GIL: the batch rebuilt is the one the call was given, even if another thread
/// changes the container meanwhile.
fn parts<'py>(
    batch: &Bound<'py, PyAny>,
    tensor_type: &Bound<'py, PyAny>,
) -> PyResult<Option<Parts<'py>>> {
    let py = batch.py();
    let (keys, tensors, seq): (Option<Vec<_>>, Vec<_>, Bound<'py, PyAny>) =
        if let Ok(d) = batch.cast_exact::<PyDict>() {
            let (k, v) = d.iter().unzip();
            (Some(k), v, d.values().into_any())
        } else if let Ok(l) = batch.cast_exact::<PyList>() {
            (None, l.iter().collect(), batch.clone())
        } else if let Ok(t) = batch.cast_exact::<PyTuple>() {
            (None, t.iter().collect(), batch.clone())
        } else {
            return Ok(None);
        };
    // An empty batch takes the general path (which returns it once the device string is
    // checked, without resolving LOCAL_RANK).
    if tensors.is_empty() || !tensors.iter().all(|t| t.get_type().is(tensor_type)) {
        return Ok(None);
    }
    // Asked all at once, as the general path asks it (`any(map(Tensor.is_neg, ...))`:
    // ~0.1 us a tensor, where a method call from here costs ~1 us under the stable ABI).
    let (any, map) = ANY_MAP.get_or_try_init(py, || -> PyResult<_> {
        let b = py.import("builtins")?;
        Ok((b.getattr("any")?.unbind(), b.getattr("map")?.unbind()))
    })?;
    let is_neg = tensor_type.getattr(intern!(py, "is_neg"))?;
    let mapped = map.bind(py).call1((is_neg, seq))?;
    if any.bind(py).call1((mapped,))?.is_truthy()? {
        return Ok(None);
    }
    Ok(Some(Parts { keys, tensors }))
}

/// `batch` (taken apart as `parts`) with each tensor replaced by its output, of its own
/// type, keys in their order; `batch` itself where every output is its input (nothing
/// moved), as the Python half's `rebuild` gives it.
fn rebuilt<'py>(
    py: Python<'py>,
    batch: Bound<'py, PyAny>,
    parts: Parts<'py>,
    outs: Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    if outs.len() != parts.tensors.len() {
        return Err(PyRuntimeError::new_err(
            "pinlane: a flat batch's call did not give one output per tensor",
        ));
    }
    if outs.iter().zip(&parts.tensors).all(|(o, t)| o.is(t)) {
        return Ok(batch);
    }
    Ok(if let Some(keys) = parts.keys {
        let new = PyDict::new(py);
        for (k, o) in keys.into_iter().zip(outs) {
            new.set_item(k, o)?;
        }
        new.into_any()
    } else if batch.is_exact_instance_of::<PyList>() {
        PyList::new(py, outs)?.into_any()
    } else {
        PyTuple::new(py, outs)?.into_any()
    })
}

/// `transfer_tensor_d2h` of a flat batch ([`parts`]), from `device` (`None`:
/// cuda:{LOCAL_RANK}), with no stream or event: the batch rebuilt with its outputs, or
/// `None` for any other batch (the Python half then takes its general path).
#[pyfunction]
#[pyo3(signature = (batch, tensor_type, device, /))]
pub(crate) fn d2h_flat<'py>(
    py: Python<'py>,
    batch: Bound<'py, PyAny>,
    tensor_type: Bound<'py, PyAny>,
    device: Option<&str>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let entry = split::start();
    let Some(parts) = parts(&batch, &tensor_type)? else {
        entry.decline();
        return Ok(None);
    };
    split::mark("walked");
    let outs = d2h_plain(py, parts.tensors.clone(), device)?;
    let out = rebuilt(py, batch, parts, outs).map(Some);
    split::mark("rebuilt");
    drop(entry);
    out
}

/// `transfer_tensor_h2d` of a flat batch ([`parts`]) onto cuda:{LOCAL_RANK}: the batch
/// rebuilt with its outputs, or `None` for any other batch (the Python half then takes
/// its general path).
#[pyfunction]
#[pyo3(signature = (batch, tensor_type, num_caches, /))]
pub(crate) fn h2d_flat<'py>(
    py: Python<'py>,
    batch: Bound<'py, PyAny>,
    tensor_type: Bound<'py, PyAny>,
    num_caches: Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    let entry = split::start();
    let Some(parts) = parts(&batch, &tensor_type)? else {
        entry.decline();
        return Ok(None);
    };
    split::mark("walked");
    // Read only now, as the general path reads it only for a batch with tensors (an int
    // of 0 or more, checked by the Python half; past `usize` it is an `OverflowError`).
    let num_caches: usize = num_caches.extract()?;
    let outs = h2d_plain(py, parts.tensors.clone(), num_caches)?;
    let out = rebuilt(py, batch, parts, outs).map(Some);
    split::mark("rebuilt");
    drop(entry);
    out
}
