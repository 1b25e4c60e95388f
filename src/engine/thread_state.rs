//! Per-thread transfer state: each thread's dedicated streams (one for H2D, one for D2H,
//! per device, created on first use), its ring of recent H2D batches, and its "current
//! stream" per device.

use crate::device::Device;
use crate::driver::{Event, Stream};
use crate::error::{Error, Result};
use crate::memory::DeviceAlloc;
use crossbeam_queue::ArrayQueue;
use std::cell::RefCell;
use std::sync::Arc;

/// A thread's H2D state on one device.
struct H2dState {
    device: usize,
    stream: Stream,
    /// The device memory of the last `num_caches` batches this thread returned, kept
    /// referenced (the seed's `num_caches`): a batch handed to a consumer on another stream
    /// is not freed the moment the caller drops it. `force_push` evicts the oldest.
    /// `None` when `num_caches` is 0 (an `ArrayQueue` cannot have capacity 0).
    ring: Option<ArrayQueue<Arc<DeviceAlloc>>>,
}

/// A thread's D2H state on one device; each part is created when first needed (a caller
/// that always passes its own stream never gets a pinlane stream).
struct D2hState {
    device: usize,
    stream: Option<Stream>,
    /// Recorded on the current stream so the copy stream can wait for it.
    ready: Option<Event>,
}

