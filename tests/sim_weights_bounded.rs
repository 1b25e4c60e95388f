//! A load's waits for its copies are bounded as a blocking transfer's are: with
//! `Config::sync_wait`, a load on a device whose every operation starts up to 1.5 s late
//! fails within the limit with `Error::SyncTimeout` instead of waiting, and what the
//! copies use is held until they finish. Its own binary: the limit and the delays are
//! the runtime's and the simulator's.
#![cfg(all(feature = "test-util", feature = "weights"))]

mod common;

use common::weights::{uniform, written};
use pinlane::driver::sim::SimConfig;
use pinlane::weights::{Checkpoint, LoadOptions};
use pinlane::{Config, Error};
use std::time::{Duration, Instant};

#[test]
fn a_load_whose_copies_outlast_sync_wait_fails_within_it() {
    common::sim_with(
        || Config::new().sync_wait(Some(Duration::from_millis(100))),
        // Seeded: every run delays the same operations by the same times.
        || SimConfig::seeded(0xB0_0D).max_delay(Duration::from_millis(1500)),
    );
    let (dir, p) = written("bounded", &uniform(1, "F32", 4, 300));
    let ckpt = Checkpoint::open(&p).unwrap();
    let t0 = Instant::now();
    let r = ckpt.load(&LoadOptions::default());
    let took = t0.elapsed();
    assert!(
        matches!(r, Err(Error::SyncTimeout { waited_ms: 100 })),
        "{:?}",
        r.map(|m| m.len())
    );
    // The wait itself ended at the limit; queueing (no device wait) adds little.
    assert!(
        took < Duration::from_millis(1000),
        "returned after {took:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
