//! GPU: memory that can be given back (trim after a 4 GiB batch), the runtime's
//! statistics, the review's holes that only the device shows, and how the driver
//! registers host memory in place (what the simulator models).
//!
//! Every test installs the same configuration (batched small D2H copies, so the legacy
//! stream test exercises the path that must refuse it).

mod common;

use pinlane::{
    memory_stats, transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_with, Config,
    D2hOptions, DType, H2dOptions, HostOutput, Location, SmallD2h, Stream, Tensor,
};

/// Installs the binary's configuration and serialises the tests: they measure the
/// device's memory, which another test's batch would disturb.
fn config() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let guard = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    Config::new()
        .small_d2h(SmallD2h::Batch)
        .install()
        .expect("every test installs the same configuration");
    guard
}

/// Device memory in use on the device, per `cuMemGetInfo`.
/// Device memory in use: the device's (`cuMemGetInfo`), or under compute-sanitizer, whose
/// own memory shows there, pinlane's pool's reservation.
fn used() -> usize {
    if common::under_sanitizer() {
        return reserved() as usize;
    }
    let (free, total) = pinlane::driver::device_memory_info(common::dev()).unwrap();
    total - free
}

fn reserved() -> u64 {
    memory_stats()
        .devices
        .iter()
        .find(|d| d.device == common::dev())
        .map_or(0, |d| d.reserved_bytes)
}

#[test]
fn trim_gives_back_a_4_gib_batch() {
    require_gpu!();
    let _serial = config();
    let dev = common::dev();
    // Warm up: context, pool and a staging slot exist; then give back what is cached.
    let warm = vec![Tensor::from_vec(vec![1u8; 1 << 20], [1 << 20]).unwrap()];
    drop(transfer_tensor_h2d_with(&warm, &H2dOptions::default().num_caches(0)).unwrap());
    Stream::legacy(dev).unwrap().synchronize().unwrap();
    pinlane::trim().unwrap();
    let before = used();

    let n = 4usize << 30;
    let big = vec![Tensor::from_vec(vec![0x5Au8; n], [n]).unwrap()];
    let on = transfer_tensor_h2d_with(&big, &H2dOptions::default().num_caches(0)).unwrap();
    assert_eq!(on[0].location(), Location::Cuda(dev));
    drop(on);
    Stream::legacy(dev).unwrap().synchronize().unwrap();
    let held = reserved();
    // With the default release threshold (keep everything) the pool still holds the
    // batch: this is what trim must give back.
    assert!(held >= n as u64, "the pool kept {held} bytes");
    let s = memory_stats();
    assert!(
        s.staging.held_bytes > 0 && s.staging.in_use_bytes == 0,
        "{s:?}"
    );

    pinlane::trim().unwrap();
    let after = used();
    let s = memory_stats();
    eprintln!(
        "device memory in use: {} MiB before, {} MiB with the batch's memory cached, {} MiB after trim",
        before >> 20,
        (before as u64 + held) >> 20,
        after >> 20
    );
    assert!(
        after <= before + (64 << 20),
        "after trim {after} bytes in use, before the batch {before}"
    );
    assert!(reserved() <= 64 << 20, "{s:?}");
    assert_eq!(s.staging.held_bytes, 0, "{s:?}");
    assert_eq!(s.pinned_outputs.in_use_bytes, 0, "{s:?}");
}

#[test]
fn a_release_threshold_of_zero_gives_memory_back_at_the_next_sync() {
    require_gpu!();
    let _serial = config();
    let dev = common::dev();
    let rt = pinlane::runtime();
    let b = vec![Tensor::from_vec(vec![3u8; 256 << 20], [256 << 20]).unwrap()];
    rt.set_device_pool_release_bytes(0).unwrap();
    let on = transfer_tensor_h2d_with(&b, &H2dOptions::default().num_caches(0)).unwrap();
    drop(on);
    Stream::legacy(dev).unwrap().synchronize().unwrap();
    let r = reserved();
    rt.set_device_pool_release_bytes(u64::MAX).unwrap();
    assert!(r < 256 << 20, "reserved {r} after a sync with threshold 0");
}

#[test]
fn d2h_on_the_legacy_stream_never_takes_the_batched_copy() {
    require_gpu!();
    let _serial = config();
    let dev = common::dev();
    // Many small tensors: with SmallD2h::Batch they would go through cuMemcpyBatchAsync,
    // which must not be given the legacy stream (D2hOptions::stream may be it).
    let b: Vec<Tensor> = (0..64)
        .map(|i| common::tensor(DType::F32, &[17 + i], i as u64))
        .collect();
    let on = transfer_tensor_h2d(&b).unwrap();
    let opts = D2hOptions::default()
        .device(dev)
        .stream(Stream::legacy(dev).unwrap());
    let back = transfer_tensor_d2h(&on, &opts).unwrap();
    assert_eq!(back, b);
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!(s.copies, 64, "one copy each on the legacy stream: {s:?}");
    // On the thread's own stream the batched copy is used: one submission.
    let back = transfer_tensor_d2h(&on, &D2hOptions::default().device(dev)).unwrap();
    assert_eq!(back, b);
    assert_eq!(pinlane::observe::last_transfer_stats().unwrap().copies, 1);
}

