//! The two calls over a flat list of torch tensors (the Python half walks the
//! containers). Each returns one output per input tensor, in order:
//!
//! * a new torch tensor over pinlane's memory, for a tensor pinlane moved;
//! * the same object, for a tensor the call does not move (a device tensor given to H2D;
//!   a host tensor, or one on another device, given to D2H);
//! * torch's own `tensor.to(...)` of it, for a tensor pinlane leaves to torch: one that
//!   requires grad (so autograd keeps its history, as spdl does), one of a subclass whose
//!   class torch's `.to()` keeps (torchvision's `tv_tensors`, `as_subclass` ones: not
//!   `nn.Parameter`), one whose dtype pinlane lacks (complex, float8, ...), or one that
//!   torch will not export or pinlane cannot hold (sparse and other layouts).
//!
//! What pinlane delivers is a tensor's values with the bits torch's own copy gives.
//! Torch may hold values lazily: a view with the negation bit (`is_neg()`, e.g.
//! `z.conj().imag`) shares memory holding the values before negation, and the exchange
//! API hands over that memory without the bit. Such a view is resolved where its memory
//! is, as torch's `tensor.to(...)` resolves it (the host and the device negate NaNs
//! differently: the device's result is the canonical NaN), and a strided view is made
//! compact there too: by torch's `resolve_neg()` / `contiguous()`, on the host for H2D,
//! on the device (on torch's current stream, which the copy waits for) for D2H. The
//! conjugate bit exists only on complex tensors, which torch moves. Torch exports its
//! sub-byte integer types as 8-bit integers: 8-bit integers are asked their torch dtype
//! ([`Torch::has_dtype`]), and those types go to torch too.
//!
//! H2D makes torch's moves as it reads the batch, before pinlane queues its copies, so
//! that a move torch refuses fails the call with nothing of it kept in the thread's ring
//! of recent batches; D2H makes them after (its outputs are host memory, which no ring
//! keeps).
//!
//! D2H's `producer_event` orders pinlane's copies, but torch's own work on a device
//! tensor (that resolving, and the fall-back `to("cpu")`) runs on torch's current stream,
//! which does not wait for the event: before the first such work of a call, the call
//! waits on the host until the event has completed (a wait the call would make anyway:
//! it returns only after copies that wait for the same event), bounded as the engine's
//! own wait is (`Config::sync_wait`). Where that setting gives a bound, a D2H call that
//! leaves every tensor to torch also waits there, with it, for torch's current stream
//! before torch's first `to("cpu")` ([`bounded_wait_before_torch`]), since torch's own wait
//! for that stream has none; where pinlane copies some tensors, its bounded wait for them
//! comes first and covers the same work. H2D's moves by torch wait for that stream too
//! (`non_blocking=False`), before pinlane queues anything: where a bound is set, the
//! call's first such move waits with it first ([`TorchMoves`]).
//!
//! Copies run with the GIL released. The outputs of a batch of 1 MiB or more are made
//! while its copies run (`while_copying` of `pinlane::transfer_tensor_h2d_overlapping` and
//! `transfer_tensor_d2h_overlapping`, the GIL taken back for it) and reach the caller only
//! once the copies are done, unless a torch function or dispatch mode is active and a run
//! of outputs is to be split (the mode would see the split): then after the copies, as a
//! smaller H2D's are.
//! A small D2H of up to three tensors (after a thread's first on the device) keeps the GIL
//! but where the engine may block on the device ([`d2h_held`]), making its outputs while
//! the copies run.
//! `min_run`: the shortest run of same-shape outputs handed to torch as one tensor (see
//! [`Torch::export_all`]); benches/py_overhead.py sets it high to time the per-tensor way.

use crate::errors::to_py;
use crate::split;
use crate::torch::{self, Kind, Managed, Torch};
use pinlane::{D2hOptions, Device, Event, H2dOptions, RawEvent, RawStream, Stream, Tensor};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use std::cell::Cell;
use std::sync::atomic::{AtomicU64, Ordering};

/// Page-locked sources at least this large are copied straight from their memory; smaller
/// ones go through the staging ring like pageable ones, where many share one copy (a copy
/// per tensor costs ~6 us). Only sources this large are asked whether they are
/// page-locked (of the driver: [`torch::mark_if_page_locked`]).
const DIRECT_MIN_BYTES: usize = 1 << 20;

/// One input's fate.
enum Slot<'py> {
    /// Moved by pinlane: the index of its output in the transfer's result.
    Moved(usize),
    /// Returned as it is: the same object, or (H2D) torch's move of it, already made
    /// ([`TorchMoves::now`]).
    Same(Bound<'py, PyAny>),
    /// Moved by torch (`tensor.to(target)`) as the outputs are listed (D2H).
    Torch(Bound<'py, PyAny>),
}

/// Runs once before the first torch-side work on a tensor the call reads (see the
/// module docs): D2H waits for its producer event there; H2D has no producer event (its
/// moves by torch wait in [`TorchMoves::now`]).
pub(crate) type BeforeTorch<'a> = &'a mut dyn FnMut() -> PyResult<()>;

/// The outputs, in input order: pinlane's, handed to torch; the same objects; torch's
/// `to(target)` of the rest (after `before_torch`).
fn outputs<'py>(
    py: Python<'py>,
    torch: &Torch,
    slots: Vec<Slot<'py>>,
    moved: &[Tensor],
    min_run: usize,
    target: &str,
    before_torch: BeforeTorch<'_>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let exported = torch.export_all(py, moved, min_run)?;
    split::mark("exported");
    outputs_from(py, slots, exported, target, before_torch)
}

