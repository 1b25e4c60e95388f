//! A simulated host that page-locks at most 24 MiB (`SimConfig::page_locked_limit`):
//! * a D2H call whose page-locked output block the host cannot lock gets pageable outputs,
//!   with the right bytes, instead of failing with out-of-memory, and the output pool's
//!   unused blocks are freed for the calls after it (the blocking and the non-blocking
//!   call; the staging arena is capped at 8 MiB so that the pageable path's slots fit);
//! * an H2D call whose staging slots beyond its first cannot be locked goes on with those
//!   it has; one that cannot lock its first fails with out-of-memory, and the next call
//!   after room is made works.
//!
//! The tests take turns: they read the process's counts.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::driver::fault::{self, FaultKind};
use pinlane::driver::sim::{enable, page_locked_bytes, SimConfig};
use pinlane::{memory_stats, transfer_tensor_d2h, transfer_tensor_d2h_async};
use pinlane::{transfer_tensor_h2d_with, Config, D2hOptions, DType, H2dOptions, Location, Tensor};
use std::time::{Duration, Instant};

/// `nbytes` patterned bytes (the tests' shared `common::tensor`).
fn tensor(nbytes: usize, seed: u64) -> Tensor {
    common::tensor(DType::U8, &[nbytes], seed)
}

fn on_device(t: &Tensor) -> Vec<Tensor> {
    transfer_tensor_h2d_with(&vec![t.clone()], &H2dOptions::default().num_caches(0)).unwrap()
}

