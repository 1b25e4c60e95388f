//! Simulated streams and events: in-order worker threads, the operations they run, and
//! how handles map to them.

use super::*;

/// The bytes a simulated copy (or the gather kernel) moves under one hold of the memory
/// lock before other threads are let in (see `Op::Copy` in [`Sim::run`]).
const COPY_PIECE: usize = 64 << 10;

/// One queued operation of a simulated stream.
pub(super) enum Op {
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
    /// The event, the generation, the waiting stream's device.
    Wait(Arc<SimEvent>, u64, usize),
    /// A host function (`cuLaunchHostFunc`).
    Host(unsafe extern "C" fn(*mut c_void), HostPtr<c_void>),
    /// The gather kernel: its descriptors read from memory when it runs, or copied from
    /// the launch's parameters.
    Gather {
        pieces: Pieces,
        dst: u64,
    },
    /// `cuStreamWriteValue32`: a word of memory the device may write (page-locked host
    /// memory on a device that maps it, or device memory).
    WriteValue {
        addr: u64,
        value: u32,
    },
}

/// Where a simulated gather finds its descriptors.
pub(super) enum Pieces {
    /// `n` descriptors at an address the kernel reads when it runs.
    At(u64, u32),
    /// Descriptors passed in the launch's parameters (each `src, dst_off, len, zeros`).
    Inline(Vec<[u64; 4]>),
}

#[derive(Default)]
pub(super) struct Progress {
    pub(super) submitted: u64,
    pub(super) done: u64,
    /// The first error of the stream, returned by every synchronisation from then on
    /// (sticky, as a real device's); after it only records, waits and frees run.
    pub(super) fault: Option<CUresult>,
}

pub(super) struct StreamState {
    pub(super) progress: Mutex<Progress>,
    pub(super) changed: Condvar,
}

impl StreamState {
    /// Waits until the stream has run what was queued on it before this call, and
    /// returns its progress, locked.
    pub(super) fn wait_queued(&self) -> std::sync::MutexGuard<'_, Progress> {
        let mut p = lock(&self.progress);
        let target = p.submitted;
        while p.done < target {
            p = self.changed.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        p
    }
}

/// A simulated stream: a worker thread running queued operations in order.
pub(crate) struct SimStream {
    pub(super) tx: Mutex<mpsc::Sender<Op>>,
    pub(super) state: Arc<StreamState>,
    pub(super) device: usize,
    /// Its `cuStreamGetId`: unique for the process's life, as the driver's (a handle may
    /// come back for a new stream once its stream is destroyed: it is an address).
    pub(super) id: u64,
    /// The stream is "capturing" (a CUDA graph capture, as [`set_capturing`] says):
    /// `cuStreamIsCapturing` answers so, and each operation queued counts in `captured`.
    pub(super) capturing: std::sync::atomic::AtomicBool,
    /// Operations queued while `capturing` (still run: the count is what a test checks).
    pub(super) captured: AtomicU64,
}

/// A simulated event: recorded generations and the last one a stream passed.
pub(crate) struct SimEvent {
    pub(super) gens: Mutex<(u64, u64)>,
    pub(super) changed: Condvar,
    /// The error of a stream that had faulted when it reached a record of this event:
    /// from then on `cuEventQuery` and `cuEventSynchronize` return it, as a real device's
    /// sticky error is returned by every call (session 87: the simulated event reported
    /// success, so no path that learns completion from an event saw a fault).
    /// With the device of the faulted stream: a stream of another device that waits on the
    /// event does not fault (a sticky error is its context's).
    pub(super) fault: Mutex<Option<(CUresult, usize)>>,
}

impl SimEvent {
    /// What a completed event answers: the fault its record met, or success.
    pub(super) fn outcome(&self) -> CUresult {
        lock(&self.fault).map_or(CUresult::CUDA_SUCCESS, |(e, _)| e)
    }
}

impl Sim {
    /// Waits until every stream of `device` has run what was queued on it before this
    /// call: what `cuMemFreeHost` does (measured on the H200: a free waited 1.5 s for
    /// another stream's host function), and `cuMemHostUnregister` (session 66).
    pub(super) fn wait_device_idle(&self, device: usize) {
        let streams: Vec<Arc<StreamState>> = lock(&self.all_streams)
            .iter()
            .filter(|(d, _)| *d == device)
            .filter_map(|(_, w)| w.upgrade())
            .collect();
        for st in streams {
            drop(st.wait_queued());
        }
    }

