//! [`Event`]: an owned CUDA event (timing disabled), the unit of "this copy is done".

use super::{bind, check, Handle, Stream};
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::Arc;

/// A CUDA event on one device. Cheap to clone; destroyed when the last clone drops.
///
/// Record it on a stream after producing work, then pass it to
/// [`D2hOptions::producer_event`](crate::D2hOptions::producer_event) so a copy waits for
/// that work.
///
/// ```no_run
/// # fn main() -> pinlane::Result<()> {
/// let producer = pinlane::Stream::new(0)?;
/// let done = pinlane::Event::new(0)?;
/// done.record(&producer)?;
/// done.synchronize()?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Event {
    inner: Arc<EventInner>,
}

struct EventInner {
    raw: Handle<sys::CUevent>,
    device: usize,
}

impl Event {
    /// Creates an event on `device`.
    pub fn new(device: usize) -> Result<Event> {
        super::require("Event::new")?;
        let _ctx = bind(device)?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: out-pointer to a live local; the device's context is current.
        unsafe { check("cuEventCreate", super::api::cuEventCreate(&mut raw, flags)) }?;
        Ok(Event {
            inner: Arc::new(EventInner {
                raw: Handle(raw),
                device,
            }),
        })
    }

    /// The device index this event belongs to.
    pub fn device(&self) -> usize {
        self.inner.device
    }

    /// Records the event at the current end of `stream`'s queue.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        super::fault_point(super::FaultKindTag::EventRecord, "cuEventRecord")?;
        let _ctx = bind(self.inner.device)?;
        // SAFETY: both handles are alive (held by self and `stream`); context current.
        unsafe {
            check(
                "cuEventRecord",
                super::api::cuEventRecord(self.raw(), stream.raw()),
            )
        }
    }

    /// Blocks until the work recorded before the event has finished.
    pub fn synchronize(&self) -> Result<()> {
        let _ctx = bind(self.inner.device)?;
        // SAFETY: the event is alive; context current.
        unsafe {
            check(
                "cuEventSynchronize",
                super::api::cuEventSynchronize(self.raw()),
            )
        }
    }

    /// Whether the recorded work has finished, without blocking.
    pub fn query(&self) -> Result<bool> {
        let _ctx = bind(self.inner.device)?;
        // SAFETY: the event is alive; context current.
        let res = unsafe { super::api::cuEventQuery(self.raw()) };
        if res == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", res).map(|()| true)
    }

    /// Makes `stream` wait (on the device, without blocking the host) for this event.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        let _ctx = bind(stream.device())?;
        // SAFETY: both handles are alive; flags 0 is the only defined value.
        unsafe {
            check(
                "cuStreamWaitEvent",
                super::api::cuStreamWaitEvent(stream.raw(), self.raw(), 0),
            )
        }
    }

    pub(crate) fn raw(&self) -> sys::CUevent {
        self.inner.raw.0
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("device", &self.inner.device)
            .finish()
    }
}

impl Drop for EventInner {
    fn drop(&mut self) {
        let res = bind(self.device).and_then(|_ctx| {
            // SAFETY: we created this event and this is its last owner.
            unsafe { check("cuEventDestroy", super::api::cuEventDestroy_v2(self.raw.0)) }
        });
        if let Err(e) = res {
            super::deferred::record(e);
        }
    }
}
