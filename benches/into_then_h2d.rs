//! `cargo bench --bench into_then_h2d` (GPU machine), a probe of session 68: does a copy
//! into existing tensors slow the same thread's later blocking small H2D calls? In
//! `async_small` (run 6) the one 1 KiB blocking H2D row took 13.3, 11.9, 13.0, 12.1 us
//! after such a copy and 12.4, 9.4, 9.7, 11.1 without it, one process each.
//!
//! Here, in one process, two threads take turns (never at once), each timing blocks of
//! 500 blocking 1 KiB H2D calls (median per block): thread A never copies into existing
//! tensors; thread B does, once, between its first and second blocks, into its own H2D
//! outputs on its current stream (as `async_small`'s check does), then only H2D. If B's
//! later blocks are slower than A's, the effect is the thread's; if both are, the
//! process's. Then B copies into existing tensors on a stream of its own, and both go on.
//! Run 7 found both threads slower after B's copy into (8.9 to 9.0 us to 10.0), and that
//! copy is the process's first kernel launch (the copy's scatter kernel); so the first
//! step after the fresh blocks is now a D2H of 8 small tensors (the gather kernel) instead,
//! to tell a kernel launch from the copy into. Session 69 ran this second form
//! (`benches/results/issue20_session69/run1`): both threads were slower after the D2H's
//! kernel already, by about 1.1 us, so the kernel launch is the cause;
//! `benches/probes/after_kernel.cu` found which driver calls it slows.
//! Prints µs per call per block; the moved bytes are checked once per configuration.

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_into, D2hOptions, DType, Device,
    IntoOptions, Stream, Tensor,
};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::time::{Duration, Instant};

const CALLS: usize = 500;

fn tensor(seed: u64) -> Tensor {
    let bytes: Vec<u8> = (0..1024u64)
        .map(|i| ((i ^ seed).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) as u8)
        .collect();
    Tensor::from_bytes(DType::F32, [256], &bytes).expect("a host tensor")
}

/// The median of `CALLS` blocking H2D calls of `batch`.
fn block(batch: &Vec<Tensor>) -> Duration {
    let mut v: Vec<Duration> = (0..CALLS)
        .map(|_| {
            let t0 = Instant::now();
            drop(transfer_tensor_h2d(batch).expect("h2d"));
            t0.elapsed()
        })
        .collect();
    v.sort();
    v[v.len() / 2]
}

/// What a thread does when told: time a block, or copy into existing tensors (on its
/// current stream, or on a stream of its own).
enum Step {
    Time,
    GatherD2h,
    IntoCurrent,
    IntoOwnStream,
    Stop,
}

fn worker(seed: u64, steps: Receiver<Step>, done: Sender<Option<Duration>>) {
    let batch = vec![tensor(seed)];
    let on = transfer_tensor_h2d(&batch).expect("h2d");
    assert_eq!(
        transfer_tensor_d2h(&on, &D2hOptions::default()).expect("d2h"),
        batch,
        "the bytes came back changed"
    );
    let own = Stream::new(Device::cuda(0)).expect("a stream");
    // Eight small device tensors: their D2H is one launch of the gather kernel.
    let small: Vec<Tensor> = (0..8).map(|i| tensor(seed + 10 + i)).collect();
    let on_small = transfer_tensor_h2d(&small).expect("h2d");
    for step in steps {
        let out = match step {
            Step::Time => Some(block(&batch)),
            Step::GatherD2h => {
                let back = transfer_tensor_d2h(&on_small, &D2hOptions::default()).expect("d2h");
                assert_eq!(back, small, "the gathered bytes came back changed");
                None
            }
            Step::IntoCurrent | Step::IntoOwnStream => {
                let opts = match step {
                    Step::IntoOwnStream => IntoOptions::default().stream(own.clone()),
                    _ => IntoOptions::default(),
                };
                transfer_tensor_h2d_into(&batch, &on, &opts)
                    .and_then(|t| t.wait())
                    .expect("h2d into");
                if matches!(step, Step::IntoOwnStream) {
                    own.synchronize().expect("sync");
                }
                let back = transfer_tensor_d2h(&on, &D2hOptions::default()).expect("d2h");
                assert_eq!(
                    back, batch,
                    "the copy into existing tensors changed the bytes"
                );
                None
            }
            Step::Stop => break,
        };
        let _ = done.send(out);
    }
}

fn main() {
    if pinlane::driver::available().is_none() {
        eprintln!("into_then_h2d: no CUDA driver here; nothing measured");
        return;
    }
    // PINLANE_* settings (session 69 compares PINLANE_SMALL_DEVICE_BLOCKS=0 with the
    // default).
    if let Err(e) = pinlane::Config::from_env().and_then(pinlane::Config::install) {
        eprintln!("into_then_h2d: {e}");
        return;
    }
    let spawn = |seed| {
        let (tx, rx) = channel();
        let (dtx, drx) = channel();
        let h = std::thread::spawn(move || worker(seed, rx, dtx));
        (tx, drx, h)
    };
    let (a, a_done, ha) = spawn(1);
    let (b, b_done, hb) = spawn(2);
    let ask = |tx: &Sender<Step>, rx: &Receiver<Option<Duration>>, s: Step| {
        tx.send(s).expect("send");
        rx.recv().expect("recv")
    };
    let row = |label: &str| {
        let mut ta = Vec::new();
        let mut tb = Vec::new();
        for _ in 0..4 {
            ta.push(ask(&a, &a_done, Step::Time).unwrap_or_default());
            tb.push(ask(&b, &b_done, Step::Time).unwrap_or_default());
        }
        let us = |v: &[Duration]| {
            v.iter()
                .map(|d| format!("{:6.2}", d.as_secs_f64() * 1e6))
                .collect::<Vec<_>>()
                .join(" ")
        };
        println!("{label:44} A {}   B {}", us(&ta), us(&tb));
    };
    row("both fresh (us per 1 KiB H2D, blocks of 500)");
    ask(&b, &b_done, Step::GatherD2h);
    row("after B's D2H of 8 small tensors (a kernel)");
    ask(&b, &b_done, Step::IntoCurrent);
    row("after B's copy into, on its current stream");
    row("again");
    ask(&b, &b_done, Step::IntoOwnStream);
    row("after B's copy into, on a stream of its own");
    for tx in [&a, &b] {
        let _ = tx.send(Step::Stop);
    }
    let _ = (ha.join(), hb.join());
}
