//! Helpers shared by the integration tests: the GPU gate and random batch strategies.
#![allow(dead_code, unused_imports)]

pub mod into;
pub mod weights;

use pinlane::{DType, Tensor};
#[cfg(feature = "proptest")]
use proptest::prelude::*;
use std::sync::{Arc, Mutex};

/// Whether GPU tests should run. Without a usable GPU they skip with a message, unless
/// `PINLANE_REQUIRE_GPU=1`, when a missing GPU is a failure.
pub fn gpu() -> bool {
    match pinlane::driver::available() {
        Some(_) => {
            shut_down_at_exit();
            true
        }
        None => {
            let reason = pinlane::driver::unavailable_reason().unwrap_or("unknown");
            if std::env::var("PINLANE_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("PINLANE_REQUIRE_GPU=1 but no usable GPU: {reason}");
            }
            eprintln!("skipping GPU test: no usable GPU ({reason})");
            false
        }
    }
}

/// Registers (once) a process-exit hook that shuts pinlane's runtime down, as a program
/// that wants a clean leak report does at its end: so compute-sanitizer's leak check over
/// a GPU test binary sees only what the tests themselves leaked. Registered after the
/// driver was loaded, so it runs before the driver's own exit handlers.
fn shut_down_at_exit() {
    extern "C" fn at_exit() {
        if let Err(e) = pinlane::shutdown(std::time::Duration::from_secs(10)) {
            eprintln!("pinlane::shutdown at exit: {e}");
        }
    }
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: registers a plain function; atexit has no other precondition.
        if unsafe { libc::atexit(at_exit) } != 0 {
            eprintln!("could not register pinlane's shutdown at exit");
        }
    });
}

/// Whether this process runs under NVIDIA's compute-sanitizer, whose own device memory
/// (tracking state that grows with the allocations it watches) shows in
/// `cuMemGetInfo`: tests that measure the device's memory in use measure pinlane's pools
/// instead there.
pub fn under_sanitizer() -> bool {
    std::env::var_os("NV_SANITIZER_INJECTION_PORT_BASE").is_some()
}

/// Returns from the test early (skipping) when there is no GPU; see [`gpu`].
#[macro_export]
macro_rules! require_gpu {
    () => {
        if !common::gpu() {
            return;
        }
    };
}

/// Bytes that reveal misplaced data: pinlane's own (`pinlane::verify`), which users'
/// tests use too.
pub use pinlane::verify::pattern;

/// A host tensor of `dtype` and `dims` filled with [`pattern`] bytes from `seed`.
pub fn tensor(dtype: DType, dims: &[usize], seed: u64) -> Tensor {
    pinlane::verify::patterned(dtype, dims, seed).expect("a test's shape fits usize")
}

/// The strategies users get with feature `proptest` (on with `test-util`).
#[cfg(feature = "proptest")]
pub use pinlane::verify::strategy::{dtype, leaf, value};

/// Host tensors of rank 0 to 4, at most 4,096 elements.
#[cfg(feature = "proptest")]
pub fn host_tensor() -> impl Strategy<Value = Tensor> {
    pinlane::verify::strategy::tensor(4, 4096)
}

/// The same batch with every `pin_every`-th tensor made page-locked and every
/// `dev_every`-th one put on the device first (0: none), by position.
pub fn mix<B: pinlane::Batch>(b: &B, pin_every: usize, dev_every: usize) -> B {
    let mut k = 0;
    b.rebuild(&mut |t| {
        k += 1;
        if dev_every > 0 && k % dev_every == 0 {
            pinlane::transfer_tensor_h2d(t).expect("to the device")
        } else if pin_every > 0 && k % pin_every == 0 {
            t.to_pinned().expect("pinned copy")
        } else {
            t.clone()
        }
    })
}

/// `dtype, dims, bytes` of every tensor, in visit order: what a round trip must keep.
pub fn fingerprint<B: pinlane::Batch>(b: &B) -> Vec<(DType, Vec<usize>, Vec<u8>)> {
    pinlane::batch::tensors(b)
        .iter()
        .map(|t| {
            (
                t.dtype(),
                t.dims().to_vec(),
                t.as_bytes().map(<[u8]>::to_vec).unwrap_or_default(),
            )
        })
        .collect()
}

