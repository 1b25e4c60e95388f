//! Page-locked host memory that tensors own: [`PinnedBuf`] (a view into a
//! [`PinnedBlock`]), blocks a pool takes back ([`BlockPool`]; D2H outputs' pool is
//! [`super::output_pool`]), and the registry of pinlane's live registrations of host
//! memory in place.

use super::filling::{Fill, Ranges};
use super::reaper::free_pinned_in_policy;
use super::{check_range, DeviceAlloc, DeviceView};
use crate::driver::{self, ContextGuard, HostPtr, Stream};
use crate::error::Result;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

/// One block of page-locked memory: a `cuMemHostAlloc` allocation (portable) owned by
/// one tensor (freed on drop) or by the output pool (returned to it on drop), or memory
/// another owner page-locked (a DLPack import of `kDLCUDAHost`), released by dropping
/// that owner.
///
/// pinlane allocates page-locked memory under the context of the device the call works
/// with, and frees it under the same one: a process that uses only `cuda:1` never
/// creates a context on `cuda:0`. Portable memory is usable from every context.
pub(crate) struct PinnedBlock {
    ptr: HostPtr<u8>,
    len: usize,
    release: Release,
    /// Ranges that a D2H call's copies may still be writing (see [`super::filling`]).
    filling: Ranges,
}

impl PinnedBlock {
    /// The ranges D2H calls' copies may still be writing.
    pub(super) fn ranges(&self) -> &Ranges {
        &self.filling
    }

    /// Its length in bytes.
    pub(super) fn len(&self) -> usize {
        self.len
    }
}

/// A pool that takes its blocks back when their last view drops
/// ([`super::output_pool::PinnedOutputPool`]).
pub(super) trait BlockPool: Send + Sync {
    /// Takes back the block at `ptr` of `len` bytes, to hand out again or free.
    ///
    /// # Safety
    /// `ptr..ptr + len` came from `host_alloc` under `device`'s context, for this pool;
    /// its last view dropped (no copy touches it any more), and nothing else holds or
    /// frees it: only `PinnedBlock`'s drop calls this.
    unsafe fn give_back(&self, ptr: HostPtr<u8>, len: usize, device: usize);
}

/// How a [`PinnedBlock`] gives its memory back.
enum Release {
    /// Nothing to give back (an empty block).
    Nothing,
    /// `cuMemFreeHost` under `device`'s context.
    Free { device: usize },
    /// Back to a pool's free list (the output pool's).
    Pool {
        pool: Arc<dyn BlockPool>,
        device: usize,
    },
    /// Drop the owner that keeps it page-locked and alive (with the block). `writable`:
    /// copies into existing tensors may write it (the importer took it as writable).
    /// `registration`: pinlane's live registration that holds all of it, kept alive with
    /// the block (memory pinlane page-locked in place, imported or registered again).
    /// `mapped_on`: what the driver said of kernels reading it in place, per device
    /// ([`PinnedBlock::foreign_mapped`]).
    /// Fields drop in order: the registration (ended if this was its last holder)
    /// before the owner that may free the memory.
    Foreign {
        registration: Option<Arc<PinnedBlock>>,
        _owner: Box<dyn Send + Sync>,
        writable: bool,
        mapped_on: AtomicU64,
    },
    /// Memory of `owner`'s, page-locked in place (`cuMemHostRegister`): unregistered under
    /// `device`'s context, then `owner` drops.
    Registered {
        device: usize,
        owner: Option<Box<dyn Send + Sync>>,
    },
}

impl PinnedBlock {
    /// A block `pool` held free, handed out again: back to `pool` when its last view
    /// drops.
    ///
    /// # Safety
    /// `ptr..ptr + len` came from `host_alloc` under `device`'s context, for `pool`, and
    /// was taken off its free list: no copy touches it and nothing else holds or frees it.
    pub(super) unsafe fn pooled(
        ptr: HostPtr<u8>,
        len: usize,
        device: usize,
        pool: Arc<dyn BlockPool>,
    ) -> Arc<PinnedBlock> {
        Arc::new(PinnedBlock {
            ptr,
            len,
            release: Release::Pool { pool, device },
            filling: Ranges::pinned(),
        })
    }

