//! [`CopyPool`]: persistent host threads that split large host-side copies (pageable into
//! a staging slot, a slot into output tensors) into pieces and run them in parallel.
//!
//! One thread copies pageable memory into page-locked memory at about 11 GB/s; the PCIe
//! link carries 55. Staging a window on one thread would cap H2D at the memcpy rate, so
//! each window's copies are cut into pieces of at most [`PIECE`] bytes that the pool's
//! workers and the calling thread take in turn from a shared counter.
//!
//! # How a job runs
//!
//! ```text
//!  caller: submit(tasks) ── pieces [p0 p1 ... pn-1] ── push Arc<Job> on the queue ──► Ticket
//!                                   ▲  next: AtomicUsize (fetch_add hands out indices)
//!  worker k: takes pieces ──────────┘  each finished piece: done.fetch_add(1)
//!  caller: ticket.wait() ── takes pieces too, then waits until done == n
//! ```
//!
//! A staging window's fill is a job of its own kind ([`CopyPool::submit_window`]): its
//! pieces are byte ranges of the window, and each thread finds the sources of the piece
//! it draws in the batch's [`Packed`] layout (a binary search), so the submitting thread
//! makes no list of a thousand small tensors' pieces before the copying can start.
//!
//! The pieces point into memory the caller borrows. A [`Ticket`] waits for its job when
//! waited or dropped, so a worker never touches that memory after the ticket is gone; a
//! worker that draws an index `>= n` touches nothing. Submitting several jobs before
//! waiting for the first keeps the workers busy with no gap between windows.
//!
//! Idle workers spin for a few microseconds before sleeping, so the next window's job
//! does not pay a thread wake-up (tens of microseconds) each time. A caller waiting for
//! the last pieces of its job spins for them too, as long, before it sleeps: they usually
//! end within microseconds, and being woken costs the caller more than that. Waking sleeping
//! workers is passed on: the submitting thread wakes one, which wakes the rest, so the
//! caller pays for one wake-up, not one per worker; and a caller that knows a job is
//! coming can wake them ahead of it ([`CopyPool::prewake`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};

/// Largest piece of a job: small enough to spread a 32 MiB window over 16 threads, large
/// enough that handing out a piece (one atomic add) is noise next to copying it.
pub const PIECE: usize = 1 << 20;

/// Smallest piece a job is cut into.
const PIECE_MIN: usize = 16 << 10;

/// The end of a spin of `spin` from now; `None` past what an `Instant` holds (a spin that
/// does not end; `Config::spin` is at most `Config::MAX_SPIN`, 1 s, so only a spin set
/// past `validate` could get there).
fn spin_end(spin: std::time::Duration) -> Option<std::time::Instant> {
    std::time::Instant::now().checked_add(spin)
}

/// Whether a spin that ends at `end` ([`spin_end`]) goes on.
fn spinning(end: Option<std::time::Instant>) -> bool {
    end.is_none_or(|e| std::time::Instant::now() < e)
}

/// Pieces per copying thread a job is cut into where [`PIECE_MIN`] allows. One piece per
/// thread left the job to its slowest thread: the caller is often busy elsewhere (H2D
/// rebuilds its batch while the workers fill the last window), so one worker copied two
/// pieces while the others had finished (1000 x 1 KiB: 12 pieces of 85 KB for 11
/// workers, the window's fill ending 26 to 49 us after it started on the H200). With
/// several pieces each, a worker that starts late or copies slowly leaves its share to
/// the others.
const PIECES_PER_THREAD: usize = 4;

/// The size of a job's pieces: about [`PIECES_PER_THREAD`] per thread, within
/// [`PIECE_MIN`]..=[`PIECE`].
fn piece_size(total: usize, threads: usize) -> usize {
    PIECE
        .min(total.div_ceil(threads.max(1) * PIECES_PER_THREAD))
        .max(PIECE_MIN)
}

/// One copy: `len` bytes from `src` to `dst`.
#[derive(Clone, Copy)]
pub(crate) struct CopyTask {
    pub(crate) src: *const u8,
    pub(crate) dst: *mut u8,
    pub(crate) len: usize,
}

// SAFETY: a CopyTask is only plain addresses; `CopyPool::run`'s contract makes the memory
// behind them valid (and not otherwise accessed) for as long as any thread may use it.
unsafe impl Send for CopyTask {}
// SAFETY: as above; tasks are only read.
unsafe impl Sync for CopyTask {}

/// Copies to run as one job, with their total and largest size counted as they are added
/// (so submitting needs no further pass over them).
#[derive(Default)]
pub(crate) struct CopyTasks {
    tasks: Vec<CopyTask>,
    total: usize,
    largest: usize,
}

impl CopyTasks {
    pub(crate) fn with_capacity(n: usize) -> CopyTasks {
        CopyTasks {
            tasks: Vec::with_capacity(n),
            ..CopyTasks::default()
        }
    }

    #[inline]
    pub(crate) fn push(&mut self, t: CopyTask) {
        self.total += t.len;
        self.largest = self.largest.max(t.len);
        self.tasks.push(t);
    }
}

impl From<Vec<CopyTask>> for CopyTasks {
    fn from(tasks: Vec<CopyTask>) -> CopyTasks {
        let mut out = CopyTasks::with_capacity(tasks.len());
        tasks.into_iter().for_each(|t| out.push(t));
        out
    }
}

struct Job {
    /// Whether to write with non-temporal stores (see [`Stores`]).
    stores: Stores,
    /// How long the waiting caller spins for the other threads' last pieces before it
    /// sleeps on `finished` (the pool's `spin`).
    spin: std::time::Duration,
    /// What the job copies, in pieces.
    work: Work,
    /// Next piece index to hand out. Relaxed is enough for the hand-out: each index goes
    /// to exactly one thread whatever the order.
    next: AtomicUsize,
    /// Pieces finished. Incremented with Release after a piece's bytes are written; read
    /// with Acquire by the caller, so the caller sees every byte once it reads `n`.
    done: AtomicUsize,
    /// Held while notifying `finished`, so the caller cannot miss the wake-up.
    lock: Mutex<()>,
    finished: Condvar,
    /// The message of the first piece that panicked (a pinlane bug): its bytes are not
    /// all copied, and the ticket's wait says so instead of waiting for ever.
    panicked: OnceLock<String>,
}

