//! [`HostBuf`]: pageable host bytes of one tensor, and the recycling pool that D2H
//! outputs are carved from.

use crate::driver::HostPtr;
use crate::error::Result;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes of a host buffer, whatever they came in.
///
/// `all_bytes` returns the same slice (address and length) on every call, for the
/// value's whole life: [`HostBuf`] keeps the address once and reads through it while it
/// holds the value. Every implementation here holds its bytes unmoved: a `Vec` that is
/// never mutated, or memory behind a fixed pointer. The address is stable, not always
/// the bytes: memory with a [`write_ptr`](HostBytes::write_ptr) may be written through
/// it (copies into existing tensors), and pinlane's own copies ([`Words`]: D2H output
/// regions, `Tensor::from_bytes`) may be handed to a consumer that writes them (the
/// Python package hands them to torch writable); so `HostBuf` reads through
/// [`base`](HostBytes::base), not a pointer derived from a `&[u8]`, and once a view is
/// handed over writable pinlane makes no reference to its bytes.
trait HostBytes: Send + Sync {
    fn all_bytes(&self) -> &[u8];

    /// How many bytes `all_bytes` holds, asked without making a reference to them.
    fn len(&self) -> usize {
        self.all_bytes().len()
    }

    /// The bytes' address with the right to write them, where there is one: only memory
    /// handed over as a raw pointer (a DLPack import), never memory pinlane or a Rust
    /// owner holds as a shared `&[u8]`.
    fn write_ptr(&self) -> Option<*mut u8> {
        None
    }

    /// The address `HostBuf` reads the bytes through, and exports them at: the write
    /// pointer of writable memory (the pointer copies into existing tensors write
    /// through), else the bytes' own. pinlane's own copies' is a pointer with the right to
    /// write, though pinlane never writes them: the Python package hands those tensors to
    /// torch, which has no read-only tensors ([`Words`]).
    fn base(&self) -> *mut u8 {
        self.write_ptr()
            .unwrap_or_else(|| self.all_bytes().as_ptr().cast_mut())
    }
}

impl<T: bytemuck::Pod + Send + Sync> HostBytes for Vec<T> {
    fn all_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
}

/// Bytes that another owner keeps alive (a `Vec`, `bytes::Bytes`, a memory map, a DLPack
/// producer's deleter): `len` bytes at `ptr`, valid and unchanged until the owner drops.
///
/// The owner is held as a raw pointer from `Box::into_raw` (not as a `Box`), so that a
/// pointer into an owner that stores its bytes inline (an array) stays valid: moving a
/// `Box` would assert unique access to its contents and invalidate it.
struct Foreign {
    /// From `Box::into_raw`; turned back into a box and dropped, once, in `Drop`.
    owner: *mut (dyn Send + Sync),
    ptr: *const u8,
    len: usize,
    /// The memory may be written by copies into existing tensors: `ptr` came as a raw
    /// pointer from its producer (not from a reference into the owner), and the importer
    /// took it as writable (see `from_raw_parts`).
    writable: bool,
}

// SAFETY: `ptr` only points into memory that the owner keeps alive and that pinlane only
// reads, except through `write_ptr` under the unsafe contract of the call that writes
// (nothing else reads or writes the bytes meanwhile); sending or sharing a `Foreign`
// sends or shares the owner, which is Send + Sync.
unsafe impl Send for Foreign {}
// SAFETY: as above: `&Foreign` gives shared reads, and writes only under that contract.
unsafe impl Sync for Foreign {}

impl Foreign {
    /// # Safety
    /// `ptr..ptr+len` is readable memory that stays valid and unchanged until `owner`
    /// (from `Box::into_raw`, handed over) is dropped, on any thread.
    unsafe fn new(owner: *mut (dyn Send + Sync), ptr: *const u8, len: usize) -> Foreign {
        Foreign {
            owner,
            ptr,
            len,
            writable: false,
        }
    }
}