    /// A block of no bytes (outputs of a batch whose tensors are all empty). Its pointer
    /// is aligned for every dtype, so typed views of it are empty slices, not errors.
    pub(crate) fn empty() -> Arc<PinnedBlock> {
        Arc::new(PinnedBlock {
            ptr: HostPtr(std::ptr::NonNull::<u64>::dangling().as_ptr().cast()),
            len: 0,
            release: Release::Nothing,
            filling: Ranges::pinned(),
        })
    }

    /// Marks `at..at + len` of the block as being written by a D2H call's copies, until
    /// [`Fill::done`]: reads of views that overlap it are refused meanwhile (see
    /// [`super::filling`]). Call it before any view of the range exists. `None` for an
    /// empty range (nothing to gate).
    pub(crate) fn start_fill(self: &Arc<Self>, at: usize, len: usize) -> Option<Fill> {
        Fill::start(self.clone(), at, len)
    }

    /// Whether a kernel may read the block at its host address (see [`PinnedBuf::mapped`]):
    /// memory pinlane allocated or registered (device-mapped and portable), or memory
    /// inside such a registration that the block holds.
    fn mapped(&self) -> bool {
        match &self.release {
            Release::Free { .. } | Release::Pool { .. } | Release::Registered { .. } => true,
            Release::Foreign { registration, .. } => registration.is_some(),
            Release::Nothing => false,
        }
    }

    /// Whether a 4-byte word at `offset` lies inside the block and is aligned.
    pub(crate) fn holds_word(&self, offset: usize) -> bool {
        offset.checked_add(4).is_some_and(|end| end <= self.len)
            && (self.ptr.0 as usize).wrapping_add(offset).is_multiple_of(4)
    }

    /// The address of byte `offset` (writes through it are the caller's to make safe).
    pub(crate) fn ptr_at(&self, offset: usize) -> *mut u8 {
        self.ptr.0.wrapping_add(offset)
    }

    /// Page-locked memory of another owner's (a DLPack import of `kDLCUDAHost`) that
    /// `owner` keeps alive: `len` bytes at `ptr`; inside `registration`, a live
    /// registration of pinlane's (torch's `is_pinned()` says true for its memory too),
    /// which the block then holds while it lives. The importer asks [`registered`] first:
    /// memory that overlaps a registration of pinlane's it cannot hold is to be taken as
    /// pageable instead.
    ///
    /// # Safety
    /// 1. `ptr..ptr+len` is page-locked (or at least readable) host memory that stays
    ///    valid and unchanged until `owner` is dropped; memory that another owner than
    ///    pinlane page-locked now stays page-locked until then (kernels may be told to read
    ///    it in place: [`PinnedBlock::foreign_mapped`]). Registrations of pinlane's are
    ///    pinlane's to track: the block holds the one it lies in, and is never read in
    ///    place through one it does not hold.
    /// 2. Dropping `owner` is what releases it, and may happen on any thread.
    /// 3. `registration`, when given, holds all of `ptr..ptr+len`.
    pub(crate) unsafe fn foreign_in(
        ptr: *mut u8,
        len: usize,
        owner: Box<dyn Send + Sync>,
        writable: bool,
        registration: Option<Arc<PinnedBlock>>,
    ) -> Arc<PinnedBlock> {
        Arc::new(PinnedBlock {
            ptr: HostPtr(ptr),
            len,
            release: Release::Foreign {
                registration,
                _owner: owner,
                writable,
                mapped_on: AtomicU64::new(0),
            },
            filling: Ranges::pinned(),
        })
    }

