//! [`Runtime`]: the one place that owns pinlane's memory (the staging arena, the output
//! pools, the copy threads) and the [`Config`] they were built from.
//!
//! A runtime is a value ([`Arc<Runtime>`]). The transfer calls use the process's default
//! runtime, which [`Config::install`] creates; if no configuration was installed, the
//! first call that needs it (a transfer, [`runtime`], [`warm_up`]) installs
//! [`Config::new`]. [`memory_stats`] and [`trim`] never do: a library may ask for
//! statistics early without fixing the configuration. [`Runtime::shutdown`] (or
//! `pinlane::shutdown` for the default) gives its memory back and stops its threads; the next
//! transfer then makes a new default runtime from the same configuration.
//!
//! The driver layer keeps its own per-device facts (primary contexts, device pools, the
//! loaded kernel), which the runtime configures ([`Config::device_pool_release_bytes`])
//! and trims.

use crate::config::{Config, CopyStores};
use crate::device::Device;
use crate::driver;
use crate::error::{Error, Result};
pub use crate::memory::PoolStats;
use crate::memory::{
    retained, waits, CopyPool, DeviceBlocks, HostPool, PinnedArena, PinnedOutputPool, Stores,
};
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// pinlane's memory and copy threads, built from a [`Config`].
///
/// ```
/// let rt = pinlane::runtime();
/// let stats = rt.memory_stats();
/// assert!(stats.staging.held_bytes <= rt.config().arena_bytes.max(rt.config().slot_bytes));
/// rt.trim().unwrap(); // gives back whatever is cached and unused
/// assert_eq!(rt.memory_stats().staging.held_bytes, rt.memory_stats().staging.in_use_bytes);
/// ```
pub struct Runtime {
    config: Config,
    pub(crate) arena: Arc<PinnedArena>,
    pub(crate) outputs: Arc<PinnedOutputPool>,
    pub(crate) device_blocks: Arc<DeviceBlocks>,
    pub(crate) host_pool: Arc<HostPool>,
    pub(crate) copy: Arc<CopyPool>,
    /// Set by [`Runtime::shutdown`].
    shut_down: AtomicBool,
}

/// The process's default runtime, and the configuration the next default is made from
/// (the one installed last, kept across a shutdown).
struct DefaultSlot {
    runtime: Option<Arc<Runtime>>,
    config: Option<Config>,
}

static DEFAULT: Mutex<DefaultSlot> = Mutex::new(DefaultSlot {
    runtime: None,
    config: None,
});

/// Bumped whenever the default runtime changes, so that each thread's cached handle to it
/// ([`CACHED`]) is checked with one atomic load instead of a lock.
static GENERATION: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static CACHED: RefCell<Option<(u64, Arc<Runtime>)>> = const { RefCell::new(None) };
}

fn lock_default() -> std::sync::MutexGuard<'static, DefaultSlot> {
    DEFAULT.lock().unwrap_or_else(|p| p.into_inner())
}

