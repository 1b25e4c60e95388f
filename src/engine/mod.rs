//! The engine: the two transfer calls, built on the layers below (driver, memory, tensor,
//! batch).
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | the public calls, [`TransferStats`] |
//! | `options.rs` | [`H2dOptions`], [`D2hOptions`], device strings and `LOCAL_RANK` |
//! | `plan.rs` | pure planning: batch layout and staging windows |
//! | `patience.rs` | how polling loops back off, and when they give up |
//! | `thread_state.rs` | per-thread streams, the cache ring, the current stream |
//! | `h2d.rs`, `d2h.rs` | the two directions |
//! | `into.rs`, `h2d_into.rs`, `d2h_into.rs`, `h2d_pairs.rs` | copies into tensors the caller owns: their options and checks; each direction's call and work; [`H2dPairs`], pairs checked once |
//! | `prefetch.rs` | [`Prefetcher`]: batches moved ahead on a worker thread |
//! | `shutdown.rs` | [`Runtime::shutdown`](crate::runtime::Runtime::shutdown): memory back, threads stopped |

mod completion;
mod d2h;
mod d2h_into;
mod h2d;
mod h2d_into;
mod h2d_pairs;
mod into;
mod options;
mod patience;
mod plan;
mod prefetch;
mod shutdown;
mod thread_state;
mod trace;

pub use completion::Transfer;
pub use d2h::end_flags_available;
pub use d2h_into::transfer_tensor_d2h_into;
pub use h2d_into::transfer_tensor_h2d_into;
pub use h2d_pairs::H2dPairs;
pub use into::IntoOptions;
pub use options::{D2hOptions, H2dOptions, HostOutput, MAX_NUM_CACHES};
pub use prefetch::Prefetcher;
pub use shutdown::{settle, shutdown};
pub use thread_state::{cached_batches, current_stream, set_current_stream, CurrentStreamGuard};
pub use trace::{last_trace, trace_next_call};

use crate::batch::Batch;
use crate::device::DeviceSpec;
use crate::driver::ContextGuard;
use crate::error::{Error, Result};
use crate::memory::InFlight;
use std::cell::Cell;

/// Copies the host tensors of `batch` to `cuda:{LOCAL_RANK}` on the calling thread's
/// dedicated stream and returns the same structure with device tensors in their place.
///
/// * Each thread has its own stream per device, created on first use.
/// * Page-locked sources of 256 KiB and more (64 KiB and more where the driver has
///   `cuMemcpyBatchAsync`, which then takes all of them in one submission) are copied
///   directly; pageable ones, and smaller page-locked ones, are staged through the bounded
///   pinned arena, many small tensors per copy.
/// * The stream is synchronised before returning: the data is on the device.
/// * Device tensors and non-tensor leaves come back unchanged (same storage).
/// * The device memory of the thread's last [`H2dOptions::num_caches`] batches stays
///   referenced; returned memory is freed on the consumer stream when its last owner
///   drops.
/// * On failure, copies already queued are drained before the error is returned; the
///   input is never changed.
/// * With no usable CUDA driver or device, the input comes back as is (cheap clones).
///
/// ```
/// use pinlane::{transfer_tensor_h2d, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let batch = vec![Tensor::from_vec(vec![1.0f32; 6], [2, 3])?];
/// let on_gpu = transfer_tensor_h2d(&batch)?;
/// if pinlane::driver::available().is_none() {
///     assert_eq!(on_gpu, batch); // no CUDA: returned as is
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`transfer_tensor_h2d_with`].
pub fn transfer_tensor_h2d<B: Batch>(batch: &B) -> Result<B> {
    transfer_tensor_h2d_with(batch, &H2dOptions::default())
}