impl HostBytes for Foreign {
    fn all_bytes(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr+len` is valid, unchanged memory while the owner lives (the
        // constructor's contract), and the owner lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn write_ptr(&self) -> Option<*mut u8> {
        (self.writable && self.len > 0).then_some(self.ptr.cast_mut())
    }
}

impl Drop for Foreign {
    fn drop(&mut self) {
        // SAFETY: `owner` came from `Box::into_raw` (the constructor's contract) and is
        // turned back into a box only here, once.
        drop(unsafe { Box::from_raw(self.owner) });
    }
}

/// Pageable host bytes: a view of `nbytes` at `offset` into shared, immutable data, which
/// is the `Vec` a tensor was built from (kept as is, no copy), a copy made by pinlane, or
/// one D2H batch's output region (recycled through [`HostPool`] when its last view drops).
///
/// # Memory layout
///
/// ```text
///  data (Vec<T>, Vec<u64> or a pooled region) ─► [ ... | b0 b1 ... b(nbytes-1) | ... ]
///                                                       ^offset
/// ```
///
/// The data starts aligned for `T` (or 8), and region offsets are multiples of 256, so
/// typed views of every dtype are aligned.
///
/// The view also keeps the address of its first byte (`at`), taken from `data` when the
/// view is made: reading the bytes then touches no memory of the owner's. A batch's
/// sources are usually cold in the CPU caches (their bytes were just streamed past), and
/// asking each owner for its address took one cache miss per tensor, 20 to 30 us for
/// a thousand.
#[derive(Clone)]
pub(crate) struct HostBuf {
    data: Arc<dyn HostBytes>,
    offset: usize,
    nbytes: usize,
    /// The address of `data`'s bytes at `offset` (see `new`): only read through.
    at: HostPtr<u8>,
}

impl HostBuf {
    /// The view of `nbytes` at `offset` of `data`'s bytes (the caller has checked that it
    /// is inside them).
    fn new(data: Arc<dyn HostBytes>, offset: usize, nbytes: usize) -> HostBuf {
        let base = data.base();
        HostBuf::inside(data, offset, nbytes, base)
    }

    /// As [`HostBuf::new`], with `data`'s [`base`](HostBytes::base) already asked (once
    /// for many views of one region).
    fn inside(data: Arc<dyn HostBytes>, offset: usize, nbytes: usize, base: *mut u8) -> HostBuf {
        debug_assert!(offset.checked_add(nbytes).is_some_and(|e| e <= data.len()));
        HostBuf {
            data,
            offset,
            nbytes,
            at: HostPtr(base.wrapping_add(offset)),
        }
    }

    /// Takes a `Vec` without copying it.
    pub(crate) fn from_vec<T: bytemuck::Pod + Send + Sync>(v: Vec<T>) -> HostBuf {
        let nbytes = std::mem::size_of_val(v.as_slice());
        HostBuf::new(Arc::new(v), 0, nbytes)
    }

    /// The bytes `owner.as_ref()` returns, without a copy; `owner` is dropped (exactly
    /// once) when the last view drops. The owner's `as_ref` is called once, here.
    pub(crate) fn from_owner<O: AsRef<[u8]> + Send + Sync + 'static>(owner: O) -> HostBuf {
        // On the heap first, so the owner's address is final before its bytes are asked
        // for; held through the raw pointer from here on (see `Foreign`).
        let raw: *mut O = Box::into_raw(Box::new(owner));
        // SAFETY: `raw` is a live, exclusively ours allocation from Box::into_raw.
        let bytes = unsafe { (*raw).as_ref() };
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        // SAFETY: the slice borrows from the owner (or from memory it keeps alive), which
        // is never moved or mutated again (no `&mut` to it is ever made), so the bytes stay
        // valid and unchanged until `Foreign` drops it; `raw` is handed over.
        let foreign = unsafe { Foreign::new(raw, ptr, len) };
        HostBuf::from_foreign(foreign)
    }

    /// `len` bytes at `ptr`, kept alive by `owner`; `writable`: copies into existing
    /// tensors may write them ([`HostBuf::write_ptr`]).
    ///
    /// # Safety
    /// `ptr..ptr+len` is readable host memory that stays valid until `owner` is dropped
    /// (on any thread), and unchanged except by the writes `writable` allows, which the
    /// memory must then permit (not mapped read-only); `ptr` is non-null when `len > 0`.
    /// The bytes must not lie inside the owner's own allocation (use
    /// [`HostBuf::from_owner`] for that).
    pub(crate) unsafe fn from_raw_parts(
        ptr: *const u8,
        len: usize,
        owner: Box<dyn Send + Sync>,
        writable: bool,
    ) -> HostBuf {
        // SAFETY: the caller's contract; the owner is handed over through into_raw.
        let mut foreign = unsafe { Foreign::new(Box::into_raw(owner), ptr, len) };
        foreign.writable = writable;
        HostBuf::from_foreign(foreign)
    }

    fn from_foreign(f: Foreign) -> HostBuf {
        let nbytes = f.len;
        HostBuf::new(Arc::new(f), 0, nbytes)
    }

    /// A copy of `bytes`, aligned to 8 ([`Words`]: a consumer it is exported to may write
    /// it).
    pub(crate) fn copy_of(bytes: &[u8]) -> HostBuf {
        let mut words = vec![0u64; bytes.len().div_ceil(8)];
        bytemuck::cast_slice_mut::<u64, u8>(&mut words)[..bytes.len()].copy_from_slice(bytes);
        HostBuf::new(Arc::new(Words::new(words, None)), 0, bytes.len())
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: `at` is the address of `data.all_bytes()[offset..]` (taken in `new` or
        // `views`, where `offset + nbytes` was checked to be inside those bytes; for
        // writable memory through the pointer it is written through), and `all_bytes`
        // returns the same bytes for `data`'s whole life (the `HostBytes` contract), which
        // lasts at least as long as `self`; the address is non-null and aligned, as a
        // slice's always is. The bytes are not written while a `&` to them exists (the
        // owners' contracts; `write_ptr` writes only while nothing reads them, and a
        // consumer pinlane's own copies are handed to writable holds their only view).
        unsafe { std::slice::from_raw_parts(self.at.0, self.nbytes) }
    }

    /// The view's first byte with the right to write it, for memory handed over as a raw
    /// pointer (a DLPack import); `None` for memory pinlane or a Rust value owns.
    /// Writing is sound only while nothing reads or writes the bytes otherwise.
    pub(crate) fn write_ptr(&self) -> Option<*mut u8> {
        let p = self.data.write_ptr()?;
        Some(p.wrapping_add(self.offset))
    }

    /// The view's first byte, as an address to hand out (a DLPack export): the pointer
    /// the view reads through ([`HostBytes::base`]), not one derived from `bytes()`.
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.at.0
    }

    /// Where the view starts in its owner's bytes.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// Whether both are views into the bytes of one owner.
    pub(crate) fn same_owner(&self, other: &HostBuf) -> bool {
        std::ptr::addr_eq(Arc::as_ptr(&self.data), Arc::as_ptr(&other.data))
    }

    /// Whether two views are the same bytes of the same data.
    pub(crate) fn same_as(&self, other: &HostBuf) -> bool {
        self.same_owner(other) && self.offset == other.offset && self.nbytes == other.nbytes
    }
}

/// A writable output region of one D2H batch, taken from the [`HostPool`]. Filled first,
/// then frozen and split into [`HostBuf`] views.
pub(crate) struct HostRegion {
    words: Vec<u64>,
    nbytes: usize,
    pool: Arc<HostPool>,
    /// Set by [`HostRegion::freeze`], which hands the words (and their return to the
    /// pool) to the frozen region.
    frozen: bool,
}

impl HostRegion {
    /// A region of at least `nbytes`, recycled (already faulted in) when `pool` has one.
    pub(crate) fn take(pool: &Arc<HostPool>, nbytes: usize) -> HostRegion {
        let words = pool.take(nbytes.div_ceil(8));
        HostRegion {
            words,
            nbytes,
            pool: pool.clone(),
            frozen: false,
        }
    }

    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        &mut bytemuck::cast_slice_mut::<u64, u8>(&mut self.words)[..self.nbytes]
    }

