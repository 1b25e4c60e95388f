//! Registering long-lived host memory (`Tensor::register_pinned`) on the simulated
//! device: page-locked in place with no copy, then moved by one direct copy;
//! unregistered when the last tensor over it drops (the same memory can be registered
//! again), refused while a registration of it is alive.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_into, D2hOptions, DType, Device,
    Error, IntoOptions, Location, Tensor,
};

const D0: Device = Device::cuda(0);

#[test]
fn registered_memory_is_moved_directly_and_unregistered_with_its_last_tensor() {
    common::sim();
    let table = common::tensor(DType::F32, &[512, 256], 3); // 512 KiB
    let pinned = table.register_pinned(D0).unwrap();
    assert_eq!(pinned.location(), Location::Pinned);
    assert_eq!(pinned, table, "same bytes");
    assert_eq!(
        pinned.as_bytes().unwrap().as_ptr(),
        table.as_bytes().unwrap().as_ptr(),
        "no copy: the same memory"
    );
    for _ in 0..3 {
        let on = transfer_tensor_h2d(&vec![pinned.clone()]).unwrap();
        let s = pinlane::observe::last_transfer_stats().unwrap();
        assert_eq!((s.direct_bytes, s.staged_bytes), (512 << 10, 0), "{s:?}");
        assert_eq!(
            transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
            vec![table.clone()]
        );
    }
    // While registered, registering the same memory again is the driver's error.
    match table.register_pinned(D0) {
        Err(Error::Driver { error, .. }) => {
            assert_eq!(error.name(), "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED");
        }
        other => panic!("expected the driver's refusal, got {other:?}"),
    }
    let clone = pinned.clone();
    drop(pinned);
    assert!(
        table.register_pinned(D0).is_err(),
        "a clone still holds the registration"
    );
    drop(clone);
    // Unregistered with the last tensor: the memory can be registered again.
    let again = table.register_pinned(D0).unwrap();
    assert_eq!(again, table);
}

#[test]
fn page_locked_empty_and_device_tensors() {
    common::sim();
    let p = common::tensor(DType::U8, &[1000], 5).to_pinned().unwrap();
    assert!(
        p.register_pinned(D0).unwrap().same_storage(&p),
        "already page-locked"
    );
    let empty = Tensor::from_vec(Vec::<f64>::new(), [0, 4]).unwrap();
    assert_eq!(empty.register_pinned(D0).unwrap(), empty);
    let on = transfer_tensor_h2d(&vec![common::tensor(DType::U8, &[10], 6)]).unwrap();
    assert!(matches!(
        on[0].register_pinned(D0),
        Err(Error::NotOnHost { .. })
    ));
    assert!(matches!(
        common::tensor(DType::U8, &[10], 7).register_pinned(Device::cuda(9)),
        Err(Error::DeviceUnavailable { .. })
    ));
}

#[test]
fn many_small_registered_tensors_are_read_by_the_kernel() {
    common::sim();
    // The simulated kernel reads registered memory only if it was registered
    // device-mapped, as on a real device.
    let host: Vec<Tensor> = (0..6)
        .map(|i| common::tensor(DType::F64, &[1000 + i], 40 + i as u64))
        .collect();
    // Side by side in the heap, they may share pages: registered together.
    let pinned = Tensor::register_pinned_many(&host, D0).unwrap();
    let on = transfer_tensor_h2d(&pinned).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    let total: usize = host.iter().map(Tensor::nbytes).sum();
    assert_eq!((s.mapped_bytes, s.staged_bytes), (total, 0), "{s:?}");
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        host
    );
}

/// Bytes of one shared buffer: tensors over parts of it share its pages.
struct Part(std::sync::Arc<Vec<u8>>, std::ops::Range<usize>);

impl AsRef<[u8]> for Part {
    fn as_ref(&self) -> &[u8] {
        &self.0[self.1.clone()]
    }
}