/// [`transfer_tensor_h2d`] with options.
///
/// ```
/// use pinlane::{transfer_tensor_h2d_with, H2dOptions, Tensor};
/// let b = (Tensor::scalar(1u8), 5i32);
/// let out = transfer_tensor_h2d_with(&b, &H2dOptions::default().num_caches(2)).unwrap();
/// assert_eq!(out.1, 5);
/// ```
///
/// # Errors
/// [`Error::InvalidDevice`](crate::error::Error::InvalidDevice),
/// [`Error::InvalidLocalRank`](crate::error::Error::InvalidLocalRank),
/// [`Error::DeviceUnavailable`](crate::error::Error::DeviceUnavailable),
/// [`Error::StreamDeviceMismatch`](crate::error::Error::StreamDeviceMismatch) and
/// [`Error::InvalidOption`](crate::error::Error::InvalidOption) for bad options (before any copy);
/// [`Error::BytesInFlight`](crate::error::Error::BytesInFlight) for a page-locked source a D2H call
/// is still writing (before any copy);
/// [`Error::StreamCapturing`](crate::error::Error::StreamCapturing) for a consumer stream a CUDA
/// graph capture runs on (before any copy);
/// [`Error::Deferred`](crate::error::Error::Deferred) for an earlier release failure of this thread on
/// the device; [`Error::StagingExhausted`](crate::error::Error::StagingExhausted); the driver's error
/// ([`Error::Driver`](crate::error::Error::Driver)) if a copy, allocation or synchronisation fails,
/// after draining what was queued. The input is never changed.
pub fn transfer_tensor_h2d_with<B: Batch>(batch: &B, opts: &H2dOptions) -> Result<B> {
    trace::start("h2d");
    let r = h2d::transfer(batch, opts, Mode::Blocking, None).map(|(b, _)| b);
    trace::end();
    r
}

/// [`transfer_tensor_h2d_with`], calling `while_copying` on the device batch once every
/// copy is queued and before the call waits for them, so that work on the outputs that
/// needs no bytes overlaps the copies: a binding handing them to its framework
/// ([`Tensor::to_dlpack`](crate::Tensor::to_dlpack)), say.
///
/// * The outputs' bytes are still being written in it: nothing may read or write them
///   until the call has returned `Ok`. pinlane's own uses of them are refused there with
///   [`Error::BytesInFlight`](crate::error::Error::BytesInFlight) (lending the pointer,
///   [`Tensor::to_dlpack`](crate::Tensor::to_dlpack), a transfer from or into them), as
///   they would not be ordered after the copies; a binding exports them with the unsafe
///   [`Tensor::to_dlpack_in_flight`](crate::Tensor::to_dlpack_in_flight), and whoever it
///   hands them to must not use them before the call has returned `Ok`.
/// * `while_copying` runs once in every successful call; on the finished batch where
///   nothing is left to overlap (a batch that passes through: no host tensor, or no
///   CUDA). Its result comes back beside the batch. If the call fails after it ran, its
///   result is dropped inside the call, on the calling thread; pinlane keeps the outputs'
///   memory until the copies have let go of it.
/// * It runs on the calling thread, with the device's context current (pinlane's own
///   calls bind it again as they need). A panic in it unwinds out of the call: nothing is
///   freed while a copy may still use it; the unwinding waits for the stream up to
///   `Config::drop_sync_wait`, retaining what it cannot prove idle (the outputs' memory
///   and the sources the copies read).
///
/// ```
/// use pinlane::{transfer_tensor_h2d_overlapping, H2dOptions, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let b = vec![Tensor::from_vec(vec![1.0f32; 6], [2, 3])?];
/// let (out, dims) =
///     transfer_tensor_h2d_overlapping(&b, &H2dOptions::default(), |out| out[0].dims().to_vec())?;
/// assert_eq!(dims, [2, 3]);
/// if pinlane::driver::available().is_none() {
///     assert_eq!(out, b); // no CUDA: returned as is, `while_copying` run on it
/// }
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`transfer_tensor_h2d_with`].
pub fn transfer_tensor_h2d_overlapping<B: Batch, R>(
    batch: &B,
    opts: &H2dOptions,
    while_copying: impl FnOnce(&B) -> R,
) -> Result<(B, R)> {
    let mut once = Once::new(while_copying);
    trace::start("h2d");
    let r = h2d::transfer(batch, opts, Mode::Blocking, Some(&mut |b| once.run(b)));
    trace::end();
    once.finish(r?.0, "transfer_tensor_h2d_overlapping")
}

