//! An inference server's data path, end to end, on every GPU of the machine:
//!
//! * client threads send requests (u8 images, 3 x h x w, sizes varying) and wait for the
//!   answer;
//! * one batcher thread per GPU groups requests (up to 32, or what arrived within 2 ms);
//! * `transfer_tensor_h2d` moves the batch to its GPU;
//! * a CUDA kernel (`kernels/normalize.cu`, PTX loaded at run time) normalises each image
//!   to f32 and computes its statistics, reading pinlane's device tensors through lent
//!   pointers and writing into device memory cudarc allocates;
//! * that memory goes back through `transfer_tensor_d2h` as external device tensors;
//! * each client checks its answer against the same computation on the CPU.
//!
//! Prints requests/s and p50/p99 latency. Without a GPU it says so and exits 0.
//!
//! `cargo run --release --example inference_server [-- REQUESTS_PER_CLIENT]`

#[path = "support/normalize.rs"]
mod normalize;

use pinlane::{transfer_tensor_h2d_with, Device, H2dOptions, Tensor};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 8;
const MAX_BATCH: usize = 32;
const WAIT: Duration = Duration::from_millis(2);

struct Request {
    image: Tensor,
    reply: mpsc::Sender<Result<(Tensor, Tensor), String>>,
}

/// A u8 image of 3 x h x w whose pixels depend on `seed`.
fn image(seed: u64) -> Tensor {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let (h, w) = (32 + (next() % 225) as usize, 32 + (next() % 225) as usize);
    let px: Vec<u8> = (0..3 * h * w).map(|_| (next() >> 24) as u8).collect();
    Tensor::from_vec(px, [3, h, w]).expect("shape matches")
}

/// One GPU's batcher: groups requests, runs the data path, answers each request.
fn batcher(device: Device, rx: mpsc::Receiver<Request>) -> Result<usize, String> {
    let kernel = normalize::Normalizer::new(device).map_err(|e| format!("{device}: {e}"))?;
    let opts = H2dOptions::default().device(device);
    let mut batches = 0;
    while let Ok(first) = rx.recv() {
        let mut reqs = vec![first];
        let deadline = Instant::now() + WAIT;
        while reqs.len() < MAX_BATCH {
            match rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
                Ok(r) => reqs.push(r),
                Err(_) => break,
            }
        }
        let images: Vec<Tensor> = reqs.iter().map(|r| r.image.clone()).collect();
        let result = transfer_tensor_h2d_with(&images, &opts)
            .map_err(|e| e.to_string())
            .and_then(|on_gpu| kernel.run(&on_gpu).map_err(|e| e.to_string()));
        match result {
            Ok((outs, stats)) => {
                for ((r, o), s) in reqs.into_iter().zip(outs).zip(stats) {
                    let _ = r.reply.send(Ok((o, s)));
                }
            }
            Err(e) => {
                for r in reqs {
                    let _ = r.reply.send(Err(e.clone()));
                }
            }
        }
        batches += 1;
    }
    Ok(batches)
}

fn main() {
    let per_client: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let devices: Vec<Device> = Device::all().collect();
    if devices.is_empty() {
        println!(
            "inference_server: no usable CUDA GPU here ({}); nothing to serve.",
            pinlane::driver::unavailable_reason().unwrap_or("unknown reason")
        );
        return;
    }
    println!(
        "inference_server: {} GPU(s) ({}), {CLIENTS} clients x {per_client} requests",
        devices.len(),
        devices
            .iter()
            .map(Device::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut senders = Vec::new();
    let mut batchers = Vec::new();
    for &d in &devices {
        let (tx, rx) = mpsc::channel();
        senders.push(tx);
        batchers.push(std::thread::spawn(move || batcher(d, rx)));
    }
    let t0 = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let senders = senders.clone();
            std::thread::spawn(move || -> Result<Vec<Duration>, String> {
                let mut lat = Vec::with_capacity(per_client);
                for i in 0..per_client {
                    let img = image((c * 1_000_003 + i) as u64);
                    let (reply, answer) = mpsc::channel();
                    let sent = Instant::now();
                    senders[(c + i) % senders.len()]
                        .send(Request {
                            image: img.clone(),
                            reply,
                        })
                        .map_err(|_| "batcher gone".to_string())?;
                    let (out, stats) = answer.recv().map_err(|_| "no answer".to_string())??;
                    lat.push(sent.elapsed());
                    normalize::check(&img, &out, &stats)
                        .map_err(|e| format!("client {c} request {i}: wrong answer: {e}"))?;
                }
                Ok(lat)
            })
        })
        .collect();
    drop(senders);
    let mut lat = Vec::new();
    let mut failed = false;
    for c in clients {
        match c.join().expect("client thread") {
            Ok(l) => lat.extend(l),
            Err(e) => {
                eprintln!("{e}");
                failed = true;
            }
        }
    }
    let wall = t0.elapsed();
    for (d, b) in devices.iter().zip(batchers) {
        match b.join().expect("batcher thread") {
            Ok(n) => println!("  {d}: {n} batches"),
            Err(e) => {
                eprintln!("{d}: {e}");
                failed = true;
            }
        }
    }
    if failed || lat.is_empty() {
        eprintln!("inference_server: FAILED");
        std::process::exit(1);
    }
    lat.sort();
    let pct = |p: f64| lat[((lat.len() - 1) as f64 * p) as usize];
    println!(
        "inference_server: {} requests, every answer checked against the CPU: {:.0} requests/s, p50 {:.2} ms, p99 {:.2} ms",
        lat.len(),
        lat.len() as f64 / wall.as_secs_f64(),
        pct(0.50).as_secs_f64() * 1e3,
        pct(0.99).as_secs_f64() * 1e3
    );
}
