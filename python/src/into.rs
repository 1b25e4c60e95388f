//! `copy_into` and `Buffers` over flat, paired lists of torch tensors (the Python half
//! pairs the containers): CPU sources into CUDA destinations, or CUDA sources into CPU
//! destinations, through `pinlane::transfer_tensor_h2d_into` / `transfer_tensor_d2h_into`.
//!
//! [`Targets`] imports and checks the destinations once: each must be a contiguous
//! (compact, row-major) tensor without the negation bit, else a `ValueError` (a copy into
//! a temporary would leave the caller's tensor unchanged). Every call then imports only
//! its sources, read as the transfers read them: a strided or negated one is first made a
//! plain contiguous tensor where it lives. A pair whose dtype pinlane lacks (complex,
//! float8, ...) is left to torch: its index is returned, and the Python half runs
//! `dst.copy_(src)` for it on the same stream.

use crate::errors::to_py;
use crate::torch::{self, Kind, Managed, Torch};
use crate::transfer::{bounded_wait_before_torch, readable, requires_grad, torch_device};
use pinlane::{Device, H2dPairs, IntoOptions, RawStream, Stream, Tensor};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;

/// Page-locked sources at least this large are read in place by the device (copied
/// straight from their memory, the engine's threshold where the driver has
/// `cuMemcpyBatchAsync`, or read by the scatter kernel where the device maps them);
/// smaller ones are staged, and the driver is not asked about them
/// ([`torch::mark_if_page_locked`]).
pub(crate) const DIRECT_MIN_BYTES: usize = 64 << 10;

pub(crate) fn bad(k: usize, what: &str) -> PyErr {
    bad_in("copy_into", k, what)
}

/// [`bad`] for the call named `call` (`Pairs` names itself).
pub(crate) fn bad_in(call: &str, k: usize, what: &str) -> PyErr {
    PyValueError::new_err(format!("{call}: pair {k}: {what}"))
}

/// Checks that source `k`, of kind `kind`, is on the side the copy reads: a CPU tensor
/// for H2D, or for D2H a CUDA tensor of the device the others are on (the first one's
/// goes to `device`). `call` names the call in the error.
pub(crate) fn check_source_side(
    call: &str,
    k: usize,
    h2d: bool,
    kind: Kind,
    device: &mut Option<usize>,
) -> PyResult<()> {
    match (h2d, kind) {
        (true, Kind::Host) => Ok(()),
        (true, _) => Err(bad_in(call, k, "the source is not a CPU tensor")),
        (false, Kind::Cuda(n)) => match *device.get_or_insert(n) {
            other if other != n => Err(bad_in(
                call,
                k,
                &format!("on cuda:{n}, another source on cuda:{other}"),
            )),
            _ => Ok(()),
        },
        (false, _) => Err(bad_in(call, k, "the source is not a CUDA tensor")),
    }
}

/// One destination, as imported.
pub(crate) enum Dst {
    /// pinlane's view of it.
    Pinlane(Tensor),
    /// A dtype pinlane lacks: torch copies it. Its dtype and size, checked against the
    /// source before anything is queued.
    Torch { dtype: Py<PyAny>, nbytes: usize },
}

/// What autograd makes of writing a destination in place under grad mode, asked at each
/// copy (a destination may gain a graph or `requires_grad_()` after it was imported).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Grad {
    /// Nothing to record: pinlane writes it.
    No,
    /// Its graph must record the copy: torch's `copy_` writes it.
    Yes,
    /// A leaf that requires grad, or a view of one: torch's `copy_` refuses it.
    Leaf,
}

/// Destinations imported once, written by every [`Targets::copy_from`].
#[pyclass(module = "pinlane._native", frozen)]
pub(crate) struct Targets {
    /// Each destination.
    pub(crate) outs: Vec<Dst>,
    /// Each destination as given, for what autograd says of it at each copy.
    dsts: Vec<Py<PyAny>>,
    /// Whether each is an inference tensor (no autograd state: pinlane writes it).
    inference: Vec<bool>,
    /// Held by a `copy_from` while it runs: one writer at a time (D2H's contract), a
    /// second thread's call is an error rather than a wait (the first releases the GIL,
    /// and a wait holding it would never end).
    busy: std::sync::Mutex<()>,
    /// CUDA destinations (else CPU ones, with CUDA sources).
    pub(crate) h2d: bool,
    /// The CUDA device of H2D's destinations (D2H's comes from its sources).
    pub(crate) device: Option<usize>,
}

