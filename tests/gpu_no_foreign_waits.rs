//! GPU: once a device is warm, no transfer waits for work that another thread queued on
//! its own stream.
//!
//! Found by a hostile test: another thread's first D2H waited 3 s for a host function on
//! an unrelated non-blocking stream. Measured causes (`cuModuleLoadData` and
//! `cuMemFreeHost` both wait for every stream of the context): the gather kernel loaded
//! on the first D2H with small tensors, and output blocks freed to make room under the
//! pool's cap. `cuMemHostUnregister` waits too (session 66), and while either waits,
//! every thread's copies are held, whatever keeps the device busy (sessions 67 and 68,
//! `benches/probes/batch_copy_wait.cu` and `free_hold.cu`: another thread's 1 MiB copy
//! took 475 ms to queue while a free or an unregister waited 480 ms behind a host
//! function or a kernel). So a free on pinlane's free thread spares the calling thread
//! the wait, not the process's copies: the pool frees a block only to make room for a
//! batch no free block can hold (a documented wait), and this test's batch at the cap
//! gets ordinary memory instead. Ending a registration is a documented wait of the
//! caller's making, so the registration here outlives the other stream's work. And the driver runs the host functions of all streams
//! one at a time (session 67: the other stream's work here is a host function, and a non-blocking
//! call's wake-up, queued as a host function on pinlane's stream, held the thread's next
//! transfer for 2968 ms). One test in its own binary, so nothing else warmed the device
//! first.
// A stream kept busy with a host-side delay: `--features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    memory_stats, transfer_tensor_d2h, transfer_tensor_h2d, transfer_tensor_h2d_into, Config,
    D2hOptions, DType, HostOutput, IntoOptions, Location, Stream, Tensor,
};
use pinlane::{transfer_tensor_d2h_async, transfer_tensor_h2d_async, H2dOptions};
use std::time::{Duration, Instant};

const BUSY: Duration = Duration::from_secs(3);

