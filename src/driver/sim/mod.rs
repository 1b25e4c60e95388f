//! A simulated CUDA device, for testing the whole engine on machines without a GPU.
//!
//! Chosen explicitly, for the whole process, with [`enable`] before any other pinlane call;
//! never silently: without it the public calls keep the rule "no CUDA, input returned as
//! is". Once enabled, every driver entry point pinlane uses (see `api.rs`) is answered
//! here instead of by `libcuda`:
//!
//! * device memory is host memory; device addresses are host addresses;
//! * each stream is an in-order worker thread that runs its queued operations (copies,
//!   frees, event signals and waits, host functions, the gather kernel); an event
//!   completes when its stream's worker passes it;
//! * every operation starts after a seeded random delay (up to [`SimConfig::max_delay`]),
//!   so a missing wait or a too-early read shows up as wrong data rather than passing by
//!   luck;
//! * copies and the gather kernel on different streams overlap: each moves 64 KiB at a
//!   time under the memory lock and lets other threads in between, so work not ordered
//!   after another's writes reads some of the old bytes;
//! * memory freed in stream order is filled with a poison byte ([`POISON_FREED`]) when the
//!   free executes, and kept (quarantined) for a while, so a use after free reads or
//!   writes poison instead of someone else's memory; new device memory starts as
//!   [`POISON_NEW`]; pinlane's staging slots are poisoned when recycled
//!   (`memory/arena.rs`);
//! * a copy outside any allocation fails the stream with `CUDA_ERROR_ILLEGAL_ADDRESS`,
//!   returned by its next synchronisation;
//! * faults: the test-only fault plan of `fault.rs` (the Nth call of a kind fails) works
//!   the same on the simulated device as on the real one.
//!
//! | file | what it holds |
//! | --- | --- |
//! | `mod.rs` | [`SimConfig`], [`enable`], [`activity`], the simulator's state |
//! | `memory.rs` | regions of simulated memory and the quarantine of freed ones |
//! | `stream.rs` | streams (in-order worker threads), events, the operations they run |
//! | `entry.rs` | the driver entry points, answered with the driver's contracts |

mod entry;
mod memory;
mod stream;

use super::HostPtr;
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUresult};
use memory::*;
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;
use stream::*;

/// Byte written over device and page-locked memory when a free executes.
pub const POISON_FREED: u8 = 0xDD;
/// Byte new device allocations start with.
pub const POISON_NEW: u8 = 0xCD;
/// Byte written over a staging slot when it goes back to the arena.
pub const POISON_RECYCLED: u8 = 0xA5;

/// How the simulated device behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct SimConfig {
    /// Seeds every stream's delays.
    pub seed: u64,
    /// Number of simulated devices (default 2, so "another device" can be tested).
    pub devices: usize,
    /// Largest delay before each queued operation (default 100 µs).
    pub max_delay: Duration,
    /// Memory of each simulated device (default 4 GiB): allocations past it fail with
    /// `CUDA_ERROR_OUT_OF_MEMORY`.
    pub memory_per_device: usize,
    /// Most page-locked host memory `cuMemHostAlloc` gives out, all allocations together
    /// (default `None`: no limit); an allocation past it fails with
    /// `CUDA_ERROR_OUT_OF_MEMORY`, as the driver's does when the host cannot lock more.
    /// Registrations (`cuMemHostRegister`) are not counted.
    pub page_locked_limit: Option<usize>,
    /// Whether the devices report unified addressing and host pointers usable for
    /// registered memory (default `true`), so that kernels may read page-locked host
    /// memory; `false` makes pinlane take its kernel-free paths, and a kernel that reads
    /// host memory anyway fails with `CUDA_ERROR_ILLEGAL_ADDRESS`.
    pub host_mapped: bool,
    /// The `n`-th copy the simulator runs (1-based, counting every `cuMemcpy*Async` of
    /// the process that moves at least one byte) has one byte flipped in its destination, once (default `None`): a
    /// silent corruption, for proving that a round-trip check finds one
    /// ([`verify::round_trip`](crate::verify::round_trip)).
    pub corrupt_copy: Option<u64>,
    /// How long setting the simulated driver up takes, as `cuInit` may (default zero):
    /// for tests of what other threads, or a process forked meanwhile, see.
    pub set_up_delay: Duration,
    /// Whether host functions of all streams run one at a time, as the real driver may
    /// run them (default `false`: each stream's worker runs its own). Measured on an H100
    /// with driver 580 (session 67): a host function queued on an idle stream ran 479 ms
    /// late, behind another stream's 500 ms host function.
    pub serial_host_functions: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 0,
            devices: 2,
            max_delay: Duration::from_micros(100),
            memory_per_device: 4 << 30,
            page_locked_limit: None,
            host_mapped: true,
            corrupt_copy: None,
            set_up_delay: Duration::ZERO,
            serial_host_functions: false,
        }
    }
}

