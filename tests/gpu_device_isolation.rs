//! GPU: a process that works with `cuda:{LOCAL_RANK}` only (h2d, d2h in both output modes,
//! page-locked copies, streams, lent pointers) leaves every other GPU without a context
//! from it, checked with `cuDevicePrimaryCtxGetState`. Its own binary, so no other test
//! touches other devices. On a one-GPU machine there is no other device to check.

mod common;

use cudarc::driver::sys;
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, DType, Device, HostOutput, Stream,
};

/// Whether `device`'s primary context is active (retained by anyone in this process).
fn primary_context_active(device: Device) -> bool {
    let mut dev: sys::CUdevice = 0;
    let (mut flags, mut active) = (0u32, 0i32);
    // SAFETY: out-pointers to live locals; pinlane's probe initialised the driver.
    unsafe {
        assert_eq!(
            sys::cuDeviceGet(&mut dev, device.ordinal() as i32),
            sys::CUresult::CUDA_SUCCESS
        );
        assert_eq!(
            sys::cuDevicePrimaryCtxGetState(dev, &mut flags, &mut active),
            sys::CUresult::CUDA_SUCCESS
        );
    }
    active != 0
}

#[test]
fn no_context_on_a_device_no_call_used() {
    require_gpu!();
    let mine = common::dev();
    let b = vec![
        common::tensor(DType::F32, &[10 << 20], 1),
        common::tensor(DType::U8, &[777], 2),
    ];
    let pinned = b[1].to_pinned().unwrap();
    let on = transfer_tensor_h2d(&(b.clone(), pinned)).unwrap();
    for mode in [HostOutput::Pinned, HostOutput::Pageable] {
        let back = transfer_tensor_d2h(&on, &D2hOptions::default().output(mode)).unwrap();
        assert_eq!(back.0, b);
    }
    let s = Stream::new(mine).unwrap();
    drop(on.0[0].device_ptr(&s).unwrap());
    drop(on);
    s.synchronize().unwrap();
    assert!(
        primary_context_active(mine),
        "the check sees the device in use"
    );
    let others: Vec<Device> = Device::all().filter(|&d| d != mine).collect();
    for &d in &others {
        assert!(
            !primary_context_active(d),
            "{d} has a context, but only {mine} was used"
        );
    }
    eprintln!(
        "{mine} used; no context on {} other device(s): {others:?}",
        others.len()
    );
}