#[pymethods]
impl Targets {
    /// Imports `dsts`: CUDA tensors of one device when `h2d`, else CPU tensors.
    #[new]
    fn new(dsts: Vec<Bound<'_, PyAny>>, h2d: bool) -> PyResult<Targets> {
        let mut t = Targets {
            outs: Vec::with_capacity(dsts.len()),
            dsts: Vec::with_capacity(dsts.len()),
            inference: Vec::with_capacity(dsts.len()),
            busy: std::sync::Mutex::new(()),
            h2d,
            device: None,
        };
        let Some(first) = dsts.first() else {
            return Ok(t);
        };
        let torch = Torch::of(first)?;
        // Every destination's bytes (`(start, len)`, pair `k` at `k`), for the overlap
        // check below.
        let mut ranges = Vec::with_capacity(dsts.len());
        for (k, d) in dsts.iter().enumerate() {
            // Imported through a detached view when it requires grad: the same memory,
            // without relying on the exchange API to export such a tensor (torch's
            // `__dlpack__` refuses one; its C export does not, today).
            let out = match requires_grad(d)? {
                false => t.import_dst(&torch, k, d, &mut ranges)?,
                true => t.import_dst(&torch, k, &detached(d)?, &mut ranges)?,
            };
            t.outs.push(out);
            t.inference.push(
                d.call_method0(intern!(d.py(), "is_inference"))?
                    .is_truthy()?,
            );
            t.dsts.push(d.clone().unbind());
        }
        // Checked once, here, for every destination: the engine checks those it writes at
        // each copy, but not those torch writes (dtypes pinlane lacks; pairs autograd
        // records, which only a copy's grad mode tells).
        if let Some((a, b)) = pinlane::memory::first_overlap(&ranges) {
            return Err(bad(b, &format!("the destination overlaps pair {a}'s")));
        }
        Ok(t)
    }

    fn __len__(&self) -> usize {
        self.outs.len()
    }

    /// The indices of the pairs torch copies (destinations of a dtype pinlane lacks).
    #[getter]
    fn torch_pairs(&self) -> Vec<usize> {
        let torch = |(k, d): (usize, &Dst)| matches!(d, Dst::Torch { .. }).then_some(k);
        self.outs.iter().enumerate().filter_map(torch).collect()
    }

