//! pinlane's errors as the exceptions spdl raises for the same input.
//!
//! spdl: `ValueError` when the device is not a CUDA device or a custom stream does not
//! match the device; `RuntimeError` when the resolved device index is unavailable. The
//! rest of pinlane's bad-input errors are `ValueError` too; failures of the driver or of
//! memory are `RuntimeError` (`MemoryError` for out of memory), and so is a `LOCAL_RANK`
//! that names no device (an integer: the resolved index is unavailable). A `LOCAL_RANK`
//! that is no integer is a `ValueError`, as spdl's `int(os.environ["LOCAL_RANK"])` raises.

use pinlane::{CheckpointFault, Error};
use pyo3::exceptions::{PyMemoryError, PyOSError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Mutex, PoisonError};

/// The attribute of an exception that holds the pinlane error recorded by earlier work
/// ([`Error::Deferred`]) that the call raised, as an [`Unreceived`].
/// `_native.UNRECEIVED`, which the Python half asks for.
pub(crate) const UNRECEIVED: &str = "_pinlane_unreceived";

/// The error inside an [`Error::Deferred`] a call raised, kept on its exception so that a
/// worker whose consumer will not take the exception can give it back for the device's
/// next call ([`put_back_unreceived`]) instead of losing somebody else's error.
#[pyclass(frozen)]
pub(crate) struct Unreceived(Mutex<Option<Error>>);

#[pymethods]
impl Unreceived {
    /// Pickled or deep-copied (the exception's `__dict__` with it: multiprocessing, torch
    /// elastic's error files), it becomes `None`: the error stays with this process's
    /// exception, and the copy can still be pickled.
    fn __reduce__<'py>(&self, py: Python<'py>) -> (Bound<'py, pyo3::types::PyType>, ()) {
        (py.None().into_bound(py).get_type(), ())
    }
}

/// The Python exception for a pinlane error, its message pinlane's; one for an
/// [`Error::Deferred`] holds the error inside it (see [`Unreceived`]).
pub(crate) fn to_py(e: Error) -> PyErr {
    let err = exception(&e);
    match e {
        Error::Deferred(inner) => Python::attach(|py| {
            let held = Py::new(py, Unreceived(Mutex::new(Some(*inner))))
                .and_then(|u| err.value(py).setattr(UNRECEIVED, u));
            // Without it the exception is the same; only a give-back would find nothing.
            drop(held);
            err
        }),
        _ => err,
    }
}

/// Gives the pinlane error that `exc` holds (see [`Unreceived`]; taken once) back for the
/// next call on the default device (`cuda:{LOCAL_RANK}`, the device `pinlane.prefetch`
/// moves to) on any thread: for an exception nobody will take (the prefetch worker's,
/// after `close()`). Says whether there was one to give back.
#[pyfunction]
pub(crate) fn put_back_unreceived(exc: &Bound<'_, PyAny>) -> bool {
    let Ok(held) = exc.getattr(UNRECEIVED) else {
        return false;
    };
    let Ok(held) = held.cast::<Unreceived>() else {
        return false;
    };
    // The device first: a `LOCAL_RANK` that names no device now leaves the error on the
    // exception (which the caller still holds) rather than taken and dropped.
    let Ok(device) = crate::local_rank_device() else {
        return false;
    };
    let taken = held
        .get()
        .0
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .take();
    let Some(e) = taken else {
        return false;
    };
    pinlane::driver::deferred::put_back(device, e);
    true
}

/// The exception for `e`, its message pinlane's.
fn exception(e: &Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::InvalidDevice { .. }
        | Error::StreamWithoutDevice
        | Error::StreamDeviceMismatch { .. }
        | Error::EventDeviceMismatch { .. }
        | Error::SealedEvent { .. }
        | Error::ForeignStream { .. }
        | Error::InvalidOption { .. }
        | Error::InvalidConfig { .. }
        | Error::DLPack { .. }
        | Error::IntoMismatch { .. }
        | Error::OverlappingDestinations { .. }
        | Error::External { .. } => PyValueError::new_err(msg),
        Error::InvalidLocalRank { value, .. } if value.trim().parse::<i64>().is_err() => {
            PyValueError::new_err(msg)
        }
        Error::Driver { error, .. } if error.is_out_of_memory() => PyMemoryError::new_err(msg),
        // A checkpoint that cannot be read is an OSError (as `open` raises); one that is
        // malformed, or asks for what pinlane cannot load, a ValueError.
        Error::Checkpoint {
            fault: CheckpointFault::Io,
            ..
        } => PyOSError::new_err(msg),
        Error::Checkpoint { .. } => PyValueError::new_err(msg),
        Error::Deferred(inner) => match inner.as_ref() {
            Error::Driver { error, .. } if error.is_out_of_memory() => PyMemoryError::new_err(msg),
            _ => PyRuntimeError::new_err(msg),
        },
        _ => PyRuntimeError::new_err(msg),
    }
}