/// Waits (up to 10 s) until the simulator's page-locked bytes are at most `most`: the
/// pool's unused blocks are freed by pinlane's reaper thread, off the call's path.
fn page_locked_down_to(most: usize) -> usize {
    let t0 = Instant::now();
    loop {
        let now = page_locked_bytes().unwrap();
        if now <= most || t0.elapsed() > Duration::from_secs(10) {
            return now;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// This test's turn, with the simulator and the runtime set up.
fn set_up() -> std::sync::MutexGuard<'static, ()> {
    let turn = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    std::env::remove_var("LOCAL_RANK");
    // (The second test to get here finds the same configuration installed.)
    let _ = Config::new()
        .slot_bytes(1 << 20)
        .arena_bytes(8 << 20)
        .install();
    enable(SimConfig::seeded(11).page_locked_limit(24 << 20)).unwrap();
    pinlane::trim().unwrap();
    turn
}

#[test]
fn d2h_gets_pageable_outputs_when_the_host_cannot_page_lock_its_block() {
    let _turn = set_up();
    let opts = D2hOptions::default();

    // A 4 MiB batch gets its page-locked block, which stays in the pool once dropped.
    let small = tensor(4 << 20, 1);
    let back = transfer_tensor_d2h(&on_device(&small), &opts).unwrap();
    assert_eq!(back[0].location(), Location::Pinned);
    assert_eq!(back, vec![small.clone()]);
    drop(back);
    assert_eq!(memory_stats().pinned_outputs.held_bytes, 4 << 20);

    // 16 MiB more does not fit beside the arena and the pool's 4 MiB: pageable outputs.
    let big = tensor(16 << 20, 2);
    let dev = on_device(&big);
    let before = memory_stats().pageable_fallbacks;
    let locked = page_locked_bytes().unwrap();
    assert!(
        locked + (16 << 20) > 24 << 20,
        "the test needs the block not to fit: {locked} bytes page-locked"
    );
    let back = transfer_tensor_d2h(&dev, &opts).expect("falls back, does not fail");
    assert_eq!(back[0].location(), Location::Host);
    assert_eq!(back, vec![big.clone()]);
    assert_eq!(memory_stats().pageable_fallbacks, before + 1);
    // The pool gave its unused 4 MiB block back.
    assert_eq!(memory_stats().pinned_outputs.held_bytes, 0);
    let after = page_locked_down_to(locked - (4 << 20));
    assert!(
        after <= locked - (4 << 20),
        "the unused block was not freed: {after} bytes page-locked, {locked} before"
    );

    // With that room, the next 16 MiB batch gets its page-locked block again.
    let back = transfer_tensor_d2h(&dev, &opts).unwrap();
    assert_eq!(back[0].location(), Location::Pinned);
    assert_eq!(back, vec![big.clone()]);
    drop(back);

    // Out of page-locked memory with a free block large enough (the 16 MiB one, which
    // a 6 MiB batch does not take first: a free block serves batches of at least half
    // its size), that block serves, as at the cap, and nothing falls back. The new
    // block's allocation is made to fail on this thread, which shows it was tried (the
    // simulator would refuse it too: the arena's 8 MiB, 16 and 6 are over 24).
    let mid = tensor(6 << 20, 3);
    let dev = on_device(&mid);
    fault::inject(FaultKind::HostAlloc, 1);
    let kept = transfer_tensor_d2h(&dev, &opts).unwrap();
    assert!(!fault::armed(), "a new block was asked for");
    assert_eq!(kept[0].location(), Location::Pinned);
    assert_eq!(kept, vec![mid.clone()]);
    assert_eq!(
        memory_stats().pinned_outputs.held_bytes,
        16 << 20,
        "the free 16 MiB block, reused"
    );
    assert_eq!(memory_stats().pageable_fallbacks, before + 1);

    // With that block in use, the non-blocking call falls back as the blocking one did.
    fault::inject(FaultKind::HostAlloc, 1);
    let back = transfer_tensor_d2h_async(&dev, &opts)
        .unwrap()
        .wait()
        .unwrap();
    assert!(!fault::armed(), "the block's allocation was tried");
    assert_eq!(back[0].location(), Location::Host);
    assert_eq!(back, vec![mid]);
    assert_eq!(memory_stats().pageable_fallbacks, before + 2);
    drop(kept);
}

#[test]
fn h2d_goes_on_with_the_slots_it_has_when_the_host_cannot_page_lock_more() {
    let _turn = set_up();
    // The sources on the device first (their H2D leases slots), then every slot freed.
    let big = tensor(6 << 20, 4);
    let dev = on_device(&tensor(22 << 20, 5));
    pinlane::trim().unwrap();
    assert_eq!(page_locked_down_to(0), 0, "nothing page-locked");
    // 22 MiB of page-locked outputs kept: room for two 1 MiB slots.
    let kept = transfer_tensor_d2h(&dev, &D2hOptions::default()).unwrap();
    assert_eq!(kept[0].location(), Location::Pinned);
    // A 6 MiB H2D through two slots, then its D2H into pageable outputs through the same
    // two (both lease more without waiting, as long as there are windows for them).
    let back = on_device(&big);
    assert_eq!(memory_stats().staging.held_bytes, 2 << 20, "two slots");
    let pageable = D2hOptions::default().output(pinlane::HostOutput::Pageable);
    assert_eq!(
        transfer_tensor_d2h(&back, &pageable).unwrap(),
        vec![big.clone()]
    );
    assert_eq!(memory_stats().staging.held_bytes, 2 << 20, "two slots");

    // With the host full (the slots freed, 2 MiB more of outputs kept), the first slot
    // cannot be locked: out of memory.
    let two = on_device(&tensor(2 << 20, 6));
    pinlane::trim().unwrap();
    assert_eq!(page_locked_down_to(22 << 20), 22 << 20);
    let full = transfer_tensor_d2h(&two, &D2hOptions::default()).unwrap();
    assert_eq!(full[0].location(), Location::Pinned);
    assert_eq!(page_locked_bytes().unwrap(), 24 << 20);
    let e = transfer_tensor_h2d_with(&vec![big.clone()], &H2dOptions::default().num_caches(0));
    match e {
        Err(e) => assert!(e.is_out_of_memory(), "{e}"),
        Ok(_) => panic!("the host had no room for a slot"),
    }
    drop((full, kept));
    pinlane::trim().unwrap();
    let again = on_device(&big);
    assert_eq!(
        transfer_tensor_d2h(&again, &D2hOptions::default()).unwrap(),
        vec![big]
    );
}

#[test]
fn a_producer_buffer_the_host_cannot_lock_is_out_of_memory_not_a_full_pool() {
    let _turn = set_up();
    fault::inject(FaultKind::HostAlloc, 1);
    let Err(e) = pinlane::memory::PinnedBufferMut::<u8>::new(3 << 20, pinlane::Device::cuda(0))
    else {
        panic!("the host could lock no block");
    };
    assert!(!fault::armed(), "a new block was asked for");
    assert!(e.is_out_of_memory(), "{e}");
    assert!(!matches!(e, pinlane::Error::PinnedPoolFull { .. }), "{e}");
    assert_eq!(memory_stats().pinned_outputs.held_bytes, 0);
    // With room, the same buffer is made.
    assert!(pinlane::memory::PinnedBufferMut::<u8>::new(3 << 20, pinlane::Device::cuda(0)).is_ok());
}
