//! The driver layer: the only place that calls CUDA.
//!
//! pinlane uses `cudarc`'s raw `sys` bindings with `dynamic-loading`: `libcuda` is opened
//! when first needed, never linked, so a pinlane binary starts (and passes batches through
//! unchanged) on a machine with no driver at all. cudarc panics if a driver symbol is
//! called without the library, so every entry point first asks [`available`], which is
//! computed once: library present, every symbol pinlane calls resolvable, `cuInit`
//! succeeded, at least one device.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`available`], the checked-call helper, raw handle wrappers |
//! | `api.rs` | the raw entry points: `libcuda`'s, or (feature `sim`) a table chosen once |
//! | `sim/` | the simulated device (`sim::enable`, feature `sim`), split by concern |
//! | `context.rs` | primary contexts, one per device, and the guard that makes one current |
//! | `devices.rs` | `Device::from_local_rank` and `Device::all`: the devices the driver sees |
//! | `stream.rs` | [`Stream`]: an owned (or borrowed legacy) `CUstream` |
//! | `event.rs` | [`Event`]: an owned `CUevent` |
//! | `calls.rs` | memory and copy calls: one checked `unsafe fn` per driver call |
//! | `batch_copy.rs` | `cuMemcpyBatchAsync`, looked up by hand (CUDA 12.8+) |
//! | `stream_id.rs` | `cuStreamGetId`, looked up by hand (CUDA 12.0+): a stream's id for the process's life |
//! | `flag.rs` | end flags: `cuStreamWriteValue32`, looked up by hand (CUDA 11.7+), and the spin on its word |
//! | `kernels.rs` | the committed PTX kernels, loaded once per device, and their launches |
//! | `deferred.rs` | errors raised in `Drop`, kept for the next call |
//! | `fork.rs` | a child forked after CUDA was set up: refused with [`Error::ForkedChild`] |
//! | `fault.rs` | fault injection, feature `test-util` only |

mod api;
mod batch_copy;
mod calls;
mod context;
pub mod deferred;
mod devices;
pub(crate) mod error;
mod event;
#[cfg(feature = "test-util")]
pub mod fault;
pub(crate) mod flag;
pub(crate) mod fork;
mod guard;
mod kernels;
#[cfg(feature = "nvtx")]
pub(crate) mod nvtx;
#[cfg(feature = "sim")]
pub mod sim;
mod stream;
pub(crate) mod stream_id;

pub(crate) use batch_copy::{
    available as batch_copy_available, memcpy_batch_d2h_async, memcpy_batch_h2d_async,
};
pub(crate) use calls::*;
pub use context::gather_unavailable_reason;
pub(crate) use context::{
    apply_pool_release_threshold, bind, context_made, device_pool_stats, device_room,
    gather_kernel, host_memory_mapped, pool_release_threshold, set_pool_release_threshold,
    trim_device_pools, warm_up,
};
pub use error::DriverError;
pub use event::{Event, RawEvent};
pub(crate) use guard::ContextGuard;
/// The gather kernel's PTX as pinlane embeds it (feature `test-util`: checked against a
/// rebuild by the kernel tests).
#[cfg(feature = "test-util")]
pub use kernels::GATHER_PTX;
pub(crate) use kernels::{launch_gather, GatherKernel, GatherPiece, INLINE_MAX};
#[cfg(feature = "nvtx")]
pub use nvtx::nvtx_loaded;
pub use stream::{RawStream, Stream};

use crate::error::{Error, Result};
use cudarc::driver::sys;
use std::sync::OnceLock;

/// What [`available`] found: the driver's version and how many devices it sees.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DriverInfo {
    /// `cuDriverGetVersion`, e.g. 13000 for CUDA 13.0; 0 for the simulated device.
    pub version: i32,
    /// Number of CUDA devices.
    pub device_count: usize,
}