impl SimConfig {
    /// The default configuration with `seed`.
    pub fn seeded(seed: u64) -> SimConfig {
        SimConfig {
            seed,
            ..SimConfig::default()
        }
    }

    /// Sets [`SimConfig::devices`].
    pub fn devices(mut self, n: usize) -> SimConfig {
        self.devices = n;
        self
    }

    /// Sets [`SimConfig::max_delay`].
    pub fn max_delay(mut self, d: Duration) -> SimConfig {
        self.max_delay = d;
        self
    }

    /// Sets [`SimConfig::memory_per_device`].
    pub fn memory_per_device(mut self, bytes: usize) -> SimConfig {
        self.memory_per_device = bytes;
        self
    }

    /// Sets [`SimConfig::page_locked_limit`].
    pub fn page_locked_limit(mut self, bytes: usize) -> SimConfig {
        self.page_locked_limit = Some(bytes);
        self
    }

    /// Sets [`SimConfig::host_mapped`].
    pub fn host_mapped(mut self, mapped: bool) -> SimConfig {
        self.host_mapped = mapped;
        self
    }

    /// Sets [`SimConfig::corrupt_copy`]: the `n`-th copy gets one byte flipped.
    pub fn corrupt_copy(mut self, n: u64) -> SimConfig {
        self.corrupt_copy = Some(n);
        self
    }

    /// Sets [`SimConfig::set_up_delay`].
    pub fn set_up_delay(mut self, d: Duration) -> SimConfig {
        self.set_up_delay = d;
        self
    }

    /// Sets [`SimConfig::serial_host_functions`].
    pub fn serial_host_functions(mut self, serial: bool) -> SimConfig {
        self.serial_host_functions = serial;
        self
    }
}

static SIM: OnceLock<Sim> = OnceLock::new();

/// Makes this process use the simulated device instead of `libcuda`. Call it before any
/// other pinlane call; afterwards (or if the real driver was already probed) it is an
/// [`Error::InvalidOption`], unless the same configuration is already enabled.
///
/// ```
/// use pinlane::driver::sim::{enable, SimConfig};
/// enable(SimConfig::seeded(7)).unwrap();
/// assert_eq!(pinlane::driver::available().unwrap().device_count, 2);
/// let b = vec![pinlane::Tensor::from_vec(vec![1u8, 2, 3], [3]).unwrap()];
/// let on = pinlane::transfer_tensor_h2d(&b).unwrap();
/// assert!(on[0].is_cuda()); // on the simulated cuda:0
/// let back = pinlane::transfer_tensor_d2h(&on, &pinlane::D2hOptions::default()).unwrap();
/// assert_eq!(back, b);
/// ```
///
/// # Errors
/// [`Error::InvalidOption`] when the real driver is already in use in this process, or the
/// simulator is already enabled with another configuration.
pub fn enable(config: SimConfig) -> Result<()> {
    let refuse = |reason: String| Error::InvalidOption {
        name: "simulated device",
        reason,
    };
    if SIM.get().is_none() && super::probed() {
        return Err(refuse(
            "the real driver is already in use in this process".into(),
        ));
    }
    let sim = SIM.get_or_init(|| Sim::new(config.clone()));
    if sim.cfg != config {
        return Err(refuse(format!("already enabled as {:?}", sim.cfg)));
    }
    Ok(())
}

/// Whether this process uses the simulated device.
pub fn is_enabled() -> bool {
    SIM.get().is_some()
}

