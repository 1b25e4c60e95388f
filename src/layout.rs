//! Shapes: plain data, no unsafe. pinlane tensors are contiguous and row-major, so a
//! shape (and the dtype) is the whole layout.

use crate::dtype::DType;
use crate::error::{Error, Result};

/// The dimensions of a contiguous, row-major tensor.
///
/// A 0-dim shape (`[]`) holds one element (a scalar); a shape with any zero dimension
/// holds none.
///
/// ```
/// use pinlane::Shape;
/// let s = Shape::new(vec![2, 3, 4]);
/// assert_eq!(s.numel(), 24);
/// assert_eq!(Shape::scalar().numel(), 1);
/// assert_eq!(Shape::new(vec![5, 0]).numel(), 0);
/// ```
///
/// Cheap to clone (the dimensions are shared), so every tensor a transfer returns shares
/// its source's shape instead of allocating one.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct Shape(std::sync::Arc<[usize]>);

impl Shape {
    /// A shape from its dimensions.
    pub fn new(dims: Vec<usize>) -> Self {
        Shape(dims.into())
    }

    /// The 0-dim shape of a scalar.
    pub fn scalar() -> Self {
        Shape(std::sync::Arc::new([]))
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.0.len()
    }

    /// Number of elements; saturates at `usize::MAX` (see [`Shape::try_nbytes`]).
    pub fn numel(&self) -> usize {
        self.try_numel().unwrap_or(usize::MAX)
    }

    /// Number of elements, or `None` if it overflows `usize`.
    pub fn try_numel(&self) -> Option<usize> {
        // A zero dimension makes the count 0 whatever the others are, even if multiplying
        // them first would overflow.
        if self.0.contains(&0) {
            return Some(0);
        }
        self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Bytes taken by this shape's elements of `dtype`, checked for overflow.
    ///
    /// # Errors
    /// [`Error::ShapeOverflow`] when the byte size overflows `usize`.
    pub fn try_nbytes(&self, dtype: DType) -> Result<usize> {
        self.try_numel()
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| Error::ShapeOverflow {
                shape: self.0.to_vec(),
            })
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape(dims.into())
    }
}

impl From<&[usize]> for Shape {
    fn from(dims: &[usize]) -> Self {
        Shape(dims.into())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape(dims.as_slice().into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scalar_has_one_element_and_zero_dims_have_none() {
        assert_eq!(Shape::scalar().numel(), 1);
        assert_eq!(Shape::scalar().rank(), 0);
        assert_eq!(Shape::from([3, 0, 7]).numel(), 0);
        assert_eq!(Shape::from([3, 0, 7]).try_nbytes(DType::F64).unwrap(), 0);
    }

    #[test]
    fn a_zero_dimension_wins_over_an_overflowing_product() {
        // Regression: multiplying left to right overflowed before reaching the 0.
        let s = Shape::from([2, usize::MAX, 0]);
        assert_eq!(s.try_numel(), Some(0));
        assert_eq!(s.numel(), 0);
        assert_eq!(
            Shape::from([1 << 40, 1 << 40, 0])
                .try_nbytes(DType::F64)
                .unwrap(),
            0
        );
        let t = crate::Tensor::from_vec(Vec::<f64>::new(), [1 << 40, 1 << 40, 0]).unwrap();
        assert_eq!(t.nbytes(), 0);
    }

    #[test]
    fn overflow_is_an_error_not_a_panic() {
        let s = Shape::from([usize::MAX, 2]);
        assert_eq!(s.try_numel(), None);
        assert!(matches!(
            s.try_nbytes(DType::U8),
            Err(Error::ShapeOverflow { .. })
        ));
        let s = Shape::from([usize::MAX / 2 + 1]);
        assert!(s.try_numel().is_some());
        assert!(s.try_nbytes(DType::I16).is_err());
    }
}