    /// Whether kernels of `ctx`'s device may read this block of another owner's (a DLPack
    /// import of `kDLCUDAHost`) at its host address. Inside a registration of pinlane's
    /// that the block holds: yes (registered device-mapped, portable). Overlapping one it
    /// does not hold (a part of one, or memory across two): no, whatever the driver says
    /// now, for that registration may end while the block lives. Otherwise the driver
    /// answers ([`driver::host_mapped_in_place`]: mapped at the same address, one
    /// allocation from the first byte to the last), asked once per device (of the first
    /// 32; later ones at every call) and remembered: the owner keeps that memory
    /// page-locked for the block's life (obligation 1 of [`PinnedBlock::foreign_in`]).
    /// `false` for pinlane's own blocks, which [`PinnedBlock::mapped`] answers.
    fn foreign_mapped(&self, ctx: &ContextGuard) -> bool {
        let Release::Foreign {
            mapped_on,
            registration,
            ..
        } = &self.release
        else {
            return false;
        };
        if registration.is_some() {
            return true;
        }
        let d = ctx.device();
        // Two bits a device: asked, and the answer.
        let bits = (d < 32).then(|| (1u64 << (2 * d), 1u64 << (2 * d + 1)));
        if let Some((asked, yes)) = bits {
            let known = mapped_on.load(Ordering::Relaxed);
            if known & asked != 0 {
                return known & yes != 0;
            }
        }
        // pinlane's registrations are on the registry from before the driver makes them
        // until after it has ended them, so one that made the driver say yes is seen by
        // one of the two looks, or was made between them (the registry's generation
        // moved). Either way the answer is not remembered: that registration may end
        // while the block lives. The looks take in the whole pages of the block's range,
        // whatever the driver maps by.
        let (at, len) = (self.ptr.0 as usize, self.len);
        let Some(before) = clear_of_live(at, len) else {
            return false;
        };
        let mapped = driver::host_mapped_in_place(ctx, self.ptr.0, self.len);
        if clear_of_live(at, len) != Some(before) {
            return false;
        }
        if let Some((asked, yes)) = bits {
            mapped_on.fetch_or(asked | if mapped { yes } else { 0 }, Ordering::Relaxed);
        }
        mapped
    }

    /// Whether copies into existing tensors may write this block: memory pinlane
    /// allocated, or imported as writable; never memory of a Rust value's page-locked in
    /// place (`register_pinned`), which other tensors may share.
    fn writable(&self) -> bool {
        match &self.release {
            Release::Free { .. } | Release::Pool { .. } => true,
            Release::Foreign { writable, .. } => *writable,
            Release::Nothing | Release::Registered { .. } => false,
        }
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
        match &mut self.release {
            Release::Nothing | Release::Foreign { .. } => {} // the owner drops with `self`
            Release::Registered { device, owner } => {
                let (device, ptr, owner) = (*device, self.ptr, owner.take());
                // `cuMemHostUnregister` waits for all work on the device, as a free does:
                // here or on the reaper thread by the same policy (see `reaper`).
                super::reaper::end_in_policy(
                    device,
                    Box::new(move || end_registration(ptr, device, owner)),
                );
            }
            // SAFETY: the block came from `host_alloc` under `device`'s context for `pool`
            // (`alloc_block`, or `pooled` whose caller vouched for it); this is its last
            // owner, and copies that touched it were proven complete before any tensor
            // owning it could drop (memory module invariant).
            Release::Pool { pool, device } => unsafe {
                pool.give_back(self.ptr, self.len, *device)
            },
            Release::Free { device } => {
                let device = *device;
                // Freed here, on the dropping thread, which waits for the device's queued
                // work (cuMemFreeHost does): handing thousands of such frees to the free
                // thread made them run during later transfers and halved their speed
                // (measured on the H200). Only frees on a transfer's path go there, and
                // these too when the program bounded its waits (Config::sync_wait).
                // SAFETY: a dedicated block from host_alloc whose last owner is us; copies
                // that read or wrote it were proven complete before any tensor owning it
                // could drop (memory module invariant).
                if let Err(e) = unsafe { free_pinned_in_policy(self.ptr, device) } {
                    driver::deferred::record(device, e);
                }
            }
        }
    }
}