/// [`lock_default`], except in a child forked after CUDA was set up, where the lock is
/// only tried: `None` if it is held. There it can only be held by a thread of the parent
/// that was inside [`runtime`] or [`Config::install`] at the fork (the child does not
/// have that thread, so the lock would be held for ever), or by another thread of the
/// child itself; either way the child's calls are refused, so nothing is lost by not
/// waiting.
fn lock_default_unless_stuck() -> Option<std::sync::MutexGuard<'static, DefaultSlot>> {
    if !crate::driver::fork::marked() {
        return Some(lock_default());
    }
    match DEFAULT.try_lock() {
        Ok(d) => Some(d),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// The process's default runtime, installing [`Config::new`] (or the configuration
/// installed last, after a shutdown) if there is none.
///
/// In a child process forked after pinlane set CUDA up it never waits for a lock a
/// thread of the parent may have held at the fork: where the default cannot be had at
/// once, it returns a runtime of the default configuration that is not installed. Every
/// call that would use CUDA through either is refused there with
/// [`Error::ForkedChild`](crate::Error::ForkedChild), as the transfers are.
pub fn runtime() -> Arc<Runtime> {
    let g = GENERATION.load(Ordering::Acquire);
    let cached = CACHED
        .try_with(|c| match &*c.borrow() {
            Some((cg, rt)) if *cg == g => Some(rt.clone()),
            _ => None,
        })
        .ok()
        .flatten();
    if let Some(rt) = cached {
        return rt;
    }
    // The generation is read under the lock that `retire` bumps it under, so the pair
    // cached below never names a runtime already retired.
    let (rt, g) = {
        let Some(mut d) = lock_default_unless_stuck() else {
            // Held for ever by a parent's thread: one that is not the default (and is not
            // cached), whose pools are empty and whose CUDA calls are refused.
            return Runtime::new(Config::default());
        };
        let rt = match &d.runtime {
            Some(rt) => rt.clone(),
            None => {
                // The defaults always validate, and so did an installed configuration.
                let config = d.config.clone().unwrap_or_default();
                let rt = Runtime::new(config.clone());
                // A pool made before could not take the release threshold: its next
                // operation is no worse than before, and `set_device_pool_release_bytes`
                // reports it.
                let _ = apply_process_settings(&config);
                d.runtime = Some(rt.clone());
                GENERATION.fetch_add(1, Ordering::AcqRel);
                rt
            }
        };
        (rt, GENERATION.load(Ordering::Acquire))
    };
    // During the thread's own teardown the cache is gone: the lock above served the call.
    let _ = CACHED.try_with(|c| *c.borrow_mut() = Some((g, rt.clone())));
    rt
}

/// The default runtime if there is one, making none (`None` also in a forked child where
/// the parent's lock is held: [`lock_default_unless_stuck`]).
pub(crate) fn current() -> Option<Arc<Runtime>> {
    lock_default_unless_stuck()?.runtime.clone()
}

/// Marks `rt` shut down and, if it is the default, removes it: the next call makes a new
/// default from the same configuration.
pub(crate) fn retire(rt: &Runtime) {
    rt.shut_down.store(true, Ordering::SeqCst);
    let mut d = lock_default();
    if d.runtime.as_ref().is_some_and(|r| std::ptr::eq(&**r, rt)) {
        d.runtime = None;
        GENERATION.fetch_add(1, Ordering::AcqRel);
    }
}

/// The settings of the default runtime that the layers below keep process-wide: the
/// device pools' release threshold and the memory layer's two wait bounds (inside `Drop`,
/// and a blocking call's wait for its copies: `memory::waits`).
fn apply_process_settings(config: &Config) -> Result<()> {
    waits::set_drop_wait(config.drop_sync_wait);
    waits::set_sync_wait(config.sync_wait);
    driver::set_pool_release_threshold(config.device_pool_release_bytes);
    // Pools made before the runtime (a `Stream::new` first, say) get it too.
    driver::apply_pool_release_threshold()
}

impl Config {
    /// Installs this configuration as the process's default runtime; see [`Runtime`].
    ///
    /// # Errors
    /// [`Error::InvalidOption`] for a value out of range; [`Error::AlreadyRunning`] when a
    /// runtime with another configuration is already the default (installing the same
    /// one again is fine; after `pinlane::shutdown`, another one is too);
    /// [`Error::ForkedChild`] in a child process forked after pinlane set CUDA up;
    /// [`Error::Driver`] when a device pool made before (by an earlier runtime, or a
    /// [`Stream`](crate::Stream) made first) cannot take
    /// [`Config::device_pool_release_bytes`] (`cuMemPoolSetAttribute`). On any error
    /// nothing is installed and the process's settings are left as they were.
    pub fn install(self) -> Result<Arc<Runtime>> {
        install(self)
    }
}

fn install(config: Config) -> Result<Arc<Runtime>> {
    config.validate()?;
    // The runtime it would install could not be used there, and the lock may be held for
    // ever by a parent's thread.
    crate::driver::fork::check("Config::install")?;
    let mut d = lock_default();
    if let Some(rt) = &d.runtime {
        if rt.config != config {
            return Err(Error::AlreadyRunning {
                reason: format!("{:?}", rt.config),
            });
        }
        return Ok(rt.clone());
    }
    // Before the runtime is published, under the lock: no call gets it under the previous
    // configuration's wait bounds, and a failure installs nothing.
    install_process_settings(&config)?;
    let rt = Runtime::new(config.clone());
    d.runtime = Some(rt.clone());
    d.config = Some(config);
    GENERATION.fetch_add(1, Ordering::AcqRel);
    Ok(rt)
}

/// [`apply_process_settings`] for [`Config::install`], all or nothing: when a pool made
/// before cannot take the new release threshold, the threshold goes back to the one in
/// force (on the pools the new one reached too, as far as they take it), the wait bounds
/// are left as they were, and the error is returned.
fn install_process_settings(config: &Config) -> Result<()> {
    let before = driver::pool_release_threshold();
    driver::set_pool_release_threshold(config.device_pool_release_bytes);
    if let Err(e) = driver::apply_pool_release_threshold() {
        driver::set_pool_release_threshold(before);
        let _ = driver::apply_pool_release_threshold();
        return Err(e);
    }
    waits::set_drop_wait(config.drop_sync_wait);
    waits::set_sync_wait(config.sync_wait);
    Ok(())
}

impl Runtime {
    fn new(config: Config) -> Arc<Runtime> {
        Arc::new(Runtime {
            arena: Arc::new(PinnedArena::new(
                config.slot_bytes,
                config.arena_bytes,
                config.slot_wait,
            )),
            outputs: Arc::new(PinnedOutputPool::new(config.pinned_output_bytes)),
            device_blocks: Arc::new(DeviceBlocks::new(config.small_device_blocks)),
            host_pool: Arc::new(HostPool::new(config.host_pool_bytes)),
            copy: Arc::new(CopyPool::new(
                config.resolved_copy_threads(),
                config.parallel_min,
                config.spin,
            )),
            config,
            shut_down: AtomicBool::new(false),
        })
    }

    /// The configuration in force: the installed one, with the limits changed since.
    pub fn config(&self) -> Config {
        let mut c = self.config.clone();
        c.arena_bytes = self.arena.max_bytes();
        c.pinned_output_bytes = self.outputs.max_bytes();
        c.host_pool_bytes = self.host_pool.max_bytes();
        c.device_pool_release_bytes = driver::pool_release_threshold();
        c
    }

    /// Whether [`Runtime::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.shut_down.load(Ordering::SeqCst)
    }

    /// Closes the pools (free memory given back now, the rest as it comes back) and trims
    /// the device pools; the first failed free.
    pub(crate) fn close_pools(&self) -> Result<()> {
        let mut first = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        note(self.arena.close());
        note(self.outputs.set_max_bytes(0));
        note(self.outputs.trim());
        self.host_pool.set_max_bytes(0);
        note(self.device_blocks.close());
        note(driver::trim_device_pools());
        first.map_or(Ok(()), Err)
    }

    /// Threads that copy pageable memory, the calling thread included.
    pub fn copy_threads(&self) -> usize {
        self.copy.threads()
    }

    pub(crate) fn settings(&self) -> &Config {
        &self.config
    }

    /// The stores to fill staging slots with, given what measured fastest for the job.
    pub(crate) fn fill_stores(&self, auto: Stores) -> Stores {
        self.stores(self.config.fill_stores, auto)
    }

    /// The stores to drain staging slots with.
    pub(crate) fn drain_stores(&self) -> Stores {
        self.stores(self.config.drain_stores, Stores::Streaming)
    }

    fn stores(&self, choice: CopyStores, auto: Stores) -> Stores {
        let s = match choice {
            CopyStores::Cached => Stores::Cached,
            CopyStores::Streaming => Stores::Streaming,
            CopyStores::Auto => auto,
        };
        if self.config.streaming_stores {
            s
        } else {
            Stores::Cached
        }
    }

    /// Changes the staging arena's cap. Slots above a lower cap are freed as they come
    /// back (and by [`Runtime::trim`]); no call waits for them. A raised cap wakes the
    /// calls waiting for a slot at once.
    ///
    /// # Errors
    /// [`Error::ForkedChild`](crate::Error::ForkedChild) in a child process forked after
    /// pinlane set CUDA up (the slots are the parent's, and so may be the arena's lock).
    pub fn set_arena_bytes(&self, bytes: usize) -> Result<()> {
        crate::driver::fork::check("Runtime::set_arena_bytes")?;
        self.arena.set_max_bytes(bytes)
    }

    /// Changes the page-locked output pool's cap; unused blocks above it are freed.
    ///
    /// # Errors
    /// A failed `cuMemFreeHost` of an unused block; [`Error::ForkedChild`](crate::Error::ForkedChild)
    /// in a child process forked after pinlane set CUDA up (the blocks are the parent's).
    pub fn set_pinned_output_bytes(&self, bytes: usize) -> Result<()> {
        crate::driver::fork::check("Runtime::set_pinned_output_bytes")?;
        self.outputs.set_max_bytes(bytes)
    }

    /// Changes the recycled pageable pool's cap; cached regions above it are freed. In a
    /// child process forked after pinlane set CUDA up it does nothing: the pool is the
    /// parent's, its lock may be held for ever by a parent's thread, and every transfer
    /// there is refused.
    pub fn set_host_pool_bytes(&self, bytes: usize) {
        if crate::driver::fork::marked() {
            return;
        }
        self.host_pool.set_max_bytes(bytes)
    }

    /// Changes the device pools' release threshold, for pools made already and later.
    ///
    /// # Errors
    /// A failed `cuMemPoolSetAttribute`; [`Error::ForkedChild`](crate::Error::ForkedChild)
    /// in a child process forked after pinlane set CUDA up (nothing is changed there).
    pub fn set_device_pool_release_bytes(&self, bytes: u64) -> Result<()> {
        crate::driver::fork::check("Runtime::set_device_pool_release_bytes")?;
        driver::set_pool_release_threshold(bytes);
        driver::apply_pool_release_threshold()
    }

    /// Gives back everything cached and not in use: free staging slots, free page-locked
    /// output blocks, cached pageable regions, the small device blocks kept for H2D
    /// outputs ([`Config::small_device_blocks`]: freed in order on their consumer streams,
    /// those of a stream the caller lent on the legacy stream after their events), and
    /// device pool memory that backs no allocation (`cuMemPoolTrimTo`). Owners retained
    /// after failed synchronisations are released first where their stream has finished
    /// its work (checked with an event, without blocking).
    ///
    /// Memory in use stays: tensors the caller holds, the batches in each thread's cache
    /// ring ([`H2dOptions::num_caches`](crate::engine::H2dOptions::num_caches)), device memory
    /// whose in-order free has not run yet on its consumer stream (synchronise that stream
    /// first to give it back too).
    ///
    /// The page-locked frees run on the calling thread, and `cuMemFreeHost` waits for all
    /// work queued on the device by anyone, holding every thread's copies meanwhile
    /// (docs/semantics.md): call it where the device is idle. With [`Config::sync_wait`]
    /// set they run on pinlane's free thread instead, and the call does not wait for the
    /// device (a failed free there is reported by the next call on the device), but other
    /// threads' copies are still held while the frees wait.
    ///
    /// # Errors
    /// [`Error::ForkedChild`](crate::Error::ForkedChild) in a child process forked after
    /// CUDA was set up (before any lock); the first failed free or trim (the rest are
    /// still attempted).
    pub fn trim(&self) -> Result<()> {
        // Not in a child forked after CUDA was set up: the pools' locks may be held for
        // ever there by the parent's threads, and the memory is the parent's.
        crate::driver::fork::check("trim")?;
        // Non-blocking: a retained stream that is still busy (or hung) keeps its owners.
        retained::release_finished(std::time::Duration::from_millis(10));
        let mut first = None;
        let mut note = |r: Result<()>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        note(self.arena.trim());
        note(self.outputs.trim());
        self.host_pool.trim();
        note(self.device_blocks.release("trim"));
        note(driver::trim_device_pools());
        first.map_or(Ok(()), Err)
    }

    /// Does once, now, the context-wide work a device needs before its first transfer:
    /// retains its primary context, creates pinlane's memory pool on it and loads the
    /// gather kernel. Loading a module waits for all work queued on the device by anyone,
    /// so a server calls this at start-up, before other streams are busy; otherwise the
    /// first transfer on the device does it. After it, no transfer on the device waits
    /// for work on streams that are not its own, but while a page-locked block is freed
    /// (an output block evicted at the pool's cap, on a thread of pinlane's; `trim`; the
    /// last drop of a `to_pinned` tensor) every thread's copies wait for the device's
    /// queued work (see docs/semantics.md).
    ///
    /// # Errors
    /// [`Error::NoCuda`], [`Error::DeviceUnavailable`], or the driver's error.
    pub fn warm_up(&self, device: Device) -> Result<()> {
        driver::require("warm_up")?;
        driver::warm_up(device.ordinal())
    }

    /// A snapshot of the memory pinlane holds; all zeros in a child process forked after
    /// pinlane set CUDA up (the pools are the parent's, and their locks may be held by
    /// the parent's threads for ever there).
    pub fn memory_stats(&self) -> MemoryStats {
        if crate::driver::fork::marked() {
            return MemoryStats::default();
        }
        MemoryStats {
            staging: self.arena.stats(),
            pinned_outputs: self.outputs.stats(),
            pageable_outputs: self.host_pool.stats(),
            devices: device_pool_stats(),
            kept_device_block_bytes: self.device_blocks.kept_bytes(),
            pageable_fallbacks: self.outputs.fallbacks(),
            slot_waits: self.arena.waits(),
            ..process_counts()
        }
    }
}

