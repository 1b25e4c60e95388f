//! [`Tensor`]: pinlane's minimal tensor: a cheap handle to immutable, contiguous bytes
//! with a dtype and a shape, in pageable host memory, page-locked host memory, or on a
//! CUDA device.

use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::Shape;
use crate::memory::{DeviceView, HostBuf, PinnedBuf};
use std::fmt;

/// Where a tensor's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// Ordinary (pageable) host memory.
    Host,
    /// Page-locked host memory (copied to and from devices without staging).
    Pinned,
    /// Memory of CUDA device N.
    Cuda(usize),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Host => f.write_str("host"),
            Location::Pinned => f.write_str("pinned host"),
            Location::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}

/// Where the bytes are, and who owns them: each variant is a view holding an `Arc` to
/// shared memory, so cloning one is a reference-count increment.
#[derive(Clone)]
pub(crate) enum Storage {
    Host(HostBuf),
    Pinned(PinnedBuf),
    Device(DeviceView),
}

/// A contiguous, row-major tensor. Cloning is cheap (two reference counts, no
/// allocation): clones share the bytes, which never change after construction.
///
/// ```
/// use pinlane::{DType, Location, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let t = Tensor::from_vec(vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3])?;
/// assert_eq!(t.dtype(), DType::F32);
/// assert_eq!(t.dims(), &[2, 3]);
/// assert_eq!(t.location(), Location::Host);
/// assert_eq!(t.to_vec::<f32>()?[4], 5.0);
/// assert!(t.to_vec::<i32>().is_err()); // wrong dtype: a typed error, not a panic
/// assert!(Tensor::from_vec(vec![1u8, 2, 3], [2, 2]).is_err()); // 3 elements, shape of 4
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Tensor {
    dtype: DType,
    shape: Shape,
    nbytes: usize,
    storage: Storage,
}

fn check_len(shape: &Shape, dtype: DType, len: usize) -> Result<usize> {
    let nbytes = shape.try_nbytes(dtype)?;
    let expected = shape.numel();
    if len != expected {
        return Err(Error::ShapeMismatch {
            shape: shape.dims().to_vec(),
            expected,
            got: len,
        });
    }
    Ok(nbytes)
}

impl Tensor {
    pub(crate) fn from_parts(dtype: DType, shape: Shape, nbytes: usize, storage: Storage) -> Self {
        Tensor {
            dtype,
            shape,
            nbytes,
            storage,
        }
    }

    /// A host tensor that takes `values` without copying them; `values.len()` must match
    /// the shape's element count.
    pub fn from_vec<T: Element>(values: Vec<T>, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let nbytes = check_len(&shape, T::DTYPE, values.len())?;
        let buf = HostBuf::from_vec(T::into_raw_vec(values));
        Ok(Tensor::from_parts(
            T::DTYPE,
            shape,
            nbytes,
            Storage::Host(buf),
        ))
    }

    /// A host tensor holding a copy of `values`.
    pub fn from_slice<T: Element>(values: &[T], shape: impl Into<Shape>) -> Result<Tensor> {
        Tensor::from_vec(values.to_vec(), shape)
    }

    /// A 0-dim host tensor.
    ///
    /// ```
    /// let t = pinlane::Tensor::scalar(7i64);
    /// assert_eq!(t.dims(), &[] as &[usize]);
    /// assert_eq!(t.to_vec::<i64>().unwrap(), vec![7]);
    /// ```
    pub fn scalar<T: Element>(value: T) -> Tensor {
        Tensor::from_parts(
            T::DTYPE,
            Shape::scalar(),
            T::DTYPE.size(),
            Storage::Host(HostBuf::from_vec(T::into_raw_vec(vec![value]))),
        )
    }