/// What a [`Job`] copies, and how it is cut into pieces.
enum Work {
    /// Tasks, large ones cut to at most one piece each; `pieces` are runs of consecutive
    /// tasks of about a piece's bytes together (many small tensors make one piece, so
    /// handing out work stays cheap).
    Tasks {
        tasks: Vec<CopyTask>,
        pieces: Vec<std::ops::Range<usize>>,
    },
    /// A window of a [`Packed`] layout: piece `i` is its bytes `i * piece ..` up to the
    /// next piece's, each thread finding the sources there itself (so the submitting
    /// thread makes no list of them).
    Window(WindowFill),
}

impl Work {
    fn pieces(&self) -> usize {
        match self {
            Work::Tasks { pieces, .. } => pieces.len(),
            Work::Window(w) => w.pieces(),
        }
    }

    /// Copies piece `i` (< [`Work::pieces`]).
    ///
    /// # Safety
    /// The contract under which the job was submitted ([`CopyPool::submit`],
    /// [`CopyPool::submit_window`]), and no other thread copies piece `i`.
    unsafe fn copy_piece(&self, i: usize, stores: Stores) {
        match self {
            // SAFETY: the submit contract, for these tasks.
            Work::Tasks { tasks, pieces } => unsafe { copy_all(&tasks[pieces[i].clone()], stores) },
            // SAFETY: the submit contract, for this window.
            Work::Window(w) => unsafe { w.copy_piece(i, stores) },
        }
    }
}

impl Job {
    /// Copies pieces until none is left to hand out.
    fn work(&self) {
        let n = self.work.pieces();
        loop {
            let i = self.next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                return;
            }
            // A piece is plain memory copies with no user code, so a panic here is a bug
            // in pinlane; caught, so that the piece is still counted (the ticket's wait
            // ends and reports it) and the copy thread lives on.
            let copied = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                // SAFETY: the contract of the submit call that made the job (`submit` or
                // `submit_window`): sources readable and unchanged, destinations writable
                // and not otherwise accessed until the ticket is waited, which completes
                // only after this piece is counted done below; index `i` went to this
                // thread alone.
                unsafe { self.work.copy_piece(i, self.stores) }
            }));
            if let Err(panic) = copied {
                let _ = self.panicked.set(crate::error::panic_message(panic));
            }
            // Order the (possibly non-temporal) stores above before the Release below.
            store_fence();
            if self.done.fetch_add(1, Ordering::Release) + 1 == n {
                let _g = self.lock.lock().unwrap_or_else(|e| e.into_inner());
                self.finished.notify_all();
            }
        }
    }

    fn exhausted(&self) -> bool {
        self.next.load(Ordering::Relaxed) >= self.work.pieces()
    }
}

/// Sources to be placed in one buffer at the offsets of a layout (the engine's
/// `plan::pack`): what the fill jobs of a batch's staging windows copy from
/// ([`CopyPool::submit_window`]). Made once per batch and shared by its windows.
pub(crate) struct Packed {
    /// Each source's place in the layout, address and length, in layout order.
    srcs: Vec<PackedSource>,
}

#[derive(Clone, Copy)]
struct PackedSource {
    at: usize,
    src: *const u8,
    len: usize,
}

// SAFETY: a Packed is only plain addresses; `CopyPool::submit_window`'s contract makes the
// memory behind them valid (and unchanged) for as long as any thread may read it.
unsafe impl Send for Packed {}
// SAFETY: as above; it is only read.
unsafe impl Sync for Packed {}

impl Packed {
    /// `srcs[k]` placed at `offsets[k]` (the shorter list decides how many). The offsets
    /// should be sorted and the ranges they start not overlap, as `plan::pack` makes
    /// them; where they are not, a window's fill leaves bytes out, and still writes
    /// nothing outside its window.
    pub(crate) fn new(srcs: &[&[u8]], offsets: &[usize]) -> Packed {
        Packed {
            srcs: srcs
                .iter()
                .zip(offsets)
                .map(|(s, &at)| PackedSource {
                    at,
                    src: s.as_ptr(),
                    len: s.len(),
                })
                .collect(),
        }
    }
}

/// One window's fill: bytes `start..start + len` of a [`Packed`] layout into `dst`, cut
/// into pieces of `piece` bytes.
struct WindowFill {
    packed: Arc<Packed>,
    start: usize,
    len: usize,
    dst: *mut u8,
    piece: usize,
}

// SAFETY: plain addresses; `CopyPool::submit_window`'s contract makes `dst..dst + len`
// writable by the job alone for as long as any thread may use it.
unsafe impl Send for WindowFill {}
// SAFETY: as above; each piece's bytes are written by the one thread that drew it.
unsafe impl Sync for WindowFill {}

impl WindowFill {
    fn pieces(&self) -> usize {
        self.len.div_ceil(self.piece.max(1))
    }

    /// Copies the sources' bytes that fall in piece `i` of the window (those at layout
    /// places `a..b`) to `dst + (place - start)`: inside `dst..dst + len` whatever the
    /// sources' places, since `start <= a` and `b <= start + len`.
    ///
    /// # Safety
    /// As [`CopyPool::submit_window`], and no other thread copies piece `i`.
    unsafe fn copy_piece(&self, i: usize, stores: Stores) {
        let end = self.start + self.len;
        let a = self.start + i * self.piece;
        let b = a.saturating_add(self.piece).min(end);
        let srcs = &self.packed.srcs;
        // The first source that ends after `a` (sorted places: their ends are sorted too).
        let mut k = srcs.partition_point(|s| s.at.saturating_add(s.len) <= a);
        while let Some(s) = srcs.get(k).filter(|s| s.at < b) {
            if let Some(next) = srcs.get(k + 1) {
                prefetch(next.src, next.len);
            }
            let (x, y) = (s.at.max(a), s.at.saturating_add(s.len).min(b));
            if y > x {
                // SAFETY: `s.at <= x < y <= s.at + s.len`: inside the source; `start <= a
                // <= x < y <= b <= end`: inside `dst..dst + len`, whose bytes `a..b` are
                // this piece's alone; the submit contract makes both valid.
                unsafe {
                    copy_bytes(
                        s.src.wrapping_add(x - s.at),
                        self.dst.wrapping_add(x - self.start),
                        y - x,
                        stores,
                    )
                };
            }
            k += 1;
        }
    }
}