/// [`outputs`] with pinlane's outputs already handed to torch (`exported`, in the
/// transfer's order).
fn outputs_from<'py>(
    py: Python<'py>,
    slots: Vec<Slot<'py>>,
    exported: Vec<Bound<'py, PyAny>>,
    target: &str,
    before_torch: BeforeTorch<'_>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let mut exported = exported.into_iter().map(Some).collect::<Vec<_>>();
    let mut out = Vec::with_capacity(slots.len());
    for s in slots {
        out.push(match s {
            Slot::Moved(k) => exported[k].take().ok_or_else(|| {
                PyRuntimeError::new_err("pinlane: an output was handed out twice")
            })?,
            Slot::Same(o) => o,
            Slot::Torch(t) => {
                before_torch()?;
                t.call_method1(intern!(py, "to"), (target,))?
            }
        });
    }
    split::mark("listed");
    Ok(out)
}

pub(crate) fn requires_grad(t: &Bound<'_, PyAny>) -> PyResult<bool> {
    t.getattr(intern!(t.py(), "requires_grad"))?.is_truthy()
}

/// `t.device` as torch names it: its type (`"cpu"`, `"cuda"`, ...) and index. Asked only
/// of tensors the exchange API refuses, to decide whether the call moves them.
pub(crate) fn torch_device(t: &Bound<'_, PyAny>) -> PyResult<(String, Option<usize>)> {
    let py = t.py();
    let d = t.getattr(intern!(py, "device"))?;
    Ok((
        d.getattr(intern!(py, "type"))?.extract()?,
        d.getattr(intern!(py, "index"))?.extract()?,
    ))
}

/// `t`'s values as a plain compact tensor that pinlane copies byte for byte: `None` with
/// `dl` itself when `t` already is one; otherwise torch's `resolve_neg()` /
/// `contiguous()` of it, where it lives (after `before_torch`), and that tensor's
/// descriptor.
///
/// `maybe_neg`: whether any tensor of the call may have the negation bit (the Python half
/// asks them all at once, `any(map(Tensor.is_neg, ...))`, at ~0.1 us a tensor, where
/// asking one from here costs ~1 us under the stable ABI); when false, none is asked.
pub(crate) fn readable<'py>(
    torch: &Torch,
    t: &Bound<'py, PyAny>,
    dl: Managed,
    maybe_neg: bool,
    before_torch: BeforeTorch<'_>,
) -> PyResult<(Option<Bound<'py, PyAny>>, Managed)> {
    let py = t.py();
    // The exchange API exports the memory of a negated view without its bit.
    let neg = maybe_neg && t.call_method0(intern!(py, "is_neg"))?.is_truthy()?;
    if !neg && torch::is_compact(&dl) {
        return Ok((None, dl));
    }
    before_torch()?;
    let mut c = t.clone();
    if neg {
        c = c.call_method0(intern!(py, "resolve_neg"))?;
    }
    let c = c.call_method0(intern!(py, "contiguous"))?;
    let (dl, _) = torch.import(&c)?;
    Ok((Some(c), dl))
}

