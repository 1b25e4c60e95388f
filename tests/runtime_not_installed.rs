//! `memory_stats()` and `trim()` before the runtime exists install nothing (issue 19): a
//! library that asks for statistics early does not fix the process's configuration. Its
//! own binary, so that nothing else creates the runtime first; it needs no device (with
//! or without a driver, the same holds).

use pinlane::{Config, PoolStats};

#[test]
fn stats_and_trim_before_any_transfer_leave_the_configuration_open() {
    let s = pinlane::memory_stats();
    assert_eq!(s.staging, PoolStats::default());
    assert_eq!(s.pinned_outputs, PoolStats::default());
    assert_eq!(s.pageable_outputs, PoolStats::default());
    assert_eq!((s.retained_owners, s.retained_bytes), (0, 0));
    pinlane::trim().unwrap();
    let arena = 24 << 20;
    Config::new()
        .arena_bytes(arena)
        .install()
        .expect("memory_stats() or trim() installed a configuration");
    assert_eq!(pinlane::runtime().config().arena_bytes, arena);
    assert!(pinlane::memory_stats().staging.held_bytes <= arena);
}
