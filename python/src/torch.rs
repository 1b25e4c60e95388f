//! torch tensors in and out of pinlane, zero-copy, through the DLPack C exchange API that
//! PyTorch 2.10 and newer publish as `torch.Tensor.__dlpack_c_exchange_api__`: one C call
//! per tensor each way, no Python-level `__dlpack__` and no capsule.

use crate::errors::to_py;
use dlpark::ffi::{DLDataType, DLDataTypeCode, DLDeviceType, DLManagedTensorVersioned, DLTensor};
use dlpark::metadata::Dynamic;
use dlpark::python::consumer::exchange::ExchangeApi;
use dlpark::DlpackFlags;
use pinlane::{DType, Device, Shape, Tensor};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use std::ffi::c_void;

/// A torch tensor's descriptor, owned: torch's deleter runs when it drops (or when the
/// pinlane tensor made from it has no more users).
pub(crate) type Managed = dlpark::versioned::Dlpack;

/// What an imported tensor is, for the two calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Host memory: `kDLCPU` (torch says `kDLCPU` for page-locked tensors too).
    Host,
    /// Memory of CUDA device `n`.
    Cuda(usize),
    /// Anything else (another accelerator, managed memory): passed through.
    Other,
}

/// PyTorch's exchange API, that of the class of the batch's first tensor (`torch.Tensor`'s
/// looked up once per process, a subclass's per call), and the torch objects the calls
/// compare with.
pub(crate) struct Torch {
    api: Api,
    objs: &'static TorchObjs,
}

/// The exchange API a call uses: `torch.Tensor`'s, looked up once per process
/// ([`TENSOR_API`]), or that of the batch's first tensor's class, looked up per call.
enum Api {
    Tensor(&'static ExchangeApi),
    Class(ExchangeApi),
}

/// `torch.Tensor`'s exchange API, shared by every call whose first tensor is exactly a
/// `torch.Tensor` (saving the class attribute lookup and capsule read, ~0.1 us a call).
struct TensorApi(ExchangeApi);

// SAFETY: an `ExchangeApi` is a pointer to the table torch publishes in its
// `__dlpack_c_exchange_api__` capsule, static in torch for the life of the process (the
// exchange API's contract) and never written after it is published. Every use is a call
// into torch with the GIL held, as with the table looked up per call.
unsafe impl Send for TensorApi {}
// SAFETY: as for `Send`: shared reads of a static table, used with the GIL held.
unsafe impl Sync for TensorApi {}

static TENSOR_API: PyOnceLock<Option<TensorApi>> = PyOnceLock::new();

/// torch objects looked up once per process.
struct TorchObjs {
    int8: Py<PyAny>,
    uint8: Py<PyAny>,
    /// `torch.Tensor`'s exchange API's `current_work_stream`, if it publishes one.
    current_work_stream: dlpark::ffi::DLPackCurrentWorkStream,
    /// `torch._C._len_torch_function_stack` and `torch._C._len_torch_dispatch_stack`, if
    /// torch has them: whether a mode would see the ops the handover runs.
    mode_stacks: Option<(Py<PyAny>, Py<PyAny>)>,
    /// `torch.Tensor`: calls whose first tensor is exactly one use [`TENSOR_API`].
    tensor_type: Py<PyAny>,
    /// `torch._C`, if torch has it: where [`Torch::rows`] finds the guard a run is split
    /// under.
    c: Option<Py<PyAny>>,
    /// `torch._C._disabled_torch_function_impl` and `_disabled_torch_dispatch_impl`, if
    /// torch has them: the `__torch_function__` and `__torch_dispatch__` of subclasses
    /// whose results torch makes plain tensors (`nn.Parameter`).
    disabled: Option<(Py<PyAny>, Py<PyAny>)>,
    /// `torch.Tensor.to`: a subclass whose class has another `.to` (bitsandbytes'
    /// `Params4bit` quantizes as it moves) is moved by calling it.
    tensor_to: Py<PyAny>,
}

static TORCH_OBJS: PyOnceLock<TorchObjs> = PyOnceLock::new();

impl Torch {
    /// The exchange API of `tensor`'s class.
    ///
    /// # Errors
    /// `RuntimeError` when the class publishes none (PyTorch older than 2.10).
    pub(crate) fn of(tensor: &Bound<'_, PyAny>) -> PyResult<Torch> {
        let py = tensor.py();
        let objs = TORCH_OBJS.get_or_try_init(py, || -> PyResult<TorchObjs> {
            let torch = py.import("torch")?;
            let c = torch.getattr("_C").ok();
            Ok(TorchObjs {
                int8: torch.getattr("int8")?.unbind(),
                uint8: torch.getattr("uint8")?.unbind(),
                current_work_stream: current_work_stream_fn(&torch.getattr("Tensor")?),
                mode_stacks: c.as_ref().and_then(|c| {
                    let f = c.getattr("_len_torch_function_stack").ok()?;
                    let d = c.getattr("_len_torch_dispatch_stack").ok()?;
                    Some((f.unbind(), d.unbind()))
                }),
                disabled: c.as_ref().and_then(|c| {
                    let f = c.getattr("_disabled_torch_function_impl").ok()?;
                    let d = c.getattr("_disabled_torch_dispatch_impl").ok()?;
                    Some((f.unbind(), d.unbind()))
                }),
                c: c.map(Bound::unbind),
                tensor_to: torch.getattr("Tensor")?.getattr("to")?.unbind(),
                tensor_type: torch.getattr("Tensor")?.unbind(),
            })
        })?;
        if tensor.get_type().is(objs.tensor_type.bind(py)) {
            let shared = TENSOR_API.get_or_try_init(py, || {
                ExchangeApi::from_object(tensor.as_borrowed()).map(|a| a.map(TensorApi))
            })?;
            if let Some(TensorApi(api)) = shared {
                return Ok(Torch {
                    api: Api::Tensor(api),
                    objs,
                });
            }
        }
        match ExchangeApi::from_object(tensor.as_borrowed())? {
            Some(api) => Ok(Torch {
                api: Api::Class(api),
                objs,
            }),
            None => Err(PyRuntimeError::new_err(
                "pinlane needs PyTorch 2.10 or newer: torch.Tensor.__dlpack_c_exchange_api__ \
                 (DLPack 1.3's C exchange API) is missing",
            )),
        }
    }

