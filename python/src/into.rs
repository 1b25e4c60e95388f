//! `copy_into` over flat, paired lists of torch tensors (the Python half pairs the
//! containers): CPU sources into CUDA destinations, or CUDA sources into CPU
//! destinations, through `pinlane::transfer_tensor_h2d_into` / `transfer_tensor_d2h_into`.
//!
//! Destinations are written in place: each must be a contiguous (compact, row-major)
//! tensor without the negation bit, of a dtype pinlane holds, else a `ValueError` (a
//! copy into a temporary would leave the caller's tensor unchanged). Sources are read as
//! the transfers read them: a strided or negated one is first made a plain contiguous
//! tensor where it lives. A pair whose dtype pinlane lacks (complex, float8, ...) is left
//! to torch: its index is returned, and the Python half runs `dst.copy_(src)` for it on
//! the same stream.

use crate::errors::to_py;
use crate::torch::{self, Kind, Torch};
use crate::transfer::readable;
use pinlane::{Device, IntoOptions, RawStream, Stream, Tensor};
use pyo3::exceptions::PyValueError;
use pyo3::intern;
use pyo3::prelude::*;

/// Page-locked sources at least this large are copied straight from their memory (the
/// engine's threshold where the driver has `cuMemcpyBatchAsync`); smaller ones are staged,
/// and torch is not asked `is_pinned()` for them (~1 us a tensor).
const DIRECT_MIN_BYTES: usize = 64 << 10;

/// Copies `srcs[i]` into `dsts[i]` for every `i`: `h2d` (CPU sources, CUDA destinations)
/// or the other way. `stream`: `(raw handle, device)` of a `torch.cuda.Stream` the copies
/// are ordered on; `None`: torch's current stream of the CUDA side's device. H2D returns
/// once the copies are queued on that stream; D2H once the bytes are in the
/// destinations. Returns the indices of the pairs left to torch.
#[pyfunction]
#[pyo3(signature = (dsts, srcs, *, h2d, stream=None))]
pub(crate) fn copy_into<'py>(
    py: Python<'py>,
    dsts: Vec<Bound<'py, PyAny>>,
    srcs: Vec<Bound<'py, PyAny>>,
    h2d: bool,
    stream: Option<(usize, usize)>,
) -> PyResult<Vec<usize>> {
    if dsts.len() != srcs.len() {
        return Err(PyValueError::new_err(format!(
            "copy_into: {} destinations for {} sources",
            dsts.len(),
            srcs.len()
        )));
    }
    let Some(first) = dsts.first() else {
        return Ok(Vec::new());
    };
    let torch = Torch::of(first)?;
    let mut to_torch = Vec::new();
    let (mut ins, mut outs) = (
        Vec::with_capacity(srcs.len()),
        Vec::with_capacity(srcs.len()),
    );
    // Torch's temporaries (contiguous copies of strided sources) live until the copies
    // are queued (H2D: staged or held by pinlane's clones; D2H: the call waits).
    let mut temps = Vec::new();
    let mut device: Option<usize> = None;
    let mut current = 0usize;
    for (k, (d, s)) in dsts.iter().zip(&srcs).enumerate() {
        let Some((dst, src)) = pair(&torch, k, d, s, h2d, &mut device, &mut current, &mut temps)?
        else {
            to_torch.push(k);
            continue;
        };
        outs.push(dst);
        ins.push(src);
    }
    let Some(device) = device.filter(|_| !ins.is_empty()) else {
        return Ok(to_torch);
    };
    let dev = Device::cuda(device);
    let raw = match stream {
        Some((_, on)) if on != device => {
            return Err(to_py(pinlane::Error::StreamDeviceMismatch {
                stream_device: Device::cuda(on),
                device: dev,
            }))
        }
        Some((raw, _)) => raw,
        None => current,
    };
    // SAFETY: a `torch.cuda.Stream`'s handle on `device` (passed by the Python half, alive
    // while the caller holds the object, for the whole call), or torch's current stream
    // there from the exchange API (of the primary context, never destroyed by torch).
    // pinlane keeps a clone only until the copies queued on it have run.
    let s = unsafe { Stream::from_raw(raw as RawStream, dev) }.map_err(to_py)?;
    let opts = IntoOptions::default().stream(s);
    if h2d {
        py.detach(|| pinlane::transfer_tensor_h2d_into(&ins, &outs, &opts).map(drop))
            .map_err(to_py)?;
    } else {
        // SAFETY: as above, torch's current stream of `device`.
        let torch_current =
            unsafe { Stream::from_raw(current as RawStream, dev) }.map_err(to_py)?;
        py.detach(|| {
            // The copies wait for torch's current stream (where the sources were made,
            // and made contiguous) and run on the stream given, or that one.
            let _guard = pinlane::set_current_stream(&torch_current);
            // SAFETY: the destinations are torch CPU tensors the caller handed over for
            // writing (as `dst.copy_(src)` writes them); pinlane holds them only for
            // this call, and nothing in pinlane reads them meanwhile.
            unsafe { pinlane::transfer_tensor_d2h_into(&ins, &outs, &opts) }
        })
        .map_err(to_py)?;
    }
    drop(temps);
    Ok(to_torch)
}