/// What one device's memory pool holds (the pool's own attributes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct DevicePoolStats {
    /// The device.
    pub device: Device,
    /// Device memory the pool has reserved from the driver.
    pub reserved_bytes: u64,
    /// Of that, bytes backing live allocations.
    pub used_bytes: u64,
    /// Highest `reserved_bytes` so far.
    pub peak_reserved_bytes: u64,
}

/// A snapshot of the memory pinlane holds: [`Runtime::memory_stats`] or
/// [`memory_stats`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct MemoryStats {
    /// Page-locked staging slots.
    pub staging: PoolStats,
    /// Page-locked D2H output blocks.
    pub pinned_outputs: PoolStats,
    /// Recycled pageable D2H output regions.
    pub pageable_outputs: PoolStats,
    /// Device pools, one per device pinlane has used.
    pub devices: Vec<DevicePoolStats>,
    /// Of the devices' `used_bytes`, blocks of small H2D outputs kept for the next ones
    /// ([`Config::small_device_blocks`]), all devices together; [`trim`] frees them.
    pub kept_device_block_bytes: usize,
    /// D2H batches that got pageable outputs because the page-locked pool was full, or
    /// the host could page-lock no more memory for it.
    pub pageable_fallbacks: u64,
    /// Times a call found every staging slot leased and waited for one.
    pub slot_waits: u64,
    /// Page-locked frees that failed on the thread that frees off the transfer path
    /// (the memory stays allocated).
    pub failed_frees: usize,
    /// Groups of owners retained after failed synchronisations.
    pub retained_owners: usize,
    /// Bytes of pinlane's own memory those owners hold (staging slots, device
    /// allocations, page-locked blocks). The caller's tensors they keep alive (clones of
    /// a call's sources or destinations) are not counted: that memory is the caller's, and
    /// an owner holding only such clones counts in `retained_owners` with no bytes.
    pub retained_bytes: usize,
    /// Errors raised on pinlane's own threads, where no call could return them (a failed
    /// free, user code that panicked while a non-blocking call's owners were released):
    /// each is returned by the next call on its device, on any thread, as
    /// [`Error::Deferred`] (see [`crate::driver::deferred`]).
    pub background_errors: usize,
}

