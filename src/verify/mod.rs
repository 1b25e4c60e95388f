//! Round-trip verification for users: [`round_trip`] moves a batch to a device and back
//! every way a program can, and says precisely where anything differs.
//!
//! ```no_run
//! use pinlane::verify::{round_trip, RoundTrip};
//! use pinlane::Tensor;
//!
//! let batch = (vec![Tensor::from_vec(vec![1.5f32; 6], [2, 3])?], Tensor::scalar(7u8));
//! // Eight routes there and back; an error names the route, the tensor and the byte.
//! round_trip(&batch, &RoundTrip::default())?;
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! It needs a device: a GPU, or pinlane's simulated device (feature `sim`,
//! [`driver::sim::enable`](crate::driver::sim)), which models the driver's semantics on
//! host threads so that a CI without a GPU can run the same tests. Without either it
//! returns [`VerifyError::Setup`] instead of passing a check that moved nothing.
//!
//! With feature `proptest`, [`strategy`] has proptest strategies for dtypes, shapes,
//! tensors whose bytes reveal misplaced data, and nested [`Value`](crate::Value) batches.
//! docs/verify.md shows a whole test to copy: a `#[derive(Batch)]` type, a proptest over
//! it, the checker, on the simulated device in CI and on a GPU where there is one.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`RoundTrip`] (which routes), [`Route`], [`round_trip`] |
//! | `report.rs` | [`VerifyError`], [`Mismatch`], the comparison ([`first_difference`]) |
//! | `pattern.rs` | tensors whose bytes reveal misplaced data ([`pattern`], [`patterned`]) |
//! | `strategy.rs` | proptest strategies (feature `proptest`) |

mod pattern;
mod report;
#[cfg(feature = "proptest")]
pub mod strategy;

pub use pattern::{pattern, patterned};
pub use report::{first_difference, Mismatch, MismatchKind, VerifyError};

use crate::batch::Batch;
use crate::device::{Device, DeviceSpec};
use crate::driver::Stream;
use crate::engine::{
    transfer_tensor_d2h, transfer_tensor_d2h_async, transfer_tensor_h2d_async,
    transfer_tensor_h2d_with, D2hOptions, H2dOptions, HostOutput,
};
use std::fmt;
use std::time::Duration;

/// Where the sources of a route are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Source {
    /// The batch as given (pageable host tensors, or page-locked ones if it has them).
    AsGiven,
    /// Every tensor copied into page-locked memory first (`Tensor::to_pinned_on`).
    PageLocked,
}

/// Which calls a route makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Calls {
    /// `transfer_tensor_h2d_with` and `transfer_tensor_d2h`.
    Blocking,
    /// `transfer_tensor_h2d_async` and `transfer_tensor_d2h_async`, waited for with a
    /// bound ([`RoundTrip::wait`]).
    Async,
}

/// One way there and back: the sources, the calls, the host output and the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Route {
    /// Where the sources are.
    pub source: Source,
    /// Which calls move them.
    pub calls: Calls,
    /// The D2H output's memory.
    pub output: HostOutput,
    /// The device.
    pub device: Device,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let calls = match self.calls {
            Calls::Blocking => "blocking calls",
            Calls::Async => "non-blocking calls",
        };
        let source = match self.source {
            Source::AsGiven => "sources as given",
            Source::PageLocked => "page-locked sources",
        };
        let output = match self.output {
            HostOutput::Pinned => "page-locked outputs",
            HostOutput::Pageable => "pageable outputs",
        };
        write!(f, "{calls}, {source}, {output}, {}", self.device)
    }
}

/// Which routes [`round_trip`] takes: by default every combination of [`Source`],
/// [`Calls`] and [`HostOutput`] (eight), to `cuda:{LOCAL_RANK}`, on the thread's own
/// streams.
///
/// ```no_run
/// use pinlane::verify::{Calls, RoundTrip};
/// use pinlane::{Device, HostOutput};
/// let quick = RoundTrip::default()
///     .device(Device::cuda(0))
///     .calls(&[Calls::Blocking])
///     .outputs(&[HostOutput::Pinned]);
/// assert_eq!(quick.routes()?.len(), 2); // sources as given, page-locked
/// # Ok::<(), pinlane::Error>(())
/// ```
#[derive(Clone, Debug)]
pub struct RoundTrip {
    device: DeviceSpec,
    stream: Option<Stream>,
    sources: Vec<Source>,
    calls: Vec<Calls>,
    outputs: Vec<HostOutput>,
    wait: Duration,
}

impl Default for RoundTrip {
    fn default() -> Self {
        RoundTrip {
            device: DeviceSpec::LocalRank,
            stream: None,
            sources: vec![Source::AsGiven, Source::PageLocked],
            calls: vec![Calls::Blocking, Calls::Async],
            outputs: vec![HostOutput::Pinned, HostOutput::Pageable],
            wait: Duration::from_secs(60),
        }
    }
}

impl RoundTrip {
    /// The device (default `cuda:{LOCAL_RANK}`).
    pub fn device(mut self, d: impl Into<DeviceSpec>) -> Self {
        self.device = d.into();
        self
    }

    /// The stream the D2H copies run on (default: the thread's own).
    pub fn stream(mut self, s: Stream) -> Self {
        self.stream = Some(s);
        self
    }

    /// Only these sources.
    pub fn sources(mut self, s: &[Source]) -> Self {
        self.sources = s.to_vec();
        self
    }