/// torch's current stream of CUDA device `device` as `h2d` asks for it (through the
/// exchange API of `probe`'s class, a torch tensor), as a raw handle: for the tests, which
/// compare it with `torch.cuda.current_stream(device).cuda_stream`.
#[pyfunction]
pub(crate) fn torch_current_stream(
    py: Python<'_>,
    probe: Bound<'_, PyAny>,
    device: usize,
) -> PyResult<usize> {
    Torch::of(&probe)?.current_stream(py, device)
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

/// `transfer_tensor_h2d` over `tensors`, onto `device` (`None`: cuda:{LOCAL_RANK}),
/// freeing returned memory in order on `consumer_stream` (a raw handle; `None`: torch's
/// current stream of `device`, asked through its exchange API).
///
/// `views`: plain small CPU tensors are read through the exchange API's non-owning view
/// ([`Torch::host_view`]); false imports every tensor the usual way (for
/// benches/py_overhead.py, which times both in one process). `handover`: false makes
/// every batch's torch tensors after its copies (for benches/probes/h2d_handover_ab.py).
/// `torch_moves`: one flag per tensor, true for a tensor torch must move (the Python half
/// marks those carrying a forward-mode AD tangent, which pinlane's copy would drop).
#[pyfunction]
#[pyo3(signature = (tensors, *, num_caches, device=None, consumer_stream=None, min_run=torch::MIN_RUN, maybe_neg=true, views=true, handover=true, torch_moves=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn h2d<'py>(
    py: Python<'py>,
    tensors: Vec<Bound<'py, PyAny>>,
    num_caches: usize,
    device: Option<usize>,
    consumer_stream: Option<usize>,
    min_run: usize,
    maybe_neg: bool,
    views: bool,
    handover: bool,
    torch_moves: Option<Vec<bool>>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let _split = split::start();
    let forced = Forced::new(torch_moves, tensors.len())?;
    let Some(first) = tensors.first() else {
        return Ok(Vec::new());
    };
    // `None`: cuda:{LOCAL_RANK}, read here rather than asked by the Python half in a
    // call of its own.
    let device = match device {
        Some(d) => d,
        None => crate::local_rank_device().map_err(to_py)?.ordinal(),
    };
    let torch = Torch::of(first)?;
    let target = format!("cuda:{device}");
    let dev = Device::cuda(device);
    let mut slots = Vec::with_capacity(tensors.len());
    let mut inputs = Vec::with_capacity(tensors.len());
    let mut moves = TorchMoves {
        torch: &torch,
        device,
        target: &target,
        waited: false,
    };
    for (i, t) in tensors.into_iter().enumerate() {
        let slot = h2d_slot(
            &mut moves,
            t,
            forced.at(i),
            dev,
            maybe_neg,
            views,
            &mut inputs,
        )?;
        slots.push(slot);
    }
    split::mark("imported");
    if inputs.is_empty() {
        return outputs(py, &torch, slots, &[], min_run, &target, &mut || Ok(()));
    }
    let consumer_stream = match consumer_stream {
        Some(raw) => raw,
        None => torch.current_stream(py, device)?,
    };
    // SAFETY: `from_raw` needs a live stream of the device's primary context (checked
    // there: a foreign context is refused) that outlives the output tensors, whose memory
    // is freed in order on it. `consumer_stream` is torch's current stream of `device`
    // (asked of torch just now, or passed as `torch.cuda.current_stream(device).cuda_stream`).
    // torch's own streams come from pools that live as long as the process, so for them
    // both hold. A `torch.cuda.ExternalStream` is the caller's: that it outlives the
    // outputs is a contract the Python docs state (as torch asks the same of it for its
    // own allocations), not something this code can check.
    let consumer = unsafe { Stream::from_raw(consumer_stream as RawStream, dev) }.map_err(to_py)?;
    let opts = H2dOptions::default()
        .device(dev)
        .num_caches(num_caches)
        .consumer_stream(consumer);
    // A batch of HANDOVER_MIN_BYTES or more is handed to torch while its copies run (the
    // GIL taken back for it), as D2H's is; a smaller one after them.
    let overlap =
        handover && inputs.iter().map(Tensor::nbytes).sum::<usize>() >= HANDOVER_MIN_BYTES;
    let shared = Attached(&torch);
    let (inputs_ref, opts_ref) = (&inputs, &opts);
    let (moved, exported) = py
        .detach(move || {
            if !overlap {
                return pinlane::transfer_tensor_h2d_with(inputs_ref, opts_ref).map(|m| (m, None));
            }
            pinlane::transfer_tensor_h2d_overlapping(inputs_ref, opts_ref, |outs| {
                // SAFETY: `outs` are the outputs of this very call, while its copies may
                // run; the torch tensors made of them stay in this function until the call
                // has returned, which hands them on only once it is `Ok` and drops them
                // unused otherwise (`hand_over`'s obligation).
                Python::attach(|py| unsafe { hand_over(py, shared.get(), outs, min_run) })
            })
        })
        .map_err(to_py)?;
    split::mark("copied");
    drop(inputs);
    split::mark("inputs dropped");
    let exported = handed_or_now(py, &torch, exported, &moved, min_run)?;
    split::mark("exported");
    outputs_from(py, slots, exported, &target, &mut || Ok(()))
}

/// [`h2d`] of one tensor known not to be negated, onto cuda:{LOCAL_RANK}: the Python
/// half's fast path for one plain tensor (a positional call, no list each way).
#[pyfunction]
#[pyo3(signature = (tensor, num_caches, /))]
pub(crate) fn h2d_one<'py>(
    py: Python<'py>,
    tensor: Bound<'py, PyAny>,
    num_caches: usize,
) -> PyResult<Bound<'py, PyAny>> {
    only(h2d_plain(py, vec![tensor], num_caches)?)
}

/// [`h2d`] of tensors known not to be negated, onto cuda:{LOCAL_RANK}, with the defaults
/// (torch's current stream, runs of [`torch::MIN_RUN`], views): the Python half's short
/// ways (one tensor, a flat batch).
pub(crate) fn h2d_plain<'py>(
    py: Python<'py>,
    tensors: Vec<Bound<'py, PyAny>>,
    num_caches: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    h2d(
        py,
        tensors,
        num_caches,
        None,
        None,
        torch::MIN_RUN,
        false,
        true,
        true,
        None,
    )
}

/// The one output of a one-tensor call.
fn only<'py>(out: Vec<Bound<'py, PyAny>>) -> PyResult<Bound<'py, PyAny>> {
    let mut out = out.into_iter();
    match (out.next(), out.next()) {
        (Some(one), None) => Ok(one),
        _ => Err(PyRuntimeError::new_err(
            "pinlane: a one-tensor call did not give one output",
        )),
    }
}

