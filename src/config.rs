//! [`Config`]: every setting of the runtime, with documented defaults, set in code or
//! (opt-in, strictly) from `PINLANE_*` environment variables.

use crate::error::{Error, Result};
use std::time::Duration;

/// How the host copy threads write a destination.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum CopyStores {
    /// What measured fastest for that copy (docs/performance.md): ordinary stores for
    /// filling staging slots, non-temporal stores for draining them.
    #[default]
    Auto,
    /// Ordinary stores (plain `memcpy`).
    Cached,
    /// Non-temporal stores for copies of 256 bytes or more (x86-64; elsewhere ordinary).
    Streaming,
}

/// How D2H moves many small tensors (up to 1 MiB each, at least 4 of them).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SmallD2h {
    /// A kernel gathers them into one device buffer, which moves in one copy (default).
    #[default]
    Gather,
    /// One `cuMemcpyBatchAsync` (CUDA 12.8+, page-locked outputs only; an experiment).
    Batch,
    /// One copy each.
    Each,
}

/// How H2D moves many small page-locked tensors (under 4 MiB each, at least 4 of them, in
/// memory pinlane page-locked: `to_pinned`, [`PinnedBufferMut`](crate::memory::PinnedBufferMut),
/// D2H outputs, `register_pinned`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum SmallH2d {
    /// A kernel reads them straight from host memory, through the device's mapping of
    /// page-locked memory, into the batch's device buffer: one launch, no host copy
    /// (default; on a device without that mapping, as `Copy`).
    #[default]
    Kernel,
    /// Copies: those under 64 KiB (256 KiB without `cuMemcpyBatchAsync`) are staged like
    /// pageable memory, the others copied directly.
    Copy,
}

