//! The bounded pool of page-locked blocks that D2H outputs (and producers' buffers) take
//! their ranges from: [`PinnedOutputPool`].

use super::pinned::{alloc_block, BlockPool, PinnedBlock};
use crate::driver::HostPtr;
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// The bounded pool of page-locked blocks that D2H outputs live in (when the caller asks
/// for page-locked outputs, the default), owned by the [`Runtime`](crate::runtime::Runtime).
///
/// A D2H batch takes a range of one block, its tensors are views into it, and the block
/// comes back to the pool when the last view of it drops. Batches of at least
/// [`SHARE_MAX`] bytes get a block of their own (rounded up to 2 MiB, so batches of
/// slightly different sizes reuse each other's blocks); smaller batches share 2 MiB
/// blocks, each taking a 256-byte-aligned range, so keeping many small batches alive does
/// not take a block each. The pool holds at most
/// [`Config::pinned_output_bytes`](crate::config::Config::pinned_output_bytes). A free block
/// serves a batch it fits that needs at least half of it, and, where a new block would
/// not fit under the cap, any batch of [`SHARE_MAX`] or more it fits (a free waits for
/// the device and holds every thread's copies meanwhile, so reusing a larger block beats
/// freeing it); otherwise unused blocks are freed to make room, and when a batch does
/// not fit even then, the call falls back to pageable outputs (counted in [`MemoryStats::pageable_fallbacks`](crate::runtime::MemoryStats::pageable_fallbacks)).
/// So does a call whose new block the host cannot page-lock (`cuMemHostAlloc` out of
/// memory) when no free block is large enough; the pool's free blocks are then freed,
/// off the call's path.
pub struct PinnedOutputPool {
    max_bytes: AtomicUsize,
    state: Mutex<PoolState>,
    fallbacks: AtomicU64,
}

#[derive(Default)]
struct PoolState {
    /// Free blocks: address, length, and the device whose context allocated them.
    free: Vec<(HostPtr<u8>, usize, usize)>,
    /// Bytes allocated: free blocks plus blocks handed out.
    held: usize,
    /// Highest `held`.
    peak: usize,
    /// Blocks allocated (free or handed out).
    blocks: usize,
    /// The block small batches share now, and where its next range starts.
    shared: Option<(Arc<PinnedBlock>, usize)>,
}

impl PoolState {
    /// Takes every free block off the free list, for the caller to free.
    fn drain_free(&mut self) -> Vec<(HostPtr<u8>, usize, usize)> {
        let free = std::mem::take(&mut self.free);
        self.held -= free.iter().map(|b| b.1).sum::<usize>();
        self.blocks -= free.len();
        free
    }
}

/// Blocks are allocated in multiples of this.
const BLOCK_ROUND: usize = 2 << 20;

/// Bytes of the block of its own a range of `nbytes` takes: rounded up to [`BLOCK_ROUND`].
fn block_bytes(nbytes: usize) -> usize {
    nbytes.div_ceil(BLOCK_ROUND).saturating_mul(BLOCK_ROUND)
}

/// Batches smaller than this share blocks (see [`PinnedOutputPool`]).
pub const SHARE_MAX: usize = 256 << 10;

/// Alignment of a batch's range inside a shared block (the device layout's alignment).
const SHARE_ALIGN: usize = super::DEVICE_ALIGN;

/// What [`PinnedOutputPool::take`] gives.
pub(crate) enum Taken {
    /// A block and the offset of the range in it.
    Range(Arc<PinnedBlock>, usize),
    /// The cap leaves no room.
    AtCap,
    /// The host can page-lock no more (`cuMemHostAlloc`'s out-of-memory error), and no
    /// free block is large enough; the pool's free blocks are being freed.
    HostFull(Error),
}

