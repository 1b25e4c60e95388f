//! Memory and copy calls: one checked function per driver call.
//!
//! Each takes a `&ContextGuard` as proof that the right context is current, so the engine
//! binds a context once per batch, not once per call. The `unsafe fn`s list what the
//! caller must guarantee; the memory layer (`src/memory/`) is their only caller.

use super::{check, context, fault_point, ContextGuard, FaultKindTag, Stream};
use crate::error::Result;
use cudarc::driver::sys;

/// A device address.
pub(crate) type DevicePtr = sys::CUdeviceptr;

/// The context a stream belongs to (`cuStreamGetCtx`).
///
/// # Safety
/// `stream` is a live stream handle (not a sentinel such as `CU_STREAM_LEGACY`).
pub(crate) unsafe fn stream_context(
    _ctx: &ContextGuard,
    stream: sys::CUstream,
) -> Result<sys::CUcontext> {
    let mut owner: sys::CUcontext = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; the handle is live (the caller's obligation).
    check("cuStreamGetCtx", unsafe {
        super::api::cuStreamGetCtx(stream, &mut owner)
    })?;
    Ok(owner)
}

/// Allocates `nbytes` (> 0) of page-locked, portable host memory.
pub(crate) fn host_alloc(_ctx: &ContextGuard, nbytes: usize) -> Result<*mut u8> {
    fault_point(FaultKindTag::HostAlloc, "cuMemHostAlloc")?;
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: out-pointer to a live local; a context is current (the guard proves it).
    let res = unsafe { super::api::cuMemHostAlloc(&mut p, nbytes, sys::CU_MEMHOSTALLOC_PORTABLE) };
    check("cuMemHostAlloc", res)?;
    Ok(p.cast())
}

/// Frees page-locked memory from [`host_alloc`].
///
/// # Safety
/// 1. `p` came from [`host_alloc`] and was not freed since.
/// 2. No copy that may still run reads or writes it.
pub(crate) unsafe fn host_free(_ctx: &ContextGuard, p: *mut u8) -> Result<()> {
    // SAFETY: obligations 1 and 2 are the caller's; a context is current.
    check("cuMemFreeHost", unsafe {
        super::api::cuMemFreeHost(p.cast())
    })
}

/// Page-locks `nbytes` (> 0) of existing host memory at `p` in place, for every context,
/// and maps it for the devices (`cuMemHostRegister`, portable and device-mapped: kernels
/// may then read it, see [`host_memory_mapped`](super::host_memory_mapped)).
///
/// # Safety
/// `p..p + nbytes` is host memory that stays allocated until [`host_unregister`].
pub(crate) unsafe fn host_register(_ctx: &ContextGuard, p: *mut u8, nbytes: usize) -> Result<()> {
    // SAFETY: the caller's obligation; a context is current (the guard proves it).
    let res = unsafe {
        super::api::cuMemHostRegister_v2(
            p.cast(),
            nbytes,
            sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP,
        )
    };
    check("cuMemHostRegister", res)
}

/// Ends a registration made by [`host_register`].
///
/// # Safety
/// `p` was registered by [`host_register`] and not unregistered since; no copy that may
/// still run reads it.
pub(crate) unsafe fn host_unregister(_ctx: &ContextGuard, p: *mut u8) -> Result<()> {
    // SAFETY: the caller's obligations; a context is current.
    check("cuMemHostUnregister", unsafe {
        super::api::cuMemHostUnregister(p.cast())
    })
}

/// `cuMemHostRegister`'s answer for memory that overlaps a live registration
/// (`CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`), for a refusal made before asking it.
pub(crate) fn already_registered() -> Result<()> {
    check(
        "cuMemHostRegister",
        sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
    )
}

/// Whether the `len` bytes of host memory at `p` are page-locked, all in one allocation or
/// registration: the driver knows the first and the last byte as host memory
/// (`CU_POINTER_ATTRIBUTE_MEMORY_TYPE`) of one buffer ([`one_buffer_where`]). This is
/// what torch's `Tensor.is_pinned()` asks of the first byte (through the runtime, after
/// looking for a device with a context, ~1.2 to 1.5 us a call from Python). `false` for
/// memory the driver does not know (pageable), device or managed memory, when the driver
/// fails to answer, and for `len == 0`.
pub(crate) fn host_page_locked(ctx: &ContextGuard, p: *const u8, len: usize) -> bool {
    let host = sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32;
    one_buffer_where(
        ctx,
        p,
        len,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        // A CUmemorytype: 32-bit, in the slot's first four bytes.
        |_, v| u32::from_ne_bytes([v[0], v[1], v[2], v[3]]) == host,
    )
}

/// Whether kernels of the current context may read the `len` bytes of host memory at `p`
/// at that same address: the driver maps the first and the last byte for the device
/// there (`CU_POINTER_ATTRIBUTE_DEVICE_POINTER`), and both lie in one allocation or
/// registration ([`one_buffer_where`]), so every byte between them is mapped too (two
/// registrations side by side, or with a hole between them, are not one). `false` for
/// memory the driver does not map for the device (not page-locked, or registered without
/// a device mapping), maps at another address, or when the driver fails to answer;
/// `false` for `len == 0`.
pub(crate) fn host_mapped_in_place(ctx: &ContextGuard, p: *const u8, len: usize) -> bool {
    one_buffer_where(
        ctx,
        p,
        len,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
        // A CUdeviceptr: 64-bit.
        |at, v| u64::from_ne_bytes(v) == at,
    )
}

/// Whether the `len` bytes at `p` lie in one allocation or registration the driver knows
/// (the same `CU_POINTER_ATTRIBUTE_BUFFER_ID`, not 0, at the first and the last byte: every
/// byte between them is then in it too), with `attr`'s value at each end accepted by
/// `ok(address, value)`. `value` is the 8-byte slot, zeroed, that the driver wrote the
/// attribute into (a 32-bit attribute fills its first four bytes). One
/// `cuPointerGetAttributes` call per end, under the context `_ctx` keeps current. `false` for
/// `len == 0` and when the driver fails to answer (it answers an address it does not know
/// with zeros, not an error).
fn one_buffer_where(
    _ctx: &ContextGuard,
    p: *const u8,
    len: usize,
    attr: sys::CUpointer_attribute,
    ok: impl Fn(u64, [u8; 8]) -> bool,
) -> bool {
    // (`attr`'s slot, buffer id) of the byte at `at`.
    let ask = |at: u64| -> Option<([u8; 8], u64)> {
        let mut attrs = [
            attr,
            sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_BUFFER_ID,
        ];
        let (mut value, mut id) = (0u64, 0u64);
        let mut data: [*mut std::ffi::c_void; 2] = [
            (&mut value as *mut u64).cast(),
            (&mut id as *mut u64).cast(),
        ];
        // SAFETY: two attributes, each with an out-pointer to a live, aligned 64-bit local
        // (room for the widest attribute asked here; the buffer id is an unsigned long
        // long); the driver only looks the address up, it reads no memory there; a
        // context is current (`_ctx`).
        let res = unsafe {
            super::api::cuPointerGetAttributes(2, attrs.as_mut_ptr(), data.as_mut_ptr(), at)
        };
        (res == sys::CUresult::CUDA_SUCCESS).then_some((value.to_ne_bytes(), id))
    };
    let Some(last_off) = (len as u64).checked_sub(1) else {
        return false;
    };
    let (first, last) = (p as u64, (p as u64).wrapping_add(last_off));
    let Some((v, id)) = ask(first) else {
        return false;
    };
    if id == 0 || !ok(first, v) {
        return false;
    }
    first == last || matches!(ask(last), Some((w, same)) if same == id && ok(last, w))
}

/// Allocates `nbytes` (> 0) of device memory from pinlane's pool of `device`, ready in
/// `stream`'s order.
pub(crate) fn device_alloc_async(
    ctx: &ContextGuard,
    device: usize,
    nbytes: usize,
    stream: &Stream,
) -> Result<DevicePtr> {
    fault_point(FaultKindTag::Alloc, "cuMemAllocFromPoolAsync")?;
    ctx.check("cuMemAllocFromPoolAsync", device)?;
    let pool = context::handles(device)?.pool;
    let mut p: DevicePtr = 0;
    // SAFETY: out-pointer to a live local; the pool and stream are alive and belong to
    // the device whose context is current.
    let res = unsafe { super::api::cuMemAllocFromPoolAsync(&mut p, nbytes, pool.0, stream.raw()) };
    check("cuMemAllocFromPoolAsync", res)?;
    Ok(p)
}

/// Frees device memory in `stream`'s order.
///
/// # Safety
/// 1. `p` came from [`device_alloc_async`] and was not freed since.
/// 2. Every use of `p` is ordered before this point of `stream` (queued earlier on it, or
///    finished, or waited for by it).
pub(crate) unsafe fn device_free_async(
    _ctx: &ContextGuard,
    p: DevicePtr,
    stream: &Stream,
) -> Result<()> {
    fault_point(FaultKindTag::Free, "cuMemFreeAsync")?;
    // SAFETY: obligations 1 and 2 are the caller's; the stream is alive.
    check("cuMemFreeAsync", unsafe {
        super::api::cuMemFreeAsync(p, stream.raw())
    })
}

/// Queues a host-to-device copy of `n` bytes.
///
/// # Safety
/// 1. `src..src+n` is readable host memory that stays alive and unchanged until the copy
///    has finished (page-locked for the copy to be truly asynchronous).
/// 2. `dst..dst+n` is device memory usable in `stream`'s order, alive until then.
pub(crate) unsafe fn memcpy_h2d_async(
    _ctx: &ContextGuard,
    dst: DevicePtr,
    src: *const u8,
    n: usize,
    stream: &Stream,
) -> Result<()> {
    fault_point(FaultKindTag::Copy, "cuMemcpyHtoDAsync")?;
    // SAFETY: obligations 1 and 2 are the caller's.
    let res = unsafe { super::api::cuMemcpyHtoDAsync_v2(dst, src.cast(), n, stream.raw()) };
    check("cuMemcpyHtoDAsync", res)
}

/// Queues a device-to-host copy of `n` bytes.
///
/// # Safety
/// 1. `dst..dst+n` is writable host memory that nothing else reads or writes, alive until
///    the copy has finished.
/// 2. `src..src+n` is device memory whose producing work is ordered before this point of
///    `stream`, alive until the copy has finished.
pub(crate) unsafe fn memcpy_d2h_async(
    _ctx: &ContextGuard,
    dst: *mut u8,
    src: DevicePtr,
    n: usize,
    stream: &Stream,
) -> Result<()> {
    fault_point(FaultKindTag::Copy, "cuMemcpyDtoHAsync")?;
    // SAFETY: obligations 1 and 2 are the caller's.
    let res = unsafe { super::api::cuMemcpyDtoHAsync_v2(dst.cast(), src, n, stream.raw()) };
    check("cuMemcpyDtoHAsync", res)
}