    pub(super) fn new_stream(&'static self, device: usize) -> Arc<SimStream> {
        Arc::new(self.make_stream(device))
    }

    /// A new stream of `device`, with its worker running.
    pub(super) fn make_stream(&'static self, device: usize) -> SimStream {
        let (tx, rx) = mpsc::channel::<Op>();
        let state = Arc::new(StreamState {
            progress: Mutex::new(Progress::default()),
            changed: Condvar::new(),
        });
        let k = self.streams.fetch_add(1, Ordering::Relaxed);
        {
            let mut all = lock(&self.all_streams);
            all.retain(|(_, w)| w.strong_count() > 0);
            all.push((device, Arc::downgrade(&state)));
        }
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
                    // The real device runs nothing after a fault: a flag written after
                    // a failed copy would claim the copy done, and host functions are not
                    // called (cuLaunchHostFunc: not in the event of an error in the
                    // context); an event recorded then completes with the error.
                    let fault = lock(&st.progress).fault;
                    let res = match (op, fault) {
                        // Nothing that touches memory or runs user code; frees still
                        // run (the simulator's bookkeeping of a context that is dead).
                        (
                            Op::WriteValue { .. }
                            | Op::Host(..)
                            | Op::Copy { .. }
                            | Op::Gather { .. },
                            Some(_),
                        ) => Ok(()),
                        (Op::Signal(ev, g), Some(e)) => {
                            lock(&ev.fault).get_or_insert((e, device));
                            self.run(Op::Signal(ev, g))
                        }
                        (op, _) => self.run(op),
                    };
                    let mut p = lock(&st.progress);
                    p.done += 1;
                    if let Err(e) = res {
                        p.fault.get_or_insert(e);
                    }
                    st.changed.notify_all();
                }
            });
        SimStream {
            tx: Mutex::new(tx),
            state,
            device,
            id: k + 1,
            capturing: std::sync::atomic::AtomicBool::new(false),
            captured: AtomicU64::new(0),
        }
    }

    /// Runs one operation on a stream's worker.
    pub(super) fn run(&self, op: Op) -> std::result::Result<(), CUresult> {
        match op {
            Op::Copy {
                dst,
                src,
                n,
                dev_dst,
                dev_src,
            } => {
                // In pieces, the memory lock taken for each, with other threads let in
                // between: copies on different streams overlap, as a device's do, so a
                // copy that is not ordered after another's writes reads some of the old
                // bytes (a missing wait shows in the bytes, not only in timing).
                let mut off = 0;
                loop {
                    let len = (n - off).min(COPY_PIECE);
                    let (d, s) = (dst + off as u64, src + off as u64);
                    {
                        let mem = lock(&self.mem);
                        if (dev_dst && !mem.covers(d, len)) || (dev_src && !mem.covers(s, len)) {
                            return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                        }
                        // SAFETY: device sides are inside simulated regions (checked
                        // above), which the memory lock keeps allocated during the piece;
                        // host sides are page-locked memory that the caller of the async
                        // copy keeps alive until the copy completes (the driver call's
                        // contract). Distinct regions; the piece lies inside both ranges.
                        unsafe { std::ptr::copy_nonoverlapping(s as *const u8, d as *mut u8, len) };
                    }
                    off += len;
                    if off >= n {
                        break;
                    }
                    std::thread::yield_now();
                }
                // Only copies that move bytes count, so the corruption always happens.
                if n > 0 {
                    let k = self.copies.fetch_add(1, Ordering::Relaxed) + 1;
                    if self.cfg.corrupt_copy == Some(k) {
                        let mem = lock(&self.mem);
                        let mid = dst + (n / 2) as u64;
                        if dev_dst && !mem.covers(mid, 1) {
                            return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                        }
                        // SAFETY: `dst + n / 2` lies inside the `n` bytes just written
                        // (n > 0): simulated device memory checked just now, or page-locked
                        // host memory the copy's caller keeps alive and lets the copy
                        // write; the memory lock is held, so nothing frees it.
                        unsafe { *(mid as *mut u8) ^= 0xFF };
                    }
                }
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
            Op::Wait(ev, g, device) => {
                let mut gens = lock(&ev.gens);
                while gens.1 < g {
                    gens = ev.changed.wait(gens).unwrap_or_else(|p| p.into_inner());
                }
                drop(gens);
                // A fault reached through the event is this stream's too if it is of the
                // same device (the context's sticky error, on a real device).
                match *lock(&ev.fault) {
                    Some((e, on)) if on == device => Err(e),
                    _ => Ok(()),
                }
            }
            Op::WriteValue { addr, value } => {
                let mem = lock(&self.mem);
                if !mem.kernel_readable(addr, 4, self.cfg.host_mapped) {
                    return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                }
                // SAFETY: `addr..+4` is inside a simulated region the device may write
                // (checked above), kept allocated by the memory lock, and aligned (checked
                // when queued); the host only reads it, atomically, meanwhile.
                let word = unsafe { std::sync::atomic::AtomicU32::from_ptr(addr as *mut u32) };
                // Release: everything this stream ran before is visible before the word.
                word.store(value, Ordering::Release);
                Ok(())
            }
            Op::Host(f, user) => {
                // One at a time across all streams when so configured, as the driver may.
                let _turn = self
                    .cfg
                    .serial_host_functions
                    .then(|| lock(&self.host_turn));
                // SAFETY: cuLaunchHostFunc's contract: `f` may be called once with `user`.
                unsafe { f(user.0) };
                Ok(())
            }
            Op::Gather { pieces, dst } => {
                let mut mem = lock(&self.mem);
                let host_mapped = self.cfg.host_mapped;
                let descs = match pieces {
                    Pieces::Inline(v) => v,
                    Pieces::At(at, n) => {
                        let desc_bytes = n as usize * 32;
                        if !mem.kernel_readable(at, desc_bytes, host_mapped) {
                            return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                        }
                        // SAFETY: `at..+desc_bytes` is inside a simulated region (checked).
                        let raw =
                            unsafe { std::slice::from_raw_parts(at as *const u8, desc_bytes) };
                        raw.chunks_exact(32)
                            .map(|d| {
                                std::array::from_fn(|i| {
                                    u64::from_ne_bytes(
                                        d[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]),
                                    )
                                })
                            })
                            .collect()
                    }
                };
                // As copies do: other threads are let in after every COPY_PIECE bytes, so
                // the kernel's reads and writes overlap other streams' work.
                let mut since = 0;
                for [src, off, len, zeros] in descs {
                    let (len, zeros) = (len as usize, zeros as usize);
                    if since >= COPY_PIECE {
                        drop(mem);
                        std::thread::yield_now();
                        mem = lock(&self.mem);
                        since = 0;
                    }
                    since += len + zeros;
                    let to = dst.wrapping_add(off);
                    if !mem.kernel_readable(src, len, host_mapped)
                        || !mem.is_device(to, len.saturating_add(zeros))
                    {
                        return Err(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS);
                    }
                    // SAFETY: both ranges are inside simulated regions (checked just
                    // above, under the lock held now), kept allocated by the lock; the
                    // kernel's contract makes them disjoint.
                    unsafe {
                        std::ptr::copy_nonoverlapping(src as *const u8, to as *mut u8, len);
                        std::ptr::write_bytes((to as *mut u8).add(len), 0, zeros);
                    }
                }
                Ok(())
            }
        }
    }

    /// The stream a handle names: the legacy one of the current device, or a created one.
    ///
    /// # Safety
    /// A non-legacy handle came from `cuStreamCreate` and was not destroyed.
    pub(super) unsafe fn stream(&'static self, s: sys::CUstream) -> Arc<SimStream> {
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
    pub(super) unsafe fn event(&self, e: sys::CUevent) -> Arc<SimEvent> {
        let p = e as *const SimEvent;
        // SAFETY: as in `stream`.
        unsafe {
            Arc::increment_strong_count(p);
            Arc::from_raw(p)
        }
    }

    pub(super) fn submit(s: &SimStream, op: Op) -> CUresult {
        if s.capturing.load(Ordering::Relaxed) {
            s.captured.fetch_add(1, Ordering::Relaxed);
        }
        let mut p = lock(&s.state.progress);
        let sent = lock(&s.tx).send(op).is_ok();
        if !sent {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        }
        p.submitted += 1;
        OK
    }
}
