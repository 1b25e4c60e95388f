//! `Pairs`: a serving loop's sources bound to its destinations once, both sides imported
//! and checked once, so that each step is one native call with nothing to import.
//!
//! The sources are read in place at every [`Pairs::copy`]: each must be a contiguous
//! tensor without the negation bit (a contiguous copy made at binding would not follow
//! the writes the loop makes into the source between steps), of a dtype pinlane copies.
//! The destinations are a [`Targets`]' (its rules, and its one-writer lock).

use crate::errors::to_py;
use crate::into::{bad_in, check_source_side, detached, Dst, Targets, DIRECT_MIN_BYTES};
use crate::torch::{self, Torch};
use crate::transfer::requires_grad;
use pinlane::{Device, H2dPairs, Tensor};
use pyo3::intern;
use pyo3::prelude::*;

/// Sources bound to destinations, copied by every [`Pairs::copy`].
#[pyclass(module = "pinlane._native", frozen)]
pub(crate) struct Pairs {
    targets: Py<Targets>,
    /// The sources, imported (each holds its torch tensor's storage).
    ins: Vec<Tensor>,
    /// The destinations, in the sources' order.
    outs: Vec<Tensor>,
    /// One source, to reach torch's exchange API at each call.
    first: Py<PyAny>,
    /// The CUDA side's device.
    device: usize,
    /// H2D: the same pairs, paired and checked once by the engine.
    bound: Option<H2dPairs>,
    /// The sources as given, for what autograd says of them at each copy under grad
    /// mode: a pair autograd would record (or torch refuse) is refused, as it cannot be
    /// left to torch here.
    srcs: Vec<Py<PyAny>>,
}

#[pymethods]
impl Pairs {
    /// Binds `srcs[i]` to destination `i` of `targets`: CPU sources when the destinations
    /// are CUDA tensors, CUDA sources of one device when they are CPU tensors. Every pair
    /// has the same dtype and byte size. `in_place` (H2D): every CPU source is read in
    /// place by the device, after `copy` returns: page-locked ones where they are,
    /// pageable ones page-locked in place now (`Tensor::register_pinned_many`; the
    /// registration ends with the `Pairs`). Else pageable sources and page-locked ones
    /// under 64 KiB are staged at each copy.
    #[new]
    #[pyo3(signature = (targets, srcs, *, in_place=false))]
    fn new(
        targets: Bound<'_, Targets>,
        srcs: Vec<Bound<'_, PyAny>>,
        in_place: bool,
    ) -> PyResult<Pairs> {
        let t = targets.get();
        if srcs.len() != t.outs.len() {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "Pairs: {} sources for {} destinations",
                srcs.len(),
                t.outs.len()
            )));
        }
        let Some(first) = srcs.first() else {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "Pairs: no tensors to copy",
            ));
        };
        if in_place && !t.h2d {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "Pairs: in_place=True is for CPU sources into CUDA destinations (device to \
                 host copies always write their destinations where they are)",
            ));
        }
        let torch = Torch::of(first)?;
        let mut device = t.device;
        let (mut ins, mut outs) = (Vec::with_capacity(srcs.len()), Vec::new());
        for (k, (s, d)) in srcs.iter().zip(&t.outs).enumerate() {
            // Read through a detached view when it requires grad (the same memory, as
            // `Targets` imports its destinations).
            let detached_src;
            let s = if requires_grad(s)? {
                detached_src = detached(s)?;
                &detached_src
            } else {
                s
            };
            let Dst::Pinlane(d) = d else {
                return Err(bad_in(
                    "Pairs",
                    k,
                    "the destination's dtype is one pinlane lacks: Pairs copies only what \
                     pinlane copies (use Buffers.copy_from, which leaves it to torch)",
                ));
            };
            let pinned_min = if in_place { 0 } else { DIRECT_MIN_BYTES };
            let src = import(&torch, k, s, t.h2d, pinned_min, &mut device)?;
            if src.dtype() != d.dtype() || src.nbytes() != d.nbytes() {
                return Err(bad_in(
                    "Pairs",
                    k,
                    &format!(
                        "the source ({}, {} bytes) and the destination ({}, {} bytes) \
                         differ in dtype or size",
                        src.dtype(),
                        src.nbytes(),
                        d.dtype(),
                        d.nbytes()
                    ),
                ));
            }
            ins.push(src);
            outs.push(d.clone());
        }
        // Every pair has a CUDA side (checked above), so there is a device.
        let Some(device) = device else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "Pairs: internal error: no CUDA device after the pairs were checked",
            ));
        };
        if in_place && t.h2d {
            // The pageable sources' memory page-locked where it is (those sharing pages as
            // one range); the page-locked ones come back as they are.
            ins = Tensor::register_pinned_many(&ins, Device::cuda(device)).map_err(|e| {
                pyo3::exceptions::PyRuntimeError::new_err(format!(
                    "Pairs(in_place=True): page-locking the sources in place failed: {e} \
                     (memory another library page-locked in place may overlap them)"
                ))
            })?;
        }
        let bound = match t.h2d {
            true => Some(H2dPairs::new(&ins, &outs).map_err(to_py)?),
            false => None,
        };
        Ok(Pairs {
            targets: targets.unbind(),
            bound,
            ins,
            outs,
            first: first.clone().unbind(),
            device,
            srcs: srcs.iter().map(|s| s.clone().unbind()).collect(),
        })
    }

    fn __len__(&self) -> usize {
        self.ins.len()
    }

    /// Copies every source, as it is now, into its destination, ordered on `stream`
    /// (`(raw handle, device)` of a `torch.cuda.Stream`) or torch's current stream of the
    /// CUDA side's device. H2D returns once the copies are queued; D2H once the bytes are
    /// in the destinations (the copies wait for torch's current stream, where the sources
    /// are written). `grad`: whether torch's grad mode is on (a pair that requires grad is
    /// then refused, nothing written).
    #[pyo3(signature = (*, stream=None, grad=false))]
    fn copy(&self, py: Python<'_>, stream: Option<(usize, usize)>, grad: bool) -> PyResult<()> {
        let targets = self.targets.get();
        if grad {
            for (k, s) in self.srcs.iter().enumerate() {
                if targets.autograd_records(py, "Pairs", k, s.bind(py))? {
                    return Err(bad_in(
                        "Pairs",
                        k,
                        "the source or the destination requires grad: under grad mode \
                         torch's copy_ would record the copy for autograd, which Pairs \
                         cannot; copy under torch.no_grad(), or use Buffers.copy_from",
                    ));
                }
            }
        }
        let _busy = targets.writer()?;
        let torch = Torch::of(self.first.bind(py))?;
        let bound = self.bound.as_ref();
        targets.run(
            py,
            &torch,
            &self.ins,
            &self.outs,
            self.device,
            stream,
            None,
            bound,
        )
    }
}