/// Switches this test binary to the simulated device (once; every test of a simulated
/// binary calls it first), with a small staging arena so batches span many slots.
#[cfg(feature = "sim")]
pub fn sim() {
    sim_with(sim_runtime, sim_device);
}

/// The runtime of the simulated binaries: a small staging arena (16 slots of 64 KiB).
#[cfg(feature = "sim")]
pub fn sim_runtime() -> pinlane::Config {
    pinlane::Config::new()
        .slot_bytes(64 << 10)
        .arena_bytes(1 << 20)
}

/// The simulated device of [`sim`]: seeded, each operation delayed up to 40 us.
#[cfg(feature = "sim")]
pub fn sim_device() -> pinlane::driver::sim::SimConfig {
    pinlane::driver::sim::SimConfig::seeded(0x5EED).max_delay(std::time::Duration::from_micros(40))
}

/// Switches this test binary to the simulated device with the runtime `config()` and the
/// simulator `sim()` make (once per binary: later calls, whatever they pass, do nothing).
#[cfg(feature = "sim")]
pub fn sim_with(
    config: impl FnOnce() -> pinlane::Config,
    sim: impl FnOnce() -> pinlane::driver::sim::SimConfig,
) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // The simulated devices are this binary's own: the machine's LOCAL_RANK (set when
        // the suite runs on a real GPU 1) must not pick one of them. Tests that set it do
        // so themselves.
        std::env::remove_var("LOCAL_RANK");
        config().install().expect("the simulated binary's runtime");
        pinlane::driver::sim::enable(sim()).expect("enable the simulated device");
    });
}

/// The device GPU tests work on: `cuda:{LOCAL_RANK}` (`cuda:0` when unset), so the suite
/// runs on any GPU of a machine (`LOCAL_RANK=1 bash .gpu/run-tests`).
pub fn dev() -> pinlane::Device {
    pinlane::Device::from_local_rank().expect("LOCAL_RANK names a device of this machine")
}

/// What an overlapping call's `while_copying` made of its outputs, as a binding makes
/// them: a capsule each (`Tensor::to_dlpack_in_flight`), and a tag whose drop is counted
/// (dropped unread, in the call, when the call fails).
pub struct HandedOver {
    pub capsules: Vec<pinlane::dlpark::versioned::Dlpack>,
    _tag: DropCounted,
}

struct DropCounted(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for DropCounted {
    fn drop(&mut self) {
        self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    }
}

/// [`HandedOver`] of `outs`, after `check` of each (what may not be read yet, say).
pub fn hand_over(
    outs: &[Tensor],
    drops: &std::sync::Arc<std::sync::atomic::AtomicUsize>,
    check: impl Fn(&Tensor),
) -> HandedOver {
    let capsules = outs
        .iter()
        .map(|t| {
            check(t);
            // SAFETY: the tests read the capsules only once the call has returned `Ok`,
            // and a failed call drops them unread.
            unsafe { t.to_dlpack_in_flight() }.unwrap()
        })
        .collect();
    HandedOver {
        capsules,
        _tag: DropCounted(drops.clone()),
    }
}

/// Runs `child` in a child process forked from this one and returns its exit status:
/// `child`'s return value, or 101 if it panicked. The child runs nothing but `child` and
/// leaves with `_exit` (none of the harness's code, no exit handlers); a child that has
/// not ended within 60 s is killed, and that fails the calling test.
pub fn in_forked_child(child: impl FnOnce() -> i32) -> i32 {
    use std::time::{Duration, Instant};
    // SAFETY: fork has no precondition. The child runs only `child`, under catch_unwind
    // (a panic must not unwind into its copy of the harness), then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        let code =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(child)).unwrap_or_else(|p| {
                let what = p
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| p.downcast_ref::<String>().cloned())
                    .unwrap_or_default();
                child_says(&format!("panicked: {what}"));
                101
            });
        // The parent sees only the low 8 bits: a code that is not 0 but whose low byte is
        // (a mask of wrong answers from the ninth check on) must not read as success.
        let code = if code != 0 && code & 0xFF == 0 {
            255
        } else {
            code
        };
        // SAFETY: ends the child at once, running no harness code and no exit handler.
        unsafe { libc::_exit(code) }
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut status = 0;
        // SAFETY: waits for this process's own child; the status goes to a live local.
        let done = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if done == pid {
            assert!(
                libc::WIFEXITED(status),
                "the child was ended by a signal ({status})"
            );
            return libc::WEXITSTATUS(status);
        }
        assert_eq!(done, 0, "waitpid failed");
        if Instant::now() > deadline {
            // SAFETY: signals and reaps this process's own child.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, &mut status, 0);
            }
            panic!("the forked child did not end within 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Writes a line to the process's standard error itself: the harness captures what
/// `eprintln!` and panic messages print, and a forked child's capture is never shown.
fn child_says(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "forked child: {line}");
}

