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
/// Cheap to clone: up to [`Shape::INLINE`] dimensions are held inline (a clone is a plain
/// copy, with no reference count to touch, which matters when a transfer builds a
/// thousand output tensors), longer shapes share one allocation.
#[derive(Clone)]
pub struct Shape(Repr);

#[derive(Clone)]
enum Repr {
    Inline {
        len: u8,
        dims: [usize; Shape::INLINE],
    },
    Shared(std::sync::Arc<[usize]>),
}

impl Shape {
    /// Most dimensions a shape holds without an allocation of its own.
    pub const INLINE: usize = 4;

    /// A shape from its dimensions.
    pub fn new(dims: Vec<usize>) -> Self {
        Shape::from(dims.as_slice())
    }

    /// The 0-dim shape of a scalar.
    pub fn scalar() -> Self {
        Shape(Repr::Inline {
            len: 0,
            dims: [0; Shape::INLINE],
        })
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        match &self.0 {
            Repr::Inline { len, dims } => &dims[..usize::from(*len)],
            Repr::Shared(d) => d,
        }
    }

    /// Number of dimensions.
    pub fn rank(&self) -> usize {
        self.dims().len()
    }

    /// Number of elements; saturates at `usize::MAX` (see [`Shape::try_nbytes`]).
    pub fn numel(&self) -> usize {
        self.try_numel().unwrap_or(usize::MAX)
    }

    /// Number of elements, or `None` if it overflows `usize`.
    pub fn try_numel(&self) -> Option<usize> {
        let dims = self.dims();
        // A zero dimension makes the count 0 whatever the others are, even if multiplying
        // them first would overflow.
        if dims.contains(&0) {
            return Some(0);
        }
        dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Bytes taken by this shape's elements of `dtype`, checked for overflow.
    ///
    /// # Errors
    /// [`Error::ShapeOverflow`] when the byte size overflows `usize`.
    pub fn try_nbytes(&self, dtype: DType) -> Result<usize> {
        self.try_numel()
            .and_then(|n| n.checked_mul(dtype.size()))
            .ok_or_else(|| Error::ShapeOverflow {
                shape: self.dims().to_vec(),
            })
    }
}

impl Default for Shape {
    /// The scalar shape.
    fn default() -> Self {
        Shape::scalar()
    }
}

impl std::fmt::Debug for Shape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Shape").field(&self.dims()).finish()
    }
}

impl PartialEq for Shape {
    fn eq(&self, other: &Shape) -> bool {
        self.dims() == other.dims()
    }
}

impl Eq for Shape {}

impl std::hash::Hash for Shape {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.dims().hash(state);
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        if d.len() <= Shape::INLINE {
            let mut dims = [0; Shape::INLINE];
            dims[..d.len()].copy_from_slice(d);
            // len <= INLINE = 4: fits a u8.
            Shape(Repr::Inline {
                len: d.len() as u8,
                dims,
            })
        } else {
            Shape(Repr::Shared(d.into()))
        }
    }
}

impl From<Vec<usize>> for Shape {
    fn from(dims: Vec<usize>) -> Self {
        Shape::from(dims.as_slice())
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(dims: [usize; N]) -> Self {
        Shape::from(dims.as_slice())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn inline_and_shared_shapes_compare_and_hash_by_dims() {
        use std::hash::{BuildHasher, RandomState};
        let h = RandomState::new();
        for dims in [vec![], vec![7], vec![2, 3, 4, 5], vec![1, 2, 3, 4, 5, 6]] {
            let a = Shape::new(dims.clone());
            let b = a.clone();
            assert_eq!(a.dims(), dims.as_slice());
            assert_eq!(a.rank(), dims.len());
            assert_eq!(a, b);
            assert_eq!(h.hash_one(&a), h.hash_one(&b));
            assert_eq!(h.hash_one(&a), h.hash_one(Shape::from(dims.as_slice())));
        }
        assert_ne!(Shape::from([2, 3]), Shape::from([2, 3, 1]));
        assert_ne!(Shape::from([1, 1, 1, 1]), Shape::from([1, 1, 1, 1, 1]));
        assert_eq!(Shape::default(), Shape::scalar());
        assert_eq!(format!("{:?}", Shape::from([2, 3])), "Shape([2, 3])");
    }

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
        let t = crate::tensor::Tensor::from_vec(Vec::<f64>::new(), [1 << 40, 1 << 40, 0]).unwrap();
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