/// [`Runtime::memory_stats`] of the process's runtime (all zeros in a forked child, as
/// there). Before the runtime exists (no
/// transfer yet, no [`Config::install`]) it installs nothing: the pools are empty, and
/// only the process-wide counts and device pools made already are reported.
///
/// ```
/// let s = pinlane::memory_stats();
/// assert!(s.staging.in_use_bytes <= s.staging.held_bytes);
/// ```
pub fn memory_stats() -> MemoryStats {
    if crate::driver::fork::marked() {
        return MemoryStats::default();
    }
    match current() {
        Some(rt) => rt.memory_stats(),
        None => MemoryStats {
            devices: device_pool_stats(),
            ..process_counts()
        },
    }
}

/// What is counted outside the runtime's pools.
fn process_counts() -> MemoryStats {
    MemoryStats {
        failed_frees: crate::memory::failed_frees(),
        retained_owners: retained::retained_count(),
        retained_bytes: retained::retained_bytes(),
        background_errors: driver::deferred::background_count(),
        ..MemoryStats::default()
    }
}

fn device_pool_stats() -> Vec<DevicePoolStats> {
    driver::device_pool_stats()
        .into_iter()
        .map(|(d, s)| DevicePoolStats {
            device: Device::cuda(d),
            reserved_bytes: s.reserved,
            used_bytes: s.used,
            peak_reserved_bytes: s.reserved_high,
        })
        .collect()
}

