//! The memory layer: the only place (with `driver`) that holds raw pointers.
//!
//! | file | owner | memory | freed |
//! | --- | --- | --- | --- |
//! | `host.rs` | `HostBuf`, `HostRegion` | pageable host memory (a `Vec`, or a D2H batch's output region) | on drop; regions go back to [`HostPool`] |
//! | `pinned.rs` | `PinnedBuf`, `PinnedBlock` | page-locked memory of tensors (`cuMemHostAlloc`) | on drop (`cuMemFreeHost`), or back to [`PinnedOutputPool`] |
//! | `output_pool.rs` | [`PinnedOutputPool`] | page-locked blocks D2H outputs and producers' buffers take ranges of (capped) | free blocks by `trim`, a lowered cap, to make room under the cap or when the host can page-lock no more (on the free thread); a returned block at once when the cap is over |
//! | `arena.rs` | [`PinnedArena`], `SlotLease` | page-locked staging slots, allocated once | never on the hot path |
//! | `device.rs` | `DeviceAlloc` | device memory of one batch (`cuMemAllocFromPoolAsync`) | in order on its consumer stream (`cuMemFreeAsync`); a small output's block back to `DeviceBlocks` |
//! | `device_blocks.rs` | `DeviceBlocks` | small H2D outputs' device blocks, kept with an event recorded on their consumer stream (a borrowed one told apart by its driver id) | reused once the event is proven complete; freed in order on that stream by `trim` and shutdown (a borrowed stream's on the legacy stream, after the event) |
//! | `copier.rs` | `CopyPool` | nothing of its own: threads that copy host bytes in parallel | - |
//! | `gather.rs` | - | a device buffer gathering many small tensors (kernel) | in stream order |
//! | `scatter.rs` | - | nothing of its own: copies into memory the caller owns (device views anywhere, writable host tensors) | - |
//! | `mapped.rs` | `MappedFile`, `MappedRange` | a checkpoint file mapped read-only (the page cache, read in place) | unmapped when the last tensor over it drops |
//! | `dlpack.rs` | a DLPack capsule's deleter (imports), a tensor clone (exports) | another framework's tensors, and ours lent to it | the deleter runs when the last view drops |
//! | `filling.rs` | - | nothing of its own: the ranges of page-locked blocks that D2H copies may still be writing (reads of them are refused) | - |
//! | `device_gate.rs` | - | nothing of its own: whether H2D copies may still write a device allocation (uses refused, or ordered after a non-blocking call's event) | - |
//! | `device_reads.rs` | - | nothing of its own: which device allocations non-blocking D2H copies may still read (copies into them wait for those calls' events) | - |
//! | `inflight.rs` | `InFlight`, `Detached` | nothing of its own: keeps the owners above alive | after the stream is synchronised, or (non-blocking calls) the call's event completes |
//! | `registration.rs` | the `PinnedBlock`s of `Tensor::register_pinned_many` | host memory of many tensors page-locked in place, buffers that share pages as one range | unregistered when the last view of a range drops |
//! | `producer.rs` | [`PinnedBufferMut`] | page-locked memory a producer writes, from the [`PinnedOutputPool`] | frozen into a tensor; back to the pool when its last view drops |
//! | `reaper.rs` | - | page-locked memory being freed | on a dedicated thread (`cuMemFreeHost` waits for the whole context) |
//! | `retained.rs` | the retained registry | owners whose copies could not be proven complete | when a later synchronisation proves it |
//!
//! # The invariant
//!
//! **Every host or device buffer that a queued copy may still touch is kept alive by an
//! owner tied to an event (or a stream synchronisation) that proves the copy finished.**
//! Reuse or free happens only after that proof, or in stream order.
//!
//! ```text
//!  caller's batch ──borrowed for the whole call──────────────────────────────┐
//!                                                                            │
//!  copy stream:  [alloc dst] [copy w0 ─slot A─] [copy w1 ─slot B─] [copy w2 ─slot A─] ... [sync]
//!                                       │ ev(A)             │ ev(B)   ▲                      │
//!  host:         fill A(w0)  fill B(w1) └─ wait ev(A) ─ fill A(w2) ───┘                      │
//!                                                                                            ▼
//!  InFlight owns: slot leases, the batch's DeviceAlloc ───────────────── released (leases back to
//!                                                                        the arena) after sync OK
//!     sync failed? ─► leases, DeviceAlloc and clones of the source tensors move to the
//!                     retained registry (bytes counted) until a later sync of that stream
//!                     succeeds.
//!
//!  output tensors ─► Arc<DeviceAlloc> ─► last owner drops ─► cuMemFreeAsync(consumer stream)
//!                                        (after everything the consumer queued before)
//! ```
//!
//! * A staging slot is written only after its event (recorded after the last copy that
//!   used it) has completed: `SlotLease::bytes_mut` waits for it.
//! * A slot goes back to the arena only when its lease drops, which happens after the
//!   stream that used it was synchronised (the lease lives in an `InFlight`) or, if that
//!   synchronisation failed, never until a later one succeeds (the registry holds it).
//! * Source tensors are borrowed by the call; they need owning only when the call returns
//!   with copies not proven complete, and then the registry takes clones of them.
//! * Device memory of a returned batch is freed on the consumer stream (the legacy default
//!   stream unless the caller names another), so it cannot be handed to a new allocation
//!   while work the consumer queued on that stream may still read it.