/// Imports pair `k`: `None` for a pair torch copies (a dtype pinlane lacks); the CUDA
/// side's device goes to `device` (all must share it), torch's current stream there to
/// `current`.
#[allow(clippy::too_many_arguments)]
fn pair<'py>(
    torch: &Torch,
    k: usize,
    d: &Bound<'py, PyAny>,
    s: &Bound<'py, PyAny>,
    h2d: bool,
    device: &mut Option<usize>,
    current: &mut usize,
    temps: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<Option<(Tensor, Tensor)>> {
    let bad = |what: &str| PyValueError::new_err(format!("copy_into: pair {k}: {what}"));
    let (ddl, dwork) = torch
        .import(d)
        .map_err(|e| bad(&format!("torch does not export the destination ({e})")))?;
    let (sdl, swork) = torch
        .import(s)
        .map_err(|e| bad(&format!("torch does not export the source ({e})")))?;
    let (cuda_dl, work) = if h2d { (&ddl, dwork) } else { (&sdl, swork) };
    let Kind::Cuda(n) = torch::kind(cuda_dl) else {
        let side = if h2d { "destination" } else { "source" };
        return Err(bad(&format!("the {side} is not a CUDA tensor")));
    };
    if *device.get_or_insert(n) != n {
        return Err(bad(&format!(
            "on cuda:{n}, another pair on cuda:{}",
            device.unwrap_or_default()
        )));
    }
    *current = work as usize;
    let host_dl = if h2d { &sdl } else { &ddl };
    if !matches!(torch::kind(host_dl), Kind::Host) {
        let side = if h2d { "source" } else { "destination" };
        return Err(bad(&format!("the {side} is not a CPU tensor")));
    }
    if !torch.has_dtype(d, &ddl)? || !torch.has_dtype(s, &sdl)? {
        return Ok(None);
    }
    let py = d.py();
    if !torch::is_compact(&ddl) {
        return Err(bad(
            "the destination is not contiguous (a copy would leave it unchanged): \
             pass a contiguous tensor, or use dst.copy_(src)",
        ));
    }
    if d.call_method0(intern!(py, "is_neg"))?.is_truthy()? {
        return Err(bad("the destination has the negation bit (is_neg())"));
    }
    let (copy, mut sdl) = readable(torch, s, sdl, &mut || Ok(()))?;
    if h2d && torch::nbytes(&sdl) >= DIRECT_MIN_BYTES {
        let src = copy.as_ref().unwrap_or(s);
        if src.call_method0(intern!(py, "is_pinned"))?.is_truthy()? {
            // SAFETY: torch says the memory is page-locked (allocated by, or registered
            // with, CUDA).
            unsafe { torch::mark_page_locked(&mut sdl) };
        }
    }
    temps.extend(copy);
    Ok(Some((torch::to_pinlane(ddl)?, torch::to_pinlane(sdl)?)))
}
