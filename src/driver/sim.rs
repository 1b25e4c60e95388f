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
//! * memory freed in stream order is filled with a poison byte ([`POISON_FREED`]) when the
//!   free executes, and kept (quarantined) for a while, so a use after free reads or
//!   writes poison instead of someone else's memory; new device memory starts as
//!   [`POISON_NEW`]; pinlane's staging slots are poisoned when recycled
//!   (`memory/arena.rs`);
//! * a copy outside any allocation fails the stream with `CUDA_ERROR_ILLEGAL_ADDRESS`,
//!   returned by its next synchronisation;
//! * faults: the test-only fault plan of `fault.rs` (the Nth call of a kind fails) works
//!   the same on the simulated device as on the real one.

use super::HostPtr;
use crate::error::{Error, Result};
use cudarc::driver::sys::{self, CUresult};
use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::ffi::{c_char, c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

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
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            seed: 0,
            devices: 2,
            max_delay: Duration::from_micros(100),
            memory_per_device: 4 << 30,
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

/// A region of simulated memory: page-aligned, zeroed at birth, freed on drop.
struct Region {
    ptr: HostPtr<u8>,
    len: usize,
    device: Option<usize>,
}

impl Region {
    fn new(len: usize, device: Option<usize>, fill: u8) -> Option<Region> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), 4096).ok()?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        if ptr.is_null() {
            return None;
        }
        // SAFETY: `ptr` is a fresh allocation of at least `len` bytes.
        unsafe { std::ptr::write_bytes(ptr, fill, len.max(1)) };
        Some(Region {
            ptr: HostPtr(ptr),
            len,
            device,
        })
    }

    fn addr(&self) -> u64 {
        self.ptr.0 as u64
    }

    fn poison(&self, byte: u8) {
        // SAFETY: the region owns `len` bytes at `ptr`; callers hold the memory lock, so no
        // simulated copy touches them concurrently.
        unsafe { std::ptr::write_bytes(self.ptr.0, byte, self.len) };
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if let Ok(layout) = std::alloc::Layout::from_size_align(self.len.max(1), 4096) {
            // SAFETY: allocated in `new` with this same layout; dropped once.
            unsafe { std::alloc::dealloc(self.ptr.0, layout) };
        }
    }
}

/// Bytes of freed memory kept (poisoned) before it is really released.
const QUARANTINE: usize = 256 << 20;

#[derive(Default)]
struct Memory {
    /// Live device allocations and page-locked host allocations, by start address.
    live: BTreeMap<u64, Region>,
    /// Freed, poisoned regions still kept, by start address, and their order.
    dead: BTreeMap<u64, Region>,
    dead_order: VecDeque<u64>,
    dead_bytes: usize,
    /// Device bytes in use, per device.
    used: Vec<usize>,
}

impl Memory {
    /// Whether `[addr, addr + n)` lies inside one live or quarantined region.
    fn covers(&self, addr: u64, n: usize) -> bool {
        let inside = |map: &BTreeMap<u64, Region>| {
            map.range(..=addr)
                .next_back()
                .is_some_and(|(&start, r)| addr - start + n as u64 <= r.len as u64)
        };
        n == 0 || inside(&self.live) || inside(&self.dead)
    }

    fn bury(&mut self, r: Region) {
        r.poison(POISON_FREED);
        self.dead_bytes += r.len;
        self.dead_order.push_back(r.addr());
        self.dead.insert(r.addr(), r);
        while self.dead_bytes > QUARANTINE {
            let Some(a) = self.dead_order.pop_front() else {
                break;
            };
            if let Some(old) = self.dead.remove(&a) {
                self.dead_bytes -= old.len;
            }
        }
    }
}

/// One queued operation of a simulated stream.
enum Op {
    /// Copy `n` bytes; `dev_dst`/`dev_src` say which side must be simulated device memory.
    Copy {
        dst: u64,
        src: u64,
        n: usize,
        dev_dst: bool,
        dev_src: bool,
    },
    Free(u64),
    Signal(Arc<SimEvent>, u64),
    Wait(Arc<SimEvent>, u64),
    /// Host functions are queued only by test helpers (feature `test-util`).
    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    Host(unsafe extern "C" fn(*mut c_void), HostPtr<c_void>),
    Gather {
        pieces: u64,
        n: u32,
        dst: u64,
    },
}

#[derive(Default)]
struct Progress {
    submitted: u64,
    done: u64,
    error: Option<CUresult>,
}

