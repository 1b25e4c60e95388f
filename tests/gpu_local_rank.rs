//! GPU: LOCAL_RANK chooses the device; bad values are typed errors naming the value and
//! the device count. (Its own binary: it changes the process environment.)

mod common;

use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, Error, Location, Tensor};

/// Runs `f` on a new thread with `LOCAL_RANK` set to `value` (`None`: unset): a thread
/// reads `LOCAL_RANK` once, at its first call that needs the default device.
fn with_local_rank<T: Send>(value: Option<&str>, f: impl FnOnce() -> T + Send) -> T {
    match value {
        Some(v) => std::env::set_var("LOCAL_RANK", v),
        None => std::env::remove_var("LOCAL_RANK"),
    }
    std::thread::scope(|s| s.spawn(f).join().unwrap())
}

#[test]
fn local_rank_selects_and_validates() {
    require_gpu!();
    let count = pinlane::driver::available().unwrap().device_count;
    let b = vec![Tensor::from_vec(vec![1u16, 2, 3], [3]).unwrap()];
    let home = std::env::var("LOCAL_RANK").ok();

    let on = with_local_rank(None, || transfer_tensor_h2d(&b).unwrap());
    assert_eq!(on[0].location(), Location::Cuda(pinlane::Device::cuda(0)));

    let last = count - 1;
    let (on, back) = with_local_rank(Some(&last.to_string()), || {
        let on = transfer_tensor_h2d(&b).unwrap();
        let back = transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap();
        (on, back)
    });
    assert_eq!(
        on[0].location(),
        Location::Cuda(pinlane::Device::cuda(last))
    );
    assert_eq!(back, b);

    for bad in [
        "abc".to_string(),
        "-1".to_string(),
        "99".to_string(),
        count.to_string(),
    ] {
        let expected = Error::InvalidLocalRank {
            value: bad.clone(),
            device_count: count,
        };
        // d2h with no device resolves LOCAL_RANK too (given a device tensor to move).
        let (h2d, d2h) = with_local_rank(Some(&bad), || {
            (
                transfer_tensor_h2d(&b).unwrap_err(),
                transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap_err(),
            )
        });
        assert_eq!(h2d, expected, "h2d, LOCAL_RANK={bad}");
        assert_eq!(d2h, expected, "d2h, LOCAL_RANK={bad}");
        let msg = expected.to_string();
        assert!(
            msg.contains(&bad) && msg.contains(&count.to_string()),
            "{msg}"
        );
    }
    match home {
        Some(v) => std::env::set_var("LOCAL_RANK", v),
        None => std::env::remove_var("LOCAL_RANK"),
    }
}