/// Settings of the [`Runtime`](crate::runtime::Runtime): sizes of the page-locked staging arena
/// and output pools, the copy threads, device pool release, and the bounds on waits.
///
/// Build one with [`Config::new`] (the defaults below) and the setters, then
/// [`Config::install`] it before the first transfer. Without that, the first transfer
/// installs `Config::new()`; the environment is read only by [`Config::from_env`].
///
/// | field | default | environment variable ([`Config::from_env`]) | changeable at run time |
/// | --- | --- | --- | --- |
/// | [`slot_bytes`](Config::slot_bytes) | 8 MiB | `PINLANE_SLOT_BYTES` | no |
/// | [`arena_bytes`](Config::arena_bytes) | 128 MiB | `PINLANE_ARENA_BYTES` | [`Runtime::set_arena_bytes`](crate::runtime::Runtime::set_arena_bytes) |
/// | [`pinned_output_bytes`](Config::pinned_output_bytes) | 2 GiB | `PINLANE_PINNED_OUTPUT_BYTES` | [`Runtime::set_pinned_output_bytes`](crate::runtime::Runtime::set_pinned_output_bytes) |
/// | [`host_pool_bytes`](Config::host_pool_bytes) | 2 GiB | `PINLANE_HOST_POOL_BYTES` | [`Runtime::set_host_pool_bytes`](crate::runtime::Runtime::set_host_pool_bytes) |
/// | [`device_pool_release_bytes`](Config::device_pool_release_bytes) | `u64::MAX` (keep all) | `PINLANE_DEVICE_POOL_RELEASE_BYTES` | [`Runtime::set_device_pool_release_bytes`](crate::runtime::Runtime::set_device_pool_release_bytes) |
/// | [`small_device_blocks`](Config::small_device_blocks) | 8 | `PINLANE_SMALL_DEVICE_BLOCKS` | no |
/// | [`copy_threads`](Config::copy_threads) | 3/4 of the cores, at most 12 (1 to 1024) | `PINLANE_COPY_THREADS` | no |
/// | [`parallel_min`](Config::parallel_min) | 256 KiB | `PINLANE_PARALLEL_MIN` | no |
/// | [`spin`](Config::spin) | 50 µs (at most 1 s) | `PINLANE_SPIN_US` | no |
/// | [`fill_stores`](Config::fill_stores) | `auto` | `PINLANE_FILL_STORES` (`auto`, `cached`, `streaming`) | no |
/// | [`drain_stores`](Config::drain_stores) | `auto` | `PINLANE_DRAIN_STORES` | no |
/// | [`streaming_stores`](Config::streaming_stores) | `true` | `PINLANE_NT_COPY` (`0` or `1`) | no |
/// | [`pipeline_slots`](Config::pipeline_slots) | 8 | `PINLANE_PIPELINE_SLOTS` | no |
/// | [`small_d2h`](Config::small_d2h) | `gather` | `PINLANE_D2H_SMALL` (`gather`, `batch`, `each`) | no |
/// | [`small_h2d`](Config::small_h2d) | `kernel` | `PINLANE_H2D_SMALL` (`kernel`, `copy`) | no |
/// | [`slot_wait`](Config::slot_wait) | 60 s (at least 1 ms) | `PINLANE_SLOT_WAIT_MS` | no |
/// | [`drop_sync_wait`](Config::drop_sync_wait) | 60 s (0, or at least 1 ms) | `PINLANE_DROP_SYNC_WAIT_MS` | no |
/// | [`sync_wait`](Config::sync_wait) | none (a limit: at least 1 ms) | `PINLANE_SYNC_WAIT_MS` | no |
///
/// ```
/// use pinlane::Config;
/// let cfg = Config::new().arena_bytes(64 << 20).copy_threads(4);
/// assert_eq!(cfg.arena_bytes, 64 << 20);
/// assert_eq!(cfg.slot_bytes, 8 << 20); // a default
/// assert!(cfg.validate().is_ok());
/// assert!(Config::new().slot_bytes(0).validate().is_err());
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Config {
    /// Bytes per page-locked staging slot: large enough for the link's full rate, small
    /// enough that the first copy starts soon. At least 4096.
    pub slot_bytes: usize,
    /// Most page-locked bytes the staging arena holds, all slots together; rounded down
    /// to whole slots, and at least one slot.
    pub arena_bytes: usize,
    /// Most page-locked bytes the D2H output pool holds; a batch that does not fit gets
    /// pageable outputs instead (counted in [`MemoryStats`](crate::runtime::MemoryStats)),
    /// or free blocks are freed to make room for it. Such a free waits for the device's
    /// queued work and holds every thread's copies meanwhile (docs/semantics.md): a cap
    /// above the program's working set of outputs avoids it.
    pub pinned_output_bytes: usize,
    /// Most bytes of recycled pageable D2H output memory kept for reuse.
    pub host_pool_bytes: usize,
    /// Device memory each device pool keeps cached after a synchronisation; more is given
    /// back to the driver. The default, `u64::MAX`, keeps everything until
    /// [`trim`](crate::trim) is called; a lower value gives memory back by itself, and
    /// large batches then map their device memory anew after synchronisations. Whatever
    /// the value, the memory the pool keeps serves an H2D batch that finds the device
    /// otherwise out of memory: the driver gives it to the allocation, with no step from
    /// pinlane (docs/semantics.md, H2D item 6).
    pub device_pool_release_bytes: u64,
    /// Device blocks of small H2D outputs (at most 1 MiB, in power-of-two size classes of
    /// 512 B to 1 MiB; above 64 KiB only outputs that fill at least 7/8 of their class,
    /// such as a batch of 1000 x 1 KiB) kept per size class and device when their last view
    /// drops, instead of
    /// freed, for the next small outputs: their allocation then skips the driver pool's
    /// check of memory freed on another stream (the outputs' consumer stream), which took
    /// 0.7 to 3 us a call (docs/performance-log.md, session 69). A block is reused only once
    /// an event recorded on its consumer stream when it was given back has completed.
    /// Kept for any consumer stream other than the copy stream; for a borrowed one (a
    /// `torch.cuda.Stream`, say) only where the driver has `cuStreamGetId` (CUDA 12.0+).
    /// Kept blocks count as used in [`DevicePoolStats`](crate::runtime::DevicePoolStats)
    /// until [`trim`](crate::trim) frees them; at most 8 x (2 MiB - 512 B), about 16 MiB, per
    /// device with the default. An output that may be kept takes its class's whole block
    /// while it lives: up to twice its size at 64 KiB or less, at most 8/7 of it above
    /// (a 600 KB output is not kept, and takes 600 KB). An H2D batch that finds the device
    /// out of memory frees its device's kept blocks (waiting up to
    /// [`slot_wait`](Config::slot_wait) for their consumer streams to run the frees) and is
    /// tried once more, unless no room could come of it (docs/semantics.md, H2D item 6).
    /// 0 keeps none.
    pub small_device_blocks: usize,
    /// Threads that copy pageable memory (the calling thread included); `None`: three
    /// quarters of the machine's parallelism, at most 12 (fastest on the GPU machine).
    pub copy_threads: Option<usize>,
    /// Host copy jobs below this many bytes run on the calling thread alone.
    pub parallel_min: usize,
    /// How long an idle copy thread spins for new work before sleeping, how long a
    /// thread waiting for the copy threads' last pieces of its job spins before sleeping,
    /// how long a blocking D2H call into page-locked outputs spins on its end flag (a
    /// word of page-locked memory its stream sets after the copies) before it waits in
    /// the driver, and how long a non-blocking call's
    /// [`Transfer::wait`](crate::Transfer::wait) asks the call's event before it sleeps.
    /// Zero turns end flags off (a wait then asks once). At most [`Config::MAX_SPIN`]: a
    /// spin is a wait, and every wait is bounded (a stream that failed before its end flag
    /// never sets it).
    pub spin: Duration,
    /// Stores used to fill staging slots (H2D).
    pub fill_stores: CopyStores,
    /// Stores used to drain staging slots into outputs (D2H).
    pub drain_stores: CopyStores,
    /// Whether non-temporal stores may be used at all (`false` turns them off everywhere).
    pub streaming_stores: bool,
    /// Staging slots one call cycles through at most (at least 1).
    pub pipeline_slots: usize,
    /// How D2H moves many small tensors.
    pub small_d2h: SmallD2h,
    /// How H2D moves many small page-locked tensors.
    pub small_h2d: SmallH2d,
    /// Longest a call waits for a staging slot while every slot is leased, or for the
    /// device to finish one of its own slots' copies so that it can fill the slot again
    /// (the H2D pipeline, which polls backing off; host fills do not count); then it
    /// fails with [`Error::StagingExhausted`] instead of waiting forever (the copies it
    /// queued are drained first). At least 1 ms: with none, a call whose pipeline found
    /// the device a moment behind would fail at once.
    pub slot_wait: Duration,
    /// Longest a `Drop` waits: for copies it must see finished (an unfinished call's
    /// stream; past it the buffers are retained, never freed early), or for a
    /// [`Prefetcher`](crate::engine::Prefetcher)'s worker to exit (past it the worker is left to
    /// exit on its own). Then the drop returns. 0 (never wait: retain at once), or at
    /// least 1 ms (kept in whole milliseconds: less would read as 0).
    pub drop_sync_wait: Duration,
    /// Longest a blocking call waits for the device to finish its copies (and the work
    /// they wait for: a D2H waits for the caller's current stream), at its end or while
    /// draining after a failure; then it fails with [`Error::SyncTimeout`], and what the
    /// copies use is held in the retained registry until they finish (never freed early).
    /// `None` (the default): the call waits in `cuStreamSynchronize` for as long as it
    /// takes. With a limit the wait is polled (an event query, yielding, then naps of at
    /// most 1 ms), which may end a few microseconds later than the driver's own wait.
    /// With a limit, page-locked frees the caller causes directly (the last drop of a
    /// [`Tensor::to_pinned`](crate::tensor::Tensor::to_pinned) buffer, `trim()`, lowering a
    /// cap) go to pinlane's free thread too, since `cuMemFreeHost` waits for the device.
    /// A limit is at least 1 ms (kept in whole milliseconds).
    pub sync_wait: Option<Duration>,
}