    /// A host tensor holding a copy of raw bytes (native endianness).
    ///
    /// ```
    /// use pinlane::{DType, Tensor};
    /// let t = Tensor::from_bytes(DType::U16, [2], &[1, 0, 2, 0]).unwrap();
    /// assert_eq!(t.to_vec::<u16>().unwrap(), vec![1, 2]);
    /// assert!(Tensor::from_bytes(DType::Bool, [1], &[2]).is_err()); // not a bool
    /// ```
    pub fn from_bytes(dtype: DType, shape: impl Into<Shape>, bytes: &[u8]) -> Result<Tensor> {
        let shape = shape.into();
        if bytes.len() % dtype.size() != 0 {
            return Err(Error::InvalidBytes {
                dtype,
                reason: format!("{} bytes is not a whole number of elements", bytes.len()),
            });
        }
        let nbytes = check_len(&shape, dtype, bytes.len() / dtype.size())?;
        if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
            return Err(Error::InvalidBytes {
                dtype,
                reason: "a bool byte other than 0 or 1".into(),
            });
        }
        Ok(Tensor::from_parts(
            dtype,
            shape,
            nbytes,
            Storage::Host(HostBuf::copy_of(bytes)),
        ))
    }

    /// A copy of this host tensor in page-locked memory, which H2D copies read directly
    /// (no staging). Needs a CUDA driver.
    pub fn to_pinned(&self) -> Result<Tensor> {
        let bytes = self.host_bytes("to_pinned")?;
        let buf = PinnedBuf::copy_of(bytes)?;
        Ok(Tensor::from_parts(
            self.dtype(),
            self.shape().clone(),
            self.nbytes(),
            Storage::Pinned(buf),
        ))
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shape.
    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// The dimensions.
    pub fn dims(&self) -> &[usize] {
        self.shape.dims()
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.shape.numel()
    }

    /// Whether the tensor holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Number of bytes.
    pub fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// Where the bytes live.
    pub fn location(&self) -> Location {
        match &self.storage {
            Storage::Host(_) => Location::Host,
            Storage::Pinned(_) => Location::Pinned,
            Storage::Device(v) => Location::Cuda(v.device()),
        }
    }

    /// Whether the bytes are on a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self.location(), Location::Cuda(_))
    }

    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    fn host_bytes(&self, op: &'static str) -> Result<&[u8]> {
        match &self.storage {
            Storage::Host(b) => Ok(b.bytes()),
            Storage::Pinned(b) => Ok(b.bytes()),
            Storage::Device(_) => Err(Error::NotOnHost {
                op,
                location: self.location(),
            }),
        }
    }

    /// The raw bytes of a host (pageable or pinned) tensor.
    pub fn as_bytes(&self) -> Result<&[u8]> {
        self.host_bytes("as_bytes")
    }

    /// A typed view of a host tensor; the dtype must match `T`.
    ///
    /// ```
    /// let t = pinlane::Tensor::from_vec(vec![1u32, 2], [2]).unwrap();
    /// assert_eq!(t.as_slice::<u32>().unwrap(), &[1, 2]);
    /// assert!(t.as_slice::<f32>().is_err());
    /// ```
    pub fn as_slice<T: Element + bytemuck::Pod>(&self) -> Result<&[T]> {
        self.check_dtype::<T>("as_slice")?;
        let bytes = self.host_bytes("as_slice")?;
        // Host and pinned buffers start aligned for every dtype (see HostBuf, and
        // cuMemHostAlloc returns page-aligned memory), so this cannot fail; map it anyway.
        bytemuck::try_cast_slice(bytes).map_err(|e| Error::InvalidBytes {
            dtype: self.dtype(),
            reason: e.to_string(),
        })
    }

    /// The elements of a host tensor as a `Vec`; the dtype must match `T`.
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.check_dtype::<T>("to_vec")?;
        let bytes = self.host_bytes("to_vec")?;
        T::from_bytes(bytes).ok_or_else(|| Error::InvalidBytes {
            dtype: self.dtype(),
            reason: "a bool byte other than 0 or 1".into(),
        })
    }

    fn check_dtype<T: Element>(&self, op: &'static str) -> Result<()> {
        if T::DTYPE != self.dtype() {
            return Err(Error::DTypeMismatch {
                op,
                expected: T::DTYPE,
                got: self.dtype(),
            });
        }
        Ok(())
    }

    /// Queues, on `stream`, a copy of the page-locked `src` over this device tensor's
    /// bytes: for tests that need a producer still writing when a transfer starts.
    /// Feature `test-util` only: pinlane tensors are otherwise immutable.
    ///
    /// # Safety
    /// 1. `src` stays alive until the copy has finished (synchronise `stream`).
    /// 2. Nothing reads these device bytes meanwhile except in `stream`'s order, and the
    ///    tensor (so its device memory) stays alive until the copy has finished.
    #[cfg(feature = "test-util")]
    pub unsafe fn overwrite_async(&self, src: &Tensor, stream: &crate::Stream) -> Result<()> {
        let (Storage::Device(dst), Storage::Pinned(buf)) = (&self.storage, &src.storage) else {
            return Err(Error::InvalidOption {
                name: "overwrite_async",
                reason: format!(
                    "needs a device destination and a pinned source, got {} and {}",
                    self.location(),
                    src.location()
                ),
            });
        };
        if self.nbytes() != src.nbytes() || dst.device() != stream.device() {
            return Err(Error::InvalidOption {
                name: "overwrite_async",
                reason: "sizes or devices differ".into(),
            });
        }
        // SAFETY: obligations 1 and 2 are the caller's, passed on unchanged.
        unsafe { dst.overwrite_from_pinned_async(buf, stream) }
    }

    /// Whether two handles share the same storage (clones of one tensor, or the same
    /// bytes of one allocation).
    pub fn same_storage(&self, other: &Tensor) -> bool {
        match (&self.storage, &other.storage) {
            (Storage::Host(a), Storage::Host(b)) => a.same_as(b),
            (Storage::Pinned(a), Storage::Pinned(b)) => a.same_as(b),
            (Storage::Device(a), Storage::Device(b)) => a.same_as(b),
            _ => false,
        }
    }
}