/// Every driver symbol pinlane calls. Checked once so that an old driver is reported as
/// "not usable" instead of cudarc panicking on a missing symbol mid-transfer.
const REQUIRED_SYMBOLS: &[&str] = &[
    "cuInit",
    "cuDriverGetVersion",
    "cuDeviceGetCount",
    "cuDeviceGet",
    "cuDeviceGetAttribute",
    "cuDevicePrimaryCtxRetain",
    "cuDevicePrimaryCtxRelease_v2",
    "cuCtxGetCurrent",
    "cuCtxPushCurrent_v2",
    "cuCtxPopCurrent_v2",
    "cuGetErrorName",
    "cuStreamCreate",
    "cuStreamDestroy_v2",
    "cuStreamSynchronize",
    "cuStreamGetCtx",
    "cuStreamWaitEvent",
    "cuLaunchHostFunc",
    "cuEventCreate",
    "cuEventDestroy_v2",
    "cuEventRecord",
    "cuEventSynchronize",
    "cuEventQuery",
    "cuMemHostAlloc",
    "cuMemFreeHost",
    "cuMemHostRegister_v2",
    "cuMemHostUnregister",
    "cuMemPoolCreate",
    "cuMemPoolDestroy",
    "cuMemPoolSetAttribute",
    "cuMemPoolGetAttribute",
    "cuMemPoolTrimTo",
    "cuMemAllocFromPoolAsync",
    "cuMemFreeAsync",
    "cuMemcpyHtoDAsync_v2",
    "cuMemcpyDtoHAsync_v2",
    "cuMemGetInfo_v2",
    "cuStreamIsCapturing",
    "cuPointerGetAttributes",
    "cuModuleLoadData",
    "cuModuleGetFunction",
    "cuLaunchKernel",
];

static STATUS: OnceLock<std::result::Result<DriverInfo, String>> = OnceLock::new();

/// Whether a usable CUDA driver with at least one device is present; computed once.
///
/// ```
/// match pinlane::driver::available() {
///     Some(info) => println!("{} CUDA device(s)", info.device_count),
///     None => println!("no CUDA: {}", pinlane::driver::unavailable_reason().unwrap()),
/// }
/// ```
pub fn available() -> Option<&'static DriverInfo> {
    probe().as_ref().ok()
}

/// Why CUDA is not usable, when [`available`] is `None`.
pub fn unavailable_reason() -> Option<&'static str> {
    probe().as_ref().err().map(String::as_str)
}

/// When a wait of `limit` from now ends: `limit` capped at about 35,000 years, so that a
/// caller's `Duration::MAX` ("no bound") cannot overflow the clock (`Instant + Duration`
/// panics past its range).
pub(crate) fn deadline_after(limit: std::time::Duration) -> std::time::Instant {
    const FOREVER: std::time::Duration = std::time::Duration::from_secs(1 << 40);
    std::time::Instant::now() + limit.min(FOREVER)
}

/// [`available`], or an [`Error::NoCuda`] naming `op`.
pub(crate) fn require(op: &'static str) -> Result<&'static DriverInfo> {
    fork::check(op)?;
    probe().as_ref().map_err(|reason| Error::NoCuda {
        op,
        reason: reason.clone(),
    })
}

/// Whether this process uses the simulated device (never without feature `sim`).
pub(crate) fn simulated() -> bool {
    #[cfg(feature = "sim")]
    {
        sim::is_enabled()
    }
    #[cfg(not(feature = "sim"))]
    {
        false
    }
}

/// Whether the driver status was computed (after which the device cannot be switched to
/// the simulator, and asking [`available`] loads nothing).
pub(crate) fn probed() -> bool {
    STATUS.get().is_some()
}

fn probe() -> &'static std::result::Result<DriverInfo, String> {
    if fork::marked() {
        if let Some(status) = STATUS.get() {
            return status;
        }
        // Forked while the parent's set-up ran: `STATUS` stays mid-initialisation here
        // for ever (the thread running it is the parent's), so it is not waited on.
        static MIDWAY: OnceLock<std::result::Result<DriverInfo, String>> = OnceLock::new();
        return MIDWAY
            .get_or_init(|| Err("this process was forked while its parent set CUDA up".into()));
    }
    // From here on the process may have driver state a forked child cannot use: watched
    // before `STATUS` is marked as being set up, so that no child forked while it is can
    // go unmarked (it would wait for ever for a set-up whose thread is not in it: session
    // 87, after a review; inside `get_or_init` a window was left before the watch).
    if STATUS.get().is_none() {
        fork::watch();
    }
    let status = STATUS.get_or_init(set_up);
    if status.is_err() {
        // No driver state: children need not be refused (one forked since is, and finds
        // no driver either).
        fork::unwatch();
    }
    status
}