thread_local! {
    static H2D: RefCell<Vec<H2dState>> = const { RefCell::new(Vec::new()) };
    static D2H: RefCell<Vec<D2hState>> = const { RefCell::new(Vec::new()) };
    /// The streams made current, innermost last, each with its guard's id.
    static CURRENT: RefCell<Vec<(u64, Stream)>> = const { RefCell::new(Vec::new()) };
    static NEXT_GUARD: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// The calling thread's H2D stream on `device`, created on first use.
pub(crate) fn h2d_stream(device: usize) -> Result<Stream> {
    H2D.try_with(|cell| {
        let mut states = cell.borrow_mut();
        if let Some(s) = states.iter().find(|s| s.device == device) {
            return Ok(s.stream.clone());
        }
        let stream = Stream::new(Device::cuda(device))?;
        states.push(H2dState {
            device,
            stream: stream.clone(),
            ring: None,
        });
        Ok(stream)
    })
    .map_err(|_| Error::ThreadExiting)?
}

/// Puts a returned batch's device memory in the thread's ring for `device`, keeping the
/// last `num_caches`.
pub(crate) fn cache_batch(device: usize, alloc: Arc<DeviceAlloc>, num_caches: usize) -> Result<()> {
    // Evicted entries are dropped after the RefCell borrow ends: their drop calls the
    // driver (cuMemFreeAsync), which must not run with the state borrowed.
    let mut evicted = Vec::new();
    H2D.try_with(|cell| {
        let mut states = cell.borrow_mut();
        let Some(state) = states.iter_mut().find(|s| s.device == device) else {
            return;
        };
        let cap = state.ring.as_ref().map_or(0, ArrayQueue::capacity);
        if cap != num_caches {
            // Resize: keep the newest min(old len, num_caches) entries, in order.
            let old: Vec<_> = state
                .ring
                .take()
                .map(|q| std::iter::from_fn(|| q.pop()).collect())
                .unwrap_or_default();
            let keep_from = old.len().saturating_sub(num_caches);
            let mut old = old.into_iter();
            evicted.extend(old.by_ref().take(keep_from));
            if num_caches > 0 {
                let q = ArrayQueue::new(num_caches);
                for a in old {
                    evicted.extend(q.force_push(a));
                }
                state.ring = Some(q);
            }
        }
        match &state.ring {
            Some(q) => evicted.extend(q.force_push(alloc)),
            None => evicted.push(alloc),
        }
    })
    .map_err(|_| Error::ThreadExiting)?;
    drop(evicted);
    Ok(())
}

/// How many batches the calling thread's ring for `device` holds now.
///
/// ```
/// // Nothing transferred on this thread yet.
/// assert_eq!(pinlane::cached_batches(pinlane::Device::cuda(0)), 0);
/// ```
pub fn cached_batches(device: Device) -> usize {
    let device = device.ordinal();
    H2D.try_with(|cell| {
        cell.borrow()
            .iter()
            .find(|s| s.device == device)
            .and_then(|s| s.ring.as_ref().map(ArrayQueue::len))
            .unwrap_or(0)
    })
    .unwrap_or(0)
}

/// The calling thread's D2H stream on `device`, created on first use.
pub(crate) fn d2h_stream(device: usize) -> Result<Stream> {
    with_d2h(device, |s| match &s.stream {
        Some(st) => Ok(st.clone()),
        None => Ok(s.stream.insert(Stream::new(Device::cuda(device))?).clone()),
    })
}

/// The calling thread's readiness event on `device` (recorded on the current stream for
/// the copy stream to wait on), created on first use.
pub(crate) fn ready_event(device: usize) -> Result<Event> {
    with_d2h(device, |s| match &s.ready {
        Some(e) => Ok(e.clone()),
        None => Ok(s.ready.insert(Event::new(Device::cuda(device))?).clone()),
    })
}

fn with_d2h<T>(device: usize, f: impl FnOnce(&mut D2hState) -> Result<T>) -> Result<T> {
    D2H.try_with(|cell| {
        let mut states = cell.borrow_mut();
        let idx = match states.iter().position(|s| s.device == device) {
            Some(i) => i,
            None => {
                states.push(D2hState {
                    device,
                    stream: None,
                    ready: None,
                });
                states.len() - 1
            }
        };
        f(&mut states[idx])
    })
    .map_err(|_| Error::ThreadExiting)?
}

/// The calling thread's current stream on `device`: the one set with
/// [`set_current_stream`], else the device's legacy default stream (the consumer stream).
///
/// This is what "the caller's current stream" means in pinlane: D2H copies wait for the
/// work queued on it before they start.
///
/// # Errors
/// [`Error::NoCuda`] or [`Error::DeviceUnavailable`] when no stream was set and the
/// legacy stream is asked for; [`Error::ThreadExiting`].
pub fn current_stream(device: Device) -> Result<Stream> {
    let set = CURRENT
        .try_with(|c| {
            c.borrow()
                .iter()
                .rev()
                .find(|(_, s)| s.device() == device)
                .map(|(_, s)| s.clone())
        })
        .map_err(|_| Error::ThreadExiting)?;
    match set {
        Some(s) => Ok(s),
        None => Stream::legacy(device),
    }
}

/// Makes `stream` the calling thread's current stream on its device until the guard
/// drops. Guards nest: the newest live guard's stream is current; dropping a guard
/// removes its own stream, whichever order guards drop in.
///
/// ```no_run
/// # fn main() -> pinlane::Result<()> {
/// let producer = pinlane::Stream::new(pinlane::Device::cuda(0))?;
/// let _current = pinlane::set_current_stream(&producer);
/// // ... queue work on `producer`; transfer_tensor_d2h on cuda:0 now waits for it.
/// # Ok(()) }
/// ```
pub fn set_current_stream(stream: &Stream) -> CurrentStreamGuard {
    let id = NEXT_GUARD
        .try_with(|n| {
            let id = n.get();
            n.set(id + 1);
            id
        })
        .ok();
    let pushed = id.filter(|&id| {
        CURRENT
            .try_with(|c| c.borrow_mut().push((id, stream.clone())))
            .is_ok()
    });
    CurrentStreamGuard {
        id: pushed,
        _not_send: std::marker::PhantomData,
    }
}

/// Restores the previous current stream on drop. See [`set_current_stream`].
#[must_use = "the stream is current only while the guard lives"]
pub struct CurrentStreamGuard {
    /// The entry this guard pushed (`None` if the thread was exiting).
    id: Option<u64>,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for CurrentStreamGuard {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            // Remove this guard's own entry: popping the top would remove another live
            // guard's stream when guards drop out of order.
            let _ = CURRENT.try_with(|c| c.borrow_mut().retain(|(g, _)| *g != id));
        }
    }
}
