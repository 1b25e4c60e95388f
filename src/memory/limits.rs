//! The hardware's pinned-memory copy rates, measured in the calling process: the
//! yardstick benchmarks (pinlane's, and a user's own) print their figures against.

use crate::driver::{self, Event, Stream};
use crate::error::{Error, Result};
use std::time::Instant;

/// Copy rates between page-locked host memory and `device`, in GB/s (1e9 bytes/s): the
/// median of `reps` timed copies of `nbytes` after one warm-up, each direction alone, then
/// both at once on two streams (total).
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct PinnedLimits {
    /// Host to device, alone.
    pub h2d: f64,
    /// Device to host, alone.
    pub d2h: f64,
    /// Both directions at once, on two streams (the total).
    pub both: f64,
}

/// Measures [`PinnedLimits`] with plain `cuMemcpy*Async` calls: one buffer of `nbytes`
/// of page-locked memory each way and one device buffer each way. With
/// [`Config::sync_wait`](crate::config::Config::sync_wait) set, each wait polls, which
/// adds up to a nap of 1 ms to a timed copy: the rates then read low (measure without).
///
/// # Errors
/// [`Error::InvalidOption`] for `nbytes` or `reps` of 0; [`Error::NoCuda`]; the driver's
/// error from an allocation, copy or synchronisation; [`Error::SyncTimeout`] when a copy
/// outlasts [`Config::sync_wait`](crate::config::Config::sync_wait), which every wait
/// here honours as the transfers' waits do. After an error the buffers are freed once
/// both streams are found idle within
/// [`Config::drop_sync_wait`](crate::config::Config::drop_sync_wait), or never.
pub fn measure_pinned_limits(
    device: crate::device::Device,
    nbytes: usize,
    reps: usize,
) -> Result<PinnedLimits> {
    for (name, v) in [("nbytes", nbytes), ("reps", reps)] {
        if v == 0 {
            return Err(Error::InvalidOption {
                name,
                reason: "measure_pinned_limits needs at least one byte and one timed copy".into(),
            });
        }
    }
    driver::require("measure_pinned_limits")?;
    let (dev, device) = (device, device.ordinal());
    let ctx = driver::bind(device)?;
    let a = Stream::new(dev)?;
    let b = Stream::new(dev)?;
    let host_up = super::PinnedBuf::copy_of(&vec![0x5Au8; nbytes], device)?;
    let host_down = super::pinned::block_of(nbytes, device)?;
    let dev_up = super::DeviceAlloc::new_async(&ctx, device, nbytes, &a, a.clone())?;
    let dev_down = super::DeviceAlloc::new_async(&ctx, device, nbytes, &a, a.clone())?;
    let down_view = super::DeviceView::whole(&dev_down);
    sync_bounded(&a)?;
    let done = Event::new(dev)?;
    let time = |f: &dyn Fn() -> Result<()>| -> Result<f64> {
        let mut v = Vec::new();
        for i in 0..=reps {
            let t0 = Instant::now();
            f()?;
            if i > 0 {
                v.push(t0.elapsed().as_secs_f64());
            }
        }
        v.sort_by(f64::total_cmp);
        Ok(v[v.len() / 2])
    };
    let up = || -> Result<()> {
        // SAFETY: every buffer is owned by this function and outlives the closure, which
        // synchronises the stream before returning; on an error before that, the buffers
        // are not freed until both streams are found idle (below).
        unsafe { host_up.h2d_async(&ctx, &dev_up, 0, &a) }?;
        sync_bounded(&a)
    };
    let down = || -> Result<()> {
        // SAFETY: as in `up`; the block is ours alone (no view of it is ever made).
        unsafe { host_down.d2h_async(&ctx, 0, &down_view, &b) }?;
        sync_bounded(&b)
    };
    let both = || -> Result<()> {
        // SAFETY: as in `up`.
        unsafe { host_up.h2d_async(&ctx, &dev_up, 0, &a) }?;
        // SAFETY: as in `down`.
        unsafe { host_down.d2h_async(&ctx, 0, &down_view, &b) }?;
        done.record(&b)?;
        sync_bounded(&a)?;
        super::arena::wait_for(&done)
    };
    let gbs = |bytes: usize, s: f64| bytes as f64 / s / 1e9;
    let measured = (|| {
        Ok(PinnedLimits {
            h2d: gbs(nbytes, time(&up)?),
            d2h: gbs(nbytes, time(&down)?),
            both: gbs(2 * nbytes, time(&both)?),
        })
    })();
    if measured.is_err() {
        // A copy may still run on either stream: the buffers are freed (on return) only
        // once both are found idle within the drop bound; otherwise they are never
        // freed (a failing device; which stream still reads them is not known).
        let end = crate::driver::deadline_after(super::waits::drop_wait());
        let left = || end.saturating_duration_since(std::time::Instant::now());
        if !(a.idle_within(left()) && b.idle_within(left())) {
            std::mem::forget((host_up, host_down, down_view, dev_up, dev_down));
        }
    }
    measured
}

/// Waits for `stream` as the engine's own waits do: in the driver, or polled for at most
/// [`Config::sync_wait`](crate::config::Config::sync_wait) when the program set one.
fn sync_bounded(stream: &Stream) -> Result<()> {
    super::arena::Synced::synchronize(stream).map(drop)
}
