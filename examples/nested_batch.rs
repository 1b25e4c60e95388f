//! A nested, dynamically shaped batch (`Value`) to the GPU and back:
//! `cargo run --release --example nested_batch`.

use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, Tensor, Value};

fn main() -> pinlane::Result<()> {
    let batch = Value::map([
        (
            "pixels",
            Value::from(Tensor::from_vec(
                vec![3u8; 2 * 3 * 32 * 32],
                [2, 3, 32, 32],
            )?),
        ),
        (
            "targets",
            Value::List(vec![
                Value::from(Tensor::from_vec(vec![0.25f32, 0.5, 0.75, 1.0], [1, 4])?),
                Value::from(Tensor::from_vec(Vec::<f32>::new(), [0, 4])?),
            ]),
        ),
        ("step", Value::from(12i64)),
    ]);
    let on_gpu = transfer_tensor_h2d(&batch)?;
    for t in pinlane::batch::tensors(&on_gpu) {
        println!("{t:?}");
    }
    let back = transfer_tensor_d2h(&on_gpu, &D2hOptions::default())?;
    println!("round trip unchanged: {}", back == batch);
    Ok(())
}