    /// The exchange API this call uses.
    fn api(&self) -> &ExchangeApi {
        match &self.api {
            Api::Tensor(a) => a,
            Api::Class(a) => a,
        }
    }

    /// `t` as a pinlane host tensor over its memory, for a call that reads it only while it
    /// runs, read through the exchange API's non-owning view
    /// (`dltensor_from_py_object_no_sync`: nothing is allocated on torch's side and no
    /// deleter runs; the usual import costs ~1 us a tensor more). Only a plain case: a
    /// compact, non-empty CPU tensor under `below` bytes, of a dtype pinlane has, not
    /// bool (whose bytes pinlane would check). `None` otherwise: the caller imports it
    /// the usual way, which handles or reports the rest.
    pub(crate) fn host_view(&self, t: &Bound<'_, PyAny>, below: usize) -> Option<Tensor> {
        let (plain, _) = self.plain(t, None, below)?;
        // SAFETY: `plain.ptr` is the torch tensor's bytes (`plain_view`: a compact,
        // non-empty CPU tensor of `plain.dims` elements of `plain.dtype`), readable while
        // the tensor keeps its storage; the owner holds the tensor object (not its
        // storage, which a managed import would hold: no storage inside the owner's own
        // allocation). The calls' contract (as torch's own copies') is that nothing
        // writes, resizes or re-points (`resize_`, `set_`, `.data =`) a tensor while it is
        // moved, so its storage, and these bytes, stay for the call.
        unsafe { Tensor::from_host_ptr(plain.ptr, plain.dtype, plain.dims, t.clone().unbind()) }
            .ok()
    }

    /// `t` as a pinlane device tensor over its memory, with torch's current stream of its
    /// device, for D2H (which reads its inputs only while it runs, and returns once the
    /// copies are done), read through the exchange API's non-owning view as
    /// [`Torch::host_view`] reads host tensors. Only a plain case: a compact, non-empty
    /// CUDA tensor of device `device`, of a dtype pinlane has. `None` otherwise: the
    /// caller imports it the usual way, which handles or reports the rest.
    pub(crate) fn device_view(
        &self,
        t: &Bound<'_, PyAny>,
        device: usize,
    ) -> Option<(Tensor, usize)> {
        let (plain, stream) = self.plain(t, Some(device), usize::MAX)?;
        // SAFETY: `plain.ptr` is the torch tensor's bytes (`plain_view`: a compact,
        // non-empty tensor of `plain.dims` elements of `plain.dtype`), CUDA memory of
        // `device` that torch's exchange API exports as usable from the device's primary
        // context (as the managed import's), allocated while the tensor keeps its
        // storage; the owner holds the tensor object (not its storage). The calls'
        // contract (as torch's own copies') is that nothing resizes or re-points
        // (`resize_`, `set_`, `.data =`) a tensor while it is moved, and that nothing
        // writes it except work ordered before the copy, on torch's current stream
        // (which the copy waits for): the storage, and these bytes, stay for the call.
        unsafe {
            Tensor::from_device_ptr(
                plain.ptr as u64,
                Device::cuda(device),
                plain.dtype,
                plain.dims,
                t.clone().unbind(),
            )
        }
        .ok()
        .map(|x| (x, stream))
    }

