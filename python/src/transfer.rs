//! The two calls over a flat list of torch tensors (the Python half walks the
//! containers). Each returns one entry per input tensor:
//!
//! * a new torch tensor, for a tensor pinlane moved;
//! * the same object, for a tensor the call does not move (a device tensor given to H2D;
//!   a host tensor, or one on another device, given to D2H);
//! * `None`, for a tensor pinlane leaves to torch: one that requires grad (so autograd
//!   keeps its history, as spdl does) or whose dtype pinlane lacks (complex, float8).
//!
//! Copies run with the GIL released; the outputs are made after, with it held.
//! `min_run`: the shortest run of same-shape outputs handed to torch as one tensor (see
//! [`Torch::export_all`]); benches/py_overhead.py sets it high to time the per-tensor way.

use crate::errors::to_py;
use crate::torch::{self, Kind, Torch};
use pinlane::{D2hOptions, Device, Event, H2dOptions, RawEvent, RawStream, Stream, Tensor};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;

/// Page-locked sources at least this large are copied straight from their memory; smaller
/// ones go through the staging ring like pageable ones, where many share one copy (a copy
/// per tensor costs ~6 us, and asking torch `is_pinned()` ~1 us a tensor).
const DIRECT_MIN_BYTES: usize = 1 << 20;

/// One input's fate.
enum Slot<'py> {
    /// Moved: the index of its output in the transfer's result.
    Moved(usize),
    /// Returned as the same object.
    Same(Bound<'py, PyAny>),
    /// Left to torch.
    Torch,
}

/// The outputs, in input order.
fn outputs<'py>(
    py: Python<'py>,
    torch: &Torch,
    slots: Vec<Slot<'py>>,
    moved: &[Tensor],
    min_run: usize,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    let mut exported = torch
        .export_all(py, moved, min_run)?
        .into_iter()
        .map(Some)
        .collect::<Vec<_>>();
    Ok(slots
        .into_iter()
        .map(|s| match s {
            Slot::Moved(k) => exported[k].take(),
            Slot::Same(o) => Some(o),
            Slot::Torch => None,
        })
        .collect())
}

fn requires_grad(t: &Bound<'_, PyAny>) -> PyResult<bool> {
    t.getattr(intern!(t.py(), "requires_grad"))?.is_truthy()
}

/// Checks a device argument without the driver: `None`, `"cuda"` and `"cuda:N"` pass;
/// anything else is the `ValueError` spdl raises, on every machine.
#[pyfunction]
#[pyo3(signature = (device=None))]
pub(crate) fn check_device(device: Option<&str>) -> PyResult<()> {
    match device {
        None | Some("cuda") => Ok(()),
        Some(s) => s.parse::<Device>().map(drop).map_err(to_py),
    }
}

/// `transfer_tensor_h2d` over `tensors`, onto `device`, freeing returned memory in order
/// on `consumer_stream` (torch's current stream of `device`, as a raw handle).
#[pyfunction]
#[pyo3(signature = (tensors, *, device, num_caches, consumer_stream, min_run=torch::MIN_RUN))]
pub(crate) fn h2d<'py>(
    py: Python<'py>,
    tensors: Vec<Bound<'py, PyAny>>,
    device: usize,
    num_caches: usize,
    consumer_stream: usize,
    min_run: usize,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    let Some(first) = tensors.first() else {
        return Ok(Vec::new());
    };
    let torch = Torch::of(first)?;
    let mut slots = Vec::with_capacity(tensors.len());
    let mut inputs = Vec::with_capacity(tensors.len());
    for t in tensors {
        if requires_grad(&t)? {
            slots.push(Slot::Torch);
            continue;
        }
        let (mut dl, _) = torch.import(&t)?;
        if !matches!(torch::kind(&dl), Kind::Host) {
            slots.push(Slot::Same(t));
            continue;
        }
        if !torch::supported_dtype(&dl) {
            slots.push(Slot::Torch);
            continue;
        }
        let src = if torch::is_compact(&dl) {
            t
        } else {
            // pinlane tensors are compact: a strided view is copied to a compact tensor
            // first (on the host), and the output is compact.
            let c = t.call_method0(intern!(py, "contiguous"))?;
            dl = torch.import(&c)?.0;
            c
        };
        if torch::nbytes(&dl) >= DIRECT_MIN_BYTES
            && src.call_method0(intern!(py, "is_pinned"))?.is_truthy()?
        {
            // SAFETY: torch says the memory is page-locked (allocated by, or registered
            // with, CUDA).
            unsafe { torch::mark_page_locked(&mut dl) };
        }
        slots.push(Slot::Moved(inputs.len()));
        inputs.push(torch::to_pinlane(dl)?);
    }
    if inputs.is_empty() {
        return outputs(py, &torch, slots, &[], min_run);
    }
    let dev = Device::cuda(device);
    // SAFETY: `consumer_stream` is torch's current stream of `device` (the Python half
    // passes `torch.cuda.current_stream(device).cuda_stream`): a stream of the device's
    // primary context, which torch never destroys (its streams come from pools that live
    // as long as the process).
    let consumer = unsafe { Stream::from_raw(consumer_stream as RawStream, dev) }.map_err(to_py)?;
    let opts = H2dOptions::default()
        .device(dev)
        .num_caches(num_caches)
        .consumer_stream(consumer);
    let moved = py
        .detach(|| pinlane::transfer_tensor_h2d_with(&inputs, &opts))
        .map_err(to_py)?;
    drop(inputs);
    outputs(py, &torch, slots, &moved, min_run)
}