#[test]
fn transfers_do_not_wait_for_other_streams() {
    require_gpu!();
    if common::under_sanitizer() {
        // A timing test: the sanitizer serialises kernels, so the gather kernel queues
        // behind the other stream's 3 s of work there, which is the tool's doing.
        eprintln!("skipped under compute-sanitizer (timing)");
        return;
    }
    // A small output pool (8 MiB): the 4 MiB block the warm-up leaves free becomes the
    // shared block of the small tensors' D2H below, so the 6 MiB batch finds the pool at
    // its cap with no free block.
    Config::new()
        .pinned_output_bytes(8 << 20)
        .install()
        .unwrap();
    let dev = common::dev();
    // Warm: one H2D (the device's context, pool and kernel), and one D2H leaving a free
    // 4 MiB output block. No D2H of small tensors has run yet.
    let warm = vec![common::tensor(DType::U8, &[3 << 20], 1)];
    let on = transfer_tensor_h2d(&warm).unwrap();
    drop(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap());

    // Memory page-locked in place, with its copy's destination and stream, made before
    // the other stream is busy. (Registering device-mapped memory does not wait for the
    // device: 0.08 to 0.64 ms behind 500 ms of another stream's work, session 67's probe,
    // `benches/probes/unregister_wait.cu`.)
    let in_place = vec![common::tensor(DType::U8, &[1 << 20], 4)];
    let registered = vec![in_place[0].register_pinned(dev).unwrap()];
    let (dst, _buf, _) = common::into::destinations(&in_place, 0);
    let copies = Stream::new(dev).unwrap();
    let mine = Stream::new(dev).unwrap();

    // Another thread's stream is busy for 3 s.
    let busy = Stream::new(dev).unwrap();
    busy.delay_async(BUSY).unwrap();
    let started = Instant::now();

    let worker = std::thread::spawn(move || {
        let small: Vec<Tensor> = (0..32)
            .map(|i| common::tensor(DType::F32, &[100 + i], i as u64))
            .collect();
        let big = vec![common::tensor(DType::U8, &[6 << 20], 2)];
        let mid = vec![common::tensor(DType::U8, &[1 << 20], 6)];
        let pinned = common::tensor(DType::I64, &[1000], 3)
            .to_pinned_on(common::dev())
            .unwrap();
        let mut times = Vec::new();
        let mut time = |what: &'static str, f: &mut dyn FnMut()| {
            let t0 = Instant::now();
            f();
            times.push((what, t0.elapsed()));
        };
        let mut on_small = Vec::new();
        time("h2d of 32 small pageable tensors", &mut || {
            on_small = transfer_tensor_h2d(&small).unwrap()
        });
        // A non-blocking call's wake-up is a host function: on pinlane's wake stream, not
        // on the call's stream, where the thread's next transfer would queue behind it
        // (it took 2968 ms there, session 67), nor on a caller's stream of a D2H.
        let mut on_mid = Vec::new();
        time("h2d, non-blocking, waited", &mut || {
            on_mid = transfer_tensor_h2d_async(&mid, &H2dOptions::default())
                .unwrap()
                .wait()
                .unwrap()
        });
        time("h2d after it, on the same thread", &mut || {
            drop(transfer_tensor_h2d(&mid).unwrap())
        });
        time(
            "d2h, non-blocking on a stream of the caller's, waited",
            &mut || {
                let opts = D2hOptions::default().device(dev).stream(mine.clone());
                let back = transfer_tensor_d2h_async(&on_mid, &opts)
                    .unwrap()
                    .wait()
                    .unwrap();
                assert_eq!(back, mid);
            },
        );
        time("that stream's synchronisation after it", &mut || {
            mine.synchronize().unwrap()
        });
        time("d2h of 32 small tensors (gather kernel)", &mut || {
            assert_eq!(
                transfer_tensor_d2h(&on_small, &D2hOptions::default()).unwrap(),
                small
            )
        });
        let mut on_big = Vec::new();
        time("h2d of 6 MiB", &mut || {
            on_big = transfer_tensor_h2d(&big).unwrap()
        });
        // The pool is at its cap with no free block: the batch gets ordinary memory, and
        // nothing is freed (a free would hold every copy of the
        // process until the other stream's work ends: see the module docs). Before
        // session 68 this step was named an eviction; it never was one.
        let before = memory_stats().pinned_outputs;
        time("d2h of 6 MiB (pool at its cap: pageable)", &mut || {
            let back = transfer_tensor_d2h(&on_big, &D2hOptions::default()).unwrap();
            assert_eq!(back, big);
            assert_eq!(back[0].location(), Location::Host, "not a fallback");
        });
        let after = memory_stats().pinned_outputs;
        assert_eq!(
            (before.held_bytes, before.in_use_bytes),
            (after.held_bytes, after.in_use_bytes),
            "the pool changed: before {before:?}, after {after:?}"
        );
        time("d2h of 6 MiB into pageable memory", &mut || {
            let opts = D2hOptions::default().output(HostOutput::Pageable);
            assert_eq!(transfer_tensor_d2h(&on_big, &opts).unwrap(), big)
        });
        time("h2d of a page-locked tensor", &mut || {
            drop(transfer_tensor_h2d(&vec![pinned.clone()]).unwrap())
        });
        // A non-blocking copy into existing tensors from pageable memory, waited: its
        // handle's wake-up is a host function on a stream of pinlane's (made at the first
        // wait), which the driver may run after other streams' host functions.
        let opts = IntoOptions::default().stream(copies.clone());
        time("copy into from pageable memory, waited", &mut || {
            let handle = transfer_tensor_h2d_into(&in_place, &dst, &opts).unwrap();
            handle.wait().unwrap();
        });
        // From memory page-locked in place: read in place, no wait. The registration
        // outlives the other stream's work (see the module docs): it is dropped after.
        time("copy into from a registration, waited", &mut || {
            let handle = transfer_tensor_h2d_into(&registered, &dst, &opts).unwrap();
            handle.wait().unwrap();
        });
        time("the check (a d2h of the destination)", &mut || {
            assert_eq!(
                transfer_tensor_d2h(&dst, &D2hOptions::default()).unwrap(),
                in_place
            )
        });
        (times, (pinned, registered), Instant::now())
    });
    let (mut times, pinned, returned) = worker.join().unwrap();
    let total = started.elapsed();
    times.push((
        "the worker's exit (its thread-locals dropped)",
        returned.elapsed(),
    ));
    // Not timed: dropping the last owner of a page-locked tensor of one's own (`pinned`, and
    // the registration) frees it, or ends the registration, on the dropping thread, which
    // waits for the device (docs/semantics.md).
    drop(pinned);
    for (what, t) in &times {
        eprintln!("{what:45} {:>9.3} ms", t.as_secs_f64() * 1e3);
    }
    assert!(
        total < BUSY / 2,
        "the transfers took {total:?} in all while another stream was busy for {BUSY:?}: {times:?}"
    );
    busy.synchronize().unwrap();
}
