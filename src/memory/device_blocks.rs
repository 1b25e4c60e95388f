//! [`DeviceBlocks`]: small device blocks that H2D outputs gave back, kept for the next
//! outputs instead of freed.
//!
//! An H2D output is allocated on the copy stream and freed in order on its consumer
//! stream (by default the legacy stream). Before the driver's pool reuses a block freed
//! on another stream, it checks that the free has passed; that check took 0.7 to 1.8 us a
//! call, and 2.0 to 3.0 us once the process had launched a kernel (every torch program),
//! against 0.4 to 0.7 for a block freed on the allocating stream (docs/performance-log.md,
//! session 69). A small output's block is kept here instead, with an event recorded on
//! its consumer stream where it was given back; a block is handed out again once that
//! event is proven complete. The proof is shared: a stream runs its work in order, so an
//! event seen complete proves every block given back before it on the same stream.
//!
//! Only outputs of at most [`MAX_BYTES`] (above 64 KiB, only those that fill at least 7/8
//! of their class's block: [`class_of`]) whose consumer stream is not their copy stream
//! are kept. The proof needs a stream whose identity cannot change: pinlane's own streams
//! and a device's legacy stream are told apart by their handles; a borrowed stream (a
//! `torch.cuda.Stream`, say) by the driver's id for it (`cuStreamGetId`, CUDA 12.0+),
//! since its handle may be destroyed and come back for another stream. Without the id,
//! a borrowed stream's outputs are not kept. [`DeviceBlocks::release`] frees a block in
//! order on its stream when that is pinlane's own or the legacy stream, which outlive it;
//! a borrowed one may be gone by then, so its blocks are freed on the legacy stream, made
//! to wait for their events.
//!
//! A class is asked only once it holds [`DEPTH`] blocks, through its block `DEPTH` from
//! the front (given back long enough ago to be done unless the consumer stream is that far
//! behind): one query for `DEPTH` calls. When neither that block nor the front one is
//! done, the class is not asked again for its next `DEPTH` takes, so a consumer stream
//! that runs behind costs at most two queries per `DEPTH` calls on top of the pool's
//! allocation. The lock is held across these driver calls (and the event's record when a
//! block is given back): each is a fraction of a microsecond to two.

use super::DEVICE_ALIGN;
use crate::driver::{self, ContextGuard, DevicePtr, Event, Stream};
use crate::error::Result;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

/// Largest output kept, in bytes: a batch of 1000 x 1 KiB (1,024,000 bytes) fits the
/// largest class (docs/performance-log.md, session 73).
pub(crate) const MAX_BYTES: usize = 1 << 20;

/// Outputs up to this size are kept whatever their size; larger ones only where they fill
/// at least 7/8 of their class's block, so that a live output above it never takes more
/// than 1/7 more device memory than it needs (a 600 KB output is allocated as it is,
/// not as a 1 MiB block).
const ANY_FILL_MAX: usize = 64 << 10;

/// Size classes: blocks of `MIN_BLOCK << k` bytes, up to [`MAX_BYTES`].
const MIN_BLOCK: usize = 512;
const CLASSES: usize = (MAX_BYTES / MIN_BLOCK).trailing_zeros() as usize + 1;

/// Blocks a class holds before it is asked (a query costs 0.2 to 1.9 us; one proves the
/// first `DEPTH` blocks of a stream).
const DEPTH: usize = 4;

const _: () =
    assert!(MIN_BLOCK.is_multiple_of(DEVICE_ALIGN) && MIN_BLOCK << (CLASSES - 1) == MAX_BYTES);

/// The class of an output of `nbytes` (> 0), and its block's size; `None` above
/// [`MAX_BYTES`], and above [`ANY_FILL_MAX`] where `nbytes` fills less than 7/8 of the
/// block.
pub(crate) fn class_of(nbytes: usize) -> Option<(usize, usize)> {
    if nbytes == 0 || nbytes > MAX_BYTES {
        return None;
    }
    let block = nbytes.next_power_of_two().max(MIN_BLOCK);
    if nbytes > ANY_FILL_MAX && nbytes < block - block / 8 {
        return None;
    }
    Some(((block / MIN_BLOCK).trailing_zeros() as usize, block))
}