    /// Freezes the region; [`HostBuf::view`] then carves tensors out of it.
    pub(crate) fn freeze(mut self) -> FrozenRegion {
        self.frozen = true;
        let words = std::mem::take(&mut self.words);
        FrozenRegion(Arc::new(Words::new(words, Some(self.pool.clone()))))
    }
}

/// A filled, immutable output region.
pub(crate) struct FrozenRegion(Arc<Words>);

impl Drop for HostRegion {
    /// A region dropped before it was frozen (a failed call) goes back to its pool too.
    fn drop(&mut self) {
        if !self.frozen {
            self.pool.give_back(std::mem::take(&mut self.words));
        }
    }
}

impl HostBuf {
    /// Views of a frozen region for each `(offset, nbytes)`: one batch's output tensors.
    /// Every range is checked first, then the views are made lazily, as the caller takes
    /// them.
    ///
    /// # Errors
    /// The first range outside the region.
    pub(crate) fn views<'a>(
        region: &'a FrozenRegion,
        ranges: impl ExactSizeIterator<Item = (usize, usize)> + Clone + 'a,
    ) -> Result<impl ExactSizeIterator<Item = HostBuf> + 'a> {
        let (base, len) = (region.0.base(), region.0.len());
        for (offset, nbytes) in ranges.clone() {
            if offset.checked_add(nbytes).is_none_or(|e| e > len) {
                super::check_range("host view", offset, nbytes, len)?;
            }
        }
        // Every range is inside the region (checked above); its address is asked once,
        // not once per view.
        Ok(ranges
            .map(move |(offset, nbytes)| HostBuf::inside(region.0.clone(), offset, nbytes, base)))
    }
}

