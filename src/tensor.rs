//! [`Tensor`]: pinlane's minimal tensor: a cheap handle to immutable, contiguous bytes
//! with a dtype and a shape, in pageable host memory, page-locked host memory, or on a
//! CUDA device.

use crate::device::Device;
use crate::driver::Stream;
use crate::dtype::{DType, Element};
use crate::error::{Error, Result};
use crate::layout::Shape;
use crate::memory::{self, DeviceAlloc, DevicePtrGuard, DeviceView, HostBuf, PinnedBuf};
use std::fmt;

pub use crate::location::Location;
pub(crate) use crate::memory::Storage;

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

/// The byte size of `shape` of `dtype`, checked against `len` bytes.
pub(crate) fn check_bytes(shape: &Shape, dtype: DType, len: usize) -> Result<usize> {
    if !len.is_multiple_of(dtype.size()) {
        return Err(Error::InvalidBytes {
            dtype,
            reason: format!("{len} bytes is not a whole number of elements"),
        });
    }
    check_len(shape, dtype, len / dtype.size())
}

/// Host bytes of `dtype` that pinlane will read as its values: a bool byte must be 0 or 1.
fn check_bools(dtype: DType, bytes: &[u8]) -> Result<()> {
    if dtype == DType::Bool && bytes.iter().any(|&b| b > 1) {
        return Err(Error::InvalidBytes {
            dtype,
            reason: "a bool byte other than 0 or 1".into(),
        });
    }
    Ok(())
}