/// Whether `r` is `Error::ForkedChild` naming `call`; says what it was otherwise.
fn refused(r: pinlane::Result<()>, call: &str) -> bool {
    matches!(r, Err(pinlane::Error::ForkedChild { op }) if op == call) || {
        child_says(&format!("{call}: {r:?}"));
        false
    }
}

/// What a child forked after CUDA was set up gets when it waits on what its parent
/// started (run by [`in_forked_child`]), as a bit mask of what went wrong, 0 when all is
/// right: `pending` (a non-blocking call's handle) says it is ready, and its waits
/// (bounded and not) fail at once with `Error::ForkedChild`; `prefetcher`'s next batch
/// is that error, then the iterator ends; `memory_stats` is all zeros (it would take the
/// parent's pool locks and ask the driver); `settle` and `shutdown` (the default
/// runtime's and the free function) fail at once with `Error::ForkedChild`, as do the
/// runtime's settings but `set_host_pool_bytes` (which changes nothing there),
/// `Config::install`, `trim` and `warm_up`; dropping the prefetcher does not wait for its
/// worker. None of these takes a lock a parent's thread may have held at the fork. Each of these
/// waited for ever, or for its bound, before session 63.
pub fn waits_in_forked_child(
    mut pending: pinlane::Transfer<Vec<Tensor>>,
    mut prefetcher: pinlane::Prefetcher<Vec<Tensor>>,
) -> i32 {
    use pinlane::Error;
    use std::time::{Duration, Instant};
    let start = Instant::now();
    let forked = |r: &pinlane::Result<Vec<Tensor>>, call: &str| {
        matches!(r, Err(Error::ForkedChild { op }) if *op == call) || {
            child_says(&format!("{call}: {:?}", r.as_ref().map(Vec::len)));
            false
        }
    };
    let checks = [
        pending.is_ready(),
        pending
            .wait_timeout(Duration::from_secs(30))
            .is_some_and(|r| forked(&r, "Transfer::wait")),
        forked(&pending.wait(), "Transfer::wait"),
        prefetcher
            .next()
            .is_some_and(|r| forked(&r, "Prefetcher::next")),
        prefetcher.next().is_none(),
        pinlane::memory_stats() == pinlane::MemoryStats::default(),
        // Both would wait out their 30 s for the pending call and the parent's threads.
        refused(pinlane::settle(Duration::from_secs(30)), "settle"),
        refused(pinlane::shutdown(Duration::from_secs(30)), "shutdown"),
        refused(
            pinlane::runtime().shutdown(Duration::from_secs(30)),
            "shutdown",
        ),
        // The runtime's settings, each of which would take a pool's lock or free the
        // parent's memory; installing a configuration would take the default's lock.
        refused(
            pinlane::runtime().set_arena_bytes(1 << 20),
            "Runtime::set_arena_bytes",
        ),
        refused(
            pinlane::runtime().set_pinned_output_bytes(0),
            "Runtime::set_pinned_output_bytes",
        ),
        refused(
            pinlane::runtime().set_device_pool_release_bytes(0),
            "Runtime::set_device_pool_release_bytes",
        ),
        {
            let before = pinlane::runtime().config().host_pool_bytes;
            pinlane::runtime().set_host_pool_bytes(before / 2 + 1);
            pinlane::runtime().config().host_pool_bytes == before
        },
        refused(
            pinlane::Config::new()
                .arena_bytes(1 << 20)
                .install()
                .map(drop),
            "Config::install",
        ),
        refused(pinlane::trim(), "trim"),
        refused(pinlane::warm_up(pinlane::Device::cuda(0)), "warm_up"),
        {
            drop(prefetcher);
            start.elapsed() < Duration::from_secs(5)
        },
    ];
    let mut wrong = 0;
    for (i, ok) in checks.into_iter().enumerate() {
        if !ok {
            child_says(&format!("check {i} is wrong"));
            wrong |= 1 << i;
        }
    }
    wrong
}