/// H2D of a tensor torch moves: by torch if it is on the host ([`TorchMoves::now`]);
/// otherwise returned as is.
fn h2d_by_torch<'py>(moves: &mut TorchMoves<'_>, t: Bound<'py, PyAny>) -> PyResult<Slot<'py>> {
    match torch_device(&t)?.0.as_str() {
        "cpu" => moves.now(t),
        _ => Ok(Slot::Same(t)),
    }
}

/// The host tensors an H2D call leaves to torch, moved by it (`t.to(target)`) as the batch
/// is read, before pinlane queues a copy: a move torch refuses (its out-of-memory error, a
/// subclass's own `.to` raising) then fails the call with nothing of it in the thread's
/// ring of recent batches (which the call would otherwise fill with its own outputs, held
/// for `num_caches` calls and never released for a retry after out-of-memory).
///
/// torch's move (`non_blocking=False`) waits for torch's current stream of the device
/// without a bound: where `Config::sync_wait` sets one, the call's first move waits for
/// that stream with it before ([`bounded_wait_before_torch`]), so that past the bound the
/// call fails with nothing moved and nothing queued.
struct TorchMoves<'a> {
    torch: &'a Torch,
    device: usize,
    target: &'a str,
    waited: bool,
}

impl TorchMoves<'_> {
    /// torch's move of host tensor `t`, made now.
    fn now<'py>(&mut self, t: Bound<'py, PyAny>) -> PyResult<Slot<'py>> {
        let py = t.py();
        if !self.waited {
            bounded_wait_before_torch(py, self.torch, self.device, None)?;
            self.waited = true;
        }
        Ok(Slot::Same(
            t.call_method1(intern!(py, "to"), (self.target,))?,
        ))
    }
}

/// The Python half's `torch_moves` of a call of `len` tensors: whether torch must move
/// the tensor at each place.
struct Forced(Option<Vec<bool>>);

impl Forced {
    fn new(flags: Option<Vec<bool>>, len: usize) -> PyResult<Forced> {
        match flags {
            Some(f) if f.len() != len => Err(PyValueError::new_err(format!(
                "pinlane: torch_moves has {} flag(s) for {len} tensor(s): one a tensor",
                f.len()
            ))),
            f => Ok(Forced(f)),
        }
    }

    fn at(&self, i: usize) -> bool {
        self.0.as_ref().is_some_and(|f| f[i])
    }
}

/// What H2D onto `dev` does with `t`: a tensor pinlane moves is pushed onto `inputs`; one
/// torch moves is moved by `moves` (onto the same device). `forced`: the Python half's
/// `torch_moves` flag for it (it carries a forward-mode AD tangent).
fn h2d_slot<'py>(
    moves: &mut TorchMoves<'_>,
    t: Bound<'py, PyAny>,
    forced: bool,
    dev: Device,
    maybe_neg: bool,
    views: bool,
    inputs: &mut Vec<Tensor>,
) -> PyResult<Slot<'py>> {
    let torch = moves.torch;
    // Torch moves what is on the host and either is flagged, requires grad (keeping
    // autograd), is of a subclass whose class torch's `.to()` keeps
    // ([`Torch::keeps_subclass`]), or will not be exported (a sparse or other non-strided
    // tensor); the rest of those stays as it is.
    if forced || requires_grad(&t)? || torch.keeps_subclass(&t)? {
        return h2d_by_torch(moves, t);
    }
    if views && !maybe_neg {
        // The plain case (a compact CPU tensor staged by pinlane) without a managed
        // import.
        if let Some(p) = torch.host_view(&t, DIRECT_MIN_BYTES) {
            inputs.push(p);
            return Ok(Slot::Moved(inputs.len() - 1));
        }
    }
    let Ok((dl, _)) = torch.import(&t) else {
        return h2d_by_torch(moves, t);
    };
    if !matches!(torch::kind(&dl), Kind::Host) {
        return Ok(Slot::Same(t));
    }
    if !torch.has_dtype(&t, &dl)? {
        return moves.now(t);
    }
    // On the host: torch's work there is synchronous, with nothing to wait for first. A
    // contiguous copy made here lives on in `dl` (the import holds its storage).
    let (_copy, mut dl) = readable(torch, &t, dl, maybe_neg, &mut || Ok(()))?;
    torch::mark_if_page_locked(&mut dl, DIRECT_MIN_BYTES, dev);
    Ok(match torch::to_pinlane(dl) {
        Ok(p) => {
            inputs.push(p);
            Slot::Moved(inputs.len() - 1)
        }
        // pinlane cannot hold it (its import says why): torch moves it.
        Err(_) => moves.now(t)?,
    })
}

