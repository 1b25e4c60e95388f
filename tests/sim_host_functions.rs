//! Host functions on the simulated device run one at a time across all streams, as the
//! real driver may run them (measured on an H100 with driver 580, session 67: a host
//! function queued on an idle stream ran 479 ms late, behind another stream's 500 ms host
//! function; `benches/probes/unregister_wait.cu`). pinlane's own host functions (the
//! non-blocking calls' wake-ups) must then never sit on a stream whose later work matters.
// The simulated device and the test hooks: `cargo test --features test-util`.
#![cfg(feature = "test-util")]

mod common;

use pinlane::{
    transfer_tensor_d2h, transfer_tensor_d2h_async, transfer_tensor_h2d, transfer_tensor_h2d_async,
    D2hOptions, DType, Device, H2dOptions, Stream, Tensor,
};
use std::time::Duration;

fn batch(seed: u64) -> Vec<Tensor> {
    vec![
        common::tensor(DType::F32, &[30_000], seed),
        common::tensor(DType::U8, &[5000], seed + 1)
            .to_pinned()
            .unwrap(),
    ]
}

fn h2d(b: &Vec<Tensor>) -> pinlane::Transfer<Vec<Tensor>> {
    transfer_tensor_h2d_async(b, &H2dOptions::default()).unwrap()
}

/// A non-blocking call's wake-up is a host function, and the driver may run all streams'
/// host functions one at a time (this binary's simulator does). Queued on the call's
/// stream, it held every later copy there behind another stream's host function: on the
/// H100 the thread's next blocking H2D took 2968 ms behind another thread's 3 s host
/// function, and here 600 ms. Now it goes on a wake stream of pinlane's: neither
/// pinlane's stream nor a caller's `stream` of a D2H waits.
#[test]
fn a_wake_up_never_holds_the_calls_stream_behind_other_host_functions() {
    common::sim_with(common::sim_runtime, || {
        common::sim_device().serial_host_functions(true)
    });
    let dev = Device::cuda(0);
    let b = batch(67);
    let (busy, mine) = (Stream::new(dev).unwrap(), Stream::new(dev).unwrap());
    let on = transfer_tensor_h2d(&b).unwrap(); // warm: the thread's streams
    h2d(&b).wait().unwrap();
    busy.delay_async(Duration::from_millis(600)).unwrap();
    let t0 = std::time::Instant::now();
    let moved = h2d(&b).wait().unwrap();
    let next = transfer_tensor_h2d(&b).unwrap(); // on the same stream, after the wake-up
    let opts = D2hOptions::default().device(dev).stream(mine.clone());
    let back = transfer_tensor_d2h_async(&on, &opts)
        .unwrap()
        .wait()
        .unwrap();
    mine.synchronize().unwrap(); // the caller's stream, after the D2H's wake-up
    let took = t0.elapsed();
    assert!(
        took < Duration::from_millis(400),
        "{took:?}: a wake-up held a stream behind the other stream's host function"
    );
    for out in [&moved, &next] {
        assert_eq!(transfer_tensor_d2h(out, &D2hOptions::default()).unwrap(), b);
    }
    assert_eq!(back, b);
    busy.synchronize().unwrap();
}