/// `transfer_tensor_d2h` over `tensors`: the CUDA tensors on `device` (`None`: LOCAL_RANK)
/// are copied to page-locked host memory, after the work queued on torch's current
/// stream of the device and the optional event; `stream` and `event` are
/// `(raw handle, device)` of a `torch.cuda.Stream` / recorded `torch.cuda.Event`.
#[pyfunction]
#[pyo3(signature = (tensors, *, device=None, stream=None, event=None, min_run=torch::MIN_RUN))]
pub(crate) fn d2h<'py>(
    py: Python<'py>,
    tensors: Vec<Bound<'py, PyAny>>,
    device: Option<&str>,
    stream: Option<(usize, usize)>,
    event: Option<(usize, usize)>,
    min_run: usize,
) -> PyResult<Vec<Option<Bound<'py, PyAny>>>> {
    check_device(device)?;
    if stream.is_some() && device.is_none() {
        return Err(to_py(pinlane::Error::StreamWithoutDevice));
    }
    let dev = match device {
        None | Some("cuda") => Device::from_local_rank(),
        Some(s) => s.parse::<Device>(),
    }
    .map_err(|e| match e {
        pinlane::Error::InvalidLocalRank { .. } => PyRuntimeError::new_err(e.to_string()),
        e => to_py(e),
    })?;
    let count = pinlane::driver::available().map_or(0, |i| i.device_count);
    if dev.ordinal() >= count {
        return Err(PyRuntimeError::new_err(format!(
            "{dev} is not available: this process sees {count} CUDA device(s)"
        )));
    }
    let mut opts = D2hOptions::default().device(dev);
    if let Some((raw, on)) = stream {
        if on != dev.ordinal() {
            return Err(PyValueError::new_err(format!(
                "the stream is on cuda:{on}, not on the device to copy from, {dev}"
            )));
        }
        // SAFETY: the Python half passes a `torch.cuda.Stream`'s handle and device: a
        // stream of that device's primary context, alive while the caller holds the
        // object (for the whole call; pinlane keeps no clone of a copy stream after it).
        opts = opts.stream(
            unsafe { Stream::from_raw(raw as RawStream, Device::cuda(on)) }.map_err(to_py)?,
        );
    }
    if let Some((raw, on)) = event {
        // SAFETY: a recorded `torch.cuda.Event`'s handle and device (created in that
        // device's primary context), alive while the caller holds the object, for the
        // whole call.
        opts = opts.producer_event(
            unsafe { Event::from_raw(raw as RawEvent, Device::cuda(on)) }.map_err(to_py)?,
        );
    }
    let Some(first) = tensors.first() else {
        return Ok(Vec::new());
    };
    let torch = Torch::of(first)?;
    let mut slots = Vec::with_capacity(tensors.len());
    let mut inputs = Vec::with_capacity(tensors.len());
    let mut current: Option<usize> = None;
    for t in tensors {
        if requires_grad(&t)? {
            // spdl copies these one by one on the current stream, keeping autograd: so
            // does the Python half, with torch.
            slots.push(Slot::Torch);
            continue;
        }
        let (mut dl, work) = torch.import(&t)?;
        match torch::kind(&dl) {
            Kind::Cuda(n) if n == dev.ordinal() => {}
            _ => {
                slots.push(Slot::Same(t));
                continue;
            }
        }
        if !torch::supported_dtype(&dl) {
            slots.push(Slot::Torch);
            continue;
        }
        current.get_or_insert(work as usize);
        if !torch::is_compact(&dl) {
            // A strided view is made compact on the device first, on torch's current
            // stream, which the copy waits for.
            dl = torch.import(&t.call_method0(intern!(py, "contiguous"))?)?.0;
        }
        slots.push(Slot::Moved(inputs.len()));
        inputs.push(torch::to_pinlane(dl)?);
    }
    if inputs.is_empty() {
        return outputs(py, &torch, slots, &[], min_run);
    }
    // torch's current stream of the device: the spec's "caller's current stream".
    let raw_current = current.unwrap_or(0);
    // SAFETY: the exchange API's `current_work_stream` for the device: torch's current
    // stream there, of the primary context, never destroyed by torch.
    let current = unsafe { Stream::from_raw(raw_current as RawStream, dev) }.map_err(to_py)?;
    let moved = py
        .detach(|| {
            let _guard = pinlane::set_current_stream(&current);
            pinlane::transfer_tensor_d2h(&inputs, &opts)
        })
        .map_err(to_py)?;
    drop(inputs);
    outputs(py, &torch, slots, &moved, min_run)
}
