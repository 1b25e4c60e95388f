//! The driver entry points the simulator answers, with the driver's names and contracts.

use super::*;

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

    pub(crate) unsafe fn cuDeviceGetAttribute(
        &self,
        v: *mut c_int,
        attr: sys::CUdevice_attribute,
        d: sys::CUdevice,
    ) -> CUresult {
        use sys::CUdevice_attribute as A;
        if d < 0 || d as usize >= self.cfg.devices {
            return CUresult::CUDA_ERROR_INVALID_DEVICE;
        }
        let value = match attr {
            A::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING
            | A::CU_DEVICE_ATTRIBUTE_CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM => {
                c_int::from(self.cfg.host_mapped)
            }
            _ => 0,
        };
        // SAFETY: out-pointer per the driver contract.
        unsafe { *v = value };
        OK
    }

    pub(crate) unsafe fn cuDevicePrimaryCtxRetain(
        &self,
        ctx: *mut sys::CUcontext,
        d: sys::CUdevice,
    ) -> CUresult {
        let mut seen = lock(&self.seen);
        if let Some(u) = seen.context_used.get_mut(d as usize) {
            *u = true;
        }
        if let Some(n) = seen.context_retains.get_mut(d as usize) {
            *n += 1;
        }
        // SAFETY: out-pointer per the driver contract.
        unsafe { *ctx = ctx_handle(d as usize) };
        OK
    }

    pub(crate) unsafe fn cuDevicePrimaryCtxRelease_v2(&self, d: sys::CUdevice) -> CUresult {
        match lock(&self.seen).context_retains.get_mut(d as usize) {
            Some(n) if *n > 0 => {
                *n -= 1;
                OK
            }
            // Released more often than retained (or no such device): the driver refuses.
            _ => CUresult::CUDA_ERROR_INVALID_CONTEXT,
        }
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
            CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED => {
                c"CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"
            }
            CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED => {
                c"CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED"
            }
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
        let device = self.current_device();
        // The stream destroyed last that no one refers to any more gives its allocation,
        // so its handle.
        let reused = lock(&self.parked).as_mut().and_then(|parked| {
            let k = parked.iter().rposition(|p| Arc::strong_count(p) == 1)?;
            Some(parked.swap_remove(k))
        });
        let st = reused
            .and_then(|mut old| {
                *Arc::get_mut(&mut old)? = self.make_stream(device);
                Some(old)
            })
            .unwrap_or_else(|| self.new_stream(device));
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
        let st = unsafe { Arc::from_raw(s as *const SimStream) };
        if let Some(parked) = lock(&self.parked).as_mut() {
            // Its queue closed (the sender replaced by one whose receiver is gone), its
            // allocation kept for the next stream's handle.
            *lock(&st.tx) = std::sync::mpsc::channel().0;
            parked.push(st);
        }
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
        lock(&self.seen).stream_syncs += 1;
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        let p = st.state.wait_queued();
        // Sticky, as a real device's error: every later synchronisation returns it too.
        p.fault.unwrap_or(OK)
    }

    /// `cuStreamGetId`: the stream's id, unique for the process's life.
    pub(crate) unsafe fn cuStreamGetId(&'static self, s: sys::CUstream, id: *mut u64) -> CUresult {
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        // SAFETY: out-pointer per the driver contract.
        unsafe { *id = st.id };
        OK
    }

    /// `cuStreamWriteValue32_v2` (flags 0: the default write, after a memory barrier): the
    /// word is written when the stream reaches it, unless an earlier operation of the
    /// stream failed (the real device runs nothing after such a fault).
    pub(crate) unsafe fn cuStreamWriteValue32(
        &'static self,
        s: sys::CUstream,
        addr: sys::CUdeviceptr,
        value: u32,
        flags: c_uint,
    ) -> CUresult {
        if flags != 0 || !addr.is_multiple_of(4) {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        lock(&self.seen).flag_writes += 1;
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        Self::submit(&st, Op::WriteValue { addr, value })
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
        let device = st.device;
        Self::submit(&st, Op::Wait(ev, g, device))
    }

    pub(crate) unsafe fn cuStreamIsCapturing(
        &'static self,
        s: sys::CUstream,
        status: *mut sys::CUstreamCaptureStatus,
    ) -> CUresult {
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        let on = st.capturing.load(Ordering::Relaxed);
        // SAFETY: out-pointer per the driver contract.
        unsafe {
            *status = if on {
                sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
            } else {
                sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
            }
        };
        OK
    }

    pub(crate) unsafe fn cuLaunchHostFunc(
        &'static self,
        s: sys::CUstream,
        f: sys::CUhostFn,
        user: *mut c_void,
    ) -> CUresult {
        let Some(f) = f else {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        };
        lock(&self.seen).host_functions += 1;
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        Self::submit(&st, Op::Host(f, HostPtr(user)))
    }

    pub(crate) unsafe fn cuEventCreate(&self, e: *mut sys::CUevent, _flags: c_uint) -> CUresult {
        lock(&self.seen).events_created += 1;
        let ev = Arc::new(SimEvent {
            gens: Mutex::new((0, 0)),
            fault: Mutex::new(None),
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
        drop(gens);
        ev.outcome()
    }

    pub(crate) unsafe fn cuEventQuery(&self, e: sys::CUevent) -> CUresult {
        // SAFETY: the handle is valid (contract).
        let ev = unsafe { self.event(e) };
        let gens = lock(&ev.gens);
        if gens.1 >= gens.0 {
            drop(gens);
            ev.outcome()
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
        let mut mem = lock(&self.mem);
        if let Some(limit) = self.cfg.page_locked_limit {
            let locked: usize = mem
                .live
                .values()
                .filter(|r| r.device.is_none())
                .map(|r| r.len)
                .sum();
            if locked.saturating_add(n) > limit {
                return CUresult::CUDA_ERROR_OUT_OF_MEMORY;
            }
        }
        // SAFETY: out-pointer per the driver contract.
        unsafe { *p = r.ptr.0.cast() };
        mem.live.insert(r.addr(), r);
        drop(mem);
        if let Some(n) = lock(&self.seen).host_allocs.get_mut(d) {
            *n += 1;
        }
        OK
    }

    pub(crate) unsafe fn cuMemFreeHost(&self, p: *mut c_void) -> CUresult {
        // As the driver: the free waits for all work queued on the context's device.
        self.wait_device_idle(self.current_device());
        let mut mem = lock(&self.mem);
        match mem.live.remove(&(p as u64)) {
            Some(r) => {
                mem.bury(r);
                OK
            }
            None => CUresult::CUDA_ERROR_INVALID_VALUE,
        }
    }

    pub(crate) unsafe fn cuMemHostRegister_v2(
        &self,
        p: *mut c_void,
        n: usize,
        flags: c_uint,
    ) -> CUresult {
        if p.is_null() || n == 0 {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        let (start, end) = (p as u64, p as u64 + n as u64);
        let mut mem = lock(&self.mem);
        // As the driver: a range overlapping a registered one is refused. Disjoint ranges
        // of one page are not (the driver tracks registrations by their bytes, while it
        // page-locks whole pages; tests/gpu_foundations.rs checks it on the device).
        let overlaps = mem
            .registered
            .range(..end)
            .next_back()
            .is_some_and(|(&s, &(len, _))| s + len as u64 > start);
        if overlaps {
            return CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED;
        }
        let mapped = flags & sys::CU_MEMHOSTREGISTER_DEVICEMAP != 0;
        mem.registered.insert(start, (n, mapped));
        OK
    }

    pub(crate) unsafe fn cuMemHostUnregister(&self, p: *mut c_void) -> CUresult {
        // As the driver: ending a registration waits for all work queued on the device,
        // as a free does (measured on an H100, session 66: 480 ms behind another stream's
        // 500 ms host function or kernel; benches/probes/unregister_wait.cu).
        self.wait_device_idle(self.current_device());
        match lock(&self.mem).registered.remove(&(p as u64)) {
            Some(_) => OK,
            None => CUresult::CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED,
        }
    }

    /// As the driver answers `cuPointerGetAttributes` (zeros, not an error, for an address
    /// it does not know): `CU_POINTER_ATTRIBUTE_DEVICE_POINTER`, the address itself for
    /// memory a kernel may read there (device memory; page-locked host memory on a device
    /// that maps it, see [`Memory::kernel_readable`]), else 0; and
    /// `CU_POINTER_ATTRIBUTE_BUFFER_ID` ([`Memory::buffer_id`]), else 0; and
    /// `CU_POINTER_ATTRIBUTE_MEMORY_TYPE` ([`Memory::memory_type`], 32-bit), else 0. Other
    /// attributes are not modelled: asking for one fails.
    pub(crate) unsafe fn cuPointerGetAttributes(
        &self,
        n: c_uint,
        attrs: *mut sys::CUpointer_attribute,
        data: *mut *mut c_void,
        ptr: sys::CUdeviceptr,
    ) -> CUresult {
        use sys::CUpointer_attribute::{
            CU_POINTER_ATTRIBUTE_BUFFER_ID, CU_POINTER_ATTRIBUTE_DEVICE_POINTER,
            CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        };
        if attrs.is_null() || data.is_null() {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        if CTX.try_with(|c| c.borrow().is_empty()).unwrap_or(true) {
            return CUresult::CUDA_ERROR_INVALID_CONTEXT;
        }
        let mem = lock(&self.mem);
        for k in 0..n as usize {
            // SAFETY: `n` attributes and out-pointers (the contract).
            let (attr, out) = unsafe { (*attrs.add(k), *data.add(k)) };
            if out.is_null() {
                return CUresult::CUDA_ERROR_INVALID_VALUE;
            }
            if attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE {
                // SAFETY: a CUmemorytype is 32-bit; `out` points to one (the contract).
                unsafe { *out.cast::<u32>() = mem.memory_type(ptr).unwrap_or(0) };
                continue;
            }
            let value = if attr == CU_POINTER_ATTRIBUTE_DEVICE_POINTER {
                if mem.kernel_readable(ptr, 1, self.cfg.host_mapped) {
                    ptr
                } else {
                    0
                }
            } else if attr == CU_POINTER_ATTRIBUTE_BUFFER_ID {
                mem.buffer_id(ptr).unwrap_or(0)
            } else {
                return CUresult::CUDA_ERROR_INVALID_VALUE;
            };
            // SAFETY: these two attributes are 64-bit (a CUdeviceptr, an unsigned long
            // long); `out` points to one (the contract).
            unsafe { *out.cast::<u64>() = value };
        }
        OK
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
        lock(&self.seen).pools_live += 1;
        OK
    }

    pub(crate) unsafe fn cuMemPoolDestroy(&self, _pool: sys::CUmemoryPool) -> CUresult {
        let mut seen = lock(&self.seen);
        if seen.pools_live == 0 {
            return CUresult::CUDA_ERROR_INVALID_VALUE;
        }
        seen.pools_live -= 1;
        OK
    }

    pub(crate) unsafe fn cuMemPoolTrimTo(
        &self,
        _pool: sys::CUmemoryPool,
        _keep: usize,
    ) -> CUresult {
        OK // the simulated pool caches nothing: freed memory is given back at once
    }

    /// The simulated pool caches nothing: reserved memory is what the pool's device has
    /// allocated now (`*_CURRENT`), and its highest so far (`*_HIGH`). Other attributes
    /// are not modelled: asking for one fails, rather than answering something else.
    pub(crate) unsafe fn cuMemPoolGetAttribute(
        &self,
        pool: sys::CUmemoryPool,
        a: sys::CUmemPool_attribute,
        v: *mut c_void,
    ) -> CUresult {
        use sys::CUmemPool_attribute::*;
        let d = (pool as usize).wrapping_sub(POOL) / 16;
        let mem = lock(&self.mem);
        let of = |x: &Vec<usize>| x.get(d).copied().unwrap_or(0) as u64;
        let value = match a {
            CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT | CU_MEMPOOL_ATTR_USED_MEM_CURRENT => {
                of(&mem.used)
            }
            CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH | CU_MEMPOOL_ATTR_USED_MEM_HIGH => of(&mem.high),
            _ => return CUresult::CUDA_ERROR_NOT_SUPPORTED,
        };
        // SAFETY: the four attributes answered are u64 values (the driver's contract).
        unsafe { *v.cast::<u64>() = value };
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
        mem.high[d] = mem.high[d].max(mem.used[d]);
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
        let handle = if name == c"pinlane_gather" {
            GATHER_FN
        } else if let Some(k) = INLINE_CAPS
            .iter()
            .position(|cap| name.to_bytes() == format!("pinlane_gather_inline_{cap}").as_bytes())
        {
            GATHER_FN + 1 + k
        } else {
            return CUresult::CUDA_ERROR_NOT_FOUND;
        };
        // SAFETY: out-pointer per the driver contract.
        unsafe { *f = handle as sys::CUfunction };
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
        let f = f as usize;
        if !(GATHER_FN..=GATHER_FN + INLINE_CAPS.len()).contains(&f) || params.is_null() {
            return CUresult::CUDA_ERROR_INVALID_HANDLE;
        }
        let (pieces, dst) = if f == GATHER_FN {
            // SAFETY: the gather kernel's parameters are (u64, u32, u64), each pointed to by
            // one entry of `params` (the launch contract); they are read now, as the driver
            // copies parameters at launch.
            let (at, n, dst) = unsafe {
                (
                    *(*params).cast::<u64>(),
                    *(*params.add(1)).cast::<u32>(),
                    *(*params.add(2)).cast::<u64>(),
                )
            };
            (Pieces::At(at, n), dst)
        } else {
            let cap = INLINE_CAPS[f - GATHER_FN - 1];
            // SAFETY: an inline variant's one parameter is its `InlineArgs<cap>`: a u64,
            // a u32, a u32 of padding, then `cap` descriptors of four u64 (the launch
            // contract); read now, as the driver copies parameters at launch.
            let (dst, n, base) = unsafe {
                let a = (*params).cast::<u8>();
                (
                    a.cast::<u64>().read_unaligned(),
                    a.add(8).cast::<u32>().read_unaligned(),
                    a.add(16),
                )
            };
            if n as usize > cap {
                return CUresult::CUDA_ERROR_INVALID_VALUE;
            }
            let descs = (0..n as usize)
                .map(|k| {
                    // SAFETY: descriptor `k` of `cap`, inside the parameter (above).
                    std::array::from_fn(|w| unsafe {
                        base.add(k * 32 + w * 8).cast::<u64>().read_unaligned()
                    })
                })
                .collect();
            lock(&self.seen).inline_launches[f - GATHER_FN - 1] += 1;
            (Pieces::Inline(descs), dst)
        };
        lock(&self.seen).kernel_launches += 1;
        // SAFETY: the handle is valid (contract).
        let st = unsafe { self.stream(s) };
        Self::submit(&st, Op::Gather { pieces, dst })
    }
}