/// Words pinlane filled and now only reads: a copy (`Tensor::from_bytes`) or a frozen
/// D2H output region, which goes back to its [`HostPool`] when the last view drops.
///
/// The bytes are read (and exported) through `base`, a pointer taken from the `Vec` with
/// `as_mut_ptr` while it was ours alone: the Python package hands these tensors to torch
/// writable (torch has no read-only tensors), and a write through a pointer derived from
/// a shared `&[u8]` would be undefined behaviour (Miri flags it:
/// `exported_output_regions_may_be_written_through_their_data_pointer`). pinlane itself
/// never writes them.
struct Words {
    /// The buffer, kept to own (and give back) its memory; its bytes are reached through
    /// `base` only.
    words: Vec<u64>,
    base: *mut u8,
    /// The pool an output region goes back to (`None` for a copy).
    pool: Option<Arc<HostPool>>,
}

// SAFETY: the one field that is not Send is `base`, a pointer into `words`' buffer, which
// `Words` owns and never moves, reallocates or writes until it is dropped; `Words` only
// reads through it.
unsafe impl Send for Words {}
// SAFETY: as above: `&Words` gives reads of an unmoving buffer.
unsafe impl Sync for Words {}

impl Words {
    /// `words`, given back to `pool` when dropped, if there is one.
    fn new(mut words: Vec<u64>, pool: Option<Arc<HostPool>>) -> Words {
        let base = words.as_mut_ptr().cast::<u8>();
        Words { words, base, pool }
    }
}

impl HostBytes for Words {
    fn all_bytes(&self) -> &[u8] {
        // SAFETY: `base` is `words`' buffer (taken in `new`), `len()` its size in bytes;
        // the buffer is neither moved nor freed before `self` drops.
        unsafe { std::slice::from_raw_parts(self.base, self.len()) }
    }

    /// From the `Vec` itself, not from a slice of its words (a reference to the bytes
    /// would be a read of memory a consumer may be writing).
    fn len(&self) -> usize {
        self.words.len() * std::mem::size_of::<u64>()
    }

    fn base(&self) -> *mut u8 {
        self.base
    }
}

impl Drop for Words {
    fn drop(&mut self) {
        if let Some(pool) = &self.pool {
            pool.give_back(std::mem::take(&mut self.words));
        }
    }
}

