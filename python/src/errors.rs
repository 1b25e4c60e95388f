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
use pyo3::PyErr;

/// The Python exception for a pinlane error, its message pinlane's.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match &e {
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