/// Before torch's synchronous copies: waits until the work queued so far on torch's
/// current stream of `device`, and on `stream` (a `torch.cuda.Stream` the Python half
/// holds for the call, if any and another), has run, each bounded as pinlane's own waits
/// are (`pinlane::wait_for_event`), with the GIL released, since torch's own wait for its
/// stream (`cudaStreamSynchronize`) has no bound. Two callers: a D2H call (or `copy_into`
/// from CUDA) where pinlane copies none of the tensors, before torch's first `to("cpu")`
/// / `copy_` (where pinlane copies some, its bounded wait for them, queued after the same
/// work, already comes first); and H2D, once a call before torch's first move of a host
/// tensor ([`TorchMoves::now`]), whatever pinlane copies (its copies are queued after
/// torch's moves).
///
/// Nothing is waited for where there is no bound (`pinlane::sync_wait()` is `None`: the
/// default, and also before pinlane's runtime exists, which `configure` or the process's
/// first transfer by pinlane makes; torch's own wait is then as long as this one would
/// be, which would cost an event and a release of the GIL a call), nor on a stream
/// pinlane cannot take (`Stream::from_raw` refuses another context's stream and the
/// per-thread handle): torch waits for those as before.
pub(crate) fn bounded_wait_before_torch(
    py: Python<'_>,
    torch: &Torch,
    device: usize,
    stream: Option<usize>,
) -> PyResult<()> {
    if pinlane::sync_wait().is_none() {
        return Ok(());
    }
    let dev = Device::cuda(device);
    let current = torch.current_stream(py, device)?;
    for raw in std::iter::once(current).chain(stream.filter(|&s| s != current)) {
        // SAFETY: a stream of `device`'s primary context (or the legacy or per-thread
        // handle, which `from_raw` checks) that stays alive for the whole call: torch's
        // current stream of `device` (one of torch's own streams, never destroyed, or an
        // `ExternalStream` its owner keeps current, so alive, for the call), or the
        // caller's `torch.cuda.Stream`, held by the Python half for the call. The clone
        // lives only in this loop.
        let Ok(s) = (unsafe { Stream::from_raw(raw as RawStream, dev) }) else {
            continue;
        };
        let done = Event::new(dev).map_err(to_py)?;
        done.record(&s).map_err(to_py)?;
        py.detach(|| pinlane::wait_for_event(&done))
            .map_err(to_py)?;
    }
    Ok(())
}

/// D2H's wait for the producer event before torch-side work (see the module docs): the
/// first `pass` synchronises with the event on the host, with the GIL released.
struct ProducerGate {
    event: Option<Event>,
    passed: bool,
}

impl ProducerGate {
    /// Waits as the engine waits for its copies (`pinlane::wait_for_event`: bounded by
    /// `Config::sync_wait` when set, then `pinlane::Error::SyncTimeout`, the call having
    /// queued nothing); it makes no runtime (a call whose tensors all go to torch makes
    /// none, and `configure` must still be possible after it).
    fn pass(&mut self, py: Python<'_>) -> PyResult<()> {
        if !self.passed {
            if let Some(e) = &self.event {
                py.detach(|| pinlane::wait_for_event(e)).map_err(to_py)?;
            }
            self.passed = true;
        }
        Ok(())
    }
}