    /// What torch's non-owning view of `t` says of it, with torch's current stream of its
    /// device, when it is a plain tensor under `below` bytes (see [`plain_view`]) on
    /// `device` (`None`: a CPU tensor; `Some(n)`: a CUDA tensor of device `n`) and a dtype
    /// pinlane has as torch names it (not one of torch's sub-byte integers, which export
    /// as 8-bit ones: see [`Torch::has_dtype`]).
    fn plain(
        &self,
        t: &Bound<'_, PyAny>,
        device: Option<usize>,
        below: usize,
    ) -> Option<(Plain, usize)> {
        let (plain, stream) = self
            .api()
            .with_tensor_view_no_sync(t.as_borrowed(), |dl, stream| {
                let on = match device {
                    None => dl.device.device_type == DLDeviceType::CPU,
                    Some(n) => {
                        dl.device.device_type == DLDeviceType::CUDA
                            && usize::try_from(dl.device.device_id).ok() == Some(n)
                    }
                };
                // A host bool is left out: pinlane would check its bytes. A device bool's
                // bytes are not read on the host.
                let bool_ok = device.is_some();
                // SAFETY: torch's view is a valid descriptor while this closure runs.
                on.then(|| unsafe { plain_view(dl, bool_ok, below) })
                    .flatten()
                    .map(|p| (p, stream as usize))
            })
            .ok()??;
        if matches!(plain.dtype, DType::U8 | DType::I8) && !self.is_8bit(t).ok()? {
            return None;
        }
        Some((plain, stream))
    }

    /// Whether `t` is of a subclass of `torch.Tensor` whose results torch's own ops give
    /// its class (and whatever the class's `__torch_function__` carries over: torchvision's
    /// `tv_tensors` keep their format and canvas size through `.to()`): every subclass but
    /// those that disable both `__torch_function__` and `__torch_dispatch__`, as
    /// `nn.Parameter` does (its `.to()` gives a plain tensor, as pinlane's outputs are; a
    /// subclass whose `__torch_dispatch__` rewraps results keeps its class through `.to()`
    /// even with `__torch_function__` disabled), and those whose class has a `.to` of its
    /// own (a `Parameter` subclass that quantizes as it moves, as bitsandbytes' do). Such
    /// a tensor is moved by its `.to(...)`, so that its output keeps its class, metadata
    /// and what the class's `.to` makes of it; pinlane's outputs are plain tensors. Only a
    /// comparison of the type for a plain `torch.Tensor`.
    pub(crate) fn keeps_subclass(&self, t: &Bound<'_, PyAny>) -> PyResult<bool> {
        let py = t.py();
        let ty = t.get_type();
        if ty.is(self.objs.tensor_type.bind(py)) {
            return Ok(false);
        }
        let Some((function, dispatch)) = &self.objs.disabled else {
            // No way to tell a disabled one: every subclass goes to torch.
            return Ok(true);
        };
        let tf = ty.getattr(pyo3::intern!(py, "__torch_function__"))?;
        if !tf.is(function.bind(py)) {
            return Ok(true);
        }
        let td = ty.getattr(pyo3::intern!(py, "__torch_dispatch__"))?;
        if !td.is(dispatch.bind(py)) {
            return Ok(true);
        }
        let to = ty.getattr(pyo3::intern!(py, "to"))?;
        Ok(!to.is(self.objs.tensor_to.bind(py)))
    }

    /// Whether a tensor that exports as an 8-bit integer is torch's `int8` or `uint8`
    /// (see [`Torch::has_dtype`]).
    fn is_8bit(&self, tensor: &Bound<'_, PyAny>) -> PyResult<bool> {
        let d = tensor.getattr(pyo3::intern!(tensor.py(), "dtype"))?;
        Ok(d.is(&self.objs.int8) || d.is(&self.objs.uint8))
    }

    /// Whether pinlane has `tensor`'s dtype, as torch names it (`dl`: its descriptor).
    /// The descriptor alone does not tell: torch exports its sub-byte integer types
    /// (`int1`..`int7`, `uint1`..`uint7`, one per byte) as 8-bit integers, so an 8-bit
    /// integer is asked its torch dtype.
    pub(crate) fn has_dtype(&self, tensor: &Bound<'_, PyAny>, dl: &Managed) -> PyResult<bool> {
        if !supported_dtype(dl) {
            return Ok(false);
        }
        let DLDataType { code, bits, .. } = header(dl).dl_tensor.dtype;
        if bits != 8 || !matches!(code, DLDataTypeCode::INT | DLDataTypeCode::UINT) {
            return Ok(true);
        }
        self.is_8bit(tensor)
    }

