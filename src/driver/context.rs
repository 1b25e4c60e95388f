//! Primary contexts and device memory pools, one of each per device, made once.
//!
//! pinlane uses each device's primary context (the one the CUDA runtime and PyTorch use),
//! retained once and never released: it lives as long as the process. Driver calls are
//! made with it current through a [`ContextGuard`], which pushes it only when another
//! context (or none) is current and pops it again, so a caller's own current context is
//! left as it was.
//!
//! Each device also gets one stream-ordered memory pool of pinlane's own, with its release
//! threshold at the maximum so freed memory stays cached in the pool for reuse instead of
//! going back to the driver at every synchronisation. It is pinlane's, not the device's
//! default pool, so pinlane changes no process-wide setting.

use super::{check, check_device, Handle};
use crate::error::Result;
use cudarc::driver::sys;
use std::sync::{Mutex, OnceLock};

/// The per-device handles made once.
#[derive(Clone, Copy)]
pub(crate) struct DeviceHandles {
    pub(crate) ctx: Handle<sys::CUcontext>,
    pub(crate) pool: Handle<sys::CUmemoryPool>,
}

/// One slot per device, filled on first use. A `Mutex` (not `OnceLock` per device) because
/// creation is fallible and rare; reads after creation copy the handles out.
static DEVICES: OnceLock<Vec<Mutex<Option<DeviceHandles>>>> = OnceLock::new();

/// The primary context and pool of `device`, made on first use.
pub(crate) fn handles(device: usize) -> Result<DeviceHandles> {
    check_device(device)?;
    let slots = DEVICES.get_or_init(|| {
        let n = super::available().map_or(0, |i| i.device_count);
        (0..n).map(|_| Mutex::new(None)).collect()
    });
    // check_device passed, so the index is in range.
    let mut slot = slots[device].lock().unwrap_or_else(|p| p.into_inner());
    if let Some(h) = *slot {
        return Ok(h);
    }
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
    let pool = {
        let _guard = push(ctx)?;
        create_pool(dev)?
    };
    let h = DeviceHandles { ctx, pool };
    *slot = Some(h);
    Ok(h)
}

fn create_pool(dev: sys::CUdevice) -> Result<Handle<sys::CUmemoryPool>> {
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
    let mut threshold: u64 = u64::MAX;
    // SAFETY: RELEASE_THRESHOLD takes a pointer to a u64, which `threshold` is; `pool`
    // was just created.
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
    Ok(Handle(pool))
}

/// Makes `device`'s primary context current until the guard drops.
pub(crate) fn bind(device: usize) -> Result<ContextGuard> {
    push(handles(device)?.ctx)
}

fn push(ctx: Handle<sys::CUcontext>) -> Result<ContextGuard> {
    let mut current: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local.
    unsafe { check("cuCtxGetCurrent", super::api::cuCtxGetCurrent(&mut current)) }?;
    if current == ctx.0 {
        return Ok(ContextGuard {
            pushed: false,
            _not_send: std::marker::PhantomData,
        });
    }
    // SAFETY: `ctx` is a retained primary context, valid for the life of the process.
    unsafe { check("cuCtxPushCurrent", super::api::cuCtxPushCurrent_v2(ctx.0)) }?;
    Ok(ContextGuard {
        pushed: true,
        _not_send: std::marker::PhantomData,
    })
}

/// Keeps a device's context current; pops it on drop if it pushed it.
///
/// Not `Send`: the context stack is per thread.
pub(crate) struct ContextGuard {
    pushed: bool,
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if self.pushed {
            let mut popped: sys::CUcontext = std::ptr::null_mut();
            // SAFETY: this guard pushed a context on this thread (the guard is !Send via
            // its PhantomData) and nothing popped it since.
            let res = unsafe { super::api::cuCtxPopCurrent_v2(&mut popped) };
            if let Err(e) = check("cuCtxPopCurrent", res) {
                super::deferred::record(e);
            }
        }
    }
}
