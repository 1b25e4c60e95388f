//! An async service on tokio that awaits pinlane transfers, checks every answer, and shows
//! that the runtime's worker threads never block on the GPU: a ticker task on the same
//! two worker threads keeps its 1 ms period while 16 clients move batches both ways.
//!
//! `cargo run --release --example tokio_service` (on a GPU; add `--features sim --
//! --simulated` to run it on pinlane's simulated device). For contrast, `-- --blocking`
//! makes the clients call the blocking functions from their tasks, which stalls the
//! ticker.
//!
//! A warm-up round runs first: page-locked memory is allocated inside the call that first
//! needs it, which takes milliseconds.
//!
//! The non-blocking calls return once their copies are queued (the pageable sources'
//! bytes are then in page-locked staging slots), so each client's batch is kept well
//! below the staging arena: a batch larger than the arena waits for slots inside the call.

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_d2h_async, transfer_tensor_h2d, transfer_tensor_h2d_async,
    D2hOptions, H2dOptions, Tensor,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENTS: usize = 16;
const REQUESTS: usize = 40;

/// A client's request: an image-like u8 tensor and a float vector, from a seed.
fn request(client: usize, n: usize) -> Vec<Tensor> {
    let seed = (client * 1000 + n) as u32;
    let img: Vec<u8> = (0..3 * 256 * 256u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed) as u8)
        .collect();
    let v: Vec<f32> = (0..4096).map(|i| (i as u32 ^ seed) as f32).collect();
    vec![
        Tensor::from_vec(img, [3, 256, 256]).expect("shape"),
        Tensor::from_vec(v, [4096]).expect("shape"),
    ]
}

/// The longest a worker thread spent inside one pinlane call, in microseconds.
static LONGEST_CALL_US: AtomicU64 = AtomicU64::new(0);

/// Runs `f` (a pinlane call) and keeps the longest time any such call took.
fn timed<T>(f: impl FnOnce() -> T) -> T {
    let t0 = Instant::now();
    let r = f();
    LONGEST_CALL_US.fetch_max(t0.elapsed().as_micros() as u64, Ordering::Relaxed);
    r
}

/// One round trip, awaited (or, with `blocking`, done by the blocking calls in the task).
async fn serve(batch: &Vec<Tensor>, blocking: bool) -> pinlane::Result<Vec<Tensor>> {
    if blocking {
        let on = timed(|| transfer_tensor_h2d(batch))?;
        return timed(|| transfer_tensor_d2h(&on, &D2hOptions::default()));
    }
    let on = timed(|| transfer_tensor_h2d_async(batch, &H2dOptions::default()))?.await?;
    timed(|| transfer_tensor_d2h_async(&on, &D2hOptions::default()))?.await
}

/// Every client's requests at once, each answer checked; the number served.
async fn clients(requests: usize, blocking: bool) -> Result<usize, String> {
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|c| {
            // Made before the clients start, so the tasks' own CPU work is only the check.
            let batches: Vec<_> = (0..requests).map(|n| request(c, n)).collect();
            tokio::spawn(async move {
                for (n, batch) in batches.iter().enumerate() {
                    let back = serve(batch, blocking)
                        .await
                        .map_err(|e| format!("client {c}, request {n}: {e}"))?;
                    if &back != batch {
                        return Err(format!("client {c}, request {n}: wrong answer"));
                    }
                }
                Ok::<usize, String>(requests)
            })
        })
        .collect();
    let mut served = 0;
    for t in tasks {
        served += t.await.map_err(|e| e.to_string())??;
    }
    Ok(served)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.iter().any(|a| a == "--simulated") {
        #[cfg(feature = "sim")]
        pinlane::driver::sim::enable(pinlane::driver::sim::SimConfig::seeded(1))?;
        #[cfg(not(feature = "sim"))]
        return Err("--simulated needs `--features sim`".into());
    }
    let blocking = args.iter().any(|a| a == "--blocking");
    match pinlane::driver::available() {
        Some(i) => println!("driver {}, {} device(s)", i.version, i.device_count),
        None => println!("no CUDA: batches pass through unchanged"),
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_time()
        .build()?;
    // Warm up first: the device's context and pool, and page-locked memory for as many
    // batches at once as the clients keep in flight (allocating page-locked memory is
    // slow, and it happens inside the calls that first need it).
    if let Ok(d) = pinlane::Device::from_local_rank() {
        if pinlane::driver::available().is_some() {
            pinlane::warm_up(d)?;
        }
    }
    rt.block_on(clients(2, blocking))?;
    let before = pinlane::memory_stats();
    LONGEST_CALL_US.store(0, Ordering::Relaxed);
    let t0 = Instant::now();
    let (served, ticks, late) = rt.block_on(async move {
        // The ticker: how late each 1 ms tick fires while the clients run.
        let stop = Arc::new(AtomicBool::new(false));
        let ticker = {
            let stop = stop.clone();
            let spawned = Instant::now();
            tokio::spawn(async move {
                let mut interval = tokio::time::interval(Duration::from_millis(1));
                interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                let (mut ticks, mut worst) = (0usize, Duration::ZERO);
                // The first tick is due at once: its wait since the spawn counts too.
                let mut last = spawned
                    .checked_sub(Duration::from_millis(1))
                    .unwrap_or(spawned);
                while !stop.load(Ordering::Relaxed) {
                    interval.tick().await;
                    let now = Instant::now();
                    let gap = now
                        .duration_since(last)
                        .saturating_sub(Duration::from_millis(1));
                    worst = worst.max(gap);
                    last = now;
                    ticks += 1;
                }
                (ticks, worst)
            })
        };
        let served = clients(REQUESTS, blocking).await?;
        stop.store(true, Ordering::Relaxed);
        let (ticks, late) = ticker.await.map_err(|e| e.to_string())?;
        Ok::<_, String>((served, ticks, late))
    })?;
    let elapsed = t0.elapsed();
    let after = pinlane::memory_stats();
    let slot_waits = after.slot_waits - before.slot_waits;
    let fallbacks = after.pageable_fallbacks - before.pageable_fallbacks;
    println!(
        "{served} requests served and checked in {:.0} ms ({} mode); ticker: {ticks} ticks of \
         1 ms (about {:.0} if never held up), worst lateness {:.2} ms; longest pinlane call \
         on a worker: {} us; calls that waited for a staging slot: {slot_waits}; D2H \
         batches that fell back to pageable outputs: {fallbacks}",
        elapsed.as_secs_f64() * 1e3,
        if blocking { "blocking" } else { "async" },
        elapsed.as_secs_f64() * 1e3,
        late.as_secs_f64() * 1e3,
        LONGEST_CALL_US.load(Ordering::Relaxed)
    );
    Ok(())
}
