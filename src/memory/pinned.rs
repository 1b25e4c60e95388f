//! Page-locked host memory that tensors own: [`PinnedBuf`] (a view into a
//! [`PinnedBlock`]), and the bounded [`PinnedOutputPool`] that D2H outputs come from.

use super::{check_range, DeviceAlloc, DeviceView};
use crate::driver::{self, ContextGuard, Handle, Stream};
use crate::error::Result;
use std::sync::{Arc, Mutex, OnceLock};

/// One block of page-locked memory: a `cuMemHostAlloc` allocation (portable) owned by
/// one tensor (freed on drop) or by the output pool (returned to it on drop), or memory
/// another owner page-locked (a DLPack import of `kDLCUDAHost`), released by dropping
/// that owner.
///
/// pinlane allocates page-locked memory under the context of the device the call works
/// with, and frees it under the same one: a process that uses only `cuda:1` never
/// creates a context on `cuda:0`. Portable memory is usable from every context.
pub(crate) struct PinnedBlock {
    ptr: Handle<*mut u8>,
    len: usize,
    release: Release,
}

/// How a [`PinnedBlock`] gives its memory back.
enum Release {
    /// Nothing to give back (an empty block).
    Nothing,
    /// `cuMemFreeHost` under `device`'s context.
    Free { device: usize },
    /// Back to the output pool's free list.
    Pool {
        pool: &'static PinnedOutputPool,
        device: usize,
    },
    /// Drop the owner that keeps it page-locked and alive (with the block).
    Foreign { _owner: Box<dyn Send + Sync> },
}

impl PinnedBlock {
    /// A block of no bytes (outputs of a batch whose tensors are all empty). Its pointer
    /// is aligned for every dtype, so typed views of it are empty slices, not errors.
    pub(crate) fn empty() -> Arc<PinnedBlock> {
        Arc::new(PinnedBlock {
            ptr: Handle(std::ptr::NonNull::<u64>::dangling().as_ptr().cast()),
            len: 0,
            release: Release::Nothing,
        })
    }

