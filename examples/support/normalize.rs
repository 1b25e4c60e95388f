//! The kernel step of `examples/inference_server.rs`, shared with the GPU suite
//! (`tests/gpu_interop.rs`): normalise a batch of u8 images, which are pinlane device
//! tensors, to f32 and compute exact per-image statistics with `kernels/normalize.cu`
//! (committed PTX, loaded at run time), writing into device memory that cudarc allocates;
//! then hand that memory to pinlane as external device tensors and copy it to the host.
//!
//! It shows each interop piece once: a cudarc stream borrowed by pinlane
//! (`Stream::from_raw`), lent pointers (`Tensor::device_ptr`), external device memory
//! (`Tensor::from_device_ptr`), and d2h ordered after the kernel (`set_current_stream`).
#![allow(dead_code)]

use cudarc::driver::{result, sys, CudaContext, CudaSlice, CudaStream, DevicePtr};
use pinlane::{set_current_stream, transfer_tensor_d2h, D2hOptions, DType, Device, Tensor};
use std::error::Error;
use std::ffi::CString;
use std::sync::Arc;

/// The kernel, as compiled by kernels/build.sh.
pub const PTX: &str = include_str!("../../kernels/normalize.ptx");

/// Per-channel `x * scale + shift` (ImageNet's mean and deviation), the 4th unused.
pub const SCALE: [f32; 4] = [
    1.0 / (255.0 * 0.229),
    1.0 / (255.0 * 0.224),
    1.0 / (255.0 * 0.225),
    1.0,
];
pub const SHIFT: [f32; 4] = [-0.485 / 0.229, -0.456 / 0.224, -0.406 / 0.225, 0.0];

/// What the kernel computes for one image, the same way on the host: the normalised
/// pixels and `[sum, sum of squares, 255 - min, max]` of the u8 values.
pub fn reference(pixels: &[u8], hw: usize) -> (Vec<f32>, [u64; 4]) {
    let out = pixels
        .iter()
        .enumerate()
        .map(|(i, &x)| {
            let c = (i / hw) & 3;
            // Two separately rounded operations, as the kernel's __fmul_rn/__fadd_rn.
            (x as f32 * SCALE[c]) + SHIFT[c]
        })
        .collect();
    let mut s = [0u64; 4];
    for &x in pixels {
        let x = x as u64;
        s[0] += x;
        s[1] += x * x;
        s[2] = s[2].max(255 - x);
        s[3] = s[3].max(x);
    }
    (out, s)
}

/// One device's kernel: a cudarc context and stream, and the loaded function. Made and
/// used on one thread (a batcher's); not `Send`, as `CUfunction` is a raw pointer.
pub struct Normalizer {
    device: Device,
    /// cudarc's stream, borrowed by pinlane. Declared before `stream`, so it is dropped
    /// first: pinlane never destroys it, cudarc does when `stream` drops.
    pl_stream: pinlane::Stream,
    stream: Arc<CudaStream>,
    func: sys::CUfunction,
    ctx: Arc<CudaContext>,
}

impl Normalizer {
    pub fn new(device: Device) -> Result<Normalizer, Box<dyn Error>> {
        let ctx = CudaContext::new(device.ordinal())?;
        let stream = ctx.new_stream()?;
        ctx.bind_to_thread()?;
        let image = CString::new(PTX)?;
        // SAFETY: a NUL-terminated PTX image; the context is current.
        let module = unsafe { result::module::load_data(image.as_ptr().cast()) }?;
        // SAFETY: `module` was just loaded and is never unloaded (lives for the process).
        let func =
            unsafe { result::module::get_function(module, CString::new("pinlane_normalize")?) }?;
        // SAFETY: a stream of `device`'s primary context (cudarc uses it), kept alive by
        // `stream`, which this struct holds as long as `pl_stream` and every batch
        // pinlane made with it: `run` returns host tensors only.
        let pl_stream = unsafe { pinlane::Stream::from_raw(stream.cu_stream(), device) }?;
        Ok(Normalizer {
            device,
            pl_stream,
            stream,
            func,
            ctx,
        })
    }