/// Ends the registration of the block at `ptr` (registered by [`register`] under
/// `device`'s context; its block has dropped), then drops `owner`, which keeps the memory
/// allocated. No reader takes the block from the registry any more (its weak reference no
/// longer upgrades once it is dropping); its entry stays until the driver has ended the
/// registration, so that nothing reads the memory in place through it meanwhile
/// (`PinnedBlock::foreign_mapped`).
fn end_registration(ptr: HostPtr<u8>, device: usize, owner: Option<Box<dyn Send + Sync>>) {
    let r = driver::bind(device).and_then(|ctx| {
        // SAFETY: registered by `register` and not since unregistered; copies that read it
        // were proven complete before any tensor over it could drop (memory module
        // invariant).
        unsafe { driver::host_unregister(&ctx, ptr.0) }
    });
    match r {
        Ok(()) => {
            forget(ptr.0 as usize);
            drop(owner);
        }
        Err(e) => {
            // Still registered: freeing the memory under a registration is unknown
            // ground, so the owner is kept (leaked) instead.
            std::mem::forget(owner);
            stuck(ptr.0 as usize);
            driver::deferred::record(device, e);
        }
    }
}

/// A new block of `len` bytes allocated under `device`'s context, freed on drop or
/// returned to `pool`.
pub(super) fn alloc_block(
    len: usize,
    device: usize,
    pool: Option<Arc<dyn BlockPool>>,
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
        ptr: HostPtr(ptr),
        len,
        release,
        filling: Ranges::pinned(),
    }))
}

/// `len` (> 0) bytes of `owner`'s host memory at `ptr`, page-locked in place for every
/// context (`cuMemHostRegister`, portable) until the block drops, when they are
/// unregistered and `owner` is dropped.
///
/// # Safety
/// `ptr..ptr + len` is host memory that `owner` keeps allocated and unchanged while it
/// lives.
pub(crate) unsafe fn register(
    ptr: *const u8,
    len: usize,
    device: usize,
    owner: Box<dyn Send + Sync>,
) -> Result<Arc<PinnedBlock>> {
    let ctx = driver::bind(device)?;
    let start = ptr as usize;
    // On the registry before the driver registers it (see `PinnedBlock::foreign_mapped`).
    reserve(start, len)?;
    // SAFETY: the caller's obligation keeps the range allocated until `owner` drops,
    // which the block does only after unregistering it.
    if let Err(e) = unsafe { driver::host_register(&ctx, ptr.cast_mut(), len) } {
        forget(start);
        return Err(e);
    }
    let block = Arc::new(PinnedBlock {
        ptr: HostPtr(ptr.cast_mut()),
        len,
        release: Release::Registered {
            device,
            owner: Some(owner),
        },
        filling: Ranges::pinned(),
    });
    record(start, len, &block);
    Ok(block)
}

// The registry of live registrations (`register` reserves and records, the block's drop
// forgets).
//
// Memory pinlane registered is page-locked for others too: torch's `is_pinned()` says so,
// and a DLPack import of it as `kDLCUDAHost` may be read in place by the device. Such a
// reader must keep the registration alive while it reads, or the device would read
// memory no longer mapped for it. So every registration pinlane makes is on this registry
// (process-wide, as the driver's registrations are), by address, from before the driver
// makes it until after the driver has ended it: an import of memory inside one holds its
// block, and one overlapping one it cannot hold is taken as pageable (`registered`, in the
// DLPack import); an import is never read in place through a registration it does not
// hold (`clear_of_live`, in `PinnedBlock::foreign_mapped`); and a new registration of
// memory inside one takes a view of it instead (`registered`, in
// `registration::register_many`). Entries never overlap (`reserve` refuses, as the
// driver would).

/// A live registration: its length; the block that ends it when dropped (none yet while
/// the driver is registering it; none that upgrades once the block is dropping); and
/// whether the driver failed to end it (it stays registered for good, see
/// `end_registration`).
type Live = (usize, Weak<PinnedBlock>, bool);

/// Notified when an entry of [`LIVE`] is recorded, forgotten or found stuck: a
/// [`reserve`] waiting for a registration being made or ended looks again.
static SETTLED: Condvar = Condvar::new();

