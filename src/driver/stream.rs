//! [`Stream`]: a CUDA stream of one device, owned (destroyed when the last clone drops)
//! or borrowed (the device's legacy default stream, or a stream another library made:
//! never destroyed by pinlane).

use super::{bind, check, Handle};
use crate::device::Device;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::Arc;

/// A raw CUDA stream handle (`CUstream`), as the driver API and other libraries
/// (cudarc's `CudaStream::cu_stream`, PyTorch's `torch.cuda.Stream.cuda_stream`) give it.
pub type RawStream = sys::CUstream;

/// A CUDA stream on one device. Cheap to clone (an `Arc` inside); the stream is destroyed
/// when the last clone drops, after the work queued on it has finished (the driver defers
/// the destruction).
///
/// ```no_run
/// # fn main() -> pinlane::Result<()> {
/// let s = pinlane::Stream::new(pinlane::Device::cuda(0))?; // a non-blocking stream
/// s.synchronize()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Stream {
    inner: Arc<StreamInner>,
}

struct StreamInner {
    raw: Handle<sys::CUstream>,
    device: usize,
    owned: bool,
}

impl Stream {
    /// Creates a non-blocking stream on `device` (no implicit synchronisation with the
    /// legacy default stream).
    ///
    /// # Errors
    /// [`Error::NoCuda`], [`Error::DeviceUnavailable`], or the driver's error.
    pub fn new(device: Device) -> Result<Stream> {
        super::require("Stream::new")?;
        let device = device.ordinal();
        let _ctx = bind(device)?;
        let mut raw: sys::CUstream = std::ptr::null_mut();
        let flags = sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32;
        // SAFETY: out-pointer to a live local; the device's context is current.
        unsafe {
            check(
                "cuStreamCreate",
                super::api::cuStreamCreate(&mut raw, flags),
            )
        }?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                raw: Handle(raw),
                device,
                owned: true,
            }),
        })
    }

    /// The legacy default stream (`CU_STREAM_LEGACY`) of `device`'s primary context: the
    /// stream PyTorch and the CUDA runtime use unless told otherwise, and pinlane's default
    /// consumer stream.
    ///
    /// # Errors
    /// [`Error::NoCuda`] or [`Error::DeviceUnavailable`].
    pub fn legacy(device: Device) -> Result<Stream> {
        super::require("Stream::legacy")?;
        let device = device.ordinal();
        super::check_device(device)?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                raw: Handle(legacy_handle()),
                device,
                owned: false,
            }),
        })
    }

    /// A stream that another library made (cudarc, PyTorch, TensorRT, ...), for use as a
    /// current, consumer or copy stream. pinlane never destroys it: its owner does, after
    /// every `Stream` made from it (and everything pinlane queued on it) is done with it.
    /// The null handle and `CU_STREAM_LEGACY` name the legacy default stream.
    ///
    /// ```no_run
    /// # fn main() -> pinlane::Result<()> {
    /// # let theirs: pinlane::Stream = pinlane::Stream::new(pinlane::Device::cuda(0))?;
    /// // `raw` comes from another library, e.g. cudarc's `CudaStream::cu_stream()`.
    /// let raw = theirs.as_raw();
    /// // SAFETY: `raw` is a live stream of cuda:0's primary context and outlives `s`.
    /// let s = unsafe { pinlane::Stream::from_raw(raw, pinlane::Device::cuda(0)) }?;
    /// let _current = pinlane::set_current_stream(&s); // d2h now waits for its work
    /// # Ok(()) }
    /// ```
    ///
    /// # Safety
    /// 1. `raw` is a stream of `device`'s **primary context** (the context the CUDA runtime,
    ///    PyTorch and cudarc use), or null / `CU_STREAM_LEGACY`.
    /// 2. It stays alive (not destroyed) until the returned `Stream`, every clone of it,
    ///    and every pinlane object that holds one (output tensors whose consumer stream it
    ///    is, the cache ring, device memory lent on it with `device_ptr(&s)` or
    ///    `to_dlpack_on(&s)`, which keeps it until that memory is released) are dropped, and
    ///    the work pinlane queued on it has run. Two live `Stream`s of one handle are taken
    ///    as one stream, so a handle destroyed too early and reused for a new stream would
    ///    merge the two.
    ///
    /// # Errors
    /// [`Error::NoCuda`], [`Error::DeviceUnavailable`]; [`Error::ForeignStream`] when
    /// the driver reports that `raw` belongs to another context; [`Error::InvalidOption`]
    /// for `CU_STREAM_PER_THREAD` (0x2), which names a different stream on every thread
    /// that uses it, where a `Stream` is one stream wherever it is used (pinlane keys the
    /// uses it waits for, and the memory it keeps, by the stream).
    pub unsafe fn from_raw(raw: RawStream, device: Device) -> Result<Stream> {
        if raw as usize == PER_THREAD {
            return Err(Error::InvalidOption {
                name: "stream",
                reason: "CU_STREAM_PER_THREAD (0x2) names another stream on each thread; \
                         pass a stream's own handle (a torch.cuda.Stream's, a cudarc \
                         stream's), or null for the legacy default stream"
                    .into(),
            });
        }
        super::require("Stream::from_raw")?;
        let ordinal = device.ordinal();
        let ctx = bind(ordinal)?;
        let raw = if raw.is_null() { legacy_handle() } else { raw };
        // The legacy stream's sentinel belongs to whichever context is current, not to one
        // context: only a real handle is asked for its context.
        if raw != legacy_handle() {
            // SAFETY: obligation 1: a live stream handle; the device's context is current.
            let owner = unsafe { super::stream_context(&ctx, raw) }?;
            if owner != super::context::handles(ordinal)?.ctx.0 {
                return Err(Error::ForeignStream {
                    device: crate::device::Device::cuda(ordinal),
                });
            }
        }
        Ok(Stream {
            inner: Arc::new(StreamInner {
                raw: Handle(raw),
                device: ordinal,
                owned: false,
            }),
        })
    }

    /// The raw handle, for other libraries (valid while any clone of this `Stream` lives,
    /// for a stream pinlane created).
    ///
    /// ```no_run
    /// let s = pinlane::Stream::new(pinlane::Device::cuda(0)).unwrap();
    /// assert!(!s.as_raw().is_null());
    /// ```
    pub fn as_raw(&self) -> RawStream {
        self.inner.raw.0
    }

    /// The device this stream belongs to.
    pub fn device(&self) -> Device {
        Device::cuda(self.inner.device)
    }

    /// The device's ordinal.
    pub(crate) fn index(&self) -> usize {
        self.inner.device
    }

    /// Whether this is the legacy default stream.
    pub fn is_legacy(&self) -> bool {
        self.inner.raw.0 == legacy_handle()
    }

    /// Whether pinlane destroys this stream when the last clone drops (it made it).
    pub fn is_owned(&self) -> bool {
        self.inner.owned
    }

    /// Blocks until all work queued on the stream has finished: the driver's own wait,
    /// with no bound (a kernel that never ends, or work waiting on an event nobody
    /// records, keeps it waiting; pinlane's own waits use `Config::sync_wait` instead).
    ///
    /// # Errors
    /// The driver's error: a failure of any work queued on the stream (the stream's copies
    /// are then not proven complete).
    pub fn synchronize(&self) -> Result<()> {
        super::fault_point(super::FaultKindTag::StreamSync, "cuStreamSynchronize")?;
        let _ctx = bind(self.inner.device)?;
        // SAFETY: the stream is alive (we hold it) and its context is current.
        unsafe {
            check(
                "cuStreamSynchronize",
                super::api::cuStreamSynchronize(self.raw()),
            )
        }
    }

    /// Refuses a stream a CUDA graph capture is running on (or was, and failed): work
    /// pinlane queued on it would be recorded into the caller's graph instead of run, and
    /// pinlane's bookkeeping (the events it waits on, the memory it keeps until they
    /// pass) would wait on events that never pass. The legacy stream is never captured
    /// (capture refuses it), so it is not asked: no driver call on that path.
    ///
    /// # Errors
    /// [`Error::StreamCapturing`]; the driver's error from `cuStreamIsCapturing`.
    pub(crate) fn refuse_capturing(&self, call: &'static str) -> Result<()> {
        if self.is_legacy() {
            return Ok(());
        }
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: the stream is alive (we hold it; a borrowed one under `from_raw`'s
        // contract) and `status` is a live out-pointer. The query needs no current context.
        unsafe {
            check(
                "cuStreamIsCapturing",
                super::api::cuStreamIsCapturing(self.raw(), &mut status),
            )
        }?;
        match status {
            sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE => Ok(()),
            _ => Err(Error::StreamCapturing {
                call,
                device: Device::cuda(self.inner.device),
            }),
        }
    }

    /// Whether two handles name the same stream.
    pub fn same_as(&self, other: &Stream) -> bool {
        self.inner.raw == other.inner.raw && self.inner.device == other.inner.device
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.inner.raw.0
    }

    /// The stream as a map key: its device and its handle's address (unique among the
    /// streams alive on that device).
    pub(crate) fn key(&self) -> (usize, usize) {
        (self.inner.device, self.inner.raw.0 as usize)
    }

    /// Whether every piece of work queued on the stream so far finishes within `limit`:
    /// an event recorded now is polled (sleeping between queries, never blocking in the
    /// driver). `false` on any error, or when the time runs out.
    pub(crate) fn idle_within(&self, limit: std::time::Duration) -> bool {
        self.done_within(limit) == Ok(true)
    }

    /// [`Stream::idle_within`], with the driver's errors: whether the work queued so far
    /// finishes within `limit`.
    ///
    /// # Errors
    /// The driver's error for making, recording or querying the event.
    pub(crate) fn done_within(&self, limit: std::time::Duration) -> Result<bool> {
        let ev = super::Event::new(self.device())?;
        ev.record(self)?;
        ev.done_within(limit)
    }

    /// Queues a call of `f` (on a driver thread) after the work queued so far: the
    /// wake-up of pinlane's completion thread. `f` must not call CUDA. The driver skips it
    /// after an error on the stream, so callers keep a fallback. The driver may run the
    /// host functions of all streams one at a time, so work queued on this stream after
    /// `f` may wait for other programs' host functions: queue it only on a stream whose
    /// later work does not matter (pinlane's wake streams, `engine::completion`).
    ///
    /// # Errors
    /// The driver's error from `cuLaunchHostFunc`.
    pub(crate) fn call_after(&self, f: fn()) -> Result<()> {
        unsafe extern "C" fn trampoline(user: *mut std::ffi::c_void) {
            // SAFETY: `user` is the `fn()` passed below, cast to a data pointer and back
            // (function and data pointers have one size on every platform CUDA runs on).
            let f: fn() = unsafe { std::mem::transmute::<*mut std::ffi::c_void, fn()>(user) };
            f();
        }
        let _ctx = bind(self.inner.device)?;
        let user = f as *mut std::ffi::c_void;
        // SAFETY: `trampoline` matches CUhostFn and calls `f` through `user`, which needs
        // nothing kept alive (a function); the stream is alive and its context current.
        let res = unsafe { super::api::cuLaunchHostFunc(self.raw(), Some(trampoline), user) };
        check("cuLaunchHostFunc", res)
    }

    /// Queues a host-side pause of `delay` on the stream: work queued after it starts only
    /// once it has passed. For tests that need a producer still running.
    ///
    /// # Errors
    /// The driver's error from `cuLaunchHostFunc`.
    #[cfg(feature = "test-util")]
    pub fn delay_async(&self, delay: std::time::Duration) -> Result<()> {
        unsafe extern "C" fn sleep_fn(user: *mut std::ffi::c_void) {
            // SAFETY: `user` is the Box<Duration> leaked below, handed over exactly once.
            let d = unsafe { Box::from_raw(user.cast::<std::time::Duration>()) };
            std::thread::sleep(*d);
        }
        let _ctx = bind(self.inner.device)?;
        let user = Box::into_raw(Box::new(delay)).cast();
        // SAFETY: sleep_fn matches CUhostFn and takes ownership of `user`; the stream is
        // alive and its context current.
        let res = unsafe { super::api::cuLaunchHostFunc(self.raw(), Some(sleep_fn), user) };
        if let Err(e) = check("cuLaunchHostFunc", res) {
            // SAFETY: the launch failed, so sleep_fn will never run and free `user`.
            drop(unsafe { Box::from_raw(user.cast::<std::time::Duration>()) });
            return Err(e);
        }
        Ok(())
    }
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("device", &self.inner.device)
            .field("legacy", &self.is_legacy())
            .field("raw", &self.inner.raw.0)
            .finish()
    }
}

/// `CU_STREAM_PER_THREAD`, the driver's sentinel for the calling thread's default stream.
const PER_THREAD: usize = 2;

fn legacy_handle() -> sys::CUstream {
    // CU_STREAM_LEGACY is the documented sentinel value 0x1.
    1usize as sys::CUstream
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let res = bind(self.device).and_then(|_ctx| {
            // SAFETY: we created this stream and this is the last owner; the driver
            // finishes queued work before releasing it.
            unsafe {
                check(
                    "cuStreamDestroy",
                    super::api::cuStreamDestroy_v2(self.raw.0),
                )
            }
        });
        if let Err(e) = res {
            super::deferred::record(self.device, e);
        }
    }
}