/// Equal dtype and shape, and then: for host tensors (pageable or pinned, in any mix),
/// equal bytes; for device tensors, the same storage (device bytes are not read here;
/// copy them to the host to compare content). A host tensor never equals a device one.
impl PartialEq for Tensor {
    fn eq(&self, other: &Tensor) -> bool {
        if self.dtype() != other.dtype() || self.shape() != other.shape() {
            return false;
        }
        match (self.as_bytes(), other.as_bytes()) {
            (Ok(a), Ok(b)) => a == b,
            (Err(_), Err(_)) => self.same_storage(other),
            _ => false,
        }
    }
}

impl fmt::Debug for Tensor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "Tensor({}, {:?}, {})",
            self.dtype(),
            self.dims(),
            self.location()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_check_length_against_shape() {
        let e = Tensor::from_vec(vec![1i32, 2, 3], [2, 2]).unwrap_err();
        assert_eq!(
            e,
            Error::ShapeMismatch {
                shape: vec![2, 2],
                expected: 4,
                got: 3
            }
        );
        assert!(Tensor::from_slice(&[0u8; 0], [0, 5]).is_ok());
        assert!(Tensor::from_slice(&[0u8; 1], [0, 5]).is_err());
        assert!(Tensor::from_vec(vec![1.0f64], Shape::scalar()).is_ok());
    }

    #[test]
    fn from_bytes_rejects_partial_elements() {
        assert!(matches!(
            Tensor::from_bytes(DType::F32, [1], &[0, 0, 0]),
            Err(Error::InvalidBytes { .. })
        ));
    }

    #[test]
    fn typed_access_checks_dtype() {
        let t = Tensor::from_vec(vec![true, false], [2]).unwrap();
        assert_eq!(t.to_vec::<bool>().unwrap(), vec![true, false]);
        assert_eq!(t.as_bytes().unwrap(), &[1, 0]);
        assert_eq!(
            t.to_vec::<u8>(),
            Err(Error::DTypeMismatch {
                op: "to_vec",
                expected: DType::U8,
                got: DType::Bool
            })
        );
    }

    #[test]
    fn every_dtype_views_are_aligned() {
        let t = Tensor::from_bytes(DType::F64, [2], &[0u8; 16]).unwrap();
        assert_eq!(t.as_slice::<f64>().unwrap(), &[0.0, 0.0]);
        let t = Tensor::from_vec(vec![half::f16::ONE; 3], [3]).unwrap();
        assert_eq!(t.nbytes(), 6);
        assert_eq!(t.as_slice::<half::f16>().unwrap()[2], half::f16::ONE);
    }

    #[test]
    fn equality_is_by_content_for_host_tensors() {
        let a = Tensor::from_vec(vec![1u8, 2], [2]).unwrap();
        let b = Tensor::from_vec(vec![1u8, 2], [2]).unwrap();
        let c = Tensor::from_vec(vec![1u8, 2], [1, 2]).unwrap();
        assert_eq!(a, b);
        assert!(!a.same_storage(&b));
        assert!(a.same_storage(&a.clone()));
        assert_ne!(a, c);
    }
}
