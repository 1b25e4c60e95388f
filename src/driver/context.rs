//! Primary contexts and device memory pools, one of each per device, made once.
//!
//! pinlane uses each device's primary context (the one the CUDA runtime and PyTorch use),
//! retained once and never released once its handles are made: it lives as long as the
//! process (a set-up that fails part way gives its retain and pool back). Driver calls are
//! made with it current through a [`ContextGuard`], which pushes it only when another
//! context (or none) is current and pops it again, so a caller's own current context is
//! left as it was.
//!
//! Each device also gets one stream-ordered memory pool of pinlane's own. Its release
//! threshold ([`Config::device_pool_release_bytes`](crate::config::Config::device_pool_release_bytes))
//! says how much freed memory stays cached for reuse instead of going back to the driver
//! at the next synchronisation; [`trim_device_pools`] gives back all that backs no
//! allocation. It is pinlane's, not the device's default pool, so pinlane changes no
//! process-wide setting.
//!
//! And each device gets its gather kernel ([`gather_kernel`]), loaded right after its
//! context is made: loading a module waits for all work on the device, so it never
//! happens on a later transfer's path.

use super::guard::ContextGuard;
use super::kernels::{self, GatherKernel};
use super::{check, check_device, Handle};
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

/// The per-device handles made once.
#[derive(Clone, Copy)]
pub(crate) struct DeviceHandles {
    pub(crate) ctx: Handle<sys::CUcontext>,
    pub(crate) pool: Handle<sys::CUmemoryPool>,
    /// Whether kernels on the device can read page-locked host memory through its host
    /// address (see [`host_memory_mapped`]).
    pub(crate) host_mapped: bool,
}

/// One slot per device, set once on first use: every later read (each `bind`, so each
/// event query of a polling loop) is a lock-free load.
static DEVICES: OnceLock<Vec<DeviceSlot>> = OnceLock::new();

/// A device's handles and gather kernel, and the locks that serialise making them.
/// Creation is fallible (and tried again by the next call after a failure), so it is not
/// `OnceLock`'s `get_or_init`; each lock is taken only by threads that found nothing,
/// only around making it, and with no other pinlane lock held (making takes none).
#[derive(Default)]
struct DeviceSlot {
    handles: OnceLock<DeviceHandles>,
    creating: Mutex<()>,
    /// The kernel, or why it could not be loaded; set once (a failure is not retried).
    gather: OnceLock<std::result::Result<GatherKernel, String>>,
    loading: Mutex<()>,
}

fn slots() -> &'static [DeviceSlot] {
    DEVICES.get_or_init(|| {
        let n = super::available().map_or(0, |i| i.device_count);
        (0..n).map(|_| DeviceSlot::default()).collect()
    })
}

/// The release threshold for device pools, set by the runtime from its configuration.
static RELEASE_THRESHOLD: AtomicU64 = AtomicU64::new(u64::MAX);

/// Sets the release threshold that pools made from now on get; see
/// [`apply_pool_release_threshold`] for those made already.
///
/// SeqCst, as is the load: with the SeqCst fence [`handles`] makes after publishing a
/// device's handles, either the caller's [`apply_pool_release_threshold`] finds that
/// device's pool, or [`handles`] reads this value and sets it itself (session 87: a pool
/// made while a configuration was installed could keep the old threshold).
pub(crate) fn set_pool_release_threshold(bytes: u64) {
    RELEASE_THRESHOLD.store(bytes, Ordering::SeqCst);
    std::sync::atomic::fence(Ordering::SeqCst);
}

/// The release threshold in force.
pub(crate) fn pool_release_threshold() -> u64 {
    RELEASE_THRESHOLD.load(Ordering::SeqCst)
}

/// The handles of the devices whose handles were made, without making any.
fn made() -> Vec<(usize, DeviceHandles)> {
    DEVICES.get().map_or_else(Vec::new, |slots| {
        slots
            .iter()
            .enumerate()
            .filter_map(|(d, s)| s.handles.get().map(|h| (d, *h)))
            .collect()
    })
}