impl PinnedOutputPool {
    pub(crate) fn new(max_bytes: usize) -> PinnedOutputPool {
        PinnedOutputPool {
            max_bytes: AtomicUsize::new(max_bytes),
            state: Mutex::new(PoolState::default()),
            fallbacks: AtomicU64::new(0),
        }
    }

    /// Most page-locked bytes the pool holds.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes.load(Ordering::Relaxed)
    }

    /// Page-locked bytes the pool holds now (free blocks and blocks in use).
    pub fn held_bytes(&self) -> usize {
        self.lock().held
    }

    pub(crate) fn fallbacks(&self) -> u64 {
        self.fallbacks.load(Ordering::Relaxed)
    }

    pub(crate) fn stats(&self) -> super::PoolStats {
        let st = self.lock();
        let free: usize = st.free.iter().map(|b| b.1).sum();
        // The shared block stays current after its ranges' tensors are gone: with no
        // view left (only the pool's reference), it counts as unused.
        let idle_shared = match &st.shared {
            Some((b, _)) if Arc::strong_count(b) == 1 => b.len(),
            _ => 0,
        };
        super::PoolStats {
            held_bytes: st.held,
            in_use_bytes: st.held - free - idle_shared,
            in_use_count: st.blocks - st.free.len() - usize::from(idle_shared > 0),
            peak_bytes: st.peak,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn set_max_bytes(&self, bytes: usize) -> Result<()> {
        self.max_bytes.store(bytes, Ordering::Relaxed);
        let excess = {
            let mut st = self.lock();
            let mut out = Vec::new();
            while st.held > bytes {
                let Some(b) = st.free.pop() else { break };
                st.held -= b.1;
                st.blocks -= 1;
                out.push(b);
            }
            out
        };
        free_blocks(excess)
    }

    /// Frees every unused block (the shared block too, if no batch uses it).
    pub(crate) fn trim(&self) -> Result<()> {
        let shared = {
            let mut st = self.lock();
            match &st.shared {
                Some((b, _)) if Arc::strong_count(b) == 1 => st.shared.take(),
                _ => None,
            }
        };
        drop(shared); // outside the lock: it goes back on the free list
        let free = self.lock().drain_free();
        free_blocks(free)
    }

    /// A range of at least `nbytes` (> 0) bytes: a block and the offset where the range
    /// starts ([`Taken::Range`]), or why there is none. A new block is allocated under
    /// `device`'s context; a free one is reused whatever context allocated it (page-locked
    /// memory is portable).
    pub(crate) fn take(self: &Arc<Self>, nbytes: usize, device: usize) -> Result<Taken> {
        if nbytes < SHARE_MAX {
            self.take_shared(nbytes, device)
        } else {
            self.take_block(nbytes, device, true)
        }
    }

    /// Counts a D2H batch that got pageable outputs for want of a block
    /// ([`MemoryStats::pageable_fallbacks`](crate::runtime::MemoryStats::pageable_fallbacks)).
    pub(crate) fn fell_back(&self) {
        self.fallbacks.fetch_add(1, Ordering::Relaxed);
    }

    /// Whether `more` bytes after a range of `nbytes` (> 0) cost at most one more step of
    /// the shared block: below [`SHARE_MAX`] (ranges there take 256-byte steps of a
    /// shared block), or where a block of its own is rounded up to 2 MiB anyway. A range
    /// that would need a larger block (outputs of exactly 2 MiB, say) is refused.
    pub(crate) fn room_after(nbytes: usize, more: usize) -> bool {
        let with = nbytes.saturating_add(more);
        if with < SHARE_MAX {
            return true;
        }
        nbytes >= SHARE_MAX && with <= block_bytes(nbytes)
    }

    /// A range of the shared block, starting a new shared block when it is full.
    fn take_shared(self: &Arc<Self>, nbytes: usize, device: usize) -> Result<Taken> {
        let step = nbytes.div_ceil(SHARE_ALIGN) * SHARE_ALIGN;
        {
            let mut st = self.lock();
            if let Some((block, next)) = &mut st.shared {
                if *next + step <= block.len() {
                    let at = *next;
                    *next += step;
                    return Ok(Taken::Range(block.clone(), at));
                }
            }
        }
        // (No larger free block at the cap: the shared block stays current until it
        // fills in 256-byte steps, and would keep a large block from large batches.)
        let block = match self.take_block(BLOCK_ROUND, device, false)? {
            Taken::Range(block, _) => block,
            none => return Ok(none),
        };
        let old = self.lock().shared.replace((block.clone(), step));
        // Dropped outside the lock: the old block goes back to the free list once its
        // last view drops (now, if none is left).
        drop(old);
        Ok(Taken::Range(block, 0))
    }

    /// A block of its own of at least `nbytes` (at offset 0); `larger_at_cap`: where a new
    /// block would not fit under the cap, any larger free block serves before one is
    /// freed.
    fn take_block(
        self: &Arc<Self>,
        nbytes: usize,
        device: usize,
        larger_at_cap: bool,
    ) -> Result<Taken> {
        let want = block_bytes(nbytes);
        // The smallest free block of at least `nbytes` and at most `most` bytes.
        let fit = |free: &[(HostPtr<u8>, usize, usize)], most: usize| {
            free.iter()
                .enumerate()
                .filter(|(_, (_, len, _))| *len >= nbytes && *len <= most)
                .min_by_key(|(_, (_, len, _))| *len)
                .map(|(i, _)| i)
        };
        let mut to_free = Vec::new();
        let reuse = {
            let mut st = self.lock();
            let max = self.max_bytes();
            let over = |held: usize| held.checked_add(want).is_none_or(|n| n > max);
            // A free block of about the size; or, where a new block would not fit under
            // the cap, any larger one (for a batch's own block) before any is freed: a
            // free (`cuMemFreeHost`) waits for all work queued on the device, and while
            // it waits it holds every thread's copies (measured on an H100, session 68:
            // another thread's 1 MiB copy took 475 ms to queue while a free waited 480 ms
            // behind another stream's kernel; `benches/probes/free_hold.cu`).
            let best = fit(&st.free, want.saturating_mul(2))
                .or_else(|| (larger_at_cap && over(st.held)).then(|| fit(&st.free, usize::MAX))?);
            match best {
                Some(i) => Some(st.free.swap_remove(i)),
                None => {
                    // Free unused blocks until the new one fits under the cap (a size
                    // past `usize` never fits: session 64, it overflowed).
                    while over(st.held) {
                        let Some(b) = st.free.pop() else { break };
                        st.held -= b.1;
                        st.blocks -= 1;
                        to_free.push(b);
                    }
                    if over(st.held) {
                        // Give the unused blocks back rather than freeing them for nothing.
                        for b in to_free.drain(..) {
                            st.held += b.1;
                            st.blocks += 1;
                            st.free.push(b);
                        }
                        return Ok(Taken::AtCap);
                    }
                    // Reserved for the allocation below (the peak counts it once made).
                    st.held += want;
                    st.blocks += 1;
                    None
                }
            }
        };
        // SAFETY: unused blocks taken off the free list under the lock above. On the
        // reaper thread: this is a transfer's path.
        unsafe { free_later(to_free) };
        if let Some(free) = reuse {
            return Ok(Taken::Range(self.reused(free), 0));
        }
        match alloc_block(want, device, Some(self.clone())) {
            Ok(b) => {
                let mut st = self.lock();
                st.peak = st.peak.max(st.held);
                Ok(Taken::Range(b, 0))
            }
            Err(e) => {
                let (larger, idle) = {
                    let mut st = self.lock();
                    st.held -= want;
                    st.blocks -= 1;
                    if !e.is_out_of_memory() {
                        return Err(e);
                    }
                    // The host can page-lock no more: any free block large enough serves
                    // (the smallest), as at the cap; with none, the free blocks are given
                    // back for the calls after this one, which has none.
                    match fit(&st.free, usize::MAX) {
                        Some(i) => (Some(st.free.swap_remove(i)), Vec::new()),
                        None => (None, st.drain_free()),
                    }
                };
                if let Some(free) = larger {
                    return Ok(Taken::Range(self.reused(free), 0));
                }
                // SAFETY: the pool's free blocks, taken off the free list under its lock.
                unsafe { free_later(idle) };
                Ok(Taken::HostFull(e))
            }
        }
    }

    /// A free block taken off the free list, handed out again.
    fn reused(
        self: &Arc<Self>,
        (ptr, len, device): (HostPtr<u8>, usize, usize),
    ) -> Arc<PinnedBlock> {
        // SAFETY: a free-list entry: allocated by `alloc_block` under `device`'s context
        // for this pool, given back after its last view dropped, and taken off the list by
        // the caller under the pool's lock, so nothing else holds or frees it.
        unsafe { PinnedBlock::pooled(ptr, len, device, self.clone()) }
    }
}

impl BlockPool for PinnedOutputPool {
    /// Takes a block back whose last view dropped: on the free list, or freed when a
    /// lowered cap leaves no room for it.
    unsafe fn give_back(&self, ptr: HostPtr<u8>, len: usize, device: usize) {
        let excess = {
            let mut st = self.lock();
            if st.held > self.max_bytes() {
                st.held -= len;
                st.blocks -= 1;
                Some((ptr, len, device))
            } else {
                st.free.push((ptr, len, device));
                None
            }
        };
        // SAFETY: by `give_back`'s contract the block came from `host_alloc` under
        // `device`'s context for this pool, no copy touches it and nothing else frees it;
        // it was put on no list. On the reaper thread: this runs in a tensor's drop.
        unsafe { free_later(excess) };
    }
}

/// Frees pool blocks on the reaper thread (`cuMemFreeHost` waits for the whole context),
/// each under the context that allocated it.
///
/// # Safety
/// Each block came from `host_alloc` under its device's context for the pool, no copy
/// touches it (a block returns to the free list only when its last view drops, after its
/// copies were proven complete), and nothing else frees it: it was taken off the free
/// list under the pool's lock, or put on none.
unsafe fn free_later(blocks: impl IntoIterator<Item = (HostPtr<u8>, usize, usize)>) {
    for (ptr, _, device) in blocks {
        // SAFETY: the caller's obligations, for each block.
        unsafe { super::reaper::free_pinned_later(ptr, device) };
    }
}

/// Frees unused pool blocks, each under the context that allocated it.
fn free_blocks(blocks: Vec<(HostPtr<u8>, usize, usize)>) -> Result<()> {
    // SAFETY: free blocks are touched by no copy (a block returns to the free list only
    // when its last view drops, after its copies were proven complete), and these were
    // taken off the free list, so nothing else frees them.
    unsafe { super::reaper::free_all(blocks.into_iter().map(|(ptr, _, device)| (ptr, device))) }
}

#[cfg(test)]
mod tests {
    use super::{PinnedOutputPool as P, SHARE_MAX};

    #[test]
    fn room_after_outputs_never_needs_a_larger_block() {
        assert!(P::room_after(1024, 16), "shared steps");
        assert!(P::room_after(SHARE_MAX - 100, 16));
        assert!(
            !P::room_after(SHARE_MAX - 8, 16),
            "would need a block of its own"
        );
        assert!(P::room_after(SHARE_MAX, 16), "rounded to 2 MiB anyway");
        assert!(P::room_after((1 << 20) + 1, 16));
        assert!(!P::room_after(2 << 20, 16), "exactly 2 MiB");
        assert!(!P::room_after(1 << 30, 8), "exactly 1 GiB");
        assert!(P::room_after((1 << 30) - 64, 16));
    }
}