    /// The normalised images (f32, same shape) and statistics (u64 `[4]`) of a batch of
    /// `[3, h, w]` u8 device tensors on this device, as host tensors.
    pub fn run(&self, images: &[Tensor]) -> Result<(Vec<Tensor>, Vec<Tensor>), Box<dyn Error>> {
        self.ctx.bind_to_thread()?;
        let n = images.len();
        let numel: Vec<usize> = images.iter().map(Tensor::len).collect();
        let total: usize = numel.iter().sum();
        // Output memory from another library: cudarc, on its stream.
        let out: CudaSlice<f32> = self.stream.alloc_zeros(total.max(1))?;
        let stats: CudaSlice<u64> = self.stream.alloc_zeros(4 * n.max(1))?;
        let (out_base, out_sync) = out.device_ptr(&self.stream);
        let (stats_base, stats_sync) = stats.device_ptr(&self.stream);
        drop((out_sync, stats_sync));

        // The job table: each image's pointer (lent by pinlane for this stream) and where
        // its results go.
        let guards = images
            .iter()
            .map(|t| t.device_ptr(&self.pl_stream))
            .collect::<pinlane::Result<Vec<_>>>()?;
        let mut table = Vec::with_capacity(5 * n);
        let mut at = 0u64;
        for (k, (g, t)) in guards.iter().zip(images).enumerate() {
            let hw = (t.dims()[1] * t.dims()[2]) as u64;
            table.extend([
                g.ptr(),
                out_base + 4 * at,
                stats_base + 32 * k as u64,
                hw,
                3,
            ]);
            at += numel[k] as u64;
        }
        let jobs: CudaSlice<u64> = self.stream.clone_htod(&table)?;
        let (jobs_ptr, jobs_sync) = jobs.device_ptr(&self.stream);
        let largest = numel.iter().copied().max().unwrap_or(0);
        let blocks_x = largest.div_ceil(256 * 8).clamp(1, 1024) as u32;
        let mut jobs_arg = jobs_ptr;
        let mut affine = [SCALE, SHIFT].concat();
        let mut params = [
            (&mut jobs_arg as *mut u64).cast(),
            affine.as_mut_ptr().cast::<std::ffi::c_void>(),
        ];
        if n > 0 {
            // SAFETY: the function takes (const ImageJob*, Affine{float[4], float[4]}),
            // which `params` points to (read at launch); the job table and outputs are
            // cudarc allocations alive until after the d2h below, ordered on this stream;
            // the inputs are kept by pinlane until the lent-pointer uses recorded on drop
            // of `guards` have run.
            unsafe {
                result::launch_kernel(
                    self.func,
                    (blocks_x, n as u32, 1),
                    (256, 1, 1),
                    0,
                    self.stream.cu_stream(),
                    &mut params,
                )
            }?;
        }
        drop(jobs_sync);
        drop(guards); // the inputs may be freed only after the kernel has read them

        // The outputs, as pinlane tensors over cudarc's memory.
        let out = Arc::new(out);
        let stats = Arc::new(stats);
        let mut outs = Vec::with_capacity(n);
        let mut sts = Vec::with_capacity(n);
        let mut at = 0u64;
        for (k, t) in images.iter().enumerate() {
            // SAFETY: inside `out` / `stats` (sizes above), cuda memory of this device,
            // kept allocated by the Arc each tensor owns; written only by the kernel,
            // which d2h below is ordered after (the current stream).
            unsafe {
                outs.push(Tensor::from_device_ptr(
                    out_base + 4 * at,
                    self.device,
                    DType::F32,
                    t.dims().to_vec(),
                    out.clone(),
                )?);
                sts.push(Tensor::from_device_ptr(
                    stats_base + 32 * k as u64,
                    self.device,
                    DType::U64,
                    [4],
                    stats.clone(),
                )?);
            }
            at += numel[k] as u64;
        }
        let back = {
            let _current = set_current_stream(&self.pl_stream);
            transfer_tensor_d2h(&(outs, sts), &D2hOptions::default().device(self.device))?
        };
        drop(jobs); // the kernel has run: d2h waited for it
        Ok(back)
    }
}

/// Checks one image's results against [`reference`]; `Err` says what differs.
pub fn check(image: &Tensor, out: &Tensor, stats: &Tensor) -> Result<(), String> {
    let px = image.as_bytes().map_err(|e| e.to_string())?;
    let hw = image.dims()[1] * image.dims()[2];
    let (want, want_stats) = reference(px, hw);
    let got = out.to_vec::<f32>().map_err(|e| e.to_string())?;
    let got_stats = stats.to_vec::<u64>().map_err(|e| e.to_string())?;
    if got_stats != want_stats {
        return Err(format!("stats {got_stats:?}, expected {want_stats:?}"));
    }
    if let Some(i) = (0..want.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        return Err(format!("pixel {i}: {} vs {}", got[i], want[i]));
    }
    Ok(())
}
