//! `cargo bench --bench async_small [-- --json PATH] [--no-into]` (GPU machine): small
//! batches through the non-blocking calls (`transfer_tensor_h2d_async` / `_d2h_async`,
//! then `wait`), beside the blocking calls in the same process: what a call's hand-over
//! to the completion thread (its event, its wake-up, the thread's answer) costs where the
//! copy itself is tiny. Session 67 moved the wake-up (a host function) from the call's
//! stream to a wake stream of pinlane's, which adds a `cuStreamWaitEvent` to every
//! non-blocking call. Session 68: `wait` asks the event for up to `Config::spin` and
//! finishes the call itself; the row "H2D into + wait" (a copy into existing tensors,
//! whose wake-up is queued only at the wait) was added then, with its check before the
//! rows (`--no-into` leaves both out).
//!
//! One thread, pageable f32 sources (staged), default options (the thread's own streams),
//! page-locked outputs. For each batch: one checked round trip (every byte compared),
//! warm-up calls, then the median of 2000 timed whole calls (the non-blocking ones timed
//! from the call to the end of `wait`). Prints GB/s, the fraction of the pinned-memory
//! limit measured in this same process, and µs per batch; writes the same as JSON.

use pinlane::memory::measure_pinned_limits;
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_d2h_async, transfer_tensor_h2d, transfer_tensor_h2d_async,
    transfer_tensor_h2d_into, D2hOptions, DType, Device, H2dOptions, IntoOptions, Tensor,
};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const REPS: usize = 2000;
const WARMUPS: usize = 50;

fn tensor(n: usize, seed: u64) -> Tensor {
    let bytes: Vec<u8> = (0..n * 4)
        .map(|i| {
            (i as u64 ^ seed)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .to_le_bytes()[7]
        })
        .collect();
    Tensor::from_bytes(DType::F32, [n], &bytes).expect("a host tensor")
}

/// The median of `REPS` timed calls of `f`, after `WARMUPS` untimed ones.
fn median(mut f: impl FnMut()) -> Duration {
    for _ in 0..WARMUPS {
        f();
    }
    let mut v: Vec<Duration> = (0..REPS)
        .map(|_| {
            let t0 = Instant::now();
            f();
            t0.elapsed()
        })
        .collect();
    v.sort();
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let json = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1).cloned());
    // `--no-into`: without the copy into existing tensors (its check and its row), as the
    // bench was before session 68.
    let into = !args.iter().any(|a| a == "--no-into");
    if pinlane::driver::available().is_none() {
        eprintln!("async_small: no CUDA driver here; nothing measured");
        return;
    }
    let dev = Device::cuda(0);
    let limits = measure_pinned_limits(dev, 256 << 20, 5).expect("the pinned limits");
    println!(
        "pinned limit: H2D {:.1} GB/s, D2H {:.1} GB/s",
        limits.h2d, limits.d2h
    );
    let mut out = String::from("[");
    for (name, count) in [("one 1 KiB f32", 1), ("64 x 1 KiB f32", 64)] {
        let batch: Vec<Tensor> = (0..count).map(|i| tensor(256, i as u64)).collect();
        let bytes = count * 1024;
        // Checked once: the round trip through both non-blocking calls.
        let on = transfer_tensor_h2d_async(&batch, &H2dOptions::default())
            .and_then(|t| t.wait())
            .expect("h2d");
        let back = transfer_tensor_d2h_async(&on, &D2hOptions::default())
            .and_then(|t| t.wait())
            .expect("d2h");
        assert_eq!(back, batch, "{name}: the bytes came back changed");
        if into {
            // The copy into existing tensors (the batch's own device tensors) checked too.
            transfer_tensor_h2d_into(&batch, &on, &IntoOptions::default())
                .and_then(|t| t.wait())
                .expect("h2d into");
            let again = transfer_tensor_d2h(&on, &D2hOptions::default()).expect("d2h");
            assert_eq!(
                again, batch,
                "{name}: the copy into existing tensors changed the bytes"
            );
        }
        let rows = [
            (
                "H2D blocking",
                median(|| drop(transfer_tensor_h2d(&batch).expect("h2d"))),
                limits.h2d,
            ),
            (
                "H2D non-blocking + wait",
                median(|| {
                    let t = transfer_tensor_h2d_async(&batch, &H2dOptions::default());
                    drop(t.and_then(|t| t.wait()).expect("h2d"))
                }),
                limits.h2d,
            ),
            (
                "H2D into + wait",
                if into {
                    median(|| {
                        let t = transfer_tensor_h2d_into(&batch, &on, &IntoOptions::default());
                        t.and_then(|t| t.wait()).expect("h2d into")
                    })
                } else {
                    Duration::ZERO // not measured (`--no-into`)
                },
                limits.h2d,
            ),
            (
                "D2H blocking",
                median(|| drop(transfer_tensor_d2h(&on, &D2hOptions::default()).expect("d2h"))),
                limits.d2h,
            ),
            (
                "D2H non-blocking + wait",
                median(|| {
                    let t = transfer_tensor_d2h_async(&on, &D2hOptions::default());
                    drop(t.and_then(|t| t.wait()).expect("d2h"))
                }),
                limits.d2h,
            ),
        ];
        for (way, t, limit) in rows {
            if t.is_zero() {
                continue;
            }
            let gbs = bytes as f64 / t.as_secs_f64() / 1e9;
            let us = t.as_secs_f64() * 1e6;
            println!(
                "{name:16} {way:24} {us:9.1} us  {gbs:7.3} GB/s  {:.4} of the limit",
                gbs / limit
            );
            let sep = if out.len() > 1 { "," } else { "" };
            let _ = write!(
                out,
                "{sep}{{\"batch\":\"{name}\",\"way\":\"{way}\",\"us\":{us:.2},\
                 \"gbs\":{gbs:.4},\"limit_gbs\":{limit:.2}}}"
            );
        }
    }
    out.push(']');
    if let Some(path) = json {
        std::fs::write(&path, out).expect("write the JSON");
    }
}
