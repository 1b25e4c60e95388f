//! [`Event`]: an owned CUDA event (timing disabled), the unit of "this copy is done".

use super::{bind, check, Handle, Stream};
use crate::device::Device;
use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// A raw CUDA event handle (`CUevent`), as the driver API and other libraries give it.
pub type RawEvent = sys::CUevent;

/// A CUDA event on one device. Cheap to clone; destroyed when the last clone drops if
/// pinlane made it ([`Event::new`]), never if it was borrowed ([`Event::from_raw`]).
///
/// Record it on a stream after producing work, then pass it to
/// [`D2hOptions::producer_event`](crate::engine::D2hOptions::producer_event) so a copy waits for
/// that work.
///
/// ```no_run
/// # fn main() -> pinlane::Result<()> {
/// let producer = pinlane::Stream::new(pinlane::Device::cuda(0))?;
/// let done = pinlane::Event::new(pinlane::Device::cuda(0))?;
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
    owned: bool,
    /// How many times [`Event::record`] has succeeded (bumped after the driver's
    /// record), and the highest such count a query saw completed: equal, the last
    /// recording is known done without asking the driver again ([`Event::completed`]).
    records: AtomicU64,
    seen_done: AtomicU64,
    /// Set while the event marks a transfer's copies and may be in a caller's hands
    /// ([`Event::seal`]): [`Event::record`] then refuses.
    sealed: AtomicBool,
}

impl EventInner {
    fn new(raw: sys::CUevent, device: usize, owned: bool) -> EventInner {
        EventInner {
            raw: Handle(raw),
            device,
            owned,
            records: AtomicU64::new(0),
            seen_done: AtomicU64::new(0),
            sealed: AtomicBool::new(false),
        }
    }
}

impl Event {
    /// Creates an event on `device` (timing disabled).
    ///
    /// # Errors
    /// [`Error::NoCuda`], [`Error::DeviceUnavailable`], or the driver's error.
    pub fn new(device: Device) -> Result<Event> {
        super::require("Event::new")?;
        let device = device.ordinal();
        let _ctx = bind(device)?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: out-pointer to a live local; the device's context is current.
        unsafe { check("cuEventCreate", super::api::cuEventCreate(&mut raw, flags)) }?;
        Ok(Event {
            inner: Arc::new(EventInner::new(raw, device, true)),
        })
    }

    /// An event that another library made (cudarc, PyTorch's `torch.cuda.Event`), for use
    /// as [`D2hOptions::producer_event`](crate::engine::D2hOptions::producer_event). pinlane never
    /// destroys it.
    ///
    /// # Safety
    /// 1. `raw` is an event created in `device`'s primary context.
    /// 2. It stays alive until the returned `Event` and every clone of it are dropped.
    ///
    /// # Errors
    /// [`Error::NoCuda`], [`Error::DeviceUnavailable`], or [`Error::InvalidOption`] for a
    /// null handle.
    pub unsafe fn from_raw(raw: RawEvent, device: Device) -> Result<Event> {
        super::require("Event::from_raw")?;
        super::check_device(device.ordinal())?;
        if raw.is_null() {
            return Err(Error::InvalidOption {
                name: "Event::from_raw",
                reason: "null event handle".into(),
            });
        }
        Ok(Event {
            inner: Arc::new(EventInner::new(raw, device.ordinal(), false)),
        })
    }

    /// The raw handle, for other libraries (valid while any clone of this `Event` lives).
    pub fn as_raw(&self) -> RawEvent {
        self.inner.raw.0
    }

    /// The device this event belongs to.
    pub fn device(&self) -> Device {
        Device::cuda(self.inner.device)
    }

    /// The device's ordinal.
    pub(crate) fn index(&self) -> usize {
        self.inner.device
    }