/// The driver's status, computed once by [`probe`].
fn set_up() -> std::result::Result<DriverInfo, String> {
    #[cfg(feature = "sim")]
    {
        let simulated = sim::active();
        api::select(simulated.is_some());
        if let Some(s) = simulated {
            std::thread::sleep(s.set_up_delay());
            return Ok(DriverInfo {
                version: 0,
                device_count: s.devices(),
            });
        }
    }
    // SAFETY: is_culib_present only tries to dlopen the library names; no symbol is
    // called.
    if !unsafe { sys::is_culib_present() } {
        return Err("libcuda could not be loaded".into());
    }
    // SAFETY: the library is present (checked above), so culib() returns it instead
    // of panicking; `get` only resolves a symbol, it calls nothing.
    let lib = unsafe { sys::culib() };
    for name in REQUIRED_SYMBOLS {
        // SAFETY: resolving a symbol's address; the pointer is never called here.
        if unsafe { lib.get::<*const ()>(name.as_bytes()) }.is_err() {
            return Err(format!("the driver lacks {name} (too old?)"));
        }
    }
    // SAFETY: every symbol called below was resolved above; cuInit takes flags 0.
    unsafe { check("cuInit", api::cuInit(0)) }.map_err(|e| e.to_string())?;
    let mut version = 0;
    // SAFETY: out-pointer to a live local.
    unsafe { check("cuDriverGetVersion", api::cuDriverGetVersion(&mut version)) }
        .map_err(|e| e.to_string())?;
    let mut count = 0;
    // SAFETY: out-pointer to a live local; cuInit succeeded.
    unsafe { check("cuDeviceGetCount", api::cuDeviceGetCount(&mut count)) }
        .map_err(|e| e.to_string())?;
    if count <= 0 {
        return Err("the driver sees no CUDA device".into());
    }
    Ok(DriverInfo {
        version,
        device_count: count as usize,
    })
}

/// Free and total memory of `device`, in bytes (`cuMemGetInfo`).
///
/// ```no_run
/// let (free, total) = pinlane::driver::device_memory_info(pinlane::Device::cuda(0)).unwrap();
/// assert!(free <= total);
/// ```
///
/// # Errors
/// [`Error::NoCuda`], [`Error::DeviceUnavailable`], or the driver's error.
pub fn device_memory_info(device: crate::device::Device) -> Result<(usize, usize)> {
    require("device_memory_info")?;
    let _ctx = bind(device.ordinal())?;
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: out-pointers to live locals; the device's context is current.
    unsafe { check("cuMemGetInfo", api::cuMemGetInfo_v2(&mut free, &mut total)) }?;
    Ok((free, total))
}

/// Fails with an injected fault if one is armed for `kind` (feature `test-util`);
/// otherwise, and in normal builds, does nothing.
#[inline]
pub(crate) fn fault_point(
    #[allow(unused_variables)] kind: FaultKindTag,
    #[allow(unused_variables)] op: &'static str,
) -> Result<()> {
    #[cfg(feature = "test-util")]
    {
        let k = match kind {
            FaultKindTag::Alloc => fault::FaultKind::Alloc,
            FaultKindTag::Copy => fault::FaultKind::Copy,
            FaultKindTag::EventRecord => fault::FaultKind::EventRecord,
            FaultKindTag::StreamSync => fault::FaultKind::StreamSync,
            FaultKindTag::FlagWrite => fault::FaultKind::FlagWrite,
            FaultKindTag::ThreadStart => fault::FaultKind::ThreadStart,
            FaultKindTag::KeepBlock => fault::FaultKind::KeepBlock,
            FaultKindTag::HostAlloc => fault::FaultKind::HostAlloc,
            FaultKindTag::Free => fault::FaultKind::Free,
            FaultKindTag::PoolAttribute => fault::FaultKind::PoolAttribute,
        };
        fault::hit(k, op)?;
    }
    Ok(())
}

