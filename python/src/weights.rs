//! `load_safetensors`: a checkpoint loaded by `pinlane::weights`, handed to torch.

use crate::errors::to_py;
use crate::torch::Torch;
use pinlane::weights::{Checkpoint, LoadOptions};
use pinlane::{Device, RawStream, Stream, Tensor};
use pyo3::prelude::*;

/// Loads the checkpoint at `path` onto `device` (`None`: no CUDA, host tensors) and returns
/// its names and torch tensors, in file order. Device memory is freed, when torch lets a
/// tensor go, in order on torch's current stream of the device at the time of the call.
/// Host tensors (no CUDA) are copies: the mapped file is read-only, and torch tensors are
/// writable.
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
    let mut opts = LoadOptions::default();
    if let Some(names) = names {
        opts = opts.names(names);
    }
    if let Some(d) = device {
        let dev = Device::cuda(d);
        let raw = torch.current_stream(py, d)?;
        // SAFETY: as in `transfer::h2d`: torch's current stream of `d` (asked just now),
        // a live stream of the device's primary context from a pool that lives as long as
        // the process, on which the outputs' memory is freed.
        let consumer = unsafe { Stream::from_raw(raw as RawStream, dev) }.map_err(to_py)?;
        opts = opts.device(dev).consumer_stream(consumer);
    }
    let loaded: Vec<(String, Tensor)> = py
        .detach(|| -> pinlane::Result<Vec<(String, Tensor)>> {
            let ckpt = Checkpoint::open(&path)?;
            ckpt.stream(&opts)?
                .map(|r| {
                    let (name, t) = r?;
                    if t.is_cuda() {
                        return Ok((name, t));
                    }
                    let copy = Tensor::from_bytes(t.dtype(), t.shape().clone(), t.as_bytes()?)?;
                    Ok((name, copy))
                })
                .collect()
        })
        .map_err(to_py)?;
    let (names, tensors): (Vec<String>, Vec<Tensor>) = loaded.into_iter().unzip();
    let out = torch.export_all(py, &tensors, usize::MAX)?;
    Ok((names, out))
}