/// The size of `class`'s blocks.
pub(crate) fn block_bytes(class: usize) -> usize {
    MIN_BLOCK << class
}

/// A consumer stream as the shared proof tells streams apart (within one device).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum StreamKey {
    /// pinlane's own stream or the legacy stream: its handle, which no other stream takes
    /// while pinlane holds it (its own) or ever (the legacy one).
    Handle(usize),
    /// A borrowed stream: the driver's id for it, unique for the process's life.
    Id(u64),
}

/// How outputs freed on `free_on`, allocated on `stream`, are told apart when kept;
/// `None` when they may not be kept (freed on the stream that allocated them, which needs
/// no proof, or a borrowed stream the driver gives no id for).
pub(crate) fn keeps_for(stream: &Stream, free_on: &Stream) -> Option<StreamKey> {
    if free_on.same_as(stream) {
        return None;
    }
    if free_on.is_owned() || free_on.is_legacy() {
        return Some(StreamKey::Handle(free_on.raw() as usize));
    }
    driver::stream_id::unique_id(free_on).map(StreamKey::Id)
}

/// The kept blocks of every device: at most `per_class` blocks per size class and device.
pub(crate) struct DeviceBlocks {
    per_class: usize,
    /// Indexed by device ordinal.
    devices: Mutex<Vec<Bins>>,
    /// Set by [`DeviceBlocks::close`] (the runtime's shutdown): blocks given back later are
    /// freed, not kept (no one would free them).
    closed: AtomicBool,
    /// Taken by an out-of-memory retry while it makes room (see [`DeviceBlocks::room_turn`]).
    room: Mutex<()>,
    /// Rounds of room made: kept blocks freed and their frees waited for.
    rooms_made: AtomicU64,
}

#[derive(Default)]
struct Bins {
    /// Per class, in the order the blocks were given back (and their events recorded:
    /// both under the lock).
    classes: [VecDeque<Given>; CLASSES],
    /// Events of blocks handed out again, for the next blocks given back.
    spare: Vec<Event>,
    /// Per class: takes so far, and the take from which the class is asked again (after
    /// an ask that found no block done).
    takes: [u64; CLASSES],
    ask_from: [u64; CLASSES],
}

/// A block given back: reusable once `done` (recorded on its consumer stream, `on`, when
/// it was given back, after everything that could use it) has completed.
struct Given {
    ptr: DevicePtr,
    on: Consumer,
    done: Event,
    proven: bool,
}

/// A kept block's consumer stream.
enum Consumer {
    /// pinlane's own or the legacy stream, held to free the block on.
    Own(Stream),
    /// A borrowed stream, by the driver's id: not held, as it may be destroyed before the
    /// block is freed.
    Borrowed(u64),
}

impl Consumer {
    fn key(&self) -> StreamKey {
        match self {
            Consumer::Own(s) => StreamKey::Handle(s.raw() as usize),
            Consumer::Borrowed(id) => StreamKey::Id(*id),
        }
    }
}

impl DeviceBlocks {
    /// Keeps at most `per_class` blocks per size class and device; 0 keeps none.
    pub(crate) fn new(per_class: usize) -> DeviceBlocks {
        DeviceBlocks {
            per_class,
            devices: Mutex::new(Vec::new()),
            closed: AtomicBool::new(false),
            room: Mutex::new(()),
            rooms_made: AtomicU64::new(0),
        }
    }