    /// Copies `srcs[i]` into destination `i` for every `i`. `stream`: `(raw handle,
    /// device)` of a `torch.cuda.Stream` the copies are ordered on; `None`: torch's
    /// current stream of the CUDA side's device. H2D returns once the copies are queued
    /// on that stream; D2H once the bytes are in the destinations. Returns the indices of
    /// the pairs left to torch.
    /// `maybe_neg`: whether any source may have the negation bit (see `readable`).
    /// `views`: as `h2d`'s (false: every source imported the usual way, for
    /// benches/py_overhead.py). `grad`: whether torch's grad mode is on: then a pair whose
    /// source or destination requires grad is left to torch too (its `copy_` records it
    /// for autograd), and a destination that is a leaf requiring grad is refused (torch's
    /// `copy_` refuses to write it in place), before anything is written.
    /// `torch_copies`: called with those indices (when there are any) and whether
    /// pinlane wrote bytes of its own pairs, once they are queued (D2H: copied), with the
    /// one-writer lock still held: the caller's copies of the pairs left to torch, so that
    /// no other thread's copy runs beside them. A pair torch then refuses (autograd's rules
    /// for views, such as the outputs of `split`) fails the call with torch's
    /// `RuntimeError`, pinlane's pairs written.
    #[pyo3(signature = (srcs, *, stream=None, maybe_neg=true, views=true, grad=false, torch_copies=None))]
    #[allow(clippy::too_many_arguments)]
    fn copy_from<'py>(
        &self,
        py: Python<'py>,
        srcs: Vec<Bound<'py, PyAny>>,
        stream: Option<(usize, usize)>,
        maybe_neg: bool,
        views: bool,
        grad: bool,
        torch_copies: Option<Bound<'py, PyAny>>,
    ) -> PyResult<Vec<usize>> {
        if srcs.len() != self.outs.len() {
            return Err(PyValueError::new_err(format!(
                "copy_into: {} sources for {} destinations",
                srcs.len(),
                self.outs.len()
            )));
        }
        let Some(first) = srcs.first() else {
            return Ok(Vec::new());
        };
        let _busy = self.writer()?;
        let torch = Torch::of(first)?;
        let mut to_torch = Vec::new();
        let (mut ins, mut outs) = (
            Vec::with_capacity(srcs.len()),
            Vec::with_capacity(srcs.len()),
        );
        // Torch's temporaries (contiguous copies of strided sources) live until the
        // copies are queued (H2D: staged, or held by pinlane's clones; D2H: it waits).
        let mut temps = Vec::new();
        let mut device = self.device;
        let mut d2h_current = None;
        for (k, (s, out)) in srcs.iter().zip(&self.outs).enumerate() {
            let autograd = grad && self.autograd_records(py, "copy_into", k, s)?;
            let out = match out {
                Dst::Pinlane(t) if !autograd => t,
                Dst::Pinlane(t) => {
                    // Autograd records this pair: torch copies it (copy_), checked here
                    // first, before anything is queued, as pinlane's pairs are (through
                    // a detached view, as the destinations are imported).
                    let plain = detached(s)?;
                    let (dl, _) = torch
                        .import(&plain)
                        .map_err(|e| bad(k, &format!("torch does not export the source ({e})")))?;
                    check_source_side("copy_into", k, self.h2d, torch::kind(&dl), &mut device)?;
                    let same = torch.has_dtype(&plain, &dl)?
                        && torch::dtype(&dl) == Some(t.dtype())
                        && torch::nbytes(&dl) == t.nbytes();
                    if !same {
                        return Err(bad(
                            k,
                            "the source's dtype or size is not the destination's",
                        ));
                    }
                    to_torch.push(k);
                    continue;
                }
                Dst::Torch { dtype, nbytes } => {
                    // Checked here, before anything is queued, as pinlane's pairs are:
                    // torch's copy_ would convert, broadcast or copy within one side
                    // instead.
                    // Its side from `s.device` (torch may not export its dtype).
                    let kind = torch::kind_of_device(&torch_device(s)?);
                    check_source_side("copy_into", k, self.h2d, kind, &mut device)?;
                    let same_dtype = s.getattr(intern!(py, "dtype"))?.is(dtype.bind(py));
                    if !same_dtype
                        || s.getattr(intern!(py, "nbytes"))?.extract::<usize>()? != *nbytes
                    {
                        return Err(bad(
                            k,
                            "the source's dtype or size is not the destination's",
                        ));
                    }
                    to_torch.push(k);
                    continue;
                }
            };
            let Some(src) = self.import_src(
                &torch,
                k,
                s,
                maybe_neg,
                views,
                &mut device,
                &mut d2h_current,
                &mut temps,
            )?
            else {
                return Err(bad(
                    k,
                    "the source's dtype is one pinlane lacks, the destination's is not: the \
                     dtypes differ",
                ));
            };
            ins.push(src);
            outs.push(out.clone());
        }
        // The stream's device, checked for every pair (also when torch copies them all).
        if let (Some((_, on)), Some(d)) = (stream, device) {
            if on != d {
                return Err(to_py(pinlane::Error::StreamDeviceMismatch {
                    stream_device: Device::cuda(on),
                    device: Device::cuda(d),
                }));
            }
        }
        // pinlane's pairs first: the engine's own refusals (a capturing stream, bytes in
        // flight, an earlier failure, no staging slot) then come before torch has written
        // anything (a graph being captured would otherwise record torch's half).
        if let Some(device) = device.filter(|_| !ins.is_empty()) {
            self.run(py, &torch, &ins, &outs, device, stream, d2h_current, None)?;
        }
        if let Some(f) = torch_copies.filter(|_| !to_torch.is_empty()) {
            // torch's D2H copies wait for their stream without a bound. pinlane's bounded
            // wait for its own copies (queued after the same work) proves that work done;
            // where pinlane copies no bytes (no pair of its own, or only empty ones), the
            // call waits for it here, bounded: torch's current stream (where the sources
            // were made) and the stream given, if any, which torch's copies then run on
            // (each wait has the bound). The engine checks every pair, empty ones too (a
            // dtype that differs is still refused), but leaves empty pairs out: a call
            // whose pairs are all empty queues nothing and waits for nothing.
            let copies = ins.iter().any(|t| t.nbytes() > 0);
            if let Some(device) = device.filter(|_| !self.h2d && !copies) {
                bounded_wait_before_torch(py, &torch, device, stream.map(|(raw, _)| raw))?;
            }
            f.call1((to_torch.clone(), copies))?;
        }
        drop(temps);
        Ok(to_torch)
    }
}