    /// Page-locked memory that `owner` keeps alive: `len` bytes at `ptr`.
    ///
    /// # Safety
    /// 1. `ptr..ptr+len` is page-locked (or at least readable) host memory that stays
    ///    valid and unchanged until `owner` is dropped.
    /// 2. Dropping `owner` is what releases it, and may happen on any thread.
    pub(crate) unsafe fn foreign(
        ptr: *mut u8,
        len: usize,
        owner: Box<dyn Send + Sync>,
    ) -> Arc<PinnedBlock> {
        Arc::new(PinnedBlock {
            ptr: Handle(ptr),
            len,
            release: Release::Foreign { _owner: owner },
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Queues a copy of `src` (all of it) into this block at `at`.
    ///
    /// # Safety
    /// 1. Nothing reads or writes `at..at+src.nbytes()` of the block until the copy has
    ///    finished, and the block stays alive until then.
    /// 2. `src`'s producing work is ordered before this point of `stream`, and `src` stays
    ///    alive until the copy has finished.
    pub(crate) unsafe fn d2h_async(
        &self,
        ctx: &ContextGuard,
        at: usize,
        src: &DeviceView,
        stream: &Stream,
    ) -> Result<()> {
        let n = src.nbytes();
        check_range("pinned output", at, n, self.len)?;
        let Some(from) = src.addr(0) else {
            return Ok(());
        };
        // SAFETY: the destination is inside the block (checked above); obligations 1 and
        // 2 are the caller's.
        unsafe { driver::memcpy_d2h_async(ctx, self.ptr.0.add(at), from, n, stream) }
    }
}

impl PinnedBlock {
    /// Queues copies of `views` into this block at `offsets` as one `cuMemcpyBatchAsync`.
    ///
    /// # Safety
    /// As [`PinnedBlock::d2h_async`], for every view; `stream` is not the legacy stream.
    pub(crate) unsafe fn d2h_batch_async(
        &self,
        ctx: &ContextGuard,
        views: &[&DeviceView],
        offsets: &[usize],
        device: usize,
        stream: &Stream,
    ) -> Result<()> {
        let mut dsts = Vec::with_capacity(views.len());
        let mut srcs = Vec::with_capacity(views.len());
        let mut sizes = Vec::with_capacity(views.len());
        for (v, &at) in views.iter().zip(offsets) {
            let n = v.nbytes();
            check_range("pinned output", at, n, self.len)?;
            let Some(src) = v.addr(0) else { continue };
            // With unified addressing a page-locked host address is a valid copy target.
            dsts.push(self.ptr.0.wrapping_add(at) as DevicePtrInt);
            srcs.push(src);
            sizes.push(n);
        }
        // SAFETY: every destination is inside the block (checked above); the rest is the
        // caller's obligation.
        unsafe {
            driver::memcpy_batch_d2h_async(ctx, &mut dsts, &mut srcs, &mut sizes, device, stream)
        }
    }
}

/// A device address as an integer (`CUdeviceptr`).
type DevicePtrInt = u64;

impl Drop for PinnedBlock {
    fn drop(&mut self) {
        match self.release {
            Release::Nothing | Release::Foreign { .. } => {} // the owner drops with `self`
            Release::Pool { pool, device } => pool.give_back(self.ptr, self.len, device),
            Release::Free { device } => {
                // SAFETY: a dedicated block from host_alloc whose last owner is us; copies
                // that read or wrote it were proven complete before any tensor owning it
                // could drop (memory module invariant).
                if let Err(e) = unsafe { free_pinned(self.ptr, device) } {
                    driver::deferred::record(e);
                }
            }
        }
    }
}

/// Frees a pinned allocation under the context it was allocated under.
///
/// # Safety
/// `ptr` came from `host_alloc` under `device`'s context, is not freed yet, and no copy
/// touches it any more.
unsafe fn free_pinned(ptr: Handle<*mut u8>, device: usize) -> Result<()> {
    let ctx = driver::bind(device)?;
    // SAFETY: the caller's obligations.
    unsafe { driver::host_free(&ctx, ptr.0) }
}

/// A new block of `len` bytes allocated under `device`'s context, freed on drop or
/// returned to `pool`.
fn alloc_block(
    len: usize,
    device: usize,
    pool: Option<&'static PinnedOutputPool>,
) -> Result<Arc<PinnedBlock>> {
    if len == 0 {
        return Ok(PinnedBlock::empty());
    }
    driver::require("pinned allocation")?;
    let ctx = driver::bind(device)?;
    let ptr = driver::host_alloc(&ctx, len)?;
    let release = match pool {
        Some(pool) => Release::Pool { pool, device },
        None => Release::Free { device },
    };
    Ok(Arc::new(PinnedBlock {
        ptr: Handle(ptr),
        len,
        release,
    }))
}

/// A tensor's page-locked bytes: `nbytes` at `offset` of a shared block.
#[derive(Clone)]
pub(crate) struct PinnedBuf {
    block: Arc<PinnedBlock>,
    offset: usize,
    nbytes: usize,
}

impl PinnedBuf {
    /// A page-locked copy of `bytes` in a block of its own, allocated under `device`'s
    /// context.
    pub(crate) fn copy_of(bytes: &[u8], device: usize) -> Result<PinnedBuf> {
        let block = alloc_block(bytes.len(), device, None)?;
        if !bytes.is_empty() {
            // SAFETY: a fresh allocation of bytes.len() bytes that nothing else can see;
            // the ranges cannot overlap.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), block.ptr.0, bytes.len()) };
        }
        Ok(PinnedBuf {
            block,
            offset: 0,
            nbytes: bytes.len(),
        })
    }

    /// Queues a copy of `src` over these bytes on `stream` (tests only).
    ///
    /// # Safety
    /// As [`PinnedBlock::d2h_async`]: nothing else reads these bytes until the copy has
    /// finished, and both sides stay alive until then.
    #[cfg(feature = "test-util")]
    pub(crate) unsafe fn d2h_async(&self, src: &DeviceView, stream: &Stream) -> Result<()> {
        let ctx = driver::bind(stream.index())?;
        check_range("pinned view", 0, src.nbytes(), self.nbytes)?;
        // SAFETY: the caller's obligations; the range was checked against the view.
        unsafe { self.block.d2h_async(&ctx, self.offset, src, stream) }
    }

    /// The address of the first byte (for DLPack exports).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.block.ptr.0.wrapping_add(self.offset)
    }

    /// `nbytes` at `offset` of `block`, whose bytes there have been fully written (and
    /// whose copies are proven complete).
    pub(crate) fn view(block: &Arc<PinnedBlock>, offset: usize, nbytes: usize) -> PinnedBuf {
        debug_assert!(offset + nbytes <= block.len);
        let ok = offset.checked_add(nbytes).is_some_and(|e| e <= block.len);
        PinnedBuf {
            block: block.clone(),
            offset: if ok { offset } else { 0 },
            nbytes: if ok { nbytes } else { 0 },
        }
    }

    /// Whether two views are the same bytes of the same block.
    pub(crate) fn same_as(&self, other: &PinnedBuf) -> bool {
        Arc::ptr_eq(&self.block, &other.block)
            && self.offset == other.offset
            && self.nbytes == other.nbytes
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        if self.nbytes == 0 {
            return &[];
        }
        // SAFETY: offset + nbytes <= block.len (view and copy_of keep it so); these bytes
        // were written (by copy_of, or by D2H copies proven complete before the view was
        // made) and are never written again while a view exists; the block lives as long
        // as `self` holds the Arc.
        unsafe { std::slice::from_raw_parts(self.block.ptr.0.add(self.offset), self.nbytes) }
    }

    /// Queues a copy of all the bytes to `dst` at `at`, straight from this memory.
    ///
    /// # Safety
    /// 1. `self` stays alive (it never changes) until the copy has finished.
    /// 2. `dst` is usable in `stream`'s order and kept alive until the copy has finished.
    pub(crate) unsafe fn h2d_async(
        &self,
        ctx: &ContextGuard,
        dst: &DeviceAlloc,
        at: usize,
        stream: &Stream,
    ) -> Result<()> {
        check_range("pinned source", at, self.nbytes, dst.nbytes())?;
        if self.nbytes == 0 {
            return Ok(());
        }
        let src = self.bytes().as_ptr();
        // SAFETY: the source is nbytes of our page-locked block (obligation 1 keeps it
        // alive); the destination range is inside `dst` (checked above; obligation 2).
        unsafe { driver::memcpy_h2d_async(ctx, dst.addr(at), src, self.nbytes, stream) }
    }
}

/// The bounded pool of page-locked blocks that D2H outputs live in (when the caller asks
/// for page-locked outputs, the default).
///
/// A D2H batch takes one block, its tensors are views into it, and the block comes back
/// to the pool when the last of them drops. The pool holds at most `max_bytes` (default
/// 2 GiB, `PINLANE_PINNED_OUTPUT_BYTES`); when a batch does not fit even after freeing the
/// unused blocks, the call falls back to pageable outputs.
///
/// ```
/// let pool = pinlane::memory::PinnedOutputPool::global();
/// assert!(pool.held_bytes() <= pool.max_bytes());
/// ```
pub struct PinnedOutputPool {
    max_bytes: usize,
    state: Mutex<PoolState>,
}

struct PoolState {
    /// Free blocks: address, length, and the device whose context allocated them.
    free: Vec<(Handle<*mut u8>, usize, usize)>,
    /// Bytes allocated: free blocks plus blocks handed out.
    held: usize,
}

/// Blocks are allocated in multiples of this, so batches of slightly different sizes
/// reuse each other's blocks.
const BLOCK_ROUND: usize = 2 << 20;

impl PinnedOutputPool {
    /// The process-wide pool.
    pub fn global() -> &'static PinnedOutputPool {
        static POOL: OnceLock<PinnedOutputPool> = OnceLock::new();
        POOL.get_or_init(|| PinnedOutputPool {
            max_bytes: crate::env_knob("PINLANE_PINNED_OUTPUT_BYTES").unwrap_or(2 << 30),
            state: Mutex::new(PoolState {
                free: Vec::new(),
                held: 0,
            }),
        })
    }

    /// Most page-locked bytes the pool holds.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    /// Page-locked bytes the pool holds now (free blocks and blocks in use).
    pub fn held_bytes(&self) -> usize {
        self.lock().held
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A block of at least `nbytes` (> 0), or `None` when the cap does not allow one. A
    /// new block is allocated under `device`'s context; a free one is reused whatever
    /// context allocated it (page-locked memory is portable).
    pub(crate) fn take(
        &'static self,
        nbytes: usize,
        device: usize,
    ) -> Result<Option<Arc<PinnedBlock>>> {
        let want = nbytes.div_ceil(BLOCK_ROUND).saturating_mul(BLOCK_ROUND);
        let mut to_free = Vec::new();
        let reuse = {
            let mut st = self.lock();
            let best = st
                .free
                .iter()
                .enumerate()
                .filter(|(_, (_, len, _))| *len >= nbytes && *len <= want.saturating_mul(2))
                .min_by_key(|(_, (_, len, _))| *len)
                .map(|(i, _)| i);
            match best {
                Some(i) => Some(st.free.swap_remove(i)),
                None => {
                    // Free unused blocks until the new one fits under the cap.
                    while st.held + want > self.max_bytes {
                        let Some(b) = st.free.pop() else { break };
                        st.held -= b.1;
                        to_free.push(b);
                    }
                    if st.held + want > self.max_bytes {
                        // Give the unused blocks back rather than freeing them for nothing.
                        for b in to_free.drain(..) {
                            st.held += b.1;
                            st.free.push(b);
                        }
                        return Ok(None);
                    }
                    st.held += want;
                    None
                }
            }
        };
        for (ptr, _, owner_device) in to_free {
            // SAFETY: free blocks are touched by no copy (a block returns to the free list
            // only when its last view drops, after its copies were proven complete).
            if let Err(e) = unsafe { free_pinned(ptr, owner_device) } {
                driver::deferred::record(e);
            }
        }
        if let Some((ptr, len, device)) = reuse {
            return Ok(Some(Arc::new(PinnedBlock {
                ptr,
                len,
                release: Release::Pool { pool: self, device },
            })));
        }
        match alloc_block(want, device, Some(self)) {
            Ok(b) => Ok(Some(b)),
            Err(e) => {
                self.lock().held -= want;
                Err(e)
            }
        }
    }

    fn give_back(&self, ptr: Handle<*mut u8>, len: usize, device: usize) {
        self.lock().free.push((ptr, len, device));
    }
}
