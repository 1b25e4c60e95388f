//! [`Stream`]: a CUDA stream of one device, owned (destroyed when the last clone drops)
//! or the device's legacy default stream (never destroyed).

use super::{bind, check, Handle};
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::Arc;

/// A CUDA stream on one device. Cheap to clone (an `Arc` inside); the stream is destroyed
/// when the last clone drops, after the work queued on it has finished (the driver defers
/// the destruction).
///
/// ```no_run
/// # fn main() -> pinlane::Result<()> {
/// let s = pinlane::Stream::new(0)?; // a non-blocking stream on cuda:0
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
    pub fn new(device: usize) -> Result<Stream> {
        super::require("Stream::new")?;
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
    pub fn legacy(device: usize) -> Result<Stream> {
        super::require("Stream::legacy")?;
        super::check_device(device)?;
        Ok(Stream {
            inner: Arc::new(StreamInner {
                raw: Handle(legacy_handle()),
                device,
                owned: false,
            }),
        })
    }

    /// The device index this stream belongs to.
    pub fn device(&self) -> usize {
        self.inner.device
    }

    /// Whether this is the legacy default stream.
    pub fn is_legacy(&self) -> bool {
        !self.inner.owned
    }

    /// Blocks until all work queued on the stream has finished.
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

    /// Whether two handles name the same stream.
    pub fn same_as(&self, other: &Stream) -> bool {
        self.inner.raw == other.inner.raw && self.inner.device == other.inner.device
    }

    pub(crate) fn raw(&self) -> sys::CUstream {
        self.inner.raw.0
    }

    /// Queues a host-side pause of `delay` on the stream: work queued after it starts only
    /// once it has passed. For tests that need a producer still running.
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
            super::deferred::record(e);
        }
    }
}
