//! GPU: interop with another library (cudarc) on the real device: its streams as
//! pinlane's consumer, current and copy streams, its memory handed to d2h, the example's
//! kernel reading pinlane's outputs, DLPack, and one process driving every GPU at once.
//! Every test takes its device from LOCAL_RANK.

mod common;

#[path = "../examples/support/normalize.rs"]
mod normalize;

use cudarc::driver::{CudaContext, DevicePtr};
use pinlane::{
    set_current_stream, transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_with,
    D2hOptions, DType, Device, H2dOptions, Stream, Tensor,
};

#[test]
fn a_cudarc_stream_is_pinlanes_consumer_current_and_copy_stream() {
    require_gpu!();
    let dev = common::dev();
    let ctx = CudaContext::new(dev.ordinal()).unwrap();
    let theirs = ctx.new_stream().unwrap();
    // SAFETY: a live stream of the device's primary context, alive for the whole test
    // (the batches that name it as consumer are dropped before it, num_caches 0).
    let s = unsafe { Stream::from_raw(theirs.cu_stream(), dev) }.unwrap();
    let b = vec![
        common::tensor(DType::F32, &[3 << 20], 1),
        common::tensor(DType::U8, &[1000], 2),
    ];
    let opts = H2dOptions::default()
        .consumer_stream(s.clone())
        .num_caches(0);
    let on = transfer_tensor_h2d_with(&b, &opts).unwrap();
    {
        let _current = set_current_stream(&s);
        assert_eq!(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(), b);
    }
    let copy_on_theirs = D2hOptions::default().device(dev).stream(s.clone());
    assert_eq!(transfer_tensor_d2h(&on, &copy_on_theirs).unwrap(), b);
    drop(on);
    drop(s);
    theirs.synchronize().unwrap(); // still alive: pinlane did not destroy it
}

#[test]
fn cudarc_device_memory_goes_through_d2h_without_a_copy_in() {
    require_gpu!();
    let dev = common::dev();
    let ctx = CudaContext::new(dev.ordinal()).unwrap();
    let stream = ctx.new_stream().unwrap();
    let want = common::pattern(5 << 20, 7);
    let slice = stream.clone_htod(&want).unwrap(); // produced on cudarc's stream
    let (ptr, sync) = slice.device_ptr(&stream);
    drop(sync);
    // SAFETY: `slice` is 5 MiB of this device's memory, kept by the tensor; produced on
    // `stream`, which d2h waits for (current stream below).
    let t = unsafe { Tensor::from_device_ptr(ptr, dev, DType::U8, [5 << 20], slice) }.unwrap();
    // SAFETY: as above.
    let s = unsafe { Stream::from_raw(stream.cu_stream(), dev) }.unwrap();
    let back = {
        let _current = set_current_stream(&s);
        transfer_tensor_d2h(&t, &D2hOptions::default()).unwrap()
    };
    assert_eq!(back.as_bytes().unwrap(), &want[..]);
    drop(t); // drops the CudaSlice (frees on cudarc's stream)
}

#[test]
fn the_examples_kernel_reads_pinlanes_outputs() {
    require_gpu!();
    let dev = common::dev();
    let images: Vec<Tensor> = (0..24)
        .map(|i| {
            let (h, w) = (17 + i * 13, 40 + i * 7);
            Tensor::from_vec(common::pattern(3 * h * w, i as u64), [3, h, w]).unwrap()
        })
        .collect();
    let k = normalize::Normalizer::new(dev).unwrap();
    for round in 0..3 {
        let on = transfer_tensor_h2d(&images).unwrap();
        let (outs, stats) = k.run(&on).unwrap();
        drop(on); // freed after the kernel's recorded use
        for (i, img) in images.iter().enumerate() {
            normalize::check(img, &outs[i], &stats[i])
                .unwrap_or_else(|e| panic!("round {round} image {i}: {e}"));
        }
    }
}

#[test]
fn dlpack_exports_of_device_tensors_read_back() {
    require_gpu!();
    let dev = common::dev();
    let t = common::tensor(DType::Bf16, &[64, 33], 5);
    let on = transfer_tensor_h2d(&t).unwrap();
    let s = Stream::new(dev).unwrap();
    let back = Tensor::from_dlpack(on.to_dlpack_on(&s).unwrap()).unwrap();
    drop(on);
    assert_eq!(back.device(), Some(dev));
    assert_eq!(
        transfer_tensor_d2h(&back, &D2hOptions::default()).unwrap(),
        t
    );
    let pinned = t.to_pinned_on(dev).unwrap();
    let back = Tensor::from_dlpack(pinned.to_dlpack().unwrap()).unwrap();
    assert_eq!(back.location(), pinlane::Location::Pinned);
    assert_eq!(back, t);
}

#[test]
fn one_process_drives_every_gpu_at_once() {
    require_gpu!();
    let devices: Vec<Device> = Device::all().collect();
    eprintln!("driving {} GPU(s) at once", devices.len());
    std::thread::scope(|sc| {
        for &d in &devices {
            sc.spawn(move || {
                let b: Vec<Tensor> = (0..8)
                    .map(|i| common::tensor(DType::F32, &[2 << 20], d.ordinal() as u64 * 100 + i))
                    .collect();
                for _ in 0..10 {
                    let on =
                        transfer_tensor_h2d_with(&b, &H2dOptions::default().device(d)).unwrap();
                    assert!(on.iter().all(|t| t.device() == Some(d)));
                    let back = transfer_tensor_d2h(&on, &D2hOptions::default().device(d)).unwrap();
                    assert_eq!(back, b, "{d}");
                }
            });
        }
    });
}
