//! A bounded wait for a blocking call's copies (issue 19, item 4): with
//! `Config::sync_wait`, a D2H whose copies wait behind a stream that stays busy returns
//! within the limit with `Error::SyncTimeout`, holds (and counts) what the copies use
//! until they finish, and the next calls work. Its own binary: the limit is the runtime's.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::sim::SimConfig;
use pinlane::{
    memory_stats, set_current_stream, transfer_tensor_d2h, transfer_tensor_h2d, Config, D2hOptions,
    DType, Device, Error, HostOutput, Stream,
};
use std::time::{Duration, Instant};

fn sim() {
    common::sim_with(
        || Config::new().sync_wait(Some(Duration::from_millis(200))),
        || SimConfig::seeded(0x5_1C).max_delay(Duration::from_micros(40)),
    );
}

#[test]
fn a_blocking_call_whose_copies_wait_too_long_fails_within_its_limit() {
    sim();
    let d0 = Device::cuda(0);
    let host = vec![
        common::tensor(DType::F32, &[4096], 1),
        common::tensor(DType::U8, &[3, 7], 2),
    ];
    let on = transfer_tensor_h2d(&host).unwrap();
    for output in [HostOutput::Pinned, HostOutput::Pageable] {
        // The caller's current stream stays busy for 2 s: the D2H's copies wait for it.
        let busy = Stream::new(d0).unwrap();
        busy.delay_async(Duration::from_secs(2)).unwrap();
        let before = memory_stats().retained_bytes;
        let t0 = Instant::now();
        let r = {
            let _g = set_current_stream(&busy);
            transfer_tensor_d2h(&on, &D2hOptions::default().output(output))
        };
        let took = t0.elapsed();
        // Before: the call waited in cuStreamSynchronize for the whole 2 s.
        assert!(
            matches!(r, Err(Error::SyncTimeout { waited_ms }) if waited_ms >= 200),
            "{output:?}: {r:?}"
        );
        assert!(
            took < Duration::from_millis(1500),
            "{output:?}: returned after {took:?}"
        );
        assert!(
            memory_stats().retained_bytes > before,
            "{output:?}: what the copies use is held"
        );
        // Once the stream has finished, a release check gives it back.
        busy.synchronize().unwrap();
        pinlane::memory::retained::try_release();
        assert_eq!(memory_stats().retained_bytes, before, "{output:?}");
        // The input is unchanged, and the next call moves it exactly.
        assert_eq!(
            transfer_tensor_d2h(&on, &D2hOptions::default().output(output)).unwrap(),
            host
        );
    }
}

#[test]
fn with_a_bound_the_frees_a_caller_causes_do_not_wait_for_a_busy_device() {
    // Before: the last drop of a `to_pinned` buffer and `trim()` freed on the caller's
    // thread, and `cuMemFreeHost` waited for the busy stream (2 s here). With
    // `Config::sync_wait` they go to the free thread (tests/sim_waits.rs shows the
    // default, which waits).
    sim();
    let d0 = Device::cuda(0);
    let src = common::tensor(DType::F32, &[4096], 3);
    let t = src.to_pinned_on(d0).unwrap();
    assert_eq!(t, src);
    let busy = Stream::new(d0).unwrap();
    busy.delay_async(Duration::from_secs(2)).unwrap();
    let t0 = Instant::now();
    drop(t);
    pinlane::trim().unwrap();
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(1000),
        "returned after {took:?}"
    );
    busy.synchronize().unwrap();
}

#[test]
fn the_bound_in_force_is_the_installed_runtimes() {
    // `pinlane::sync_wait()`: what code beside pinlane's calls reads to decide whether to
    // take a bounded wait of its own (the Python package before torch's copies). The
    // doctest shows `None` with no runtime installed; here the runtime sets 200 ms, and
    // `wait_for_event` waits with that bound.
    sim();
    assert_eq!(pinlane::sync_wait(), Some(Duration::from_millis(200)));
    let d0 = Device::cuda(0);
    let busy = Stream::new(d0).unwrap();
    busy.delay_async(Duration::from_secs(2)).unwrap();
    let done = pinlane::Event::new(d0).unwrap();
    done.record(&busy).unwrap();
    let t0 = Instant::now();
    let r = pinlane::wait_for_event(&done);
    assert!(matches!(r, Err(Error::SyncTimeout { .. })), "{r:?}");
    assert!(
        t0.elapsed() < Duration::from_millis(1500),
        "{:?}",
        t0.elapsed()
    );
    busy.synchronize().unwrap();
}
