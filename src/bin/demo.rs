//! `cargo run --release`: moves one mixed batch to the GPU and back, checks every byte,
//! and prints what happened and how fast. Without a GPU it says so and shows the batch
//! coming back unchanged. `cargo run --release -- --simulated` runs the same on pinlane's
//! simulated device instead (no GPU used; its timings say nothing about a GPU).

use pinlane::observe::last_transfer_stats;
use pinlane::{driver, transfer_tensor_d2h, transfer_tensor_h2d, Batch, D2hOptions, Tensor};
use std::time::{Duration, Instant};

#[derive(Batch, Clone, PartialEq, Debug)]
struct Sample {
    images: Vec<Tensor>,
    features: Tensor,
    labels: Tensor,
    #[batch(skip)]
    name: String,
}

fn pattern(n: usize, seed: u32) -> Vec<u8> {
    (0..n as u32)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

fn build() -> pinlane::Result<Sample> {
    let images = (0..64)
        .map(|k| Tensor::from_vec(pattern(3 * 224 * 224, k), [3, 224, 224]))
        .collect::<pinlane::Result<Vec<_>>>()?;
    let feats: Vec<f32> = (0..(16 << 20)).map(|i| i as f32 * 0.25).collect();
    Ok(Sample {
        images,
        features: Tensor::from_vec(feats, [4096, 4096])?,
        labels: Tensor::from_vec((0..64i64).collect(), [64])?,
        name: "demo batch".into(),
    })
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn main() -> pinlane::Result<()> {
    // PINLANE_* variables tune the demo's runtime (the library itself reads none).
    pinlane::Config::from_env()?.install()?;
    let simulated = std::env::args().any(|a| a == "--simulated");
    if simulated {
        #[cfg(feature = "sim")]
        {
            pinlane::driver::sim::enable(pinlane::driver::sim::SimConfig::seeded(1))?;
            println!(
                "SIMULATED device: no GPU is used; copies run on host threads with random delays"
            );
        }
        #[cfg(not(feature = "sim"))]
        {
            eprintln!("--simulated needs the demo built with feature `sim`");
            std::process::exit(2);
        }
    }
    let batch = build()?;
    let bytes: usize = pinlane::batch::tensors(&batch)
        .iter()
        .map(|t| t.nbytes())
        .sum();
    let n = pinlane::batch::tensors(&batch).len();
    println!(
        "batch: {n} tensors (64 u8 images 3x224x224, one f32 4096x4096, 64 i64 labels), {:.1} MB",
        bytes as f64 / 1e6
    );

    let Some(info) = driver::available() else {
        println!(
            "no CUDA: {}",
            driver::unavailable_reason().unwrap_or("unknown")
        );
        let there = transfer_tensor_h2d(&batch)?;
        let back = transfer_tensor_d2h(&there, &D2hOptions::default())?;
        println!(
            "h2d and d2h returned the batch as is: unchanged = {}, same storage = {}",
            back == batch,
            back.features.same_storage(&batch.features)
        );
        return Ok(());
    };
    if simulated {
        println!("{} simulated device(s)", info.device_count);
    } else {
        println!(
            "CUDA driver {}.{}, {} device(s)",
            info.version / 1000,
            info.version % 1000 / 10,
            info.device_count
        );
    }

    let mut h2d = Vec::new();
    let mut d2h = Vec::new();
    let mut ok = true;
    for rep in 0..7 {
        let t0 = Instant::now();
        let on_gpu = transfer_tensor_h2d(&batch)?;
        let t1 = Instant::now();
        let back = transfer_tensor_d2h(&on_gpu, &D2hOptions::default())?;
        let t2 = Instant::now();
        if rep == 0 {
            ok = back == batch;
            println!(
                "first round trip: {} tensors on {}; every byte back unchanged: {ok}",
                n,
                on_gpu.features.location()
            );
            println!("  d2h: {:?}", last_transfer_stats());
        } else {
            h2d.push(t1 - t0);
            d2h.push(t2 - t1);
        }
    }
    let gbs = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    let (h, d) = (median(h2d), median(d2h));
    println!(
        "h2d (pageable source): {:>8.2} ms  {:>6.1} GB/s   (median of 6)",
        h.as_secs_f64() * 1e3,
        gbs(h)
    );
    println!(
        "d2h (page-locked outputs): {:>4.2} ms  {:>6.1} GB/s   (median of 6)",
        d.as_secs_f64() * 1e3,
        gbs(d)
    );
    let mem = pinlane::memory_stats();
    println!(
        "page-locked memory held: staging {} MiB, outputs {} MiB",
        mem.staging.held_bytes >> 20,
        mem.pinned_outputs.held_bytes >> 20
    );
    if simulated {
        println!("(simulated: these timings measure the simulator, not a GPU)");
    }
    if !ok {
        eprintln!("round trip changed the batch");
        std::process::exit(1);
    }
    Ok(())
}
