//! Registering long-lived host memory (`Tensor::register_pinned`) on the simulated
//! device: page-locked in place with no copy, then moved by one direct copy;
//! unregistered when the last tensor over it drops (the same memory can be registered
//! again), refused while a registration of it is alive.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, Device, Error, Location, Tensor,
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
    let pinned: Vec<Tensor> = host
        .iter()
        .map(|t| t.register_pinned(D0).unwrap())
        .collect();
    let on = transfer_tensor_h2d(&pinned).unwrap();
    let s = pinlane::observe::last_transfer_stats().unwrap();
    let total: usize = host.iter().map(Tensor::nbytes).sum();
    assert_eq!((s.mapped_bytes, s.staged_bytes), (total, 0), "{s:?}");
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(),
        host
    );
}