    /// torch's current stream on CUDA device `device`, as a raw handle: one C call through
    /// the exchange API (`torch.cuda.current_stream(device).cuda_stream` costs ~3 us from
    /// Python), or that Python expression where torch publishes no such call.
    pub(crate) fn current_stream(&self, py: Python<'_>, device: usize) -> PyResult<usize> {
        if let Some(f) = self.objs.current_work_stream {
            let id = i32::try_from(device)
                .map_err(|_| PyValueError::new_err(format!("no CUDA device {device}")))?;
            let mut out: *mut c_void = std::ptr::null_mut();
            // SAFETY: `f` is torch's `current_work_stream` from its exchange API table, which
            // lives as long as the process; it writes one pointer to `out`, a live local,
            // and is called with the GIL held (this function holds `py`).
            let rc = unsafe { f(DLDeviceType::CUDA, id, &mut out) };
            if rc == 0 {
                return Ok(out as usize);
            }
            // A failure sets a Python exception: take it, and ask torch the slow way.
            let _ = PyErr::take(py);
        }
        py.import("torch")?
            .getattr("cuda")?
            .call_method1("current_stream", (device,))?
            .getattr("cuda_stream")?
            .extract()
    }

    /// `tensor`'s descriptor (taking a reference to its storage), and torch's current
    /// stream on the tensor's device (null for host tensors).
    pub(crate) fn import(&self, tensor: &Bound<'_, PyAny>) -> PyResult<(Managed, *mut c_void)> {
        Ok(self
            .api()
            .import_managed_no_sync(tensor.as_borrowed())?
            .into_parts())
    }