    /// Only these calls.
    pub fn calls(mut self, c: &[Calls]) -> Self {
        self.calls = c.to_vec();
        self
    }

    /// Only these outputs.
    pub fn outputs(mut self, o: &[HostOutput]) -> Self {
        self.outputs = o.to_vec();
        self
    }

    /// The longest a non-blocking call is waited for (default 60 s); past it the route
    /// fails with [`VerifyError::Timeout`]. The blocking calls wait as the transfers do:
    /// bounded by [`Config::sync_wait`](crate::Config::sync_wait) when it is set (a CI
    /// job that must end on a hung device sets it), for as long as the device takes
    /// otherwise.
    pub fn wait(mut self, limit: Duration) -> Self {
        self.wait = limit;
        self
    }

    /// The routes, in the order [`round_trip`] takes them.
    ///
    /// # Errors
    /// No CUDA driver (nor the simulated device); a device that is not there or does not
    /// parse (`LOCAL_RANK` included); no route (an empty list of calls, sources or
    /// outputs: a check that moves nothing must not pass).
    pub fn routes(&self) -> Result<Vec<Route>, crate::error::Error> {
        let empty = [
            ("calls", self.calls.is_empty()),
            ("sources", self.sources.is_empty()),
            ("outputs", self.outputs.is_empty()),
        ];
        if let Some((name, _)) = empty.into_iter().find(|(_, e)| *e) {
            return Err(crate::error::Error::InvalidOption {
                name,
                reason: "an empty list leaves no route to check".into(),
            });
        }
        let info = crate::driver::require("verify::round_trip")?;
        let device = self.device.resolve(info.device_count)?;
        let mut out = Vec::new();
        for &calls in &self.calls {
            for &source in &self.sources {
                for &output in &self.outputs {
                    out.push(Route {
                        source,
                        calls,
                        output,
                        device,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// Moves `batch` (host tensors) to the device and back along every route of `how`, and
/// checks that each comes back with the same structure (every tensor at the same
/// [`Path`](crate::batch::Path)), dtypes, shapes and bytes, and that after the H2D every
/// tensor is on the device. Stops at the first difference.
///
/// It needs a device (a GPU, or the simulated one); without, it fails with
/// [`VerifyError::Setup`] rather than pass a check that moved nothing.
///
/// # Errors
/// [`VerifyError::Mismatch`] naming the route, the tensor's path, and what differs (for
/// bytes: the first differing byte's offset, its element, and both values);
/// [`VerifyError::Transfer`] when a call fails; [`VerifyError::Timeout`] when a
/// non-blocking call outlives [`RoundTrip::wait`]; [`VerifyError::NotHost`] when the batch
/// holds a tensor that is not on the host (the check starts from host batches);
/// [`VerifyError::Setup`] without a device.
pub fn round_trip<B: Batch>(batch: &B, how: &RoundTrip) -> Result<(), VerifyError> {
    report::all_on_host(batch)?;
    let routes = how.routes().map_err(VerifyError::Setup)?;
    // The page-locked copy of the batch, made once for every route that uses it (all
    // routes share one device).
    let mut pinned: Option<B> = None;
    for route in routes {
        let src = match route.source {
            Source::AsGiven => batch,
            Source::PageLocked => match &mut pinned {
                Some(p) => &*p,
                none => &*none.insert(page_locked(batch, route)?),
            },
        };
        one_route(batch, src, how, route)?;
    }
    Ok(())
}

/// `batch` with every tensor copied into page-locked memory for `route`'s device.
fn page_locked<B: Batch>(batch: &B, route: Route) -> Result<B, VerifyError> {
    let mut first = None;
    let pinned = batch.rebuild(&mut |t| {
        t.to_pinned_on(route.device).unwrap_or_else(|e| {
            first.get_or_insert(e);
            t.clone()
        })
    });
    match first {
        Some(error) => Err(VerifyError::Transfer { route, error }),
        None => Ok(pinned),
    }
}

/// One route: `src` (the batch's sources for it) there, the check on the device side,
/// back, the comparison with `batch`.
fn one_route<B: Batch>(
    batch: &B,
    src: &B,
    how: &RoundTrip,
    route: Route,
) -> Result<(), VerifyError> {
    let fail = |error| VerifyError::Transfer { route, error };
    let h2d = H2dOptions::default().device(route.device);
    let mut d2h = D2hOptions::default()
        .device(route.device)
        .output(route.output);
    if let Some(s) = &how.stream {
        d2h = d2h.stream(s.clone());
    }
    let timeout = |route| VerifyError::Timeout {
        route,
        waited_ms: u64::try_from(how.wait.as_millis()).unwrap_or(u64::MAX),
    };
    let on = match route.calls {
        Calls::Blocking => transfer_tensor_h2d_with(src, &h2d).map_err(fail)?,
        Calls::Async => transfer_tensor_h2d_async(src, &h2d)
            .map_err(fail)?
            .wait_timeout(how.wait)
            .ok_or_else(|| timeout(route))?
            .map_err(fail)?,
    };
    report::all_on_device(&on, route)?;
    let back = match route.calls {
        Calls::Blocking => transfer_tensor_d2h(&on, &d2h).map_err(fail)?,
        Calls::Async => transfer_tensor_d2h_async(&on, &d2h)
            .map_err(fail)?
            .wait_timeout(how.wait)
            .ok_or_else(|| timeout(route))?
            .map_err(fail)?,
    };
    report::all_in_outputs(&back, route)?;
    report::compare(batch, &back, route)
}