    /// Whether blocks are kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.per_class > 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Bins>> {
        self.devices.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kept block of `class` on `device` whose last uses are proven complete, if there
    /// is one: usable now on any stream. Asks the driver at most twice, only when the
    /// class holds [`DEPTH`] blocks or more (all of them, if fewer may be kept), and not
    /// again soon after an ask that found none done.
    pub(crate) fn take(&self, device: usize, class: usize) -> Option<DevicePtr> {
        let depth = DEPTH.min(self.per_class).max(1);
        let mut devices = self.lock();
        let bins = devices.get_mut(device)?;
        let take = *bins.takes.get(class)?;
        bins.takes[class] += 1;
        let queue = bins.classes.get_mut(class)?;
        let front = queue.front()?;
        if !front.proven && queue.len() >= depth && take >= bins.ask_from[class] {
            // The block `depth` from the front: complete, its event proves every block
            // given back before it on its stream (the stream ran that work first), which
            // are the ones ahead of it in the queue on that stream.
            let probe = &queue[depth - 1];
            if probe.done.completed() == Ok(true) {
                let key = probe.on.key();
                for g in queue.iter_mut().take(depth) {
                    if g.on.key() == key {
                        g.proven = true;
                    }
                }
            }
            // The front one may be on another stream: its own event.
            if let Some(front) = queue.front_mut() {
                if !front.proven && front.done.completed() == Ok(true) {
                    front.proven = true;
                }
            }
            if !queue.front()?.proven {
                bins.ask_from[class] = take + depth as u64;
            }
        }
        if !queue.front()?.proven {
            return None;
        }
        let g = queue.pop_front()?;
        bins.spare.push(g.done);
        Some(g.ptr)
    }

    /// Keeps `ptr`, a block of `class` from pinlane's pool on `device` (`ctx`'s), for
    /// reuse once the work queued on `stream` so far has run: records an event there.
    /// `key` is `stream`'s, from [`keeps_for`]. `false` when it is not kept (the class is
    /// full, nothing is kept, the stream is capturing, or the event could not be made or
    /// recorded): the caller frees it, as any block not kept. A failed event is no error
    /// of anyone's: keeping is an optimisation, and the free is what the block gets
    /// without it.
    pub(crate) fn give_back(
        &self,
        ctx: &ContextGuard,
        class: usize,
        ptr: DevicePtr,
        stream: &Stream,
        key: StreamKey,
    ) -> bool {
        let device = ctx.device();
        if self.per_class == 0 || class >= CLASSES {
            return false;
        }
        let mut devices = self.lock();
        // Asked under the lock that `release` drains under: a block given back while the
        // runtime closes is either drained by it or freed by the caller, never left kept.
        if self.closed.load(Ordering::Acquire) {
            return false;
        }
        if devices.len() <= device {
            devices.resize_with(device + 1, Bins::default);
        }
        let bins = &mut devices[device];
        if bins.classes[class].len() >= self.per_class {
            return false;
        }
        // A stream capturing a CUDA graph (a borrowed one, or one of pinlane's that the
        // caller captures through its raw handle) would take the event's record into the
        // graph, where it proves nothing of the work queued before: not kept (freed as
        // before, on the stream). No driver call for the legacy stream, which cannot be
        // captured.
        if stream.refuse_capturing("keeping a device block").is_err() {
            return false;
        }
        let done = match bins.spare.pop() {
            Some(e) => e,
            None => match Event::new(crate::device::Device::cuda(device)) {
                Ok(e) => e,
                Err(_) => return false,
            },
        };
        // A failed record leaves the event unknown: it is dropped, not kept as a spare.
        if done
            .record_as(stream, driver::FaultKindTag::KeepBlock)
            .is_err()
        {
            return false;
        }
        let on = match key {
            StreamKey::Handle(_) => Consumer::Own(stream.clone()),
            StreamKey::Id(id) => Consumer::Borrowed(id),
        };
        bins.classes[class].push_back(Given {
            ptr,
            on,
            done,
            proven: false,
        });
        true
    }

    /// Frees what is kept and keeps nothing given back from now on: the runtime's
    /// shutdown (outputs dropped after it free their blocks as before).
    ///
    /// # Errors
    /// As [`DeviceBlocks::release`], named `shutdown`.
    pub(crate) fn close(&self) -> Result<()> {
        self.closed.store(true, Ordering::Release);
        self.release("shutdown")
    }