#[test]
fn small_batches_share_page_locked_blocks() {
    require_gpu!();
    let _serial = config();
    let on = transfer_tensor_h2d(&vec![Tensor::scalar(7.5f32)]).unwrap();
    let before = memory_stats().pinned_outputs.held_bytes;
    // 1,100 batches of one scalar kept alive: before, each took a 2 MiB block and the
    // 2 GiB pool ran out, after which outputs silently became pageable.
    let kept: Vec<Vec<Tensor>> = (0..1100)
        .map(|_| transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap())
        .collect();
    assert!(kept
        .iter()
        .all(|b| b[0].location() == Location::Pinned && b[0].as_slice::<f32>().unwrap() == [7.5]));
    let s = memory_stats();
    assert!(
        s.pinned_outputs.held_bytes - before <= 4 << 20,
        "1,100 scalars hold {} bytes: {s:?}",
        s.pinned_outputs.held_bytes - before
    );
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default().output(HostOutput::Pinned)).unwrap()[0]
            .location(),
        Location::Pinned
    );
}

/// Bytes of one shared buffer: tensors over parts of it share its pages.
struct Part(std::sync::Arc<Vec<u8>>, std::ops::Range<usize>);

impl AsRef<[u8]> for Part {
    fn as_ref(&self) -> &[u8] {
        &self.0[self.1.clone()]
    }
}

/// What the simulator's `cuMemHostRegister` models (src/driver/sim/entry.rs): the driver
/// registers disjoint ranges of one page separately, refuses a range overlapping a live
/// registration, and `register_pinned_many` takes views of live registrations instead.
#[test]
fn the_driver_registers_disjoint_ranges_of_one_page_and_refuses_overlaps() {
    require_gpu!();
    let buf = std::sync::Arc::new(vec![7u8; 3 * 4096]);
    let o = (buf.as_ptr() as usize).next_multiple_of(4096) - buf.as_ptr() as usize;
    let part = |r: std::ops::Range<usize>| {
        Tensor::from_owner(
            Part(buf.clone(), o + r.start..o + r.end),
            DType::U8,
            [r.len()],
        )
        .unwrap()
    };
    let (a, b, over) = (part(0..100), part(200..300), part(50..250));
    let dev = common::dev();
    let ra = a.register_pinned(dev).unwrap();
    let rb = b
        .register_pinned(dev)
        .expect("a disjoint range of the same page");
    // The driver itself (pinlane refuses overlaps of its own registrations before asking
    // it), through cudarc.
    let ctx = cudarc::driver::CudaContext::new(dev.ordinal()).unwrap();
    ctx.bind_to_thread().unwrap();
    let at = over.as_bytes().unwrap().as_ptr().cast_mut();
    // SAFETY: memory of `buf`, alive for the whole test; the driver refuses the call (else
    // it is unregistered just below).
    let res = unsafe {
        cudarc::driver::sys::cuMemHostRegister_v2(
            at.cast(),
            over.nbytes(),
            cudarc::driver::sys::CU_MEMHOSTREGISTER_PORTABLE,
        )
    };
    if res == cudarc::driver::sys::CUresult::CUDA_SUCCESS {
        // SAFETY: registered just above.
        unsafe { cudarc::driver::sys::cuMemHostUnregister(at.cast()) };
    }
    assert_eq!(
        res,
        cudarc::driver::sys::CUresult::CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED,
        "an overlapping range"
    );
    assert!(
        matches!(over.register_pinned(dev), Err(pinlane::Error::Driver { error, .. })
            if error.name() == "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED"),
        "pinlane refuses it with the driver's error"
    );
    let many = Tensor::register_pinned_many(&[a.clone(), b.clone()], dev).unwrap();
    // Views of the live registrations (the driver would refuse to register them again):
    // the same memory.
    for (m, r) in many.iter().zip([&ra, &rb]) {
        assert_eq!(m.location(), Location::Pinned);
        assert_eq!(
            m.as_bytes().unwrap().as_ptr(),
            r.as_bytes().unwrap().as_ptr()
        );
    }
    drop((ra, rb, many));
    let whole = Tensor::register_pinned_many(&[a, b, over], dev).unwrap();
    assert!(whole.iter().all(|t| t.location() == Location::Pinned));
}