struct StreamState {
    progress: Mutex<Progress>,
    changed: Condvar,
}

/// A simulated stream: a worker thread running queued operations in order.
pub(crate) struct SimStream {
    tx: Mutex<mpsc::Sender<Op>>,
    state: Arc<StreamState>,
    device: usize,
}

/// A simulated event: recorded generations and the last one a stream passed.
pub(crate) struct SimEvent {
    gens: Mutex<(u64, u64)>,
    changed: Condvar,
}

/// The simulated device (all of its devices).
pub(crate) struct Sim {
    cfg: SimConfig,
    mem: Mutex<Memory>,
    /// Counts streams, to seed each one's delays differently.
    streams: AtomicU64,
    legacy: Vec<OnceLock<Arc<SimStream>>>,
    /// What each device has seen, for [`activity`].
    seen: Mutex<Activity>,
}

/// What the simulated devices have seen so far in this process ([`activity`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Activity {
    /// Per device: whether its primary context was retained or made current.
    pub context_used: Vec<bool>,
    /// Per device: page-locked host allocations made while its context was current.
    pub host_allocs: Vec<usize>,
    /// Per device: device allocations made on it.
    pub device_allocs: Vec<usize>,
    /// Streams created with `cuStreamCreate`.
    pub streams_created: usize,
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
                ..Memory::default()
            }),
            streams: AtomicU64::new(0),
            legacy: (0..devices).map(|_| OnceLock::new()).collect(),
            seen: Mutex::new(Activity {
                context_used: vec![false; devices],
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

    fn new_stream(&'static self, device: usize) -> Arc<SimStream> {
        let (tx, rx) = mpsc::channel::<Op>();
        let state = Arc::new(StreamState {
            progress: Mutex::new(Progress::default()),
            changed: Condvar::new(),
        });
        let k = self.streams.fetch_add(1, Ordering::Relaxed);
        let mut rng = (self.cfg.seed ^ k.wrapping_mul(0x9E37_79B9_7F4A_7C15)) | 1;
        let max = self.cfg.max_delay.as_nanos() as u64;
        let st = state.clone();
        let _ = std::thread::Builder::new()
            .name(format!("pinlane-sim-stream-{k}"))
            .spawn(move || {
                for op in rx {
                    if max > 0 {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        std::thread::sleep(Duration::from_nanos(rng % (max + 1)));
                    }
                    let res = self.run(op);
                    let mut p = lock(&st.progress);
                    p.done += 1;
                    if let Err(e) = res {
                        p.error.get_or_insert(e);
                    }
                    st.changed.notify_all();
                }
            });
        Arc::new(SimStream {
            tx: Mutex::new(tx),
            state,
            device,
        })
    }

    /// Runs one operation on a stream's worker.
    fn run(&self, op: Op) -> std::result::Result<(), CUresult> {
        match op {
            Op::Copy {
                dst,
                src,
                n,
                dev_dst,
                dev_src,
            } => {
                let mem = lock(&self.mem);
                if (dev_dst && !mem.covers(dst, n)) || (dev_src && !mem.covers(src, n)) {
                    return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                }
                // SAFETY: device sides are inside simulated regions (checked above), which
                // the memory lock keeps allocated during the copy; host sides are
                // page-locked memory that the caller of the async copy keeps alive until
                // the copy completes (the driver call's contract). Distinct regions.
                unsafe { std::ptr::copy_nonoverlapping(src as *const u8, dst as *mut u8, n) };
                Ok(())
            }
            Op::Free(addr) => {
                let mut mem = lock(&self.mem);
                let Some(r) = mem.live.remove(&addr) else {
                    return Err(CUresult::CUDA_ERROR_INVALID_VALUE);
                };
                if let Some(d) = r.device {
                    mem.used[d] -= r.len;
                }
                mem.bury(r);
                Ok(())
            }
            Op::Signal(ev, g) => {
                let mut gens = lock(&ev.gens);
                gens.1 = gens.1.max(g);
                ev.changed.notify_all();
                Ok(())
            }
            Op::Wait(ev, g) => {
                let mut gens = lock(&ev.gens);
                while gens.1 < g {
                    gens = ev.changed.wait(gens).unwrap_or_else(|p| p.into_inner());
                }
                Ok(())
            }
            Op::Host(f, user) => {
                // SAFETY: cuLaunchHostFunc's contract: `f` may be called once with `user`.
                unsafe { f(user.0) };
                Ok(())
            }
            Op::Gather { pieces, n, dst } => {
                let mem = lock(&self.mem);
                let desc_bytes = n as usize * 24;
                if !mem.covers(pieces, desc_bytes) {
                    return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                }
                // SAFETY: `pieces..+desc_bytes` is inside a simulated region (checked).
                let raw = unsafe { std::slice::from_raw_parts(pieces as *const u8, desc_bytes) };
                for d in raw.chunks_exact(24) {
                    let word = |i: usize| {
                        u64::from_ne_bytes(d[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]))
                    };
                    let (src, off, len) = (word(0), word(1), word(2) as usize);
                    let to = dst.wrapping_add(off);
                    if !mem.covers(src, len) || !mem.covers(to, len) {
                        return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                    }
                    // SAFETY: both ranges are inside simulated regions (checked above),
                    // kept allocated by the lock; the kernel's contract makes them disjoint.
                    unsafe { std::ptr::copy_nonoverlapping(src as *const u8, to as *mut u8, len) };
                }
                Ok(())
            }
        }
    }

    /// The stream a handle names: the legacy one of the current device, or a created one.
    ///
    /// # Safety
    /// A non-legacy handle came from `cuStreamCreate` and was not destroyed.
    unsafe fn stream(&'static self, s: sys::CUstream) -> Arc<SimStream> {
        if s.is_null() || s as usize == LEGACY {
            let d = self.current_device().min(self.legacy.len() - 1);
            return self.legacy[d].get_or_init(|| self.new_stream(d)).clone();
        }
        let p = s as *const SimStream;
        // SAFETY: `p` came from Arc::into_raw in cuStreamCreate and is still owned by the
        // handle (caller's contract); take a new reference without consuming the handle's.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }

    /// # Safety
    /// `e` came from `cuEventCreate` and was not destroyed.
    unsafe fn event(&self, e: sys::CUevent) -> Arc<SimEvent> {
        let p = e as *const SimEvent;
        // SAFETY: as in `stream`.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }

    fn submit(s: &SimStream, op: Op) -> CUresult {
        let mut p = lock(&s.state.progress);
        let sent = lock(&s.tx).send(op).is_ok();
        if !sent {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        }
        p.submitted += 1;
        OK
    }
}

/// The driver entry points, simulated (same names and signatures as the real ones; see
/// `api.rs`). Each has the contract of its driver call.
#[allow(non_snake_case, clippy::missing_safety_doc, clippy::too_many_arguments)]
impl Sim {
    pub(crate) unsafe fn cuInit(&self, _flags: c_uint) -> CUresult {
        OK
    }

    pub(crate) unsafe fn cuDriverGetVersion(&self, v: *mut c_int) -> CUresult {
        // SAFETY: out-pointer per the driver contract.
        unsafe { *v = 0 };
        OK
    }

    pub(crate) unsafe fn cuDeviceGetCount(&self, n: *mut c_int) -> CUresult {
        // SAFETY: out-pointer per the driver contract.
        unsafe { *n = self.cfg.devices as c_int };
        OK
    }

    pub(crate) unsafe fn cuDeviceGet(&self, d: *mut sys::CUdevice, ordinal: c_int) -> CUresult {
        if ordinal < 0 || ordinal as usize >= self.cfg.devices {
            return CUresult::CUDA_ERROR_INVALID_DEVICE;
        }
        // SAFETY: out-pointer per the driver contract.
        unsafe { *d = ordinal };
        OK
    }

    pub(crate) unsafe fn cuDevicePrimaryCtxRetain(
        &self,
        ctx: *mut sys::CUcontext,
        d: sys::CUdevice,
    ) -> CUresult {
        if let Some(u) = lock(&self.seen).context_used.get_mut(d as usize) {
            *u = true;
        }
        // SAFETY: out-pointer per the driver contract.
        unsafe { *ctx = ctx_handle(d as usize) };
        OK
    }

    pub(crate) unsafe fn cuCtxGetCurrent(&self, ctx: *mut sys::CUcontext) -> CUresult {
        let top = CTX.try_with(|c| c.borrow().last().copied()).ok().flatten();
        // SAFETY: out-pointer per the driver contract.
        unsafe { *ctx = top.map_or(std::ptr::null_mut(), ctx_handle) };
        OK
    }

    pub(crate) unsafe fn cuCtxPushCurrent_v2(&self, ctx: sys::CUcontext) -> CUresult {
        let d = (ctx as usize / 0x1000).saturating_sub(1);
        if let Some(u) = lock(&self.seen).context_used.get_mut(d) {
            *u = true;
        }
        let _ = CTX.try_with(|c| c.borrow_mut().push(d));
        OK
    }

    pub(crate) unsafe fn cuCtxPopCurrent_v2(&self, ctx: *mut sys::CUcontext) -> CUresult {
        let top = CTX.try_with(|c| c.borrow_mut().pop()).ok().flatten();
        if !ctx.is_null() {
            // SAFETY: out-pointer per the driver contract (may be null).
            unsafe { *ctx = top.map_or(std::ptr::null_mut(), ctx_handle) };
        }
        OK
    }

    pub(crate) unsafe fn cuGetErrorName(&self, e: CUresult, s: *mut *const c_char) -> CUresult {
        let name: &'static std::ffi::CStr = match e {
            CUresult::CUDA_SUCCESS => c"CUDA_SUCCESS",
            CUresult::CUDA_ERROR_INVALID_VALUE => c"CUDA_ERROR_INVALID_VALUE",
            CUresult::CUDA_ERROR_OUT_OF_MEMORY => c"CUDA_ERROR_OUT_OF_MEMORY",
            CUresult::CUDA_ERROR_INVALID_DEVICE => c"CUDA_ERROR_INVALID_DEVICE",
            CUresult::CUDA_ERROR_INVALID_HANDLE => c"CUDA_ERROR_INVALID_HANDLE",
            CUresult::CUDA_ERROR_NOT_READY => c"CUDA_ERROR_NOT_READY",
            CUresult::CUDA_ERROR_ILLEGAL_ADDRESS => c"CUDA_ERROR_ILLEGAL_ADDRESS",
            _ => c"CUDA_ERROR_UNKNOWN",
        };
        // SAFETY: out-pointer per the driver contract; the string is static.
        unsafe { *s = name.as_ptr() };
        OK
    }

    pub(crate) unsafe fn cuStreamCreate(
        &'static self,
        s: *mut sys::CUstream,
        _flags: c_uint,
    ) -> CUresult {
        let st = self.new_stream(self.current_device());
        lock(&self.seen).streams_created += 1;
        // SAFETY: out-pointer per the driver contract; the handle owns one reference,
        // released by cuStreamDestroy.
        unsafe { *s = Arc::into_raw(st) as sys::CUstream };
        OK
    }

    pub(crate) unsafe fn cuStreamDestroy_v2(&self, s: sys::CUstream) -> CUresult {
        if s.is_null() || s as usize == LEGACY {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        }
        // SAFETY: the handle's reference from cuStreamCreate, released once (contract).
        // Queued work still runs: the worker ends when its queue closes.
        drop(unsafe { Arc::from_raw(s as *const SimStream) });
        *lock(&self.seen).destroyed.entry(s as usize).or_default() += 1;
        OK
    }

    pub(crate) unsafe fn cuStreamGetCtx(
        &'static self,
        s: sys::CUstream,
        ctx: *mut sys::CUcontext,
    ) -> CUresult {
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        // SAFETY: out-pointer per the driver contract.
        unsafe { *ctx = ctx_handle(st.device) };
        OK
    }

    pub(crate) unsafe fn cuStreamSynchronize(&'static self, s: sys::CUstream) -> CUresult {
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        let mut p = lock(&st.state.progress);
        while p.done < p.submitted {
            p = st.state.changed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        p.error.take().unwrap_or(OK)
    }

    pub(crate) unsafe fn cuStreamWaitEvent(
        &'static self,
        s: sys::CUstream,
        e: sys::CUevent,
        _flags: c_uint,
    ) -> CUresult {
        // SAFETY: both handles are valid (contract).
        let (st, ev) = unsafe { (self.stream(s), self.event(e)) };
        let g = lock(&ev.gens).0;
        if g == 0 {
            return OK; // never recorded: nothing to wait for
        }
        Self::submit(&st, Op::Wait(ev, g))
    }

    #[cfg_attr(not(feature = "test-util"), allow(dead_code))]
    pub(crate) unsafe fn cuLaunchHostFunc(
        &'static self,
        s: sys::CUstream,
        f: sys::CUhostFn,
        user: *mut c_void,
    ) -> CUresult {
        let Some(f) = f else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        Self::submit(&st, Op::Host(f, HostPtr(user)))
    }

    pub(crate) unsafe fn cuEventCreate(&self, e: *mut sys::CUevent, _flags: c_uint) -> CUresult {
        let ev = Arc::new(SimEvent {
            gens: Mutex::new((0, 0)),
            changed: Condvar::new(),
        });
        // SAFETY: out-pointer per the driver contract; released by cuEventDestroy.
        unsafe { *e = Arc::into_raw(ev) as sys::CUevent };
        OK
    }

    pub(crate) unsafe fn cuEventDestroy_v2(&self, e: sys::CUevent) -> CUresult {
        // SAFETY: the handle's reference from cuEventCreate, released once (contract).
        drop(unsafe { Arc::from_raw(e as *const SimEvent) });
        *lock(&self.seen).destroyed.entry(e as usize).or_default() += 1;
        OK
    }

    pub(crate) unsafe fn cuEventRecord(
        &'static self,
        e: sys::CUevent,
        s: sys::CUstream,
    ) -> CUresult {
        // SAFETY: both handles are valid (contract).
        let (ev, st) = unsafe { (self.event(e), self.stream(s)) };
        let g = {
            let mut gens = lock(&ev.gens);
            gens.0 += 1;
            gens.0
        };
        Self::submit(&st, Op::Signal(ev, g))
    }

    pub(crate) unsafe fn cuEventSynchronize(&self, e: sys::CUevent) -> CUresult {
        // SAFETY: the handle is valid (contract).
        let ev = unsafe { self.event(e) };
        let mut gens = lock(&ev.gens);
        let g = gens.0;
        while gens.1 < g {
            gens = ev.changed.wait(gens).unwrap_or_else(|p| p.into_inner());
        }
        OK
    }

    pub(crate) unsafe fn cuEventQuery(&self, e: sys::CUevent) -> CUresult {
        // SAFETY: the handle is valid (contract).
        let ev = unsafe { self.event(e) };
        let gens = lock(&ev.gens);
        if gens.1 >= gens.0 {
            OK
        } else {
            CUresult::CUDA_ERROR_NOT_READY
        }
    }

    pub(crate) unsafe fn cuMemHostAlloc(
        &self,
        p: *mut *mut c_void,
        n: usize,
        _flags: c_uint,
    ) -> CUresult {
        let Some(r) = Region::new(n, None, 0) else {
            return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        };
        let current = CTX.try_with(|c| c.borrow().last().copied()).ok().flatten();
        let Some(d) = current else {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        };
        if let Some(n) = lock(&self.seen).host_allocs.get_mut(d) {
            *n += 1;
        }
        // SAFETY: out-pointer per the driver contract.
        unsafe { *p = r.ptr.0.cast() };
        lock(&self.mem).live.insert(r.addr(), r);
        OK
    }

    pub(crate) unsafe fn cuMemFreeHost(&self, p: *mut c_void) -> CUresult {
        let mut mem = lock(&self.mem);
        match mem.live.remove(&(p as u64)) {
            Some(r) => {
                mem.bury(r);
                OK
            }
            None => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }

    pub(crate) unsafe fn cuMemPoolCreate(
        &self,
        pool: *mut sys::CUmemoryPool,
        props: *const sys::CUmemPoolProps,
    ) -> CUresult {
        // SAFETY: the props pointer is valid for reads (contract).
        let d = unsafe { (*props).location.id } as usize;
        // SAFETY: out-pointer per the driver contract.
        unsafe { *pool = (POOL + 16 * d) as sys::CUmemoryPool };
        OK
    }

    pub(crate) unsafe fn cuMemPoolTrimTo(
        &self,
        _pool: sys::CUmemoryPool,
        _keep: usize,
    ) -> CUresult {
        OK // the simulated pool caches nothing: freed memory is given back at once
    }

    /// Reserved and used memory are both what the pool's device has allocated (the
    /// simulated pool caches nothing).
    pub(crate) unsafe fn cuMemPoolGetAttribute(
        &self,
        pool: sys::CUmemoryPool,
        _a: sys::CUmemPool_attribute,
        v: *mut c_void,
    ) -> CUresult {
        let d = (pool as usize).wrapping_sub(POOL) / 16;
        let used = lock(&self.mem).used.get(d).copied().unwrap_or(0) as u64;
        // SAFETY: the attributes pinlane reads are u64 (contract).
        unsafe { *v.cast::<u64>() = used };
        OK
    }

    pub(crate) unsafe fn cuMemPoolSetAttribute(
        &self,
        _pool: sys::CUmemoryPool,
        _a: sys::CUmemPool_attribute,
        _v: *mut c_void,
    ) -> CUresult {
        OK
    }

    pub(crate) unsafe fn cuMemAllocFromPoolAsync(
        &self,
        p: *mut sys::CUdeviceptr,
        n: usize,
        _pool: sys::CUmemoryPool,
        _s: sys::CUstream,
    ) -> CUresult {
        let d = self.current_device().min(self.cfg.devices - 1);
        let mut mem = lock(&self.mem);
        if mem.used[d].saturating_add(n) > self.cfg.memory_per_device {
            return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        }
        let Some(r) = Region::new(n, Some(d), POISON_NEW) else {
            return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        };
        mem.used[d] += n;
        if let Some(k) = lock(&self.seen).device_allocs.get_mut(d) {
            *k += 1;
        }
        // SAFETY: out-pointer per the driver contract.
        unsafe { *p = r.addr() };
        mem.live.insert(r.addr(), r);
        OK
    }

    pub(crate) unsafe fn cuMemFreeAsync(
        &'static self,
        p: sys::CUdeviceptr,
        s: sys::CUstream,
    ) -> CUresult {
        if !lock(&self.mem).live.contains_key(&p) {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        Self::submit(&st, Op::Free(p))
    }

    pub(crate) unsafe fn cuMemcpyHtoDAsync_v2(
        &'static self,
        dst: sys::CUdeviceptr,
        src: *const c_void,
        n: usize,
        s: sys::CUstream,
    ) -> CUresult {
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        let op = Op::Copy {
            dst,
            src: src as u64,
            n,
            dev_dst: true,
            dev_src: false,
        };
        Self::submit(&st, op)
    }

    pub(crate) unsafe fn cuMemcpyDtoHAsync_v2(
        &'static self,
        dst: *mut c_void,
        src: sys::CUdeviceptr,
        n: usize,
        s: sys::CUstream,
    ) -> CUresult {
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        let op = Op::Copy {
            dst: dst as u64,
            src,
            n,
            dev_dst: false,
            dev_src: true,
        };
        Self::submit(&st, op)
    }

    pub(crate) unsafe fn cuMemGetInfo_v2(&self, free: *mut usize, total: *mut usize) -> CUresult {
        let d = self.current_device().min(self.cfg.devices - 1);
        let used = lock(&self.mem).used[d];
        // SAFETY: out-pointers per the driver contract.
        unsafe {
            *total = self.cfg.memory_per_device;
            *free = self.cfg.memory_per_device.saturating_sub(used);
        }
        OK
    }

    pub(crate) unsafe fn cuModuleLoadData(
        &self,
        m: *mut sys::CUmodule,
        _image: *const c_void,
    ) -> CUresult {
        // SAFETY: out-pointer per the driver contract.
        unsafe { *m = MODULE as sys::CUmodule };
        OK
    }

    pub(crate) unsafe fn cuModuleGetFunction(
        &self,
        f: *mut sys::CUfunction,
        _m: sys::CUmodule,
        name: *const c_char,
    ) -> CUresult {
        // SAFETY: `name` is a NUL-terminated string per the driver contract.
        let name = unsafe { std::ffi::CStr::from_ptr(name) };
        if name != c"pinlane_gather" {
            return CUresult::CUDA_ERROR_NOT_FOUND;
        }
        // SAFETY: out-pointer per the driver contract.
        unsafe { *f = GATHER_FN as sys::CUfunction };
        OK
    }

    pub(crate) unsafe fn cuLaunchKernel(
        &'static self,
        f: sys::CUfunction,
        _gx: c_uint,
        _gy: c_uint,
        _gz: c_uint,
        _bx: c_uint,
        _by: c_uint,
        _bz: c_uint,
        _shared: c_uint,
        s: sys::CUstream,
        params: *mut *mut c_void,
        _extra: *mut *mut c_void,
    ) -> CUresult {
        if f as usize != GATHER_FN || params.is_null() {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        }
        // SAFETY: the gather kernel's parameters are (u64, u32, u64), each pointed to by
        // one entry of `params` (the launch contract); they are read now, as the driver
        // copies parameters at launch.
        let (pieces, n, dst) = unsafe {
            (
                *(*params).cast::<u64>(),
                *(*params.add(1)).cast::<u32>(),
                *(*params.add(2)).cast::<u64>(),
            )
        };
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        Self::submit(&st, Op::Gather { pieces, n, dst })
    }
}