/// An overlapping call's `while_copying`: run at most once inside the call ([`Once::run`],
/// what the call is given as its [`WhileCopying`]), or else on the finished batch
/// ([`Once::finish`]).
struct Once<F, R> {
    f: Option<F>,
    out: Option<R>,
}

impl<F, R> Once<F, R> {
    fn new(f: F) -> Self {
        Once {
            f: Some(f),
            out: None,
        }
    }

    fn run<B>(&mut self, b: &B)
    where
        F: FnOnce(&B) -> R,
    {
        if let Some(f) = self.f.take() {
            self.out = Some(f(b));
        }
    }

    /// The batch with what `while_copying` made in the call, or, where the call did not
    /// run it (nothing was left to overlap), with what it makes of the finished batch now.
    fn finish<B>(mut self, b: B, op: &'static str) -> Result<(B, R)>
    where
        F: FnOnce(&B) -> R,
    {
        self.run(&b);
        match self.out {
            Some(out) => Ok((b, out)),
            None => Err(Error::Internal {
                op,
                reason: "while_copying was taken and gave no result".into(),
            }),
        }
    }
}

/// The caller's code that a blocking call runs on its rebuilt batch once its copies are
/// queued, before it waits for them (the overlapping calls' `while_copying`).
type WhileCopying<'h, B> = Option<&'h mut dyn FnMut(&B)>;

/// Runs `while_copying` on `rebuilt` while `job`'s copies may run. A panic in it is caught
/// until `job` has kept what the copies use, `sources()` included
/// ([`InFlight::unwind`]: the drop of an unwinding job keeps its memory but has no
/// sources to keep), then resumed.
fn run_while_copying<B, S: Send + 'static>(
    while_copying: &mut dyn FnMut(&B),
    rebuilt: &B,
    mut job: InFlight,
    sources: impl FnOnce() -> S,
) -> InFlight {
    // `while_copying` runs once every copy is queued.
    job.guarded(sources, true, |_| while_copying(rebuilt));
    trace::mark("handed over");
    job
}

/// Whether a call waits for its copies (the spec's calls) or returns once they are
/// queued, with a [`Transfer`] handle.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Blocking,
    Async,
}

/// [`transfer_tensor_h2d_with`] without waiting: returns once every copy is queued (the
/// pageable sources' bytes are in the staging slots by then; the caller's batch is no
/// longer read, and may change or drop), with a [`Transfer`] whose `wait()` / `.await`
/// gives the device batch. Copies run in the order of the calls on the thread's stream.
///
/// ```
/// use pinlane::{transfer_tensor_h2d_async, H2dOptions, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let batch = vec![Tensor::from_vec(vec![1.0f32; 1 << 16], [1 << 16])?];
/// let moving = transfer_tensor_h2d_async(&batch, &H2dOptions::default())?;
/// // ... decode the next batch while this one moves ...
/// let on_gpu = moving.wait()?; // or `moving.await` in async code
/// assert_eq!(on_gpu[0].dims(), &[1 << 16]);
/// # Ok(()) }
/// ```
///
/// # Errors
/// Bad input, as [`transfer_tensor_h2d_with`] (before any copy). A failure of the driver
/// or of the staging arena, while queueing (then drained, as the blocking call does) or
/// while the copies run, comes from [`Transfer::wait`] / `.await`.
pub fn transfer_tensor_h2d_async<B: Batch>(batch: &B, opts: &H2dOptions) -> Result<Transfer<B>> {
    trace::start("h2d_async");
    let r = h2d::transfer(batch, opts, Mode::Async, None);
    trace::end();
    handle(r, &opts.device)
}