/// What `host_mapped_in_place` relies on, on the real driver, for memory that another
/// library registered (cudarc here: not on pinlane's registry): an import inside one
/// registration is read in place by the kernel (the driver answers
/// `CU_POINTER_ATTRIBUTE_BUFFER_ID` for registered memory); one across two registrations
/// with an unregistered page between them is copied (read in place, the kernel would
/// fault on the middle page); both land right.
#[test]
fn imports_are_read_in_place_only_within_one_registration_of_the_driver() {
    use cudarc::driver::sys;
    use pinlane::dlpark::ffi::DLDeviceType;
    use pinlane::dlpark::versioned::Dlpack;
    use pinlane::{transfer_tensor_h2d_into, IntoOptions};
    require_gpu!();
    let _serial = config();
    const PAGE: usize = 4096;
    let dev = common::dev();
    let ctx = cudarc::driver::CudaContext::new(dev.ordinal()).unwrap();
    ctx.bind_to_thread().unwrap();
    let mut buf: Vec<u8> = (0..5 * PAGE).map(|i| (i * 13 % 251) as u8).collect();
    let base = buf.as_mut_ptr();
    let o = (base as usize).next_multiple_of(PAGE) - base as usize;
    let at = |k: usize| base.wrapping_add(o + k * PAGE);
    for k in [0, 2] {
        // SAFETY: a page of `buf`, which outlives the registration (ended below); the
        // primary context is current.
        let res = unsafe {
            sys::cuMemHostRegister_v2(
                at(k).cast(),
                PAGE,
                sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP,
            )
        };
        assert_eq!(res, sys::CUresult::CUDA_SUCCESS);
    }
    let claimed = |r: std::ops::Range<usize>| {
        // SAFETY: `buf` outlives every tensor over it and is not written meanwhile.
        let t = unsafe { Tensor::from_host_ptr(buf[r.clone()].as_ptr(), DType::U8, [r.len()], ()) }
            .unwrap();
        let raw = t.to_dlpack().unwrap().into_raw();
        // SAFETY: `raw` is the capsule just made, owned here alone.
        unsafe { (*raw).dl_tensor.device.device_type = DLDeviceType::CUDAHOST };
        // SAFETY: a valid capsule, ownership taken back.
        Tensor::from_dlpack(unsafe { Dlpack::from_raw(raw) }.unwrap()).unwrap()
    };
    for (r, inside) in [
        (o + 256..o + PAGE, true),
        (o + PAGE - 64..o + 2 * PAGE + 64, false),
    ] {
        let src = vec![claimed(r.clone())];
        let zeros = Tensor::from_vec(vec![0u8; r.len()], [r.len()]).unwrap();
        let dst = transfer_tensor_h2d(&vec![zeros]).unwrap();
        transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        let s = pinlane::observe::last_transfer_stats().unwrap();
        assert_eq!(
            s.mapped_bytes,
            if inside { r.len() } else { 0 },
            "{r:?}: {s:?}"
        );
        let back = transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap();
        assert_eq!(back[0].as_bytes().unwrap(), &buf[r.clone()], "{r:?}");
    }
    for k in [0, 2] {
        // SAFETY: registered above; the copies that read it were waited for.
        let res = unsafe { sys::cuMemHostUnregister(at(k).cast()) };
        assert_eq!(res, sys::CUresult::CUDA_SUCCESS);
    }
}

/// What the Python package's H2D relies on to tell large pageable sources from
/// page-locked ones (`pinlane::memory::host_page_locked`), on the real driver: true for
/// pinlane's page-locked memory (a whole tensor and a range inside it) and for memory
/// another library page-locked (cudarc's `cuMemAllocHost`), false for heap memory, no
/// bytes, a range past a page-locked allocation's end and device memory.
#[test]
fn the_driver_tells_page_locked_host_memory_from_pageable_memory() {
    require_gpu!();
    let _g = config();
    let dev = common::dev();
    let locked = |p: *const u8, n: usize| pinlane::memory::host_page_locked(p, n, dev).unwrap();
    let heap = vec![3u8; 1 << 20];
    assert!(!locked(heap.as_ptr(), heap.len()), "heap memory");
    let pinned = Tensor::from_vec(heap.clone(), [1 << 20])
        .unwrap()
        .to_pinned_on(dev)
        .unwrap();
    let p = pinned.as_bytes().unwrap();
    assert!(locked(p.as_ptr(), p.len()), "pinlane's page-locked tensor");
    assert!(
        locked(p[4097..9000].as_ptr(), 9000 - 4097),
        "a range inside it"
    );
    assert!(!locked(p.as_ptr(), 0), "no bytes");
    let ctx = cudarc::driver::CudaContext::new(dev.ordinal()).unwrap();
    ctx.bind_to_thread().unwrap();
    let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: an out-pointer to a live local; freed below.
    let res = unsafe { cudarc::driver::sys::cuMemAllocHost_v2(&mut host, 1 << 16) };
    assert_eq!(res, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    let h = host.cast::<u8>().cast_const();
    assert!(locked(h, 1 << 16), "another library's page-locked memory");
    assert!(!locked(h, 1 << 17), "past its end");
    // SAFETY: allocated just above, used by nothing.
    unsafe { cudarc::driver::sys::cuMemFreeHost(host) };
    let on_device = transfer_tensor_h2d(&pinned).unwrap();
    let s = Stream::new(dev).unwrap();
    let d = on_device.device_ptr(&s).unwrap();
    assert!(
        !locked(d.ptr() as usize as *const u8, 1 << 20),
        "device memory"
    );
}