    /// Torch tensors over `ts`' memory (no copy), in order, each keeping its memory
    /// alive until torch frees it. Host tensors come out as CPU tensors (page-locked
    /// memory stays page-locked: `is_pinned()` is true); all come out writable, as torch
    /// has no read-only tensors.
    ///
    /// A run of at least `min_run` ([`MIN_RUN`] by default) tensors of one dtype and shape, views into one
    /// allocation at a constant stride (an H2D batch's 1000 small tensors, a D2H batch's
    /// images), is handed over as one strided tensor and split with `unbind(0)`: one
    /// DLPack import for the run instead of one per tensor, which is most of what a
    /// small tensor costs. Runs are found from the tensors' allocations and byte offsets,
    /// and only the run's first tensor is exported: its tensor keeps the whole allocation
    /// alive (a descriptor per member, made and dropped again, cost 0.2 to 0.3 us a
    /// tensor). Each output is then a row of the run's tensor, over its storage (not a
    /// view of it where torch has the guard [`Torch::rows`] uses), which keeps every
    /// tensor of the run alive.
    pub(crate) fn export_all<'py>(
        &self,
        py: Python<'py>,
        ts: &[Tensor],
        min_run: usize,
    ) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let out = self.export_with(py, ts, min_run, false)?;
        out.ok_or_else(|| PyRuntimeError::new_err("pinlane: outputs left unexported"))
    }

    /// [`Torch::export_all`] of the outputs of a call whose copies may still be running:
    /// from inside the `while_copying` of `transfer_tensor_d2h_overlapping` or
    /// `transfer_tensor_h2d_overlapping`. `None`
    /// (nothing handed over) where a run would be split while a torch function or
    /// dispatch mode is active on the thread: the mode would see the split's outputs, and
    /// could read their bytes, before the copies are done; the caller then exports them
    /// after the call, with [`Torch::export_all`].
    ///
    /// # Safety
    /// [`Tensor::to_dlpack_in_flight`]'s, for every tensor: no one reads or writes the
    /// returned tensors' bytes before that call returns `Ok` (the binding hands them to no
    /// one before), and if it fails, they are dropped unread.
    pub(crate) unsafe fn export_all_in_flight<'py>(
        &self,
        py: Python<'py>,
        ts: &[Tensor],
        min_run: usize,
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        self.export_with(py, ts, min_run, true)
    }

    /// Whether a torch function mode is active on the thread (true when torch does not
    /// say).
    fn function_modes_active(&self, py: Python<'_>) -> PyResult<bool> {
        let Some((function, _)) = &self.objs.mode_stacks else {
            return Ok(true);
        };
        Ok(function.bind(py).call0()?.extract::<usize>()? > 0)
    }

    /// Whether a torch function or dispatch mode is active on the thread (true when torch
    /// does not say).
    fn modes_active(&self, py: Python<'_>) -> PyResult<bool> {
        let Some((_, dispatch)) = &self.objs.mode_stacks else {
            return Ok(true);
        };
        Ok(self.function_modes_active(py)? || dispatch.bind(py).call0()?.extract::<usize>()? > 0)
    }

    /// `base`'s rows, `base.unbind(0)`, run under torch's
    /// `_AutoDispatchBelowADInplaceOrView` guard where torch has it (as a `with` block
    /// would: entered, and left whatever the split gave; looked up in `torch._C` per run, a
    /// dictionary lookup, so that benches/probes/split_guard_ab.py can time both ways in
    /// one process by removing the name). Below that guard the split skips autograd's view
    /// tracking: the rows are plain tensors over the run's storage, not views of `base`
    /// (`_is_view()` false, each with its own version counter, as `t.cpu()`'s outputs), and
    /// each costs about 0.17 us less to make and 0.03 us less to drop
    /// (benches/probes/unbind_ways.py: 1000 rows in 383 to 393 us against 551 to 601).
    /// Nothing is lost by the separate version counters: `base` is this call's own, held by
    /// no one else, and its rows never overlap (pinlane's tensors are compact, and
    /// [`run_at`] takes a stride of at least a tensor's bytes). The rows are written in place
    /// and made to require grad as any tensor.
    ///
    /// Not while a torch function mode is active (or torch does not say): its
    /// `__torch_function__` runs above the dispatcher, so under the guard the ops it runs
    /// would skip autograd. The rows are then views, as before. (Code the interpreter runs
    /// inside the split by itself, a garbage collection's finalizers, runs under the guard
    /// as it does in torch's own Python uses of it: docs/semantics.md.)
    fn rows<'py>(&self, base: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyAny>> {
        let py = base.py();
        let unbind = || base.call_method1(pyo3::intern!(py, "unbind"), (0,));
        let Some(c) = &self.objs.c else {
            return unbind();
        };
        let Some(guard) = c
            .bind(py)
            .getattr_opt(pyo3::intern!(py, "_AutoDispatchBelowADInplaceOrView"))?
        else {
            return unbind();
        };
        if self.function_modes_active(py)? {
            return unbind();
        }
        let guard = guard.call0()?;
        guard.call_method0(pyo3::intern!(py, "__enter__"))?;
        let rows = unbind();
        let left = guard.call_method1(
            pyo3::intern!(py, "__exit__"),
            (py.None(), py.None(), py.None()),
        );
        let rows = rows?;
        left?;
        Ok(rows)
    }

    /// [`Torch::export_all`]; `in_flight`: see [`Torch::export_all_in_flight`], whose
    /// obligations a caller passing true has.
    fn export_with<'py>(
        &self,
        py: Python<'py>,
        ts: &[Tensor],
        min_run: usize,
        in_flight: bool,
    ) -> PyResult<Option<Vec<Bound<'py, PyAny>>>> {
        let to_dlpack = |t: &Tensor| {
            if in_flight {
                // SAFETY: `in_flight` is passed true only by `export_all_in_flight`, whose
                // caller has `to_dlpack_in_flight`'s obligations for these tensors.
                unsafe { t.to_dlpack_in_flight() }
            } else {
                t.to_dlpack()
            }
            .map(handover)
            .map_err(to_py)
        };
        let mut out = Vec::with_capacity(ts.len());
        let mut checked = !in_flight;
        let mut i = 0;
        while i < ts.len() {
            let (len, stride) = run_at(ts, i);
            if len >= min_run && !checked {
                if self.modes_active(py)? {
                    return Ok(None);
                }
                checked = true;
            }
            let first = to_dlpack(&ts[i])?;
            if len >= min_run {
                let base = self
                    .api()
                    .managed_tensor_to_py_object_no_sync(strided(first, len, stride)?, py)?;
                crate::split::mark("run in torch");
                for v in self.rows(&base)?.try_iter()? {
                    out.push(v?);
                }
                crate::split::mark("run split");
                i += len;
            } else {
                out.push(self.api().managed_tensor_to_py_object_no_sync(first, py)?);
                i += 1;
            }
        }
        if out.len() != ts.len() {
            return Err(PyRuntimeError::new_err(format!(
                "handed {} tensors to torch for {} outputs",
                out.len(),
                ts.len()
            )));
        }
        Ok(Some(out))
    }
}

