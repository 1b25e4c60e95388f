//! A serving step, as a server that replays CUDA graphs runs it: every step, a handful of
//! small host tensors (token ids, positions, slot mappings, block tables, lengths) are
//! copied into device buffers allocated once (slices of one static buffer), with
//! `transfer_tensor_h2d_into`: one staging copy and one kernel launch for the step.
//!
//! Prints the median step (the copies queued and waited for) against
//! `transfer_tensor_h2d` of the same batch into new memory, where the time of one call
//! goes (`--trace`), and checks the buffers' bytes. Without a GPU it says so and exits 0.
//!
//! `cargo run --release --example serving_step [-- STEPS] [--trace]`

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_into, D2hOptions, Device,
    IntoOptions, Stream, Tensor,
};
use std::time::{Duration, Instant};

/// Byte sizes of the step's tensors: 256 B to 256 KiB.
const SIZES: [usize; 16] = [
    256, 512, 1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072, 262144, 768, 3072, 12288, 49152,
    196608,
];

fn step_inputs(step: u64) -> Vec<Tensor> {
    SIZES
        .iter()
        .enumerate()
        .map(|(k, &n)| {
            let v: Vec<i64> = (0..n as i64 / 8)
                .map(|i| ((step as i64) << 32 | k as i64) ^ i)
                .collect();
            Tensor::from_vec(v, [n / 8]).expect("shape")
        })
        .collect()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> pinlane::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let steps: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(2000);
    let trace = args.iter().any(|a| a == "--trace");
    if pinlane::driver::available().is_none() {
        println!("no GPU: nothing to run");
        return Ok(());
    }
    let dev = Device::cuda(0);
    pinlane::warm_up(dev)?;
    // The static buffers: one allocation, each input a 256-byte-aligned slice of it.
    let total: usize = SIZES.iter().map(|n| n.next_multiple_of(256)).sum();
    let buf = transfer_tensor_h2d(&Tensor::from_vec(vec![0u8; total], [total])?)?;
    let stream = Stream::new(dev)?;
    let guard = buf.device_ptr(&stream)?;
    let base = guard.ptr();
    guard.finish()?;
    let mut at = 0u64;
    let mut statics = Vec::new();
    for &n in &SIZES {
        // SAFETY: `base + at .. + n` lies inside `buf`, which the owner (a clone) keeps
        // allocated; only this program's copies, on `stream`, write it.
        let t = unsafe {
            Tensor::from_device_ptr(base + at, dev, pinlane::DType::I64, [n / 8], buf.clone())
        }?;
        statics.push(t);
        at += n.next_multiple_of(256) as u64;
    }
    let opts = IntoOptions::default().stream(stream.clone());
    let inputs: Vec<Vec<Tensor>> = (0..8).map(step_inputs).collect();
    let mut into = Vec::with_capacity(steps);
    let mut fresh = Vec::with_capacity(steps);
    let mut calls = Vec::with_capacity(steps);
    for s in 0..steps + 50 {
        let x = &inputs[s % inputs.len()];
        let t0 = Instant::now();
        let copying = transfer_tensor_h2d_into(x, &statics, &opts)?;
        let t1 = Instant::now();
        stream.synchronize()?; // the stream's order is what a graph replay would follow
        let t2 = Instant::now();
        copying.wait()?; // errors of the copies (none here); completion is already known
        let out = transfer_tensor_h2d(x)?;
        let t3 = Instant::now();
        drop(out);
        if s >= 50 {
            calls.push(t1 - t0);
            into.push(t2 - t0);
            fresh.push(t3 - t2);
        }
    }
    let bytes: usize = SIZES.iter().sum();
    let (a, b) = (median(into), median(fresh));
    println!(
        "serving step, {} tensors, {} KiB: transfer_tensor_h2d_into {:.1} us (the call {:.1} us; \
         {:.2} GB/s), transfer_tensor_h2d {:.1} us; h2d / into {:.2}x",
        SIZES.len(),
        bytes / 1024,
        a.as_secs_f64() * 1e6,
        median(calls).as_secs_f64() * 1e6,
        bytes as f64 / a.as_secs_f64() / 1e9,
        b.as_secs_f64() * 1e6,
        b.as_secs_f64() / a.as_secs_f64()
    );
    if let Some(s) = pinlane::observe::last_transfer_stats() {
        println!("last call: {s:?}");
    }
    if trace {
        let mut marks: Vec<(&str, Vec<Duration>)> = Vec::new();
        for s in 0..200 {
            pinlane::observe::trace_next_call();
            let copying = transfer_tensor_h2d_into(&inputs[s % inputs.len()], &statics, &opts)?;
            stream.synchronize()?;
            copying.wait()?;
            for (k, (name, d)) in pinlane::observe::last_trace()
                .unwrap_or_default()
                .into_iter()
                .enumerate()
            {
                if marks.len() <= k {
                    marks.push((name, Vec::new()));
                }
                marks[k].1.push(d);
            }
        }
        let line: Vec<String> = marks
            .into_iter()
            .map(|(n, v)| format!("{n} {:.1}", median(v).as_secs_f64() * 1e6))
            .collect();
        println!(
            "one call's marks (us from its start, median of 200): {}",
            line.join(", ")
        );
    }
    // Every byte of the last step, read back in the stream's order.
    let last = &inputs[(steps + 49) % inputs.len()];
    transfer_tensor_h2d_into(last, &statics, &opts)?.wait()?;
    let _current = pinlane::set_current_stream(&stream);
    let back = transfer_tensor_d2h(&statics, &D2hOptions::default())?;
    let ok = back
        .iter()
        .zip(last)
        .all(|(a, b)| a.as_bytes().ok() == b.as_bytes().ok());
    println!("bytes {}", if ok { "ok" } else { "WRONG" });
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