/// pinlane's live registrations, by start address.
static LIVE: Mutex<BTreeMap<usize, Live>> = Mutex::new(BTreeMap::new());

/// How many registrations were ever reserved: moved (under the lock of [`LIVE`]) by every
/// [`reserve`], so two looks that read the same count saw no registration begin between
/// them.
static GENERATION: AtomicU64 = AtomicU64::new(0);

fn live() -> std::sync::MutexGuard<'static, BTreeMap<usize, Live>> {
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// The entry of `map` that overlaps `addr..addr + len` (entries never overlap, so only
/// the last one starting before the range's end can), as (start, length, block).
fn overlapping(map: &BTreeMap<usize, Live>, addr: usize, len: usize) -> Option<(usize, &Live)> {
    let end = addr.saturating_add(len.max(1));
    let (&start, live) = map.range(..end).next_back()?;
    (start.saturating_add(live.0) > addr).then_some((start, live))
}

/// Puts `len` bytes at `start` on the registry before the driver registers them. A
/// registration they overlap that is being made or ended (another thread is in the
/// driver's call, or the free thread is about to make it: ending one waits for the
/// device, so pinlane ends those it drops itself there) is waited for, for at most
/// [`Config::drop_sync_wait`](crate::config::Config::drop_sync_wait): memory whose last
/// view a non-blocking call held can be registered again right after the call's wait (the
/// registering thread waits here for the free thread to end the old registration, as the
/// wait did when the completion thread ended it before the handle's wait returned).
///
/// # Errors
/// The driver's `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED` (as `cuMemHostRegister` would
/// answer) when they overlap a live registration of pinlane's, or one still being made or
/// ended past the bound.
fn reserve(start: usize, len: usize) -> Result<()> {
    let deadline = driver::deadline_after(super::waits::drop_wait());
    let mut map = live();
    loop {
        match overlapping(&map, start, len) {
            None => break,
            Some((_, (_, block, false))) if block.strong_count() == 0 => {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                if left.is_zero() {
                    return driver::already_registered();
                }
                map = SETTLED
                    .wait_timeout(map, left)
                    .unwrap_or_else(|p| p.into_inner())
                    .0;
            }
            Some(_) => return driver::already_registered(),
        }
    }
    map.insert(start, (len, Weak::new(), false));
    GENERATION.fetch_add(1, Ordering::Relaxed); // under the lock: `clear_of_live` reads it there
    Ok(())
}

/// Records the block that holds the registration reserved at `start`, until [`forget`].
fn record(start: usize, len: usize, block: &Arc<PinnedBlock>) {
    live().insert(start, (len, Arc::downgrade(block), false));
    SETTLED.notify_all();
}

/// Ends the record of the registration at `start` (the driver has ended it, or never
/// made it).
fn forget(start: usize) {
    live().remove(&start);
    SETTLED.notify_all();
}

/// Marks the registration at `start` as one the driver failed to end: it stays on the
/// registry for good, and a [`reserve`] overlapping it is refused at once.
fn stuck(start: usize) {
    if let Some(e) = live().get_mut(&start) {
        e.2 = true;
    }
    SETTLED.notify_all();
}

/// The host's page size (`sysconf(_SC_PAGESIZE)`), or 4096 where it gives no answer.
pub(crate) fn page_size() -> usize {
    // SAFETY: sysconf only reads a system constant.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(n)
        .ok()
        .filter(|n| n.is_power_of_two())
        .unwrap_or(4096)
}

/// `None` when a page that any of `len` bytes at `addr` lies on holds bytes of a
/// registration of pinlane's that the driver may hold now (live, being made, or being
/// ended); else the registry's generation ([`GENERATION`]), read under the same lock.
fn clear_of_live(addr: usize, len: usize) -> Option<u64> {
    let page = page_size();
    let start = addr - addr % page;
    let end = addr
        .saturating_add(len.max(1))
        .checked_next_multiple_of(page)
        .unwrap_or(usize::MAX);
    let map = live();
    if overlapping(&map, start, end - start).is_some() {
        return None;
    }
    Some(GENERATION.load(Ordering::Relaxed))
}

