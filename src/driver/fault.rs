//! Fault injection for tests (feature `test-util` only): makes the Nth driver call of a
//! kind fail on the calling thread, so the failure rules can be proven on the real device.
//!
//! The injected call is not made: the checked wrapper returns
//! [`Error::Driver`] with the name `INJECTED_FAULT` instead of
//! calling the driver (`CUDA_ERROR_OUT_OF_MEMORY` for [`FaultKind::HostAlloc`]), so an
//! injected allocation leaks nothing and an injected copy moves nothing. Plans are per
//! thread, so tests running in parallel do not see each other's.

use crate::error::Error;
use std::cell::RefCell;

/// The kinds of driver call a fault can be injected into. Non-exhaustive: kinds are added
/// as pinlane's calls gain driver steps (`KeepBlock` in session 73), so a `match` on it
/// needs a wildcard arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultKind {
    /// `cuMemAllocFromPoolAsync`.
    Alloc,
    /// `cuMemcpyHtoDAsync` / `cuMemcpyDtoHAsync`.
    Copy,
    /// `cuEventRecord`.
    EventRecord,
    /// `cuStreamSynchronize`, or the spin on an end flag that takes its place at the end
    /// of a blocking call.
    StreamSync,
    /// `cuStreamWriteValue32`: queuing an end flag's write (the call then waits in the
    /// driver instead).
    FlagWrite,
    /// Starting pinlane's completion thread (the first non-blocking call's, or the first
    /// after a shutdown), which then fails as `std::thread::Builder::spawn` can.
    ThreadStart,
    /// `cuEventRecord` on an H2D output's consumer stream when its dropped device block is
    /// kept for the next outputs (`Config::small_device_blocks`). Apart from
    /// [`FaultKind::EventRecord`]: a failure there frees the block instead, as one not
    /// kept, and leaves no error for any call, so a sweep of a call's own faults (each
    /// must fail the call) leaves it out. It may fire inside a call: the cache ring drops
    /// the oldest batch there.
    KeepBlock,
    /// `cuMemHostAlloc`, failing as the driver does when the host can page-lock no more
    /// memory (`CUDA_ERROR_OUT_OF_MEMORY`, not the injected error of the others), for
    /// whatever block the thread allocates next: a D2H output block (the call then falls
    /// back to pageable outputs, so a sweep of a call's own faults leaves it out too), a
    /// staging slot, a `PinnedBufferMut`'s block, or a tensor's `to_pinned` block.
    HostAlloc,
    /// `cuMemFreeAsync` of device memory. The free is not made: the memory stays
    /// allocated for the rest of the process, as after a real failure (pinlane never
    /// frees memory a copy may still use, so a failed free leaks rather than retries).
    Free,
    /// `cuMemPoolSetAttribute`: setting the release threshold
    /// ([`Config::device_pool_release_bytes`](crate::config::Config::device_pool_release_bytes))
    /// on a device pool, when one is made or when a configuration is installed.
    PoolAttribute,
}

thread_local! {
    /// Armed faults: (kind, calls of that kind still to let through before failing).
    static PLAN: RefCell<Vec<(FaultKind, usize)>> = const { RefCell::new(Vec::new()) };
}

/// Makes the `nth` (1-based) next call of `kind` on this thread fail. Several faults may
/// be armed at once; each fires once.
pub fn inject(kind: FaultKind, nth: usize) {
    PLAN.with(|p| p.borrow_mut().push((kind, nth.max(1) - 1)));
}

/// Disarms every fault of this thread.
pub fn clear() {
    PLAN.with(|p| p.borrow_mut().clear());
}

/// Whether faults are still armed on this thread (one that never fired, say).
pub fn armed() -> bool {
    PLAN.with(|p| !p.borrow().is_empty())
}

/// Whether a fault of `kind` is armed on this thread (fired or not by the next call).
pub(crate) fn armed_for(kind: FaultKind) -> bool {
    PLAN.try_with(|p| p.borrow().iter().any(|(k, _)| *k == kind))
        .unwrap_or(false)
}

/// Called by the driver layer before a call of `kind`: the error to return instead of
/// calling, if a fault fires now.
pub(crate) fn hit(kind: FaultKind, op: &'static str) -> Result<(), Error> {
    let fire = PLAN
        .try_with(|p| {
            let mut plan = p.borrow_mut();
            let mut fire = false;
            plan.retain_mut(|(k, left)| {
                if *k != kind || fire {
                    return true;
                }
                if *left == 0 {
                    fire = true;
                    return false;
                }
                *left -= 1;
                true
            });
            fire
        })
        .unwrap_or(false);
    if fire {
        let error = match kind {
            FaultKind::HostAlloc => crate::driver::DriverError::from_code(
                cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY as u32,
            ),
            _ => crate::driver::DriverError::with_name(999, "INJECTED_FAULT"),
        };
        Err(Error::Driver { op, error })
    } else {
        Ok(())
    }
}