/// `transfer_tensor_d2h` over `tensors`: the CUDA tensors on `device` (`None`: LOCAL_RANK)
/// are copied to page-locked host memory, after the work queued on torch's current
/// stream of the device and the optional event; `stream` and `event` are
/// `(raw handle, device)` of a `torch.cuda.Stream` / recorded `torch.cuda.Event`.
///
/// `views`: plain CUDA tensors are read through the exchange API's non-owning view
/// ([`Torch::device_view`]); false imports every tensor the usual way (for
/// benches/py_overhead.py).
#[pyfunction]
#[pyo3(signature = (tensors, *, device=None, stream=None, event=None, min_run=torch::MIN_RUN, maybe_neg=true, views=true, torch_moves=None))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn d2h<'py>(
    py: Python<'py>,
    tensors: Vec<Bound<'py, PyAny>>,
    device: Option<&str>,
    stream: Option<(usize, usize)>,
    event: Option<(usize, usize)>,
    min_run: usize,
    maybe_neg: bool,
    views: bool,
    torch_moves: Option<Vec<bool>>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    let _split = split::start();
    let forced = Forced::new(torch_moves, tensors.len())?;
    if stream.is_some() && device.is_none() {
        return Err(to_py(pinlane::Error::StreamWithoutDevice));
    }
    // Parsed once: a bad string is `check_device`'s error, from the same parse.
    let dev = match device {
        None | Some("cuda") => crate::local_rank_device(),
        Some(s) => s.parse::<Device>(),
    }
    .map_err(to_py)?;
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
    let mut gate = ProducerGate {
        event: None,
        passed: false,
    };
    if let Some((raw, on)) = event {
        if on != dev.ordinal() {
            // Checked here, before any torch-side work waits for it (the engine checks too,
            // but only once pinlane moves a tensor).
            return Err(to_py(pinlane::Error::EventDeviceMismatch {
                event_device: Device::cuda(on),
                device: dev,
            }));
        }
        // SAFETY: a recorded `torch.cuda.Event`'s handle and device (created in that
        // device's primary context), alive while the caller holds the object, for the
        // whole call.
        let e = unsafe { Event::from_raw(raw as RawEvent, Device::cuda(on)) }.map_err(to_py)?;
        opts = opts.producer_event(e.clone());
        gate.event = Some(e);
    }
    let Some(first) = tensors.first() else {
        return Ok(Vec::new());
    };
    let torch = Torch::of(first)?;
    let mut slots = Vec::with_capacity(tensors.len());
    let mut inputs = Vec::with_capacity(tensors.len());
    let mut current: Option<usize> = None;
    for (i, t) in tensors.into_iter().enumerate() {
        let before = &mut || gate.pass(py);
        let slot = d2h_slot(
            &torch,
            t,
            forced.at(i),
            dev,
            maybe_neg,
            views,
            before,
            &mut inputs,
            &mut current,
        )?;
        slots.push(slot);
    }
    split::mark("imported");
    if inputs.is_empty() {
        // Every tensor is torch's to move (`to("cpu")` on its current stream, which waits
        // there without a bound): after the producer event, that stream, bounded.
        if slots.iter().any(|s| matches!(s, Slot::Torch(_))) {
            gate.pass(py)?;
            bounded_wait_before_torch(py, &torch, dev.ordinal(), None)?;
        }
        return outputs(py, &torch, slots, &[], min_run, "cpu", &mut || {
            gate.pass(py)
        });
    }
    // torch's current stream of the device: the spec's "caller's current stream".
    let raw_current = current.unwrap_or(0);
    // SAFETY: the exchange API's `current_work_stream` for the device: torch's current
    // stream there, of the primary context, never destroyed by torch.
    let current = unsafe { Stream::from_raw(raw_current as RawStream, dev) }.map_err(to_py)?;
    // A batch of HANDOVER_MIN_BYTES or more is handed to torch while its copies run (the
    // GIL taken back for it), then the call waits for the copies without it. A smaller one
    // of up to HELD_MAX_TENSORS tensors keeps the GIL (`d2h_held`), after the thread's
    // first call on the device; any other, after the copies.
    let overlap = inputs.iter().map(Tensor::nbytes).sum::<usize>() >= HANDOVER_MIN_BYTES;
    // Read once, before the call: a shutdown while it runs leaves the thread cold.
    let epoch = EPOCH.load(Ordering::Relaxed);
    // Never on a caller's stream: the device's setup for it is not the thread's own.
    let held = !overlap && inputs.len() <= HELD_MAX_TENSORS && stream.is_none() && warm(dev, epoch);
    let shared = Attached(&torch);
    let (inputs_ref, opts_ref, current_ref) = (&inputs, &opts, &current);
    let (moved, exported) = if held {
        d2h_held(py, &torch, &inputs, &opts, &current, min_run)
    } else {
        py.detach(move || {
            let _guard = pinlane::set_current_stream(current_ref);
            if !overlap {
                return pinlane::transfer_tensor_d2h(inputs_ref, opts_ref).map(|m| (m, None));
            }
            pinlane::transfer_tensor_d2h_overlapping(inputs_ref, opts_ref, |outs| {
                // SAFETY: `outs` are the outputs of this very call, while its copies may
                // run; the torch tensors made of them stay in this function until the call
                // has returned, which hands them on only once it is `Ok` and drops them
                // unread otherwise (`hand_over`'s obligation).
                Python::attach(|py| unsafe { hand_over(py, shared.get(), outs, min_run) })
            })
        })
    }
    .map_err(to_py)?;
    split::mark("copied");
    if stream.is_none() {
        set_warm(dev, epoch);
    }
    drop(inputs);
    split::mark("inputs dropped");
    let exported = handed_or_now(py, &torch, exported, &moved, min_run)?;
    split::mark("exported");
    outputs_from(py, slots, exported, "cpu", &mut || gate.pass(py))
}

/// Batches of at least this many bytes are handed to torch while their copies run, both
/// ways (benches/probes/d2h_handover.py: 64 images, 8 x 32 MiB; for H2D,
/// benches/probes/images_split.py). Smaller D2H ones are handed over while the copies run
/// with the GIL kept ([`d2h_held`], up to [`HELD_MAX_TENSORS`] tensors), or after the
/// wait, as smaller H2D ones are: the copies end within microseconds of being queued, and
/// the GIL taken back for the handover would be a second acquisition in the call (the
/// interpreter may take a switch interval, 5 ms by default, to hand it over when another
/// thread holds it) for at most the copies' microseconds. A larger batch pays it too,
/// partly hidden by its copies: under a busy Python thread no change showed against the
/// package without the handover (benches/probes/gil_contention.py, docs/semantics.md).
const HANDOVER_MIN_BYTES: usize = 1 << 20;

/// Batches of at most this many tensors (and under [`HANDOVER_MIN_BYTES`]) move with the
/// GIL held ([`d2h_held`]). Below the engine's four small tensors, each takes a copy of
/// its own: the engine gathers four or more through a staging slot, and may wait for one
/// outside `around_wait` (`transfer_tensor_d2h_overlapping_around`'s docs).
const HELD_MAX_TENSORS: usize = 3;

/// Bumped by [`crate::shutdown`]: after it, a thread's next call may start pinlane's
/// runtime anew, so every thread counts as not warm again.
pub(crate) static EPOCH: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// The devices (a bit each, ordinals under 64) this thread has made a D2H call on with
    /// its own stream, and the [`EPOCH`] then: a first call (which may set up the thread's
    /// stream, the device's context and pinlane's runtime) lets go of the GIL throughout.
    static WARM: Cell<(u64, u64)> = const { Cell::new((u64::MAX, 0)) };
}