pub(crate) fn active() -> Option<&'static Sim> {
    SIM.get()
}

impl Sim {
    /// [`SimConfig::set_up_delay`].
    pub(crate) fn set_up_delay(&self) -> Duration {
        self.cfg.set_up_delay
    }
}

/// The simulated device (all of its devices).
pub(crate) struct Sim {
    cfg: SimConfig,
    mem: Mutex<Memory>,
    /// Counts streams, to seed each one's delays differently.
    streams: AtomicU64,
    /// Counts the copies run, for [`SimConfig::corrupt_copy`].
    copies: AtomicU64,
    legacy: Vec<OnceLock<Arc<SimStream>>>,
    /// Every stream made, with its device: `cuMemFreeHost` waits for those of its device,
    /// as the driver's does. Weak: a stream's state lives while its handle or its worker
    /// (queued work) does.
    all_streams: Mutex<Vec<(usize, std::sync::Weak<stream::StreamState>)>>,
    /// What each device has seen, for [`activity`].
    seen: Mutex<Activity>,
    /// Held while a host function runs, when [`SimConfig::serial_host_functions`] is set.
    host_turn: Mutex<()>,
    /// [`reuse_stream_handles`]: destroyed streams parked (their queues closed) for the
    /// next `cuStreamCreate` to take their handles; `None` while handles are not reused.
    parked: Mutex<Option<Vec<Arc<SimStream>>>>,
}

/// What the simulated devices have seen so far in this process ([`activity`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Activity {
    /// Per device: whether its primary context was retained or made current.
    pub context_used: Vec<bool>,
    /// Per device: retains of its primary context not released yet.
    pub context_retains: Vec<usize>,
    /// Memory pools made (`cuMemPoolCreate`) and not destroyed yet.
    pub pools_live: usize,
    /// Per device: page-locked host allocations made while its context was current.
    pub host_allocs: Vec<usize>,
    /// Per device: device allocations made on it.
    pub device_allocs: Vec<usize>,
    /// Streams created with `cuStreamCreate`.
    pub streams_created: usize,
    /// Events created with `cuEventCreate`.
    pub events_created: usize,
    /// Host functions queued with `cuLaunchHostFunc`.
    pub host_functions: usize,
    /// Launches of the gather kernel, of all variants.
    pub kernel_launches: usize,
    /// Of those, launches that passed their descriptors in the parameters, per variant:
    /// the ones taking up to 15, 63 and 127 descriptors.
    pub inline_launches: [usize; 3],
    /// Calls of `cuStreamSynchronize`.
    pub stream_syncs: usize,
    /// End flags' writes queued (`cuStreamWriteValue32`).
    pub flag_writes: usize,
    /// Handles (as addresses) passed to `cuStreamDestroy` and `cuEventDestroy`, with how
    /// often each was.
    pub destroyed: std::collections::HashMap<usize, usize>,
}

impl Activity {
    /// How often `handle` was destroyed (a stream or an event, by address).
    pub fn times_destroyed(&self, handle: usize) -> usize {
        self.destroyed.get(&handle).copied().unwrap_or(0)
    }
}

/// What the simulated devices have seen so far (`None` when the simulator is not
/// enabled): which contexts were used, where memory was allocated, streams made and
/// destroyed. For tests that prove pinlane touches only the devices it was asked to use
/// and never destroys a stream it did not make.
pub fn activity() -> Option<Activity> {
    active().map(|s| lock(&s.seen).clone())
}

/// Page-locked host bytes allocated (`cuMemHostAlloc`) and not freed yet: what a leak
/// checker would report if the process ended now (`None` when the simulator is not
/// enabled).
pub fn page_locked_bytes() -> Option<usize> {
    active().map(|s| {
        lock(&s.mem)
            .live
            .values()
            .filter(|r| r.device.is_none())
            .map(|r| r.len)
            .sum()
    })
}

/// Host bytes registered (`cuMemHostRegister`) and not unregistered yet (`None` when the
/// simulator is not enabled).
pub fn registered_bytes() -> Option<usize> {
    active().map(|s| lock(&s.mem).registered.values().map(|&(n, _)| n).sum())
}