/// What pinlane's registry says of `len` bytes at `addr` that another owner calls
/// page-locked (a DLPack import of `kDLCUDAHost`), see [`PinnedBlock::foreign_in`].
pub(crate) enum Registered {
    /// Inside a live registration of pinlane's, which the import can hold.
    Inside(Arc<PinnedBlock>),
    /// Clear of every registration of pinlane's.
    Clear,
    /// Overlapping one it cannot hold: only part of it, or one being made or ended, whose
    /// pages may stop being page-locked while the import lives. Such memory is taken as
    /// pageable.
    Passing,
}

impl Registered {
    /// The registration that holds all of the range, when there is one to hold.
    pub(crate) fn inside(self) -> Option<Arc<PinnedBlock>> {
        match self {
            Registered::Inside(block) => Some(block),
            Registered::Clear | Registered::Passing => None,
        }
    }
}

/// [`Registered`] for `len` bytes at `addr` (one look at the registry).
pub(crate) fn registered(addr: usize, len: usize) -> Registered {
    let map = live();
    let Some((start, (n, block, _))) = overlapping(&map, addr, len) else {
        return Registered::Clear;
    };
    let inside = addr >= start
        && addr
            .checked_add(len)
            .is_some_and(|end| end <= start.saturating_add(*n));
    let block = block.upgrade();
    // The registry's lock goes before `block` may be dropped: if another thread let go
    // of the block meanwhile, this reference is the last, and its drop ends the
    // registration, which takes that lock (the order was the 2021 edition's rule for a
    // tail expression's temporaries, kept by nothing written here).
    drop(map);
    match (inside, block) {
        (true, Some(block)) => Registered::Inside(block),
        _ => Registered::Passing,
    }
}

/// A page-locked block of its own (freed on drop), for measurements.
pub(crate) fn block_of(len: usize, device: usize) -> Result<Arc<PinnedBlock>> {
    alloc_block(len, device, None)
}

/// A tensor's page-locked bytes: `nbytes` at `offset` of a shared block.
#[derive(Clone)]
pub(crate) struct PinnedBuf {
    block: Arc<PinnedBlock>,
    offset: usize,
    nbytes: usize,
    /// The block's address at `offset`, and whether the block is `mapped`: kept here so
    /// that reading a view touches no memory of the block's (a batch's sources are
    /// usually cold in the CPU caches, and asking each block took one cache miss per
    /// tensor).
    at: HostPtr<u8>,
    mapped: bool,
}

impl PinnedBuf {
    /// `nbytes` at `offset` of `block` (the caller has checked that it is inside).
    fn new(block: Arc<PinnedBlock>, offset: usize, nbytes: usize) -> PinnedBuf {
        let mapped = block.mapped();
        PinnedBuf::with_kind(block, offset, nbytes, mapped)
    }

    /// As [`PinnedBuf::new`], with the block's `mapped()` already asked (once for many
    /// views of one block).
    fn with_kind(block: Arc<PinnedBlock>, offset: usize, nbytes: usize, mapped: bool) -> PinnedBuf {
        debug_assert!(offset.checked_add(nbytes).is_some_and(|e| e <= block.len));
        let at = HostPtr(block.ptr_at(offset));
        PinnedBuf {
            block,
            offset,
            nbytes,
            at,
            mapped,
        }
    }

    /// A page-locked copy of `bytes` in a block of its own, allocated under `device`'s
    /// context.
    pub(crate) fn copy_of(bytes: &[u8], device: usize) -> Result<PinnedBuf> {
        let block = alloc_block(bytes.len(), device, None)?;
        if !bytes.is_empty() {
            // SAFETY: a fresh allocation of bytes.len() bytes that nothing else can see;
            // the ranges cannot overlap.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), block.ptr.0, bytes.len()) };
        }
        Ok(PinnedBuf::new(block, 0, bytes.len()))
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

    /// The address of the first byte (for DLPack exports and copies). Reading through it
    /// is for callers that asked [`PinnedBuf::readable`] first: the export does, and the
    /// calls that copy from or into tensors check their batches before queueing
    /// ([`super::check_readable`]).
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.at.0
    }