/// Whether this thread has made a D2H call on `dev` with its own stream in [`EPOCH`] `now`
/// (read before the call): only then may one keep the GIL ([`d2h_held`]).
fn warm(dev: Device, now: u64) -> bool {
    let (epoch, devices) = WARM.get();
    epoch == now && dev.ordinal() < 64 && devices & (1 << dev.ordinal()) != 0
}

/// Records that this thread has made a D2H call on `dev` with its own stream, which began
/// in [`EPOCH`] `now`: a shutdown since then (the epoch moved on) marks nothing warm for the
/// new one.
fn set_warm(dev: Device, now: u64) {
    if dev.ordinal() >= 64 {
        return;
    }
    let (epoch, devices) = WARM.get();
    let devices = if epoch == now { devices } else { 0 };
    WARM.set((now, devices | 1 << dev.ordinal()));
}

/// A small D2H that keeps the GIL, but where the engine may block on the device
/// (`transfer_tensor_d2h_overlapping_around`'s `around_wait`): its outputs are handed to
/// torch while the copies run, with no acquisition of the GIL in the call (which another
/// thread busy in Python could delay by a switch interval, 5 ms by default). The call
/// lets go of the GIL if its copies are not seen done within the engine's spin
/// (`Config::spin`, 50 us; when the caller's stream is still busy, say), for a failed
/// call's drain, and for pageable outputs (the page-locked output pool at its cap).
/// Torch's own `.cpu()` lets go of it for the whole call.
fn d2h_held(
    py: Python<'_>,
    torch: &Torch,
    inputs: &Vec<Tensor>,
    opts: &D2hOptions,
    current: &Stream,
    min_run: usize,
) -> pinlane::Result<(Vec<Tensor>, Option<Handed>)> {
    let _guard = pinlane::set_current_stream(current);
    pinlane::transfer_tensor_d2h_overlapping_around(
        inputs,
        opts,
        // SAFETY: as in `d2h`'s handover: `outs` are this very call's outputs, whose
        // torch tensors are handed on only once the call is `Ok` and dropped unread
        // otherwise (`hand_over`'s obligation).
        |outs| unsafe { hand_over(py, torch, outs, min_run) },
        |wait| {
            let wait = Unattached(wait);
            py.detach(move || wait.run());
        },
    )
}

/// The torch tensors a call made of its outputs while their copies ran.
type Handed = Vec<Py<PyAny>>;

/// The torch tensors over `moved`, a finished call's outputs: those `handed` over while
/// its copies ran, or, where none were (a small batch, a mode that would see a run's
/// split, or a failure of the handover), made now (a lasting failure is raised here).
fn handed_or_now<'py>(
    py: Python<'py>,
    torch: &Torch,
    handed: Option<Handed>,
    moved: &[Tensor],
    min_run: usize,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    match handed {
        Some(v) => Ok(v.into_iter().map(|o| o.into_bound(py)).collect()),
        None => torch.export_all(py, moved, min_run),
    }
}

/// Torch tensors over `outs`, made while their copies run (`while_copying` of the
/// engine's overlapping calls: D2H's page-locked outputs, H2D's device outputs); `None`
/// if they could not be made then (the call hands them over after the copies instead).
///
/// # Safety
/// `outs` are the outputs of the call running this, and its caller hands the returned
/// tensors to no one before that call has returned `Ok` (it drops them unused
/// otherwise): [`Torch::export_all_in_flight`]'s obligations. No Python code is given them
/// meanwhile: the only op run on them is a run's `unbind(0)` (no kernel: rows of the
/// run's tensor, over its storage), left until after the call when a torch function or
/// dispatch mode would see it (that function's check). While the GIL is let go for a
/// wait, another thread could reach them only through the garbage collector's list of
/// all objects (`gc.get_objects()`); so could code that a garbage collection runs in the
/// handover itself (finalizers, `gc.callbacks`), which no code should read them from
/// either.
unsafe fn hand_over(
    py: Python<'_>,
    torch: &Torch,
    outs: &[Tensor],
    min_run: usize,
) -> Option<Handed> {
    split::mark("hook entered");
    // SAFETY: this function's own obligations, passed on.
    let made = unsafe { torch.export_all_in_flight(py, outs, min_run) };
    let handed: Option<Handed> = made
        .ok()
        .flatten()
        .map(|v| v.into_iter().map(Bound::unbind).collect());
    if handed.is_some() {
        // Only where the tensors were made here (not for a fall-back to after the copies).
        split::mark("handed over");
    }
    handed
}

/// The engine's wait, run by [`d2h_held`] with the GIL released.
struct Unattached<'a>(&'a mut dyn FnMut());

// SAFETY: pyo3's `detach` runs its closure on the calling thread before it returns, so
// the wait never leaves the thread that made it. It uses no Python object: the engine's
// wait, and at most the drop of owners an earlier failed call left in pinlane's keeping,
// where a torch tensor's `Py` handle is only queued for its decref (pyo3 does that when
// no thread state is attached).
unsafe impl Send for Unattached<'_> {}