/// The handle of a non-blocking call on the device `spec` names: bad input is the call's
/// error; a failure while queueing copies (already drained) comes from the handle, as a
/// failure of the copies themselves does.
fn handle<B>(
    r: Result<(B, Option<completion::Pending>)>,
    spec: &DeviceSpec,
) -> Result<Transfer<B>> {
    match r {
        Ok((b, Some(p))) => Ok(Transfer::pending(b, p)),
        Ok((b, None)) => Ok(Transfer::ready(b)),
        // Dropped unwaited, the handle records a driver's failure for the device's next
        // call; not a staging slot's wait given up (contention, nothing failed: the
        // device's next call has no reason to fail for it).
        Err(e @ Error::Driver { .. }) => Ok(Transfer::failed(e, ordinal_of(spec))),
        Err(e @ Error::StagingExhausted { .. }) => Ok(Transfer::failed(e, None)),
        Err(e) => Err(e),
    }
}

/// The ordinal of the device `spec` names, as a call resolves it; `None` without a driver
/// or for a spec that names no device here. For recording an error no call returns
/// ([`crate::driver::deferred`]) where only the options are at hand.
fn ordinal_of(spec: &DeviceSpec) -> Option<usize> {
    let info = crate::driver::available()?;
    spec.resolve(info.device_count).ok().map(|d| d.ordinal())
}

/// [`transfer_tensor_d2h`] without waiting: returns once every copy is queued (after the
/// caller's current stream and the producer event, as the blocking call), with a
/// [`Transfer`] whose `wait()` / `.await` gives the host batch. Into page-locked outputs
/// (the default) nothing waits; into pageable outputs ([`HostOutput::Pageable`], or when
/// the output pool is full) host copies finish the batch after the device copies, so
/// that path completes inside the call and the handle is ready at once.
///
/// # Errors
/// Bad input, as [`transfer_tensor_d2h`] (before any copy). A failure of the driver or of
/// the staging arena, while queueing (then drained) or while the copies run, comes from
/// [`Transfer::wait`] / `.await`.
pub fn transfer_tensor_d2h_async<B: Batch>(batch: &B, opts: &D2hOptions) -> Result<Transfer<B>> {
    trace::start("d2h_async");
    let r = d2h::transfer(batch, opts, Mode::Async, d2h::Overlap::none());
    trace::end();
    handle(r, opts.device.as_ref().unwrap_or(&DeviceSpec::LocalRank))
}

/// Copies the tensors of `batch` that are on the chosen CUDA device to new host tensors
/// and returns the same structure with them in place.
///
/// * Device: [`D2hOptions::device`], or `cuda:{LOCAL_RANK}`.
/// * The copy stream waits for the work already queued on the caller's
///   [`current_stream`] (and for [`D2hOptions::producer_event`]), so tensors still being
///   produced there are copied once ready.
/// * Copies go into new host tensors: page-locked ones from a bounded, recycled pool by
///   default, or pageable ones through cached page-locked staging slots
///   ([`D2hOptions::output`], [`HostOutput`]). The call waits for the copy stream before
///   returning.
/// * Tensors on other devices, host tensors and non-tensor leaves pass through.
/// * No tensor in the input, or no CUDA: the input comes back as is, with no stream or
///   memory created.
///
/// ```
/// use pinlane::{transfer_tensor_d2h, D2hOptions, Error, Tensor};
/// let b = vec![Tensor::scalar(2.5f64)];
/// // A host-only batch passes through.
/// assert_eq!(transfer_tensor_d2h(&b, &D2hOptions::default()).unwrap(), b);
/// // "cpu" is not a CUDA device, on any machine.
/// let bad = D2hOptions::default().device("cpu");
/// assert!(matches!(transfer_tensor_d2h(&b, &bad), Err(Error::InvalidDevice { .. })));
/// ```
///
/// # Errors
/// [`Error::InvalidDevice`](crate::error::Error::InvalidDevice),
/// [`Error::StreamWithoutDevice`](crate::error::Error::StreamWithoutDevice),
/// [`Error::StreamDeviceMismatch`](crate::error::Error::StreamDeviceMismatch),
/// [`Error::EventDeviceMismatch`](crate::error::Error::EventDeviceMismatch),
/// [`Error::InvalidLocalRank`](crate::error::Error::InvalidLocalRank),
/// [`Error::DeviceUnavailable`](crate::error::Error::DeviceUnavailable) for bad options (before any
/// copy); [`Error::BytesInFlight`](crate::error::Error::BytesInFlight) for a source that an H2D
/// call's copies may still be writing (its output, inside that call: before any copy);
/// [`Error::StreamCapturing`](crate::error::Error::StreamCapturing) when a CUDA graph capture runs
/// on the copy stream given or on the current stream (before any copy);
/// [`Error::Deferred`](crate::error::Error::Deferred);
/// [`Error::StagingExhausted`](crate::error::Error::StagingExhausted); the driver's error
/// ([`Error::Driver`](crate::error::Error::Driver)) after draining what was queued. The input is never
/// changed.
pub fn transfer_tensor_d2h<B: Batch>(batch: &B, opts: &D2hOptions) -> Result<B> {
    trace::start("d2h");
    let r = d2h::transfer(batch, opts, Mode::Blocking, d2h::Overlap::none()).map(|(b, _)| b);
    trace::end();
    r
}