pub(crate) mod arena;
mod copier;
mod device;
mod device_blocks;
mod device_gate;
mod device_reads;
pub(crate) mod dlpack;
mod filling;
mod gather;
mod host;
mod inflight;
mod limits;
#[cfg(feature = "weights")]
mod mapped;
mod output_pool;
mod overlap;
mod page_locked;
pub(crate) mod pinned;
mod producer;
pub(crate) mod reaper;
mod registration;
pub mod retained;
pub(crate) mod scatter;
pub(crate) mod waits;

pub(crate) use crate::driver::batch_copy_available;
pub use arena::PinnedArena;
pub(crate) use arena::SlotLease;
pub use copier::CopyPool;
pub(crate) use copier::{CopyTask, CopyTasks, Packed, Stores};
pub use device::DevicePtrGuard;
pub(crate) use device::{DeviceAlloc, DeviceView};
pub(crate) use device_blocks::DeviceBlocks;
pub(crate) use device_gate::DeviceFill;
pub(crate) use device_reads::{reads_before_write, DeviceReads};
pub(crate) use gather::{
    available as gather_available, gather_async, h2d_gather_async, h2d_gather_available,
    h2d_gather_pieces,
};
pub use host::HostPool;
pub(crate) use host::{HostBuf, HostRegion};
pub(crate) use inflight::{run_around, AroundWait, Detached, InFlight};
pub use limits::{measure_pinned_limits, PinnedLimits};
#[cfg(feature = "weights")]
pub(crate) use mapped::{open_regular, MappedFile, MappedRange};
pub(crate) use output_pool::Taken;
pub use output_pool::{PinnedOutputPool, SHARE_MAX};
pub use overlap::first_overlap;
pub use page_locked::host_page_locked;
pub(crate) use pinned::{h2d_batch_async, PinnedBlock, PinnedBuf};
pub use producer::PinnedBufferMut;
pub(crate) use reaper::failed as failed_frees;
pub(crate) use reaper::quiesce as quiesce_frees;
pub(crate) use registration::register_many;

/// Where a tensor's bytes are, and who owns them: each variant is a view holding an
/// `Arc` to shared memory (pinlane's, or another owner's), so cloning one is a
/// reference-count increment.
#[derive(Clone)]
pub(crate) enum Storage {
    Host(HostBuf),
    Pinned(PinnedBuf),
    Device(DeviceView),
}

impl Storage {
    /// A host tensor's first byte with the right to write it: page-locked memory pinlane
    /// allocated, or memory imported writable through DLPack (the unsafe imports, not
    /// flagged read-only); `None` for device memory, for memory a Rust value owns (a
    /// `Vec`, `Tensor::from_owner`, and the same page-locked in place by
    /// `register_pinned`) and for read-only imports, which pinlane only reads. Writing is
    /// sound only while nothing reads or writes the bytes otherwise.
    pub(crate) fn host_write_ptr(&self) -> Option<*mut u8> {
        match self {
            Storage::Host(b) => b.write_ptr(),
            Storage::Pinned(b) => b.write_ptr(),
            Storage::Device(_) => None,
        }
    }

    /// Whether copies into existing tensors may write a device tensor's memory: pinlane's
    /// own, or another owner's taken as writable (`Tensor::from_device_ptr`, the unsafe
    /// DLPack imports of memory not flagged read-only); `false` for host memory.
    pub(crate) fn device_writable(&self) -> bool {
        match self {
            Storage::Device(v) => v.writable(),
            Storage::Host(_) | Storage::Pinned(_) => false,
        }
    }
}