impl Targets {
    /// The right to write the destinations: one call at a time (see `busy`).
    pub(crate) fn writer(&self) -> PyResult<std::sync::MutexGuard<'_, ()>> {
        match self.busy.try_lock() {
            Ok(g) => Ok(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Ok(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => Err(PyRuntimeError::new_err(
                "copy_into: these Buffers are being written by another thread's copy",
            )),
        }
    }

    /// Copies `ins[i]` into `outs[i]` (imported pairs of `device`'s CUDA side), ordered on
    /// `stream` (`(raw handle, device)`) or torch's current stream of `device`. D2H's
    /// copies wait for `d2h_current` (torch's current stream where the sources were made),
    /// or that same current stream. `bound`: the same H2D pairs, checked once (`Pairs`),
    /// copied without pairing them again. The `busy` lock is the caller's to hold.
    // `&Vec`: the calls take a `Batch`, which a `Vec` is and a slice is not.
    #[allow(clippy::too_many_arguments, clippy::ptr_arg)]
    pub(crate) fn run(
        &self,
        py: Python<'_>,
        torch: &Torch,
        ins: &Vec<Tensor>,
        outs: &Vec<Tensor>,
        device: usize,
        stream: Option<(usize, usize)>,
        d2h_current: Option<usize>,
        bound: Option<&H2dPairs>,
    ) -> PyResult<()> {
        let dev = Device::cuda(device);
        let current = match d2h_current {
            Some(work) => work,
            None => torch.current_stream(py, device)?,
        };
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
        // SAFETY: a `torch.cuda.Stream`'s handle on `device` (passed by the Python half,
        // alive while the caller holds the object, for the whole call), or torch's current
        // stream there (of the primary context, never destroyed by torch). pinlane keeps
        // a clone only until the copies queued on it have run.
        let s = unsafe { Stream::from_raw(raw as RawStream, dev) }.map_err(to_py)?;
        let opts = IntoOptions::default().stream(s);
        if let Some(pairs) = bound {
            py.detach(|| pairs.copy(&opts).map(drop)).map_err(to_py)
        } else if self.h2d {
            py.detach(|| pinlane::transfer_tensor_h2d_into(ins, outs, &opts).map(drop))
                .map_err(to_py)
        } else {
            // SAFETY: as above, torch's current stream of `device`.
            let torch_current =
                unsafe { Stream::from_raw(current as RawStream, dev) }.map_err(to_py)?;
            py.detach(|| {
                // The copies wait for torch's current stream (where the sources were made,
                // and made contiguous) and run on the stream given, or that one.
                let _guard = pinlane::set_current_stream(&torch_current);
                // SAFETY: the destinations are torch CPU tensors the caller handed over
                // for writing (as `dst.copy_(src)` writes them), and nothing in pinlane
                // reads them during the call.
                unsafe { pinlane::transfer_tensor_d2h_into(ins, outs, &opts) }
            })
            .map_err(to_py)
        }
    }

    /// Whether, under grad mode, autograd records the copy of `src` into destination `k`
    /// (torch's `copy_` must make it), asked now: the destination requires grad, or the
    /// source does and the destination is not an inference tensor (which has no autograd
    /// state). A destination that is a leaf requiring grad, or a view of one, is `call`'s
    /// refusal of pair `k`, as `copy_` refuses it.
    pub(crate) fn autograd_records(
        &self,
        py: Python<'_>,
        call: &str,
        k: usize,
        src: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        match self.grad(py, k)? {
            Grad::Leaf => Err(bad_in(
                call,
                k,
                "the destination is a leaf tensor that requires grad (or a view of one): \
                 torch's copy_ refuses to write it in place; copy under torch.no_grad()",
            )),
            Grad::Yes => Ok(true),
            Grad::No => Ok(!self.is_inference(k) && requires_grad(src)?),
        }
    }

    /// Whether destination `k` is an inference tensor.
    fn is_inference(&self, k: usize) -> bool {
        self.inference.get(k).copied().unwrap_or(false)
    }

    /// What autograd makes of writing destination `k` in place under grad mode, asked now
    /// (see [`Grad`]). An inference tensor has no autograd state: [`Grad::No`].
    fn grad(&self, py: Python<'_>, k: usize) -> PyResult<Grad> {
        let Some(d) = self.dsts.get(k).map(|d| d.bind(py)) else {
            return Ok(Grad::No);
        };
        if self.is_inference(k) || !requires_grad(d)? {
            return Ok(Grad::No);
        }
        let leaf = |t: &Bound<'_, PyAny>| -> PyResult<bool> {
            t.getattr(intern!(py, "is_leaf"))?.is_truthy()
        };
        if leaf(d)? {
            return Ok(Grad::Leaf);
        }
        // A view of a leaf that requires grad: copy_ refuses it as it refuses the leaf.
        let base = d.getattr(intern!(py, "_base"))?;
        if !base.is_none() && requires_grad(&base)? && leaf(&base)? {
            return Ok(Grad::Leaf);
        }
        Ok(Grad::Yes)
    }