impl Unattached<'_> {
    /// Runs the wait. A method, not `.0`: a closure that names the field captures the
    /// field alone (not `Send`), not the wrapper.
    fn run(self) {
        (self.0)()
    }
}

/// The binding's [`Torch`], lent to the closures that `h2d` and `d2h` run detached from the
/// interpreter, for its `Python::attach`.
struct Attached<'a>(&'a Torch);

// SAFETY: the only part of `Torch` that is not `Send` is the pointer to the exchange API's
// table, which torch keeps for the life of the process; its torch objects are used only
// with the thread attached (inside `Python::attach`). pyo3's `detach` runs its closure on
// the calling thread before it returns, so the `Attached` moved into it never leaves the
// thread that made it.
unsafe impl Send for Attached<'_> {}

impl Attached<'_> {
    /// The `Torch`. A method, not `.0`: a closure that names the field captures the field
    /// alone (a `&Torch`, which is not `Send`), not the wrapper.
    fn get(&self) -> &Torch {
        self.0
    }
}

/// [`d2h`] of one tensor known not to be negated, from `device` (`None`:
/// cuda:{LOCAL_RANK}), with no stream or event: the Python half's fast path for one plain
/// tensor.
#[pyfunction]
#[pyo3(signature = (tensor, device, /))]
pub(crate) fn d2h_one<'py>(
    py: Python<'py>,
    tensor: Bound<'py, PyAny>,
    device: Option<&str>,
) -> PyResult<Bound<'py, PyAny>> {
    only(d2h_plain(py, vec![tensor], device)?)
}

/// [`d2h`] of tensors known not to be negated, from `device` (`None`: cuda:{LOCAL_RANK}),
/// with no stream or event and the defaults (runs of [`torch::MIN_RUN`], views): the
/// Python half's short ways (one tensor, a flat batch).
pub(crate) fn d2h_plain<'py>(
    py: Python<'py>,
    tensors: Vec<Bound<'py, PyAny>>,
    device: Option<&str>,
) -> PyResult<Vec<Bound<'py, PyAny>>> {
    d2h(
        py,
        tensors,
        device,
        None,
        None,
        torch::MIN_RUN,
        false,
        true,
        None,
    )
}

/// D2H from `dev` of a tensor torch moves: by torch if it is on `dev`; otherwise returned
/// as is.
fn d2h_by_torch(t: Bound<'_, PyAny>, dev: Device) -> PyResult<Slot<'_>> {
    Ok(match torch_device(&t)? {
        (ty, Some(n)) if ty == "cuda" && n == dev.ordinal() => Slot::Torch(t),
        _ => Slot::Same(t),
    })
}

/// What D2H from `dev` does with `t`; a tensor pinlane moves is pushed onto `inputs`,
/// and torch's current stream on `dev` noted in `current` (from the first such tensor).
/// `forced`: the Python half's `torch_moves` flag for it (it carries a forward-mode AD
/// tangent).
#[allow(clippy::too_many_arguments)]
fn d2h_slot<'py>(
    torch: &Torch,
    t: Bound<'py, PyAny>,
    forced: bool,
    dev: Device,
    maybe_neg: bool,
    views: bool,
    before_torch: BeforeTorch<'_>,
    inputs: &mut Vec<Tensor>,
    current: &mut Option<usize>,
) -> PyResult<Slot<'py>> {
    // Torch moves what is on `dev` and either is flagged, requires grad (spdl copies these
    // one by one on the current stream, keeping autograd), is of a subclass whose class
    // torch's `.to()` keeps ([`Torch::keeps_subclass`]), or will not be exported (a sparse
    // or other non-strided tensor); the rest of those stays as it is.
    let by_torch = |t| d2h_by_torch(t, dev);
    if forced || requires_grad(&t)? || torch.keeps_subclass(&t)? {
        return by_torch(t);
    }
    if views && !maybe_neg {
        // The plain case (a compact CUDA tensor of `dev`) without a managed import.
        if let Some((p, work)) = torch.device_view(&t, dev.ordinal()) {
            current.get_or_insert(work);
            inputs.push(p);
            return Ok(Slot::Moved(inputs.len() - 1));
        }
    }
    let Ok((dl, work)) = torch.import(&t) else {
        return by_torch(t);
    };
    match torch::kind(&dl) {
        Kind::Cuda(n) if n == dev.ordinal() => {}
        _ => return Ok(Slot::Same(t)),
    }
    if !torch.has_dtype(&t, &dl)? {
        return Ok(Slot::Torch(t));
    }
    current.get_or_insert(work as usize);
    // Resolved and made compact on the device, on torch's current stream (which the copy
    // waits for), once the producer event has completed.
    let (_, dl) = readable(torch, &t, dl, maybe_neg, before_torch)?;
    Ok(match torch::to_pinlane(dl) {
        Ok(p) => {
            inputs.push(p);
            Slot::Moved(inputs.len() - 1)
        }
        Err(_) => Slot::Torch(t),
    })
}