/// Recycled pageable output memory of the [`Runtime`](crate::runtime::Runtime).
///
/// Writing into freshly allocated memory is bound by page faults (5 to 7 GB/s on one
/// thread), far below the link; so D2H output regions come back here when their last
/// tensor drops, already faulted in, and the next batch of a similar size reuses one.
/// Bounded: at most [`Config::host_pool_bytes`](crate::config::Config::host_pool_bytes) are kept;
/// the oldest cached regions are freed to make room for a newer one.
pub struct HostPool {
    max_bytes: AtomicUsize,
    state: Mutex<HostPoolState>,
}

#[derive(Default)]
struct HostPoolState {
    free: Vec<Vec<u64>>,
    /// Bytes of `free`.
    cached: usize,
    /// Bytes and count of regions handed out and not back yet.
    in_use: usize,
    in_use_count: usize,
    /// Highest `cached + in_use`.
    peak: usize,
}

impl HostPool {
    pub(crate) fn new(max_bytes: usize) -> HostPool {
        HostPool {
            max_bytes: AtomicUsize::new(max_bytes),
            state: Mutex::new(HostPoolState::default()),
        }
    }

    /// Most bytes kept for reuse.
    pub fn max_bytes(&self) -> usize {
        self.max_bytes.load(Ordering::Relaxed)
    }

    /// Bytes kept for reuse now.
    pub fn cached_bytes(&self) -> usize {
        self.lock().cached
    }

    pub(crate) fn set_max_bytes(&self, bytes: usize) {
        self.max_bytes.store(bytes, Ordering::Relaxed);
        let evicted = {
            let mut st = self.lock();
            let mut evicted = Vec::new();
            while st.cached > bytes && !st.free.is_empty() {
                let old = st.free.remove(0);
                st.cached -= old.len() * 8;
                evicted.push(old);
            }
            evicted
        };
        drop(evicted); // freed outside the lock
    }

    /// Frees every cached region.
    pub(crate) fn trim(&self) {
        let free = {
            let mut st = self.lock();
            st.cached = 0;
            std::mem::take(&mut st.free)
        };
        drop(free);
    }

