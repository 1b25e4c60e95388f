//! [`PinnedBuf`]: page-locked host memory owned by one tensor.

use super::DeviceAlloc;
use crate::driver::{self, ContextGuard, Handle, Stream};
use crate::error::Result;

/// Page-locked (pinned) host memory from `cuMemHostAlloc`, portable to every context, so
/// the copy engines read or write it directly and an H2D from it needs no staging.
///
/// Allocated under cuda:0's context (portable memory works from any context); freed with
/// `cuMemFreeHost` when dropped. Empty buffers allocate nothing.
pub(crate) struct PinnedBuf {
    ptr: Handle<*mut u8>,
    nbytes: usize,
}

/// The device whose context pinned tensor memory is allocated and freed under.
const PINNED_CTX_DEVICE: usize = 0;

impl PinnedBuf {
    /// A page-locked copy of `bytes`.
    pub(crate) fn copy_of(bytes: &[u8]) -> Result<PinnedBuf> {
        if bytes.is_empty() {
            return Ok(PinnedBuf {
                ptr: Handle(std::ptr::NonNull::dangling().as_ptr()),
                nbytes: 0,
            });
        }
        driver::require("pinned allocation")?;
        let ctx = driver::bind(PINNED_CTX_DEVICE)?;
        let ptr = driver::host_alloc(&ctx, bytes.len())?;
        // SAFETY: `ptr` is a fresh allocation of bytes.len() bytes that nothing else can
        // see yet; the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), ptr, bytes.len()) };
        Ok(PinnedBuf {
            ptr: Handle(ptr),
            nbytes: bytes.len(),
        })
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` points to `nbytes` initialised bytes (written in copy_of) that
        // live as long as self and are never written again; for nbytes 0 it is a
        // dangling, aligned, non-null pointer, which an empty slice allows.
        unsafe { std::slice::from_raw_parts(self.ptr.0, self.nbytes) }
    }
}

impl PinnedBuf {
    /// Queues a copy of all the bytes to `dst` at `at`, straight from this memory.
    ///
    /// # Safety
    /// 1. `self` stays alive (and unchanged: it never changes) until the copy has finished.
    /// 2. `dst` is usable in `stream`'s order and kept alive until the copy has finished.
    pub(crate) unsafe fn h2d_async(
        &self,
        ctx: &ContextGuard,
        dst: &DeviceAlloc,
        at: usize,
        stream: &Stream,
    ) -> Result<()> {
        if at.checked_add(self.nbytes).is_none_or(|e| e > dst.nbytes()) {
            return Err(crate::Error::InvalidOption {
                name: "copy range",
                reason: format!(
                    "pinned source {at}+{} exceeds {} bytes",
                    self.nbytes,
                    dst.nbytes()
                ),
            });
        }
        if self.nbytes == 0 {
            return Ok(());
        }
        // SAFETY: the source is our page-locked allocation of nbytes (obligation 1 keeps it
        // alive); the destination range is inside `dst` (checked above; obligation 2).
        unsafe { driver::memcpy_h2d_async(ctx, dst.addr(at), self.ptr.0, self.nbytes, stream) }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        if self.nbytes == 0 {
            return;
        }
        let res = driver::bind(PINNED_CTX_DEVICE).and_then(|ctx| {
            // SAFETY: the pointer came from host_alloc and this is its only owner; a copy
            // reading it is proven complete before the tensor that owns us can drop
            // (memory module invariant: the call synchronised, or the registry holds a
            // clone of the tensor).
            unsafe { driver::host_free(&ctx, self.ptr.0) }
        });
        if let Err(e) = res {
            driver::deferred::record(e);
        }
    }
}