/// Sets the release threshold on every pool made so far.
pub(crate) fn apply_pool_release_threshold() -> Result<()> {
    for (d, h) in made() {
        let _ctx = bind(d)?;
        set_release_threshold(h.pool.0)?;
    }
    Ok(())
}

/// Gives back to the driver all memory of pinlane's device pools that backs no
/// allocation (`cuMemPoolTrimTo(pool, 0)`), on every device used so far.
pub(crate) fn trim_device_pools() -> Result<()> {
    for (d, h) in made() {
        let _ctx = bind(d)?;
        trim_to_zero(h.pool.0)?;
    }
    Ok(())
}

/// `cuMemPoolTrimTo(pool, 0)`; the pool's device context is current.
fn trim_to_zero(pool: sys::CUmemoryPool) -> Result<()> {
    // SAFETY: the pool is alive for the process; trimming only releases unused memory.
    unsafe { check("cuMemPoolTrimTo", super::api::cuMemPoolTrimTo(pool, 0)) }
}

/// The most `ctx`'s device could give one allocation from pinlane's pool (its context is
/// current): the device's free memory and the memory the pool holds that backs no
/// allocation, plus `more` (bytes about to be freed into the pool).
pub(crate) fn device_room(ctx: &ContextGuard, more: usize) -> Result<usize> {
    use sys::CUmemPool_attribute::*;
    let pool = handles(ctx.device())?.pool.0;
    let (free, _) = super::device_memory_info(crate::device::Device::cuda(ctx.device()))?;
    let reserved = pool_attr(pool, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?;
    let used = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?;
    let unused = usize::try_from(reserved.saturating_sub(used)).unwrap_or(usize::MAX);
    Ok(free.saturating_add(unused).saturating_add(more))
}

/// One of a pool's u64 attributes (reserved, used, highest reserved bytes).
fn pool_attr(pool: sys::CUmemoryPool, a: sys::CUmemPool_attribute) -> Result<u64> {
    let mut v: u64 = 0;
    // SAFETY: the attributes asked are u64 values; `v` is a live u64; the pool is alive
    // for the process.
    unsafe {
        check(
            "cuMemPoolGetAttribute",
            super::api::cuMemPoolGetAttribute(pool, a, (&mut v as *mut u64).cast()),
        )
    }?;
    Ok(v)
}

/// A device pool's reserved, used and highest reserved bytes.
pub(crate) struct PoolAttrs {
    pub(crate) reserved: u64,
    pub(crate) used: u64,
    pub(crate) reserved_high: u64,
}

/// [`PoolAttrs`] of every device pool made so far (devices whose attributes cannot be
/// read are left out). Not asked in a forked child: `memory_stats` returns zeros there.
pub(crate) fn device_pool_stats() -> Vec<(usize, PoolAttrs)> {
    use sys::CUmemPool_attribute::*;
    made()
        .into_iter()
        .filter_map(|(d, h)| {
            let attrs = (|| {
                Ok::<_, crate::error::Error>(PoolAttrs {
                    reserved: pool_attr(h.pool.0, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT)?,
                    used: pool_attr(h.pool.0, CU_MEMPOOL_ATTR_USED_MEM_CURRENT)?,
                    reserved_high: pool_attr(h.pool.0, CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH)?,
                })
            })();
            attrs.ok().map(|a| (d, a))
        })
        .collect()
}

/// The primary context and pool of `device`, made on first use (with the gather kernel,
/// loaded right after).
pub(crate) fn handles(device: usize) -> Result<DeviceHandles> {
    check_device(device)?;
    // check_device passed, so the index is in range.
    let slot = &slots()[device];
    if let Some(h) = slot.handles.get() {
        return Ok(*h);
    }
    let creating = slot.creating.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = slot.handles.get() {
        return Ok(*h); // another thread made them while this one waited
    }
    let (h, set) = create(device)?;
    // Module loading waits for every stream of the context: do it now, with the context's
    // creation, and never on a later transfer's path. The kernel's lock is taken before
    // the handles are published, so a thread that finds them and asks for the kernel
    // waits for this load instead of loading it on its own transfer's path. Lock order:
    // `creating`, then `loading`; the load takes neither again (the context is pushed
    // directly). A kernel that cannot load is not an error here (D2H then copies small
    // tensors one by one).
    let loading = slot.loading.lock().unwrap_or_else(|p| p.into_inner());
    let h = *slot.handles.get_or_init(|| h);
    drop(creating);
    load_gather_locked(slot, device, h.ctx, &loading);
    drop(loading);
    // A threshold set after the pool took `set`, by a caller whose apply did not find the
    // pool yet (see `set_pool_release_threshold`), is set here. The handles are out:
    // failing now would fail this one call for a setting, so the error goes to the
    // device's next call instead.
    std::sync::atomic::fence(Ordering::SeqCst);
    if pool_release_threshold() != set {
        if let Err(e) = push(h.ctx, device).and_then(|_guard| set_release_threshold(h.pool.0)) {
            super::deferred::record(device, e);
        }
    }
    Ok(h)
}

/// Loads `device`'s gather kernel under `ctx` (its primary context, pushed directly, not
/// through [`handles`]) unless it was tried already.
fn load_gather_once(slot: &DeviceSlot, device: usize, ctx: Handle<sys::CUcontext>) {
    if slot.gather.get().is_some() {
        return;
    }
    let loading = slot.loading.lock().unwrap_or_else(|p| p.into_inner());
    load_gather_locked(slot, device, ctx, &loading);
}

/// [`load_gather_once`] with the slot's `loading` lock held (`_held`).
fn load_gather_locked(
    slot: &DeviceSlot,
    device: usize,
    ctx: Handle<sys::CUcontext>,
    _held: &std::sync::MutexGuard<'_, ()>,
) {
    if slot.gather.get().is_none() {
        let r = push(ctx, device)
            .and_then(|guard| kernels::load_gather(&guard))
            .map_err(|e| e.to_string());
        let _ = slot.gather.set(r);
    }
}

/// The gather kernel of `device`, loaded with its context on first use; `None` if it
/// cannot be loaded (see [`gather_unavailable_reason`]).
pub(crate) fn gather_kernel(device: usize) -> Option<GatherKernel> {
    let ctx = handles(device).ok()?.ctx;
    let slot = &slots()[device]; // handles passed: the index is in range
    load_gather_once(slot, device, ctx);
    slot.gather.get()?.as_ref().ok().copied()
}

/// Why the gather kernel of `device` is unavailable, if it was tried and failed.
pub fn gather_unavailable_reason(device: crate::device::Device) -> Option<String> {
    let slot = DEVICES.get()?.get(device.ordinal())?;
    slot.gather.get()?.as_ref().err().cloned()
}

/// Retains `device`'s primary context and makes pinlane's pool on it.
/// The device's handles, and the release threshold its pool was given.
fn create(device: usize) -> Result<(DeviceHandles, u64)> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: out-pointer to a live local; `device` is below the device count.
    unsafe {
        check(
            "cuDeviceGet",
            super::api::cuDeviceGet(&mut dev, device as i32),
        )
    }?;
    let mut ctx: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; `dev` is a valid device handle.
    unsafe {
        check(
            "cuDevicePrimaryCtxRetain",
            super::api::cuDevicePrimaryCtxRetain(&mut ctx, dev),
        )
    }?;
    let ctx = Handle(ctx);
    // Popped before the release below, if it comes to that.
    let made = push(ctx, device).and_then(|_guard| create_pool(dev, device));
    let (pool, set) = match made {
        Ok(made) => made,
        Err(e) => {
            // The retain given back: the next call retries from the start, and a retry
            // per call must not retain once more each time (session 87, a review).
            // SAFETY: `dev` is the device whose primary context was retained above, once;
            // pinlane keeps nothing of it (the guard is popped; a pool belongs to the
            // device, not the context).
            let released = unsafe { super::api::cuDevicePrimaryCtxRelease_v2(dev) };
            // The error returned is the set-up's; a failed release, for the next call.
            if let Err(r) = check("cuDevicePrimaryCtxRelease", released) {
                super::deferred::record(device, r);
            }
            return Err(e);
        }
    };
    // Unified addressing makes memory from cuMemHostAlloc readable by kernels at its host
    // address; the second attribute extends that to cuMemHostRegister'd ranges (mapped).
    // A driver that cannot say is taken to mean no.
    let host_mapped = [
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM,
    ]
    .into_iter()
    .all(|attr| {
        let mut v: std::ffi::c_int = 0;
        // SAFETY: out-pointer to a live local; `dev` is a valid device handle.
        let res = unsafe { super::api::cuDeviceGetAttribute(&mut v, attr, dev) };
        check("cuDeviceGetAttribute", res).is_ok() && v == 1
    });
    let handles = DeviceHandles {
        ctx,
        pool,
        host_mapped,
    };
    Ok((handles, set))
}