/// [`transfer_tensor_d2h`], calling `while_copying` on the host batch once the copies
/// into page-locked outputs are queued and before the call waits for them, so that work
/// on the outputs that needs no bytes overlaps the copies: a binding handing them to its
/// framework ([`Tensor::to_dlpack_in_flight`](crate::Tensor::to_dlpack_in_flight)), say.
///
/// * Page-locked outputs' bytes cannot be read in it: reads get
///   [`Error::BytesInFlight`](crate::error::Error::BytesInFlight).
/// * `while_copying` runs once in every successful call, on the finished batch where
///   nothing is left to overlap (pageable outputs, or a batch that passes through), and
///   its result comes back beside the batch. If the call fails after it ran, its result
///   is dropped inside the call, on the calling thread; pinlane keeps the outputs' memory
///   until the copies have let go of it.
/// * It runs on the calling thread, with the device's context current (pinlane's own
///   calls bind it again as they need). A panic in it unwinds out of the call: nothing is
///   freed while a copy may still use it; the unwinding waits for the stream up to
///   `Config::drop_sync_wait`, retaining what it cannot prove idle (the outputs' memory
///   and the sources the copies read).
///
/// ```
/// use pinlane::{transfer_tensor_d2h_overlapping, D2hOptions, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let b = vec![Tensor::scalar(2.5f64)];
/// // A host-only batch passes through; `while_copying` still runs, on it.
/// let (out, n) = transfer_tensor_d2h_overlapping(&b, &D2hOptions::default(), |out| out.len())?;
/// assert_eq!((out, n), (b, 1));
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`transfer_tensor_d2h`].
pub fn transfer_tensor_d2h_overlapping<B: Batch, R>(
    batch: &B,
    opts: &D2hOptions,
    while_copying: impl FnOnce(&B) -> R,
) -> Result<(B, R)> {
    transfer_tensor_d2h_overlapping_around(batch, opts, while_copying, |wait| wait())
}

