//! GPU: LOCAL_RANK chooses the device; bad values are typed errors naming the value and
//! the device count. (Its own binary: it changes the process environment.)

mod common;

use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, Error, Location, Tensor};

#[test]
fn local_rank_selects_and_validates() {
    require_gpu!();
    let count = pinlane::driver::available().unwrap().device_count;
    let b = vec![Tensor::from_vec(vec![1u16, 2, 3], [3]).unwrap()];

    std::env::remove_var("LOCAL_RANK");
    let on = transfer_tensor_h2d(&b).unwrap();
    assert_eq!(on[0].location(), Location::Cuda(common::dev().ordinal()));

    let last = count - 1;
    std::env::set_var("LOCAL_RANK", last.to_string());
    let on = transfer_tensor_h2d(&b).unwrap();
    assert_eq!(on[0].location(), Location::Cuda(last));
    assert_eq!(transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap(), b);

    for bad in [
        "abc".to_string(),
        "-1".to_string(),
        "99".to_string(),
        count.to_string(),
    ] {
        std::env::set_var("LOCAL_RANK", &bad);
        let expected = Error::InvalidLocalRank {
            value: bad.clone(),
            device_count: count,
        };
        assert_eq!(
            transfer_tensor_h2d(&b).unwrap_err(),
            expected,
            "h2d, LOCAL_RANK={bad}"
        );
        // d2h with no device resolves LOCAL_RANK too (given a device tensor to move).
        assert_eq!(
            transfer_tensor_d2h(&on, &D2hOptions::default()).unwrap_err(),
            expected
        );
        let msg = expected.to_string();
        assert!(
            msg.contains(&bad) && msg.contains(&count.to_string()),
            "{msg}"
        );
    }
    std::env::remove_var("LOCAL_RANK");
}