/// Makes `stream` (one pinlane or the caller made with `cuStreamCreate`, not the legacy
/// stream) look as if a CUDA graph capture were running on it (`on`) or not: the
/// simulated `cuStreamIsCapturing` answers so, and what is queued on it meanwhile is
/// counted ([`captured_ops`]). The operations still run: the simulator records no graph.
/// Returns false (nothing changed) when the simulator is not enabled or `stream` is the
/// legacy stream.
pub fn set_capturing(stream: &crate::driver::Stream, on: bool) -> bool {
    match sim_stream(stream) {
        Some(st) => {
            st.capturing.store(on, std::sync::atomic::Ordering::Relaxed);
            true
        }
        None => false,
    }
}

/// With `on`, a destroyed stream's handle goes to the next stream created (its queued
/// work still runs first), as a real driver may hand a freed handle out again; off (the
/// default), a handle is an address the allocator may or may not reuse. For tests of
/// what must not be told apart by handle. `false` when the simulator is not enabled.
pub fn reuse_stream_handles(on: bool) -> bool {
    match active() {
        Some(sim) => {
            *lock(&sim.parked) = on.then(Vec::new);
            true
        }
        None => false,
    }
}

/// Whether `ptr` starts a live (not yet freed) simulated device or page-locked allocation,
/// for the lib's own tests of when a free has run.
#[cfg(test)]
pub(crate) fn is_live(ptr: u64) -> bool {
    active().is_some_and(|s| lock(&s.mem).live.contains_key(&ptr))
}

/// How many operations were queued on `stream` while [`set_capturing`] had it capturing
/// (`None` when the simulator is not enabled or `stream` is the legacy stream).
pub fn captured_ops(stream: &crate::driver::Stream) -> Option<u64> {
    sim_stream(stream).map(|st| st.captured.load(std::sync::atomic::Ordering::Relaxed))
}

fn sim_stream(stream: &crate::driver::Stream) -> Option<Arc<stream::SimStream>> {
    let sim = active()?;
    if stream.is_legacy() {
        return None;
    }
    // SAFETY: a non-legacy `Stream` holds a handle from `cuStreamCreate` (pinlane's own,
    // alive while `stream` is) or one its maker keeps alive (`Stream::from_raw`'s
    // contract); under the simulator both are simulated streams.
    Some(unsafe { sim.stream(stream.raw()) })
}

thread_local! {
    /// The simulated context stack: device indices.
    static CTX: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

const OK: CUresult = CUresult::CUDA_SUCCESS;
/// Fake handles: distinct non-null values that are never dereferenced.
const MODULE: usize = 0x5100;
const GATHER_FN: usize = 0x5200;
/// The inline variants of the gather kernel (`GATHER_FN + 1 + k`) and how many
/// descriptors each takes (`INLINE_SIZES` of `kernels.rs`).
const INLINE_CAPS: [usize; 3] = super::kernels::INLINE_SIZES;
const POOL: usize = 0x5300;
const LEGACY: usize = 1;

fn ctx_handle(device: usize) -> sys::CUcontext {
    ((device + 1) * 0x1000) as sys::CUcontext
}

impl Sim {
    fn new(cfg: SimConfig) -> Sim {
        let devices = cfg.devices.max(1);
        Sim {
            mem: Mutex::new(Memory {
                used: vec![0; devices],
                high: vec![0; devices],
                ..Memory::default()
            }),
            streams: AtomicU64::new(0),
            copies: AtomicU64::new(0),
            legacy: (0..devices).map(|_| OnceLock::new()).collect(),
            all_streams: Mutex::new(Vec::new()),
            host_turn: Mutex::new(()),
            parked: Mutex::new(None),
            seen: Mutex::new(Activity {
                context_used: vec![false; devices],
                context_retains: vec![0; devices],
                host_allocs: vec![0; devices],
                device_allocs: vec![0; devices],
                ..Activity::default()
            }),
            cfg: SimConfig { devices, ..cfg },
        }
    }

    pub(crate) fn devices(&self) -> usize {
        self.cfg.devices
    }

    fn current_device(&self) -> usize {
        CTX.try_with(|c| c.borrow().last().copied())
            .ok()
            .flatten()
            .unwrap_or(0)
    }
}