/// Whether kernels on `device` can read pinlane's page-locked host memory (from
/// `cuMemHostAlloc`, or registered by [`host_register`](super::host_register)) through its
/// host address: unified addressing, and host pointers usable for registered memory.
/// `false` when the device cannot be opened.
pub(crate) fn host_memory_mapped(device: usize) -> bool {
    handles(device).is_ok_and(|h| h.host_mapped)
}

/// Whether pinlane has made `device`'s context (it makes nothing): after it, asking the
/// device's handles ([`host_memory_mapped`], say) makes nothing either.
pub(crate) fn context_made(device: usize) -> bool {
    made().iter().any(|(d, _)| *d == device)
}

/// Makes `device`'s context, pool and kernel now ([`crate::runtime::Runtime::warm_up`]).
pub(crate) fn warm_up(device: usize) -> Result<()> {
    handles(device).map(|_| ())
}

/// `device`'s (`dev`'s) pool, and the release threshold it was given.
fn create_pool(dev: sys::CUdevice, device: usize) -> Result<(Handle<sys::CUmemoryPool>, u64)> {
    // SAFETY: CUmemPoolProps is a plain C struct for which all-zero is the documented
    // "no options" value; the fields we need are set below.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    props.location.id = dev;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: both pointers point to live locals; the device's context is current.
    unsafe {
        check(
            "cuMemPoolCreate",
            super::api::cuMemPoolCreate(&mut pool, &props),
        )
    }?;
    match set_release_threshold(pool) {
        Ok(set) => Ok((Handle(pool), set)),
        Err(e) => {
            // SAFETY: the pool was made just now, and nothing was allocated from it; its
            // device's context is current.
            let destroyed = unsafe { super::api::cuMemPoolDestroy(pool) };
            // The error returned is the threshold's; a failed destroy, for the next call.
            if let Err(d) = check("cuMemPoolDestroy", destroyed) {
                super::deferred::record(device, d);
            }
            Err(e)
        }
    }
}

