//! [`DeviceAlloc`]: the device memory of one batch, and [`DeviceView`]: one tensor in it.

use crate::driver::{self, ContextGuard, DevicePtr, Handle, Stream};
use crate::error::Result;
use std::sync::Arc;

/// One allocation from pinlane's stream-ordered pool of a device, holding every tensor of
/// one H2D batch (each at a [`DEVICE_ALIGN`](super::DEVICE_ALIGN)-aligned offset).
///
/// Freed with `cuMemFreeAsync` on `free_on` (the consumer stream) when the last
/// [`DeviceView`] and the last ring or in-flight reference drop. So a tensor kept by the
/// caller keeps its whole batch's allocation alive: that is the cost of moving a batch
/// with one allocation and one copy per staging window instead of one per tensor.
pub(crate) struct DeviceAlloc {
    ptr: Handle<DevicePtr>,
    nbytes: usize,
    device: usize,
    free_on: Stream,
}

impl DeviceAlloc {
    /// Allocates `nbytes` (> 0) on `device`, ready in `stream`'s order; it will be freed
    /// on `free_on`.
    pub(crate) fn new_async(
        ctx: &ContextGuard,
        device: usize,
        nbytes: usize,
        stream: &Stream,
        free_on: Stream,
    ) -> Result<Arc<DeviceAlloc>> {
        let ptr = driver::device_alloc_async(ctx, device, nbytes, stream)?;
        Ok(Arc::new(DeviceAlloc {
            ptr: Handle(ptr),
            nbytes,
            device,
            free_on,
        }))
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The device address at `offset` (<= nbytes).
    pub(crate) fn addr(&self, offset: usize) -> DevicePtr {
        debug_assert!(offset <= self.nbytes);
        self.ptr.0 + offset as DevicePtr
    }
}

impl Drop for DeviceAlloc {
    fn drop(&mut self) {
        let res = driver::bind(self.device).and_then(|ctx| {
            // SAFETY: the pointer came from device_alloc_async and this is its last owner.
            // Every pinlane copy into it was synchronised before the batch was returned
            // (or the registry would still own us); work the consumer queued on `free_on`
            // is ordered before this free by the stream itself.
            unsafe { driver::device_free_async(&ctx, self.ptr.0, &self.free_on) }
        });
        if let Err(e) = res {
            driver::deferred::record(e);
        }
    }
}

/// A tensor's bytes inside a [`DeviceAlloc`]. Empty tensors have no allocation.
#[derive(Clone)]
pub(crate) struct DeviceView {
    alloc: Option<Arc<DeviceAlloc>>,
    offset: usize,
    nbytes: usize,
    device: usize,
}

impl DeviceView {
    /// `nbytes` at `offset` of `alloc` (`offset + nbytes <= alloc.nbytes()`).
    pub(crate) fn new(alloc: &Arc<DeviceAlloc>, offset: usize, nbytes: usize) -> DeviceView {
        debug_assert!(offset + nbytes <= alloc.nbytes());
        DeviceView {
            alloc: Some(alloc.clone()),
            offset,
            nbytes,
            device: alloc.device,
        }
    }

    /// A view of no bytes on `device`.
    pub(crate) fn empty(device: usize) -> DeviceView {
        DeviceView {
            alloc: None,
            offset: 0,
            nbytes: 0,
            device,
        }
    }

    pub(crate) fn device(&self) -> usize {
        self.device
    }

    pub(crate) fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The address at `at` (<= nbytes) bytes into the view; `None` for an empty view.
    pub(crate) fn addr(&self, at: usize) -> Option<DevicePtr> {
        debug_assert!(at <= self.nbytes);
        self.alloc.as_ref().map(|a| a.addr(self.offset + at))
    }

    /// Queues a copy of `src` over this view's bytes on `stream` (tests only).
    ///
    /// # Safety
    /// 1. `src` stays alive until the copy has finished.
    /// 2. The view's allocation stays alive until then, and nothing else reads or writes
    ///    these bytes meanwhile except in `stream`'s order.
    #[cfg(feature = "test-util")]
    pub(crate) unsafe fn overwrite_from_pinned_async(
        &self,
        src: &super::PinnedBuf,
        stream: &Stream,
    ) -> Result<()> {
        let Some(alloc) = &self.alloc else {
            return Ok(()); // empty view: nothing to write (sizes were checked equal)
        };
        let ctx = driver::bind(self.device)?;
        // SAFETY: obligations 1 and 2 are the caller's; h2d_async checks the range.
        unsafe { src.h2d_async(&ctx, alloc, self.offset, stream) }
    }

    /// Whether two views are the same bytes of the same allocation.
    pub(crate) fn same_as(&self, other: &DeviceView) -> bool {
        let same_alloc = match (&self.alloc, &other.alloc) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            (None, None) => self.device == other.device,
            _ => false,
        };
        same_alloc && self.offset == other.offset && self.nbytes == other.nbytes
    }
}