    /// Whether a kernel may read these bytes at their host address, on a device that maps
    /// host memory ([`driver::host_memory_mapped`]): memory pinlane allocated
    /// (`cuMemHostAlloc`) or registered itself (device-mapped), or memory of another
    /// owner's inside such a registration, which its block holds. Not other memory
    /// another owner page-locked (a DLPack import), which may be registered without a
    /// device mapping ([`PinnedBuf::mapped_on`] asks the driver).
    pub(crate) fn mapped(&self) -> bool {
        self.mapped
    }

    /// Whether a kernel of `ctx`'s device may read these bytes at their host address, on
    /// a device that maps host memory ([`driver::host_memory_mapped`]): [`PinnedBuf::mapped`],
    /// or memory of another owner's that the driver maps for the device at that address
    /// (asked once per block and device).
    pub(crate) fn mapped_on(&self, ctx: &ContextGuard) -> bool {
        self.mapped || self.block.foreign_mapped(ctx)
    }

    /// `nbytes` at `offset` of `block`.
    ///
    /// # Errors
    /// A range outside the block (never a view that reaches past it).
    pub(crate) fn view(
        block: &Arc<PinnedBlock>,
        offset: usize,
        nbytes: usize,
    ) -> Result<PinnedBuf> {
        check_range("pinned view", offset, nbytes, block.len)?;
        Ok(PinnedBuf::new(block.clone(), offset, nbytes))
    }