/// Waits for `event` as pinlane's blocking calls wait for their copies: in the driver
/// (`cuEventSynchronize`), or, with the default runtime's [`Config::sync_wait`] set,
/// polled for at most that long. It makes no runtime (before one, there is no bound): for
/// code that waits on the device beside pinlane's calls, as the Python package's wait for
/// a producer event does.
///
/// # Errors
/// [`Error::SyncTimeout`](crate::Error::SyncTimeout) past the bound; the driver's error
/// for a failed wait (the failure of any work the event covers).
///
/// ```no_run
/// # fn main() -> pinlane::Result<()> {
/// let stream = pinlane::Stream::new(pinlane::Device::cuda(0))?;
/// let done = pinlane::Event::new(pinlane::Device::cuda(0))?;
/// done.record(&stream)?;
/// pinlane::wait_for_event(&done)?;
/// # Ok(()) }
/// ```
pub fn wait_for_event(event: &crate::Event) -> Result<()> {
    crate::memory::arena::wait_for(event)
}

/// The bound [`wait_for_event`] and pinlane's blocking calls wait with now: the installed
/// runtime's [`Config::sync_wait`]; `None` when it sets none, or before a runtime is
/// installed (it makes none). For code beside pinlane's calls that would take a bounded
/// wait of its own only where there is a bound, as the Python package does before
/// torch's own synchronous copies.
///
/// ```
/// // No runtime installed with a bound: waits are as long as the work takes.
/// assert_eq!(pinlane::sync_wait(), None);
/// ```
pub fn sync_wait() -> Option<std::time::Duration> {
    crate::memory::waits::sync_wait()
}