/// The copy threads of the [`Runtime`](crate::runtime::Runtime) ([`Config::copy_threads`](crate::config::Config::copy_threads)).
pub struct CopyPool {
    threads: usize,
    /// Jobs below this many bytes run on the calling thread alone.
    parallel_min: usize,
    /// How long an idle worker spins before sleeping.
    spin: std::time::Duration,
    queue: Mutex<VecDeque<Arc<Job>>>,
    /// Jobs pushed and not yet seen exhausted: what spinning workers watch. Relaxed: a
    /// hint only; the queue's lock orders the real hand-over.
    queued: AtomicUsize,
    /// Workers asleep on `work_ready` (under the queue lock), so submit skips the wake-up
    /// call when nobody sleeps.
    sleepers: AtomicUsize,
    work_ready: Condvar,
    started: OnceLock<()>,
    /// Set by [`CopyPool::stop`]: workers exit once idle, and later jobs run on the
    /// calling thread alone.
    stopping: AtomicBool,
    /// The workers, for [`CopyPool::stop`] to see them finish.
    workers: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

impl CopyPool {
    pub(crate) fn new(threads: usize, parallel_min: usize, spin: std::time::Duration) -> CopyPool {
        CopyPool {
            threads: threads.max(1),
            parallel_min,
            spin,
            queue: Mutex::new(VecDeque::new()),
            queued: AtomicUsize::new(0),
            sleepers: AtomicUsize::new(0),
            work_ready: Condvar::new(),
            started: OnceLock::new(),
            stopping: AtomicBool::new(false),
            workers: Mutex::new(Vec::new()),
        }
    }

    /// Spawns the workers on first use; each holds the pool until it exits.
    fn start(self: &Arc<Self>) {
        self.started.get_or_init(|| {
            let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
            for k in 1..self.threads {
                let pool = self.clone();
                // A worker that fails to spawn only means fewer threads: the caller always
                // works on its own job, so every job still finishes.
                if let Ok(h) = std::thread::Builder::new()
                    .name(format!("pinlane-copy-{k}"))
                    .spawn(move || pool.worker())
                {
                    workers.push(h);
                }
            }
        });
    }