/// The `current_work_stream` of `cls`'s DLPack exchange API (the first table of DLPack's
/// major version 1 in its chain), if it has one. Read here rather than through dlpark,
/// whose `ExchangeApi::current_work_stream` is crate-private; the chain walk is the one
/// dlpark's `compatible_api` makes.
fn current_work_stream_fn(cls: &Bound<'_, PyAny>) -> dlpark::ffi::DLPackCurrentWorkStream {
    use dlpark::ffi::{DLPackExchangeAPI, DLPackExchangeAPIHeader, DLPACK_MAJOR_VERSION};
    let capsule = cls.getattr("__dlpack_c_exchange_api__").ok()?;
    // SAFETY: `capsule` is a live object for this call (held by `capsule`), and
    // PyCapsule_GetPointer checks that it is a capsule of this name (anything else gives
    // null, with an exception set, which is cleared below). The pointer outlives the
    // capsule: the table it names is static in torch, alive as long as the process (the
    // exchange API's contract), so it may be read after `capsule` drops and cached.
    let mut header = unsafe {
        pyo3::ffi::PyCapsule_GetPointer(capsule.as_ptr(), c"dlpack_exchange_api".as_ptr())
    }
    .cast::<DLPackExchangeAPIHeader>();
    if header.is_null() {
        let _ = PyErr::take(cls.py());
        return None;
    }
    for _ in 0..16 {
        // SAFETY: a non-null header of the table torch publishes for the life of the
        // process, or of an older table its chain links to (DLPack's contract).
        let h = unsafe { header.as_ref() }?;
        if h.version.major == DLPACK_MAJOR_VERSION {
            // SAFETY: a header of major version 1 begins a whole `DLPackExchangeAPI` (the
            // exchange API's layout is fixed within a major version: minor versions may
            // only append, and `current_work_stream` is part of the 1.x table), alive for
            // the process as above.
            return unsafe { (*header.cast::<DLPackExchangeAPI>()).current_work_stream };
        }
        header = h.prev_api;
    }
    None
}

/// Runs of this many tensors or more are handed to torch as one tensor.
pub(crate) const MIN_RUN: usize = 16;

/// A pinlane tensor's descriptor, just made, as handed to torch: page-locked memory is CPU
/// memory to torch (which does not take kDLCUDAHost), and the tensor is writable.
fn handover(dl: Managed) -> Managed {
    // SAFETY: `dl` was just made and is owned here alone: no one else reads its
    // descriptor. The tensor handed over is the only user of its bytes (pinlane keeps a
    // reference only to keep memory alive, never to read it; views of one block never
    // overlap), so dropping READ_ONLY lets no write reach anything else. The data pointer
    // carries the right to write: page-locked blocks are raw driver allocations, and
    // pinlane's own pageable memory (a D2H output region, a copy such as the checkpoint
    // loader's without a GPU) is exported through the pointer taken from its buffer with
    // `as_mut_ptr` (pinlane's `Words`), not one derived from a shared `&[u8]`.
    unsafe {
        let m = dl.as_ptr();
        if (*m).dl_tensor.device.device_type == DLDeviceType::CUDAHOST {
            (*m).dl_tensor.device.device_type = DLDeviceType::CPU;
            (*m).dl_tensor.device.device_id = 0;
        }
        (*m).flags.remove(DlpackFlags::READ_ONLY);
    }
    dl
}

/// How many tensors from `i` on form a run (same dtype and shape, one allocation, a
/// constant byte stride no smaller than a tensor), and that stride. Read from the
/// tensors themselves (`byte_offset`), with no descriptor made per tensor.
fn run_at(ts: &[Tensor], i: usize) -> (usize, usize) {
    let first = &ts[i];
    let Some(second) = ts.get(i + 1) else {
        return (1, 0);
    };
    if first.nbytes() == 0 || !second.same_allocation(first) {
        return (1, 0);
    }
    let stride = match second.byte_offset().checked_sub(first.byte_offset()) {
        Some(s) if s >= first.nbytes() && s % first.dtype().size() == 0 => s,
        _ => return (1, 0),
    };
    let mut len = 1;
    while let Some(t) = ts.get(i + len) {
        let prev = &ts[i + len - 1];
        let ok = t.dtype() == first.dtype()
            && t.dims() == first.dims()
            && t.same_allocation(prev)
            && t.byte_offset().checked_sub(prev.byte_offset()) == Some(stride);
        if !ok {
            break;
        }
        len += 1;
    }
    (len, stride)
}

