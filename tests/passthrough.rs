//! Without CUDA, both calls return the input as is; bad options are errors on every
//! machine. (With CUDA present, the pass-through checks say so and defer to the GPU suite.)

mod common;

use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, Error, Tensor};

fn no_cuda() -> bool {
    if pinlane::driver::available().is_some() {
        eprintln!("CUDA is present: pass-through without CUDA is not what runs here (gpu_* tests cover this machine)");
        return false;
    }
    true
}

#[test]
fn no_cuda_h2d_returns_the_same_storage() {
    if !no_cuda() {
        return;
    }
    let b = (
        vec![common::tensor(pinlane::DType::F32, &[4, 4], 1)],
        "leaf",
        3u8,
    );
    let r = transfer_tensor_h2d(&b).unwrap();
    assert_eq!(r, b);
    assert!(r.0[0].same_storage(&b.0[0]), "a cheap clone, not a copy");
    assert_eq!(
        pinlane::observe::last_transfer_stats(),
        None,
        "nothing was moved"
    );
}

#[test]
fn no_cuda_d2h_returns_input_even_for_unknown_index() {
    if !no_cuda() {
        return;
    }
    let b = vec![common::tensor(pinlane::DType::I64, &[3], 2)];
    // Without a driver the device count is unknown, so cuda:99 cannot be refused.
    let r = transfer_tensor_d2h(&b, &D2hOptions::default().device("cuda:99")).unwrap();
    assert!(r[0].same_storage(&b[0]));
}

#[test]
fn d2h_rejects_non_cuda_devices_everywhere() {
    let b = vec![Tensor::scalar(1.0f32)];
    for bad in ["cpu", "cuda:x", "gpu", "", "cuda:", "cuda:-1"] {
        let e = transfer_tensor_d2h(&b, &D2hOptions::default().device(bad)).unwrap_err();
        assert_eq!(e, Error::InvalidDevice { value: bad.into() }, "{bad:?}");
        assert!(e.to_string().contains("not a CUDA device"), "{e}");
    }
}

#[test]
fn d2h_of_a_batch_without_tensors_is_the_input() {
    let b = (1i32, String::from("x"), vec![2.5f64]);
    assert_eq!(transfer_tensor_d2h(&b, &D2hOptions::default()).unwrap(), b);
}

/// The strategies are pinlane's (feature `proptest`, on with `test-util`).
#[cfg(feature = "proptest")]
mod props {
    use super::*;
    use pinlane::Value;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn no_cuda_round_trip_is_identity(v in common::value()) {
            if pinlane::driver::available().is_none() {
                let there = transfer_tensor_h2d(&v).unwrap();
                let back = transfer_tensor_d2h(&there, &D2hOptions::default()).unwrap();
                prop_assert_eq!(&back, &v);
                let _: &Value = &back;
            }
        }
    }
}