    /// Views of `block` at `base + offset` for each `(offset, nbytes)`: one D2H batch's
    /// output tensors. Every range is checked first (a tight pass over the numbers), then
    /// the views are made lazily, as the caller takes them: the batch is rebuilt around
    /// them in the same pass, while the copies that write them run (the caller hands them
    /// out only once those copies are proven complete). No list of views in between: for
    /// a thousand tensors each pass over them costs 10 to 20 us.
    ///
    /// # Errors
    /// The first range outside the block.
    pub(crate) fn views<'a>(
        block: &'a Arc<PinnedBlock>,
        base: usize,
        ranges: impl ExactSizeIterator<Item = (usize, usize)> + Clone + 'a,
    ) -> Result<impl ExactSizeIterator<Item = PinnedBuf> + 'a> {
        for (offset, nbytes) in ranges.clone() {
            let at = base.saturating_add(offset);
            // One comparison on the fast path; the error (always one here) is built by
            // check_range, as for every other copy range.
            if at.checked_add(nbytes).is_none_or(|e| e > block.len) || at == usize::MAX {
                check_range("pinned view", at, nbytes.max(1), block.len)?;
            }
        }
        // Every range is inside the block (checked above): the invariant `bytes` relies on.
        // The block's address and kind are asked once, not once per view.
        let mapped = block.mapped();
        Ok(ranges.map(move |(offset, nbytes)| {
            PinnedBuf::with_kind(block.clone(), base + offset, nbytes, mapped)
        }))
    }

    /// Where the view starts in its owner's bytes.
    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    /// Whether both are views into one block.
    pub(crate) fn same_block(&self, other: &PinnedBuf) -> bool {
        Arc::ptr_eq(&self.block, &other.block)
    }

    /// Whether two views are the same bytes of the same block.
    pub(crate) fn same_as(&self, other: &PinnedBuf) -> bool {
        self.same_block(other) && self.offset == other.offset && self.nbytes == other.nbytes
    }

    /// `Ok` when the bytes may be read: no D2H call's copies may still be writing them
    /// (a view handed to a `Batch::rebuild` while they run, or kept from one; see
    /// [`super::filling`]). Asked by every read of the bytes that can reach them while
    /// that is so: [`PinnedBuf::bytes`], the DLPack export, and the calls that take the
    /// tensor as a source or destination ([`super::check_readable`]).
    ///
    /// # Errors
    /// [`Error::BytesInFlight`](crate::Error::BytesInFlight) naming `op`.
    pub(crate) fn readable(&self, op: &'static str) -> Result<()> {
        // Touches the block only while some range of some block is marked.
        self.block.filling.check(self.offset, self.nbytes, op)
    }

    /// How many bytes the view has.
    pub(crate) fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// The bytes, once no copy may still write them.
    ///
    /// # Errors
    /// [`Error::BytesInFlight`](crate::Error::BytesInFlight) naming `op` (see
    /// [`PinnedBuf::readable`]).
    pub(crate) fn bytes(&self, op: &'static str) -> Result<&[u8]> {
        self.readable(op)?;
        Ok(self.bytes_unchecked())
    }

    /// The bytes, for a caller that has asked [`PinnedBuf::readable`] for this view
    /// already in this call (or made the view itself, with nothing writing it).
    pub(crate) fn bytes_unchecked(&self) -> &[u8] {
        if self.nbytes == 0 {
            // Aligned for every dtype (8 bytes), so typed views of it are empty slices.
            const EMPTY: &[u64] = &[];
            return bytemuck::cast_slice(EMPTY);
        }
        // SAFETY: offset + nbytes <= block.len (view and copy_of keep it so). These bytes
        // were written by copy_of, or by D2H copies: either proven complete before the
        // view was made (copies into existing tensors), or marked as being filled from
        // before any view existed until proven complete (`super::filling`), and every
        // read while marked is refused (`readable`, which the callers ask). They are
        // never written again while a view exists. The block lives as long as `self`
        // holds the Arc.
        unsafe { std::slice::from_raw_parts(self.at.0, self.nbytes) }
    }

    /// The first byte, with the right to write it (the block's own allocation pointer),
    /// where the block may be written (see `PinnedBlock::writable`). Writing is sound only
    /// while nothing reads or writes these bytes otherwise.
    pub(crate) fn write_ptr(&self) -> Option<*mut u8> {
        self.block
            .writable()
            .then(|| self.block.ptr_at(self.offset))
    }

    /// Queues a copy of all the bytes to `dst` at `at`, straight from this memory.
    ///
    /// # Safety
    /// 1. `self` stays alive (it never changes) until the copy has finished, and was found
    ///    [`readable`](PinnedBuf::readable) in this call.
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
        let src = self.as_ptr();
        // SAFETY: the source is nbytes of our page-locked block (obligation 1 keeps it
        // alive); the destination range is inside `dst` (checked above; obligation 2).
        unsafe { driver::memcpy_h2d_async(ctx, dst.addr(at), src, self.nbytes, stream) }
    }
}

/// Queues copies of `bufs` into `dst` at `offsets` as one `cuMemcpyBatchAsync`.
///
/// # Safety
/// As [`PinnedBuf::h2d_async`], for every buffer; `stream` is not the legacy stream.
pub(crate) unsafe fn h2d_batch_async(
    ctx: &ContextGuard,
    bufs: &[&PinnedBuf],
    dst: &DeviceAlloc,
    offsets: &[usize],
    device: usize,
    stream: &Stream,
) -> Result<()> {
    let mut dsts = Vec::with_capacity(bufs.len());
    let mut srcs = Vec::with_capacity(bufs.len());
    let mut sizes = Vec::with_capacity(bufs.len());
    for (b, &at) in bufs.iter().zip(offsets) {
        check_range("pinned source", at, b.nbytes, dst.nbytes())?;
        if b.nbytes == 0 {
            continue;
        }
        dsts.push(dst.addr(at));
        // With unified addressing a page-locked host address is a valid copy source.
        srcs.push(b.as_ptr() as DevicePtrInt);
        sizes.push(b.nbytes);
    }
    // SAFETY: every destination range is inside `dst` (checked above); the rest is the
    // caller's obligation.
    unsafe { driver::memcpy_batch_h2d_async(ctx, &mut dsts, &mut srcs, &mut sizes, device, stream) }
}