/// [`transfer_tensor_d2h_overlapping`], with the part of the call that may block on the
/// device run inside `around_wait`: a binding that holds its interpreter's lock through a
/// small call (so that another thread cannot keep it from the caller for a switch
/// interval) lets go of it there, and only there.
///
/// * `around_wait` is given that part and runs it on the calling thread. It is called at
///   most once, and only if the call comes to such a part: the wait in the driver for the
///   copies into page-locked outputs, after `while_copying` (when there is no end flag,
///   or it is not seen within `Config::spin`); the drain of a call that failed while or
///   after queueing its copies; or, for pageable outputs (asked for, or no page-locked
///   block for the batch: the output pool at its cap, or the host out of page-locked
///   memory), the whole copy through staging slots, which
///   waits for slots and copies along the way. A call that sees its end flag, or fails
///   before its copies start (bad options, the stream or event setup, the output
///   block), does not call it.
/// * The part runs once whatever `around_wait` does: called again it does nothing; not
///   called at all, it runs once `around_wait` has returned. It runs none of the call's
///   caller code: no `Batch` method, not `while_copying`. (Owners that an earlier failed
///   call left in pinlane's keeping may be dropped there once their stream is proven
///   idle, and a `tracing` subscriber sees its phase marks.) A panic in `around_wait`
///   unwinds out of the call as one in `while_copying` does.
/// * Outside it: the first call on a thread (its stream, the device's context, pinlane's
///   runtime), a new block of page-locked outputs (`cuMemHostAlloc`), and, for four or
///   more small tensors (up to 1 MiB each) into page-locked outputs, the wait for the
///   staging slot they are gathered through may take milliseconds.
///
/// ```
/// use pinlane::{transfer_tensor_d2h_overlapping_around, D2hOptions, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let b = vec![Tensor::scalar(2.5f64)];
/// let mut waits = 0;
/// let (out, ()) = transfer_tensor_d2h_overlapping_around(
///     &b,
///     &D2hOptions::default(),
///     |_| (),
///     |wait| {
///         waits += 1;
///         wait()
///     },
/// )?;
/// // A host-only batch passes through: no copy, no wait.
/// assert_eq!((out, waits), (b, 0));
/// # Ok(()) }
/// ```
///
/// # Errors
/// As [`transfer_tensor_d2h`].
pub fn transfer_tensor_d2h_overlapping_around<B: Batch, R>(
    batch: &B,
    opts: &D2hOptions,
    while_copying: impl FnOnce(&B) -> R,
    mut around_wait: impl FnMut(&mut dyn FnMut()),
) -> Result<(B, R)> {
    let mut once = Once::new(while_copying);
    trace::start("d2h");
    let overlap = d2h::Overlap {
        while_copying: Some(&mut |b| once.run(b)),
        around_wait: Some(&mut around_wait),
    };
    let r = d2h::transfer(batch, opts, Mode::Blocking, overlap);
    trace::end();
    // Not run in the call (pageable outputs, or a batch that passed through): nothing was
    // left to overlap, it runs on the finished batch.
    once.finish(r?.0, "transfer_tensor_d2h_overlapping")
}

/// What the calling thread's last successful transfer did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TransferStats {
    /// Tensors moved.
    pub tensors: usize,
    /// Bytes moved.
    pub bytes: usize,
    /// Bytes that went through staging slots.
    pub staged_bytes: usize,
    /// Bytes copied straight from page-locked sources (H2D), or gathered on the device
    /// before their copy (D2H).
    pub direct_bytes: usize,
    /// Bytes a kernel read straight from page-locked host sources (H2D,
    /// [`SmallH2d::Kernel`](crate::config::SmallH2d::Kernel)).
    pub mapped_bytes: usize,
    /// Copy submissions (`cuMemcpy*Async` calls).
    pub copies: usize,
    /// Staging windows used.
    pub windows: usize,
}

thread_local! {
    static LAST: Cell<Option<TransferStats>> = const { Cell::new(None) };
}

/// What every queueing step of one call needs: the device's context made current, the
/// device, and the call's statistics as they are counted.
struct Call<'a> {
    ctx: &'a ContextGuard,
    device: usize,
    /// The runtime the call started with: its pools and settings for every step.
    rt: &'a crate::runtime::Runtime,
    stats: TransferStats,
    /// The stream whose earlier calls of this thread give their staging slots back when
    /// the call finds no slot free ([`completion::reap`]): set by copies into existing
    /// tensors, which otherwise release them after queueing their own copies.
    reap: Option<(usize, usize)>,
}

impl<'a> Call<'a> {
    /// A call moving `tensors` tensors of `bytes` bytes in all.
    fn new(
        ctx: &'a ContextGuard,
        device: usize,
        rt: &'a crate::runtime::Runtime,
        tensors: usize,
        bytes: usize,
    ) -> Call<'a> {
        Call {
            ctx,
            device,
            rt,
            stats: TransferStats {
                tensors,
                bytes,
                ..TransferStats::default()
            },
            reap: None,
        }
    }
}

fn record_stats(s: TransferStats) {
    let _ = LAST.try_with(|c| c.set(Some(s)));
}

/// The calling thread's last successful transfer's [`TransferStats`], if it moved any
/// tensor.
pub fn last_transfer_stats() -> Option<TransferStats> {
    LAST.try_with(Cell::get).ok().flatten()
}

