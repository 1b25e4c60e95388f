//! `cargo bench --bench transfer [-- --json PATH] [--quick] [--trace] [--only NAME]`:
//! PERFORMANCE.md's batches through pinlane both ways, on the GPU machine. `--trace`
//! prints each phase's median time over 21 traced calls; `--only` keeps the batches whose
//! name contains NAME. `--simulated` (built with feature `sim`) runs on pinlane's
//! simulated device with no delays, on any machine: its host-side phases (the walk, the
//! checks, the rebuild) run the same code as on a GPU; its copies and its limit say
//! nothing about one.
//!
//! For each configuration: one checked round trip (every byte compared), a warm-up, then
//! the median of timed whole calls (sources rotated among several copies for small
//! batches). Prints GB/s, the fraction of the pinned-memory limit measured in this same
//! process, µs per batch, pinned bytes held, and host CPU seconds per GB moved; writes
//! the same as JSON.

use pinlane::memory::measure_pinned_limits;
use pinlane::{
    transfer_tensor_d2h, transfer_tensor_h2d, Batch as _, D2hOptions, DType, HostOutput, Tensor,
    Value,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Process CPU time (user + system), from /proc/self/stat, in seconds.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which may contain spaces) start after ") ".
    let rest = stat.rsplit_once(") ").map_or("", |r| r.1);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are fields 14 and 15 (1-based) = 11 and 12 here; 100 ticks a second.
    (ticks(11) + ticks(12)) / 100.0
}

/// The calling thread's minor page faults and its voluntary and involuntary context
/// switches so far (getrusage, RUSAGE_THREAD); zeros where it fails.
fn thread_usage() -> (i64, i64, i64) {
    // SAFETY: an all-zero `rusage` is a valid value (integers and timevals), and
    // getrusage writes only into the struct it is given.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `u` is a live, writable `rusage`.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut u) } != 0 {
        return (0, 0, 0);
    }
    (u.ru_minflt, u.ru_nvcsw, u.ru_nivcsw)
}

fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes()[..8.min(n - v.len())]);
    }
    v
}

fn tensor(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    let n: usize = dims.iter().product::<usize>() * dtype.size();
    // f32 patterns made of random bytes include NaNs; compared bytewise, that is fine.
    Tensor::from_bytes(dtype, dims.to_vec(), &pattern(n, seed)).unwrap()
}

/// A batch as the seed's users pass it: a dict of tensors or a list of them.
type Batch = Value;

fn dict(ts: Vec<Tensor>) -> Batch {
    Value::Map(
        ts.into_iter()
            .enumerate()
            .map(|(i, t)| (format!("t{i:04}"), Value::Tensor(t)))
            .collect::<BTreeMap<_, _>>(),
    )
}

fn list(ts: Vec<Tensor>) -> Batch {
    Value::List(ts.into_iter().map(Value::Tensor).collect())
}

struct Config {
    name: &'static str,
    /// Copies of the batch to rotate among (small batches: so caches don't flatter them).
    sources: Vec<Batch>,
    reps: usize,
}

