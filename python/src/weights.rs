//! `load_safetensors`: a checkpoint loaded by `pinlane::weights`, handed to torch.

use crate::errors::to_py;
use crate::torch::Torch;
use pinlane::weights::{Checkpoint, LoadOptions};
use pinlane::{Device, RawStream, Stream, Tensor};
use pyo3::prelude::*;

/// Loads the checkpoint at `path` onto `device` and returns its names and torch tensors,
/// in file order. Device memory is freed, when torch lets a tensor go, in order on torch's
/// current stream of the device at the time of the call. `device` `None` (no CUDA): CPU
/// tensors holding copies of the file's bytes.
#[pyfunction]
#[pyo3(signature = (path, *, probe, device, names=None))]
pub(crate) fn load_safetensors<'py>(
    py: Python<'py>,
    path: std::path::PathBuf,
    probe: Bound<'py, PyAny>,
    device: Option<usize>,
    names: Option<Vec<String>>,
) -> PyResult<(Vec<String>, Vec<Bound<'py, PyAny>>)> {
    let torch = Torch::of(&probe)?;
    let Some(d) = device else {
        // No CUDA (for torch or for pinlane): host tensors, read from the file without a
        // transfer. They are copies: the mapping is read-only and torch tensors are not.
        let loaded = py.detach(|| on_host(&path, names)).map_err(to_py)?;
        let (names, tensors): (Vec<String>, Vec<Tensor>) = loaded.into_iter().unzip();
        let out = torch.export_all(py, &tensors, usize::MAX)?;
        return Ok((names, out));
    };
    let mut opts = LoadOptions::default();
    if let Some(names) = names {
        opts = opts.names(names);
    }
    let dev = Device::cuda(d);
    let raw = torch.current_stream(py, d)?;
    // SAFETY: as in `transfer::h2d`: torch's current stream of `d` (asked just now), a
    // live stream of the device's primary context from a pool that lives as long as the
    // process, on which the outputs' memory is freed.
    let consumer = unsafe { Stream::from_raw(raw as RawStream, dev) }.map_err(to_py)?;
    opts = opts.device(dev).consumer_stream(consumer);
    let loaded: Vec<(String, Tensor)> = py
        .detach(|| -> pinlane::Result<Vec<(String, Tensor)>> {
            // One group, as `Checkpoint::load` (the device pool grows once), streamed to
            // keep the file's order.
            Checkpoint::open(&path)?
                .stream(&opts.group_bytes(usize::MAX))?
                .collect()
        })
        .map_err(to_py)?;
    let (names, tensors): (Vec<String>, Vec<Tensor>) = loaded.into_iter().unzip();
    let out = torch.export_all(py, &tensors, usize::MAX)?;
    Ok((names, out))
}

/// The names of the checkpoint's tensors, in file order (its headers only: no tensor is
/// read), for `load_safetensors`' `names` given as a predicate.
#[pyfunction]
pub(crate) fn safetensors_names(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Vec<String>> {
    py.detach(|| {
        let ckpt = Checkpoint::open(&path)?;
        Ok(ckpt.tensors().map(|t| t.name.to_string()).collect())
    })
    .map_err(to_py)
}

/// The chosen tensors (all, or `names`), in file order, as host copies.
fn on_host(
    path: &std::path::Path,
    names: Option<Vec<String>>,
) -> pinlane::Result<Vec<(String, Tensor)>> {
    let ckpt = Checkpoint::open(path)?;
    let chosen: Option<std::collections::HashSet<String>> = match names {
        None => None,
        Some(ns) => {
            for n in &ns {
                if ckpt.info(n).is_none() {
                    // The checkpoint's own error for a name it lacks.
                    ckpt.read(n)?;
                }
            }
            Some(ns.into_iter().collect())
        }
    };
    ckpt.tensors()
        .filter(|t| chosen.as_ref().is_none_or(|c| c.contains(t.name)))
        .map(|t| Ok((t.name.to_string(), ckpt.read(t.name)?)))
        .collect()
}