    /// Stops the workers: each exits once no job has pieces left for it, and every later
    /// job runs on the calling thread alone. Waits up to `limit` for them to exit and says
    /// whether they all did (the rest exit on their own, after the jobs they are on).
    pub(crate) fn stop(&self, limit: std::time::Duration) -> bool {
        {
            // Under the queue lock, so that no worker misses the wake-up between its look
            // at the flag and its sleep.
            let _q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            self.stopping.store(true, Ordering::SeqCst);
            self.work_ready.notify_all();
        }
        let deadline = crate::driver::deadline_after(limit);
        let mut workers = self.workers.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            workers.retain(|h| !h.is_finished());
            if workers.is_empty() {
                return true;
            }
            if std::time::Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_micros(200));
        }
    }

    /// Threads that copy, the calling thread included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Jobs below this many bytes run on the calling thread alone.
    pub(crate) fn parallel_min(&self) -> usize {
        self.parallel_min
    }

    fn worker(&self) {
        while let Some(job) = self.next_job() {
            job.work();
        }
    }

    /// The oldest job with pieces left; spins briefly, then sleeps, while there is none.
    /// `None` once the pool is stopping and no job has pieces left.
    fn next_job(&self) -> Option<Arc<Job>> {
        let mut spin_until = None;
        loop {
            if self.queued.load(Ordering::Relaxed) > 0 {
                let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
                while q.front().is_some_and(|j| j.exhausted()) {
                    q.pop_front();
                    self.queued.fetch_sub(1, Ordering::Relaxed);
                }
                if let Some(j) = q.front() {
                    return Some(j.clone());
                }
            }
            // (Stopping ends the spin: a spin without end would never see it below.)
            if spinning(*spin_until.get_or_insert_with(|| spin_end(self.spin)))
                && !self.stopping.load(Ordering::Relaxed)
            {
                std::hint::spin_loop();
                continue;
            }
            let q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            if q.iter().all(|j| j.exhausted()) {
                if self.stopping.load(Ordering::SeqCst) {
                    return None;
                }
                self.sleepers.fetch_add(1, Ordering::Relaxed);
                let q = self.work_ready.wait(q).unwrap_or_else(|e| e.into_inner());
                let others = self.sleepers.fetch_sub(1, Ordering::Relaxed) - 1;
                drop(q);
                // Wake-ups are passed on: the thread that hands out work wakes one worker
                // (one wake-up's cost on its own path) and that worker wakes the rest.
                if others > 0 {
                    self.work_ready.notify_all();
                }
            }
            spin_until = None;
        }
    }

    /// Runs every task and returns when all bytes are copied.
    ///
    /// # Errors
    /// [`Error::Internal`](crate::error::Error::Internal) as [`Ticket::wait`]'s
    /// [`CopyPanicked`].
    ///
    /// # Safety
    /// As for [`CopyPool::submit`], until `run` returns.
    pub(crate) unsafe fn run(
        self: &Arc<Self>,
        tasks: CopyTasks,
        stores: Stores,
    ) -> crate::error::Result<()> {
        // SAFETY: the ticket is waited before returning, within the caller's guarantee.
        Ok(unsafe { self.submit(tasks, stores) }.wait()?)
    }

    /// Starts copying every task, in parallel when they add up to the pool's `parallel_min`
    /// or more (smaller jobs are copied right here), and returns a [`Ticket`] that waits
    /// for them.
    ///
    /// # Safety
    /// For every task, until the ticket is waited or dropped (it must not be leaked):
    /// `src..src+len` is readable and unchanged, `dst..dst+len` is writable, the two do
    /// not overlap, and nothing else reads or writes `dst..dst+len`.
    pub(crate) unsafe fn submit(self: &Arc<Self>, tasks: CopyTasks, stores: Stores) -> Ticket {
        let CopyTasks {
            tasks,
            total,
            largest,
        } = tasks;
        if total < self.parallel_min || self.threads == 1 || self.stopping.load(Ordering::Relaxed) {
            // SAFETY: the caller's contract, for each task.
            unsafe { copy_all(&tasks, stores) };
            store_fence();
            return Ticket { job: None };
        }
        let piece = piece_size(total, self.threads);
        // Tasks larger than a piece are cut (many small tensors are taken as they are).
        let cut = if largest <= piece {
            tasks
        } else {
            let mut cut = Vec::with_capacity(total / piece + tasks.len());
            for t in &tasks {
                let mut off = 0;
                while off < t.len {
                    let len = piece.min(t.len - off);
                    // off + len <= t.len: inside both ranges (wrapping_add never wraps).
                    cut.push(CopyTask {
                        src: t.src.wrapping_add(off),
                        dst: t.dst.wrapping_add(off),
                        len,
                    });
                    off += len;
                }
            }
            cut
        };
        // Pieces: runs of consecutive tasks adding up to about `piece` bytes.
        let mut pieces = Vec::with_capacity(total / piece + 1);
        let (mut start, mut acc) = (0, 0);
        for (k, t) in cut.iter().enumerate() {
            acc += t.len;
            if acc >= piece {
                pieces.push(start..k + 1);
                (start, acc) = (k + 1, 0);
            }
        }
        if start < cut.len() {
            pieces.push(start..cut.len());
        }
        self.enqueue(Work::Tasks { tasks: cut, pieces }, stores)
    }

    /// Starts copying bytes `start..start + len` of the `packed` layout into `dst` (the
    /// sources' bytes there, each at `dst + (place - start)`; the bytes between sources
    /// are left as they are), in parallel when `len` is the pool's `parallel_min` or more,
    /// and returns a [`Ticket`] that waits for it. The threads find the sources of their
    /// pieces themselves: the caller makes no list of them.
    ///
    /// # Safety
    /// Until the ticket is waited or dropped (it must not be leaked): every source of
    /// `packed` with bytes in the window is readable and unchanged, `dst..dst + len` is
    /// writable, overlaps no source, and nothing else reads or writes it.
    pub(crate) unsafe fn submit_window(
        self: &Arc<Self>,
        packed: &Arc<Packed>,
        start: usize,
        len: usize,
        dst: *mut u8,
        stores: Stores,
    ) -> Ticket {
        let parallel =
            len >= self.parallel_min && self.threads > 1 && !self.stopping.load(Ordering::Relaxed);
        let fill = WindowFill {
            packed: packed.clone(),
            start,
            len,
            dst,
            piece: if parallel {
                piece_size(len, self.threads)
            } else {
                len.max(1)
            },
        };
        if !parallel {
            if len > 0 {
                // SAFETY: the caller's contract; one piece, copied by this thread alone.
                unsafe { fill.copy_piece(0, stores) };
            }
            store_fence();
            return Ticket { job: None };
        }
        self.enqueue(Work::Window(fill), stores)
    }

    /// Queues `work` for the workers (waking them) and returns its ticket.
    fn enqueue(self: &Arc<Self>, work: Work, stores: Stores) -> Ticket {
        self.start();
        let job = Arc::new(Job {
            stores,
            spin: self.spin,
            work,
            next: AtomicUsize::new(0),
            done: AtomicUsize::new(0),
            lock: Mutex::new(()),
            finished: Condvar::new(),
            panicked: OnceLock::new(),
        });
        {
            let mut q = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            q.push_back(job.clone());
            self.queued.fetch_add(1, Ordering::Relaxed);
        }
        self.wake();
        Ticket { job: Some(job) }
    }

    /// Wakes the sleeping workers, if any, so that they are spinning when work comes: for
    /// a caller that knows it will submit a job shortly (while it does other work first).
    pub(crate) fn prewake(self: &Arc<Self>) {
        if self.threads > 1 && !self.stopping.load(Ordering::Relaxed) {
            self.start();
            self.wake();
        }
    }

    /// Wakes one sleeping worker, which wakes the others (see `next_job`).
    fn wake(&self) {
        if self.sleepers.load(Ordering::Relaxed) > 0 {
            self.work_ready.notify_one();
        }
    }
}

/// A copy job's piece panicked (a bug in pinlane: a piece is plain memory copies): the
/// job's bytes are not all copied. Holds the panic's message.
#[derive(Clone, Debug)]
pub(crate) struct CopyPanicked(String);

impl From<CopyPanicked> for crate::error::Error {
    fn from(p: CopyPanicked) -> Self {
        crate::error::Error::Internal {
            op: "host copy",
            reason: format!(
                "a copy thread panicked ({}); the bytes are not all copied",
                p.0
            ),
        }
    }
}

/// A submitted copy job: [`Ticket::wait`] (or dropping it) helps with the job's pieces,
/// then blocks until every piece is copied.
#[must_use = "dropping a ticket waits for its copies"]
pub(crate) struct Ticket {
    job: Option<Arc<Job>>,
}

impl Ticket {
    /// Waits for the job (working on it meanwhile).
    ///
    /// # Errors
    /// [`CopyPanicked`] if a piece panicked (a bug in pinlane): its bytes are not all
    /// copied.
    pub(crate) fn wait(mut self) -> Result<(), CopyPanicked> {
        self.finish()
            .map_or(Ok(()), |message| Err(CopyPanicked(message)))
    }

    /// Whether every piece of the job is copied (its stores visible to this thread).
    pub(crate) fn is_done(&self) -> bool {
        self.job
            .as_ref()
            .is_none_or(|j| j.done.load(Ordering::Acquire) == j.work.pieces())
    }

    /// Copies pieces of the job that no thread has taken yet, if any; returns when none
    /// is left to take (others may still be copying theirs).
    pub(crate) fn help(&self) {
        if let Some(j) = &self.job {
            j.work();
        }
    }