/// The call kinds that [`fault_point`] guards (mirrors `fault::FaultKind`, which exists
/// only with `test-util`).
#[derive(Clone, Copy)]
pub(crate) enum FaultKindTag {
    Alloc,
    Copy,
    EventRecord,
    StreamSync,
    FlagWrite,
    ThreadStart,
    KeepBlock,
    HostAlloc,
    Free,
    PoolAttribute,
}

/// Checks a device index against the device count.
pub(crate) fn check_device(index: usize) -> Result<()> {
    let info = require("device")?;
    if index < info.device_count {
        Ok(())
    } else {
        Err(Error::DeviceUnavailable {
            device: crate::device::Device::cuda(index),
            device_count: info.device_count,
        })
    }
}

/// Turns a `CUresult` into pinlane's error, naming the call.
///
/// The single funnel for driver results: every checked call in this layer goes through it.
pub(crate) fn check(op: &'static str, res: sys::CUresult) -> Result<()> {
    if res == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    Err(driver_error(op, res))
}

fn driver_error(op: &'static str, res: sys::CUresult) -> Error {
    let mut name_ptr: *const std::ffi::c_char = std::ptr::null();
    // SAFETY: cuGetErrorName only writes a pointer to a static string (or fails); it is
    // reached only after `probe` resolved the symbol, since every caller of `check`
    // runs behind `available()`.
    let named = unsafe { api::cuGetErrorName(res, &mut name_ptr) };
    let name = if named == sys::CUresult::CUDA_SUCCESS && !name_ptr.is_null() {
        // SAFETY: the driver returned a pointer to a NUL-terminated string that is static
        // (it lives in the driver library, which stays loaded for the process's life).
        unsafe { std::ffi::CStr::from_ptr::<'static>(name_ptr) }
            .to_str()
            .ok()
    } else {
        None
    };
    Error::Driver {
        op,
        error: DriverError::from_result(res, name),
    }
}

/// A raw driver handle that may be sent between threads: only for the types that
/// implement [`DriverHandle`].
///
/// CUDA driver handles (contexts, streams, events, pools, functions) are process-wide
/// values that the driver lets any thread use; the raw pointer types are only `!Send`
/// because they are pointers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Handle<T: DriverHandle>(pub(crate) T);

/// The opaque driver handle types a [`Handle`] may hold.
///
/// # Safety
/// Values of the type are tokens the driver lets any thread pass to it; they are never
/// dereferenced by pinlane.
pub(crate) unsafe trait DriverHandle: Copy {}

// SAFETY: each is an opaque driver handle (see the trait); the driver API is thread-safe
// for all of them.
unsafe impl DriverHandle for sys::CUcontext {}
// SAFETY: as above.
unsafe impl DriverHandle for sys::CUstream {}
// SAFETY: as above.
unsafe impl DriverHandle for sys::CUevent {}
// SAFETY: as above.
unsafe impl DriverHandle for sys::CUmemoryPool {}
// SAFETY: as above.
unsafe impl DriverHandle for sys::CUfunction {}

// SAFETY: `T: DriverHandle` is a token any thread may use (the trait's contract).
unsafe impl<T: DriverHandle> Send for Handle<T> {}
// SAFETY: as above; a handle is an opaque value that is only passed to the driver.
unsafe impl<T: DriverHandle> Sync for Handle<T> {}

/// The address of host memory that an owner in the memory layer (a staging slab, a
/// page-locked block, a simulated region) allocated and governs.
///
/// Sending the address is safe because every access to the bytes goes through that
/// owner's rules (exclusive leases, immutable views after completed copies, events): the
/// address alone grants nothing, and the owner's own `Send`/`Sync` follow from it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct HostPtr<T>(pub(crate) *mut T);

// SAFETY: see the type's docs: the owner that holds the address decides who touches the
// bytes, and it allows that only under its own synchronisation.
unsafe impl<T> Send for HostPtr<T> {}
// SAFETY: as above; shared references to a HostPtr only copy the address.
unsafe impl<T> Sync for HostPtr<T> {}
