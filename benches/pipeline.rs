//! `cargo bench --bench pipeline` (GPU machine): a pipeline of 64 batches of 32 MiB
//! (pageable f32), each used by a GPU kernel that takes about as long as the batch's
//! transfer, with and without the [`Prefetcher`].
//!
//! The kernel stands in for a model step: memsets over a scratch buffer on the consumer's
//! stream, sized in this process so that one takes as long as one batch's transfer. The
//! consumer waits for each kernel before taking the next batch (it uses the result).
//!
//! * serial: transfer (blocking), kernel, wait: about transfer + compute;
//! * prefetched: `Prefetcher` (depth 2) moves the next batches on its worker thread while
//!   the kernel runs: the target is at most 1.15 x max(transfer, compute).
//!
//! Also printed: the consumer thread's CPU time while it waits for batches (it sleeps),
//! and the same for `Transfer::wait` on non-blocking calls. Bytes are checked once.

use cudarc::driver::{result, CudaContext, DevicePtr};
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d_async, transfer_tensor_h2d_with, D2hOptions, Device,
    H2dOptions, Prefetcher, Stream, Tensor,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BATCHES: usize = 64;
const BATCH_BYTES: usize = 32 << 20;
const SOURCES: usize = 8;

/// This thread's CPU time (user + system).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer; CLOCK_THREAD_CPUTIME_ID is always available on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn source(seed: usize) -> Vec<Tensor> {
    let n = BATCH_BYTES / 4;
    let v: Vec<f32> = (0..n)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761) ^ seed as u32) as f32)
        .collect();
    vec![Tensor::from_vec(v, [n]).expect("shape")]
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let Some(_) = pinlane::driver::available() else {
        println!("no CUDA: nothing to measure");
        return Ok(());
    };
    let dev = Device::from_local_rank()?;
    let ctx = CudaContext::new(dev.ordinal())?;
    let compute = ctx.new_stream()?;
    // SAFETY: cudarc's stream, of the device's primary context, alive for all of main.
    let compute_pl = unsafe { Stream::from_raw(compute.cu_stream(), dev) }?;
    // No cache ring: every batch's memory is freed in order on `compute` while it lives
    // (the ring would free its last batches at thread exit, after cudarc destroyed it).
    let opts = H2dOptions::default()
        .device(dev)
        .num_caches(0)
        .consumer_stream(compute_pl.clone());
    let sources: Arc<Vec<Vec<Tensor>>> = Arc::new((0..SOURCES).map(source).collect());
    let batches = || {
        let s = sources.clone();
        (0..BATCHES).map(move |i| s[i % SOURCES].clone())
    };

    // The bytes, once.
    let on = transfer_tensor_h2d_with(&sources[1], &opts)?;
    assert!(
        transfer_tensor_d2h(&on, &D2hOptions::default().device(dev))? == sources[1],
        "the round trip changed bytes"
    );
    drop(on);

    // One batch's transfer, and the kernel sized to match it.
    let mut t = Vec::new();
    for s in sources.iter().cycle().take(16) {
        let t0 = Instant::now();
        drop(transfer_tensor_h2d_with(s, &opts)?);
        t.push(t0.elapsed());
    }
    t.sort();
    let transfer_one = t[t.len() / 2];
    let scratch_bytes = 1usize << 30;
    let scratch = compute.alloc_zeros::<u8>(scratch_bytes)?;
    let (ptr, _keep) = scratch.device_ptr(&compute);
    let memset = |bytes: usize| {
        // SAFETY: `ptr` is `scratch_bytes` >= `bytes` of device memory alive for main.
        unsafe { result::memset_d8_async(ptr, 7, bytes, compute.cu_stream()) }
    };
    let t0 = Instant::now();
    for _ in 0..8 {
        memset(scratch_bytes)?;
    }
    compute.synchronize()?;
    let per_byte = t0.elapsed().as_secs_f64() / (8.0 * scratch_bytes as f64);
    let kernel_bytes = ((transfer_one.as_secs_f64() / per_byte) as usize).max(1 << 20);
    let kernel = || -> Result<(), Box<dyn std::error::Error>> {
        let mut left = kernel_bytes;
        while left > 0 {
            let n = left.min(scratch_bytes);
            memset(n)?;
            left -= n;
        }
        Ok(())
    };

    // Each part alone.
    let t0 = Instant::now();
    for b in batches() {
        drop(transfer_tensor_h2d_with(&b, &opts)?);
    }
    let transfer_total = t0.elapsed();
    let t0 = Instant::now();
    for _ in 0..BATCHES {
        kernel()?;
        compute.synchronize()?;
    }
    let compute_total = t0.elapsed();

    // Serial: transfer, kernel, wait.
    let t0 = Instant::now();
    for b in batches() {
        let on = transfer_tensor_h2d_with(&b, &opts)?;
        kernel()?;
        compute.synchronize()?;
        drop(on);
    }
    let serial = t0.elapsed();

    // Prefetched: the worker moves the next batches while the kernel runs.
    let t0 = Instant::now();
    let mut waiting_cpu = Duration::ZERO;
    let mut waiting = Duration::ZERO;
    let mut p = Prefetcher::new(batches(), 2, opts.clone())?;
    loop {
        let (c0, w0) = (thread_cpu(), Instant::now());
        let Some(on) = p.next() else { break };
        waiting_cpu += thread_cpu() - c0;
        waiting += w0.elapsed();
        let on = on?;
        kernel()?;
        compute.synchronize()?;
        drop(on);
    }
    let prefetched = t0.elapsed();

    // Transfer::wait: non-blocking calls, waited for one by one.
    let mut wait_cpu = Duration::ZERO;
    let mut wait_time = Duration::ZERO;
    for b in batches().take(16) {
        let moving = transfer_tensor_h2d_async(&b, &opts)?;
        let (c0, w0) = (thread_cpu(), Instant::now());
        drop(moving.wait()?);
        wait_cpu += thread_cpu() - c0;
        wait_time += w0.elapsed();
    }

    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let max = transfer_total.max(compute_total);
    println!(
        "{dev}: {BATCHES} batches of {} MiB; one transfer {:.3} ms ({:.1} GB/s), kernel sized to match",
        BATCH_BYTES >> 20,
        ms(transfer_one),
        BATCH_BYTES as f64 / transfer_one.as_secs_f64() / 1e9
    );
    println!(
        "alone: transfers {:.1} ms, kernels {:.1} ms",
        ms(transfer_total),
        ms(compute_total)
    );
    println!(
        "serial:     {:>8.1} ms = {:.2} x max(transfer, compute), {:.2} x their sum",
        ms(serial),
        serial.as_secs_f64() / max.as_secs_f64(),
        serial.as_secs_f64() / (transfer_total + compute_total).as_secs_f64()
    );
    println!(
        "prefetched: {:>8.1} ms = {:.2} x max(transfer, compute) (target <= 1.15)",
        ms(prefetched),
        prefetched.as_secs_f64() / max.as_secs_f64()
    );
    println!(
        "consumer waiting for the prefetcher: {:.1} ms of wall time, {:.2} ms of CPU",
        ms(waiting),
        ms(waiting_cpu)
    );
    println!(
        "Transfer::wait on 16 non-blocking calls: {:.1} ms of wall time, {:.2} ms of CPU",
        ms(wait_time),
        ms(wait_cpu)
    );
    Ok(())
}