/// What a call's owners keep of its H2D sources: clones of the page-locked ones, which
/// the device may still read after the call (copied straight, or read in place by the
/// kernel). Pageable sources are read only by the host fills into staging slots, which
/// `InFlight` settles before it records, keeps or retains anything.
fn device_read_sources<'a>(
    sources: impl IntoIterator<Item = &'a crate::tensor::Tensor>,
) -> Vec<crate::tensor::Tensor> {
    sources
        .into_iter()
        .filter(|t| matches!(t.storage(), crate::tensor::Storage::Pinned(_)))
        .cloned()
        .collect()
}

/// Leases staging slots into `job` for `n_windows` windows: the first may block until
/// another call returns one; more (up to [`Config::pipeline_slots`](crate::config::Config::pipeline_slots):
/// by default 8, enough to keep several windows' copies queued while the host fills the
/// next, leaving half of the default arena to a transfer in the other direction) only if
/// free. Returns how many the job holds (at least one).
fn lease_slots(call: &Call, job: &mut InFlight, n_windows: usize) -> Result<usize> {
    let arena = &call.rt.arena;
    let pipeline_slots = call.rt.settings().pipeline_slots;
    if job.leases.is_empty() {
        let first = match call.reap {
            // No slot free: the thread's done calls on the stream give theirs back first
            // (a one-slot arena's is the last step's), rather than this call waiting.
            Some(key) => match arena.lease(call.ctx, false)? {
                Some(l) => Some(l),
                None => {
                    completion::reap(key);
                    arena.lease(call.ctx, true)?
                }
            },
            None => arena.lease(call.ctx, true)?,
        };
        if let Some(first) = first {
            job.leases.push(first);
        }
    }
    while job.leases.len() < pipeline_slots.min(n_windows) {
        match arena.lease(call.ctx, false)? {
            Some(l) => job.leases.push(l),
            None => break,
        }
    }
    // A waiting lease always returns a slot, so this holds; callers divide by it.
    debug_assert!(!job.leases.is_empty());
    Ok(job.leases.len().max(1))
}

/// How many tensors [`rebuild_with`] places between two calls of its `tick` (a tick that
/// finds no fill finished is one atomic load; 1000 tensors take 30 to 50 us).
const TICK_EVERY: usize = 32;

/// Rebuilds `batch`, whose tensors in visit order are `all`, with the tensors at visit
/// indices `indices` replaced by `outputs`, in that order; the others are kept (cloned).
/// When every tensor is replaced in visit order (the usual case), the outputs are taken
/// one by one as the batch is rebuilt (a lazy `outputs` is made then too), with no list
/// of `Option`s in between.
///
/// The `Batch` contract is checked on the way: `rebuild` must hand over, one by one, the
/// tensors `visit` gave, in the same order (the same references, or at least the same
/// storage, dtype and shape). A hand-written implementation that skips, adds or reorders
/// a tensor gets [`Error::BatchMismatch`] instead of a batch with tensors in the wrong
/// places.
///
/// `tick` is called after every [`TICK_EVERY`] tensors the rebuild places (and every
/// [`TICK_EVERY`] outputs taken ahead of it, when the order is not the visit order): H2D
/// queues the staging windows filled meanwhile there.
fn rebuild_with<B: Batch>(
    batch: &B,
    all: &[&crate::tensor::Tensor],
    indices: &[usize],
    mut outputs: impl Iterator<Item = crate::tensor::Tensor>,
    tick: &mut dyn FnMut(),
) -> Result<B> {
    let mut made = 0usize;
    let mut step = || {
        made += 1;
        if made.is_multiple_of(TICK_EVERY) {
            tick();
        }
    };
    let n = all.len();
    let mut k = 0;
    let mut first_mismatch = None;
    let mut check = |orig: &crate::tensor::Tensor| {
        let same = all.get(k).is_some_and(|v| {
            std::ptr::eq(*v, orig)
                || (v.same_storage(orig) && v.dtype() == orig.dtype() && v.shape() == orig.shape())
        });
        if !same && first_mismatch.is_none() {
            first_mismatch = Some(k);
        }
        k += 1;
    };
    let rebuilt = if indices.len() == n && indices.iter().enumerate().all(|(k, &i)| k == i) {
        batch.rebuild(&mut |orig| {
            check(orig);
            step();
            outputs.next().unwrap_or_else(|| orig.clone())
        })
    } else {
        let mut new: Vec<Option<crate::tensor::Tensor>> = vec![None; n];
        for (&i, t) in indices.iter().zip(outputs) {
            step();
            if let Some(slot) = new.get_mut(i) {
                *slot = Some(t);
            }
        }
        let mut it = new.into_iter();
        batch.rebuild(&mut |orig| {
            check(orig);
            step();
            it.next().flatten().unwrap_or_else(|| orig.clone())
        })
    };
    if k != n || first_mismatch.is_some() {
        return Err(Error::BatchMismatch {
            visited: n,
            rebuilt: k,
            first_mismatch,
        });
    }
    Ok(rebuilt)
}