    /// Whether this is the only handle to an event pinlane made: no clone can then see
    /// it recorded again, so it may be reused for other work.
    pub(crate) fn reusable(&self) -> bool {
        self.inner.owned && Arc::strong_count(&self.inner) == 1
    }

    /// Makes [`Event::record`] refuse, on this handle and every clone of it: for an event
    /// recorded after a transfer's copies and handed out with it. pinlane waits for that
    /// event before it lets go of the copies' buffers, and the transfer's ordered outputs'
    /// uses wait for it on the device, so a caller's record (which moves it to another
    /// point of another stream) could free a buffer a copy still touches.
    pub(crate) fn seal(&self) {
        self.inner.sealed.store(true, Ordering::Release);
    }

    /// Lets [`Event::record`] record again: only for a [`reusable`](Event::reusable)
    /// event, whose last handle pinlane holds.
    pub(crate) fn unseal(&self) {
        debug_assert!(self.reusable());
        self.inner.sealed.store(false, Ordering::Release);
    }

    /// Errors unless `stream` is on this event's device.
    fn same_device(&self, op: &'static str, stream: &Stream) -> Result<()> {
        if stream.index() == self.inner.device {
            return Ok(());
        }
        Err(Error::EventStreamMismatch {
            op,
            event_device: crate::device::Device::cuda(self.inner.device),
            stream_device: crate::device::Device::cuda(stream.index()),
        })
    }

    /// Records the event at the current end of `stream`'s queue.
    ///
    /// # Errors
    /// [`Error::SealedEvent`] for a transfer's own event
    /// ([`Transfer::ready_event`](crate::Transfer::ready_event)) or a clone of it,
    /// [`Error::EventStreamMismatch`] for a stream of another device, or the driver's
    /// error.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.record_as(stream, super::FaultKindTag::EventRecord)
    }

    /// [`Event::record`], its injected faults (feature `test-util`) of kind `fault`.
    pub(crate) fn record_as(&self, stream: &Stream, fault: super::FaultKindTag) -> Result<()> {
        if self.inner.sealed.load(Ordering::Acquire) {
            return Err(Error::SealedEvent {
                op: "Event::record",
            });
        }
        self.same_device("Event::record", stream)?;
        super::fault_point(fault, "cuEventRecord")?;
        let _ctx = bind(self.inner.device)?;
        // SAFETY: both handles are alive (held by self and `stream`); context current.
        unsafe {
            check(
                "cuEventRecord",
                super::api::cuEventRecord(self.raw(), stream.raw()),
            )
        }?;
        // After the driver's record, never before: a query that read the count before
        // this bump can only cache the old count, which no longer matches; one that reads
        // it after asks the driver about this record. (Bumped before, a query could read
        // the new count, ask the driver before its record lands, see the old recording
        // done, and cache the new count as done.) A `completed` racing this call may
        // answer for the recording before it, as if it had come first.
        self.inner.records.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }

    /// Blocks until the work recorded before the event has finished: the driver's own
    /// wait, with no bound (pinlane's own waits use `Config::sync_wait` instead).
    ///
    /// # Errors
    /// The driver's error for a failed wait (the failure of any work the event covers).
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
    ///
    /// # Errors
    /// The driver's error, other than "not ready" (which is `Ok(false)`).
    pub fn query(&self) -> Result<bool> {
        let _ctx = bind(self.inner.device)?;
        // SAFETY: the event is alive; context current.
        let res = unsafe { super::api::cuEventQuery(self.raw()) };
        if res == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check("cuEventQuery", res).map(|()| true)
    }

    /// [`Event::query`] for the work pinlane's last [`Event::record`] of this event
    /// queued, remembered: once a query has seen it done, the answer is `true` without a
    /// driver call (a query costs 1 to 2 us) until the event is recorded again. Only for
    /// events pinlane made: a borrowed one ([`Event::from_raw`]) may be recorded by its
    /// owner, unseen, and is always asked. (A record of a pinlane event through its raw
    /// handle is not seen either; what this answers, that pinlane's own recorded work is
    /// done, stays true then.)
    pub(crate) fn completed(&self) -> Result<bool> {
        let inner = &*self.inner;
        if !inner.owned {
            return self.query();
        }
        let n = inner.records.load(Ordering::SeqCst);
        if inner.seen_done.load(Ordering::SeqCst) == n {
            return Ok(true);
        }
        let done = self.query()?;
        if done {
            // `n` was read before the query, and a record bumps the count only once the
            // driver has it: every record counted in `n` came before this query.
            inner.seen_done.fetch_max(n, Ordering::SeqCst);
        }
        Ok(done)
    }

    /// Whether the recorded work finishes within `limit`: polled, never blocking in the
    /// driver (a hung device cannot hold the caller past `limit`): the thread yields
    /// between queries for the first 100 us, then naps from 20 us growing to 1 ms.
    ///
    /// # Errors
    /// The driver's error from `cuEventQuery`.
    pub(crate) fn done_within(&self, limit: std::time::Duration) -> Result<bool> {
        let start = std::time::Instant::now();
        let deadline = super::deadline_after(limit);
        let mut nap = std::time::Duration::from_micros(20);
        loop {
            if self.query()? {
                return Ok(true);
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return Ok(false);
            }
            if now - start < std::time::Duration::from_micros(100) {
                std::thread::yield_now();
                continue;
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(std::time::Duration::from_millis(1));
        }
    }

    /// Makes `stream` wait (on the device, without blocking the host) for this event. The
    /// stream may be on another device (the driver orders across devices).
    ///
    /// # Errors
    /// The driver's error.
    pub fn wait_on(&self, stream: &Stream) -> Result<()> {
        let _ctx = bind(stream.index())?;
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
        if !self.owned {
            return;
        }
        let res = bind(self.device).and_then(|_ctx| {
            // SAFETY: we created this event and this is its last owner.
            unsafe { check("cuEventDestroy", super::api::cuEventDestroy_v2(self.raw.0)) }
        });
        if let Err(e) = res {
            super::deferred::record(self.device, e);
        }
    }
}