    /// Waits for the job; the message of the piece that panicked, if one did.
    fn finish(&mut self) -> Option<String> {
        let job = self.job.take()?;
        job.work();
        let n = job.work.pieces();
        // Only other threads' pieces are left. Spin for them first: with the copy threads
        // awake, sleeping for them made a 280 KiB fill take 11.4 us instead of 5.2 on the
        // H200 (benches/probes/small_fill.cu, docs/performance-log.md, session 37).
        if !job.spin.is_zero() {
            let end = spin_end(job.spin);
            while job.done.load(Ordering::Acquire) < n && spinning(end) {
                std::hint::spin_loop();
            }
        }
        // Bounded without a deadline: every piece left was taken by a thread that is
        // copying it now (`work` takes an index only to copy it), and a piece is a plain
        // memory copy of at most a window's bytes, with no lock, driver call or user code
        // in it, counted done as it ends (also if it panicked: `work` catches that).
        let mut g = job.lock.lock().unwrap_or_else(|e| e.into_inner());
        while job.done.load(Ordering::Acquire) < n {
            g = job.finished.wait(g).unwrap_or_else(|e| e.into_inner());
        }
        job.panicked.get().cloned()
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        // Dropped unwaited only where the copy's result no longer matters (a call that
        // failed or unwinds): it must only end before the borrowed memory does.
        let _ = self.finish();
    }
}

/// How a copy writes its destination.
///
/// Measured on the GPU machine (docs/performance.md): filling staging slots for a large
/// batch is fastest with ordinary stores; filling them for a small batch (a few MiB),
/// and draining slots into output regions, which are not read again soon, is fastest
/// with non-temporal stores that skip the read-for-ownership.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stores {
    /// Ordinary stores (plain `memcpy`).
    Cached,
    /// Non-temporal stores for copies of 256 bytes or more (x86-64; elsewhere ordinary).
    Streaming,
}

/// Copies below this size use plain `memcpy`. Small copies stream too: a staging slot
/// filled with ordinary stores is left in the CPU caches as dirty lines, and the DMA that
/// reads it then runs far slower (measured: 1000 x 1 KiB H2D spent 26 to 37 us after the
/// last host step waiting for its 1 MB copy, 3 to 10 us with these copies streamed; the
/// threshold was 64 KiB before).
#[cfg(all(target_arch = "x86_64", not(miri)))]
const NT_MIN: usize = 256;

/// How much of the next task's source [`copy_all`] asks the CPU to fetch while it copies
/// the current one.
#[cfg(all(target_arch = "x86_64", not(miri)))]
const PREFETCH_BYTES: usize = 1 << 10;

/// Runs `tasks` in order, asking the CPU for the start of each task's source while it
/// copies the one before ([`prefetch_source`]): many small sources, each its own
/// allocation and usually cold, otherwise cost one round of cache misses each, one after
/// another, which the hardware prefetchers do not cover across allocations.
///
/// # Safety
/// For every task: as [`copy_bytes`].
unsafe fn copy_all(tasks: &[CopyTask], stores: Stores) {
    for (k, t) in tasks.iter().enumerate() {
        if let Some(next) = tasks.get(k + 1) {
            prefetch_source(next);
        }
        // SAFETY: the caller's contract, for this task.
        unsafe { copy_bytes(t.src, t.dst, t.len, stores) };
    }
}

/// Asks the CPU to fetch the first KiB (`PREFETCH_BYTES`) of `t`'s source into its caches.
#[inline]
fn prefetch_source(t: &CopyTask) {
    prefetch(t.src, t.len);
}

/// Asks the CPU to fetch the first KiB (`PREFETCH_BYTES`) of the `len` bytes at `src`
/// into its caches (on x86-64; nothing elsewhere). A hint: it reads nothing the program
/// sees.
#[inline]
fn prefetch(src: *const u8, len: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    {
        let mut at = 0;
        while at < len.min(PREFETCH_BYTES) {
            // SAFETY: a prefetch never faults and changes no memory, whatever the address
            // (here inside the source); SSE is part of the x86-64 baseline.
            unsafe {
                std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(
                    src.wrapping_add(at).cast::<i8>(),
                )
            };
            at += 64;
        }
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = (src, len);
}

/// Copies `len` bytes, with non-temporal stores for large copies on x86-64.
///
/// # Safety
/// `src..src+len` readable, `dst..dst+len` writable, not overlapping.
unsafe fn copy_bytes(src: *const u8, dst: *mut u8, len: usize, stores: Stores) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    if stores == Stores::Streaming && len >= NT_MIN {
        // SAFETY: the caller's contract.
        unsafe { copy_nt_x86(src, dst, len) };
        return;
    }
    let _ = stores; // used on x86-64 only
                    // SAFETY: the caller's contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, len) };
}

/// Makes preceding non-temporal stores visible before later stores (a no-op where they
/// are not used).
fn store_fence() {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: sfence has no preconditions; SSE is part of the x86-64 baseline.
    unsafe {
        std::arch::x86_64::_mm_sfence()
    };
}