/// One descriptor over a run of `len` tensors that starts with `first`'s: shape
/// `[len, dims...]`, `first`'s data, dtype and device, row stride `stride` bytes. Its
/// context is `first`'s descriptor, whose tensor keeps their shared allocation alive
/// whole (every member's memory with it) until torch lets the tensor go.
fn strided(first: Managed, len: usize, stride: usize) -> PyResult<Managed> {
    let head = &header(&first).dl_tensor;
    let ndim = usize::try_from(head.ndim).unwrap_or(0);
    // SAFETY: a valid descriptor's `shape` and `strides` point to `ndim` values each,
    // alive as long as the descriptor (pinlane's exports always carry strides).
    let (dims, inner) = unsafe {
        if ndim == 0 {
            (&[][..], &[][..])
        } else {
            (
                std::slice::from_raw_parts(head.shape, ndim),
                std::slice::from_raw_parts(head.strides, ndim),
            )
        }
    };
    let elem = usize::from(head.dtype.bits) / 8;
    let as_i64 = |n: usize| i64::try_from(n).map_err(|_| PyValueError::new_err("run too large"));
    let mut shape = vec![as_i64(len)?];
    shape.extend_from_slice(dims);
    let mut strides = vec![as_i64(stride / elem)?];
    strides.extend_from_slice(inner);
    let (data, device, dtype) = (head.data, head.device, head.dtype);
    fn bad(e: impl std::fmt::Display) -> PyErr {
        PyValueError::new_err(e.to_string())
    }
    let mut init = Dynamic::new(shape, strides)
        .initialize(Box::new(first))
        .map_err(bad)?;
    init.set_data(data)
        .set_device(device)
        .set_dtype(dtype)
        .set_byte_offset(0);
    // SAFETY: the descriptor is complete: `data` is the first member's bytes, and row r
    // is member r's (one allocation, constant stride from the first: `run_at` checked
    // both through `byte_offset`), all kept alive by the context (the first member's
    // descriptor holds a clone of its tensor, which holds the whole allocation) until the
    // deleter runs; shape and strides live in the same allocation.
    Ok(unsafe { init.finish() })
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

/// Where a tensor lives, as torch's `t.device` names it (`(type, index)`): for a tensor
/// that is not exported.
pub(crate) fn kind_of_device((ty, index): &(String, Option<usize>)) -> Kind {
    match (ty.as_str(), index) {
        ("cpu", _) => Kind::Host,
        ("cuda", Some(n)) => Kind::Cuda(*n),
        _ => Kind::Other,
    }
}

/// Whether pinlane has the descriptor's dtype: bool, (u)int 8 to 64, float 16/32/64,
/// bfloat16 (see [`Torch::has_dtype`] for what the descriptor does not say).
fn supported_dtype(dl: &Managed) -> bool {
    dtype(dl).is_some()
}

/// The descriptor's dtype as pinlane names it (`None`: one pinlane lacks). An 8-bit
/// integer may be one of torch's sub-byte ones: [`Torch::has_dtype`] tells.
pub(crate) fn dtype(dl: &Managed) -> Option<DType> {
    DType::from_dlpack(header(dl).dl_tensor.dtype)
}

/// The tensor's size in bytes (0 when it does not fit `usize`: pinlane's import reports
/// that).
pub(crate) fn nbytes(dl: &Managed) -> usize {
    // SAFETY: a `Managed` holds a valid descriptor until it drops.
    unsafe { view_nbytes(&header(dl).dl_tensor) }
}

/// [`nbytes`] of a descriptor.
///
/// # Safety
/// `t` is a valid descriptor: `shape` points to `ndim` values (or is null for 0-d).
unsafe fn view_nbytes(t: &DLTensor) -> usize {
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    let elem = usize::from(t.dtype.bits).div_ceil(8);
    if ndim == 0 || t.shape.is_null() {
        return elem;
    }
    // SAFETY: a valid descriptor's `shape` points to `ndim` values (the caller's
    // promise).
    let shape = unsafe { std::slice::from_raw_parts(t.shape, ndim) };
    shape
        .iter()
        .try_fold(elem, |acc, &d| acc.checked_mul(usize::try_from(d).ok()?))
        .unwrap_or(0)
}

/// The address of the tensor's first byte (its data pointer and byte offset; `None` if
/// that overflows).
pub(crate) fn address(dl: &Managed) -> Option<usize> {
    let t = &header(dl).dl_tensor;
    usize::try_from(t.byte_offset)
        .ok()
        .and_then(|o| (t.data as usize).checked_add(o))
}

/// Whether the tensor is laid out compact and row-major (what pinlane tensors are).
/// Dimensions of size 1 may have any stride; a tensor with no elements is compact.
pub(crate) fn is_compact(dl: &Managed) -> bool {
    // SAFETY: a `Managed` holds a valid descriptor until it drops.
    unsafe { view_is_compact(&header(dl).dl_tensor) }
}

/// [`is_compact`] of a descriptor.
///
/// # Safety
/// `t` is a valid descriptor: `shape` and `strides` (when not null) point to `ndim`
/// values each.
unsafe fn view_is_compact(t: &DLTensor) -> bool {
    let ndim = usize::try_from(t.ndim).unwrap_or(0);
    if ndim == 0 || t.strides.is_null() {
        return true;
    }
    // SAFETY: a valid descriptor's `shape` and `strides` point to `ndim` values each
    // (the caller's promise).
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

/// What [`Torch::host_view`] and [`Torch::device_view`] read of a plain tensor's view.
struct Plain {
    ptr: *const u8,
    dtype: DType,
    dims: Shape,
}

/// The view `t` (on a device its caller checked) as a [`Plain`] tensor under `below`
/// bytes, or `None`. `bool_ok`: whether a bool tensor qualifies (a host one does not:
/// pinlane would check its bytes; device bytes are not read on the host).
///
/// # Safety
/// `t` is a valid descriptor (its `shape` and `strides` readable).
unsafe fn plain_view(t: &DLTensor, bool_ok: bool, below: usize) -> Option<Plain> {
    let dtype = DType::from_dlpack(t.dtype).filter(|&d| bool_ok || d != DType::Bool)?;
    // SAFETY: the caller's promise.
    let (len, compact) = unsafe { (view_nbytes(t), view_is_compact(t)) };
    let ptr = (t.data as usize).checked_add(usize::try_from(t.byte_offset).ok()?)?;
    if !compact || len == 0 || len >= below || t.data.is_null() || ptr % dtype.size() != 0 {
        return None;
    }
    let ndim = usize::try_from(t.ndim).ok()?;
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: the caller's promise (`view_nbytes` read the same values).
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    let dims = if ndim <= Shape::INLINE {
        // Held inline by the shape: no list allocated (and freed) per tensor.
        let mut inline = [0; Shape::INLINE];
        for (to, &d) in inline.iter_mut().zip(shape) {
            *to = usize::try_from(d).ok()?;
        }
        Shape::from(&inline[..ndim])
    } else {
        let dims: Vec<usize> = shape
            .iter()
            .map(|&d| usize::try_from(d).ok())
            .collect::<Option<_>>()?;
        Shape::from(dims)
    };
    Some(Plain {
        ptr: ptr as *const u8,
        dtype,
        dims,
    })
}

/// Marks a host descriptor `dl` of at least `min_bytes` as page-locked when the driver says
/// all of it is ([`pinlane::memory::host_page_locked`], asked in `device`'s context: what
/// torch's `is_pinned()` asks, without its ~1.2 to 1.5 us a tensor), so that pinlane reads
/// it in place (the device, in the call or after it returns). Smaller ones, and memory the
/// driver cannot answer for, stay unmarked (staged).
pub(crate) fn mark_if_page_locked(dl: &mut Managed, min_bytes: usize, device: Device) {
    let n = nbytes(dl);
    if n < min_bytes.max(1) {
        return; // staged: the driver is not asked
    }
    let Some(ptr) = address(dl) else {
        return;
    };
    if pinlane::memory::host_page_locked(ptr as *const u8, n, device).unwrap_or(false) {
        // SAFETY: the driver says all of the memory is page-locked now. Page-locked by
        // torch's allocator, it stays so while `dl` holds the tensor's storage; by a
        // registration of pinlane's, the import holds it when it lies inside it, and is
        // taken as pageable otherwise (one being made or ended, or covering it in part:
        // `pinned::registered`); by the program's own `cudaHostRegister`, keeping it
        // registered while pinlane may read it is the program's part (the package's
        // README says so).
        unsafe { mark_page_locked(dl) };
    }
}

/// Marks a host tensor's descriptor as page-locked, so pinlane copies it directly.
///
/// # Safety
/// The memory is page-locked and registered with CUDA, and stays so while pinlane may read
/// it (the driver said so just now: [`mark_if_page_locked`], whose comment says why it
/// stays).
unsafe fn mark_page_locked(dl: &mut Managed) {
    // SAFETY: `dl` is owned here alone (exclusive borrow); torch's deleter does not read
    // the device field. That the memory is page-locked is the caller's promise.
    unsafe { (*dl.as_ptr()).dl_tensor.device.device_type = DLDeviceType::CUDAHOST };
}

/// A pinlane tensor over an imported descriptor of a torch tensor the call is moving.
pub(crate) fn to_pinlane(dl: Managed) -> PyResult<Tensor> {
    // SAFETY: torch's memory is writable. A transfer's inputs live for the call only (the
    // calls drop them before returning), and pinlane only reads them; the calls'
    // contract, as torch's own copies', is that the caller's code does not write a tensor
    // while it is being moved (device tensors: work that writes them is ordered before
    // the copy, on the current stream or the producer event). `Buffers` keeps its
    // destinations across calls and pinlane writes them (copy_into's documented
    // contract: nothing else touches them while a copy runs); pinlane never reads them,
    // so torch's writes between calls break no assumption of pinlane's. `Pairs` keeps its
    // sources across calls too, and the caller writes them between calls: pinlane reads
    // a source only inside `copy()` (the host fill, which ends in the call) or, for a
    // page-locked one of 64 KiB or more (any source, with `in_place`), by the
    // device after it (its documented contract:
    // not written until the stream has passed the copies), and keeps nothing read from
    // one between calls (no cache of bytes or checksums), so those writes break no
    // assumption either. Either kept tensor must not be resized (`resize_`,
    // `untyped_storage().resize_`): torch would free the memory this descriptor points
    // at (documented as forbidden on `Buffers` and `Pairs`, as for a CUDA graph's
    // static inputs).
    unsafe { Tensor::from_dlpack_writable(dl) }.map_err(to_py)
}