#[cfg(all(test, feature = "test-util"))]
mod tests {
    use super::*;
    use std::time::Duration;

    /// `completed` remembers a recording seen done, and a new record (by pinlane) is never
    /// taken as done from the last one; a borrowed event is always asked.
    #[test]
    fn completed_is_remembered_until_the_next_record() {
        crate::sim_tests::setup();
        let dev = Device::cuda(0);
        let s = Stream::new(dev).unwrap();
        let e = Event::new(dev).unwrap();
        assert!(
            e.completed().unwrap(),
            "an event never recorded is complete"
        );
        for round in 0..2 {
            s.delay_async(Duration::from_millis(300)).unwrap();
            e.record(&s).unwrap();
            assert!(
                !e.completed().unwrap(),
                "round {round}: a record behind a 300 ms pause was taken as done"
            );
            e.synchronize().unwrap();
            assert!(e.completed().unwrap(), "round {round}: done after a sync");
        }
        // The same CUDA event recorded through a borrowed handle (as another library
        // would): the borrowed `Event` asks the driver; pinlane's own, whose last record
        // is done, answers from what it saw, without asking.
        // SAFETY: `e`'s handle, alive while `e` is (it outlives `b`), of device 0's
        // primary context.
        let b = unsafe { Event::from_raw(e.as_raw(), dev) }.unwrap();
        s.delay_async(Duration::from_millis(300)).unwrap();
        b.record(&s).unwrap();
        assert!(
            !b.completed().unwrap(),
            "a borrowed event was answered unasked"
        );
        assert!(
            !e.query().unwrap(),
            "the driver should see the new record pending"
        );
        assert!(
            e.completed().unwrap(),
            "pinlane's seen-done record was asked again"
        );
        b.synchronize().unwrap();
    }
}