impl Default for Config {
    fn default() -> Self {
        Config::new()
    }
}

impl Config {
    /// The defaults (see the table above). Reads no environment variable.
    pub fn new() -> Config {
        Config {
            slot_bytes: 8 << 20,
            arena_bytes: 128 << 20,
            pinned_output_bytes: 2 << 30,
            host_pool_bytes: 2 << 30,
            device_pool_release_bytes: u64::MAX,
            small_device_blocks: 8,
            copy_threads: None,
            parallel_min: 256 << 10,
            spin: Duration::from_micros(50),
            fill_stores: CopyStores::Auto,
            drain_stores: CopyStores::Auto,
            streaming_stores: true,
            pipeline_slots: 8,
            small_d2h: SmallD2h::Gather,
            small_h2d: SmallH2d::Kernel,
            slot_wait: Duration::from_secs(60),
            drop_sync_wait: Duration::from_secs(60),
            sync_wait: None,
        }
    }

    /// [`Config::new`] with every `PINLANE_*` variable of the table above that is set
    /// applied. Strict: a value that does not parse, or is out of range, is an
    /// [`Error::InvalidConfig`] naming the variable and the value, never ignored.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for the first bad variable.
    ///
    /// ```
    /// // No PINLANE_* variable is set in the doctest's environment.
    /// assert_eq!(pinlane::Config::from_env().unwrap(), pinlane::Config::new());
    /// ```
    pub fn from_env() -> Result<Config> {
        Config::from_vars(|name| std::env::var(name).ok())
    }