/// What a child forked after CUDA was set up gets from pinlane (run by
/// [`in_forked_child`]), as a bit mask of what went wrong, 0 when all is right: each call
/// that would use the parent's CUDA state (an H2D of `host`, a D2H of `on_device`, a copy
/// of `host` into `on_device`, a copy of `on_device` into `targets` (page-locked tensors
/// the parent made, of `host`'s shapes), a new stream on `device`, lending or exporting a
/// device tensor (`device_ptr` and `to_dlpack_on` on `stream`, a stream of `device` the
/// parent made; `to_dlpack`), page-locking a host
/// tensor) fails
/// with `Error::ForkedChild` naming it, and a D2H of host tensors (nothing to copy)
/// passes them through.
pub fn refusals_in_forked_child(
    host: &[Tensor],
    on_device: &[Tensor],
    targets: &[Tensor],
    device: pinlane::Device,
    stream: &pinlane::Stream,
) -> i32 {
    use pinlane::Error;
    let (host, on_device, targets) = (host.to_vec(), on_device.to_vec(), targets.to_vec());
    let mut wrong = 0;
    let checks = [
        refused(
            pinlane::transfer_tensor_h2d(&host).map(drop),
            "transfer_tensor_h2d",
        ),
        refused(
            pinlane::transfer_tensor_d2h(&on_device, &Default::default()).map(drop),
            "transfer_tensor_d2h",
        ),
        refused(
            pinlane::transfer_tensor_h2d_into(&host, &on_device, &pinlane::IntoOptions::default())
                .map(drop),
            "transfer_tensor_h2d_into",
        ),
        refused(
            // SAFETY: the destinations are this function's own, touched by nothing else.
            unsafe {
                pinlane::transfer_tensor_d2h_into(
                    &on_device,
                    &targets,
                    &pinlane::IntoOptions::default(),
                )
            },
            "transfer_tensor_d2h_into",
        ),
        refused(pinlane::Stream::new(device).map(drop), "Stream::new"),
        refused(on_device[0].device_ptr(stream).map(drop), "device_ptr"),
        refused(on_device[0].to_dlpack().map(drop), "to_dlpack"),
        refused(on_device[0].to_dlpack_on(stream).map(drop), "to_dlpack_on"),
        refused(host[0].to_pinned_on(device).map(drop), "to_pinned"),
        refused(pinlane::trim(), "trim"),
        pinlane::transfer_tensor_d2h(&host, &Default::default())
            .is_ok_and(|b| b.len() == host.len()),
    ];
    for (i, ok) in checks.into_iter().enumerate() {
        if !ok {
            wrong |= 1 << i;
        }
    }
    wrong
}

/// An owner that keeps `T` alive and records the name of each thread that drops it (for
/// tests of which pinlane thread lets another library's memory go, and when).
pub struct DropNames<T>(pub Arc<Mutex<Vec<String>>>, pub T);

impl<T> Drop for DropNames<T> {
    fn drop(&mut self) {
        let name = std::thread::current().name().unwrap_or("?").to_string();
        self.0.lock().unwrap_or_else(|p| p.into_inner()).push(name);
    }
}
