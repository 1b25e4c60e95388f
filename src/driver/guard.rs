//! [`ContextGuard`]: a device's primary context kept current on this thread while the
//! guard lives (made by [`bind`](super::bind)); what every driver call of pinlane runs
//! under.

use super::check;
use crate::error::Result;
use cudarc::driver::sys;

/// Keeps a device's context current; pops it on drop if it pushed it.
///
/// Not `Send`: the context stack is per thread.
pub(crate) struct ContextGuard {
    pushed: bool,
    /// The device whose context this guard keeps current: calls that take a guard and a
    /// device index check they agree ([`ContextGuard::check`]).
    device: usize,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl ContextGuard {
    /// A guard for `device`'s context, just made current on this thread by the caller
    /// (`pushed`: pushed by it, so popped on drop) or found current already.
    pub(super) fn new(device: usize, pushed: bool) -> ContextGuard {
        ContextGuard {
            pushed,
            device,
            _not_send: std::marker::PhantomData,
        }
    }

    /// The device whose context is current.
    pub(crate) fn device(&self) -> usize {
        self.device
    }

    /// `Ok` if this guard is for `device`; a typed error otherwise (a call would run in
    /// another device's context).
    pub(crate) fn check(&self, op: &'static str, device: usize) -> Result<()> {
        if self.device == device {
            Ok(())
        } else {
            Err(crate::error::Error::ContextMismatch {
                op,
                current: crate::device::Device::cuda(self.device),
                device: crate::device::Device::cuda(device),
            })
        }
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: this guard pushed a context on this thread (the guard is !Send via
            // its PhantomData) and nothing popped it since.
            let res = unsafe { super::api::cuCtxPopCurrent_v2(&mut popped) };
            if let Err(e) = check("cuCtxPopCurrent", res) {
                super::deferred::record(self.device, e);
            }
        }
    }
}