#[cfg(test)]
mod tests {
    use super::rebuild_with;
    use crate::{Batch, Error, Tensor};

    fn t(v: u8) -> Tensor {
        Tensor::scalar(v)
    }

    #[test]
    fn rebuild_with_replaces_the_named_tensors_in_any_order() {
        let b = vec![t(0), t(1), t(2)];
        let all = crate::batch::tensors(&b);
        // Every tensor, in visit order: the direct path.
        let every = rebuild_with(
            &b,
            &all,
            &[0, 1, 2],
            [t(10), t(11), t(12)].into_iter(),
            &mut || {},
        );
        assert_eq!(every, Ok(vec![t(10), t(11), t(12)]));
        // Every tensor, reordered (small ones first, as the D2H gather lays them out).
        let perm = rebuild_with(
            &b,
            &all,
            &[2, 0, 1],
            [t(12), t(10), t(11)].into_iter(),
            &mut || {},
        );
        assert_eq!(perm, Ok(vec![t(10), t(11), t(12)]));
        // Some tensors: the others are kept.
        let some = rebuild_with(&b, &all, &[2, 0], [t(12), t(10)].into_iter(), &mut || {});
        assert_eq!(some, Ok(vec![t(10), t(1), t(12)]));
        let none = rebuild_with(&b, &all, &[], std::iter::empty(), &mut || {});
        assert_eq!(none, Ok(b.clone()));
    }

    /// Visits `a` then `b`; rebuilds them in the other order, or skips `b` on the visit.
    struct Broken {
        a: Tensor,
        b: Tensor,
        skip_b: bool,
    }

    impl Batch for Broken {
        fn visit<'a>(&'a self, f: &mut dyn FnMut(&'a Tensor)) {
            f(&self.a);
            if !self.skip_b {
                f(&self.b);
            }
        }
        fn rebuild(&self, f: &mut dyn FnMut(&Tensor) -> Tensor) -> Self {
            let b = f(&self.b);
            let a = f(&self.a);
            Broken {
                a,
                b,
                skip_b: self.skip_b,
            }
        }
    }

    #[test]
    fn a_rebuild_that_disagrees_with_its_visit_is_an_error() {
        let x = Tensor::from_vec(vec![1u8; 6], [2, 3]).unwrap();
        let y = Tensor::from_vec(vec![2i64; 4], [4]).unwrap();
        for skip_b in [false, true] {
            let broken = Broken {
                a: x.clone(),
                b: y.clone(),
                skip_b,
            };
            let all = crate::batch::tensors(&broken);
            let outs = all.iter().map(|&t| t.clone());
            let r = rebuild_with(
                &broken,
                &all,
                &(0..all.len()).collect::<Vec<_>>(),
                outs,
                &mut || {},
            );
            let want = Error::BatchMismatch {
                visited: if skip_b { 1 } else { 2 },
                rebuilt: 2,
                first_mismatch: Some(0),
            };
            assert_eq!(r.err(), Some(want));
        }
    }
}