    pub(crate) fn stats(&self) -> super::PoolStats {
        let st = self.lock();
        super::PoolStats {
            held_bytes: st.cached + st.in_use,
            in_use_bytes: st.in_use,
            in_use_count: st.in_use_count,
            peak_bytes: st.peak,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HostPoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of at least `words` words: the smallest cached one no more than twice
    /// that size, else a new one.
    fn take(&self, words: usize) -> Vec<u64> {
        let found = {
            let mut st = self.lock();
            let best = st
                .free
                .iter()
                .enumerate()
                .filter(|(_, v)| v.len() >= words && v.len() <= words.saturating_mul(2).max(8))
                .min_by_key(|(_, v)| v.len())
                .map(|(i, _)| i);
            let found = best.map(|i| st.free.swap_remove(i));
            let len = found.as_ref().map_or(words, Vec::len) * 8;
            if let Some(f) = &found {
                st.cached -= f.len() * 8;
            }
            st.in_use += len;
            st.in_use_count += 1;
            st.peak = st.peak.max(st.cached + st.in_use);
            found
        };
        found.unwrap_or_else(|| vec![0u64; words])
    }

    /// Keeps `v` for reuse, evicting the oldest cached buffers if the cap needs it (the
    /// newest is the likeliest to fit the next batch); a buffer larger than the cap is
    /// freed.
    fn give_back(&self, v: Vec<u64>) {
        let max = self.max_bytes();
        let evicted = {
            let mut st = self.lock();
            st.in_use = st.in_use.saturating_sub(v.len() * 8);
            st.in_use_count = st.in_use_count.saturating_sub(1);
            if v.is_empty() || v.len() * 8 > max {
                drop(st);
                return; // `v` is freed here
            }
            let mut evicted = Vec::new();
            while st.cached + v.len() * 8 > max && !st.free.is_empty() {
                let old = st.free.remove(0);
                st.cached -= old.len() * 8;
                evicted.push(old);
            }
            st.cached += v.len() * 8;
            st.free.push(v);
            evicted
        };
        drop(evicted); // freed outside the lock
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_vec_keeps_bytes_and_alignment() {
        let b = HostBuf::from_vec(vec![1.0f64, 2.0]);
        assert_eq!(b.bytes().len(), 16);
        assert_eq!(b.bytes().as_ptr() as usize % 8, 0);
        assert_eq!(bytemuck::cast_slice::<u8, f64>(b.bytes()), &[1.0, 2.0]);
    }

    #[test]
    fn foreign_owners_are_read_in_place_and_dropped_once() {
        // An owner that stores its bytes inline: the pointer points into the owner itself.
        let inline = HostBuf::from_owner([7u8, 8, 9]);
        let moved = [inline.clone(), inline]; // the views move; the owner does not
        assert_eq!(moved[1].bytes(), &[7, 8, 9]);
        // An owner whose bytes live elsewhere, with a drop counter.
        struct Owner(Vec<u8>, std::sync::Arc<std::sync::atomic::AtomicUsize>);
        impl AsRef<[u8]> for Owner {
            fn as_ref(&self) -> &[u8] {
                &self.0
            }
        }
        impl Drop for Owner {
            fn drop(&mut self) {
                self.1.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
        let drops = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let b = HostBuf::from_owner(Owner(vec![1, 2, 3, 4], drops.clone()));
        let c = b.clone();
        drop(b);
        assert_eq!(c.bytes(), &[1, 2, 3, 4]);
        assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 0);
        drop(c);
        assert_eq!(drops.load(std::sync::atomic::Ordering::SeqCst), 1);
        assert_eq!(HostBuf::from_owner(Vec::<u8>::new()).bytes(), &[] as &[u8]);
    }

    #[test]
    fn copy_of_odd_length_is_exact() {
        let b = HostBuf::copy_of(&[1, 2, 3]);
        assert_eq!(b.bytes(), &[1, 2, 3]);
        assert_eq!(b.bytes().as_ptr() as usize % 8, 0);
        assert_eq!(HostBuf::copy_of(&[]).bytes(), &[] as &[u8]);
    }

    #[test]
    fn regions_are_recycled_and_views_see_their_bytes() {
        let pool = Arc::new(HostPool::new(1 << 20));
        let mut r = HostRegion::take(&pool, 1000);
        r.bytes_mut()[256..260].copy_from_slice(&[9, 8, 7, 6]);
        let ptr = r.bytes_mut().as_ptr() as usize;
        let frozen = r.freeze();
        // Out-of-range views are errors, not empty views (1000 bytes round up to 1000).
        assert!(HostBuf::views(&frozen, [(1000, 1)].into_iter()).is_err());
        assert!(HostBuf::views(&frozen, [(0, 4), (usize::MAX, 2)].into_iter()).is_err());
        let v = HostBuf::views(&frozen, [(256, 4)].into_iter())
            .unwrap()
            .next()
            .unwrap();
        assert_eq!(v.bytes(), &[9, 8, 7, 6]);
        drop(frozen);
        assert_eq!(v.bytes(), &[9, 8, 7, 6], "a view keeps the region alive");
        drop(v);
        // The region went back to the pool; a request of the same size gets it again.
        assert_eq!(pool.stats().in_use_bytes, 0);
        assert_eq!(pool.stats().in_use_count, 0);
        assert_eq!(pool.cached_bytes(), 1000usize.div_ceil(8) * 8);
        let mut again = HostRegion::take(&pool, 1000);
        assert_eq!(again.bytes_mut().as_ptr() as usize, ptr);
        assert_eq!(pool.stats().in_use_count, 1);
        drop(again);
        assert_eq!(
            pool.stats().in_use_count,
            0,
            "an unfrozen region goes back too"
        );
        pool.trim();
        assert_eq!(pool.stats().held_bytes, 0);
    }
}
