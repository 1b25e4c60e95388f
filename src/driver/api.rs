//! The narrow interface the rest of the driver layer calls the device through: the raw
//! driver entry points pinlane uses, forwarded to `libcuda` or (feature `sim`, once a
//! process has chosen it with `driver::sim::enable`) to the simulated device. Same names
//! and signatures as `cudarc::driver::sys`, so the checked wrappers read the same either
//! way.
//!
//! # Safety
//! Every function here has the contract of the driver call of the same name.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use cudarc::driver::sys::{self, CUresult};
use std::ffi::{c_char, c_int, c_uint, c_void};

/// Without the `sim` feature, each entry point is `libcuda`'s, called directly.
#[cfg(not(feature = "sim"))]
macro_rules! route {
    ($(fn $name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        #[inline]
        pub(crate) unsafe fn $name($($arg: $ty),*) -> CUresult {
            // SAFETY: forwarded unchanged under the caller's contract.
            unsafe { sys::$name($($arg),*) }
        }
    )*};
}

/// With the `sim` feature, the entry points come from a function table chosen once, when
/// the driver is probed ([`select`]): `libcuda`'s, or the simulated device's.
#[cfg(feature = "sim")]
macro_rules! route {
    ($(fn $name:ident($($arg:ident: $ty:ty),*);)*) => {
        struct Table {
            $($name: unsafe fn($($ty),*) -> CUresult,)*
        }

        static REAL: Table = Table { $($name: sys::$name,)* };

        /// The simulated device's entry points, as free functions.
        mod simulated {
            use super::*;
            $(
                pub(super) unsafe fn $name($($arg: $ty),*) -> CUresult {
                    match super::super::sim::active() {
                        // SAFETY: the caller's contract is the driver call's; the
                        // simulator keeps it.
                        Some(s) => unsafe { s.$name($($arg),*) },
                        None => CUresult::CUDA_ERROR_NOT_INITIALIZED,
                    }
                }
            )*
        }

        static SIMULATED: Table = Table { $($name: simulated::$name,)* };

        $(
            #[inline]
            pub(crate) unsafe fn $name($($arg: $ty),*) -> CUresult {
                // SAFETY: forwarded unchanged under the caller's contract.
                unsafe { (table().$name)($($arg),*) }
            }
        )*
    };
}

#[cfg(feature = "sim")]
static TABLE: std::sync::OnceLock<&'static Table> = std::sync::OnceLock::new();

/// Chooses the entry points once: the simulated device's or `libcuda`'s.
#[cfg(feature = "sim")]
pub(crate) fn select(simulated: bool) {
    TABLE.get_or_init(|| if simulated { &SIMULATED } else { &REAL });
}

#[cfg(feature = "sim")]
#[inline]
fn table() -> &'static Table {
    TABLE.get().copied().unwrap_or(&REAL)
}

route! {
    fn cuInit(flags: c_uint);
    fn cuDriverGetVersion(v: *mut c_int);
    fn cuDeviceGetCount(n: *mut c_int);
    fn cuDeviceGet(d: *mut sys::CUdevice, ordinal: c_int);
    fn cuDeviceGetAttribute(v: *mut c_int, attr: sys::CUdevice_attribute, d: sys::CUdevice);
    fn cuDevicePrimaryCtxRetain(ctx: *mut sys::CUcontext, d: sys::CUdevice);
    fn cuDevicePrimaryCtxRelease_v2(d: sys::CUdevice);
    fn cuCtxGetCurrent(ctx: *mut sys::CUcontext);
    fn cuCtxPushCurrent_v2(ctx: sys::CUcontext);
    fn cuCtxPopCurrent_v2(ctx: *mut sys::CUcontext);
    fn cuGetErrorName(e: CUresult, s: *mut *const c_char);
    fn cuStreamCreate(s: *mut sys::CUstream, flags: c_uint);
    fn cuStreamDestroy_v2(s: sys::CUstream);
    fn cuStreamSynchronize(s: sys::CUstream);
    fn cuStreamGetCtx(s: sys::CUstream, ctx: *mut sys::CUcontext);
    fn cuStreamWaitEvent(s: sys::CUstream, e: sys::CUevent, flags: c_uint);
    fn cuStreamIsCapturing(s: sys::CUstream, status: *mut sys::CUstreamCaptureStatus);
    fn cuLaunchHostFunc(s: sys::CUstream, f: sys::CUhostFn, user: *mut c_void);
    fn cuEventCreate(e: *mut sys::CUevent, flags: c_uint);
    fn cuEventDestroy_v2(e: sys::CUevent);
    fn cuEventRecord(e: sys::CUevent, s: sys::CUstream);
    fn cuEventSynchronize(e: sys::CUevent);
    fn cuEventQuery(e: sys::CUevent);
    fn cuMemHostAlloc(p: *mut *mut c_void, n: usize, flags: c_uint);
    fn cuMemFreeHost(p: *mut c_void);
    fn cuMemHostRegister_v2(p: *mut c_void, n: usize, flags: c_uint);
    fn cuMemHostUnregister(p: *mut c_void);
    fn cuPointerGetAttributes(n: c_uint, attrs: *mut sys::CUpointer_attribute, data: *mut *mut c_void, ptr: sys::CUdeviceptr);
    fn cuMemPoolCreate(pool: *mut sys::CUmemoryPool, props: *const sys::CUmemPoolProps);
    fn cuMemPoolDestroy(pool: sys::CUmemoryPool);
    fn cuMemPoolSetAttribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute, v: *mut c_void);
    fn cuMemPoolGetAttribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute, v: *mut c_void);
    fn cuMemPoolTrimTo(pool: sys::CUmemoryPool, keep: usize);
    fn cuMemAllocFromPoolAsync(p: *mut sys::CUdeviceptr, n: usize, pool: sys::CUmemoryPool, s: sys::CUstream);
    fn cuMemFreeAsync(p: sys::CUdeviceptr, s: sys::CUstream);
    fn cuMemcpyHtoDAsync_v2(dst: sys::CUdeviceptr, src: *const c_void, n: usize, s: sys::CUstream);
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: sys::CUdeviceptr, n: usize, s: sys::CUstream);
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
    fn cuModuleLoadData(m: *mut sys::CUmodule, image: *const c_void);
    fn cuModuleGetFunction(f: *mut sys::CUfunction, m: sys::CUmodule, name: *const c_char);
    fn cuLaunchKernel(f: sys::CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, s: sys::CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
}