#[test]
fn tensors_sharing_pages_are_registered_together() {
    common::sim();
    const PAGE: usize = 4096;
    let buf = std::sync::Arc::new(
        (0..4 * PAGE)
            .map(|i| (i * 7 % 251) as u8)
            .collect::<Vec<u8>>(),
    );
    let base = buf.as_ptr() as usize;
    let o = base.next_multiple_of(PAGE) - base; // the first page boundary in the buffer
                                                // Two parts in one page, a third from that page into the next, a fourth two pages on.
    let ranges = [
        o..o + 100,
        o + 200..o + 300,
        o + 304..o + PAGE + 48,
        o + 2 * PAGE + 8..o + 2 * PAGE + 64,
    ];
    let parts: Vec<Tensor> = ranges
        .iter()
        .map(|r| Tensor::from_owner(Part(buf.clone(), r.clone()), DType::U8, [r.len()]).unwrap())
        .collect();
    let pinned = Tensor::register_pinned_many(&parts, D0).unwrap();
    for (p, t) in pinned.iter().zip(&parts) {
        assert_eq!(p.location(), Location::Pinned);
        assert_eq!(
            p.as_bytes().unwrap().as_ptr(),
            t.as_bytes().unwrap().as_ptr(),
            "no copy"
        );
        assert_eq!(p, t);
    }
    // One registration for the first three (they share pages), one for the fourth.
    assert!(pinned[0].same_allocation(&pinned[2]) && !pinned[0].same_allocation(&pinned[3]));
    // Registering them again, alone or together, gives views of the live registrations
    // (the driver would refuse a second registration of their bytes): the same memory.
    let again = Tensor::register_pinned_many(&[parts[1].clone(), parts[3].clone()], D0).unwrap();
    for (a, p) in again.iter().zip([&pinned[1], &pinned[3]]) {
        assert_eq!(a.location(), Location::Pinned);
        assert_eq!(
            a.as_bytes().unwrap().as_ptr(),
            p.as_bytes().unwrap().as_ptr()
        );
    }
    // Page-locked and empty tensors come back as they are; device tensors are refused.
    let empty = Tensor::from_vec(Vec::<u8>::new(), [0]).unwrap();
    let same = Tensor::register_pinned_many(&[pinned[0].clone(), empty.clone()], D0).unwrap();
    assert!(same[0].same_storage(&pinned[0]) && same[1] == empty);
    let on = transfer_tensor_h2d(&pinned).unwrap();
    assert!(matches!(
        Tensor::register_pinned_many(&[on[0].clone()], D0),
        Err(Error::NotOnHost { .. })
    ));
    // The kernel reads them in place.
    let s = pinlane::observe::last_transfer_stats().unwrap();
    let total: usize = parts.iter().map(Tensor::nbytes).sum();
    assert_eq!((s.mapped_bytes, s.staged_bytes), (total, 0), "{s:?}");
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        parts
    );
    // A registration lasts while any tensor over it does, the views taken again included.
    let refused = |r: pinlane::Result<Tensor>| {
        matches!(r, Err(Error::Driver { error, .. })
            if error.name() == "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED")
    };
    drop((pinned, same, on));
    assert!(refused(parts[1].register_pinned(D0)), "`again` holds it");
    drop(again);
    assert!(parts[1].register_pinned(D0).is_ok());
}

#[test]
fn an_import_of_registered_memory_keeps_the_registration() {
    use pinlane::dlpark::ffi::DLDeviceType;
    use pinlane::dlpark::versioned::Dlpack;
    common::sim();
    // As from torch: a tensor whose memory pinlane registered (is_pinned() says true)
    // comes back through DLPack as kDLCUDAHost. The import keeps the registration alive,
    // so the device may read it in place after the registered tensors are gone.
    let host = common::tensor(DType::F32, &[3000], 77);
    let registered = Tensor::register_pinned_many(std::slice::from_ref(&host), D0).unwrap();
    let raw = host.to_dlpack().unwrap().into_raw();
    // SAFETY: `raw` is the capsule just made, owned here alone.
    unsafe { (*raw).dl_tensor.device.device_type = DLDeviceType::CUDAHOST };
    // SAFETY: a valid capsule, ownership taken back.
    let import = Tensor::from_dlpack(unsafe { Dlpack::from_raw(raw) }.unwrap()).unwrap();
    drop(registered);
    let refused = |t: &Tensor| {
        matches!(t.register_pinned(D0), Err(Error::Driver { error, .. })
            if error.name() == "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED")
    };
    assert!(refused(&host), "the import holds the registration");
    // Read in place by transfer_tensor_h2d_into's kernel.
    let dst = transfer_tensor_h2d(&vec![
        Tensor::from_vec(vec![0f32; 3000], [3000]).unwrap();
        2
    ])
    .unwrap();
    transfer_tensor_h2d_into(&vec![import.clone(); 2], &dst, &IntoOptions::default())
        .unwrap()
        .wait()
        .unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    assert_eq!(
        (s.mapped_bytes, s.copies),
        (2 * 12_000, 1),
        "read in place: {s:?}"
    );
    assert_eq!(
        transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap(),
        vec![host.clone(); 2]
    );
    drop((import, dst));
    assert!(host.register_pinned(D0).is_ok(), "gone with the import");
}

