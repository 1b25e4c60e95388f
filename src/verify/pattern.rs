//! Tensors whose bytes reveal misplaced data: [`pattern`], [`patterned`].

use crate::dtype::DType;
use crate::error::Result;
use crate::layout::Shape;
use crate::tensor::Tensor;

/// Bytes that reveal misplaced data: each depends on its index and `seed` (xorshift), so
/// a byte copied to the wrong place, or from the wrong tensor, shows.
pub fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// A host tensor of `dtype` and `dims` with [`pattern`] bytes from `seed` (bool tensors
/// hold 0 and 1).
///
/// ```
/// use pinlane::verify::patterned;
/// use pinlane::DType;
/// let t = patterned(DType::F32, &[2, 3], 7)?;
/// assert_eq!((t.dims(), t.nbytes()), (&[2, 3][..], 24));
/// assert_ne!(t, patterned(DType::F32, &[2, 3], 8)?);
/// # Ok::<(), pinlane::Error>(())
/// ```
///
/// # Errors
/// [`Error::ShapeOverflow`](crate::error::Error::ShapeOverflow) when the byte size
/// overflows `usize`.
pub fn patterned(dtype: DType, dims: &[usize], seed: u64) -> Result<Tensor> {
    let shape = Shape::new(dims.to_vec());
    let mut bytes = pattern(shape.try_nbytes(dtype)?, seed);
    if dtype == DType::Bool {
        bytes.iter_mut().for_each(|b| *b &= 1);
    }
    Tensor::from_bytes(dtype, shape, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_differ_by_seed_and_position() {
        let a = pattern(64, 1);
        assert_ne!(a, pattern(64, 2));
        assert!(a.windows(2).any(|w| w[0] != w[1]));
        let b = patterned(DType::Bool, &[100], 3).unwrap();
        assert!(b.as_bytes().unwrap().iter().all(|&x| x <= 1));
        assert!(
            patterned(DType::F64, &[usize::MAX, 2], 1).is_err(),
            "overflow is an error"
        );
    }
}