/// Source `k`, imported to be read in place at every call: on the side `h2d` says (a CUDA
/// source's device goes to `device`, and must match it), contiguous, without the negation
/// bit, of a dtype pinlane has; marked page-locked from `pinned_min` bytes on, where the
/// driver says it is.
fn import(
    torch: &Torch,
    k: usize,
    s: &Bound<'_, PyAny>,
    h2d: bool,
    pinned_min: usize,
    device: &mut Option<usize>,
) -> PyResult<Tensor> {
    let (mut dl, _) = torch.import(s).map_err(|e| {
        bad_in(
            "Pairs",
            k,
            &format!("torch does not export the source ({e})"),
        )
    })?;
    check_source_side("Pairs", k, h2d, torch::kind(&dl), device)?;
    if !torch.has_dtype(s, &dl)? {
        return Err(bad_in(
            "Pairs",
            k,
            "the source's dtype is one pinlane lacks: Pairs copies only what pinlane copies \
             (use Buffers.copy_from)",
        ));
    }
    if !torch::is_compact(&dl) {
        return Err(bad_in(
            "Pairs",
            k,
            "the source is not contiguous: a bound source is read in place at every copy \
             (a contiguous copy made now would not follow later writes into it)",
        ));
    }
    if s.call_method0(intern!(s.py(), "is_neg"))?.is_truthy()? {
        return Err(bad_in(
            "Pairs",
            k,
            "the source has the negation bit (is_neg())",
        ));
    }
    if h2d {
        // H2D: `device` is the destinations' (a `Targets` of CUDA tensors has one); the
        // driver says, in its context, whether the source is page-locked.
        let Some(d) = *device else {
            return Err(pyo3::exceptions::PyRuntimeError::new_err(
                "Pairs: internal error: CUDA destinations without a device",
            ));
        };
        torch::mark_if_page_locked(&mut dl, pinned_min, Device::cuda(d));
    }
    torch::to_pinlane(dl)
}