/// An owner whose drops are counted.
struct Counted(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Three pages of bytes at a page boundary, kept for the whole test (the tensors over it
/// are given their own owners, whose drops are what the tests watch).
fn page_aligned(pages: usize) -> (Vec<u8>, usize) {
    const PAGE: usize = 4096;
    let buf: Vec<u8> = (0..(pages + 1) * PAGE)
        .map(|i| (i * 13 % 251) as u8)
        .collect();
    let o = (buf.as_ptr() as usize).next_multiple_of(PAGE) - buf.as_ptr() as usize;
    (buf, o)
}

/// A u8 tensor over `buf[r]` owned by `owner` (the buffer outlives it).
fn over<O: Send + Sync + 'static>(buf: &[u8], r: std::ops::Range<usize>, owner: O) -> Tensor {
    // SAFETY: the test keeps `buf` alive and unwritten past every tensor over it.
    unsafe { Tensor::from_host_ptr(buf[r.clone()].as_ptr(), DType::U8, [r.len()], owner) }.unwrap()
}

/// A group's registration takes in the bytes between its buffers, which may belong to
/// another allocation: registered later, that allocation's tensor becomes a view of the
/// group's registration, and the view must keep that allocation's own owner alive (the
/// registration holds only its members').
#[test]
fn a_view_of_a_live_registration_keeps_its_own_owner() {
    use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
    use std::sync::Arc;
    common::sim();
    let (buf, o) = page_aligned(1);
    let drops = Arc::new(AtomicUsize::new(0));
    let (a, b) = (
        over(&buf, o..o + 100, ()),
        over(&buf, o + 3000..o + 3100, ()),
    );
    // Between a and b on their page: another allocation's bytes.
    let c = over(&buf, o + 1000..o + 1100, Counted(drops.clone()));
    let group = Tensor::register_pinned_many(&[a.clone(), b.clone()], D0).unwrap();
    drop((a, b));
    let view = Tensor::register_pinned_many(std::slice::from_ref(&c), D0).unwrap();
    assert_eq!(view[0].location(), Location::Pinned);
    assert_eq!(view[0], c);
    drop(c);
    assert_eq!(drops.load(SeqCst), 0, "the view holds c's owner");
    drop(group);
    assert_eq!(drops.load(SeqCst), 0, "and the registration");
    let on = transfer_tensor_h2d(&view).unwrap();
    let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
    assert_eq!(back[0].as_bytes().unwrap(), &buf[o + 1000..o + 1100]);
    let refused = |t: &Tensor| {
        matches!(t.register_pinned(D0), Err(Error::Driver { error, .. })
            if error.name() == "CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED")
    };
    let whole = over(&buf, o..o + 4096, ());
    assert!(refused(&whole), "the view keeps the group's registration");
    drop((view, on, back));
    assert_eq!(drops.load(SeqCst), 1, "dropped once, with the view");
    assert!(
        whole.register_pinned(D0).is_ok(),
        "and the registration ended"
    );
}

/// An import called page-locked that lies across two registrations of pinlane's, with
/// memory nobody registered between them: its first and last bytes are mapped, the
/// middle is not, so the kernel must not read it in place (the simulator fails a kernel
/// that reads unmapped memory); nor an import over part of a registration it does not
/// hold. Both are copied, and land right.
#[test]
fn imports_across_or_around_registrations_are_not_read_in_place() {
    use pinlane::dlpark::ffi::DLDeviceType;
    use pinlane::dlpark::versioned::Dlpack;
    common::sim();
    const PAGE: usize = 4096;
    let (buf, o) = page_aligned(3);
    let first = over(&buf, o..o + PAGE, ()).register_pinned(D0).unwrap();
    let last = over(&buf, o + 2 * PAGE..o + 3 * PAGE, ())
        .register_pinned(D0)
        .unwrap();
    let claimed = |r: std::ops::Range<usize>| {
        let raw = over(&buf, r, ()).to_dlpack().unwrap().into_raw();
        // SAFETY: `raw` is the capsule just made, owned here alone.
        unsafe { (*raw).dl_tensor.device.device_type = DLDeviceType::CUDAHOST };
        // SAFETY: a valid capsule, ownership taken back.
        Tensor::from_dlpack(unsafe { Dlpack::from_raw(raw) }.unwrap()).unwrap()
    };
    for r in [
        o + PAGE - 64..o + 2 * PAGE + 64, // across the unregistered page
        o + PAGE - 64..o + PAGE + 64,     // the end of one, then unregistered memory
        o + 256..o + PAGE,                // inside one: read in place, holding it
    ] {
        let src = vec![claimed(r.clone())];
        let inside = r.end <= o + PAGE;
        // Overlapping registrations it cannot hold, the import is taken as pageable.
        let want = if inside {
            Location::Pinned
        } else {
            Location::Host
        };
        assert_eq!(src[0].location(), want, "{r:?}");
        let dst = transfer_tensor_h2d(&vec![
            Tensor::from_vec(vec![0u8; r.len()], [r.len()]).unwrap()
        ])
        .unwrap();
        for _ in 0..2 {
            transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default())
                .unwrap()
                .wait()
                .unwrap();
            let s = pinlane::observe::last_transfer_stats().unwrap();
            let mapped = if inside { r.len() } else { 0 };
            assert_eq!(s.mapped_bytes, mapped, "{r:?}: {s:?}");
            let back = transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap();
            assert_eq!(back[0].as_bytes().unwrap(), &buf[r.clone()], "{r:?}");
        }
    }
    drop((first, last));
}

