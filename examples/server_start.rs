//! A server's start: its model's weights loaded from a safetensors checkpoint (one file, a
//! sharded checkpoint's index, or a directory) onto the GPU, tensor by tensor as each
//! arrives (`Checkpoint::stream`), placed into the server's layer table while the rest
//! load; then a few requests served with the weights resident.
//!
//! Prints, for each of `--reps` starts (each opening the checkpoint afresh; the first is
//! the process's first load, which also allocates the staging arena and grows the device
//! pool), the time to open it, to the first tensor and to the whole model, and to unmap
//! it, with the rate against the page-locked limit measured in this process; then checks
//! every loaded tensor's bytes against the file (read back from the device). Without a
//! GPU it says so and exits 0.
//!
//! `cargo run --release --example server_start -- PATH [--group-mib N] [--reps N]`

use pinlane::weights::{Checkpoint, LoadOptions};
use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, Tensor};
use std::collections::BTreeMap;
use std::time::Instant;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: server_start PATH [--group-mib N] [--reps N]");
        std::process::exit(2);
    };
    let flag = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(default)
    };
    let (group_mib, reps) = (flag("--group-mib", 512), flag("--reps", 3));
    if pinlane::driver::available().is_none_or(|i| i.device_count == 0) {
        println!("no GPU: nothing to load onto");
        return Ok(());
    }
    // A server warms the device up at start: the context, pinlane's memory pool and its
    // kernel (the first load would do it otherwise).
    let t0 = Instant::now();
    pinlane::warm_up(pinlane::Device::cuda(0))?;
    println!("warm_up {:.1} ms", t0.elapsed().as_secs_f64() * 1e3);
    let limit = pinlane::memory::measure_pinned_limits(pinlane::Device::cuda(0), 256 << 20, 5)?;

    // Each start opens the checkpoint afresh, as a server does once: the mapping's pages
    // are touched for the first time by the load, and unmapped when the last host view
    // of them goes (timed separately, as `unmap`).
    let opts = LoadOptions::default().group_bytes(group_mib << 20);
    let mut layers: BTreeMap<String, Tensor> = BTreeMap::new();
    let mut ckpt = None;
    for rep in 0..reps.max(1) {
        layers.clear();
        ckpt = None;
        let t0 = Instant::now();
        let c = Checkpoint::open(path)?;
        let opened = t0.elapsed();
        if rep == 0 {
            println!(
                "{path}: {} tensors, {:.2} GB in {} file(s); groups of {group_mib} MiB; page-locked limit {:.1} GB/s",
                c.len(),
                c.nbytes() as f64 / 1e9,
                c.files().len(),
                limit.h2d
            );
        }
        let gb = c.nbytes() as f64 / 1e9;
        let mut first = None;
        for item in c.stream(&opts)? {
            let (name, tensor) = item?;
            first.get_or_insert_with(|| t0.elapsed());
            layers.insert(name, tensor); // a real server places it in its layer table
        }
        let loaded = t0.elapsed();
        // Unmapping: what dropping the checkpoint (the last owner of the mapping) costs.
        drop(c);
        let all = t0.elapsed().as_secs_f64();
        println!(
            "start {rep}: open {:.2} ms, first tensor after {:.2} ms, loaded after {:.1} ms, unmap {:.2} ms; \
             all {:.1} ms: {:.1} GB/s, {:.3} of the limit",
            opened.as_secs_f64() * 1e3,
            first.unwrap_or_default().as_secs_f64() * 1e3,
            loaded.as_secs_f64() * 1e3,
            (all - loaded.as_secs_f64()) * 1e3,
            all * 1e3,
            gb / all,
            gb / all / limit.h2d
        );
        if rep + 1 == reps.max(1) {
            ckpt = Some(Checkpoint::open(path)?);
        }
    }
    let ckpt = ckpt.ok_or("no checkpoint")?;

    // Every tensor's bytes, read back, against the file's (read with plain file reads,
    // not through pinlane, its header parsed by the `safetensors` crate).
    let mut checked = (0usize, 0usize);
    for file in ckpt.files() {
        let bytes = std::fs::read(file)?;
        let st = safetensors::SafeTensors::deserialize(&bytes)?;
        let names: Vec<String> = st.names().into_iter().map(String::from).collect();
        let ours: Vec<Tensor> = names.iter().map(|n| layers[n].clone()).collect();
        let back = transfer_tensor_d2h(&ours, &D2hOptions::default())?;
        for (name, t) in names.iter().zip(&back) {
            let want = st.tensor(name)?;
            if t.as_bytes()? != want.data() || t.dims() != want.shape() {
                return Err(format!("{name}: bytes differ from the file").into());
            }
            checked = (checked.0 + 1, checked.1 + t.nbytes());
        }
    }
    if checked.0 != layers.len() {
        return Err("the files hold other tensors than were loaded".into());
    }
    println!(
        "checked {} bytes of {} tensors against the file",
        checked.1, checked.0
    );

    // Serve: requests' inputs go to the GPU while the weights stay resident.
    for r in 0..3u32 {
        let ids = Tensor::from_vec((0..512).map(|i| (i * 7 + r) as i64).collect(), [512])?;
        let t0 = Instant::now();
        let on_gpu = transfer_tensor_h2d(&vec![ids])?;
        println!(
            "request {r}: {} input bytes on the GPU in {:.1} us, {} weight tensors resident",
            on_gpu[0].nbytes(),
            t0.elapsed().as_secs_f64() * 1e6,
            layers.len()
        );
    }
    Ok(())
}