/// Another library's memory for `nbytes` of `dtype` at `addr` (`what`: "host pointer",
/// "device pointer"): not null, aligned to the dtype's size (no memory, no check).
fn check_foreign_addr(what: &str, addr: u64, nbytes: usize, dtype: DType) -> Result<()> {
    if nbytes > 0 && (addr == 0 || !addr.is_multiple_of(dtype.size() as u64)) {
        return Err(Error::External {
            reason: format!(
                "{what} {addr:#x} is null or not aligned to {dtype}'s {} bytes",
                dtype.size()
            ),
        });
    }
    Ok(())
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
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] when the shape does not hold `values.len()` elements;
    /// [`Error::ShapeOverflow`].
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
    ///
    /// # Errors
    /// As [`Tensor::from_vec`].
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
    ///
    /// # Errors
    /// [`Error::InvalidBytes`] for a length that is not a whole number of elements, or a
    /// bool byte other than 0 and 1; [`Error::ShapeMismatch`]; [`Error::ShapeOverflow`].
    pub fn from_bytes(dtype: DType, shape: impl Into<Shape>, bytes: &[u8]) -> Result<Tensor> {
        let shape = shape.into();
        let nbytes = check_bytes(&shape, dtype, bytes.len())?;
        check_bools(dtype, bytes)?;
        Ok(Tensor::from_parts(
            dtype,
            shape,
            nbytes,
            Storage::Host(HostBuf::copy_of(bytes)),
        ))
    }

    /// A host tensor over bytes that another owner keeps alive, without a copy: a `Vec`,
    /// `bytes::Bytes`, a memory map, anything `AsRef<[u8]> + Send + Sync + 'static` (as
    /// `bytes::Bytes::from_owner` takes). The owner is dropped, exactly once, when the
    /// last tensor over it (and the last transfer reading it) is done with it.
    ///
    /// `owner.as_ref()` is called once, here; like `bytes`, pinlane relies on the owner
    /// not changing those bytes while it lives.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] / [`Error::InvalidBytes`] when the byte count does not fit
    /// the dtype and shape, or a bool byte is not 0 or 1; [`Error::External`] when the
    /// bytes are not aligned to the dtype's size.
    ///
    /// ```
    /// use pinlane::{DType, Tensor};
    /// # fn main() -> pinlane::Result<()> {
    /// let words: Vec<u32> = vec![1, 2, 3, 4]; // e.g. a buffer a decoder filled
    /// let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    /// let t = Tensor::from_owner(bytes, DType::U32, [2, 2])?;
    /// assert_eq!(t.to_vec::<u32>()?, words);
    /// # Ok(()) }
    /// ```
    pub fn from_owner<O>(owner: O, dtype: DType, shape: impl Into<Shape>) -> Result<Tensor>
    where
        O: AsRef<[u8]> + Send + Sync + 'static,
    {
        let shape = shape.into();
        let buf = HostBuf::from_owner(owner);
        let bytes = buf.bytes();
        let nbytes = check_bytes(&shape, dtype, bytes.len())?;
        if !(bytes.as_ptr() as usize).is_multiple_of(dtype.size()) && nbytes > 0 {
            return Err(Error::External {
                reason: format!(
                    "host bytes at {:p} are not aligned to {dtype}'s {} bytes",
                    bytes.as_ptr(),
                    dtype.size()
                ),
            });
        }
        check_bools(dtype, bytes)?;
        Ok(Tensor::from_parts(dtype, shape, nbytes, Storage::Host(buf)))
    }

    /// A host tensor over host memory that another library owns (a PyTorch CPU tensor's
    /// bytes, a buffer of a C library), without a copy: the host counterpart of
    /// [`Tensor::from_device_ptr`]. `owner` keeps the memory alive; pinlane drops it,
    /// exactly once, when the last tensor over it is gone. For memory a Rust value owns,
    /// [`Tensor::from_owner`] needs no `unsafe`.
    ///
    /// # Safety
    /// 1. `ptr..ptr + nbytes` (`nbytes` from `dtype` and `shape`) is readable host memory.
    /// 2. It stays valid until `owner` is dropped (on any thread), and does not lie inside
    ///    `owner`'s own allocation (which moves when `owner` is boxed).
    /// 3. Nothing writes it while the tensor lives.
    ///
    /// # Errors
    /// [`Error::ShapeOverflow`]; [`Error::External`] for a null or misaligned pointer;
    /// [`Error::InvalidBytes`] for a bool byte other than 0 or 1. On error `owner` is
    /// dropped.
    ///
    /// ```
    /// use pinlane::{DType, Tensor};
    /// # fn main() -> pinlane::Result<()> {
    /// let words: &'static [u32] = Box::leak(vec![1u32, 2, 3, 4].into_boxed_slice());
    /// // SAFETY: a leaked slice: readable, never freed, never written.
    /// let t = unsafe { Tensor::from_host_ptr(words.as_ptr().cast(), DType::U32, [2, 2], ()) }?;
    /// assert_eq!(t.to_vec::<u32>()?, words);
    /// # Ok(()) }
    /// ```
    pub unsafe fn from_host_ptr<O: Send + Sync + 'static>(
        ptr: *const u8,
        dtype: DType,
        shape: impl Into<Shape>,
        owner: O,
    ) -> Result<Tensor> {
        let shape = shape.into();
        let nbytes = shape.try_nbytes(dtype)?;
        check_foreign_addr("host pointer", ptr as usize as u64, nbytes, dtype)?;
        // SAFETY: obligations 1 to 3 are the caller's, passed on unchanged; `ptr` is
        // non-null when `nbytes > 0` (checked above); nothing may write (not writable).
        let buf = unsafe { HostBuf::from_raw_parts(ptr, nbytes, Box::new(owner), false) };
        check_bools(dtype, buf.bytes())?;
        Ok(Tensor::from_parts(dtype, shape, nbytes, Storage::Host(buf)))
    }

    /// A device tensor over device memory that another library allocated (a model's
    /// output, a cudarc `CudaSlice`, a PyTorch tensor's storage), without a copy.
    /// `owner` keeps the memory allocated; pinlane drops it, exactly once, when the last
    /// tensor over it is gone and every transfer and lent pointer use of it has finished
    /// (see [`Tensor::device_ptr`]). [`transfer_tensor_d2h`](crate::transfer_tensor_d2h)
    /// copies such tensors like its own; order the work that produces the bytes as for
    /// any tensor (the current stream, or a producer event).
    ///
    /// # Safety
    /// 1. `ptr..ptr + nbytes` (`nbytes` from `dtype` and `shape`) is device memory of
    ///    `device`, usable from its primary context (`cuMemAlloc*` there, `cudaMalloc`,
    ///    PyTorch's and cudarc's allocators all qualify).
    /// 2. It stays allocated until `owner` is dropped.
    /// 3. Nothing writes it while the tensor lives, except work ordered before each
    ///    transfer that reads it (the caller's current stream, or a producer event).
    ///
    /// pinlane writes it only when it is named as a destination of a copy into existing
    /// tensors (`transfer_tensor_h2d_into`, `H2dPairs`).
    ///
    /// # Errors
    /// [`Error::NoCuda`], [`Error::DeviceUnavailable`]; [`Error::ShapeOverflow`];
    /// [`Error::External`] for a null or misaligned pointer. On error `owner` is
    /// dropped.
    ///
    /// ```no_run
    /// # fn main() -> pinlane::Result<()> {
    /// # let (ptr, owner) = (0u64, ());
    /// use pinlane::{DType, Device, Tensor};
    /// // `ptr`: 1024 f32 of cuda:0 memory that `owner` keeps allocated.
    /// // SAFETY: as the contract above says.
    /// let t = unsafe { Tensor::from_device_ptr(ptr, Device::cuda(0), DType::F32, [1024], owner) }?;
    /// # Ok(()) }
    /// ```
    pub unsafe fn from_device_ptr<O: Send + Sync + 'static>(
        ptr: u64,
        device: Device,
        dtype: DType,
        shape: impl Into<Shape>,
        owner: O,
    ) -> Result<Tensor> {
        crate::driver::require("Tensor::from_device_ptr")?;
        crate::driver::check_device(device.ordinal())?;
        let shape = shape.into();
        let nbytes = shape.try_nbytes(dtype)?;
        let view = if nbytes == 0 {
            drop(owner);
            DeviceView::empty(device.ordinal())
        } else {
            check_foreign_addr("device pointer", ptr, nbytes, dtype)?;
            // SAFETY: obligations 1 and 2 are the caller's, passed on unchanged.
            let alloc = unsafe {
                DeviceAlloc::foreign(ptr, nbytes, device.ordinal(), Box::new(owner), true)
            };
            DeviceView::whole(&alloc)
        };
        Ok(Tensor::from_parts(
            dtype,
            shape,
            nbytes,
            Storage::Device(view),
        ))
    }

    /// This host tensor's own memory, page-locked in place (`cuMemHostRegister`,
    /// portable), as a page-locked tensor over the same bytes: no copy. For buffers sent
    /// again and again (an embedding table, a reused input): H2D then copies them straight
    /// from their memory (those of 256 KiB and more, 64 KiB and more where the driver has
    /// `cuMemcpyBatchAsync`; smaller ones are staged anyway). The
    /// registration lasts until the returned tensor and every clone of it are gone; the
    /// original tensor is unaffected. A page-locked tensor comes back as a clone.
    ///
    /// Registering costs about as much as copying the bytes once
    /// (`docs/performance.md` has the cost and the number of transfers that repay it).
    /// Register whole buffers, each once: registering memory that overlaps a
    /// registration still alive is the driver's error.
    ///
    /// Ending the registration (`cuMemHostUnregister`) waits for all work queued on the
    /// device, as freeing page-locked memory does: when the caller drops the last clone,
    /// its thread waits (unless [`Config::sync_wait`](crate::Config::sync_wait) is set);
    /// when pinlane does (a non-blocking call that held the last clone), pinlane's free
    /// thread ends it, a little later: registering the same memory again before then
    /// waits for that end (at most [`Config::drop_sync_wait`](crate::Config::drop_sync_wait),
    /// then the driver's error above). While the driver waits there, it also holds the
    /// copies of every other thread of the process, pinlane's and the program's, until
    /// the device's queued work is done (measured on an H100: another thread's 1 MiB copy
    /// took 475 ms while an unregister waited 480 ms for another stream's work). So keep
    /// a registration for as long as the buffer is sent, and end it where the device is
    /// idle or a pause does not matter (at shutdown, between epochs).
    ///
    /// # Errors
    /// [`Error::NotOnHost`] for a device tensor; [`Error::NoCuda`],
    /// [`Error::DeviceUnavailable`]; the driver's error (`cuMemHostRegister`).
    ///
    /// ```no_run
    /// # fn main() -> pinlane::Result<()> {
    /// let table = pinlane::Tensor::from_vec(vec![0.5f32; 1 << 24], [1 << 14, 1 << 10])?;
    /// let pinned = table.register_pinned(pinlane::Device::cuda(0))?; // once
    /// for _ in 0..100 {
    ///     let _on_gpu = pinlane::transfer_tensor_h2d(&vec![pinned.clone()])?; // one DMA each
    /// }
    /// # Ok(()) }
    /// ```
    pub fn register_pinned(&self, device: Device) -> Result<Tensor> {
        let buf = match &self.storage {
            Storage::Host(b) => b,
            Storage::Pinned(_) => return Ok(self.clone()),
            Storage::Device(_) => {
                return Err(Error::NotOnHost {
                    op: "register_pinned",
                    location: self.location(),
                })
            }
        };
        crate::driver::require("register_pinned")?;
        crate::driver::check_device(device.ordinal())?;
        let bytes = buf.bytes();
        if bytes.is_empty() {
            return Ok(self.clone());
        }
        let (ptr, len) = (bytes.as_ptr(), bytes.len());
        // SAFETY: `ptr..ptr + len` are the bytes of `buf`, which the block keeps (as its
        // owner) until it has unregistered them; pinlane tensors never change their bytes.
        let block =
            unsafe { memory::pinned::register(ptr, len, device.ordinal(), Box::new(buf.clone())) }?;
        let view = memory::PinnedBuf::view(&block, 0, len)?;
        Ok(Tensor::from_parts(
            self.dtype,
            self.shape.clone(),
            self.nbytes,
            Storage::Pinned(view),
        ))
    }

    /// [`Tensor::register_pinned`] for many tensors at once: each host tensor's memory
    /// page-locked in place, as a page-locked tensor over the same bytes (in order; no
    /// copy). The driver page-locks whole pages, so tensors whose memory shares a page
    /// (small buffers side by side in a heap) are registered as one range, one driver
    /// call for a run of them: every page of a range holds bytes of one of its tensors,
    /// and the range stays registered until the last tensor over it (and every clone) is
    /// gone. Memory inside a registration pinlane made and still holds (an earlier call's)
    /// comes back as a view of it, where the driver would refuse to register it again;
    /// and while a registration lives, a DLPack import of its memory as `kDLCUDAHost`
    /// (torch's `is_pinned()` says true for it) keeps it alive. Page-locked tensors come
    /// back as clones, empty ones as they are.
    ///
    /// For small buffers sent step after step (a serving loop's inputs): the gather
    /// kernel of [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into) then reads
    /// them in place, with no copy into staging memory (and so, like every page-locked
    /// source, after the call has returned: see its docs).
    ///
    /// # Errors
    /// [`Error::NotOnHost`] for a device tensor; [`Error::NoCuda`],
    /// [`Error::DeviceUnavailable`]; the driver's error (`cuMemHostRegister`: memory
    /// overlapping another owner's live registration, say, or one that another thread is
    /// making or ending at that moment). On an error nothing new is left registered.
    ///
    /// ```no_run
    /// use pinlane::{Device, Tensor};
    /// # fn main() -> pinlane::Result<()> {
    /// let inputs = vec![
    ///     Tensor::from_vec(vec![0i64; 256], [256])?,
    ///     Tensor::from_vec(vec![0i32; 16], [16])?,
    /// ];
    /// let pinned = Tensor::register_pinned_many(&inputs, Device::cuda(0))?;
    /// assert!(pinned.iter().all(|t| t.location() == pinlane::Location::Pinned));
    /// # Ok(()) }
    /// ```
    pub fn register_pinned_many(tensors: &[Tensor], device: Device) -> Result<Vec<Tensor>> {
        let mut spans = Vec::new();
        let mut owners: Vec<std::sync::Arc<dyn Send + Sync>> = Vec::new();
        let mut at = Vec::new(); // which tensor each span is
        for (k, t) in tensors.iter().enumerate() {
            match &t.storage {
                Storage::Host(b) if t.nbytes > 0 => {
                    let bytes = b.bytes();
                    spans.push((bytes.as_ptr(), bytes.len()));
                    owners.push(std::sync::Arc::new(b.clone()));
                    at.push(k);
                }
                Storage::Device(_) => {
                    return Err(Error::NotOnHost {
                        op: "register_pinned_many",
                        location: t.location(),
                    })
                }
                _ => {}
            }
        }
        let mut out = tensors.to_vec();
        if spans.is_empty() {
            return Ok(out);
        }
        crate::driver::require("register_pinned_many")?;
        crate::driver::check_device(device.ordinal())?;
        // SAFETY: each span is the bytes of a host buffer whose clone is its owner, kept
        // by the block its view comes from (the group's registration, until it has ended;
        // or the view of a live registration) while that block lives; pinlane tensors
        // never change their bytes.
        let views = unsafe { memory::register_many(&spans, owners, device.ordinal()) }?;
        for (k, view) in at.into_iter().zip(views) {
            let t = &tensors[k];
            out[k] = Tensor::from_parts(t.dtype, t.shape.clone(), t.nbytes, Storage::Pinned(view));
        }
        Ok(out)
    }

    /// A copy of this host tensor in page-locked memory, which H2D copies read directly
    /// (no staging), allocated under the context of `cuda:{LOCAL_RANK}` (see
    /// [`Tensor::to_pinned_on`]). Needs a CUDA driver.
    ///
    /// # Errors
    /// [`Error::NotOnHost`] for a device tensor; [`Error::NoCuda`];
    /// [`Error::InvalidLocalRank`]; [`Error::BytesInFlight`] (see [`Tensor::as_bytes`]);
    /// the driver's error.
    pub fn to_pinned(&self) -> Result<Tensor> {
        self.host_bytes("to_pinned")?;
        self.to_pinned_on(Device::from_local_rank()?)
    }

    /// A copy of this host tensor in page-locked memory allocated under `device`'s
    /// context (usable from every context: portable), so a process that works only with
    /// `device` creates no context on another one.
    ///
    /// # Errors
    /// [`Error::NotOnHost`] for a device tensor; [`Error::NoCuda`];
    /// [`Error::DeviceUnavailable`]; [`Error::BytesInFlight`] (see [`Tensor::as_bytes`]);
    /// the driver's error.
    pub fn to_pinned_on(&self, device: Device) -> Result<Tensor> {
        let bytes = self.host_bytes("to_pinned")?;
        crate::driver::require("to_pinned")?;
        crate::driver::check_device(device.ordinal())?;
        let buf = PinnedBuf::copy_of(bytes, device.ordinal())?;
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
            Storage::Device(v) => Location::Cuda(Device::cuda(v.device())),
        }
    }

    /// Whether the bytes are on a CUDA device.
    pub fn is_cuda(&self) -> bool {
        matches!(self.location(), Location::Cuda(_))
    }

    /// The CUDA device the bytes are on, `None` for host tensors.
    pub fn device(&self) -> Option<Device> {
        match &self.storage {
            Storage::Device(v) => Some(Device::cuda(v.device())),
            _ => None,
        }
    }

    /// Lends this device tensor's address for work queued on `stream`; the guard also
    /// gives its device and byte length (with [`Tensor::dtype`] and [`Tensor::dims`],
    /// all a kernel needs). Queue every use on `stream` while the guard lives: when it
    /// drops, the use is recorded, and the memory is not freed or reused before that work
    /// has run. The rule in full is on [`DevicePtrGuard`] and in docs/semantics.md.
    ///
    /// An output of a non-blocking H2D call that has returned
    /// ([`transfer_tensor_h2d_async`](crate::transfer_tensor_h2d_async)), lent before its
    /// copies are done (from its handle's `batch_for`, or a clone kept from its rebuild),
    /// makes `stream` wait for them first.
    ///
    /// # Errors
    /// [`Error::NotOnDevice`] for a host tensor; [`Error::BytesInFlight`] for an output of
    /// an H2D call whose copies may still write it (inside that call: its batch's rebuild,
    /// or the `while_copying` of
    /// [`transfer_tensor_h2d_overlapping`](crate::transfer_tensor_h2d_overlapping)), whose
    /// use on `stream` would not be ordered after them, or of a call that failed; the
    /// driver's error making `stream` wait; [`Error::ForkedChild`] in a child process
    /// forked after CUDA was set up.
    pub fn device_ptr(&self, stream: &Stream) -> Result<DevicePtrGuard> {
        match &self.storage {
            Storage::Device(v) => {
                // Not in a child forked after CUDA was set up: before the gate's lock.
                crate::driver::fork::check("device_ptr")?;
                v.usable_on(stream, "device_ptr")?;
                Ok(v.lend(stream))
            }
            _ => Err(Error::NotOnDevice {
                op: "device_ptr",
                location: self.location(),
            }),
        }
    }

    pub(crate) fn storage(&self) -> &Storage {
        &self.storage
    }

    fn host_bytes(&self, op: &'static str) -> Result<&[u8]> {
        match &self.storage {
            Storage::Host(b) => Ok(b.bytes()),
            Storage::Pinned(b) => b.bytes(op),
            Storage::Device(_) => Err(Error::NotOnHost {
                op,
                location: self.location(),
            }),
        }
    }

    /// The raw bytes of a host (pageable or pinned) tensor.
    ///
    /// # Errors
    /// [`Error::NotOnHost`] for a device tensor; [`Error::BytesInFlight`] for a
    /// page-locked tensor whose D2H copies may still be running (one a D2H call handed to
    /// [`Batch::rebuild`](crate::Batch::rebuild), read before that call returned).
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
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`] when `T` is not the tensor's dtype; [`Error::NotOnHost`];
    /// [`Error::InvalidBytes`] for an external owner's bytes not aligned for `T`;
    /// [`Error::BytesInFlight`] (see [`Tensor::as_bytes`]).
    pub fn as_slice<T: Element + bytemuck::Pod>(&self) -> Result<&[T]> {
        self.check_dtype::<T>("as_slice")?;
        let bytes = self.host_bytes("as_slice")?;
        if bytes.is_empty() {
            // An empty view's pointer may be only 1-aligned (an empty external owner);
            // bytemuck checks alignment even for empty slices, so answer directly.
            return Ok(&[]);
        }
        // pinlane's host and pinned buffers start aligned for every dtype (see HostBuf;
        // cuMemHostAlloc returns page-aligned memory); an external owner's may not be.
        bytemuck::try_cast_slice(bytes).map_err(|e| Error::InvalidBytes {
            dtype: self.dtype(),
            reason: e.to_string(),
        })
    }

    /// The elements of a host tensor as a `Vec`; the dtype must match `T`.
    ///
    /// # Errors
    /// [`Error::DTypeMismatch`]; [`Error::NotOnHost`]; [`Error::InvalidBytes`] for a bool
    /// byte other than 0 and 1; [`Error::BytesInFlight`] (see [`Tensor::as_bytes`]).
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
    /// Feature `test-util` only: pinlane tensors are otherwise immutable. Unlike the safe
    /// uses, it does not ask whether a transfer's copies may still write either tensor
    /// ([`Error::BytesInFlight`]): its obligations cover that.
    ///
    /// # Safety
    /// 1. `src` stays alive until the copy has finished (synchronise `stream`).
    /// 2. Nothing reads these device bytes meanwhile except in `stream`'s order, and the
    ///    tensor (so its device memory) stays alive until the copy has finished.
    ///
    /// # Errors
    /// [`Error::NotOnDevice`], a size mismatch as [`Error::InvalidOption`], or the driver's
    /// error.
    #[cfg(feature = "test-util")]
    pub unsafe fn overwrite_async(
        &self,
        src: &Tensor,
        stream: &crate::driver::Stream,
    ) -> Result<()> {
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
        if self.nbytes() != src.nbytes() || dst.device() != stream.device().ordinal() {
            return Err(Error::InvalidOption {
                name: "overwrite_async",
                reason: "sizes or devices differ".into(),
            });
        }
        // SAFETY: obligations 1 and 2 are the caller's, passed on unchanged.
        unsafe { dst.overwrite_from_pinned_async(buf, stream) }
    }

    /// Queues, on `stream`, a copy of this device tensor's bytes over the page-locked
    /// `dst`: a reader of the device memory that runs in `stream`'s order, for tests of
    /// when device memory is freed. Feature `test-util` only. Not gated, as
    /// [`Tensor::overwrite_async`]: the obligations cover the transfers' copies.
    ///
    /// # Safety
    /// 1. `dst` stays alive, and nothing reads it, until the copy has finished.
    /// 2. This tensor's memory stays allocated until then (or a test expects poison).
    ///
    /// # Errors
    /// [`Error::NotOnDevice`], a size mismatch as [`Error::InvalidOption`], or the driver's
    /// error.
    #[cfg(feature = "test-util")]
    pub unsafe fn read_into_async(&self, dst: &Tensor, stream: &Stream) -> Result<()> {
        let (Storage::Device(src), Storage::Pinned(buf)) = (&self.storage, &dst.storage) else {
            return Err(Error::InvalidOption {
                name: "read_into_async",
                reason: "needs a device source and a pinned destination".into(),
            });
        };
        if self.nbytes() != dst.nbytes() {
            return Err(Error::InvalidOption {
                name: "read_into_async",
                reason: "sizes differ".into(),
            });
        }
        // SAFETY: obligations 1 and 2 are the caller's, passed on unchanged.
        unsafe { buf.d2h_async(src, stream) }
    }

    /// This tensor as a versioned DLPack tensor (`DLManagedTensorVersioned`, flagged
    /// read-only), without a copy: `kDLCPU` for host tensors, `kDLCUDAHost` for
    /// page-locked ones, `kDLCUDA` for device ones. The capsule holds a clone of the
    /// tensor (so its memory stays alive) until the consumer calls the deleter. A device
    /// tensor's memory is then freed in order on its consumer stream; a consumer that works
    /// on another stream takes [`Tensor::to_dlpack_on`] instead. Pass it on with
    /// `into_raw()`.
    ///
    /// # Errors
    /// [`Error::DLPack`] for a dimension that does not fit `i64`;
    /// [`Error::BytesInFlight`] for a page-locked tensor a D2H call is still writing, or a
    /// device tensor an H2D call is (see [`Tensor::device_ptr`]; an output of a
    /// non-blocking H2D call that has returned, until its copies are done: no stream is
    /// there to order the consumer after them, as `to_dlpack_on` does).
    ///
    /// ```
    /// use pinlane::Tensor;
    /// # fn main() -> pinlane::Result<()> {
    /// let t = Tensor::from_vec(vec![1.5f32, 2.5, 3.5], [3])?;
    /// let capsule = t.to_dlpack()?;
    /// let back = Tensor::from_dlpack(capsule)?; // zero-copy, deleter run once on drop
    /// assert_eq!(back, t);
    /// # Ok(()) }
    /// ```
    pub fn to_dlpack(&self) -> Result<dlpark::versioned::Dlpack> {
        self.export_dlpack(None, false)
    }

    /// [`Tensor::to_dlpack`] for a consumer that reads the device tensor on `stream`:
    /// when the consumer calls the deleter (after queueing its work), the use is recorded
    /// on `stream` as by [`Tensor::device_ptr`], so the memory is not freed before that
    /// work has run. An output of a non-blocking H2D call that has returned, exported
    /// before its copies are done, makes `stream` wait for them first.
    ///
    /// # Errors
    /// [`Error::NotOnDevice`] for a host tensor; [`Error::DLPack`];
    /// [`Error::BytesInFlight`] (see [`Tensor::device_ptr`]); [`Error::ForkedChild`] in a
    /// child process forked after CUDA was set up.
    pub fn to_dlpack_on(&self, stream: &Stream) -> Result<dlpark::versioned::Dlpack> {
        if !self.is_cuda() {
            return Err(Error::NotOnDevice {
                op: "to_dlpack_on",
                location: self.location(),
            });
        }
        self.export_dlpack(Some(stream), false)
    }

    /// [`Tensor::to_dlpack`] without its check that no copy may still write the bytes: for
    /// an output of [`transfer_tensor_d2h_overlapping`](crate::transfer_tensor_d2h_overlapping)
    /// or [`transfer_tensor_h2d_overlapping`](crate::transfer_tensor_h2d_overlapping), from
    /// inside its `while_copying`, to hand the outputs to another framework (a binding's
    /// tensor objects) in the time the copies take. It never checks, wherever the tensor
    /// came from (an output of a non-blocking call not yet waited for, a clone kept from a
    /// failed call): the caller proves the bytes done before anyone reads them.
    ///
    /// # Safety
    /// Nothing reads or writes the bytes through the descriptor (the consumer, or anyone it
    /// hands them to) before the copies that write them are proven done: for an output of
    /// an overlapping call, before that call returns `Ok`; if it fails, the descriptor is
    /// dropped (its deleter called) with its bytes unread. pinlane keeps the memory
    /// allocated while the descriptor lives, and does not recycle it while a copy may
    /// still write it, either way.
    ///
    /// # Errors
    /// [`Error::DLPack`] for a dimension that does not fit `i64`.
    pub unsafe fn to_dlpack_in_flight(&self) -> Result<dlpark::versioned::Dlpack> {
        self.export_dlpack(None, true)
    }

    fn export_dlpack(
        &self,
        stream: Option<&Stream>,
        in_flight: bool,
    ) -> Result<dlpark::versioned::Dlpack> {
        if self.is_cuda() {
            // A device tensor's export asks its gate and lends its memory: not in a child
            // forked after CUDA was set up (before any lock). A host tensor's needs no
            // driver.
            crate::driver::fork::check(if stream.is_some() {
                "to_dlpack_on"
            } else {
                "to_dlpack"
            })?;
        }
        // The capsule keeps a clone of the tensor: its memory stays alive until the
        // consumer calls the deleter.
        let keep = Box::new(self.clone());
        memory::dlpack::export(
            &self.storage,
            self.dtype,
            self.dims(),
            keep,
            stream,
            in_flight,
        )
    }

    fn import_dlpack<M: dlpark::ManagedTensorBase>(
        dl: dlpark::Managed<M>,
        writes: memory::dlpack::Writes,
    ) -> Result<Tensor> {
        let (dtype, shape, nbytes, storage) = memory::dlpack::import(dl, writes)?;
        Ok(Tensor::from_parts(dtype, shape, nbytes, storage))
    }

    /// A tensor over a versioned DLPack tensor's memory, without a copy (`kDLCPU`,
    /// `kDLCUDAHost` and `kDLCUDA`; contiguous, every dtype pinlane has), when nobody else
    /// writes that memory: the producer flagged it `READ_ONLY` (pinlane's own exports
    /// are) or `IS_COPIED` (it is pinlane's alone). A pinlane tensor's bytes never change,
    /// and safe code reads them (`as_bytes`); memory its producer may still write is
    /// imported with the unsafe [`Tensor::from_dlpack_writable`]. DLPack's `READ_ONLY`
    /// itself forbids only the consumer's writes: pinlane takes it as the producer's word
    /// that nobody writes the memory while the capsule lives, so a producer that flags a
    /// read-only view of memory it still writes (numpy's read-only view of a writable
    /// array, say) must not hand that capsule to this call. The producer's deleter
    /// runs exactly once: when the last tensor over the memory is gone, or right away if
    /// the import fails. A `kDLCUDA` tensor is [external device
    /// memory](Tensor::from_device_ptr): order the work that produces it before a transfer
    /// reads it, as for any device tensor. Copies into existing tensors refuse such an
    /// import as a destination ([`Error::IntoMismatch`]): nobody writes it.
    ///
    /// # Errors
    /// [`Error::DLPack`] for writable memory (neither flag set), an unsupported device
    /// type or dtype, non-contiguous strides, a null or misaligned data pointer;
    /// [`Error::NoCuda`] / [`Error::DeviceUnavailable`] for a CUDA tensor on a device
    /// this process cannot use.
    pub fn from_dlpack(dl: dlpark::versioned::Dlpack) -> Result<Tensor> {
        Tensor::import_dlpack(dl, memory::dlpack::Writes::Refused)
    }

    /// [`Tensor::from_dlpack`] for memory its producer could still write (no `READ_ONLY`
    /// or `IS_COPIED` flag: a PyTorch tensor's, say). Unless flagged `READ_ONLY`, copies
    /// into existing tensors may write it when it is named as their destination.
    ///
    /// # Safety
    /// 1. Nothing writes the memory while a tensor over it lives, except, for device
    ///    memory, work ordered before each transfer that reads it (the caller's current
    ///    stream, or a producer event), as for [`Tensor::from_device_ptr`].
    ///
    /// # Errors
    /// As [`Tensor::from_dlpack`], but for the flags.
    pub unsafe fn from_dlpack_writable(dl: dlpark::versioned::Dlpack) -> Result<Tensor> {
        Tensor::import_dlpack(dl, memory::dlpack::Writes::Promised)
    }

    /// [`Tensor::from_dlpack_writable`] for the legacy, unversioned `DLManagedTensor`
    /// (which has no flags to say its memory is read-only).
    ///
    /// # Safety
    /// As [`Tensor::from_dlpack_writable`].
    ///
    /// # Errors
    /// As [`Tensor::from_dlpack_writable`].
    pub unsafe fn from_dlpack_legacy(dl: dlpark::legacy::Dlpack) -> Result<Tensor> {
        Tensor::import_dlpack(dl, memory::dlpack::Writes::Promised)
    }

    /// [`Tensor::from_dlpack_writable`] from a raw pointer, as C code or another library
    /// hands it over. pinlane takes ownership: the deleter runs exactly once, also on
    /// error.
    ///
    /// # Safety
    /// 1. `ptr` is null (an error) or a valid `DLManagedTensorVersioned` whose ownership
    ///    the caller gives up: its descriptor is readable and unchanged until its deleter
    ///    runs, and the deleter may be called once, from any thread.
    /// 2. As [`Tensor::from_dlpack_writable`]: nothing writes the memory while a tensor
    ///    over it lives.
    ///
    /// # Errors
    /// As [`Tensor::from_dlpack_writable`]; also a null pointer, and a major version
    /// other than 1.
    pub unsafe fn from_dlpack_raw(
        ptr: *mut dlpark::ffi::DLManagedTensorVersioned,
    ) -> Result<Tensor> {
        // SAFETY: the caller's contract, passed on unchanged (obligation 2 is what
        // `Writes::Promised` stands for).
        let (dtype, shape, nbytes, storage) =
            unsafe { memory::dlpack::import_raw(ptr, memory::dlpack::Writes::Promised) }?;
        Ok(Tensor::from_parts(dtype, shape, nbytes, storage))
    }

    /// [`Tensor::from_dlpack_raw`] for the legacy `DLManagedTensor`.
    ///
    /// # Safety
    /// As [`Tensor::from_dlpack_raw`], for a `DLManagedTensor`.
    ///
    /// # Errors
    /// As [`Tensor::from_dlpack_raw`].
    pub unsafe fn from_dlpack_legacy_raw(ptr: *mut dlpark::ffi::DLManagedTensor) -> Result<Tensor> {
        // SAFETY: the caller's contract, passed on unchanged.
        let (dtype, shape, nbytes, storage) =
            unsafe { memory::dlpack::import_raw(ptr, memory::dlpack::Writes::Promised) }?;
        Ok(Tensor::from_parts(dtype, shape, nbytes, storage))
    }

    /// Whether two tensors are views into one allocation: one batch's device buffer,
    /// one page-locked block, one host buffer (an H2D or D2H batch's outputs usually
    /// are). The bytes between two such views belong to that allocation too, so a
    /// consumer may describe several of them as one strided tensor over it, as long as
    /// it keeps every one of them alive (the Python package hands runs of same-shape
    /// outputs to torch that way).
    ///
    /// ```
    /// use pinlane::Tensor;
    /// # fn main() -> pinlane::Result<()> {
    /// let a = Tensor::from_vec(vec![1u8; 4], [4])?;
    /// let b = Tensor::from_vec(vec![1u8; 4], [4])?;
    /// assert!(a.same_allocation(&a.clone()));
    /// assert!(!a.same_allocation(&b));
    /// # Ok(()) }
    /// ```
    pub fn same_allocation(&self, other: &Tensor) -> bool {
        match (&self.storage, &other.storage) {
            (Storage::Host(a), Storage::Host(b)) => a.same_owner(b),
            (Storage::Pinned(a), Storage::Pinned(b)) => a.same_block(b),
            (Storage::Device(a), Storage::Device(b)) => a.same_alloc(b),
            _ => false,
        }
    }

    /// Where this tensor's bytes start inside its allocation, in bytes: two tensors `a`
    /// and `b` for which [`same_allocation`](Tensor::same_allocation) holds lie
    /// `b.byte_offset() - a.byte_offset()` bytes apart. The outputs of one transfer call
    /// are views of one allocation (each at a multiple of 256 bytes; in the call's layout
    /// order, which is not always the batch's), so a consumer can hand an evenly spaced run
    /// of them to a framework as one strided tensor, kept alive whole by any one of them.
    /// An allocation may hold more than one call's outputs (small page-locked outputs
    /// share pooled blocks), so `same_allocation` alone does not say they came from one
    /// call. 0 for a tensor made from a `Vec` and for an empty device tensor (which has
    /// no allocation).
    ///
    /// ```
    /// use pinlane::Tensor;
    /// # fn main() -> pinlane::Result<()> {
    /// let a = Tensor::from_vec(vec![1u8; 4], [4])?;
    /// assert_eq!(a.byte_offset(), 0);
    /// # Ok(()) }
    /// ```
    pub fn byte_offset(&self) -> usize {
        match &self.storage {
            Storage::Host(b) => b.offset(),
            Storage::Pinned(b) => b.offset(),
            Storage::Device(v) => v.offset(),
        }
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

    /// `from_host_ptr` reads through the pointer without a copy, refuses a null or
    /// misaligned pointer and bad bool bytes, and drops the owner exactly once either way.
    #[test]
    fn from_host_ptr_borrows_checks_and_drops_the_owner_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        struct Owner(Arc<AtomicUsize>);
        impl Drop for Owner {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let words: &'static [u32] = Box::leak(vec![7u32, 8, 9, 10].into_boxed_slice());
        let bytes: &'static [u8] = Box::leak(vec![0u8, 1, 2, 1].into_boxed_slice());
        let drops = Arc::new(AtomicUsize::new(0));
        let owner = || Owner(drops.clone());
        // SAFETY: a leaked slice of 4 u32, readable for the whole test, never written.
        let t = unsafe { Tensor::from_host_ptr(words.as_ptr().cast(), DType::U32, [4], owner()) }
            .unwrap();
        assert_eq!(
            t.as_bytes().unwrap().as_ptr(),
            words.as_ptr().cast::<u8>(),
            "a copy"
        );
        assert_eq!(t.to_vec::<u32>().unwrap(), words);
        drop(t);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        // SAFETY: refused before any read (a null pointer for one byte).
        let null = unsafe { Tensor::from_host_ptr(std::ptr::null(), DType::U8, [1], owner()) };
        assert!(matches!(null, Err(Error::External { .. })), "{null:?}");
        // SAFETY: 4 bytes from a byte into the leaked 16, refused before any read.
        let skewed = unsafe {
            Tensor::from_host_ptr(words.as_ptr().cast::<u8>().add(1), DType::U16, [2], owner())
        };
        assert!(matches!(skewed, Err(Error::External { .. })), "{skewed:?}");
        // SAFETY: a leaked slice of 4 bytes, readable for the whole test, never written.
        let bools = unsafe { Tensor::from_host_ptr(bytes.as_ptr(), DType::Bool, [4], owner()) };
        assert!(
            matches!(bools, Err(Error::InvalidBytes { .. })),
            "{bools:?}"
        );
        assert_eq!(
            drops.load(Ordering::SeqCst),
            4,
            "an owner dropped other than once"
        );
        // SAFETY: no bytes to read.
        let empty = unsafe { Tensor::from_host_ptr(std::ptr::null(), DType::F32, [0], owner()) };
        assert_eq!(empty.unwrap().nbytes(), 0);
    }

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
