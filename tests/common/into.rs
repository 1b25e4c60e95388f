//! Destinations for copies into existing tensors (issue 23): views of one static device
//! buffer, and the check that it holds the sources' bytes and nothing else changed.

use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, Batch, D2hOptions, Stream, Tensor};

/// The byte every static buffer starts filled with.
pub const FILL: u8 = 0xA5;

/// One static device buffer of `len` bytes, filled with [`FILL`].
pub fn static_buffer(len: usize) -> Tensor {
    transfer_tensor_h2d(&Tensor::from_vec(vec![FILL; len], [len]).unwrap()).unwrap()
}

/// A view of `buf` at byte `at`, with `like`'s dtype and shape.
pub fn view(buf: &Tensor, at: usize, like: &Tensor) -> Tensor {
    let stream = Stream::legacy(super::dev()).unwrap();
    let guard = buf.device_ptr(&stream).unwrap();
    let ptr = guard.ptr() + at as u64;
    guard.finish().unwrap();
    // SAFETY: `ptr..+nbytes` lies inside `buf` (the caller placed it so), which the owner
    // (a clone of `buf`) keeps allocated; nothing else writes it but these tests' copies,
    // queued on the legacy stream that the later reads follow.
    unsafe { Tensor::from_device_ptr(ptr, super::dev(), like.dtype(), like.dims(), buf.clone()) }
        .unwrap()
}

/// Destinations for `src`'s tensors in one static buffer: each at a place aligned to its
/// dtype, `skew` elements past a 256-byte boundary (so some are not 16-byte aligned), with
/// a gap after each. Returns the batch of views, the buffer, and each view's range.
pub fn destinations<B: Batch>(src: &B, skew: usize) -> (B, Tensor, Vec<(usize, usize)>) {
    let mut ranges = Vec::new();
    let mut end = 0usize;
    for t in pinlane::batch::tensors(src) {
        let at = end.next_multiple_of(256) + skew * t.dtype().size();
        ranges.push((at, t.nbytes()));
        end = at + t.nbytes() + 64;
    }
    let buf = static_buffer(end.max(1));
    let mut k = 0;
    let dst = src.rebuild(&mut |t| {
        let v = view(&buf, ranges[k].0, t);
        k += 1;
        v
    });
    (dst, buf, ranges)
}

/// Checks that `buf` holds `src`'s bytes at `ranges` and [`FILL`] everywhere else.
pub fn check_buffer<B: Batch>(
    buf: &Tensor,
    src: &B,
    ranges: &[(usize, usize)],
) -> Result<(), String> {
    let host = transfer_tensor_d2h(buf, &D2hOptions::default()).map_err(|e| e.to_string())?;
    let bytes = host.as_bytes().map_err(|e| e.to_string())?;
    let mut expect = vec![FILL; bytes.len()];
    for (t, &(at, n)) in pinlane::batch::tensors(src).iter().zip(ranges) {
        expect[at..at + n].copy_from_slice(t.as_bytes().map_err(|e| e.to_string())?);
    }
    match bytes.iter().zip(&expect).position(|(a, b)| a != b) {
        None => Ok(()),
        Some(i) => Err(format!(
            "byte {i} of the static buffer: {:#04x}, expected {:#04x}",
            bytes[i], expect[i]
        )),
    }
}