    /// [`Config::from_env`] over any variable source (tests, or a config file mapped to
    /// the same names).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] for the first bad variable.
    ///
    /// ```
    /// use pinlane::{Config, Error};
    /// let vars = |name: &str| (name == "PINLANE_ARENA_BYTES").then(|| "64M".to_string());
    /// assert!(matches!(Config::from_vars(vars), Err(Error::InvalidConfig { .. })));
    /// ```
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Config> {
        let mut c = Config::new();
        let get = |name: &'static str| var(name).map(|v| (name, v));
        if let Some((n, v)) = get("PINLANE_SLOT_BYTES") {
            c.slot_bytes = parse(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_ARENA_BYTES") {
            c.arena_bytes = parse(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_PINNED_OUTPUT_BYTES") {
            c.pinned_output_bytes = parse(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_HOST_POOL_BYTES") {
            c.host_pool_bytes = parse(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_DEVICE_POOL_RELEASE_BYTES") {
            c.device_pool_release_bytes = parse(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_SMALL_DEVICE_BLOCKS") {
            c.small_device_blocks = parse(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_COPY_THREADS") {
            c.copy_threads = Some(parse(n, &v)?);
        }
        if let Some((n, v)) = get("PINLANE_PARALLEL_MIN") {
            c.parallel_min = parse(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_SPIN_US") {
            c.spin = Duration::from_micros(parse(n, &v)?);
        }
        if let Some((n, v)) = get("PINLANE_FILL_STORES") {
            c.fill_stores = parse_stores(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_DRAIN_STORES") {
            c.drain_stores = parse_stores(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_NT_COPY") {
            c.streaming_stores = match v.trim() {
                "0" => false,
                "1" => true,
                _ => return Err(invalid(n, &v, "expected 0 or 1")),
            };
        }
        if let Some((n, v)) = get("PINLANE_PIPELINE_SLOTS") {
            c.pipeline_slots = parse(n, &v)?;
        }
        if let Some((n, v)) = get("PINLANE_D2H_SMALL") {
            c.small_d2h = match v.trim() {
                "gather" => SmallD2h::Gather,
                "batch" => SmallD2h::Batch,
                "each" => SmallD2h::Each,
                _ => return Err(invalid(n, &v, "expected gather, batch or each")),
            };
        }
        if let Some((n, v)) = get("PINLANE_H2D_SMALL") {
            c.small_h2d = match v.trim() {
                "kernel" => SmallH2d::Kernel,
                "copy" => SmallH2d::Copy,
                _ => return Err(invalid(n, &v, "expected kernel or copy")),
            };
        }
        if let Some((n, v)) = get("PINLANE_SLOT_WAIT_MS") {
            c.slot_wait = Duration::from_millis(parse(n, &v)?);
        }
        if let Some((n, v)) = get("PINLANE_DROP_SYNC_WAIT_MS") {
            c.drop_sync_wait = Duration::from_millis(parse(n, &v)?);
        }
        if let Some((n, v)) = get("PINLANE_SYNC_WAIT_MS") {
            c.sync_wait = Some(Duration::from_millis(parse(n, &v)?));
        }
        c.validate().map_err(|e| match e {
            Error::InvalidOption { name, reason } => {
                // The variables of durations carry their unit.
                let variable = match name {
                    "sync_wait" => "PINLANE_SYNC_WAIT_MS".to_string(),
                    "slot_wait" => "PINLANE_SLOT_WAIT_MS".to_string(),
                    "drop_sync_wait" => "PINLANE_DROP_SYNC_WAIT_MS".to_string(),
                    "spin" => "PINLANE_SPIN_US".to_string(),
                    _ => format!("PINLANE_{}", name.to_uppercase()),
                };
                let value = var(&variable).unwrap_or_default();
                Error::InvalidConfig {
                    variable,
                    value,
                    reason,
                }
            }
            e => e,
        })?;
        Ok(c)
    }

    /// Checks every value's range.
    ///
    /// # Errors
    /// [`Error::InvalidOption`] naming the first field out of range.
    pub fn validate(&self) -> Result<()> {
        let bad = |name: &'static str, reason: &str| {
            Err(Error::InvalidOption {
                name,
                reason: reason.into(),
            })
        };
        if self.slot_bytes < 4096 {
            return bad("slot_bytes", "must be at least 4096");
        }
        if self.pipeline_slots == 0 {
            return bad("pipeline_slots", "must be at least 1");
        }
        match self.copy_threads {
            Some(0) => return bad("copy_threads", "must be at least 1"),
            Some(n) if n > Config::MAX_COPY_THREADS => {
                let most = format!("must be at most {}", Config::MAX_COPY_THREADS);
                return bad("copy_threads", &most);
            }
            _ => {}
        }
        // The wait bounds are kept in whole milliseconds (`memory::waits`): less than one
        // would read as 0, and a call bounded by 0 fails at once.
        const MS: Duration = Duration::from_millis(1);
        if self.sync_wait.is_some_and(|d| d < MS) {
            return bad("sync_wait", "must be at least 1 ms (or none)");
        }
        if self.slot_wait < MS {
            return bad("slot_wait", "must be at least 1 ms");
        }
        if self.drop_sync_wait > Duration::ZERO && self.drop_sync_wait < MS {
            return bad("drop_sync_wait", "must be 0 or at least 1 ms");
        }
        if self.spin > Config::MAX_SPIN {
            return bad("spin", "must be at most 1 s (1000000 us)");
        }
        Ok(())
    }

    /// The longest [`Config::spin`] allowed: 1 s, 20,000 times the default. A longer spin
    /// would keep a core busy as long on every idle copy thread, and a blocking D2H whose
    /// stream failed before its end flag spins it out before it asks the driver.
    pub const MAX_SPIN: Duration = Duration::from_secs(1);

    /// The most [`Config::copy_threads`] allowed: each is a thread that spins for
    /// [`Config::spin`] when idle, and more than the machine has cores copy no faster
    /// (docs/performance.md, "Design choices"); a typo of many thousands would use up
    /// the process's threads.
    pub const MAX_COPY_THREADS: usize = 1024;

    // `Config::install` lives in runtime.rs, with the runtime it makes: this module only
    // describes settings.
}

macro_rules! setters {
    ($($(#[$doc:meta])* $name:ident: $ty:ty;)*) => {
        impl Config {$(
            $(#[$doc])*
            pub fn $name(mut self, v: $ty) -> Config {
                self.$name = v;
                self
            }
        )*}
    };
}

setters! {
    /// Sets [`Config::slot_bytes`].
    slot_bytes: usize;
    /// Sets [`Config::arena_bytes`].
    arena_bytes: usize;
    /// Sets [`Config::pinned_output_bytes`].
    pinned_output_bytes: usize;
    /// Sets [`Config::host_pool_bytes`].
    host_pool_bytes: usize;
    /// Sets [`Config::device_pool_release_bytes`].
    device_pool_release_bytes: u64;
    /// Sets [`Config::small_device_blocks`].
    small_device_blocks: usize;
    /// Sets [`Config::parallel_min`].
    parallel_min: usize;
    /// Sets [`Config::spin`].
    spin: Duration;
    /// Sets [`Config::fill_stores`].
    fill_stores: CopyStores;
    /// Sets [`Config::drain_stores`].
    drain_stores: CopyStores;
    /// Sets [`Config::streaming_stores`].
    streaming_stores: bool;
    /// Sets [`Config::pipeline_slots`].
    pipeline_slots: usize;
    /// Sets [`Config::small_d2h`].
    small_d2h: SmallD2h;
    /// Sets [`Config::small_h2d`].
    small_h2d: SmallH2d;
    /// Sets [`Config::slot_wait`].
    slot_wait: Duration;
    /// Sets [`Config::drop_sync_wait`].
    drop_sync_wait: Duration;
    /// Sets [`Config::sync_wait`].
    sync_wait: Option<Duration>;
}

impl Config {
    /// Sets [`Config::copy_threads`].
    pub fn copy_threads(mut self, n: usize) -> Config {
        self.copy_threads = Some(n);
        self
    }

    /// The copy threads in force: [`Config::copy_threads`] or the default.
    pub(crate) fn resolved_copy_threads(&self) -> usize {
        self.copy_threads.unwrap_or_else(|| {
            // Three quarters of the cores, at most 12: on the 16-core GPU machine 12
            // threads copied fastest (docs/performance.md); more compete for bandwidth.
            std::thread::available_parallelism().map_or(4, |n| (n.get() * 3 / 4).clamp(1, 12))
        })
    }
}

fn invalid(name: &str, value: &str, reason: &str) -> Error {
    Error::InvalidConfig {
        variable: name.into(),
        value: value.into(),
        reason: reason.into(),
    }
}

fn parse<T: std::str::FromStr>(name: &str, value: &str) -> Result<T>
where
    T::Err: std::fmt::Display,
{
    value
        .trim()
        .parse()
        .map_err(|e: T::Err| invalid(name, value, &e.to_string()))
}

/// A store choice (surrounding whitespace ignored, as for the numbers).
fn parse_stores(name: &str, value: &str) -> Result<CopyStores> {
    match value.trim() {
        "auto" => Ok(CopyStores::Auto),
        "cached" => Ok(CopyStores::Cached),
        "streaming" => Ok(CopyStores::Streaming),
        _ => Err(invalid(name, value, "expected auto, cached or streaming")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vars<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |n| pairs.iter().find(|p| p.0 == n).map(|p| p.1.to_string())
    }

    #[test]
    fn every_variable_is_read() {
        let c = Config::from_vars(vars(&[
            ("PINLANE_SLOT_BYTES", "65536"),
            ("PINLANE_ARENA_BYTES", "1048576"),
            ("PINLANE_PINNED_OUTPUT_BYTES", "7"),
            ("PINLANE_HOST_POOL_BYTES", "8"),
            ("PINLANE_DEVICE_POOL_RELEASE_BYTES", "9"),
            ("PINLANE_SMALL_DEVICE_BLOCKS", "5"),
            ("PINLANE_COPY_THREADS", "3"),
            ("PINLANE_PARALLEL_MIN", "10"),
            ("PINLANE_SPIN_US", "11"),
            // The choices' surrounding whitespace is ignored, as the numbers' is
            // (session 79: "0 " was an error for the choices alone).
            ("PINLANE_FILL_STORES", " cached"),
            ("PINLANE_DRAIN_STORES", "streaming\n"),
            ("PINLANE_NT_COPY", "0 "),
            ("PINLANE_PIPELINE_SLOTS", " 2"),
            ("PINLANE_D2H_SMALL", "each "),
            ("PINLANE_H2D_SMALL", "\tcopy"),
            ("PINLANE_SLOT_WAIT_MS", "12"),
            ("PINLANE_DROP_SYNC_WAIT_MS", "13"),
            ("PINLANE_SYNC_WAIT_MS", "14"),
        ]))
        .unwrap();
        let want = Config::new()
            .slot_bytes(65536)
            .arena_bytes(1 << 20)
            .pinned_output_bytes(7)
            .host_pool_bytes(8)
            .device_pool_release_bytes(9)
            .small_device_blocks(5)
            .copy_threads(3)
            .parallel_min(10)
            .spin(Duration::from_micros(11))
            .fill_stores(CopyStores::Cached)
            .drain_stores(CopyStores::Streaming)
            .streaming_stores(false)
            .pipeline_slots(2)
            .small_d2h(SmallD2h::Each)
            .small_h2d(SmallH2d::Copy)
            .slot_wait(Duration::from_millis(12))
            .drop_sync_wait(Duration::from_millis(13))
            .sync_wait(Some(Duration::from_millis(14)));
        assert_eq!(c, want);
    }

    #[test]
    fn bad_values_name_the_variable_and_value() {
        for (name, value) in [
            ("PINLANE_ARENA_BYTES", "64M"),
            ("PINLANE_COPY_THREADS", "-1"),
            ("PINLANE_NT_COPY", "yes"),
            ("PINLANE_FILL_STORES", "fast"),
            ("PINLANE_D2H_SMALL", ""),
            ("PINLANE_H2D_SMALL", "gather"),
            ("PINLANE_SPIN_US", "1.5"),
            ("PINLANE_SYNC_WAIT_MS", "soon"),
            ("PINLANE_SYNC_WAIT_MS", "0"), // parses, but no call could finish in 0 ms
            ("PINLANE_SPIN_US", "1000001"), // a spin is a wait: bounded (session 64)
            // Session 78: a slot wait of 0 failed every pipelined H2D at once; a typo of
            // many threads would use up the process's.
            ("PINLANE_SLOT_WAIT_MS", "0"),
            ("PINLANE_COPY_THREADS", "100000"),
        ] {
            match Config::from_vars(vars(&[(name, value)])) {
                Err(Error::InvalidConfig {
                    variable, value: v, ..
                }) => {
                    assert_eq!((variable.as_str(), v.as_str()), (name, value));
                }
                other => panic!("{name}={value}: {other:?}"),
            }
        }
        // In range per variable, out of range as a whole: still an error.
        assert!(matches!(
            Config::from_vars(vars(&[("PINLANE_SLOT_BYTES", "16")])),
            Err(Error::InvalidConfig { .. })
        ));
        assert!(matches!(
            Config::from_vars(vars(&[("PINLANE_COPY_THREADS", "0")])),
            Err(Error::InvalidConfig { .. })
        ));
        // The longest spin is allowed; one longer is refused by the builder's check too.
        assert!(Config::new().spin(Config::MAX_SPIN).validate().is_ok());
        assert!(matches!(
            Config::new().spin(Duration::MAX).validate(),
            Err(Error::InvalidOption { name: "spin", .. })
        ));
        // The wait bounds are whole milliseconds: less than one would read as 0 (session
        // 78: a 500 us sync wait became 0, and nearly every call timed out).
        let us500 = Duration::from_micros(500);
        for (c, name) in [
            (Config::new().sync_wait(Some(us500)), "sync_wait"),
            (Config::new().slot_wait(us500), "slot_wait"),
            (Config::new().slot_wait(Duration::ZERO), "slot_wait"),
            (Config::new().drop_sync_wait(us500), "drop_sync_wait"),
            (
                Config::new().copy_threads(Config::MAX_COPY_THREADS + 1),
                "copy_threads",
            ),
        ] {
            match c.validate() {
                Err(Error::InvalidOption { name: n, .. }) => assert_eq!(n, name),
                other => panic!("{name}: {other:?}"),
            }
        }
        let ms = Duration::from_millis(1);
        let fine = Config::new()
            .sync_wait(Some(ms))
            .slot_wait(ms)
            .drop_sync_wait(Duration::ZERO)
            .copy_threads(Config::MAX_COPY_THREADS);
        assert!(fine.validate().is_ok());
    }
}
