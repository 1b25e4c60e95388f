//! End flags: a stream writes a word of page-locked memory once the work queued before
//! the write has finished (`cuStreamWriteValue32`), and the calling thread spins on the
//! word instead of waiting in `cuStreamSynchronize`. On the H200 a 1 KiB copy ended that
//! way 0.3 to 0.9 us sooner than with the driver's wait (`benches/probes/wait_floor.cu`,
//! docs/performance-log.md, session 44).
//!
//! The call is not in the CUDA 11.4 header set pinlane binds; CUDA 11.7 and later have it
//! as `cuStreamWriteValue32_v2`, looked up by hand when first needed (the first version
//! needs a device attribute the H200 does not set). Without it, [`available`] is false
//! and callers wait in the driver. The simulated device answers it too.

use super::{check, fault_point, ContextGuard, FaultKindTag, Stream};
use crate::error::Result;
use cudarc::driver::sys;
use std::ffi::c_uint;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

type WriteValue =
    unsafe extern "C" fn(sys::CUstream, sys::CUdeviceptr, u32, c_uint) -> sys::CUresult;

/// Set when the driver refused a write as such ([`refuses`]): later calls wait in the
/// driver, which reports a stream's own errors.
static REFUSED: AtomicBool = AtomicBool::new(false);

/// Whether a failed write means the driver will not take end flags at all: the call or
/// its arguments are unsupported. Any other error (a context's sticky fault, no memory,
/// a stream being captured) belongs to one call or one device, and turning flags off
/// for every device of the process on it would slow them all for good.
fn refuses(res: sys::CUresult) -> bool {
    use sys::CUresult::*;
    matches!(res, CUDA_ERROR_NOT_SUPPORTED | CUDA_ERROR_INVALID_VALUE)
}

fn entry() -> Option<WriteValue> {
    static E: OnceLock<Option<WriteValue>> = OnceLock::new();
    *E.get_or_init(|| {
        super::available()?;
        #[cfg(feature = "sim")]
        if super::simulated() {
            return Some(simulated as WriteValue);
        }
        // SAFETY: the library is loaded (available() checked it); `get` only resolves an
        // address, and the type matches the CUDA 11.7+ prototype of the `_v2` entry.
        unsafe {
            sys::culib()
                .get::<WriteValue>(b"cuStreamWriteValue32_v2")
                .ok()
                .map(|f| *f)
        }
    })
}

/// The simulated device's `cuStreamWriteValue32`.
#[cfg(feature = "sim")]
unsafe extern "C" fn simulated(
    s: sys::CUstream,
    addr: sys::CUdeviceptr,
    value: u32,
    flags: c_uint,
) -> sys::CUresult {
    match super::sim::active() {
        // SAFETY: the caller's contract is the driver call's; the simulator keeps it.
        Some(sim) => unsafe { sim.cuStreamWriteValue32(s, addr, value, flags) },
        None => sys::CUresult::CUDA_ERROR_NOT_INITIALIZED,
    }
}

/// Whether end flags can be used: the driver has the write, and has not refused it.
pub(crate) fn available() -> bool {
    entry().is_some() && !REFUSED.load(Ordering::Relaxed)
}

/// Queues on `stream`, after everything queued there so far, the write of `value` into
/// the word at `word`, with a memory barrier: once the word holds `value`, the queued
/// work's writes to host memory are visible. `Ok(false)` when end flags are not
/// available (nothing queued). `ctx` is the stream's device's context, current (checked).
///
/// # Safety
/// `word` is 4-byte aligned page-locked host memory from `cuMemHostAlloc`, readable by
/// `stream`'s device at its host address ([`host_memory_mapped`](super::host_memory_mapped)),
/// that stays allocated until the write is proven done (the stream synchronised, or the
/// word seen to hold `value`), and that nothing else writes meanwhile.
pub(crate) unsafe fn queue_write(
    ctx: &ContextGuard,
    stream: &Stream,
    word: *mut u32,
    value: u32,
) -> Result<bool> {
    fault_point(FaultKindTag::FlagWrite, "cuStreamWriteValue32")?;
    let Some(write) = entry().filter(|_| !REFUSED.load(Ordering::Relaxed)) else {
        return Ok(false);
    };
    ctx.check("cuStreamWriteValue32", stream.device().ordinal())?;
    // SAFETY: the stream is alive (borrowed) and its context current; `word` is the
    // caller's obligation; flags 0 is the default write, ordered after prior work with a
    // memory barrier.
    let res = unsafe { write(stream.raw(), word as sys::CUdeviceptr, value, 0) };
    if refuses(res) {
        // Not retried on every call: the driver's wait is as correct, a little slower.
        REFUSED.store(true, Ordering::Relaxed);
    }
    check("cuStreamWriteValue32", res).map(|()| true)
}

/// Whether the waits of this thread must go to the driver: a test armed a fault of the
/// driver's wait (feature `test-util`), which fires there, once per wait.
pub(crate) fn wait_fault_armed() -> bool {
    #[cfg(feature = "test-util")]
    {
        super::fault::armed_for(super::fault::FaultKind::StreamSync)
    }
    #[cfg(not(feature = "test-util"))]
    {
        false
    }
}

/// Spins until the word at `word` holds `value`, for at most `limit`: whether it did.
/// Once it returns `true`, host reads of what the flagged work wrote see it.
///
/// # Safety
/// `word` is 4-byte aligned memory that stays allocated for the call; meanwhile only the
/// device (or the simulated device's thread, atomically) writes it.
pub(crate) unsafe fn spin_until(word: *mut u32, value: u32, limit: Duration) -> bool {
    // SAFETY: aligned and allocated for the call, and written only atomically (by the
    // device, or the simulator's atomic store) meanwhile: the caller's obligations.
    let word = unsafe { std::sync::atomic::AtomicU32::from_ptr(word) };
    // Acquire: reads of the flagged work's bytes come after the load that saw it.
    let seen = || word.load(Ordering::Acquire) == value;
    let started = Instant::now();
    loop {
        for _ in 0..16 {
            if seen() {
                return true;
            }
            std::hint::spin_loop();
        }
        if started.elapsed() >= limit {
            return false;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{refuses, spin_until};
    use cudarc::driver::sys::CUresult;
    use std::time::Duration;

    #[test]
    fn only_an_unsupported_write_turns_end_flags_off() {
        assert!(refuses(CUresult::CUDA_ERROR_NOT_SUPPORTED));
        assert!(refuses(CUresult::CUDA_ERROR_INVALID_VALUE));
        // One device's sticky fault, or a passing shortage, keeps flags for the others.
        assert!(!refuses(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS));
        assert!(!refuses(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
        assert!(!refuses(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
    }

    #[test]
    fn the_spin_sees_a_word_set_by_another_thread_and_gives_up_on_one_never_set() {
        let word = std::sync::atomic::AtomicU32::new(0);
        let at = word.as_ptr();
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(Duration::from_millis(2));
                word.store(7, std::sync::atomic::Ordering::Release);
            });
            // SAFETY: `at` points into `word`, alive for the scope.
            assert!(unsafe { spin_until(at, 7, Duration::from_secs(10)) });
        });
        let t0 = std::time::Instant::now();
        // SAFETY: as above.
        assert!(!unsafe { spin_until(at, 8, Duration::from_millis(3)) });
        assert!(t0.elapsed() >= Duration::from_millis(3));
    }
}