    /// Frees every kept block, each in order on the stream it was given back on (after
    /// its last uses), or, for a borrowed stream, on the legacy stream once its event has
    /// passed; for [`trim`](crate::trim) and shutdown. The memory goes back to the device
    /// pool once those frees have run on their streams.
    ///
    /// # Errors
    /// [`Error::ForkedChild`](crate::Error::ForkedChild) naming `op` in a child process
    /// forked after CUDA was set up; the first failed free (the rest are still freed).
    pub(crate) fn release(&self, op: &'static str) -> Result<()> {
        // Not in a child forked after CUDA was set up: the lock may be held for ever there
        // by a thread of the parent's, and the blocks are the parent's.
        driver::fork::check(op)?;
        let kept: Vec<(usize, Given)> = {
            let mut devices = self.lock();
            let mut out = Vec::new();
            for (d, bins) in devices.iter_mut().enumerate() {
                for queue in &mut bins.classes {
                    out.extend(queue.drain(..).map(|g| (d, g)));
                }
                bins.spare.clear();
            }
            out
        };
        let mut first = None;
        for (d, g) in kept {
            if let Err(e) = driver::bind(d).and_then(|ctx| free_on_its_stream(&ctx, g).map(drop)) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Frees the blocks kept on `ctx`'s device, each as [`DeviceBlocks::release`] frees it,
    /// for an allocation that found the device out of memory; returns the streams the
    /// frees were queued on (each once), for the caller to wait for (empty when nothing
    /// was kept). A free that cannot be queued leaves its block allocated (never freed
    /// early), as `release`'s failures do; its error is recorded for the calling thread's
    /// next call on the device (`driver::deferred`), which this allocation does not
    /// return: it goes on with what the other frees made room for.
    pub(crate) fn free_device(&self, ctx: &ContextGuard) -> Vec<Stream> {
        let kept: Vec<Given> = {
            let mut devices = self.lock();
            let Some(bins) = devices.get_mut(ctx.device()) else {
                return Vec::new();
            };
            bins.classes.iter_mut().flat_map(|q| q.drain(..)).collect()
        };
        let mut on: Vec<Stream> = Vec::new();
        for g in kept {
            match free_on_its_stream(ctx, g) {
                Ok(s) if !on.iter().any(|o| o.same_as(&s)) => on.push(s),
                Ok(_) => {}
                Err(e) => driver::deferred::record(ctx.device(), e),
            }
        }
        on
    }

    /// The rounds of room made so far, read before an allocation: an out-of-memory retry
    /// that finds it changed when its turn comes knows another made room meanwhile.
    pub(crate) fn rooms_made(&self) -> u64 {
        self.rooms_made.load(Ordering::Acquire)
    }

    /// The turn of one out-of-memory retry to make room (one at a time, so that a second
    /// thread out of memory waits for the first's frees rather than finding nothing left
    /// to free); [`DeviceBlocks::made_room`] counts a round that freed blocks.
    pub(crate) fn room_turn(&self) -> std::sync::MutexGuard<'_, ()> {
        self.room.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Counts a round of room made (under [`DeviceBlocks::room_turn`]).
    pub(crate) fn made_room(&self) {
        self.rooms_made.fetch_add(1, Ordering::AcqRel);
    }

    /// Bytes of the blocks kept on `device` now.
    pub(crate) fn kept_bytes_on(&self, device: usize) -> usize {
        self.lock().get(device).map_or(0, Bins::bytes)
    }

    /// Bytes of the blocks kept now, on every device (each counted at its class's size).
    pub(crate) fn kept_bytes(&self) -> usize {
        self.lock().iter().map(Bins::bytes).sum()
    }
}

impl Bins {
    /// Bytes of the blocks kept here, each counted at its class's size.
    fn bytes(&self) -> usize {
        let sizes = self.classes.iter().enumerate();
        sizes.map(|(k, q)| q.len() * block_bytes(k)).sum()
    }
}

/// Frees kept block `g` of `ctx`'s device in order on the stream it was given back on
/// (after its last uses), or, for a borrowed stream (which may be gone), on the legacy
/// stream once its event has passed; returns the stream the free was queued on.
fn free_on_its_stream(ctx: &ContextGuard, g: Given) -> Result<Stream> {
    let on = match g.on {
        Consumer::Own(s) => s,
        Consumer::Borrowed(_) => {
            // An event outlives its stream's end.
            let legacy = Stream::legacy(crate::device::Device::cuda(ctx.device()))?;
            g.done.wait_on(&legacy)?;
            legacy
        }
    };
    // SAFETY: the block came from `device_alloc_async` on `ctx`'s device and was given
    // back by its last owner (`DeviceAlloc`'s drop): nothing but this free refers to it
    // now. Every use of it was queued on its consumer stream before `g.done`, or on
    // streams that stream was made to wait for, so the free in order on that stream comes
    // after them all, and so does one on the legacy stream after its wait for `g.done`.
    // `on` is alive: pinlane's own (`g` held it) or the device's legacy stream.
    unsafe { driver::device_free_async(ctx, g.ptr, &on) }?;
    Ok(on)
}

/// On the simulated device (feature `test-util`): what the public API cannot reach.
#[cfg(all(test, feature = "test-util"))]
mod sim {
    use super::*;
    use crate::device::Device;
    use std::time::{Duration, Instant};

    #[test]
    fn a_gone_borrowed_streams_blocks_are_freed_only_after_their_events() {
        crate::sim_tests::setup();
        let ctx = driver::bind(0).unwrap();
        let copy = Stream::new(Device::cuda(0)).unwrap();
        let owner = Stream::new(Device::cuda(0)).unwrap();
        // SAFETY: `owner`'s handle, a live stream of device 0, used through `borrowed`
        // only until `owner` is dropped below.
        let borrowed = unsafe { Stream::from_raw(owner.as_raw(), Device::cuda(0)) }.unwrap();
        let key = keeps_for(&copy, &borrowed).expect("the simulator gives stream ids");
        assert!(matches!(key, StreamKey::Id(_)));
        let (class, size) = class_of(1000).unwrap();
        let ptr = driver::device_alloc_async(&ctx, 0, size, &copy).unwrap();
        copy.synchronize().unwrap();
        // Work on the borrowed stream that may still use the block, held for 500 ms; the
        // block is given back behind it, and the stream destroyed while it is held.
        let held = Instant::now();
        owner.delay_async(Duration::from_millis(500)).unwrap();
        let blocks = DeviceBlocks::new(8);
        assert!(blocks.give_back(&ctx, class, ptr, &borrowed, key));
        drop(borrowed);
        drop(owner);
        blocks.release("trim").unwrap();
        assert_eq!(blocks.kept_bytes(), 0);
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            held.elapsed() < Duration::from_millis(450),
            "too slow to check"
        );
        assert!(
            driver::sim::is_live(ptr),
            "the block was freed while work queued before it was given back was held"
        );
        Stream::legacy(Device::cuda(0))
            .unwrap()
            .synchronize()
            .unwrap();
        assert!(held.elapsed() >= Duration::from_millis(500));
        assert!(!driver::sim::is_live(ptr), "the block was never freed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_cover_every_size_up_to_the_largest() {
        assert_eq!(class_of(0), None);
        assert_eq!(class_of(1), Some((0, 512)));
        assert_eq!(class_of(512), Some((0, 512)));
        assert_eq!(class_of(513), Some((1, 1024)));
        assert_eq!(class_of(4096), Some((3, 4096)));
        assert_eq!(class_of(1000 * 1024), Some((11, 1 << 20)));
        // Above 64 KiB, only outputs filling at least 7/8 of their block.
        assert_eq!(class_of(ANY_FILL_MAX + 1), None);
        assert_eq!(class_of(112 << 10), Some((8, 128 << 10)));
        assert_eq!(class_of((112 << 10) - 1), None);
        assert_eq!(class_of(600_000), None);
        assert_eq!(class_of(917_504), Some((11, 1 << 20)));
        assert_eq!(class_of(917_503), None);
        assert_eq!(class_of(MAX_BYTES), Some((CLASSES - 1, MAX_BYTES)));
        assert_eq!(class_of(MAX_BYTES + 1), None);
        for n in [1, 100, 700, 3000, 40_000, 120_000, MAX_BYTES] {
            let (k, block) = class_of(n).unwrap();
            assert!(block >= n && block == MIN_BLOCK << k && k < CLASSES, "{n}");
            assert!(n <= ANY_FILL_MAX || 8 * n >= 7 * block, "{n}");
        }
    }
}