/// `Ok` when every page-locked tensor of `storages` (the tensors' storages) may be read
/// (or written): no D2H call's copies may still be writing it (see
/// [`PinnedBuf::readable`]). Device tensors are not looked at: for calls whose device
/// tensors pass through unread, or are checked by [`check_usable`]. One load when no D2H
/// call has copies in flight; a pass over the tensors otherwise.
///
/// # Errors
/// [`Error::BytesInFlight`](crate::Error::BytesInFlight) naming `op`, for the first such
/// tensor.
pub(crate) fn check_readable<'a>(
    storages: impl IntoIterator<Item = &'a Storage>,
    op: &'static str,
) -> crate::error::Result<()> {
    if !filling::pinned_any() {
        return Ok(());
    }
    for s in storages {
        if let Storage::Pinned(b) = s {
            b.readable(op)?;
        }
    }
    Ok(())
}

/// [`check_readable`], and every device tensor of `storages` may be used: no H2D call's
/// copies may still be writing it unordered (see `device_gate`). The events of those a
/// non-blocking H2D call's copies may still write (its outputs, once it has returned) come
/// back, each once: [`UsesAfter::order`] makes the call's stream wait for them before it
/// queues anything that uses the tensors. Nothing is queued here, so a refused call leaves
/// nothing behind. One load per kind when no call has copies in flight into that kind of
/// memory; a pass over the tensors otherwise. Asked by the calls that take device tensors
/// as sources or destinations, before anything is queued.
///
/// # Errors
/// [`Error::BytesInFlight`](crate::Error::BytesInFlight) naming `op`, for the first such
/// tensor.
pub(crate) fn check_usable<'a>(
    storages: impl IntoIterator<Item = &'a Storage>,
    op: &'static str,
) -> crate::error::Result<UsesAfter> {
    let (pinned, device) = (filling::pinned_any(), device_gate::any());
    let mut after = UsesAfter(Vec::new());
    if !pinned && !device {
        return Ok(after);
    }
    for s in storages {
        match s {
            Storage::Pinned(b) if pinned => b.readable(op)?,
            Storage::Device(v) if device => {
                // A batch's tensors share their allocation, and so its event: kept once.
                if let Some(e) = v.pending_use(op)? {
                    after.add(&e);
                }
            }
            _ => {}
        }
    }
    Ok(after)
}

/// The events that a call's uses of its device tensors must be ordered after (see
/// [`check_usable`]); usually none.
#[must_use = "the call's stream must wait for these events before it uses the tensors"]
pub(crate) struct UsesAfter(Vec<crate::driver::Event>);

impl UsesAfter {
    /// Keeps `e`, once (a batch's tensors share their allocation, and so its events).
    fn add(&mut self, e: &crate::driver::Event) {
        if !self.0.iter().any(|k| k.as_raw() == e.as_raw()) {
            self.0.push(e.clone());
        }
    }

    /// Makes `stream` wait for each event (on the device: the host does not wait).
    ///
    /// # Errors
    /// The driver's error.
    pub(crate) fn order(self, stream: &crate::driver::Stream) -> crate::error::Result<()> {
        self.0.iter().try_for_each(|e| e.wait_on(stream))
    }

    /// How many events a stream will wait for (for `crate::sim_tests`).
    #[cfg(all(test, feature = "test-util"))]
    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }
}

/// Device offsets of a batch are aligned to this many bytes (cudaMalloc's own alignment),
/// so every tensor of a coalesced batch starts where a kernel would expect it.
pub const DEVICE_ALIGN: usize = 256;

/// `Ok` if `at..at + n` lies within `len` bytes (no overflow); else an error naming `what`.
/// Every copy the memory layer queues checks its ranges with this first.
/// Inlined (a batch checks thousands of ranges); the error is built out of line.
#[inline]
pub(crate) fn check_range(what: &str, at: usize, n: usize, len: usize) -> crate::error::Result<()> {
    if at.checked_add(n).is_some_and(|end| end <= len) {
        return Ok(());
    }
    Err(range_error(what, at, n, len))
}

#[cold]
#[inline(never)]
fn range_error(what: &str, at: usize, n: usize, len: usize) -> crate::error::Error {
    crate::error::Error::Internal {
        op: "copy range",
        reason: format!("{what}: {at}+{n} exceeds {len} bytes"),
    }
}

/// What one kind of host memory holds: the staging arena, the page-locked output pool or
/// the recycled pageable pool (a field of the runtime's `MemoryStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct PoolStats {
    /// Bytes allocated and kept (in use or cached for reuse).
    pub held_bytes: usize,
    /// Bytes of those in use now (leased slots, blocks or regions with live tensors).
    pub in_use_bytes: usize,
    /// Highest `held_bytes` so far.
    pub peak_bytes: usize,
    /// Allocations (slots, blocks, regions) in use now.
    pub in_use_count: usize,
}