    /// Destination `k`: `None` for one whose dtype pinlane lacks (torch copies it). Its
    /// bytes are pushed to `ranges` as `(start address, length)`.
    fn import_dst(
        &mut self,
        torch: &Torch,
        k: usize,
        d: &Bound<'_, PyAny>,
        ranges: &mut Vec<(u64, usize)>,
    ) -> PyResult<Dst> {
        let (dl, _) = torch
            .import(d)
            .map_err(|e| bad(k, &format!("torch does not export the destination ({e})")))?;
        match (self.h2d, torch::kind(&dl)) {
            (true, Kind::Cuda(n)) => {
                if *self.device.get_or_insert(n) != n {
                    let other = self.device.unwrap_or_default();
                    return Err(bad(
                        k,
                        &format!("on cuda:{n}, another destination on cuda:{other}"),
                    ));
                }
            }
            (true, _) => return Err(bad(k, "the destination is not a CUDA tensor")),
            (false, Kind::Host) => {}
            (false, _) => return Err(bad(k, "the destination is not a CPU tensor")),
        }
        // Every destination is contiguous, also one torch copies (the rule copy_into
        // documents; its bytes are then one range, checked for overlap).
        if !torch::is_compact(&dl) {
            return Err(bad(
                k,
                "the destination is not contiguous (a copy would leave it unchanged): \
                 pass a contiguous tensor, or use dst.copy_(src)",
            ));
        }
        // (An address past `usize` cannot be; as an empty range it overlaps nothing.)
        ranges.push(match torch::address(&dl) {
            Some(at) => (at as u64, torch::nbytes(&dl)),
            None => (0, 0),
        });
        if !torch.has_dtype(d, &dl)? {
            let py = d.py();
            return Ok(Dst::Torch {
                dtype: d.getattr(intern!(py, "dtype"))?.unbind(),
                nbytes: d.getattr(intern!(py, "nbytes"))?.extract()?,
            });
        }
        if d.call_method0(intern!(d.py(), "is_neg"))?.is_truthy()? {
            return Err(bad(k, "the destination has the negation bit (is_neg())"));
        }
        torch::to_pinlane(dl).map(Dst::Pinlane)
    }

    /// Source `k`, read as the transfers read it; `None` for a dtype pinlane lacks. The CUDA
    /// side's device goes to `device` (D2H: the sources'), and for D2H torch's current
    /// stream there to `current`.
    #[allow(clippy::too_many_arguments)]
    fn import_src<'py>(
        &self,
        torch: &Torch,
        k: usize,
        s: &Bound<'py, PyAny>,
        maybe_neg: bool,
        views: bool,
        device: &mut Option<usize>,
        current: &mut Option<usize>,
        temps: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<Option<Tensor>> {
        if self.h2d && views && !maybe_neg {
            // The plain case (a small compact CPU tensor) without a managed import.
            if let Some(t) = torch.host_view(s, DIRECT_MIN_BYTES) {
                return Ok(Some(t));
            }
        }
        let (dl, work): (Managed, _) = torch
            .import(s)
            .map_err(|e| bad(k, &format!("torch does not export the source ({e})")))?;
        check_source_side("copy_into", k, self.h2d, torch::kind(&dl), device)?;
        if !self.h2d {
            current.get_or_insert(work as usize);
        }
        if !torch.has_dtype(s, &dl)? {
            return Ok(None);
        }
        let (copy, mut dl) = readable(torch, s, dl, maybe_neg, &mut || Ok(()))?;
        if self.h2d {
            // An H2D source has a destination, so the destinations' device: the driver
            // says, in its context, whether the source is page-locked.
            let Some(d) = self.device else {
                return Err(PyRuntimeError::new_err(
                    "copy_into: internal error: CUDA destinations without a device",
                ));
            };
            torch::mark_if_page_locked(&mut dl, DIRECT_MIN_BYTES, Device::cuda(d));
        }
        temps.extend(copy);
        torch::to_pinlane(dl).map(Some)
    }
}

/// `t.detach()`: a view of the same memory that does not require grad.
pub(crate) fn detached<'py>(t: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
    t.call_method0(intern!(t.py(), "detach"))
}