/// [`Runtime::warm_up`] of the process's runtime.
///
/// # Errors
/// As [`Runtime::warm_up`].
///
/// ```
/// if pinlane::driver::available().is_some() {
///     pinlane::warm_up(pinlane::Device::cuda(0)).unwrap();
/// } else {
///     assert!(pinlane::warm_up(pinlane::Device::cuda(0)).is_err());
/// }
/// ```
pub fn warm_up(device: Device) -> Result<()> {
    runtime().warm_up(device)
}

/// [`Runtime::trim`] of the process's runtime. Before the runtime exists it installs
/// nothing: it trims the device pools made already (if any), the only memory pinlane can
/// hold then.
///
/// # Errors
/// As [`Runtime::trim`].
pub fn trim() -> Result<()> {
    // Before the default's lock, which a parent's thread may hold in a forked child.
    crate::driver::fork::check("trim")?;
    match current() {
        Some(rt) => rt.trim(),
        None => driver::trim_device_pools(),
    }
}

#[cfg(all(test, feature = "test-util"))]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A child forked while a thread of its parent held the default runtime's lock (as
    /// one inside the first `runtime()` or `Config::install` does) never waits for it:
    /// that thread is not in the child, so the lock is held there for ever. Shown to fail
    /// without `lock_default_unless_stuck`: the child was still waiting when killed.
    #[test]
    fn a_forked_child_never_waits_for_the_default_runtimes_lock() {
        crate::sim_tests::setup();
        assert!(
            crate::driver::available().is_some(),
            "the fork guard is armed"
        );
        let parents = runtime();
        // The child must look the default up (not find it in this thread's cache).
        CACHED.with(|c| *c.borrow_mut() = None);
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let (free_tx, free_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let _d = lock_default();
            held_tx.send(()).unwrap();
            let _ = free_rx.recv_timeout(Duration::from_secs(60));
        });
        held_rx.recv().unwrap();
        // SAFETY: fork has no precondition; the child runs only the checks below (no
        // test harness code, no exit handlers) and leaves with `_exit`.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork failed");
        if pid == 0 {
            let rt = runtime();
            let checks = [
                !Arc::ptr_eq(&rt, &parents),
                current().is_none(),
                matches!(trim(), Err(crate::Error::ForkedChild { op: "trim" })),
                matches!(
                    Config::default().install(),
                    Err(crate::Error::ForkedChild { .. })
                ),
                matches!(rt.trim(), Err(crate::Error::ForkedChild { .. })),
            ];
            let wrong = checks
                .iter()
                .enumerate()
                .filter(|(_, ok)| !**ok)
                .fold(0, |m, (i, _)| m | 1 << i);
            // SAFETY: ends the child at once.
            unsafe { libc::_exit(wrong) }
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut status = 0;
        let ended = loop {
            // SAFETY: waits for this process's own child; the status goes to a live local.
            let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if done == pid {
                break true;
            }
            if Instant::now() > deadline {
                // SAFETY: signals and reaps this process's own child.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                break false;
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        free_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(ended, "the child was still waiting after 10 s");
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "wrong answers: {status:#x}"
        );
        assert!(
            Arc::ptr_eq(&runtime(), &parents),
            "the parent's default is as it was"
        );
    }
}
