//! [`PinnedBufferMut`]: page-locked memory a producer writes a batch into, then freezes
//! into a [`Tensor`] without a copy, so H2D reads it with one DMA and no staging.

use super::output_pool::Taken;
use super::pinned::{PinnedBlock, PinnedBuf};
use crate::device::Device;
use crate::dtype::Element;
use crate::error::{Error, Result};
use crate::layout::Shape;
use crate::tensor::{Storage, Tensor};
use std::marker::PhantomData;
use std::sync::Arc;

/// A writable page-locked buffer of `len` values of `T`, from the same bounded, recycled
/// pool as page-locked D2H outputs ([`crate::config::Config::pinned_output_bytes`]): a loader
/// decodes or assembles a batch straight into it, then [`freeze`](Self::freeze)s it into
/// a [`Tensor`] (no copy). H2D copies such a tensor straight from its memory (one DMA,
/// no host copy, when it is 256 KiB or more; smaller ones are staged, many per copy).
/// The memory goes back to the pool when the buffer, or the last tensor over it, drops;
/// [`memory_stats`](crate::memory_stats)`().pinned_outputs` counts it.
///
/// The memory is recycled, so it may hold another batch's bytes: a buffer is never read
/// before it is written. [`as_mut_slice`](Self::as_mut_slice) zeroes it the first time
/// (and [`freeze`](Self::freeze) of a buffer never written gives zeros);
/// [`copy_from_slice`](Self::copy_from_slice) fills it without zeroing first, and a
/// producer that writes every value itself (a decoder) does so through
/// [`as_uninit_mut`](Self::as_uninit_mut) and [`assume_init`](Self::assume_init), also
/// without zeroing.
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
    /// Whether every value has been written (zeroed, copied in, or promised by
    /// `assume_init`): only then are the values readable as `T`.
    init: bool,
    _values: PhantomData<T>,
}

impl<T: Element + bytemuck::Pod> PinnedBufferMut<T> {
    /// A buffer of `len` values, taken from the pool (allocated under `device`'s context
    /// when the pool has no free block; page-locked memory is usable from every device).
    /// Nothing of the recycled memory can be read before it is written (see the type's
    /// docs).
    ///
    /// # Errors
    /// [`Error::NoCuda`], [`Error::DeviceUnavailable`]; [`Error::ShapeOverflow`] for a
    /// size that does not fit; [`Error::PinnedPoolFull`] when the pool's cap leaves no
    /// room; the driver's error from `cuMemHostAlloc` (out of memory when the host can
    /// page-lock no more and no free block of the pool is large enough).
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
                init: true,
                _values: PhantomData,
            });
        }
        let pool = &crate::runtime::runtime().outputs;
        let (block, base) = match pool.take(nbytes, device.ordinal())? {
            Taken::Range(block, base) => (block, base),
            Taken::AtCap => {
                return Err(Error::PinnedPoolFull {
                    requested: nbytes,
                    cap: pool.max_bytes(),
                })
            }
            Taken::HostFull(e) => return Err(e),
        };
        Ok(PinnedBufferMut {
            block,
            base,
            len,
            init: false,
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

    /// The values, to write (and read back). The first call zeroes them, unless they
    /// were all written already ([`copy_from_slice`](Self::copy_from_slice), or
    /// [`assume_init`](Self::assume_init)).
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.zero_unless_written();
        let values = self.values();
        // SAFETY: every value has been written (`init`), and any bit pattern is a valid
        // `T` (Pod); `MaybeUninit<T>` has `T`'s layout.
        unsafe { &mut *(std::ptr::from_mut(values) as *mut [T]) }
    }

    /// Writes every value from `src`, without zeroing first: the fastest way to fill the
    /// buffer from memory.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when `src` is not `len` values long (nothing is written).
    pub fn copy_from_slice(&mut self, src: &[T]) -> Result<()> {
        if src.len() != self.len {
            return Err(Error::ShapeMismatch {
                shape: vec![self.len],
                expected: self.len,
                got: src.len(),
            });
        }
        let dst = self.values();
        // SAFETY: `dst` and `src` are `len` values each and do not overlap (`dst` is this
        // buffer's exclusive range of page-locked memory, `src` a shared borrow the caller
        // holds, which cannot alias a `&mut` borrow of the buffer).
        unsafe {
            std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<T>(), src.len());
        }
        self.init = true;
        Ok(())
    }

    /// The values as uninitialised memory, for a producer that writes every one of them
    /// (a decoder), without zeroing first; then [`assume_init`](Self::assume_init). Safe
    /// code may store uninitialised values through it, so the buffer counts as unwritten
    /// again until `assume_init` (a later [`as_mut_slice`](Self::as_mut_slice) or
    /// [`freeze`](Self::freeze) without it zeroes the values).
    pub fn as_uninit_mut(&mut self) -> &mut [std::mem::MaybeUninit<T>] {
        self.init = false;
        self.values()
    }

    /// The buffer's range, as uninitialised memory, leaving `init` as it is.
    fn values(&mut self) -> &mut [std::mem::MaybeUninit<T>] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: `base..base + len * size_of::<T>()` is inside the block (the pool gave a
        // range of at least that many bytes) and was taken for this buffer alone (no
        // other buffer, tensor or copy uses it until the buffer is frozen or dropped), and
        // `&mut self` makes the borrow exclusive; the range is aligned for every dtype
        // (blocks are page-aligned, shared ranges 256-aligned). `MaybeUninit` asks
        // nothing of the bytes.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.block
                    .ptr_at(self.base)
                    .cast::<std::mem::MaybeUninit<T>>(),
                self.len,
            )
        }
    }

    /// Marks every value written, after a producer filled them all through
    /// [`as_uninit_mut`](Self::as_uninit_mut).
    ///
    /// # Safety
    /// 1. Every one of the `len` values was written since the buffer was made.
    pub unsafe fn assume_init(&mut self) {
        self.init = true;
    }

    /// Zeroes the values unless they have all been written.
    fn zero_unless_written(&mut self) {
        if !self.init {
            let bytes = self.len * std::mem::size_of::<T>();
            let values = self.values();
            // SAFETY: `values` is this buffer's exclusive range of `bytes` bytes.
            unsafe { std::ptr::write_bytes(values.as_mut_ptr().cast::<u8>(), 0, bytes) };
            self.init = true;
        }
    }

    /// A tensor of `shape` over the buffer's values, without a copy (zeros where the
    /// buffer was never written).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when `shape` does not hold `len` values (the buffer is
    /// dropped, back to the pool).
    pub fn freeze(mut self, shape: impl Into<Shape>) -> Result<Tensor> {
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
        self.zero_unless_written();
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
