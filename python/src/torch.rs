//! torch tensors in and out of pinlane, zero-copy, through the DLPack C exchange API that
//! PyTorch 2.10 and newer publish as `torch.Tensor.__dlpack_c_exchange_api__`: one C call
//! per tensor each way, no Python-level `__dlpack__` and no capsule.

use crate::errors::to_py;
use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDeviceType, DLManagedTensorVersioned};
use dlpark::python::consumer::exchange::ExchangeApi;
use dlpark::DlpackFlags;
use pinlane::Tensor;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::ffi::c_void;

/// A torch tensor's descriptor, owned: torch's deleter runs when it drops (or when the
/// pinlane tensor made from it has no more users).
pub(crate) type Managed = dlpark::versioned::Dlpack;

/// What an imported tensor is, for the two calls.
pub(crate) enum Kind {
    /// Host memory: `kDLCPU` (torch says `kDLCPU` for page-locked tensors too).
    Host,
    /// Memory of CUDA device `n`.
    Cuda(usize),
    /// Anything else (another accelerator, managed memory): passed through.
    Other,
}

/// PyTorch's exchange API, looked up once per call from the class of the batch's first
/// tensor.
pub(crate) struct Torch {
    api: ExchangeApi,
}

impl Torch {
    /// The exchange API of `tensor`'s class.
    ///
    /// # Errors
    /// `RuntimeError` when the class publishes none (PyTorch older than 2.10).
    pub(crate) fn of(tensor: &Bound<'_, PyAny>) -> PyResult<Torch> {
        match ExchangeApi::from_object(tensor.as_borrowed())? {
            Some(api) => Ok(Torch { api }),
            None => Err(PyRuntimeError::new_err(
                "pinlane needs PyTorch 2.10 or newer: torch.Tensor.__dlpack_c_exchange_api__ \
                 (DLPack 1.3's C exchange API) is missing",
            )),
        }
    }

    /// `tensor`'s descriptor (taking a reference to its storage), and torch's current
    /// stream on the tensor's device (null for host tensors).
    pub(crate) fn import(&self, tensor: &Bound<'_, PyAny>) -> PyResult<(Managed, *mut c_void)> {
        Ok(self
            .api
            .import_managed_no_sync(tensor.as_borrowed())?
            .into_parts())
    }

    /// A torch tensor over `t`'s memory (no copy), which keeps `t`'s memory alive until
    /// torch frees it. Host tensors come out as CPU tensors (page-locked memory stays
    /// page-locked: `is_pinned()` is true); all come out writable, as torch has no
    /// read-only tensors.
    pub(crate) fn export<'py>(&self, py: Python<'py>, t: &Tensor) -> PyResult<Bound<'py, PyAny>> {
        let dl = t.to_dlpack().map_err(to_py)?;
        // SAFETY: `dl` was just made and is owned here alone: no one else reads its
        // descriptor. Page-locked memory is CPU memory to torch, which does not take
        // kDLCUDAHost. The tensor handed over is the only user of its bytes (pinlane keeps
        // a reference only to keep memory alive, never to read it; views of one block
        // never overlap), so dropping READ_ONLY lets no write reach anything else.
        unsafe {
            let m = dl.as_ptr();
            if (*m).dl_tensor.device.device_type == DLDeviceType::CUDAHOST {
                (*m).dl_tensor.device.device_type = DLDeviceType::CPU;
                (*m).dl_tensor.device.device_id = 0;
            }
            (*m).flags.remove(DlpackFlags::READ_ONLY);
        }
        self.api.managed_tensor_to_py_object_no_sync(dl, py)
    }
}

/// The header of an owned descriptor.
fn header(dl: &Managed) -> &DLManagedTensorVersioned {
    // SAFETY: a `Managed` holds a valid, non-null descriptor until it drops, and nothing
    // else writes it meanwhile.
    unsafe { &*dl.as_ptr() }
}

/// Where an imported tensor lives.
pub(crate) fn kind(dl: &Managed) -> Kind {
    let d = header(dl).dl_tensor.device;
    match d.device_type {
        DLDeviceType::CPU | DLDeviceType::CUDAHOST => Kind::Host,
        DLDeviceType::CUDA => usize::try_from(d.device_id).map_or(Kind::Other, Kind::Cuda),
        _ => Kind::Other,
    }
}

/// Whether pinlane has the tensor's dtype: bool, (u)int 8 to 64, float 16/32/64, bfloat16.
pub(crate) fn supported_dtype(dl: &Managed) -> bool {
    let DLDataType { code, bits, lanes } = header(dl).dl_tensor.dtype;
    lanes == 1
        && match code {
            DLDataTypeCode::INT | DLDataTypeCode::UINT => matches!(bits, 8 | 16 | 32 | 64),
            DLDataTypeCode::FLOAT => matches!(bits, 16 | 32 | 64),
            DLDataTypeCode::BFLOAT => bits == 16,
            DLDataTypeCode::BOOL => bits == 8,
            _ => false,
        }
}

/// The tensor's size in bytes (0 when it does not fit `usize`: pinlane's import reports
/// that).
pub(crate) fn nbytes(dl: &Managed) -> usize {
    let t = &header(dl).dl_tensor;
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    let elem = usize::from(t.dtype.bits).div_ceil(8);
    if ndim == 0 || t.shape.is_null() {
        return elem;
    }
    // SAFETY: a valid descriptor's `shape` points to `ndim` values, alive as long as it.
    let shape = unsafe { std::slice::from_raw_parts(t.shape, ndim) };
    shape
        .iter()
        .try_fold(elem, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        .unwrap_or(0)
}

/// Whether the tensor is laid out compact and row-major (what pinlane tensors are).
/// Dimensions of size 1 may have any stride; a tensor with no elements is compact.
pub(crate) fn is_compact(dl: &Managed) -> bool {
    let t = &header(dl).dl_tensor;
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    if ndim == 0 || t.strides.is_null() {
        return true;
    }
    // SAFETY: a valid descriptor's `shape` and `strides` point to `ndim` values each,
    // alive as long as the descriptor.
    let (shape, strides) = unsafe {
        (
            std::slice::from_raw_parts(t.shape, ndim),
            std::slice::from_raw_parts(t.strides, ndim),
        )
    };
    if shape.contains(&0) {
        return true;
    }
    let mut expected: i64 = 1;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(n);
    }
    true
}

/// Marks a host tensor's descriptor as page-locked, so pinlane copies it directly.
///
/// # Safety
/// The memory is page-locked and registered with CUDA (torch's `is_pinned()` said so).
pub(crate) unsafe fn mark_page_locked(dl: &mut Managed) {
    // SAFETY: `dl` is owned here alone (exclusive borrow); torch's deleter does not read
    // the device field. That the memory is page-locked is the caller's promise.
    unsafe { (*dl.as_ptr()).dl_tensor.device.device_type = DLDeviceType::CUDAHOST };
}

/// A pinlane tensor over an imported descriptor.
pub(crate) fn to_pinlane(dl: Managed) -> PyResult<Tensor> {
    Tensor::from_dlpack(dl).map_err(to_py)
}