/// Sets the release threshold in force on `pool`, and says which it set.
fn set_release_threshold(pool: sys::CUmemoryPool) -> Result<u64> {
    super::fault_point(super::FaultKindTag::PoolAttribute, "cuMemPoolSetAttribute")?;
    let mut threshold: u64 = pool_release_threshold();
    // SAFETY: RELEASE_THRESHOLD takes a pointer to a u64, which `threshold` is; the pool
    // is alive.
    unsafe {
        check(
            "cuMemPoolSetAttribute",
            super::api::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            ),
        )
    }?;
    Ok(threshold)
}

/// Makes `device`'s primary context current until the guard drops.
pub(crate) fn bind(device: usize) -> Result<ContextGuard> {
    super::fork::check("CUDA context")?;
    push(handles(device)?.ctx, device)
}

pub(super) fn push(ctx: Handle<sys::CUcontext>, device: usize) -> Result<ContextGuard> {
    let mut current: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local.
    unsafe { check("cuCtxGetCurrent", super::api::cuCtxGetCurrent(&mut current)) }?;
    if current == ctx.0 {
        return Ok(ContextGuard::new(device, false));
    }
    // SAFETY: `ctx` is a retained primary context, valid for the life of the process.
    unsafe { check("cuCtxPushCurrent", super::api::cuCtxPushCurrent_v2(ctx.0)) }?;
    Ok(ContextGuard::new(device, true))
}