fn configs(quick: bool) -> Vec<Config> {
    let big_reps = if quick { 3 } else { 8 };
    let small = |n: usize, f: &dyn Fn(u64) -> Batch| (0..n as u64).map(f).collect::<Vec<_>>();
    vec![
        Config {
            name: "8 x 32 MiB f32",
            sources: vec![dict(
                (0..8).map(|i| tensor(DType::F32, &[8 << 20], i)).collect(),
            )],
            reps: big_reps,
        },
        Config {
            name: "1 GiB f32",
            sources: vec![list(vec![tensor(DType::F32, &[256 << 20], 99)])],
            reps: big_reps.min(6),
        },
        Config {
            name: "64 x 3x224x224 u8",
            sources: small(4, &|s| {
                list(
                    (0..64)
                        .map(|i| tensor(DType::U8, &[3, 224, 224], s * 100 + i))
                        .collect(),
                )
            }),
            reps: 30,
        },
        Config {
            name: "1000 x 1 KiB f32",
            sources: small(4, &|s| {
                list(
                    (0..1000)
                        .map(|i| tensor(DType::F32, &[256], s * 10_000 + i))
                        .collect(),
                )
            }),
            reps: 60,
        },
        Config {
            name: "1 x 1 KiB f32",
            sources: small(8, &|s| list(vec![tensor(DType::F32, &[256], s)])),
            reps: 200,
        },
    ]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

struct Row {
    config: &'static str,
    direction: String,
    bytes: usize,
    median: Duration,
    limit: f64,
    pinned_held: usize,
    cpu_s_per_gb: f64,
}

impl Row {
    fn gbs(&self) -> f64 {
        self.bytes as f64 / self.median.as_secs_f64() / 1e9
    }
}

/// Warm-up calls before timing: the H2D cache ring keeps the last 4 batches alive
/// (`num_caches`), so the device pool grows during the first 5 calls of a batch size (by a
/// batch each: 1.2 to 1.9 ms for 1 GiB); from the 6th on it reuses its memory.
const WARMUPS: usize = 6;

/// Times `reps` calls of `f(rep)` after [`WARMUPS`] warm-ups.
fn time(reps: usize, mut f: impl FnMut(usize)) -> (Duration, f64) {
    for w in 0..WARMUPS {
        f(w);
    }
    let cpu0 = cpu_seconds();
    let mut v = Vec::with_capacity(reps);
    for r in 0..reps {
        let t0 = Instant::now();
        f(r);
        v.push(t0.elapsed());
    }
    (median(v), cpu_seconds() - cpu0)
}

fn bytes_of(b: &Batch) -> usize {
    pinlane::batch::tensors(b).iter().map(|t| t.nbytes()).sum()
}

/// Turns the simulated device on (no delays, host memory mapped as on the H200), or
/// stops the run when the bench was built without it.
fn simulate() {
    #[cfg(feature = "sim")]
    {
        use pinlane::driver::sim;
        let config = sim::SimConfig::seeded(1).max_delay(Duration::ZERO);
        if let Err(e) = sim::enable(config) {
            eprintln!("simulated device: {e}");
            std::process::exit(2);
        }
        println!(
            "SIMULATED device: host-side phases only; copies and limits say nothing about a GPU"
        );
    }
    #[cfg(not(feature = "sim"))]
    {
        eprintln!("--simulated needs the bench built with feature `sim`");
        std::process::exit(2);
    }
}

fn main() {
    // PINLANE_* variables tune this run (the sweeps set them); a bad value stops it.
    if let Err(e) = pinlane::Config::from_env().and_then(pinlane::Config::install) {
        eprintln!("configuration: {e}");
        std::process::exit(2);
    }
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let trace = args.iter().any(|a| a == "--trace");
    let json_path = args
        .iter()
        .position(|a| a == "--json")
        .and_then(|i| args.get(i + 1))
        .cloned();
    if args.iter().any(|a| a == "--simulated") {
        simulate();
    }
    let Some(info) = pinlane::driver::available() else {
        println!(
            "no CUDA ({}): nothing to measure",
            pinlane::driver::unavailable_reason().unwrap_or("?")
        );
        return;
    };
    // The device the transfers go to (cuda:{LOCAL_RANK}), and its limit, measured here.
    let device = pinlane::Device::from_local_rank().expect("LOCAL_RANK names a device");
    let limits = measure_pinned_limits(device, 256 << 20, 8).expect("pinned limit");
    println!(
        "{device}: pinned limit (256 MiB, median of 8, this process): H2D {:.1} GB/s, D2H {:.1} GB/s, both at once {:.1} GB/s",
        limits.h2d, limits.d2h, limits.both
    );
    // The device-side floor of a small batch: one 1 MiB copy and its synchronisation.
    let mib = measure_pinned_limits(device, 1 << 20, 50).expect("pinned 1 MiB");
    println!(
        "{device}: one 1 MiB page-locked copy with its synchronisation (median of 50): H2D {:.1} us, D2H {:.1} us",
        (1 << 20) as f64 / mib.h2d / 1e3,
        (1 << 20) as f64 / mib.d2h / 1e3
    );
    println!(
        "driver {}, copy threads {}, staging slot {} MiB, arena cap {} MiB",
        info.version,
        pinlane::runtime().copy_threads(),
        pinlane::runtime().config().slot_bytes >> 20,
        pinlane::runtime().config().arena_bytes >> 20
    );

    let mut rows = Vec::new();
    let cpu_per_gb = |cpu: f64, bytes: usize, reps: usize| cpu / (bytes as f64 * reps as f64 / 1e9);
    let only = args
        .iter()
        .position(|a| a == "--only")
        .and_then(|i| args.get(i + 1))
        .cloned();
    for c in configs(quick) {
        if only.as_ref().is_some_and(|o| !c.name.contains(o.as_str())) {
            continue;
        }
        let bytes = bytes_of(&c.sources[0]);
        let n = c.sources.len();
        // Check the moved bytes once per configuration, both output modes.
        let dev: Vec<Batch> = c
            .sources
            .iter()
            .map(|s| transfer_tensor_h2d(s).unwrap())
            .collect();
        for mode in [HostOutput::Pinned, HostOutput::Pageable] {
            let back = transfer_tensor_d2h(&dev[0], &D2hOptions::default().output(mode)).unwrap();
            assert!(
                back == c.sources[0],
                "{}: round trip ({mode:?}) changed bytes",
                c.name
            );
        }

        if trace {
            // Median of each phase over traced calls: the marks' offsets from the call's
            // start, then each phase's duration (the time since the previous mark).
            let show = |call: &str, f: &mut dyn FnMut(usize)| {
                let mut runs: Vec<Vec<(&'static str, Duration)>> = Vec::new();
                // Device memory the pools have reserved: which calls made a pool grow.
                let reserved = || -> u64 {
                    pinlane::memory_stats()
                        .devices
                        .iter()
                        .map(|d| d.reserved_bytes)
                        .sum()
                };
                let mut grew = Vec::new();
                // The calling thread's page faults and context switches per call (its
                // outputs' drop included).
                let (mut faults, mut switches) = (Vec::new(), Vec::new());
                for r in 0..21 {
                    let before = reserved();
                    let u0 = thread_usage();
                    pinlane::observe::trace_next_call();
                    f(r);
                    let u1 = thread_usage();
                    runs.extend(pinlane::observe::last_trace());
                    if reserved() > before {
                        grew.push(r);
                    }
                    faults.push(u1.0 - u0.0);
                    switches.push((u1.1 - u0.1, u1.2 - u0.2));
                }
                let Some(first) = runs.first().cloned() else {
                    return;
                };
                let marks: Vec<String> = (0..first.len())
                    .map(|k| {
                        let phase = |run: &Vec<(&str, Duration)>| {
                            let prev = k.checked_sub(1).map_or(Duration::ZERO, |j| run[j].1);
                            run[k].1.saturating_sub(prev)
                        };
                        let same = runs.iter().filter(|r| r.len() == first.len());
                        let d = median(same.map(phase).collect());
                        format!("{} +{:.1}", first[k].0, d.as_secs_f64() * 1e6)
                    })
                    .collect();
                eprintln!(
                    "trace {} {call} (median us per phase, to each mark from the previous): {}",
                    c.name,
                    marks.join(", ")
                );
                // Whole calls, and where the slowest one lost its time: a stall that hits
                // a different phase in each call is invisible in the per-phase medians.
                let total =
                    |run: &Vec<(&str, Duration)>| run.last().map_or(Duration::ZERO, |m| m.1);
                let mut totals: Vec<f64> =
                    runs.iter().map(|r| total(r).as_secs_f64() * 1e6).collect();
                totals.sort_by(f64::total_cmp);
                let slow_alloc: Vec<String> = runs
                    .iter()
                    .enumerate()
                    .filter_map(|(r, run)| {
                        let k = run.iter().position(|m| m.0 == "allocated")?;
                        let d = run[k].1 - k.checked_sub(1).map_or(Duration::ZERO, |j| run[j].1);
                        (d > Duration::from_micros(200))
                            .then(|| format!("call {r}: {:.0} us", d.as_secs_f64() * 1e6))
                    })
                    .collect();
                eprintln!(
                    "trace {} {call}: allocations over 200 us: [{}]; calls that grew a device pool: {grew:?}",
                    c.name,
                    slow_alloc.join(", ")
                );
                eprintln!(
                    "trace {} {call}: the calling thread's minor page faults per call {faults:?}; context switches (voluntary, involuntary) {switches:?}",
                    c.name
                );
                if let Some(slow) = runs.iter().max_by_key(|r| total(r)) {
                    let mut phases: Vec<(usize, &str, f64)> = (0..slow.len())
                        .map(|k| {
                            let prev = k.checked_sub(1).map_or(Duration::ZERO, |j| slow[j].1);
                            (k, slow[k].0, (slow[k].1 - prev).as_secs_f64() * 1e6)
                        })
                        .collect();
                    phases.sort_by(|a, b| b.2.total_cmp(&a.2));
                    let top: Vec<String> = phases
                        .iter()
                        .take(6)
                        .map(|(k, name, us)| format!("#{k} {name} {us:.0}"))
                        .collect();
                    eprintln!(
                        "trace {} {call}: whole calls min/median/max {:.0}/{:.0}/{:.0} us; the slowest call's longest phases: {}",
                        c.name,
                        totals[0],
                        totals[totals.len() / 2],
                        totals[totals.len() - 1],
                        top.join(", ")
                    );
                }
            };
            show("h2d", &mut |r| {
                drop(transfer_tensor_h2d(&c.sources[r % n]).unwrap())
            });
            show("d2h", &mut |r| {
                drop(transfer_tensor_d2h(&dev[r % n], &D2hOptions::default()).unwrap())
            });
            let pageable = D2hOptions::default().output(HostOutput::Pageable);
            show("d2h pageable out", &mut |r| {
                drop(transfer_tensor_d2h(&dev[r % n], &pageable).unwrap())
            });
        }
        let (m, cpu) = time(c.reps, |r| {
            drop(transfer_tensor_h2d(&c.sources[r % n]).unwrap())
        });
        rows.push(Row {
            config: c.name,
            direction: "H2D pageable".into(),
            bytes,
            median: m,
            limit: limits.h2d,
            pinned_held: pinlane::memory_stats().staging.held_bytes,
            cpu_s_per_gb: cpu_per_gb(cpu, bytes, c.reps),
        });

        let pinned_src: Vec<Batch> = c
            .sources
            .iter()
            .map(|s| s.rebuild(&mut |t| t.to_pinned().unwrap()))
            .collect();
        let (m, cpu) = time(c.reps, |r| {
            drop(transfer_tensor_h2d(&pinned_src[r % n]).unwrap())
        });
        rows.push(Row {
            config: c.name,
            direction: "H2D pinned".into(),
            bytes,
            median: m,
            limit: limits.h2d,
            pinned_held: pinlane::memory_stats().staging.held_bytes,
            cpu_s_per_gb: cpu_per_gb(cpu, bytes, c.reps),
        });
        drop(pinned_src);

        // The same bytes written by a producer into pool buffers (PinnedBufferMut), when
        // the pool has room for them.
        let mut fits = true;
        let produced: Vec<Batch> = c
            .sources
            .iter()
            .map(|s| {
                s.rebuild(&mut |t| {
                    let made = t.as_bytes().and_then(|src| {
                        let mut b = pinlane::memory::PinnedBufferMut::<u8>::new(src.len(), device)?;
                        b.copy_from_slice(src)?;
                        b.freeze([src.len()])
                    });
                    made.unwrap_or_else(|_| {
                        fits = false;
                        t.clone()
                    })
                })
            })
            .collect();
        let produced = fits.then_some(produced);
        if let Some(produced) = produced {
            let (m, cpu) = time(c.reps, |r| {
                drop(transfer_tensor_h2d(&produced[r % n]).unwrap())
            });
            rows.push(Row {
                config: c.name,
                direction: "H2D producer buffer".into(),
                bytes,
                median: m,
                limit: limits.h2d,
                pinned_held: pinlane::memory_stats().staging.held_bytes,
                cpu_s_per_gb: cpu_per_gb(cpu, bytes, c.reps),
            });
        }

        // Registering the sources in place (cuMemHostRegister): its cost, the transfers
        // from registered memory, and after how many transfers it has paid for itself.
        if bytes >= 64 << 20 {
            let t0 = Instant::now();
            let registered: Vec<Batch> = c
                .sources
                .iter()
                .map(|s| s.rebuild(&mut |t| t.register_pinned(device).expect("register")))
                .collect();
            let reg = t0.elapsed();
            let (m, cpu) = time(c.reps, |r| {
                drop(transfer_tensor_h2d(&registered[r % n]).unwrap())
            });
            let t0 = Instant::now();
            drop(registered);
            let unreg = t0.elapsed();
            let pageable = rows
                .iter()
                .find(|r: &&Row| r.config == c.name && r.direction == "H2D pageable")
                .map(|r| r.median);
            let saved = pageable.map(|p| p.as_secs_f64() - m.as_secs_f64());
            let per_batch = (reg + unreg).as_secs_f64() / n as f64;
            eprintln!(
                "{}: registering {} MiB took {:.2} ms and unregistering {:.2} ms a batch; \
                 repaid after {} transfers (each {:.3} ms faster than from pageable memory)",
                c.name,
                bytes >> 20,
                reg.as_secs_f64() * 1e3 / n as f64,
                unreg.as_secs_f64() * 1e3 / n as f64,
                saved
                    .filter(|&s| s > 0.0)
                    .map_or("never".to_string(), |s| format!("{:.1}", per_batch / s)),
                saved.unwrap_or(0.0) * 1e3
            );
            rows.push(Row {
                config: c.name,
                direction: "H2D registered".into(),
                bytes,
                median: m,
                limit: limits.h2d,
                pinned_held: pinlane::memory_stats().staging.held_bytes,
                cpu_s_per_gb: cpu_per_gb(cpu, bytes, c.reps),
            });
        }

        for (mode, label) in [
            (HostOutput::Pinned, "D2H pinned out"),
            (HostOutput::Pageable, "D2H pageable out"),
        ] {
            let opts = D2hOptions::default().output(mode);
            let (m, cpu) = time(c.reps, |r| {
                drop(transfer_tensor_d2h(&dev[r % n], &opts).unwrap())
            });
            rows.push(Row {
                config: c.name,
                direction: label.into(),
                bytes,
                median: m,
                limit: limits.d2h,
                pinned_held: pinlane::memory_stats().staging.held_bytes
                    + pinlane::memory_stats().pinned_outputs.held_bytes,
                cpu_s_per_gb: cpu_per_gb(cpu, bytes, c.reps),
            });
        }
    }

    // H2D in one thread and D2H in another at once, 256 MiB each.
    if only
        .as_ref()
        .is_none_or(|o| "256 MiB each way at once".contains(o.as_str()))
    {
        let src = dict(
            (0..8)
                .map(|i| tensor(DType::F32, &[8 << 20], 500 + i))
                .collect(),
        );
        let dev = transfer_tensor_h2d(&dict(
            (0..8)
                .map(|i| tensor(DType::F32, &[8 << 20], 600 + i))
                .collect(),
        ))
        .unwrap();
        let bytes = bytes_of(&src);
        let reps = if quick { 3 } else { 8 };
        let barrier = std::sync::Barrier::new(2);
        let run = |reps: usize| {
            std::thread::scope(|s| {
                let up = s.spawn(|| {
                    barrier.wait();
                    for _ in 0..reps {
                        drop(transfer_tensor_h2d(&src).unwrap());
                    }
                });
                let down = s.spawn(|| {
                    barrier.wait();
                    for _ in 0..reps {
                        drop(transfer_tensor_d2h(&dev, &D2hOptions::default()).unwrap());
                    }
                });
                up.join().unwrap();
                down.join().unwrap();
            })
        };
        // As many warm-up calls as the other rows (it had one): the H2D cache ring keeps
        // 4 batches, so the device pool grows during the first 5 calls of a process that
        // measures only this row.
        run(WARMUPS);
        let cpu0 = cpu_seconds();
        let t0 = Instant::now();
        run(reps);
        let per = t0.elapsed() / reps as u32;
        rows.push(Row {
            config: "256 MiB each way at once",
            direction: "H2D + D2H".into(),
            bytes: 2 * bytes,
            median: per,
            limit: limits.both,
            pinned_held: pinlane::memory_stats().staging.held_bytes
                + pinlane::memory_stats().pinned_outputs.held_bytes,
            cpu_s_per_gb: cpu_per_gb(cpu_seconds() - cpu0, 2 * bytes, reps),
        });
    }

    println!();
    println!(
        "{:<26} {:<18} {:>9} {:>8} {:>12} {:>11} {:>9}",
        "batch", "direction", "GB/s", "x limit", "us/batch", "pinned MiB", "CPU s/GB"
    );
    for r in &rows {
        println!(
            "{:<26} {:<18} {:>9.2} {:>8.3} {:>12.1} {:>11} {:>9.3}",
            r.config,
            r.direction,
            r.gbs(),
            r.gbs() / r.limit,
            r.median.as_secs_f64() * 1e6,
            r.pinned_held >> 20,
            r.cpu_s_per_gb
        );
    }

    if let Some(path) = json_path {
        let mut j = String::new();
        let _ = write!(
            j,
            "{{\"tool\":\"pinlane\",\"limits\":{{\"h2d\":{:.3},\"d2h\":{:.3},\"both\":{:.3}}},\"copy_threads\":{},\"rows\":[",
            limits.h2d,
            limits.d2h,
            limits.both,
            pinlane::runtime().copy_threads()
        );
        for (i, r) in rows.iter().enumerate() {
            let _ = write!(
                j,
                "{}{{\"batch\":\"{}\",\"direction\":\"{}\",\"bytes\":{},\"median_us\":{:.2},\"gbs\":{:.3},\"fraction_of_limit\":{:.4},\"pinned_held_bytes\":{},\"cpu_s_per_gb\":{:.4}}}",
                if i > 0 { "," } else { "" },
                r.config,
                r.direction,
                r.bytes,
                r.median.as_secs_f64() * 1e6,
                r.gbs(),
                r.gbs() / r.limit,
                r.pinned_held,
                r.cpu_s_per_gb
            );
        }
        j.push_str("]}\n");
        std::fs::write(&path, j).expect("write json");
        println!("\nwrote {path}");
    }
}