/// The x86-64 streaming copy: plain copies up to the first 16-byte-aligned destination
/// address, then 64 bytes per step with unaligned loads and `movntdq` stores, then the
/// tail. The caller issues the `sfence` (once per piece, not per copy).
///
/// # Safety
/// As [`copy_bytes`].
#[cfg(all(target_arch = "x86_64", not(miri)))]
unsafe fn copy_nt_x86(src: *const u8, dst: *mut u8, len: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_stream_si128};
    let head = dst.align_offset(16).min(len);
    // SAFETY: head <= len: inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    while i + 64 <= len {
        // SAFETY: i + 64 <= len keeps all four 16-byte loads and stores inside the
        // ranges; dst + i is 16-byte aligned (head aligned it, steps are multiples of 16),
        // as _mm_stream_si128 requires; loads may be unaligned (loadu). SSE2 is baseline.
        unsafe {
            let s = src.add(i).cast::<__m128i>();
            let d = dst.add(i).cast::<__m128i>();
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
        }
        i += 64;
    }
    // SAFETY: i <= len: the tail is inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), len - i) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool of 4 threads for these tests (the runtime's is sized for the machine).
    fn pool() -> &'static Arc<CopyPool> {
        static P: OnceLock<Arc<CopyPool>> = OnceLock::new();
        P.get_or_init(|| {
            Arc::new(CopyPool::new(
                4,
                256 << 10,
                std::time::Duration::from_micros(50),
            ))
        })
    }

    fn run_copy(src: &[u8], dst: &mut [u8], cuts: &[usize]) {
        // Tasks: consecutive ranges of src into the same ranges of dst.
        // One pointer per slice, offsets added to it: a fresh `&mut dst[at..]` per task
        // would invalidate the pointers taken before it (Miri's Stacked Borrows).
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let mut tasks = Vec::new();
        let mut at = 0;
        for &c in cuts.iter().chain(std::iter::once(&src.len())) {
            let c = c.min(src.len());
            if c > at {
                tasks.push(CopyTask {
                    src: s.wrapping_add(at),
                    dst: d.wrapping_add(at),
                    len: c - at,
                });
                at = c;
            }
        }
        // SAFETY: every task lies inside src/dst (distinct slices) and dst is borrowed
        // mutably for the whole call.
        assert!(unsafe { pool().run(tasks.into(), Stores::Cached) }.is_ok());
    }

    #[test]
    fn large_parallel_copy_is_exact() {
        let n = if cfg!(miri) {
            300 << 10
        } else {
            9 << 20 | 12345
        };
        let src: Vec<u8> = (0..n).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut dst = vec![0u8; n];
        run_copy(&src, &mut dst, &[1, 5000, 3 << 20]);
        assert!(src == dst);
    }

    #[test]
    fn the_wait_ends_after_the_last_piece_another_thread_holds() {
        // A job whose pieces are all handed out, one still being copied by another thread
        // (simulated: it counts its piece done 30 ms later, after setting `copied`). The
        // caller's wait must end only after that piece, whether it sleeps at once (no
        // spin), spins and then sleeps (5 ms), spins throughout (10 s), or spins without
        // end (`Duration::MAX`, which no `Instant` holds).
        let spins = [
            std::time::Duration::ZERO,
            std::time::Duration::from_millis(5),
            std::time::Duration::from_secs(10),
            std::time::Duration::MAX,
        ];
        for spin in spins {
            let job = Arc::new(Job {
                stores: Stores::Cached,
                spin,
                work: Work::Tasks {
                    tasks: Vec::new(),
                    pieces: vec![0..0, 0..0],
                },
                next: AtomicUsize::new(2),
                done: AtomicUsize::new(1),
                lock: Mutex::new(()),
                finished: Condvar::new(),
                panicked: OnceLock::new(),
            });
            let copied = Arc::new(AtomicBool::new(false));
            let other = {
                let (job, copied) = (job.clone(), copied.clone());
                std::thread::spawn(move || {
                    std::thread::sleep(std::time::Duration::from_millis(30));
                    copied.store(true, Ordering::Relaxed);
                    // As `Job::work` counts a finished piece.
                    if job.done.fetch_add(1, Ordering::Release) + 1 == job.work.pieces() {
                        let _g = job.lock.lock().unwrap_or_else(|e| e.into_inner());
                        job.finished.notify_all();
                    }
                })
            };
            assert!(Ticket { job: Some(job) }.wait().is_ok());
            assert!(copied.load(Ordering::Relaxed), "spin {spin:?}");
            assert!(other.join().is_ok());
        }
    }

    #[test]
    fn a_parallel_copy_is_exact_whether_the_caller_spins_or_sleeps() {
        let n = if cfg!(miri) {
            200 << 10
        } else {
            (1 << 20) + 12345
        };
        let src: Vec<u8> = (0..n).map(|i| (i * 13 + i / 977) as u8).collect();
        for spin in [
            std::time::Duration::ZERO,
            std::time::Duration::from_millis(20),
        ] {
            let pool = Arc::new(CopyPool::new(4, 16 << 10, spin));
            for round in 0..if cfg!(miri) { 2 } else { 20 } {
                let mut dst = vec![0u8; n];
                let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
                let tasks: Vec<CopyTask> = (0..n)
                    .step_by(100_000)
                    .map(|at| CopyTask {
                        src: s.wrapping_add(at),
                        dst: d.wrapping_add(at),
                        len: 100_000.min(n - at),
                    })
                    .collect();
                // SAFETY: the tasks cover disjoint ranges inside src and dst (distinct
                // vectors), and dst is not otherwise used until `run` returns.
                assert!(unsafe { pool.run(tasks.into(), Stores::Streaming) }.is_ok());
                assert!(src == dst, "spin {spin:?}, round {round}");
            }
            assert!(pool.stop(std::time::Duration::from_secs(5)));
        }
    }

    #[test]
    fn many_small_tasks_and_odd_alignments_copy_exactly() {
        // 3000 tasks of 1..300 bytes at odd offsets: chunked into shared pieces; with
        // ordinary and with streaming stores (which start at 256 bytes).
        let tasks_n = if cfg!(miri) { 400 } else { 3000 };
        let n = tasks_n * 300;
        let src: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; n + 64];
        let (s_ptr, d_ptr) = (src.as_ptr(), dst.as_mut_ptr());
        let mut tasks = Vec::new();
        let mut at = 0;
        for k in 0..tasks_n {
            let len = 1 + k % 300;
            tasks.push(CopyTask {
                src: s_ptr.wrapping_add(at),
                dst: d_ptr.wrapping_add(at + 3),
                len,
            });
            at += len;
        }
        let dst_len = dst.len();
        for stores in [Stores::Cached, Stores::Streaming] {
            // SAFETY: (the clearing, through the same pointer as the tasks, so they stay
            // valid) d_ptr covers dst_len bytes of dst. Tasks are disjoint ranges inside src
            // and dst (offset by 3), both alive and dst not otherwise borrowed meanwhile.
            unsafe {
                std::ptr::write_bytes(d_ptr, 0, dst_len);
                assert!(pool().run(tasks.clone().into(), stores).is_ok());
            }
            assert!(dst[3..at + 3] == src[..at], "{stores:?}");
            assert_eq!(dst[..3], [0, 0, 0]);
            assert!(dst[at + 3..].iter().all(|&b| b == 0), "{stores:?}");
        }
    }

    #[test]
    fn streaming_copy_handles_heads_and_tails() {
        let src: Vec<u8> = (0..(300 << 10)).map(|i| (i * 13 % 256) as u8).collect();
        for (s_off, d_off, len) in [
            (0, 0, 64 << 10),
            (1, 5, (64 << 10) + 7),
            (3, 0, 200_003),
            // At and around the smallest streamed copy, with heads of every length.
            (0, 1, 255),
            (2, 1, 256),
            (5, 15, 257),
            (7, 9, 1024),
            (0, 0, 320),
        ] {
            let mut dst = vec![0u8; len + 32];
            // SAFETY: both ranges are inside their vectors and distinct.
            unsafe {
                copy_bytes(
                    src[s_off..].as_ptr(),
                    dst[d_off..].as_mut_ptr(),
                    len,
                    Stores::Streaming,
                )
            };
            store_fence();
            assert!(
                dst[d_off..d_off + len] == src[s_off..s_off + len],
                "{s_off} {d_off} {len}"
            );
            assert!(dst[d_off + len..].iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn small_copy_runs_inline() {
        let src = [1u8, 2, 3, 4, 5];
        let mut dst = [0u8; 5];
        run_copy(&src, &mut dst, &[2]);
        assert_eq!(dst, src);
    }

    #[test]
    fn concurrent_jobs_from_many_threads() {
        let handles: Vec<_> = (0..4u8)
            .map(|k| {
                std::thread::spawn(move || {
                    let n = if cfg!(miri) { 300 << 10 } else { 3 << 20 };
                    for r in 0..(if cfg!(miri) { 1 } else { 5 }) {
                        let src = vec![k.wrapping_mul(31).wrapping_add(r); n];
                        let mut dst = vec![0u8; n];
                        run_copy(&src, &mut dst, &[]);
                        assert!(src == dst);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().unwrap();
        }
    }

    #[test]
    fn jobs_are_cut_into_several_pieces_per_thread() {
        // 1000 x 1 KiB for 12 threads: 48 pieces, where one per thread left one worker
        // with two of them.
        assert_eq!(1_024_000_usize.div_ceil(piece_size(1_024_000, 12)), 48);
        // Bounded both ways: a small job is not cut below PIECE_MIN, a huge one not
        // above PIECE.
        assert_eq!(piece_size(256 << 10, 12), PIECE_MIN);
        assert_eq!(piece_size(1 << 30, 12), PIECE);
        assert_eq!(piece_size(8 << 20, 16), 128 << 10);
        assert_eq!(piece_size(0, 0), PIECE_MIN);
        // A real job: 1000 tasks of 1 KiB on the tests' 4 threads make 16 pieces (15 of
        // 63 tasks, the last of 55), where one per thread made 4.
        let n = if cfg!(miri) { 100 } else { 1000 };
        let src: Vec<u8> = (0..n * 1024).map(|i| (i % 253) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
        let tasks: Vec<CopyTask> = (0..n)
            .map(|k| CopyTask {
                src: s.wrapping_add(k * 1024),
                dst: d.wrapping_add(k * 1024),
                len: 1024,
            })
            .collect();
        let pool = Arc::new(CopyPool::new(4, 1024, std::time::Duration::from_micros(50)));
        // SAFETY: both buffers outlive the ticket, waited for below before they are read;
        // the tasks' ranges are disjoint and inside both buffers.
        let ticket = unsafe { pool.submit(tasks.into(), Stores::Cached) };
        let pieces = ticket.job.as_ref().map_or(0, |j| j.work.pieces());
        assert!(ticket.wait().is_ok());
        assert!(dst == src);
        if !cfg!(miri) {
            assert_eq!(pieces, 16);
        }
        assert!(pool.stop(std::time::Duration::from_secs(5)));
    }

    #[test]
    fn a_helped_job_is_done_only_when_every_piece_is_copied() {
        let n = if cfg!(miri) { 600 << 10 } else { 6 << 20 };
        let src: Vec<u8> = (0..n).map(|i| (i * 31 + i / 977) as u8).collect();
        let mut dst = vec![0u8; n];
        let task = CopyTask {
            src: src.as_ptr(),
            dst: dst.as_mut_ptr(),
            len: n,
        };
        // SAFETY: both buffers outlive the ticket, which is waited for below before they
        // are read or dropped; nothing else touches `dst` meanwhile.
        let ticket = unsafe { pool().submit(vec![task].into(), Stores::Cached) };
        // The caller takes pieces until none is left, then polls as the H2D pump does.
        ticket.help();
        while !ticket.is_done() {
            std::hint::spin_loop();
        }
        // Read before `wait` (which synchronises by itself): `is_done` alone must make the
        // workers' stores visible (Miri's race detector checks this).
        assert!(src == dst);
        assert!(ticket.wait().is_ok());
    }

    #[test]
    fn a_piece_that_panics_ends_the_wait_with_an_error_and_the_workers_live_on() {
        // Pieces that index past their tasks panic (as a bug in a piece would): on the
        // workers and on the waiting caller alike, each is still counted, the wait ends
        // with the error instead of waiting for ever, and no copy thread dies of it.
        let pool = Arc::new(CopyPool::new(4, 1024, std::time::Duration::from_micros(50)));
        pool.start();
        assert_eq!(Arc::strong_count(&pool), 4, "three workers hold the pool");
        let broken = || Work::Tasks {
            tasks: Vec::new(),
            pieces: vec![0..1; 64],
        };
        let err = pool.enqueue(broken(), Stores::Cached).wait().err();
        let message =
            crate::error::Error::from(err.expect("the wait reports the panic")).to_string();
        assert!(message.contains("copy thread panicked"), "{message}");
        assert!(message.contains("out of range"), "{message}");
        // Dropping an unwaited ticket of such a job ends too.
        drop(pool.enqueue(broken(), Stores::Cached));
        assert_eq!(Arc::strong_count(&pool), 4, "a worker died of the panic");
        let src: Vec<u8> = (0..(3usize << 20)).map(|i| (i % 253) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let task = CopyTask {
            src: src.as_ptr(),
            dst: dst.as_mut_ptr(),
            len: src.len(),
        };
        // SAFETY: src and dst are distinct vectors of the task's length, alive throughout.
        let copied = unsafe { pool.run(vec![task].into(), Stores::Cached) };
        assert!(copied.is_ok());
        assert!(dst == src, "the pool copies exactly after the panics");
        assert!(pool.stop(std::time::Duration::from_secs(5)));
    }

    #[test]
    fn a_stopped_pool_ends_its_workers_and_still_copies() {
        let pool = Arc::new(CopyPool::new(4, 1024, std::time::Duration::from_micros(50)));
        let src: Vec<u8> = (0..(1usize << 20)).map(|i| (i % 251) as u8).collect();
        let mut dst = vec![0u8; src.len()];
        let task = |dst: &mut [u8]| CopyTask {
            src: src.as_ptr(),
            dst: dst.as_mut_ptr(),
            len: src.len(),
        };
        // SAFETY: src and dst are distinct vectors of the task's length, alive throughout.
        assert!(unsafe { pool.run(vec![task(&mut dst)].into(), Stores::Cached) }.is_ok());
        assert!(dst == src);
        assert_eq!(Arc::strong_count(&pool), 4, "three workers hold the pool");
        assert!(
            pool.stop(std::time::Duration::from_secs(5)),
            "workers did not exit"
        );
        assert_eq!(
            Arc::strong_count(&pool),
            1,
            "the workers let go of the pool"
        );
        dst.iter_mut().for_each(|b| *b = 0);
        // SAFETY: as above.
        assert!(unsafe { pool.run(vec![task(&mut dst)].into(), Stores::Cached) }.is_ok());
        assert!(dst == src, "a stopped pool copies on the calling thread");
    }

    /// Bytes after each window's buffer that a fill must leave alone: as large as the
    /// largest piece of these tests (windows of at most 32 KiB cut for 3 threads), so a
    /// piece that ran past its window shows here.
    const GUARD: usize = PIECE_MIN;

    /// Fills each window `(start, len)` of `srcs` placed at `offsets` into its own buffer
    /// of `len` bytes and [`GUARD`] bytes after them, all set to 0xEE first, through
    /// `pool`; returns the buffers.
    fn fill_windows(
        pool: &Arc<CopyPool>,
        srcs: &[Vec<u8>],
        offsets: &[usize],
        windows: &[(usize, usize)],
        stores: Stores,
    ) -> Vec<Vec<u8>> {
        let views: Vec<&[u8]> = srcs.iter().map(Vec::as_slice).collect();
        let packed = Arc::new(Packed::new(&views, offsets));
        let mut bufs: Vec<Vec<u8>> = windows
            .iter()
            .map(|&(_, len)| vec![0xEE; len + GUARD])
            .collect();
        // All windows in flight at once, as the staging ring has them.
        let tickets: Vec<Ticket> = windows
            .iter()
            .zip(bufs.iter_mut())
            .map(|(&(start, len), buf)| {
                // SAFETY: the sources (`srcs`) outlive the tickets, waited for below; each
                // buffer has `len` bytes and more, is its window's alone, and is not used
                // until its ticket is waited.
                unsafe { pool.submit_window(&packed, start, len, buf.as_mut_ptr(), stores) }
            })
            .collect();
        for t in tickets {
            assert!(t.wait().is_ok());
        }
        bufs
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(if cfg!(miri) { 2 } else { 48 }))]

        /// Window fills place every source's bytes at its offset, window by window, leave
        /// the bytes between sources and after each window as they were, and do so on the
        /// copy threads (small `parallel_min`) and on the calling thread alike.
        #[test]
        fn window_fills_place_each_source_at_its_offset(
            sizes in proptest::collection::vec(0usize..3000, 1..if cfg!(miri) { 8 } else { 120 }),
            align_log in 0u32..9,
            window_log in 8u32..16,
            streaming: bool,
            parallel_min in proptest::sample::select(vec![1usize << 10, 1 << 30]),
        ) {
            let align = 1usize << align_log;
            let mut offsets = Vec::new();
            let mut end = 0usize;
            for &n in &sizes {
                let at = end.next_multiple_of(align);
                offsets.push(at);
                end = at + n;
            }
            let srcs: Vec<Vec<u8>> = sizes
                .iter()
                .enumerate()
                .map(|(k, &n)| (0..n).map(|i| (i * 31 + k * 7) as u8 | 1).collect())
                .collect();
            let mut image = vec![0xEEu8; end];
            for (s, &at) in srcs.iter().zip(&offsets) {
                image[at..at + s.len()].copy_from_slice(s);
            }
            let window = 1usize << window_log;
            let windows: Vec<(usize, usize)> =
                (0..end).step_by(window).map(|a| (a, window.min(end - a))).collect();
            let pool = Arc::new(CopyPool::new(3, parallel_min, std::time::Duration::from_micros(20)));
            let stores = if streaming { Stores::Streaming } else { Stores::Cached };
            let bufs = fill_windows(&pool, &srcs, &offsets, &windows, stores);
            for (&(a, len), buf) in windows.iter().zip(&bufs) {
                proptest::prop_assert_eq!(&buf[..len], &image[a..a + len], "window at {}", a);
                proptest::prop_assert!(buf[len..].iter().all(|&b| b == 0xEE), "after window at {}", a);
            }
            proptest::prop_assert!(pool.stop(std::time::Duration::from_secs(5)));
        }

        /// Places that are not sorted, or overlap, leave bytes out but never write outside
        /// a window.
        #[test]
        fn window_fills_never_write_outside_their_window(
            places in proptest::collection::vec((0usize..20_000, 0usize..4000), 1..if cfg!(miri) { 8 } else { 60 }),
            window_log in 8u32..15,
        ) {
            let srcs: Vec<Vec<u8>> = places.iter().map(|&(_, n)| vec![0x5A; n]).collect();
            let offsets: Vec<usize> = places.iter().map(|p| p.0).collect();
            let window = 1usize << window_log;
            let windows: Vec<(usize, usize)> =
                (0..24_000).step_by(window).map(|a| (a, window.min(24_000 - a))).collect();
            let pool = Arc::new(CopyPool::new(3, 1 << 10, std::time::Duration::from_micros(20)));
            let bufs = fill_windows(&pool, &srcs, &offsets, &windows, Stores::Streaming);
            for (&(a, len), buf) in windows.iter().zip(&bufs) {
                proptest::prop_assert!(buf[len..].iter().all(|&b| b == 0xEE), "after window at {}", a);
            }
            proptest::prop_assert!(pool.stop(std::time::Duration::from_secs(5)));
        }
    }
}
