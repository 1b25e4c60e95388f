//! [`PinnedBufferMut`]: page-locked memory a producer writes a batch into, then freezes
//! into a [`Tensor`] without a copy, so H2D reads it with one DMA and no staging.

use super::pinned::{PinnedBlock, PinnedBuf};
use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::Shape;
use crate::tensor::{Storage, Tensor};
use std::marker::PhantomData;
use std::sync::Arc;

/// A writable page-locked buffer of `len` values of `T`, from the same bounded, recycled
/// pool as page-locked D2H outputs ([`crate::Config::pinned_output_bytes`]): a loader
/// decodes or assembles a batch straight into it, then [`freeze`](Self::freeze)s it into
/// a [`Tensor`] (no copy). H2D copies such a tensor straight from its memory (one DMA,
/// no host copy, when it is 256 KiB or more; smaller ones are staged, many per copy).
/// The memory goes back to the pool when the buffer, or the last tensor over it, drops;
/// [`memory_stats`](crate::memory_stats)`().pinned_outputs` counts it.
///
/// ```
/// use pinlane::{memory::PinnedBufferMut, Device};
/// # fn main() -> pinlane::Result<()> {
/// # if pinlane::driver::available().is_none() { return Ok(()); }
/// let mut buf = PinnedBufferMut::<f32>::new(3 * 224 * 224, Device::cuda(0))?;
/// for (i, x) in buf.as_mut_slice().iter_mut().enumerate() {
///     *x = i as f32; // decode here
/// }
/// let image = buf.freeze([3, 224, 224])?; // page-locked, no copy
/// let on_gpu = pinlane::transfer_tensor_h2d(&vec![image])?;
/// # let _ = on_gpu;
/// # Ok(()) }
/// ```
pub struct PinnedBufferMut<T> {
    block: Arc<PinnedBlock>,
    base: usize,
    len: usize,
    _values: PhantomData<T>,
}

impl<T: Element + bytemuck::Pod> PinnedBufferMut<T> {
    /// A buffer of `len` values, taken from the pool (allocated under `device`'s context
    /// when the pool has no free block; page-locked memory is usable from every device).
    /// Its contents are unspecified (recycled memory) until written.
    ///
    /// # Errors
    /// [`Error::NoCuda`], [`Error::DeviceUnavailable`]; [`Error::ShapeOverflow`] for a
    /// size that does not fit; [`Error::PinnedPoolFull`] when the pool's cap leaves no
    /// room; the driver's error from `cuMemHostAlloc`.
    pub fn new(len: usize, device: Device) -> Result<PinnedBufferMut<T>> {
        crate::driver::require("PinnedBufferMut::new")?;
        crate::driver::check_device(device.ordinal())?;
        let nbytes = len
            .checked_mul(std::mem::size_of::<T>())
            .ok_or_else(|| Error::ShapeOverflow { shape: vec![len] })?;
        if nbytes == 0 {
            return Ok(PinnedBufferMut {
                block: PinnedBlock::empty(),
                base: 0,
                len: 0,
                _values: PhantomData,
            });
        }
        let pool = &crate::runtime::runtime().outputs;
        let Some((block, base)) = pool.take(nbytes, device.ordinal())? else {
            return Err(Error::PinnedPoolFull {
                requested: nbytes,
                cap: pool.max_bytes(),
            });
        };
        Ok(PinnedBufferMut {
            block,
            base,
            len,
            _values: PhantomData,
        })
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no values.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The values, to write.
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `base..base + len * size_of::<T>()` is inside the block (the pool gave a
        // range of at least that many bytes) and was taken for this buffer alone (no
        // other buffer, tensor or copy uses it until the buffer is frozen or dropped), and
        // `&mut self` makes the borrow exclusive; the range is
        // aligned for every dtype (blocks are page-aligned, shared ranges 256-aligned),
        // and every bit pattern is a valid `T` (Pod).
        unsafe {
            std::slice::from_raw_parts_mut(self.block.ptr_at(self.base).cast::<T>(), self.len)
        }
    }

    /// A tensor of `shape` over the buffer's values, without a copy.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when `shape` does not hold `len` values (the buffer is
    /// dropped, back to the pool).
    pub fn freeze(self, shape: impl Into<Shape>) -> Result<Tensor> {
        let shape = shape.into();
        let numel = shape.try_numel().ok_or_else(|| Error::ShapeOverflow {
            shape: shape.dims().to_vec(),
        })?;
        if numel != self.len {
            return Err(Error::ShapeMismatch {
                shape: shape.dims().to_vec(),
                expected: numel,
                got: self.len,
            });
        }
        let nbytes = self.len * std::mem::size_of::<T>();
        let view = PinnedBuf::view(&self.block, self.base, nbytes)?;
        Ok(Tensor::from_parts(
            T::DTYPE,
            shape,
            nbytes,
            Storage::Pinned(view),
        ))
    }
}

impl<T> std::fmt::Debug for PinnedBufferMut<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PinnedBufferMut")
            .field("len", &self.len)
            .finish()
    }
}