/// An import called page-locked whose memory pinlane registers only later (another
/// tensor over it, `register_pinned`): the import does not hold that registration, so the
/// device never reads it in place, neither while the registration lives (the driver then
/// says the memory is mapped) nor after it has ended (reading it in place then would read
/// unmapped memory: the simulator fails such a kernel).
#[test]
fn an_import_is_not_read_in_place_through_a_registration_it_does_not_hold() {
    use pinlane::dlpark::ffi::DLDeviceType;
    use pinlane::dlpark::versioned::Dlpack;
    common::sim();
    let (buf, o) = page_aligned(1);
    let r = o + 256..o + 4096;
    let raw = over(&buf, r.clone(), ()).to_dlpack().unwrap().into_raw();
    // SAFETY: `raw` is the capsule just made, owned here alone.
    unsafe { (*raw).dl_tensor.device.device_type = DLDeviceType::CUDAHOST };
    // SAFETY: a valid capsule, ownership taken back.
    let import = Tensor::from_dlpack(unsafe { Dlpack::from_raw(raw) }.unwrap()).unwrap();
    assert_eq!(import.location(), Location::Pinned);
    let src = vec![import];
    let zeros = Tensor::from_vec(vec![0u8; r.len()], [r.len()]).unwrap();
    let dst = transfer_tensor_h2d(&vec![zeros]).unwrap();
    let step = |when: &str| {
        transfer_tensor_h2d_into(&src, &dst, &IntoOptions::default())
            .unwrap()
            .wait()
            .unwrap();
        let s = pinlane::observe::last_transfer_stats().unwrap();
        assert_eq!(s.mapped_bytes, 0, "{when}: {s:?}");
        let back = transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap();
        assert_eq!(back[0].as_bytes().unwrap(), &buf[r.clone()], "{when}");
    };
    let registered = over(&buf, o..o + 4096, ()).register_pinned(D0).unwrap();
    step("the registration live");
    drop(registered);
    step("the registration ended");
}
