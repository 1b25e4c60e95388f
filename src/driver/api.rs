//! The narrow interface the rest of the driver layer calls the device through: the raw
//! driver entry points pinlane uses, each forwarded to `libcuda` or, once a process has
//! chosen it with [`crate::driver::sim::enable`], to the simulated device. Same names and
//! signatures as `cudarc::driver::sys`, so the checked wrappers read the same either way.
//!
//! # Safety
//! Every function here has the contract of the driver call of the same name.

#![allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]

use super::sim;
use cudarc::driver::sys::{self, CUresult};
use std::ffi::{c_char, c_int, c_uint, c_void};

macro_rules! route {
    ($(fn $name:ident($($arg:ident: $ty:ty),*);)*) => {$(
        // cuLaunchHostFunc is only called by test helpers (feature `test-util`).
        #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
        #[inline]
        pub(crate) unsafe fn $name($($arg: $ty),*) -> CUresult {
            match sim::active() {
                // SAFETY: the caller's contract is the driver call's; the simulator keeps it.
                Some(s) => unsafe { s.$name($($arg),*) },
                // SAFETY: forwarded unchanged under the caller's contract.
                None => unsafe { sys::$name($($arg),*) },
            }
        }
    )*};
}

route! {
    fn cuInit(flags: c_uint);
    fn cuDriverGetVersion(v: *mut c_int);
    fn cuDeviceGetCount(n: *mut c_int);
    fn cuDeviceGet(d: *mut sys::CUdevice, ordinal: c_int);
    fn cuDevicePrimaryCtxRetain(ctx: *mut sys::CUcontext, d: sys::CUdevice);
    fn cuCtxGetCurrent(ctx: *mut sys::CUcontext);
    fn cuCtxPushCurrent_v2(ctx: sys::CUcontext);
    fn cuCtxPopCurrent_v2(ctx: *mut sys::CUcontext);
    fn cuGetErrorName(e: CUresult, s: *mut *const c_char);
    fn cuStreamCreate(s: *mut sys::CUstream, flags: c_uint);
    fn cuStreamDestroy_v2(s: sys::CUstream);
    fn cuStreamSynchronize(s: sys::CUstream);
    fn cuStreamGetCtx(s: sys::CUstream, ctx: *mut sys::CUcontext);
    fn cuStreamWaitEvent(s: sys::CUstream, e: sys::CUevent, flags: c_uint);
    fn cuLaunchHostFunc(s: sys::CUstream, f: sys::CUhostFn, user: *mut c_void);
    fn cuEventCreate(e: *mut sys::CUevent, flags: c_uint);
    fn cuEventDestroy_v2(e: sys::CUevent);
    fn cuEventRecord(e: sys::CUevent, s: sys::CUstream);
    fn cuEventSynchronize(e: sys::CUevent);
    fn cuEventQuery(e: sys::CUevent);
    fn cuMemHostAlloc(p: *mut *mut c_void, n: usize, flags: c_uint);
    fn cuMemFreeHost(p: *mut c_void);
    fn cuMemPoolCreate(pool: *mut sys::CUmemoryPool, props: *const sys::CUmemPoolProps);
    fn cuMemPoolSetAttribute(pool: sys::CUmemoryPool, attr: sys::CUmemPool_attribute, v: *mut c_void);
    fn cuMemAllocFromPoolAsync(p: *mut sys::CUdeviceptr, n: usize, pool: sys::CUmemoryPool, s: sys::CUstream);
    fn cuMemFreeAsync(p: sys::CUdeviceptr, s: sys::CUstream);
    fn cuMemcpyHtoDAsync_v2(dst: sys::CUdeviceptr, src: *const c_void, n: usize, s: sys::CUstream);
    fn cuMemcpyDtoHAsync_v2(dst: *mut c_void, src: sys::CUdeviceptr, n: usize, s: sys::CUstream);
    fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize);
    fn cuModuleLoadData(m: *mut sys::CUmodule, image: *const c_void);
    fn cuModuleGetFunction(f: *mut sys::CUfunction, m: sys::CUmodule, name: *const c_char);
    fn cuLaunchKernel(f: sys::CUfunction, gx: c_uint, gy: c_uint, gz: c_uint, bx: c_uint, by: c_uint, bz: c_uint, shared: c_uint, s: sys::CUstream, params: *mut *mut c_void, extra: *mut *mut c_void);
}
